// Expandable segments give pages back with cuMemUnmap, which does not wait for queued kernels:
// the allocator must wait for the stream that last used the pages (and only that stream), once
// per batch of frees, and empty_cache must do that wait without holding the allocator's lock.
// FakeDevice throws when pages still used by a queued kernel are unmapped.
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "core/error.h"
#include "tests/core/allocator/test_util.h"

namespace mg::allocator {
namespace {

using namespace mg::allocator::testing;

// A kernel on stream 1 still reads a freed block; a kernel on stream 2 uses a live block of
// another segment. empty_cache unmaps the first block's pages only after stream 1 ran, and
// leaves stream 2 running: what a cudaDeviceSynchronize would have waited for needlessly.
TEST(ExpandableUnmap, WaitsForTheOwningStreamOnly) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  a.set_expandable_segments(true);
  void* x = allocate_in_use(a, dev, 40 * MiB, 1);
  void* y = allocate_in_use(a, dev, 40 * MiB, 2);
  a.free(x);
  a.empty_cache();  // throws inside FakeDevice::unmap if stream 1's kernel were still queued
  EXPECT_EQ(dev.stream_syncs(), 1);
  EXPECT_EQ(a.stats().num_unmap_stream_syncs, 1);
  EXPECT_EQ(a.memory_stats().at("num_unmap_stream_syncs"), 1);
  EXPECT_EQ(dev.kernels_in_flight(1), 0u);
  EXPECT_EQ(dev.kernels_in_flight(2), 1u);  // not waited for
  EXPECT_EQ(a.memory_reserved(), 40 * MiB);
  expect_consistent(a, dev, {{y, 40 * MiB}});
  a.free(y);
}

// One stream wait covers every block of the stream freed before it: two holes, one wait; an
// empty_cache with nothing freed since waits for nothing; a new free needs a new wait.
TEST(ExpandableUnmap, OneWaitPerStreamUntilMoreFrees) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  a.set_expandable_segments(true);
  void* p[5];
  for (void*& q : p) q = a.allocate(20 * MiB, 1);
  a.free(p[1]);
  a.free(p[3]);
  const std::int64_t unmaps = dev.unmap_calls();
  a.empty_cache();
  EXPECT_EQ(dev.unmap_calls(), unmaps + 2);  // two holes, two unmaps...
  EXPECT_EQ(dev.stream_syncs(), 1);          // ... one wait
  a.empty_cache();
  EXPECT_EQ(dev.stream_syncs(), 1);
  dev.launch(1, p[4], 20 * MiB);
  a.free(p[4]);
  a.empty_cache();
  EXPECT_EQ(dev.stream_syncs(), 2);
  EXPECT_EQ(dev.kernels_in_flight(1), 0u);
  expect_consistent(a, dev, {{p[0], 20 * MiB}, {p[2], 20 * MiB}});
  a.free(p[0]);
  a.free(p[2]);
}

// The growth budget pays for new pages with a freed hole: the hole's stream is waited for before
// its pages go, the other stream keeps running.
TEST(ExpandableUnmap, GrowthReclaimWaitsForTheHolesStream) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  a.set_expandable_segments(true);
  void* other = allocate_in_use(a, dev, 20 * MiB, 2);
  void* x = a.allocate(40 * MiB);
  void* y = a.allocate(40 * MiB);
  void* z = a.allocate(40 * MiB);
  dev.launch(kDefaultStream, y, 40 * MiB);  // a kernel still reads y when it is freed
  a.free(y);
  void* big = a.allocate(60 * MiB);  // unmaps most of y's hole (see ExpandableUnmapsAHoleToGrow...)
  EXPECT_GE(dev.unmap_calls(), 1);
  EXPECT_EQ(dev.stream_syncs(), 1);
  EXPECT_EQ(dev.kernels_in_flight(kDefaultStream), 0u);
  EXPECT_EQ(dev.kernels_in_flight(2), 1u);
  expect_consistent(a, dev, {{other, 20 * MiB}, {x, 40 * MiB}, {z, 40 * MiB}, {big, 60 * MiB}});
  for (void* q : {other, x, z, big}) a.free(q);
}

// empty_cache waits for the streams with the lock released: another thread allocates and frees
// meanwhile. The block it frees had a kernel queued after the wait began, so that wait does not
// cover it: the allocator waits again (under the lock) before unmapping its pages.
TEST(ExpandableUnmap, EmptyCacheWaitsWithoutTheLockAndRechecksLaterFrees) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  a.set_expandable_segments(true);
  void* keep = a.allocate(20 * MiB, 1);
  a.free(a.allocate(20 * MiB, 1));
  bool first = true, finished = false;
  dev.on_synchronize_stream([&](StreamId) {
    if (!first) return;
    first = false;
    auto other_thread = std::async(std::launch::async, [&] { a.free(allocate_in_use(a, dev, 8 * MiB, 1)); });
    // With the allocator locked this would time out (and finish only after the wait returned).
    finished = other_thread.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  });
  a.empty_cache();
  EXPECT_TRUE(finished) << "the other thread could not allocate while empty_cache waited for the stream";
  EXPECT_EQ(dev.stream_syncs(), 2);  // the unlocked wait, then one for the block freed during it
  EXPECT_EQ(dev.kernels_in_flight(1), 0u);
  EXPECT_EQ(a.memory_reserved(), 20 * MiB);
  expect_consistent(a, dev, {{keep, 20 * MiB}});
  dev.on_synchronize_stream(nullptr);
  a.free(keep);
}

// The destructor unmaps what is left, live blocks included: their streams are waited for first.
TEST(ExpandableUnmap, DestructorWaitsBeforeUnmappingLiveBlocks) {
  FakeDevice dev(GiB);
  {
    CachingAllocator a(dev);
    a.set_expandable_segments(true);
    allocate_in_use(a, dev, 20 * MiB, 3);
  }
  EXPECT_EQ(dev.kernels_in_flight(3), 0u);
  EXPECT_EQ(dev.live_bytes(), 0u);
  EXPECT_EQ(dev.reserved_ranges(), 0u);
}

}  // namespace
}  // namespace mg::allocator
