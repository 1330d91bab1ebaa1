// The allocation machinery of CachingAllocator: pools, segments, split/coalesce, stream events,
// expandable segments and the free-cache-then-retry path. Reports and settings: *_stats.cc.
#include "core/cuda/caching_allocator.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mg::cuda {
namespace {

std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }

// Anything above this can't be rounded without overflow and can't exist on a device anyway.
constexpr std::size_t kMaxRequest = std::size_t{1} << 60;

std::string hex(std::uintptr_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

std::size_t round_size(std::size_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return round_up(bytes, kMinBlockSize);
}

std::size_t segment_size_for(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

// Hot-path stat updates whose sign is known: no branch on the sign, peak kept exact.
inline void stat_add(Stat& s, std::int64_t v) {
  s.current += v;
  s.allocated += v;
  if (s.current > s.peak) s.peak = s.current;
}
inline void stat_sub(Stat& s, std::int64_t v) {
  s.current -= v;
  s.freed += v;
}
inline void add(StatArray& a, int pool, std::int64_t v) {
  stat_add(a[kAllPools], v);
  stat_add(a[pool], v);
}
inline void sub(StatArray& a, int pool, std::int64_t v) {
  stat_sub(a[kAllPools], v);
  stat_sub(a[pool], v);
}
inline int pool_index(bool small) { return small ? kSmallPool : kLargePool; }

void CachingAllocator::BlockIndex::insert(std::uintptr_t key, Block* b) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    --shift_;
    for (const Slot& s : old) {
      if (s.key == 0) continue;
      std::size_t i = home(s.key);
      while (slots_[i].key != 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::size_t i = home(key);
  while (slots_[i].key != 0) i = (i + 1) & mask_;
  slots_[i] = Slot{key, b};
  ++size_;
}

void CachingAllocator::BlockIndex::erase(std::uintptr_t key) {
  std::size_t i = home(key);
  while (slots_[i].key != key) i = (i + 1) & mask_;
  // Backward shift: pull later entries of the probe run into the hole unless that would move
  // them before their home slot, so lookups never need tombstones.
  for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
    const std::size_t h = home(slots_[j].key);
    const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (!stays) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = Slot{};
  --size_;
}

CachingAllocator::CachingAllocator(DeviceMemory& device, int device_index)
    : device_(device), device_index_(device_index), start_(std::chrono::steady_clock::now()) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  for (Block* b : spare_blocks_) delete b;
  spare_blocks_.clear();
  try {
    synchronize_and_free_events();
    for (auto& [addr, seg] : segments_) {
      for (Block* b = seg->head; b;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
      if (seg->expandable) {
        if (seg->size > 0) device_.unmap(reinterpret_cast<void*>(seg->addr), seg->size);
        device_.release_address(reinterpret_cast<void*>(seg->addr), seg->va_size);
      } else {
        device_.free(reinterpret_cast<void*>(seg->addr));
      }
    }
  } catch (...) {
    // A destructor must not throw; the device is being torn down anyway.
  }
}

void CachingAllocator::update(StatArray& stat, bool small, std::int64_t delta) {
  stat[kAllPools].update(delta);
  stat[small ? kSmallPool : kLargePool].update(delta);
}

void CachingAllocator::trace(TraceAction action, std::uintptr_t addr, std::size_t size,
                             StreamId stream, std::uint32_t context) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_).count();
  history_.push_back(TraceEntry{action, addr, size, stream, seq_++,
                                static_cast<std::uint64_t>(ns), AllocationContext::name(context)});
  while (history_.size() > history_max_) {
    history_.pop_front();
    ++history_dropped_;
  }
}

CachingAllocator::Block* CachingAllocator::new_block() {
  if (spare_blocks_.empty()) return new Block;
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  return b;
}

void CachingAllocator::delete_block(Block* b) {
  b->requested = 0;
  b->prev = b->next = nullptr;
  b->segment = nullptr;
  b->event_count = 0;
  b->context = 0;
  b->allocated = b->oversize = b->counted_split = false;
  b->stream_uses.clear();  // keeps its capacity for the next record_stream
  spare_blocks_.push_back(b);
}

// Free blocks that share a segment with other blocks are "inactive split": counting them on the
// way in and out of the pool keeps that stat exact without rescanning neighbours later.
void CachingAllocator::count_split(Block* b) {
  b->counted_split = b->prev || b->next;
  if (b->counted_split) {
    const int p = pool_index(b->segment->small);
    add(stats_.inactive_split, p, 1);
    add(stats_.inactive_split_bytes, p, static_cast<std::int64_t>(b->size));
  }
}

void CachingAllocator::uncount_split(Block* b) {
  if (b->counted_split) {
    const int p = pool_index(b->segment->small);
    sub(stats_.inactive_split, p, 1);
    sub(stats_.inactive_split_bytes, p, static_cast<std::int64_t>(b->size));
    b->counted_split = false;
  }
}

// Set nodes are recycled through spare_nodes_ (C++17 node handles), so this never allocates
// once the allocator has warmed up.
void CachingAllocator::pool_insert(Block* b) {
  count_split(b);
  BlockSet& set = pool_for(b->segment->small).blocks;
  if (spare_nodes_.empty()) {
    b->pool_it = set.insert(b).first;
  } else {
    BlockSet::node_type node = std::move(spare_nodes_.back());
    spare_nodes_.pop_back();
    node.value() = b;
    b->pool_it = set.insert(std::move(node)).position;
  }
}

void CachingAllocator::pool_erase(Block* b) {
  spare_nodes_.push_back(pool_for(b->segment->small).blocks.extract(b->pool_it));
  uncount_split(b);
}

// Gives a pooled block a new range. A split shrinks a block and a merge grows it, and usually
// no other free block of the stream has a size in between, so the block keeps its place in the
// set: two neighbour comparisons instead of an erase and an insert with their rebalancing.
void CachingAllocator::pool_update(Block* b, std::uintptr_t addr, std::size_t size) {
  uncount_split(b);
  BlockSet& set = pool_for(b->segment->small).blocks;
  const BlockKey key{b->stream, size, addr};
  const BlockLess less;
  const auto it = b->pool_it;
  const bool in_order = (it == set.begin() || less(*std::prev(it), key)) &&
                        (std::next(it) == set.end() || less(key, *std::next(it)));
  if (in_order) {
    b->addr = addr;  // the set orders by these fields; the order with every other block holds
    b->size = size;
  } else {
    BlockSet::node_type node = set.extract(it);
    b->addr = addr;
    b->size = size;
    b->pool_it = set.insert(std::move(node)).position;
  }
  count_split(b);
}

void CachingAllocator::unlink(Block* b) {
  if (b->prev) {
    b->prev->next = b->next;
  } else {
    b->segment->head = b->next;
  }
  if (b->next) b->next->prev = b->prev;
}

// Best fit: the smallest free block of this stream that holds `size`, lowest address first.
CachingAllocator::Block* CachingAllocator::find_free_block(bool small, StreamId stream,
                                                           std::size_t size) {
  BlockSet& set = pool_for(small).blocks;
  auto it = set.lower_bound(BlockKey{stream, size, 0});
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  // Expandable segments split freely, so the oversize rules only guard fixed segments.
  if (max_split_size_ != SIZE_MAX && !b->segment->expandable) {
    // Keep big unsplittable blocks for big requests; don't waste them on small ones.
    if (size < max_split_size_ && b->size >= max_split_size_) return nullptr;
    // And don't let a big request take a block much bigger than it.
    if (size >= max_split_size_ && b->size >= size + kLargeBuffer) return nullptr;
  }
  return b;
}

CachingAllocator::Block* CachingAllocator::get_new_memory(bool small, StreamId stream,
                                                          std::size_t size, bool* limit_hit) {
  *limit_hit = false;
  if (expandable_ && device_.supports_virtual_memory()) {
    return grow_expandable(small, stream, size, limit_hit);
  }
  return alloc_segment(small, stream, segment_size_for(size), limit_hit);
}

CachingAllocator::Block* CachingAllocator::alloc_segment(bool small, StreamId stream,
                                                         std::size_t seg_size, bool* limit_hit) {
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  if (limit_ != 0 && reserved + seg_size > limit_) {
    *limit_hit = true;
    return nullptr;
  }
  void* ptr = device_.malloc(seg_size);
  if (!ptr) return nullptr;
  auto seg = std::make_unique<Segment>();
  seg->addr = reinterpret_cast<std::uintptr_t>(ptr);
  seg->size = seg_size;
  seg->stream = stream;
  seg->small = small;
  seg->oversize = seg_size >= max_split_size_;
  Block* b = new_block();
  b->addr = seg->addr;
  b->size = seg_size;
  b->stream = stream;
  b->segment = seg.get();
  seg->head = b;
  ++stats_.num_device_alloc;
  update(stats_.segment, small, 1);
  update(stats_.reserved_bytes, small, static_cast<std::int64_t>(seg_size));
  if (seg->oversize) stats_.oversize_segments.update(1);
  if (history_enabled_) {
    trace(TraceAction::kSegmentAlloc, seg->addr, seg_size, stream, AllocationContext::current_id());
  }
  segments_[seg->addr] = std::move(seg);
  pool_insert(b);
  return b;
}

// One reserved address range per (pool, stream) that grows page by page. A request that doesn't
// fit extends the free tail block in place, so growing tensors never strand a whole old segment.
CachingAllocator::Block* CachingAllocator::grow_expandable(bool small, StreamId stream,
                                                           std::size_t size, bool* limit_hit) {
  const std::size_t gran = device_.granularity();
  const std::size_t page = round_up(small ? kSmallBuffer : kLargeBuffer, gran);
  auto found = expandable_segments_.find({small, stream});
  Segment* seg = found == expandable_segments_.end() ? nullptr : found->second;
  Block* tail = nullptr;
  for (Block* b = seg ? seg->head : nullptr; b; b = b->next) tail = b;
  const std::size_t avail = tail && tail->is_free() ? tail->size : 0;
  if (avail >= size) return tail;
  const std::size_t need = round_up(size - avail, page);

  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  if (limit_ != 0 && reserved + need > limit_) {
    *limit_hit = true;
    return nullptr;
  }
  std::unique_ptr<Segment> fresh;
  if (!seg) {
    std::size_t free_bytes = 0, total = 0;
    device_.mem_get_info(&free_bytes, &total);
    // Address space is cheap: reserve the whole device so the segment never has to move.
    const std::size_t va = round_up(std::max(total, need), page);
    void* base = device_.reserve_address(va);
    if (!base) return nullptr;
    fresh = std::make_unique<Segment>();
    fresh->addr = reinterpret_cast<std::uintptr_t>(base);
    fresh->va_size = va;
    fresh->page = page;
    fresh->stream = stream;
    fresh->small = small;
    fresh->expandable = true;
    seg = fresh.get();
  }
  if (seg->size + need > seg->va_size ||
      !device_.map(reinterpret_cast<void*>(seg->addr + seg->size), need)) {
    if (fresh) device_.release_address(reinterpret_cast<void*>(fresh->addr), fresh->va_size);
    return nullptr;
  }
  ++stats_.num_device_alloc;
  update(stats_.reserved_bytes, small, static_cast<std::int64_t>(need));
  const std::uintptr_t old_end = seg->addr + seg->size;
  if (history_enabled_) {
    trace(TraceAction::kSegmentMap, old_end, need, stream, AllocationContext::current_id());
  }
  seg->size += need;
  if (fresh) {
    update(stats_.segment, small, 1);
    expandable_segments_[{small, stream}] = seg;
    segments_[seg->addr] = std::move(fresh);
  }
  if (tail && tail->is_free()) {
    pool_update(tail, tail->addr, tail->size + need);
    return tail;
  }
  Block* b = new_block();
  b->addr = old_end;
  b->size = need;
  b->stream = stream;
  b->segment = seg;
  b->prev = tail;
  if (tail) {
    tail->next = b;
  } else {
    seg->head = b;
  }
  pool_insert(b);
  return b;
}

// How much cached memory must go back before `want` more bytes can be reserved: whatever the
// limit or the device's free memory is short of. When neither explains the failure (the device
// is fragmented), at least `want`.
std::size_t CachingAllocator::bytes_to_release(std::size_t want) {
  std::size_t needed = 0;
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  if (limit_ != 0 && reserved + want > limit_) needed = reserved + want - limit_;
  std::size_t free_bytes = 0, total = 0;
  device_.mem_get_info(&free_bytes, &total);
  if (want > free_bytes) needed = std::max(needed, want - free_bytes);
  return needed == 0 ? want : needed;
}

std::size_t CachingAllocator::releasable_bytes(const Segment& s) const {
  if (!s.expandable) return s.head && !s.head->next && s.head->is_free() ? s.size : 0;
  Block* tail = nullptr;
  for (Block* b = s.head; b; b = b->next) tail = b;
  if (!tail || !tail->is_free()) return 0;
  const std::uintptr_t start = s.addr + round_up(tail->addr - s.addr, s.page);
  const std::uintptr_t end = s.addr + s.size;
  return end > start ? end - start : 0;
}

// Frees whole free segments (and free tail pages of expandable ones). With a target, it frees
// the smallest single segment that covers it, else the largest ones until covered: that keeps
// as much cache as possible while still making room. SIZE_MAX frees everything.
std::size_t CachingAllocator::release_cached(std::size_t needed) {
  std::vector<std::pair<std::size_t, Segment*>> candidates;
  for (auto& [addr, seg] : segments_) {
    const std::size_t r = releasable_bytes(*seg);
    if (r > 0) candidates.emplace_back(r, seg.get());
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::size_t freed = 0;
  if (needed != SIZE_MAX) {
    for (auto& [bytes, seg] : candidates) {
      if (bytes >= needed) return release_segment(seg);
    }
    for (auto it = candidates.rbegin(); it != candidates.rend() && freed < needed; ++it) {
      freed += release_segment(it->second);
    }
    return freed;
  }
  for (auto& [bytes, seg] : candidates) freed += release_segment(seg);
  return freed;
}

std::size_t CachingAllocator::release_segment(Segment* s) {
  const bool small = s->small;
  const std::uintptr_t addr = s->addr;
  if (!s->expandable) {
    const std::size_t size = s->size;
    pool_erase(s->head);
    delete_block(s->head);
    device_.free(reinterpret_cast<void*>(addr));
    ++stats_.num_device_free;
    update(stats_.segment, small, -1);
    update(stats_.reserved_bytes, small, -static_cast<std::int64_t>(size));
    if (s->oversize) stats_.oversize_segments.update(-1);
    if (history_enabled_) {
      trace(TraceAction::kSegmentFree, addr, size, s->stream, AllocationContext::current_id());
    }
    segments_.erase(addr);
    return size;
  }
  Block* tail = nullptr;
  for (Block* b = s->head; b; b = b->next) tail = b;
  const std::uintptr_t start = addr + round_up(tail->addr - addr, s->page);
  const std::size_t bytes = addr + s->size - start;
  device_.unmap(reinterpret_cast<void*>(start), bytes);
  ++stats_.num_device_free;
  update(stats_.reserved_bytes, small, -static_cast<std::int64_t>(bytes));
  if (history_enabled_) {
    trace(TraceAction::kSegmentUnmap, start, bytes, s->stream, AllocationContext::current_id());
  }
  if (start == tail->addr) {
    pool_erase(tail);
    unlink(tail);
    delete_block(tail);
  } else {
    pool_update(tail, tail->addr, start - tail->addr);
  }
  s->size -= bytes;
  if (s->size == 0) {
    device_.release_address(reinterpret_cast<void*>(addr), s->va_size);
    update(stats_.segment, small, -1);
    expandable_segments_.erase({small, s->stream});
    segments_.erase(addr);
  }
  return bytes;
}

bool CachingAllocator::should_split(const Block* b, std::size_t size) const {
  const std::size_t remaining = b->size - size;
  if (b->segment->small || b->segment->expandable) return remaining >= kMinBlockSize;
  // A large-pool sliver of <= 1 MiB would only ever serve small requests, which never come here.
  return size < max_split_size_ && remaining > kSmallSize;
}

// b is a free block in its pool, at least `size` bytes.
void* CachingAllocator::take_block(Block* b, std::size_t size, std::size_t requested) {
  Segment* seg = b->segment;
  if (should_split(b, size)) {
    // Hand out the front as a new block; b keeps the rest (and usually its place in the pool).
    Block* front = new_block();
    front->addr = b->addr;
    front->size = size;
    front->stream = b->stream;
    front->segment = seg;
    front->prev = b->prev;
    front->next = b;
    if (b->prev) {
      b->prev->next = front;
    } else {
      seg->head = front;
    }
    b->prev = front;
    pool_update(b, b->addr + size, b->size - size);
    b = front;
  } else {
    pool_erase(b);
  }
  b->allocated = true;
  b->requested = requested;
  b->context = AllocationContext::current_id();
  b->oversize = b->size >= max_split_size_;
  allocated_blocks_.insert(b->addr, b);
  const int p = pool_index(seg->small);
  const auto bytes = static_cast<std::int64_t>(b->size);
  add(stats_.allocation, p, 1);
  add(stats_.allocated_bytes, p, bytes);
  add(stats_.requested_bytes, p, static_cast<std::int64_t>(requested));
  add(stats_.active, p, 1);
  add(stats_.active_bytes, p, bytes);
  if (b->oversize) stats_.oversize_allocations.update(1);
  if (history_enabled_) trace(TraceAction::kAlloc, b->addr, b->size, b->stream, b->context);
  return reinterpret_cast<void*>(b->addr);
}

void* CachingAllocator::allocate(std::size_t bytes, StreamId stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard lock(mutex_);
  if (bytes > kMaxRequest) throw_oom(bytes, bytes, stream, false);
  if (!events_.empty()) process_events();
  const std::size_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  if (Block* b = find_free_block(small, stream, size)) return take_block(b, size, bytes);
  bool limit_hit = false;
  Block* b = get_new_memory(small, stream, size, &limit_hit);
  bool retried = false;
  if (!b) {
    // A request larger than the device or the limit can never fit: flushing the cache for it
    // would only make the caller's next, smaller attempt slower.
    std::size_t free_bytes = 0, total = 0;
    device_.mem_get_info(&free_bytes, &total);
    if (size > total || (limit_ != 0 && size > limit_)) throw_oom(bytes, size, stream, limit_hit);
  }
  if (!b) {
    // First give back only what is missing, keeping the rest of the cache warm.
    const bool vm = expandable_ && device_.supports_virtual_memory();
    const std::size_t page = round_up(small ? kSmallBuffer : kLargeBuffer, device_.granularity());
    const std::size_t want = vm ? round_up(size, page) : segment_size_for(size);
    if (release_cached(bytes_to_release(want)) > 0) {
      retried = true;
      ++stats_.num_alloc_retries;
      b = get_new_memory(small, stream, size, &limit_hit);
    }
  }
  if (!b) {
    // Then wait for every pending free and give back everything.
    synchronize_and_free_events();
    b = find_free_block(small, stream, size);
    if (!b && release_cached(SIZE_MAX) > 0) {
      if (!retried) ++stats_.num_alloc_retries;
      b = get_new_memory(small, stream, size, &limit_hit);
    }
  }
  if (!b) throw_oom(bytes, size, stream, limit_hit);
  return take_block(b, size, bytes);
}

CachingAllocator::Block* CachingAllocator::lookup_allocated(void* ptr, const char* op) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (Block* b = allocated_blocks_.find(addr)) return b;
  // Say *why* the pointer is wrong: an interior pointer and a stale one need different fixes.
  auto seg = segments_.upper_bound(addr);
  if (seg != segments_.begin()) {
    --seg;
    for (Block* b = seg->second->head; b; b = b->next) {
      if (addr >= b->addr && addr < b->addr + b->size) {
        if (b->allocated) {
          MG_THROW(ValueError, "CachingAllocator::", op, ": pointer ", hex(addr), " points ",
                   addr - b->addr, " bytes into the block at ", hex(b->addr), " (",
                   format_bytes(b->size), "); pass the pointer allocate() returned");
        }
        MG_THROW(ValueError, "CachingAllocator::", op, ": pointer ", hex(addr),
                 " is not allocated (already freed?) on device ", device_index_);
      }
    }
  }
  MG_THROW(ValueError, "CachingAllocator::", op, ": pointer ", hex(addr),
           " was not returned by allocate() of this allocator (device ", device_index_, ")");
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  Block* b = lookup_allocated(ptr, "free");
  allocated_blocks_.erase(b->addr);
  b->allocated = false;
  const int p = pool_index(b->segment->small);
  sub(stats_.allocation, p, 1);
  sub(stats_.allocated_bytes, p, static_cast<std::int64_t>(b->size));
  sub(stats_.requested_bytes, p, static_cast<std::int64_t>(b->requested));
  if (b->oversize) stats_.oversize_allocations.update(-1);
  b->oversize = false;
  if (history_enabled_) trace(TraceAction::kFreeRequested, b->addr, b->size, b->stream, b->context);
  if (b->stream_uses.empty()) {
    free_block(b);
  } else {
    insert_events(b);
  }
}

void CachingAllocator::free_block(Block* b) {
  const int pidx = pool_index(b->segment->small);
  sub(stats_.active, pidx, 1);
  sub(stats_.active_bytes, pidx, static_cast<std::int64_t>(b->size));
  if (history_enabled_) trace(TraceAction::kFreeCompleted, b->addr, b->size, b->stream, b->context);
  b->requested = 0;
  b->context = 0;
  // Merge with free neighbours. A neighbour already in the pool absorbs b (and keeps its place
  // in the pool when the order allows), so freeing a block carved from a free one is cheap.
  Block* p = b->prev && b->prev->is_free() ? b->prev : nullptr;
  Block* n = b->next && b->next->is_free() ? b->next : nullptr;
  if (!p && !n) {
    pool_insert(b);
    return;
  }
  std::uintptr_t addr = b->addr;
  std::size_t size = b->size;
  unlink(b);
  delete_block(b);
  if (p && n) {
    size += n->size;
    pool_erase(n);
    unlink(n);
    delete_block(n);
  }
  Block* keep = p ? p : n;
  if (p) addr = p->addr;
  pool_update(keep, addr, size + keep->size);
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard lock(mutex_);
  Block* b = lookup_allocated(ptr, "record_stream");
  if (stream == b->stream) return;  // stream order already protects the owning stream
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
}

void CachingAllocator::insert_events(Block* b) {
  for (StreamId s : b->stream_uses) {
    const EventId e = device_.record_event(s);
    ++b->event_count;
    events_[s].push_back(PendingEvent{e, b});
  }
  b->stream_uses.clear();
}

// Events on one stream complete in order, so each queue is scanned only up to its first
// unfinished event.
void CachingAllocator::process_events() {
  for (auto it = events_.begin(); it != events_.end();) {
    auto& queue = it->second;
    while (!queue.empty()) {
      const PendingEvent pe = queue.front();
      if (!device_.event_query(pe.event)) break;
      device_.destroy_event(pe.event);
      queue.pop_front();
      if (--pe.block->event_count == 0) free_block(pe.block);
    }
    it = queue.empty() ? events_.erase(it) : std::next(it);
  }
}

void CachingAllocator::synchronize_and_free_events() {
  if (events_.empty()) return;
  ++stats_.num_sync_all_streams;
  for (auto& [stream, queue] : events_) {
    for (const PendingEvent& pe : queue) {
      device_.event_synchronize(pe.event);
      device_.destroy_event(pe.event);
      if (--pe.block->event_count == 0) free_block(pe.block);
    }
  }
  events_.clear();
}

void CachingAllocator::empty_cache_locked() {
  synchronize_and_free_events();
  release_cached(SIZE_MAX);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  empty_cache_locked();
}

std::size_t CachingAllocator::allocation_size(void* ptr) const {
  std::lock_guard lock(mutex_);
  return lookup_allocated(ptr, "allocation_size")->size;
}

}  // namespace mg::cuda
