// Activation offload: the third choice beside keeping a saved tensor on the device and
// recomputing it. Under an OffloadScope the tensors ops save for backward are copied to
// page-locked host memory on a side stream while the forward goes on; the device copy is
// dropped as soon as that copy has finished, and backward brings each one back on a second
// side stream, a window ahead of the node that needs it (docs/recompute.md, "Offload").
//
//   {
//     OffloadScope offload;            // everything saved in here goes to host memory
//     y = block(x);
//   }
//   loss.backward();                   // fetched back just in time, in reverse order
//
// What is not offloaded: CPU tensors, tensors smaller than OffloadOptions::min_bytes, leaves
// that require grad (parameters stay where they are), autocast's cached weight casts (they
// live for the whole step anyway), and anything saved while a CUDA graph is being captured.
// A tensor saved twice (or two views of one storage) is copied once. The copies only read the
// saved tensor: gradients are bitwise those of a run without offload.
//
// The device memory a saved tensor held is given back when its copy to the host is seen to
// have finished: SavedTensor polls every time it saves or unpacks while copies are pending.
// A tensor backward asks for before its copy finished is used from the device as it is.
//
// Backward fetches ahead: at every saved tensor it unpacks, the offloaded tensors it will need
// next (latest saved first) are copied back while two limits hold. At most
// OffloadOptions::prefetch_bytes are fetched and not yet used, and the device's live bytes
// stay at or below what they were when backward began: a fetch ahead only fills memory
// backward has already freed, so it never raises the step's peak.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace mg {

struct OffloadOptions {
  // Saved tensors of fewer bytes stay on the device: below about a megabyte a copy's fixed
  // cost outweighs what it frees.
  int64_t min_bytes = int64_t{1} << 20;
  // How far ahead backward fetches: the most bytes copied back and not yet used. More hides
  // the copies better; each byte is device memory taken early.
  int64_t prefetch_bytes = int64_t{512} << 20;
};

// Turns offload on for the calling thread for a scope (nests; the innermost options apply).
class OffloadScope {
 public:
  explicit OffloadScope(OffloadOptions options = {});
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;

 private:
  const OffloadOptions* prev_;
  OffloadOptions options_;
};

// Blocks the calling thread until every copy to the host queued so far has finished, and gives
// their device memory back. The host runs ahead of the device: where the step is about to peak
// (GPT: before the head), the copies of the offloaded blocks may not have run yet, and the memory
// they free would count only later. Waiting there costs device time only when the copies are
// slower than the work queued behind them.
void offload_wait();

// Copy bandwidth between a device and page-locked host memory, each way, in bytes per
// millisecond: what an offloaded tensor's copy out and back costs (memory/planner.h's
// plan_offload weighs it against the forward's time).
struct HostLink {
  double to_host_bytes_per_ms = 0.0;
  double to_device_bytes_per_ms = 0.0;
};
// Times `bytes`-sized copies each way on a side stream of `device` (a CUDA device, else
// mg::ValueError): the median of `repeats` after a warm-up copy.
HostLink measure_host_link(Device device, int64_t bytes = int64_t{64} << 20, int repeats = 5);

// Counters since the last reset (process-wide).
struct OffloadStats {
  int64_t offloaded_bytes = 0;  // copies to the host started
  int64_t fetched_bytes = 0;    // copies back to the device started
  int64_t used_in_place = 0;    // tensors backward asked for before their copy to the host finished
  int64_t device_bytes = 0;     // device bytes still held for saved tensors whose copy is pending
};
OffloadStats offload_stats();
void reset_offload_stats();

namespace autograd {

// A saved tensor's storage on its way to, in, or back from host memory. SavedTensor holds it
// in place of the storage.
class OffloadedStorage;

// The storage to save `t` with: null when `t` stays on the device (not offloaded).
std::shared_ptr<OffloadedStorage> offload(const Tensor& t);
// The storage back on the device, ordered before the work the current stream runs next.
Storage fetch(OffloadedStorage& s);

namespace detail {
// Offloaded tensors whose copy to the host is not yet seen finished, or not yet fetched back.
extern std::atomic<int64_t> offload_waiting;
void offload_tick(bool in_backward);
}  // namespace detail
// Drops the device memory of saved tensors whose copy to the host has finished; in backward
// (`in_backward`: a saved tensor is being unpacked) also starts the fetches ahead.
inline void poll_offload(bool in_backward = false) {
  if (detail::offload_waiting.load(std::memory_order_relaxed) > 0) detail::offload_tick(in_backward);
}

}  // namespace autograd
}  // namespace mg
