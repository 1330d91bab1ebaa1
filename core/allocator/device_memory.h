// The raw device-memory interface the caching allocator sits on: malloc/free, events, and
// optional virtual memory. The CUDA backend implements it; FakeDevice implements it for CPU tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mg::allocator {

// Streams and events are opaque handles so this header needs no CUDA types: a CUDA backend
// reinterpret_casts cudaStream_t / cudaEvent_t to and from these integers.
using StreamId = std::uintptr_t;
using EventId = std::uintptr_t;
inline constexpr StreamId kDefaultStream = 0;

// Everything the allocator needs from a device. All calls but synchronize_stream come from the
// allocator with its mutex held, one allocator per device, so implementations need no locking of
// their own unless several allocators share one object (synchronize_stream touches no state).
//
// Mapping to CUDA (for the backend implementer):
//   malloc            -> cudaMalloc, returning nullptr on cudaErrorMemoryAllocation
//                        (clear the sticky error with cudaGetLastError); other errors throw.
//   free              -> cudaFree
//   mem_get_info      -> cudaMemGetInfo
//   record_event      -> cudaEventCreateWithFlags(cudaEventDisableTiming) + cudaEventRecord
//   event_query       -> cudaEventQuery == cudaSuccess (cudaErrorNotReady -> false)
//   event_synchronize -> cudaEventSynchronize
//   destroy_event     -> cudaEventDestroy
//   granularity       -> cuMemGetAllocationGranularity(..., CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
//   reserve_address   -> cuMemAddressReserve
//   map               -> for each granularity page: cuMemCreate + cuMemMap + cuMemSetAccess,
//                        keeping one handle per page (so any page can be unmapped alone);
//                        return false when cuMemCreate reports CUDA_ERROR_OUT_OF_MEMORY
//   synchronize_stream-> cudaStreamSynchronize
//   unmap             -> for each page: cuMemUnmap + cuMemRelease (no synchronization: the
//                        allocator has already waited for the stream that last used the pages)
//   release_address   -> cuMemAddressFree
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // Returns nullptr when the device is out of memory; OOM is an expected outcome the allocator
  // recovers from (free cache, retry), so it must not be an exception. Other failures may throw.
  virtual void* malloc(std::size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  virtual void mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;

  // An event marks "everything queued on this stream so far". The allocator records one on each
  // stream that used a block (record_stream) before reusing the block.
  virtual EventId record_event(StreamId stream) = 0;
  virtual bool event_query(EventId event) = 0;  // true once the event has completed
  virtual void event_synchronize(EventId event) = 0;
  virtual void destroy_event(EventId event) = 0;
  // Waits for everything queued on `stream` so far. The allocator calls it before unmapping
  // pages whose last use was on that stream (the only host wait expandable segments need).
  // Unlike the other calls it may come without the allocator's mutex held.
  virtual void synchronize_stream(StreamId stream) = 0;

  // Virtual memory for expandable segments. The allocator only calls these when
  // supports_virtual_memory() is true; addresses and sizes passed to map/unmap are multiples
  // of granularity() and lie inside a range reserve_address returned.
  virtual bool supports_virtual_memory() const { return false; }
  virtual std::size_t granularity() const { return std::size_t{2} << 20; }
  // nullptr when no address range of that size can be reserved.
  virtual void* reserve_address(std::size_t /*bytes*/) { return nullptr; }
  // Backs [addr, addr + bytes) with physical memory; false when out of memory (nothing mapped).
  virtual bool map(void* /*addr*/, std::size_t /*bytes*/) { return false; }
  // Always a set of whole pages that an earlier map() backed, possibly a sub-range of one map().
  // No queued work uses them any more: the allocator synchronized their stream first.
  virtual void unmap(void* /*addr*/, std::size_t /*bytes*/) {}
  // Called only once nothing inside the range is mapped.
  virtual void release_address(void* /*addr*/, std::size_t /*bytes*/) {}

  // Shown in OOM messages and summaries ("NVIDIA H200", "FakeDevice").
  virtual std::string name() const { return "device"; }
};

}  // namespace mg::allocator
