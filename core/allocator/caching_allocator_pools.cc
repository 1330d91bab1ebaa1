// Private pools for captured graphs: creation, holds, allocation routing and the pool reports.
// The pools themselves are ordinary small/large pools under a stream key no real stream has
// (caching_allocator.h, kPoolKeyBit), so the allocation machinery needs no second code path.
#include <algorithm>

#include "core/allocator/caching_allocator.h"
#include "core/error.h"

namespace mg::allocator {

CachingAllocator::PoolId CachingAllocator::create_pool() {
  std::lock_guard lock(mutex_);
  const PoolId id = next_pool_++;
  pool_holds_[id] = 1;
  return id;
}

void CachingAllocator::retain_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  auto it = pool_holds_.find(id);
  MG_CHECK(it != pool_holds_.end(), ValueError, "CachingAllocator::retain_pool: graph memory pool ", id,
           " does not exist (never created, or already released) on device ", device_index_);
  ++it->second;
}

void CachingAllocator::release_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  auto it = pool_holds_.find(id);
  MG_CHECK(it != pool_holds_.end(), ValueError, "CachingAllocator::release_pool: graph memory pool ", id,
           " does not exist (never created, or already released) on device ", device_index_);
  if (--it->second > 0) return;
  const StreamId key = pool_key(id);
  MG_CHECK(std::none_of(routes_.begin(), routes_.end(), [&](const auto& r) { return r.second == key; }), ValueError,
           "CachingAllocator::release_pool: graph memory pool ", id,
           " is still receiving allocations (end_allocate_to_pool first)");
  pool_holds_.erase(it);
  release_orphaned_segments();
}

void CachingAllocator::begin_allocate_to_pool(PoolId id, StreamId stream) {
  std::lock_guard lock(mutex_);
  MG_CHECK(pool_holds_.count(id), ValueError, "CachingAllocator::begin_allocate_to_pool: graph memory pool ", id,
           " does not exist (never created, or already released) on device ", device_index_);
  MG_CHECK(!is_pool_key(stream), ValueError, "CachingAllocator::begin_allocate_to_pool: stream ", stream,
           " is not a stream handle");
  MG_CHECK(std::none_of(routes_.begin(), routes_.end(), [&](const auto& r) { return r.first == stream; }), ValueError,
           "CachingAllocator::begin_allocate_to_pool: the stream already allocates into a graph pool");
  routes_.emplace_back(stream, pool_key(id));
}

void CachingAllocator::end_allocate_to_pool(StreamId stream) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(routes_.begin(), routes_.end(), [&](const auto& r) { return r.first == stream; });
  MG_CHECK(it != routes_.end(), ValueError,
           "CachingAllocator::end_allocate_to_pool: the stream does not allocate into a graph pool");
  routes_.erase(it);
  release_orphaned_segments();  // of pools released during the capture
}

bool CachingAllocator::releasable_pool_segment(const Segment& s) const {
  return !is_pool_key(s.stream) || !pool_holds_.count(s.stream & ~kPoolKeyBit);
}

// A released pool's segment whose blocks are all free goes back to the device, unless a capture
// is under way (then it goes when the last capture ends).
void CachingAllocator::release_if_orphaned(Segment* s) {
  if (routes_.empty() && is_pool_key(s->stream) && releasable_pool_segment(*s) && releasable_bytes(*s) > 0)
    release_segment(s);
}

void CachingAllocator::release_orphaned_segments() {
  std::vector<Segment*> all;
  for (auto& [addr, seg] : segments_) all.push_back(seg.get());
  for (Segment* s : all) release_if_orphaned(s);
}

std::size_t CachingAllocator::pool_reserved_bytes(PoolId id) const {
  std::lock_guard lock(mutex_);
  std::size_t bytes = 0;
  for (const auto& [addr, seg] : segments_)
    if (seg->stream == pool_key(id)) bytes += seg->size;
  return bytes;
}

}  // namespace mg::allocator
