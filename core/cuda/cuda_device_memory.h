// The real device behind the caching allocator: cudaMalloc/cudaFree, CUDA events, and
// driver virtual memory (cuMemCreate/cuMemMap) for expandable segments.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/allocator/device_memory.h"

namespace mg::allocator {
class CachingAllocator;
}  // namespace mg::allocator

namespace mg::cuda {

using allocator::DeviceMemory;  // implemented here for the CUDA device
using allocator::EventId;
using allocator::StreamId;

class CudaDeviceMemory final : public DeviceMemory {
 public:
  // The mapping unit (granularity()) for expandable segments: each unit is one physical
  // allocation, created, mapped and given access separately. The driver's calls cost about the
  // same per allocation whatever its size (~85 us per cuMemCreate + cuMemMap + cuMemSetAccess +
  // cuMemUnmap + cuMemRelease on an H200), so a unit above the 2 MiB hardware granularity makes
  // growing and shrinking several times cheaper; the price is that free memory is given back
  // in whole units. Rounded up to a multiple of the device's granularity.
  static constexpr std::size_t kDefaultMapUnit = std::size_t{16} << 20;
  explicit CudaDeviceMemory(int device, std::size_t map_unit = kDefaultMapUnit);
  void* malloc(std::size_t bytes) override;
  void free(void* ptr) override;
  void mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  EventId record_event(StreamId stream) override;
  bool event_query(EventId event) override;
  void event_synchronize(EventId event) override;
  void destroy_event(EventId event) override;
  void synchronize_stream(StreamId stream) override;
  bool supports_virtual_memory() const override;
  std::size_t granularity() const override { return granularity_; }
  void* reserve_address(std::size_t bytes) override;
  bool map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  void release_address(void* addr, std::size_t bytes) override;
  std::string name() const override { return name_; }

 private:
  void release_pages(std::uintptr_t base, std::size_t bytes);  // unmap + release, no sync

  int device_;
  std::string name_;
  std::size_t granularity_ = std::size_t{2} << 20;
  bool vm_ok_ = false;
  std::map<std::uintptr_t, unsigned long long> page_handles_;  // page address -> CUmemGenericAllocationHandle
};

// The caching allocator of device `device` (core/cuda/register_backend.cc), created on first use.
allocator::CachingAllocator& caching_allocator(int device);

}  // namespace mg::cuda
