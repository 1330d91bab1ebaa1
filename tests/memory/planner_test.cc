// The checkpoint planner: profiles measure what a segment keeps; sqrt(n) has the right
// shape; the dynamic program fits the budget and is as cheap as the best of every possible
// split (brute force) under a slightly tighter budget; a planned run gives the plain
// gradients and keeps what the plan said. The offload planner's timelines, worked by hand.
#include "memory/planner.h"

#include <gtest/gtest.h>

#include "autograd/recompute.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/random.h"
#include "nn/linear.h"
#include "nn/transformer.h"

namespace mg::nn {

using namespace mg::memory;  // the module under test
namespace {

std::vector<SegmentProfile> random_profile(int n, uint64_t seed) {
  Generator g(seed);
  Tensor u = rand({n, 3}, {DType::f64}, &g);
  auto v = u.to_vector<double>();
  std::vector<SegmentProfile> p(n);
  for (int i = 0; i < n; ++i) {
    p[i].name = "s" + std::to_string(i);
    p[i].output_bytes = 1000 + static_cast<int64_t>(v[3 * i] * 4000);
    p[i].kept_bytes = p[i].output_bytes + static_cast<int64_t>(v[3 * i + 1] * 50000);
    p[i].forward_ms = 0.1 + v[3 * i + 2];
  }
  return p;
}

// Every split into runs and every flag assignment: the least extra time that fits.
double brute_force_best(const std::vector<SegmentProfile>& p, int64_t budget) {
  const int n = static_cast<int>(p.size());
  double best = 1e300;
  for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
    std::vector<int64_t> bounds{0};
    for (int i = 1; i < n; ++i)
      if (cuts & (1u << (i - 1))) bounds.push_back(i);
    bounds.push_back(n);
    const size_t runs = bounds.size() - 1;
    for (uint32_t f = 0; f < (1u << runs); ++f) {
      std::vector<bool> flags(runs);
      for (size_t r = 0; r < runs; ++r) flags[r] = f & (1u << r);
      CheckpointPlan c = evaluate_plan(p, bounds, flags, "brute");
      if (c.estimated_peak_bytes() <= budget) best = std::min(best, c.extra_forward_ms);
    }
  }
  return best;
}

TEST(Planner, DynamicProgramMatchesBruteForce) {
  for (uint64_t seed : {1, 2, 3}) {
    auto p = random_profile(8, seed);
    const CheckpointPlan none = plan_none(p);
    for (double frac : {0.9, 0.6, 0.4, 0.25}) {
      const int64_t budget = static_cast<int64_t>(frac * static_cast<double>(none.plain_bytes));
      CheckpointPlan plan = plan_for_budget(p, budget);
      const double tighter = brute_force_best(p, budget - 8 * (none.plain_bytes / 2048 + 1));
      const double exact = brute_force_best(p, budget);
      if (exact > 1e299) {
        EXPECT_FALSE(plan.fits);
        continue;
      }
      ASSERT_TRUE(plan.fits) << "seed " << seed << " budget " << frac;
      EXPECT_LE(plan.estimated_peak_bytes(), budget);
      EXPECT_GE(plan.extra_forward_ms, exact - 1e-9);  // nothing beats the true optimum
      if (tighter < 1e299) {
        EXPECT_LE(plan.extra_forward_ms, tighter + 1e-9) << plan.table(p);
      }
    }
  }
}

// Profiling runs the segments, and dropout draws from the default generator: it is put back, so
// the program's random stream goes on as if the profile had not run.
TEST(Planner, ProfileLeavesTheDefaultGeneratorAsItWas) {
  std::vector<SegmentFn> segs(3, [](const Tensor& x) { return dropout(x, 0.5, /*training=*/true); });
  Tensor x = randn({256}, {DType::f32});
  x.requires_grad_(true);
  const PhiloxState before = default_generator().get_state();
  profile_segments(segs, x);
  const PhiloxState after = default_generator().get_state();
  EXPECT_EQ(after.seed, before.seed);
  EXPECT_EQ(after.offset, before.offset);
}

TEST(Planner, SqrtNShapeAndTable) {
  auto p = random_profile(16, 4);
  CheckpointPlan s = plan_sqrt_n(p);
  EXPECT_EQ(s.bounds, (std::vector<int64_t>{0, 4, 8, 12, 16}));
  EXPECT_EQ(s.checkpointed, (std::vector<bool>{true, true, true, false}));
  EXPECT_LT(s.estimated_peak_bytes(), s.plain_bytes);
  const std::string t = s.table(p);
  EXPECT_NE(t.find("s0 .. s3"), std::string::npos) << t;
  EXPECT_NE(t.find("sqrt(n)"), std::string::npos) << t;
  EXPECT_EQ(plan_every_segment(p).segment_mask(), std::vector<bool>(16, true));
  // A budget above the plain run needs no checkpoint at all.
  EXPECT_DOUBLE_EQ(plan_for_budget(p, s.plain_bytes).extra_forward_ms, 0.0);
  EXPECT_THROW(plan_for_budget(p, -1), ValueError);
  EXPECT_THROW(plan_for_budget({}, 10), ValueError);
}

TEST(Planner, ProfileAndPlannedRunOnCpu) {
  // Six segments of three tanh each over 64 KiB tensors: each keeps its three outputs.
  std::vector<SegmentFn> segs;
  for (int i = 0; i < 6; ++i) segs.push_back([](const Tensor& x) { return tanh(tanh(tanh(x))); });
  Tensor x = randn({8192}, {DType::f64});
  x.requires_grad_(true);
  auto prof = profile_segments(segs, x);
  ASSERT_EQ(prof.size(), 6u);
  const int64_t one = 8192 * 8;
  for (const auto& s : prof) {
    EXPECT_EQ(s.output_bytes, one);
    EXPECT_GE(s.kept_bytes, 3 * one);
    EXPECT_LE(s.kept_bytes, 3 * one + 4096);
    EXPECT_GT(s.forward_ms, 0.0);
  }
  CheckpointPlan plan = plan_for_budget(prof, 9 * one);
  ASSERT_TRUE(plan.fits) << plan.table(prof);

  Tensor plain = x;
  for (auto& f : segs) plain = f(plain);
  sum(plain).backward();
  auto want = x.grad().to_vector<double>();
  plain = Tensor();
  x.set_grad(Tensor());
  const int64_t before = memory_allocated();
  Tensor y = checkpoint_segments(segs, plan.bounds, plan.checkpointed, x);
  const int64_t kept = memory_allocated() - before;
  EXPECT_LE(kept, plan.stored_bytes + 4096 * 6) << plan.table(prof);
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), want);
}

