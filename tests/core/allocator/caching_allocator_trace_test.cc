// Replayed training-step traces (bench/training_trace.h) on the fake device: what the
// allocator promises about fragmentation (peak reserved within 5% of peak allocated) and that a
// steady training loop makes no device calls. Properties of the policy, not timings.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "bench/training_trace.h"
#include "tests/core/allocator/test_util.h"

namespace mg::allocator {
namespace {

using namespace mg::allocator::testing;
using bench::GptShape;
using bench::TraceEvent;

struct Replay {
  double ratio = 0;  // peak reserved / peak allocated
  std::int64_t device_calls = 0;
};

Replay replay(const std::vector<TraceEvent>& trace, bool expandable, const char* config = "") {
  FakeDevice dev(std::size_t{140} << 30);
  CachingAllocator a(dev);
  a.set_expandable_segments(expandable);
  a.configure(config);
  std::map<std::int64_t, void*> live;
  for (const TraceEvent& e : trace) {
    if (e.alloc) {
      live[e.id] = a.allocate(e.bytes);
    } else {
      a.free(live.at(e.id));
      live.erase(e.id);
    }
  }
  a.check_invariants();
  for (auto& [id, p] : live) a.free(p);
  const DeviceStats st = a.stats();
  Replay r;
  r.ratio =
      static_cast<double>(st.reserved_bytes[kAllPools].peak) / static_cast<double>(st.allocated_bytes[kAllPools].peak);
  r.device_calls = st.num_device_alloc + st.num_device_free;
  a.empty_cache();
  EXPECT_EQ(dev.live_bytes(), 0u);
  return r;
}

TEST(CachingAllocatorTrace, Gpt2StepExpandableWithin5Percent) {
  const GptShape f32;  // GPT-2 124M, B=8, T=1024
  GptShape bf16 = f32;
  bf16.elem = 2;
  for (const GptShape& shape : {f32, bf16}) {
    const Replay r = replay(bench::gpt_training_step_trace(shape, 2), /*expandable=*/true);
    EXPECT_LE(r.ratio, 1.05) << "elem " << shape.elem;
  }
}

TEST(CachingAllocatorTrace, Gpt2StepFixedSegmentsWithin5Percent) {
  const Replay r = replay(bench::gpt_training_step_trace(GptShape{}, 2), /*expandable=*/false);
  EXPECT_LE(r.ratio, 1.05);
}

TEST(CachingAllocatorTrace, GrowingBatchWithin5Percent) {
  const auto trace = bench::growing_batch_trace(24 * MiB, 12, 1.15);
  EXPECT_LE(replay(trace, /*expandable=*/true).ratio, 1.05);
  EXPECT_LE(replay(trace, /*expandable=*/false).ratio, 1.05);
}

// The policies are what make the difference: PyTorch's (plain best fit, cache freed only on
// OOM) wastes more on the same traces.
TEST(CachingAllocatorTrace, PyTorchPoliciesFragmentMore) {
  const char* pytorch = "reserved_slack:-1,segment_reuse_ratio:0";
  EXPECT_GT(replay(bench::gpt_training_step_trace(GptShape{}, 2), false, pytorch).ratio, 1.08);
  EXPECT_GT(replay(bench::growing_batch_trace(24 * MiB, 12, 1.15), false, pytorch).ratio, 5.0);
}

// After the second step the cache holds what a step needs: more steps add no device calls
// (no malloc/free, no map/unmap churn from the growth budget).
TEST(CachingAllocatorTrace, SteadyStateMakesNoDeviceCalls) {
  for (const bool expandable : {false, true}) {
    const Replay two = replay(bench::gpt_training_step_trace(GptShape{}, 2), expandable);
    const Replay five = replay(bench::gpt_training_step_trace(GptShape{}, 5), expandable);
    EXPECT_EQ(five.device_calls, two.device_calls) << (expandable ? "expandable" : "fixed");
  }
}

}  // namespace
}  // namespace mg::allocator
