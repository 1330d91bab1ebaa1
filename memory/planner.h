// Checkpoint planner: measures each segment of a chain (activation bytes kept for backward,
// forward time) and picks which runs of segments to checkpoint so activations fit a budget.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/sequential.h"

namespace mg::nn {

using SegmentFn = std::function<Tensor(const Tensor&)>;

struct SegmentProfile {
  std::string name;
  int64_t kept_bytes = 0;    // growth of live memory over its recorded forward, previous output released
  int64_t output_bytes = 0;  // the segment's output alone (what a checkpoint boundary keeps)
  double forward_ms = 0.0;   // forward without recording (what a replay costs)
};

// Runs the chain once recording (memory deltas per segment on the sample's device), then
// `repeats` times under no_grad for the timings (median). The graph is dropped afterwards.
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

// A Sequential's children as segment functions (for profile_segments / checkpoint_segments),
// and mg::checkpoint_sequential over them (PyTorch's checkpoint_sequential(seq, segments, x)).
std::vector<SegmentFn> segments_of(const Sequential& seq);
Tensor checkpoint_sequential(const Sequential& seq, int64_t segments, const Tensor& input);

}  // namespace mg::nn
