// Private pools for captured graphs, on FakeDevice: a pool's blocks are reused only by
// allocations routed to it, nothing is freed to the device while a capture is under way, and a
// released pool's memory goes back once its blocks are free.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/core/allocator/test_util.h"

namespace mg::allocator {
namespace {

using namespace mg::allocator::testing;

constexpr StreamId kCapture = 7;  // the stream a graph is captured on
constexpr StreamId kEager = 7;    // the same stream used eagerly after the capture ended

// One block of `bytes` allocated while `stream` is captured into `pool`: a graph's output (kept)
// or, when `temporary`, freed again inside the capture. Returns its address.
void* allocate_in_capture(CachingAllocator& a, CachingAllocator::PoolId pool, StreamId stream, std::size_t bytes,
                          bool temporary) {
  a.begin_allocate_to_pool(pool, stream);
  void* p = a.allocate(bytes, stream);
  if (temporary) a.free(p);
  a.end_allocate_to_pool(stream);
  return p;
}

TEST(GraphPool, BlocksFreedInThePoolAreNotHandedToEagerCode) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  const auto pool = a.create_pool();
  a.begin_allocate_to_pool(pool, kCapture);
  void* x = a.allocate(4 * MiB, kCapture);
  a.free(x);                                // freed inside the capture: back to the pool
  void* y = a.allocate(4 * MiB, kCapture);  // the capture reuses it
  EXPECT_EQ(y, x);
  a.free(y);
  a.end_allocate_to_pool(kCapture);
  EXPECT_EQ(a.pool_reserved_bytes(pool), 20 * MiB);  // one large-pool segment
  EXPECT_EQ(a.memory_stats().at("graph_pools"), 1);
  EXPECT_EQ(a.memory_stats().at("graph_pool_reserved_bytes"), 20 * MiB);
  // The same stream, now eager: the graph still replays into x, so eager code gets other memory.
  void* z = a.allocate(4 * MiB, kEager);
  EXPECT_NE(z, x);
  EXPECT_EQ(dev.malloc_calls(), 2);
  a.free(z);
  // empty_cache keeps the live pool's segment.
  a.empty_cache();
  EXPECT_EQ(a.memory_reserved(), 20 * MiB);
  EXPECT_EQ(a.pool_reserved_bytes(pool), 20 * MiB);
  a.release_pool(pool);
  EXPECT_EQ(a.memory_reserved(), 0u);
  EXPECT_EQ(a.memory_stats().at("graph_pools"), 0);
  expect_consistent(a, dev, {});
}

// Two graphs sharing one pool: the second capture reuses what the first freed, and the pool
// lives until both let go.
TEST(GraphPool, SharedPoolLivesUntilTheLastHolderReleases) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  const auto pool = a.create_pool();
  void* x = allocate_in_capture(a, pool, kCapture, MiB, /*temporary=*/true);
  a.retain_pool(pool);                                                     // the second graph
  EXPECT_EQ(allocate_in_capture(a, pool, 8, MiB, /*temporary=*/true), x);  // another stream, the same pool
  a.release_pool(pool);
  EXPECT_EQ(a.pool_reserved_bytes(pool), 2 * MiB);  // one small-pool segment, still held
  a.release_pool(pool);
  EXPECT_EQ(a.pool_reserved_bytes(pool), 0u);
  EXPECT_THROW(a.release_pool(pool), ValueError);
  EXPECT_THROW(a.retain_pool(pool), ValueError);
  expect_consistent(a, dev, {});
}

// A tensor a graph produced outlives the graph: its segment goes back when it is freed.
TEST(GraphPool, ReleasedPoolsSegmentGoesWhenItsLastBlockIsFreed) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  const auto pool = a.create_pool();
  void* out = allocate_in_capture(a, pool, kCapture, 3 * MiB, /*temporary=*/false);
  a.release_pool(pool);
  EXPECT_EQ(a.memory_reserved(), 20 * MiB);
  expect_consistent(a, dev, {{out, 3 * MiB}});
  a.free(out);
  EXPECT_EQ(a.memory_reserved(), 0u);
  EXPECT_EQ(dev.free_calls(), 1);
  expect_consistent(a, dev, {});
}

// While a capture is under way nothing goes back to the device (cudaFree is illegal then), not
// even on the retry path of an eager allocation that runs out of memory.
TEST(GraphPool, NothingIsFreedToTheDeviceDuringACapture) {
  FakeDevice dev(64 * MiB);
  CachingAllocator a(dev);
  void* e = a.allocate(40 * MiB, 1);
  a.free(e);  // 40 MiB cached for stream 1
  const auto pool = a.create_pool();
  a.begin_allocate_to_pool(pool, kCapture);
  a.empty_cache();
  EXPECT_EQ(dev.free_calls(), 0);
  // The capture needs 40 MiB; the device has 24 MiB left and the cache may not be freed.
  EXPECT_THROW(a.allocate(40 * MiB, kCapture), OutOfMemoryError);
  EXPECT_EQ(dev.free_calls(), 0);
  a.end_allocate_to_pool(kCapture);
  void* c = nullptr;
  // After the capture the retry path may free the eager cache again.
  a.begin_allocate_to_pool(pool, kCapture);
  a.end_allocate_to_pool(kCapture);
  c = a.allocate(40 * MiB, 2);
  EXPECT_EQ(dev.free_calls(), 1);
  a.free(c);
  a.release_pool(pool);
  a.empty_cache();
  expect_consistent(a, dev, {});
}

// Pools never use expandable segments: unmapping their pages would need a real stream.
TEST(GraphPool, PoolsUseFixedSegmentsWhenExpandableSegmentsAreOn) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  a.set_expandable_segments(true);
  const auto pool = a.create_pool();
  void* x = allocate_in_capture(a, pool, kCapture, 30 * MiB, /*temporary=*/false);
  EXPECT_EQ(dev.map_calls(), 0);
  EXPECT_EQ(dev.malloc_calls(), 1);
  a.free(x);
  a.release_pool(pool);
  EXPECT_EQ(a.memory_reserved(), 0u);
  expect_consistent(a, dev, {});
}

TEST(GraphPool, MisuseIsAClearError) {
  FakeDevice dev(GiB);
  CachingAllocator a(dev);
  EXPECT_THROW(a.begin_allocate_to_pool(42, kCapture), ValueError);
  EXPECT_THROW(a.end_allocate_to_pool(kCapture), ValueError);
  const auto pool = a.create_pool();
  a.begin_allocate_to_pool(pool, kCapture);
  EXPECT_THROW(a.begin_allocate_to_pool(pool, kCapture), ValueError);  // already routed
  EXPECT_THROW(a.release_pool(pool), ValueError);                      // still capturing into it
  a.end_allocate_to_pool(kCapture);
  a.release_pool(pool);
}

}  // namespace
}  // namespace mg::allocator
