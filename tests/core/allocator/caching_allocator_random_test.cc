// Randomized alloc/free/record_stream/empty_cache sequences on several streams, checking every
// invariant after every op: the allocator's bookkeeping must match the fake device exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/core/allocator/test_util.h"

namespace mg::allocator {
namespace {

using namespace mg::allocator::testing;

struct RandomParams {
  unsigned seed;
  bool expandable;
  bool limit;
  const char* config = "";            // CachingAllocator::configure
  std::size_t granularity = 2 * MiB;  // the fake device's mapping unit
  const char* name = "";
};

std::string param_name(const ::testing::TestParamInfo<RandomParams>& info) {
  return "seed" + std::to_string(info.param.seed) + (info.param.expandable ? "_expandable" : "") +
         (info.param.limit ? "_limit" : "") + info.param.name;
}

class RandomOps : public ::testing::TestWithParam<RandomParams> {};

// Mostly small tensors, a good share of 1-12 MiB ones and some big ones: the mix that makes
// both pools split, coalesce and fragment.
std::size_t draw_size(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double kind = u(rng);
  auto log_uniform = [&](double lo, double hi) { return static_cast<std::size_t>(lo * std::pow(hi / lo, u(rng))); };
  if (kind < 0.50) return log_uniform(1, static_cast<double>(MiB));
  if (kind < 0.88) return log_uniform(static_cast<double>(MiB), 12.0 * MiB);
  return log_uniform(12.0 * MiB, 48.0 * MiB);
}

TEST_P(RandomOps, InvariantsHoldAfterEveryOp) {
  const RandomParams prm = GetParam();
  std::uint64_t seed = prm.seed;
  if (const char* env = std::getenv("MG_TEST_SEED")) seed ^= std::strtoull(env, nullptr, 10);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);

  FakeDevice dev(256 * MiB, /*virtual_memory=*/true, prm.granularity);
  CachingAllocator a(dev);
  a.set_expandable_segments(prm.expandable);
  a.configure(prm.config);
  if (prm.limit) a.set_memory_limit(160 * MiB);
  a.record_history(true, 5000);

  std::map<void*, std::size_t> live;
  std::vector<void*> order;  // for picking a random live pointer
  auto pick = [&]() -> std::size_t { return rng() % order.size(); };
  int ooms = 0, frees = 0, records = 0;
  constexpr int kOps = 3000;
  for (int op = 0; op < kOps; ++op) {
    const int r = static_cast<int>(rng() % 100);
    const int alloc_pct = live.size() < 30 ? 55 : 35;
    if (r < alloc_pct || order.empty()) {
      const std::size_t size = draw_size(rng);
      const StreamId stream = rng() % 3;
      const auto before = a.memory_stats();
      try {
        void* p = a.allocate(size, stream);
        ASSERT_EQ(live.count(p), 0u) << "pointer handed out twice";
        live[p] = size;
        order.push_back(p);
      } catch (const OutOfMemoryError& e) {
        ++ooms;
        const auto after = a.memory_stats();
        ASSERT_EQ(after.at("allocated_bytes.all.current"), before.at("allocated_bytes.all.current"));
        ASSERT_EQ(after.at("allocation.all.current"), before.at("allocation.all.current"));
        ASSERT_NE(std::string(e.what()).find("Tried to allocate"), std::string::npos);
      }
    } else if (r < 85) {
      const std::size_t i = pick();
      a.free(order[i]);
      live.erase(order[i]);
      order[i] = order.back();
      order.pop_back();
      ++frees;
    } else if (r < 93) {
      a.record_stream(order[pick()], rng() % 4);
      ++records;
    } else if (r < 98) {
      dev.run_stream(rng() % 4);
    } else if (r < 99) {
      a.empty_cache();
    } else {
      dev.complete_all_events();
    }
    expect_consistent(a, dev, live);
    if (HasFatalFailure()) {
      ADD_FAILURE() << "after op " << op << "\n" << a.memory_summary();
      return;
    }
  }
  const DeviceStats st = a.stats();
  std::printf(
      "seed %llu: %d frees, %d ooms, %lld retries, %lld syncs, %lld device allocs, "
      "peak reserved %s, peak allocated %s\n",
      static_cast<unsigned long long>(seed), frees, ooms, static_cast<long long>(st.num_alloc_retries),
      static_cast<long long>(st.num_sync_all_streams), static_cast<long long>(st.num_device_alloc),
      format_bytes(st.reserved_bytes[kAllPools].peak).c_str(),
      format_bytes(st.allocated_bytes[kAllPools].peak).c_str());
  EXPECT_GT(frees, kOps / 5);
  EXPECT_GT(records, 50);
  // The reports must cope with whatever state the sequence left behind.
  EXPECT_NE(timeline_html(a.snapshot()).find("<svg"), std::string::npos);
  EXPECT_FALSE(a.memory_summary().empty());

  for (void* p : order) a.free(p);
  live.clear();
  expect_consistent(a, dev, live);
  a.empty_cache();
  expect_consistent(a, dev, live);
  EXPECT_EQ(a.memory_reserved(), 0u);
  EXPECT_EQ(dev.live_bytes(), 0u);
  EXPECT_EQ(dev.live_allocations(), 0u);
  EXPECT_EQ(dev.reserved_ranges(), 0u);
  EXPECT_EQ(dev.live_events(), 0u);
  EXPECT_EQ(a.stats().num_ooms, ooms);
}

INSTANTIATE_TEST_SUITE_P(
    Seeds, RandomOps,
    ::testing::Values(RandomParams{1, false, false}, RandomParams{2, false, false}, RandomParams{3, false, true},
                      RandomParams{4, false, true}, RandomParams{5, true, false}, RandomParams{6, true, false},
                      RandomParams{7, true, true}, RandomParams{8, true, true},
                      // PyTorch's policies: no growth budget, plain best fit.
                      RandomParams{9, false, false, "reserved_slack:-1,segment_reuse_ratio:0", 2 * MiB, "_pytorch"},
                      RandomParams{10, true, true, "reserved_slack:-1", 2 * MiB, "_pytorch"},
                      // Aggressive policies: no slack, whole segments kept for requests >= 1/2.
                      RandomParams{11, false, true, "reserved_slack:0,segment_reuse_ratio:2", 2 * MiB, "_tight"},
                      RandomParams{12, true, false, "reserved_slack:0", 2 * MiB, "_tight"},
                      // A fine mapping granularity: many partly used granules and small holes.
                      RandomParams{13, true, false, "", 64 * KiB, "_gran64k"},
                      RandomParams{14, true, true, "", 64 * KiB, "_gran64k"}),
    param_name);

}  // namespace
}  // namespace mg::allocator
