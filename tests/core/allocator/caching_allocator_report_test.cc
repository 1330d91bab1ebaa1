// Caching allocator reporting and settings on a fake device: stats and peaks, fragmentation,
// the summary table, snapshot JSON and history, the HTML timeline, options and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/core/allocator/test_util.h"

namespace mg::allocator {
namespace {

using namespace mg::allocator::testing;

TEST(CachingAllocator, PeaksAndResets) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  void* p = a.allocate(10 * MiB);
  a.free(p);
  EXPECT_EQ(a.memory_allocated(), 0u);
  EXPECT_EQ(a.max_memory_allocated(), 10 * MiB);
  EXPECT_EQ(a.max_memory_reserved(), 10 * MiB);
  a.reset_peak_memory_stats();
  EXPECT_EQ(a.max_memory_allocated(), 0u);
  EXPECT_EQ(a.max_memory_reserved(), 10 * MiB);  // still reserved
  auto st = a.memory_stats();
  EXPECT_EQ(st["allocation.all.allocated"], 1);
  EXPECT_EQ(st["allocation.all.freed"], 1);
  a.reset_accumulated_memory_stats();
  st = a.memory_stats();
  EXPECT_EQ(st["allocation.all.allocated"], 0);
  EXPECT_EQ(st["num_device_alloc"], 0);
  a.check_invariants();
}

TEST(CachingAllocator, FragmentationMetrics) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  std::vector<void*> ps;
  for (int i = 0; i < 16; ++i) ps.push_back(a.allocate(64 * KiB));
  for (int i = 0; i < 16; i += 2) a.free(ps[i]);
  const FragmentationInfo f = a.fragmentation();
  EXPECT_EQ(f.largest_free_block, MiB);  // the untouched tail of the 2 MiB segment
  EXPECT_EQ(f.free_cached, MiB + 8 * 64 * KiB);
  EXPECT_EQ(f.reserved_unallocated, f.free_cached);
  EXPECT_NEAR(f.ratio, 1.0 / 3.0, 1e-9);
  EXPECT_EQ(a.memory_stats().at("fragmentation.ratio_ppm"), std::llround(1e6 / 3.0));
  EXPECT_EQ(a.stats().inactive_split[kAllPools].current, 9);
}

TEST(CachingAllocator, MemorySummaryHasKeyRows) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  void* p = a.allocate(3 * MiB);
  void* q = a.allocate(3 * KiB);
  const std::string s = a.memory_summary();
  for (const char* row :
       {"memgrad CUDA memory summary, device ID 0", "CUDA OOMs: 0", "Allocated memory", "from large pool",
        "from small pool", "Active memory", "Requested memory", "GPU reserved memory", "Non-releasable memory",
        "Allocations", "GPU reserved segments", "Oversize GPU segments", "Fragmentation", "3.00 MiB", "20.00 MiB"}) {
    EXPECT_NE(s.find(row), std::string::npos) << row << "\n" << s;
  }
  a.free(p);
  a.free(q);
}

TEST(CachingAllocator, SnapshotJsonAndHistory) {
  FakeDevice dev(64 * MiB);
  CachingAllocator a(dev);
  a.record_history(true);
  void* p;
  {
    AllocationContext fwd("forward");
    AllocationContext mm("matmul");
    p = a.allocate(5 * MiB);
  }
  void* q = a.allocate(100 * KiB);
  EXPECT_THROW(a.allocate(100 * MiB), OutOfMemoryError);
  a.free(q);
  const auto j = nlohmann::json::parse(snapshot_to_json(a.snapshot()));
  ASSERT_EQ(j["segments"].size(), 2u);
  bool found = false;
  for (const auto& seg : j["segments"]) {
    for (const auto& b : seg["blocks"]) {
      if (b["address"].get<std::uintptr_t>() == addr(p)) {
        found = true;
        EXPECT_EQ(b["state"], "active_allocated");
        EXPECT_EQ(b["context"], "forward/matmul");
        EXPECT_EQ(b["requested_size"], 5 * MiB);
      }
    }
  }
  EXPECT_TRUE(found);
  std::vector<std::string> actions;
  for (const auto& e : j["device_traces"]) actions.push_back(e["action"]);
  const std::vector<std::string> expected = {"segment_alloc", "alloc",          "segment_alloc", "alloc",
                                             "oom",           "free_requested", "free_completed"};
  EXPECT_EQ(actions, expected);
  EXPECT_EQ(j["stats"]["num_ooms"], 1);
  const std::string path = ::testing::TempDir() + "/snapshot.json";
  a.write_snapshot_json(path);
  std::ifstream in(path);
  EXPECT_EQ(nlohmann::json::parse(in)["device_traces"].size(), expected.size());
  a.record_history(true, 3);  // the ring buffer keeps the newest entries
  for (int i = 0; i < 5; ++i) a.free(a.allocate(KiB));
  const MemorySnapshot snap = a.snapshot();
  EXPECT_EQ(snap.history.size(), 3u);
  EXPECT_GT(snap.history_dropped, 0u);
  EXPECT_LT(snap.history[0].seq, snap.history[2].seq);
  a.free(p);
}

