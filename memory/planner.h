// Checkpoint planner: measures each segment of a chain (activation bytes kept for backward,
// forward time) and picks which runs of segments to checkpoint so activations fit a budget, and
// how many leading segments can offload their activations to host memory with the copies hidden.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/offload.h"
#include "core/tensor.h"
#include "nn/sequential.h"

namespace mg::memory {

using SegmentFn = std::function<Tensor(const Tensor&)>;

struct SegmentProfile {
  std::string name;
  int64_t kept_bytes = 0;    // growth of live memory over its recorded forward, previous output released
  int64_t output_bytes = 0;  // the segment's output alone (what a checkpoint boundary keeps)
  double forward_ms = 0.0;   // forward without recording (what a replay costs)
};

// Runs the chain once recording (memory deltas per segment on the sample's device), then
// `repeats` times under no_grad for the timings (median). The graph is dropped afterwards, and
// the default generator is left as it was (the segments' dropout draws from it).
std::vector<SegmentProfile> profile_segments(const std::vector<SegmentFn>& segments, const Tensor& sample,
                                             const std::vector<std::string>& names = {}, int repeats = 3);

// Contiguous runs [bounds[i], bounds[i+1]) of segments, each checkpointed or not: what
// mg::checkpoint_segments runs.
struct CheckpointPlan {
  std::string strategy;
  std::vector<int64_t> bounds;
  std::vector<bool> checkpointed;
  int64_t stored_bytes = 0;       // activations kept through the forward
  int64_t replay_bytes = 0;       // the largest replayed run's activations, rebuilt during backward
  int64_t plain_bytes = 0;        // activations kept with no checkpointing
  double extra_forward_ms = 0.0;  // recomputation per step
  double plain_forward_ms = 0.0;
  bool fits = true;  // stored + replay <= the budget (planned plans only)
  int64_t estimated_peak_bytes() const { return stored_bytes + replay_bytes; }
  // One checkpoint flag per segment (true when the segment lies in a checkpointed run).
  std::vector<bool> segment_mask() const;
  // A table: one row per run (segments, kept / output bytes, ms, checkpointed), then the
  // estimated activation peak against no checkpointing and the extra forward time.
  std::string table(const std::vector<SegmentProfile>& profile) const;
};

// The cost model above for a given split (also used to explain hand-made plans).
CheckpointPlan evaluate_plan(const std::vector<SegmentProfile>& profile, std::vector<int64_t> bounds,
                             std::vector<bool> checkpointed, std::string strategy);

CheckpointPlan plan_none(const std::vector<SegmentProfile>& profile);
// Every segment its own checkpointed run (per-block checkpointing).
CheckpointPlan plan_every_segment(const std::vector<SegmentProfile>& profile);
// Chen et al.'s baseline: runs of ceil(sqrt(n)) segments, all checkpointed but the last.
CheckpointPlan plan_sqrt_n(const std::vector<SegmentProfile>& profile);
// The least recomputation whose estimated activation peak fits `budget_bytes`: a dynamic
// program over contiguous runs (for each cap on the replay term, a min-time cover of the
// bytes that must be saved). When nothing fits it returns the plan with the lowest peak,
// fits = false.
CheckpointPlan plan_for_budget(const std::vector<SegmentProfile>& profile, int64_t budget_bytes);

// Offload (autograd/offload.h) of what the first segments save, planned so that its copies hide
// behind compute. Cost model: segment i's kept_bytes go to the host on one side stream, after the
// copy before it; its tensors are saved as the segment runs, so its copy starts with the segment
// and ends no earlier than the segment does. The forward waits for the last copy `tail_ms` after
// the chain ends (GPT waits before its head: 0). Backward spends
// backward_ratio x a segment's forward time on it, in reverse order, starting with
// backward_ratio x tail_ms; the copies back run one after another from backward's start, latest
// segment first, and a segment's backward waits for its own. The exposed time is what the step
// waits for copies, both passes together.
// Backward's time per segment against its forward's, as the offload cost model takes it.
inline constexpr double kOffloadBackwardRatio = 2.0;

struct OffloadPlan {
  int64_t segments = 0;  // the first `segments` segments offload
  int64_t total_segments = 0;
  int64_t offloaded_bytes = 0;
  double forward_exposed_ms = 0.0;   // the forward's wait for the last copy out
  double backward_exposed_ms = 0.0;  // backward's waits for copies back
  bool window_capped = false;        // plan_offload stopped at a segment larger than its window
  double exposed_ms() const { return forward_exposed_ms + backward_exposed_ms; }
  // "offload 1 of 12 segments (218.0 MiB), exposed 0.00 ms (forward 0.00, backward 0.00)".
  std::string summary() const;
};

// The cost model for offloading the first `segments` segments over `link`.
OffloadPlan evaluate_offload(const std::vector<SegmentProfile>& profile, int64_t segments, const HostLink& link,
                             double tail_ms = 0.0, double backward_ratio = kOffloadBackwardRatio);
// The most leading segments whose copies leave at most max_exposed_ms exposed (0: fully hidden).
// A link of zero bandwidth offloads nothing. window_bytes >= 0 (OffloadOptions::prefetch_bytes):
// the plan also stops before the first segment that keeps more. Backward fetches no more than
// the window ahead, so the rest of such a segment's copy back would stall its own backward,
// which the model above does not see (H200, GPT-2 B=8 with dropout 0.1: 1.2 GiB blocks against
// the 512 MiB window, one offloaded block cost 18.5 ms where the model predicted none).
OffloadPlan plan_offload(const std::vector<SegmentProfile>& profile, const HostLink& link, double max_exposed_ms = 0.0,
                         double tail_ms = 0.0, double backward_ratio = kOffloadBackwardRatio,
                         int64_t window_bytes = -1);

// A Sequential's children as segment functions (for profile_segments / checkpoint_segments),
// and mg::checkpoint_sequential over them (PyTorch's checkpoint_sequential(seq, segments, x)).
std::vector<SegmentFn> segments_of(const nn::Sequential& seq);
Tensor checkpoint_sequential(const nn::Sequential& seq, int64_t segments, const Tensor& input);

}  // namespace mg::memory