TEST(Planner, CheckpointSequentialOverASequential) {
  Generator g(3);
  Sequential seq;
  for (int i = 0; i < 4; ++i) {
    seq.push_back(std::make_shared<Linear>(6, 6, true, TensorOptions{DType::f64}, &g));
    seq.push_back(std::make_shared<GELU>());
  }
  Tensor x = randn({5, 6}, {DType::f64}, &g);
  sum(seq(x)).backward();
  std::vector<std::vector<double>> want;
  for (const Tensor& p : seq.parameters()) want.push_back(p.grad().to_vector<double>());
  seq.zero_grad(true);
  const int64_t replays = checkpoint_replay_count();
  sum(checkpoint_sequential(seq, 4, x)).backward();
  EXPECT_EQ(checkpoint_replay_count() - replays, 3);
  auto params = seq.parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].grad().to_vector<double>(), want[i]);
}

// Four segments of 1 ms keeping 100 bytes each; the copy out takes 2 ms a segment, the copy back
// 1 ms. The timelines below are worked by hand from the cost model in planner.h.
std::vector<SegmentProfile> even_profile() {
  std::vector<SegmentProfile> p(4);
  for (auto& s : p) s.kept_bytes = 100, s.output_bytes = 10, s.forward_ms = 1.0;
  return p;
}
constexpr HostLink kLink{.to_host_bytes_per_ms = 50.0, .to_device_bytes_per_ms = 100.0};

