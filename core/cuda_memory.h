// The CUDA memory surface users call (torch.cuda.* names): empty_cache, memory_summary,
// per-process limits, record_stream, snapshots. Declared for every build; without CUDA
// these raise mg::DeviceError (or report nothing to free).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device_runtime.h"
#include "core/tensor.h"

namespace mg::cuda {

// Returns every cached, unused segment of every device to the driver.
void empty_cache();
// A readable table of the caching allocator's statistics for a device.
std::string memory_summary(int device = 0);
// Caps what memgrad may reserve on the device to fraction * total memory (0 < f <= 1).
void set_per_process_memory_fraction(double fraction, int device = 0);
// Caps reserved bytes on the device (0 removes the cap).
void set_per_process_memory_limit(int64_t bytes, int device = 0);
// Marks t's memory as used by `stream`: the block is not reused before that stream's work
// queued so far has finished.
void record_stream(const Tensor& t, const Stream& stream);
// Opt into expandable segments (virtual-memory backed growth) for a device's allocator.
void set_expandable_segments(bool enabled, int device = 0);
// Allocation history recording and its outputs (JSON snapshot, HTML/SVG timeline).
void record_memory_history(bool enabled, int device = 0, int64_t max_entries = 100000);
void write_memory_snapshot(const std::string& json_path, int device = 0);
void write_memory_timeline(const std::string& html_path, int device = 0);
// Largest free cached block and reserved-but-unallocated bytes (fragmentation).
struct Fragmentation {
  int64_t largest_free_block = 0;
  int64_t reserved_unallocated = 0;
  double ratio = 0.0;
};
Fragmentation fragmentation(int device = 0);

// A page-locked (pinned) host copy of a CPU tensor: host<->device copies from it can run
// asynchronously on a stream (non_blocking) and overlap compute.
Tensor pin_memory(const Tensor& cpu_tensor);
bool is_pinned(const Tensor& t);

// Page-locked host memory from a caching pool (PyTorch's CachingHostAllocator): activation
// offload takes and returns blocks every step, and each cudaHostAlloc costs milliseconds and
// synchronizes the device. A block goes back to the pool when its PinnedBlock dies; it is
// handed out again only after the work recorded on it (record()) has finished, so a copy still
// reading or writing it never races its next user. Sizes are rounded up (to 4 KiB, and to
// 2 MiB from 1 MiB up), and a request reuses any cached block of its rounded size.
class PinnedBlock {
 public:
  PinnedBlock() = default;
  // mg::DeviceError without CUDA or when the host cannot pin `bytes` more.
  static PinnedBlock allocate(size_t bytes);
  ~PinnedBlock();
  PinnedBlock(PinnedBlock&& o) noexcept;
  PinnedBlock& operator=(PinnedBlock&& o) noexcept;
  PinnedBlock(const PinnedBlock&) = delete;
  PinnedBlock& operator=(const PinnedBlock&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }  // the rounded size
  // The block is used by the work queued on `s` so far: it is not reused before that finishes.
  void record(const Stream& s);
  // A contiguous CPU tensor of `shape` and `dtype` over the block's first bytes (at most size());
  // the block must outlive it. What host<->device copies read and write.
  Tensor view(const Shape& shape, DType dtype) const;

 private:
  void release();
  void* data_ = nullptr;
  size_t size_ = 0;
  std::vector<Event> uses_;
};

struct PinnedPoolStats {
  int64_t in_use_bytes = 0;  // held by live PinnedBlocks
  int64_t cached_bytes = 0;  // free in the pool, or waiting for their recorded work
  int64_t host_allocs = 0;   // cudaHostAlloc calls so far
  int64_t reuses = 0;        // requests served from the pool
};
PinnedPoolStats pinned_pool_stats();
// Frees the pool's idle blocks (waiting for their recorded work first).
void empty_pinned_cache();

}  // namespace mg::cuda
