// The real device behind the caching allocator: cudaMalloc/cudaFree, CUDA events, and
// driver virtual memory (cuMemCreate/cuMemMap) for expandable segments.
#pragma once

#include <map>
#include <string>

#include "core/cuda/device_memory.h"

namespace mg::cuda {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device);
  void* malloc(std::size_t bytes) override;
  void free(void* ptr) override;
  void mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  EventId record_event(StreamId stream) override;
  bool event_query(EventId event) override;
  void event_synchronize(EventId event) override;
  void destroy_event(EventId event) override;
  bool supports_virtual_memory() const override;
  std::size_t granularity() const override { return granularity_; }
  void* reserve_address(std::size_t bytes) override;
  bool map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  void release_address(void* addr, std::size_t bytes) override;
  std::string name() const override { return name_; }

 private:
  int device_;
  std::string name_;
  std::size_t granularity_ = std::size_t{2} << 20;
  bool vm_ok_ = false;
  std::map<std::uintptr_t, unsigned long long> page_handles_;  // page address -> CUmemGenericAllocationHandle
};

}  // namespace mg::cuda