TEST(OffloadPlanner, HandWorkedTimelines) {
  const auto p = even_profile();
  // One segment: its copy runs 0..2 ms, inside the 4 ms forward; fetched back by 1 ms, needed at 6.
  OffloadPlan one = evaluate_offload(p, 1, kLink);
  EXPECT_EQ(one.offloaded_bytes, 100);
  EXPECT_DOUBLE_EQ(one.exposed_ms(), 0.0);
  // Two: the second copy queues behind the first (2..4 ms) and ends with the forward.
  OffloadPlan two = evaluate_offload(p, 2, kLink);
  EXPECT_EQ(two.offloaded_bytes, 200);
  EXPECT_DOUBLE_EQ(two.exposed_ms(), 0.0);
  // Three: copies end at 6 ms, 2 past the forward's end.
  OffloadPlan three = evaluate_offload(p, 3, kLink);
  EXPECT_DOUBLE_EQ(three.forward_exposed_ms, 2.0);
  EXPECT_DOUBLE_EQ(three.backward_exposed_ms, 0.0);
  // Four: copies end at 8 ms (4 exposed); backward needs the last segment's copy back (1 ms) at
  // once: 1 ms more.
  OffloadPlan four = evaluate_offload(p, 4, kLink);
  EXPECT_DOUBLE_EQ(four.forward_exposed_ms, 4.0);
  EXPECT_DOUBLE_EQ(four.backward_exposed_ms, 1.0);
  // Work after the chain that the copies may overlap (tail_ms) hides the third copy.
  EXPECT_DOUBLE_EQ(evaluate_offload(p, 3, kLink, /*tail_ms=*/2.0).exposed_ms(), 0.0);
  // A slow copy back binds in backward: 10 ms to fetch segment 0, whose backward starts at 6 ms.
  OffloadPlan slow = evaluate_offload(p, 1, HostLink{.to_host_bytes_per_ms = 1000.0, .to_device_bytes_per_ms = 10.0});
  EXPECT_DOUBLE_EQ(slow.forward_exposed_ms, 0.0);
  EXPECT_DOUBLE_EQ(slow.backward_exposed_ms, 4.0);
  EXPECT_EQ(three.summary(), "offload 3 of 4 segments (300 B), exposed 2.00 ms (forward 2.00, backward 0.00)");
}

TEST(OffloadPlanner, PlanTakesTheMostSegmentsWithinTheExposedTime) {
  const auto p = even_profile();
  EXPECT_EQ(plan_offload(p, kLink).segments, 2);
  EXPECT_EQ(plan_offload(p, kLink, 1.9).segments, 2);
  EXPECT_EQ(plan_offload(p, kLink, 2.0).segments, 3);
  OffloadPlan all = plan_offload(p, kLink, 100.0);
  EXPECT_EQ(all.segments, 4);
  EXPECT_EQ(all.total_segments, 4);
  EXPECT_DOUBLE_EQ(all.exposed_ms(), 5.0);
  // Even a fast link cannot hide the last segment's copy back when backward starts with it (no
  // tail): three. With work after the chain (the head's backward runs first), all four. No link
  // (off CUDA) offloads nothing.
  EXPECT_EQ(plan_offload(p, HostLink{1e9, 1e9}).segments, 3);
  EXPECT_EQ(plan_offload(p, HostLink{1e9, 1e9}, 0.0, /*tail_ms=*/0.5).segments, 4);
  // A prefetch window smaller than a segment stops the plan before it.
  OffloadPlan capped = plan_offload(p, kLink, 100.0, 0.0, 2.0, /*window_bytes=*/99);
  EXPECT_EQ(capped.segments, 0);
  EXPECT_TRUE(capped.window_capped);
  EXPECT_NE(capped.summary().find("stopped at a segment larger than the prefetch window"), std::string::npos);
  auto big_third = p;
  big_third[2].kept_bytes = 1000;
  EXPECT_EQ(plan_offload(big_third, HostLink{1e9, 1e9}, 100.0, 0.0, 2.0, 100).segments, 2);
  EXPECT_EQ(plan_offload(p, kLink, 100.0, 0.0, 2.0, 100).segments, 4);
  EXPECT_FALSE(plan_offload(p, kLink, 100.0, 0.0, 2.0, 100).window_capped);
  OffloadPlan none = plan_offload(p, HostLink{});
  EXPECT_EQ(none.segments, 0);
  EXPECT_EQ(none.offloaded_bytes, 0);
}

TEST(OffloadPlanner, BadArgumentsAreValueErrorsNamingThem) {
  const auto p = even_profile();
  try {
    evaluate_offload(p, 1, HostLink{});
    FAIL() << "expected mg::ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("evaluate_offload: offloading 1 segments needs a link of positive bandwidth"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(evaluate_offload(p, 5, kLink), ValueError);
  EXPECT_THROW(evaluate_offload(p, -1, kLink), ValueError);
  EXPECT_THROW(evaluate_offload(p, 1, kLink, -1.0), ValueError);
  EXPECT_THROW(plan_offload(p, kLink, -0.5), ValueError);
  try {
    measure_host_link(Device::cpu());
    FAIL() << "expected mg::ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("measure_host_link: needs a CUDA device, got cpu"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mg::nn
