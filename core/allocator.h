// The Allocator interface every Storage comes from, the CPU allocator, and per-category
// accounting (parameters, gradients, optimizer state, activations) for memory reports.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "core/device.h"
#include "core/format_bytes.h"

namespace mg {

// Bytes counters with PyTorch's meaning: current, peak since reset, and totals.
struct MemoryCounter {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // total ever added
  int64_t freed = 0;      // total ever removed
  void add(int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void sub(int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
};

// What a block of memory is for. A thread-local guard (MemoryCategoryGuard) sets it;
// storages remember the category they were created under.
// Gathered: parameters brought to the device for a unit's use and released after it (the
// working set of ZeRO-3 and of parameter offload, autograd/param_units.h).
enum class MemoryCategory : uint8_t {
  Other,
  Parameters,
  Gradients,
  OptimizerState,
  Activations,
  Data,
  Gathered,
  kCount
};
const char* memory_category_name(MemoryCategory c);

class MemoryCategoryGuard {
 public:
  explicit MemoryCategoryGuard(MemoryCategory c);
  ~MemoryCategoryGuard();
  MemoryCategoryGuard(const MemoryCategoryGuard&) = delete;
  MemoryCategoryGuard& operator=(const MemoryCategoryGuard&) = delete;
  static MemoryCategory current();

 private:
  MemoryCategory prev_;
};

// Per-device, per-category live bytes (what the storages hold, not what is reserved).
class CategoryStats {
 public:
  static CategoryStats& get(Device d);
  void on_alloc(MemoryCategory c, int64_t bytes);
  void on_free(MemoryCategory c, int64_t bytes);
  MemoryCounter counter(MemoryCategory c) const;
  // Category breakdown at the moment total live bytes peaked.
  std::array<int64_t, static_cast<size_t>(MemoryCategory::kCount)> at_peak() const;
  MemoryCounter total() const;
  void reset_peak();

 private:
  mutable std::mutex mu_;
  std::array<MemoryCounter, static_cast<size_t>(MemoryCategory::kCount)> by_cat_{};
  std::array<int64_t, static_cast<size_t>(MemoryCategory::kCount)> at_peak_{};
  MemoryCounter total_;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for nbytes (nbytes may be 0) or throws (OutOfMemoryError on exhaustion).
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
  // PyTorch-style stats: "allocated_bytes.all.current", "reserved_bytes.all.peak", ...
  virtual std::map<std::string, int64_t> memory_stats() const = 0;
  virtual void reset_peak_memory_stats() = 0;
};

// Plain malloc with 64-byte alignment and the same stats surface the CUDA allocator has
// (reserved == allocated: nothing is cached on the host).
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cpu(); }
  std::map<std::string, int64_t> memory_stats() const override;
  void reset_peak_memory_stats() override;

 private:
  mutable std::mutex mu_;
  MemoryCounter bytes_;
  MemoryCounter count_;
};

CpuAllocator& cpu_allocator();

// The allocator new tensors on `d` come from. CUDA allocators register themselves here
// when the CUDA backend is linked in.
Allocator& allocator_for(Device d);
using AllocatorFactory = Allocator& (*)(int device_index);
void register_cuda_allocator(AllocatorFactory f);

// The surface PyTorch users look for, for any device.
int64_t memory_allocated(Device d = Device::cpu());
int64_t max_memory_allocated(Device d = Device::cpu());
int64_t memory_reserved(Device d = Device::cpu());
int64_t max_memory_reserved(Device d = Device::cpu());
void reset_peak_memory_stats(Device d = Device::cpu());
std::map<std::string, int64_t> memory_stats(Device d = Device::cpu());

}  // namespace mg