TEST(CachingAllocator, TimelineHtmlIsSelfContained) {
  FakeDevice dev(256 * MiB);
  CachingAllocator a(dev);
  void* before = a.allocate(3 * MiB);  // allocated before history: drawn from step 0
  a.record_history(true);
  std::vector<void*> ps;
  for (int i = 0; i < 20; ++i) {
    AllocationContext ctx(i % 2 ? "layer<odd>" : "layer&even");
    ps.push_back(a.allocate((i + 1) * 512 * KiB));
    if (i % 3 == 2) {
      a.free(ps.front());
      ps.erase(ps.begin());
    }
  }
  a.free(before);
  EXPECT_THROW(a.allocate(GiB), OutOfMemoryError);
  const std::string path = ::testing::TempDir() + "/timeline.html";
  a.write_timeline_html(path);
  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string html = buf.str();
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("<polygon"), std::string::npos);
  EXPECT_NE(html.find("OOM: asked 1.00 GiB"), std::string::npos);
  EXPECT_NE(html.find("layer&lt;odd&gt;"), std::string::npos);  // escaped
  EXPECT_NE(html.find("(before history)"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  for (void* p : ps) a.free(p);
  EXPECT_THROW(a.write_timeline_html("/nonexistent-dir/x.html"), IOError);
}

TEST(CachingAllocator, BadInputRaisesClearErrors) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  int local = 0;
  EXPECT_NE(message([&] { a.free(&local); }).find("was not returned by allocate()"), std::string::npos);
  void* p = a.allocate(4 * KiB);
  const std::string interior = message([&] { a.free(static_cast<char*>(p) + 512); });
  EXPECT_NE(interior.find("points 512 bytes into the block"), std::string::npos) << interior;
  a.free(p);
  const std::string twice = message([&] { a.free(p); });
  EXPECT_NE(twice.find("already freed"), std::string::npos) << twice;
  EXPECT_THROW(a.record_stream(p, 1), ValueError);
  EXPECT_THROW(a.allocation_size(p), ValueError);
  for (double f : {0.0, -0.5, 1.5, std::nan("")}) {
    const std::string m = message([&] { a.set_memory_fraction(f); });
    EXPECT_NE(m.find("set_memory_fraction: fraction must be in (0, 1]"), std::string::npos) << m;
  }
  EXPECT_THROW(a.set_memory_limit(0), ValueError);
  EXPECT_THROW(a.set_max_split_size(MiB), ValueError);
  EXPECT_THROW(a.record_history(true, 0), ValueError);
  a.check_invariants();  // none of it disturbed the allocator
}

TEST(CachingAllocator, ConfigureStringAndBadOptions) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  a.configure(" expandable_segments:True , per_process_memory_fraction:0.25");
  EXPECT_EQ(a.memory_limit(), 256 * MiB);
  void* p = a.allocate(30 * MiB);
  EXPECT_TRUE(a.snapshot().segments[0].expandable);
  a.free(p);
  try {
    a.configure("garbage_collection_threshold:0.6");
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown option 'garbage_collection_threshold'"), std::string::npos);
  }
  EXPECT_THROW(a.configure("expandable_segments:maybe"), ValueError);
  EXPECT_THROW(a.configure("max_split_size_mb:abc"), ValueError);
  EXPECT_THROW(a.configure("max_split_size_mb:8"), ValueError);  // must exceed 20 MiB
  EXPECT_THROW(a.configure("novalue"), ValueError);
}

}  // namespace
}  // namespace mg::allocator
