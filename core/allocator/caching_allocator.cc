// The allocation machinery of CachingAllocator: pools, segments, split/coalesce, stream events,
// expandable segments and the free-cache-then-retry path. Reports and settings: *_stats.cc.
//
// The whole policy (docs/caching_allocator.md says it at length):
//  1. Every request rounds up to a multiple of 512 B (round_size).
//  2. Requests up to 1 MiB take the small pool (2 MiB segments); larger ones the large pool
//     (20 MiB segments below 10 MiB, else their own size rounded to 2 MiB: segment_size_for).
//  3. Best fit: the smallest free block of the caller's stream that fits (a set ordered by
//     stream, size, address); a whole free segment over 20 MiB is kept from requests under an
//     eighth of it (segment reuse ratio) unless the device refuses a new one.
//  4. Split: the rest of a bigger block becomes free when it is >= 512 B (small pool) or
//     > 1 MiB (large pool); blocks of max_split_size or more are never split.
//  5. Coalesce: a freed block merges with free neighbours in its segment.
//  6. Streams: a block is reused only on its stream; record_stream defers its reuse until
//     events on the other streams complete.
//  7. Growth budget: new device memory past (1 + slack) x the peak allocated frees cache first.
//  8. On OOM: a skipped whole segment, then free just the missing bytes and retry, then wait
//     for pending frees, free every free segment and retry, then OutOfMemoryError saying what
//     was asked, allocated, reserved and free (nothing left half-done).
//  9. empty_cache returns every wholly free segment (and free pages of expandable ones).
// 10. set_memory_fraction / set_memory_limit cap reserved bytes; over the cap is an OOM.
// 11. Expandable segments map and unmap pages in one virtual range per (pool, stream).
// 12. Blocks allocated during CUDA graph capture live in a private pool only it reuses.
#include "core/allocator/caching_allocator.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/profiler.h"

namespace mg::allocator {
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
  try {
    synchronize_and_free_events();
    for (auto& [addr, seg] : segments_) {
      if (seg->expandable) {
        // Unmap each backed run, then give the address range back. Blocks still allocated may
        // be in use by queued work: wait for the segment's stream first.
        device_.synchronize_stream(seg->stream);
        for (Block* b = seg->head; b;) {
          if (!b->mapped) {
            b = b->next;
            continue;
          }
          const std::uintptr_t start = b->addr;
          while (b && b->mapped) b = b->next;
          const std::uintptr_t end = b ? b->addr : seg->addr + seg->va_size;
          device_.unmap(reinterpret_cast<void*>(start), end - start);
        }
        device_.release_address(reinterpret_cast<void*>(seg->addr), seg->va_size);
      } else {
        device_.free(reinterpret_cast<void*>(seg->addr));
      }
    }
  } catch (...) {
    // A destructor must not throw; the device is being torn down anyway.
  }
  for (auto& [addr, seg] : segments_) {
    for (Block* b = seg->head; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
  for (Block* b : spare_blocks_) delete b;
}

void CachingAllocator::update(StatArray& stat, bool small, std::int64_t delta) {
  stat[kAllPools].update(delta);
  stat[small ? kSmallPool : kLargePool].update(delta);
}

void CachingAllocator::trace(TraceAction action, std::uintptr_t addr, std::size_t size, StreamId stream,
                             std::uint32_t context) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  history_.push_back(
      TraceEntry{action, addr, size, stream, seq_++, static_cast<std::uint64_t>(ns), AllocationContext::name(context)});
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
  b->freed_at = 0;
  b->context = 0;
  b->allocated = b->oversize = b->counted_split = false;
  b->mapped = true;
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
  const bool in_order =
      (it == set.begin() || less(*std::prev(it), key)) && (std::next(it) == set.end() || less(key, *std::next(it)));
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
CachingAllocator::Block* CachingAllocator::find_free_block(bool small, StreamId stream, std::size_t size, bool strict) {
  BlockSet& set = pool_for(small).blocks;
  auto it = set.lower_bound(BlockKey{stream, size, 0});
  if (strict && segment_reuse_ratio_ > 0) {
    // A cached segment that is entirely free was made for a request of its size: keep it whole
    // for the next one rather than carving a small request out of it (see the docs). Blocks of
    // expandable segments always have neighbours, so this only skips fixed segments.
    while (it != set.end() && (*it)->stream == stream && !(*it)->prev && !(*it)->next && (*it)->size > kLargeBuffer &&
           static_cast<double>((*it)->size) > segment_reuse_ratio_ * static_cast<double>(size)) {
      ++it;
    }
  }
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

// How far reserved memory may grow before new memory is paid for with cached memory:
// (1 + slack) x the most ever allocated at once, counting the request being served.
std::size_t CachingAllocator::growth_budget(std::size_t request) const {
  if (reserved_slack_ < 0) return SIZE_MAX;
  const auto& a = stats_.allocated_bytes[kAllPools];
  const std::size_t live =
      std::max({allocated_hwm_, static_cast<std::size_t>(a.peak), static_cast<std::size_t>(a.current) + request});
  return static_cast<std::size_t>(static_cast<double>(live) * (1.0 + reserved_slack_));
}

CachingAllocator::Block* CachingAllocator::get_new_memory(bool small, StreamId stream, std::size_t size,
                                                          bool* limit_hit) {
  *limit_hit = false;
  if (expandable_ && device_.supports_virtual_memory() && !is_pool_key(stream)) {
    return grow_expandable(small, stream, size, limit_hit);
  }
  return alloc_segment(small, stream, segment_size_for(size), limit_hit);
}

CachingAllocator::Block* CachingAllocator::alloc_segment(bool small, StreamId stream, std::size_t seg_size,
                                                         bool* limit_hit) {
  // Growing past the budget: first give back entirely free segments too small for this
  // request (they are what a growing workload leaves behind). Larger ones are kept: they serve
  // their own size class, and freeing them would only make the next step allocate them again.
  if (const std::size_t budget = growth_budget(seg_size); reserved() + seg_size > budget) {
    release_cached(reserved() + seg_size - budget, /*below=*/seg_size);
  }
  const std::size_t reserved_now = reserved();
  if (limit_ != 0 && reserved_now + seg_size > limit_) {
    *limit_hit = true;
    return nullptr;
  }
  void* ptr = device_.malloc(seg_size);
  if (!ptr) return nullptr;
  profiler::instant("segment alloc", "allocator", {{"bytes", static_cast<int64_t>(seg_size)}});
  Segment* seg = add_segment(reinterpret_cast<std::uintptr_t>(ptr), seg_size, small, stream);
  seg->size = seg_size;
  seg->oversize = seg_size >= max_split_size_;
  ++stats_.num_device_alloc;
  update(stats_.reserved_bytes, small, static_cast<std::int64_t>(seg_size));
  if (seg->oversize) stats_.oversize_segments.update(1);
  if (history_enabled_) {
    trace(TraceAction::kSegmentAlloc, seg->addr, seg_size, stream, AllocationContext::current_id());
  }
  pool_insert(seg->head);
  return seg->head;
}

// A new segment at [addr, addr + span) tiled by one block, registered and counted.
CachingAllocator::Segment* CachingAllocator::add_segment(std::uintptr_t addr, std::size_t span, bool small,
                                                         StreamId stream) {
  auto seg = std::make_unique<Segment>();
  seg->addr = addr;
  seg->stream = stream;
  seg->small = small;
  Block* b = new_block();
  b->addr = addr;
  b->size = span;
  b->stream = stream;
  b->segment = seg.get();
  seg->head = b;
  update(stats_.segment, small, 1);
  Segment* raw = seg.get();
  segments_[addr] = std::move(seg);
  return raw;
}

// The (pool, stream)'s expandable segment, created on first use: an address range twice the
// device's memory (address space is cheap, and the slack lets live blocks sit anywhere without
// boxing in a large request), all of it one unmapped block.
CachingAllocator::Segment* CachingAllocator::expandable_segment(bool small, StreamId stream, std::size_t size) {
  if (auto it = expandable_segments_.find({small, stream}); it != expandable_segments_.end()) {
    return it->second;
  }
  const std::size_t gran = device_.granularity();
  const std::size_t page = round_up(small ? kSmallBuffer : kLargeBuffer, gran);
  std::size_t free_bytes = 0, total = 0;
  device_.mem_get_info(&free_bytes, &total);
  const std::size_t va = round_up(std::max(2 * total, size), page);
  void* base = device_.reserve_address(va);
  if (!base) return nullptr;
  Segment* seg = add_segment(reinterpret_cast<std::uintptr_t>(base), va, small, stream);
  seg->va_size = va;
  seg->gran = gran;
  seg->page = page;
  seg->expandable = true;
  seg->head->mapped = false;
  expandable_segments_[{small, stream}] = seg;
  return seg;
}

// Called when an expandable segment has nothing mapped any more: one unmapped block is left.
void CachingAllocator::release_expandable(Segment* s) {
  device_.release_address(reinterpret_cast<void*>(s->addr), s->va_size);
  update(stats_.segment, s->small, -1);
  for (Block* b = s->head; b;) {
    Block* next = b->next;
    delete_block(b);
    b = next;
  }
  expandable_segments_.erase({s->small, s->stream});
  segments_.erase(s->addr);
}

// Makes room for `size` bytes in the (pool, stream)'s expandable segment by mapping pages into
// the run of free address space that needs the fewest new pages: a hole left by freed (and
// unmapped) blocks, or the unmapped end. Returns the pooled free block that holds the request.
CachingAllocator::Block* CachingAllocator::grow_expandable(bool small, StreamId stream, std::size_t size,
                                                           bool* limit_hit) {
  Segment* seg = expandable_segment(small, stream, size);
  if (!seg) return nullptr;
  // Pages to map when the request takes `take` bytes from the start of unmapped block c. The
  // unmapped end of the range grows by whole pages (fewer, larger map calls); holes by granules.
  auto map_bytes = [seg](const Block* c, std::size_t take) {
    const std::size_t unit = c->next ? seg->gran : seg->page;
    return std::min(c->size, round_up(take, unit));
  };
  Block* start = nullptr;
  std::uintptr_t run_end = 0;
  std::size_t to_map = SIZE_MAX;
  for (Block* b = seg->head; b; b = b->next) {
    if (!b->is_free() || (b->prev && b->prev->is_free())) continue;  // runs start here only
    std::size_t have = 0, m = 0;
    Block* c = b;
    for (; c && c->is_free(); c = c->next) {
      if (have < size) {
        const std::size_t take = std::min(c->size, size - have);
        if (!c->mapped) m += map_bytes(c, take);
        have += take;
      }
    }
    if (have >= size && m < to_map) {
      start = b;
      run_end = c ? c->addr : seg->addr + seg->va_size;
      to_map = m;
    }
  }
  auto give_up = [&]() -> Block* {
    growing_ = nullptr;
    if (seg->size == 0) release_expandable(seg);
    return nullptr;
  };
  if (!start) return give_up();  // no run of address space is long enough
  // Pay for the new pages with free pages elsewhere (never from the run we are about to use)
  // when mapping would exceed the limit or the growth budget.
  std::size_t over = 0;
  if (limit_ != 0 && reserved() + to_map > limit_) over = reserved() + to_map - limit_;
  if (const std::size_t budget = growth_budget(size); reserved() + to_map > budget) {
    over = std::max(over, reserved() + to_map - budget);
  }
  growing_ = seg;  // reclaiming must not release the segment we are about to map into
  if (over > 0) reclaim_pages(over, start->addr, run_end);
  if (limit_ != 0 && reserved() + to_map > limit_) {
    *limit_hit = true;
    return give_up();
  }
  const std::uintptr_t lo = start->addr, hi = lo + size;
  Block* result = start->mapped ? start : nullptr;
  for (Block* c = start; c && c->addr < hi;) {
    if (c->mapped) {
      c = c->next;
      continue;
    }
    const std::size_t bytes = map_bytes(c, std::min(c->size, hi - c->addr));
    if (!device_.map(reinterpret_cast<void*>(c->addr), bytes)) return give_up();
    profiler::instant("segment map", "allocator", {{"bytes", static_cast<int64_t>(bytes)}});
    ++stats_.num_device_alloc;
    update(stats_.reserved_bytes, small, static_cast<std::int64_t>(bytes));
    seg->size += bytes;
    if (history_enabled_) {
      trace(TraceAction::kSegmentMap, c->addr, bytes, stream, AllocationContext::current_id());
    }
    if (bytes < c->size) {  // the rest stays unmapped
      Block* rest = new_block();
      rest->addr = c->addr + bytes;
      rest->size = c->size - bytes;
      rest->stream = stream;
      rest->segment = seg;
      rest->mapped = false;
      rest->prev = c;
      rest->next = c->next;
      if (c->next) c->next->prev = rest;
      c->next = rest;
      c->size = bytes;
    }
    c->mapped = true;
    result = insert_free(c);  // merges with the free blocks before it
    c = result->next;
  }
  growing_ = nullptr;
  return result;
}

// Unmaps the whole free pages of pooled block b in an expandable segment, at most max_bytes of
// them (taken from the top, so the rest of the block stays usable). Returns the bytes unmapped.
// May release the segment when nothing in it stays mapped.
std::size_t CachingAllocator::unmap_free_pages(Block* b, std::size_t max_bytes) {
  Segment* s = b->segment;
  const std::uintptr_t end = b->end();
  std::uintptr_t lo = s->addr + round_up(b->addr - s->addr, s->gran);
  const std::uintptr_t hi = s->addr + (end - s->addr) / s->gran * s->gran;
  if (hi <= lo || max_bytes == 0) return 0;
  if (hi - lo > max_bytes) lo = hi - round_up(max_bytes, s->gran);
  const std::size_t bytes = hi - lo;
  wait_before_unmap(b);
  device_.unmap(reinterpret_cast<void*>(lo), bytes);
  profiler::instant("segment unmap", "allocator", {{"bytes", static_cast<int64_t>(bytes)}});
  ++stats_.num_device_free;
  update(stats_.reserved_bytes, s->small, -static_cast<std::int64_t>(bytes));
  s->size -= bytes;
  if (history_enabled_) {
    trace(TraceAction::kSegmentUnmap, lo, bytes, s->stream, AllocationContext::current_id());
  }
  auto insert_after = [](Block* at, Block* nb) {
    nb->prev = at;
    nb->next = at->next;
    if (at->next) at->next->prev = nb;
    at->next = nb;
  };
  auto make = [&](std::uintptr_t addr, std::size_t size, bool mapped) {
    Block* nb = new_block();
    nb->addr = addr;
    nb->size = size;
    nb->stream = b->stream;
    nb->segment = s;
    nb->mapped = mapped;
    nb->freed_at = b->freed_at;
    return nb;
  };
  Block* top = nullptr;  // [hi, end) stays mapped and free
  if (hi < end) {
    top = make(hi, end - hi, true);
    insert_after(b, top);
  }
  Block* u;
  if (lo > b->addr) {
    u = make(lo, bytes, false);
    insert_after(b, u);
    pool_update(b, b->addr, lo - b->addr);
  } else {
    pool_erase(b);
    b->mapped = false;
    b->size = bytes;
    u = b;
  }
  if (top) pool_insert(top);
  if (u->prev && !u->prev->mapped) {  // join neighbouring unmapped ranges
    Block* p = u->prev;
    p->size += u->size;
    unlink(u);
    delete_block(u);
    u = p;
  }
  if (u->next && !u->next->mapped) {
    Block* n = u->next;
    u->size += n->size;
    unlink(n);
    delete_block(n);
  }
  if (s->size == 0 && s != growing_) release_expandable(s);
  return bytes;
}

// Unmaps at least `need` bytes of free pages from expandable segments (largest free blocks
// first, fewest calls), leaving alone the blocks in [keep_lo, keep_hi). Returns the bytes.
std::size_t CachingAllocator::reclaim_pages(std::size_t need, std::uintptr_t keep_lo, std::uintptr_t keep_hi) {
  std::vector<std::pair<std::size_t, Block*>> candidates;
  for (const auto& [key, s] : expandable_segments_) {
    for (Block* b = s->head; b; b = b->next) {
      if (!b->pooled() || (b->addr < keep_hi && b->end() > keep_lo)) continue;
      const std::uintptr_t lo = s->addr + round_up(b->addr - s->addr, s->gran);
      const std::uintptr_t hi = s->addr + (b->end() - s->addr) / s->gran * s->gran;
      if (hi > lo) candidates.emplace_back(hi - lo, b);
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::size_t freed = 0;
  for (const auto& [bytes, b] : candidates) {
    if (freed >= need) break;
    freed += unmap_free_pages(b, need - freed);
  }
  return freed;
}

// How much cached memory must go back before `want` more bytes can be reserved: whatever the
// limit or the device's free memory is short of. When neither explains the failure (the device
// is fragmented), at least `want`.
std::size_t CachingAllocator::bytes_to_release(std::size_t want) {
  std::size_t needed = 0;
  const std::size_t reserved_now = reserved();
  if (limit_ != 0 && reserved_now + want > limit_) needed = reserved_now + want - limit_;
  std::size_t free_bytes = 0, total = 0;
  device_.mem_get_info(&free_bytes, &total);
  if (want > free_bytes) needed = std::max(needed, want - free_bytes);
  return needed == 0 ? want : needed;
}

std::size_t CachingAllocator::releasable_bytes(const Segment& s) const {
  if (!s.expandable) return s.head && !s.head->next && s.head->is_free() ? s.size : 0;
  std::size_t bytes = 0;
  for (const Block* b = s.head; b; b = b->next) {
    if (!b->pooled()) continue;
    const std::uintptr_t lo = s.addr + round_up(b->addr - s.addr, s.gran);
    const std::uintptr_t hi = s.addr + (b->end() - s.addr) / s.gran * s.gran;
    if (hi > lo) bytes += hi - lo;
  }
  return bytes;
}

// Frees whole free segments (and the free pages of expandable ones). With a target, it frees
// the smallest single segment that covers it, else the largest ones until covered: that keeps
// as much cache as possible while still making room. SIZE_MAX frees everything.
std::size_t CachingAllocator::release_cached(std::size_t needed, std::size_t below) {
  if (!routes_.empty()) return 0;  // a capture is under way: no cudaFree until it ends
  std::vector<std::pair<std::size_t, Segment*>> candidates;
  for (auto& [addr, seg] : segments_) {
    if (!releasable_pool_segment(*seg)) continue;
    const std::size_t r = releasable_bytes(*seg);
    if (r > 0 && (seg->expandable || seg->size < below)) candidates.emplace_back(r, seg.get());
  }
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
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
    profiler::instant("segment free", "allocator", {{"bytes", static_cast<int64_t>(size)}});
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
  std::vector<Block*> free_blocks;
  for (Block* b = s->head; b; b = b->next) {
    if (b->pooled()) free_blocks.push_back(b);
  }
  std::size_t bytes = 0;
  for (Block* b : free_blocks) bytes += unmap_free_pages(b, SIZE_MAX);  // may release s
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
  stream = route(stream);
  if (!events_.empty() && routes_.empty()) process_events();
  const std::size_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  if (Block* b = find_free_block(small, stream, size)) return take_block(b, size, bytes);
  {
    // A request larger than the device or the limit can never fit: giving back cache for it
    // (growth budget, retry) would only make the caller's next, smaller attempt slower.
    std::size_t free_bytes = 0, total = 0;
    device_.mem_get_info(&free_bytes, &total);
    if (size > total || (limit_ != 0 && size > limit_)) {
      throw_oom(bytes, size, stream, limit_ != 0 && reserved() + size > limit_);
    }
  }
  bool limit_hit = false;
  Block* b = get_new_memory(small, stream, size, &limit_hit);
  // Rather than fail or flush the cache, carve the request out of a segment kept whole.
  if (!b) b = find_free_block(small, stream, size, /*strict=*/false);
  bool retried = false;
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
  if (!b && routes_.empty()) {
    // Then wait for every pending free and give back everything (never during a capture).
    synchronize_and_free_events();
    b = find_free_block(small, stream, size, /*strict=*/false);
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
          MG_THROW(ValueError, "CachingAllocator::", op, ": pointer ", hex(addr), " points ", addr - b->addr,
                   " bytes into the block at ", hex(b->addr), " (", format_bytes(b->size),
                   "); pass the pointer allocate() returned");
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
  b->freed_at = ++free_seq_;
  release_if_orphaned(insert_free(b)->segment);  // the last block of a released graph pool's segment
}

// Puts free, mapped, unpooled block b into its pool, merged with free neighbours. A neighbour
// already in the pool absorbs b (and keeps its place in the pool when the order allows), so
// freeing a block carved from a free one is cheap. Returns the pooled block.
CachingAllocator::Block* CachingAllocator::insert_free(Block* b) {
  Block* p = b->prev && b->prev->pooled() ? b->prev : nullptr;
  Block* n = b->next && b->next->pooled() ? b->next : nullptr;
  if (!p && !n) {
    pool_insert(b);
    return b;
  }
  std::uintptr_t addr = b->addr;
  std::size_t size = b->size;
  const std::uint64_t b_freed_at = b->freed_at, n_freed_at = p && n ? n->freed_at : 0;
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
  // The merged block was last used when its most recently freed part was.
  keep->freed_at = std::max({keep->freed_at, b_freed_at, n_freed_at});
  pool_update(keep, addr, size + keep->size);
  return keep;
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard lock(mutex_);
  Block* b = lookup_allocated(ptr, "record_stream");
  if (route(stream) == b->stream) return;  // stream order already protects the owning stream
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

// Before pages of a free block are unmapped, the work that last used them must be done:
// cuMemUnmap does not wait for queued kernels. The block's uses on other streams were waited
// for with events before it became free, so only its segment's stream is left, and only the work
// queued there before the block was freed. A cudaStreamSynchronize of that one stream (never a
// device-wide sync: NCCL, copy and other compute streams keep running) covers every block of the
// stream freed before it began, so it runs at most once per stream until more blocks are freed.
void CachingAllocator::wait_before_unmap(const Block* b) {
  const StreamId stream = b->segment->stream;
  auto it = stream_synced_.find(stream);
  if (it != stream_synced_.end() && it->second >= b->freed_at) return;
  const std::uint64_t covers = free_seq_;  // every block freed so far had its work queued
  device_.synchronize_stream(stream);
  ++stats_.num_unmap_stream_syncs;
  stream_synced_[stream] = covers;
}

// The stream waits happen unlocked: other threads keep allocating from the cache (and the
// streams keep being fed) meanwhile. What is freed during the wait has a later freed_at than the
// wait covers, so wait_before_unmap waits once more, under the lock, for such blocks only.
void CachingAllocator::empty_cache() {
  std::vector<std::pair<StreamId, std::uint64_t>> waits;
  {
    std::lock_guard lock(mutex_);
    synchronize_and_free_events();
    for (const auto& [key, s] : expandable_segments_) {
      if (releasable_bytes(*s) == 0) continue;
      auto it = stream_synced_.find(s->stream);
      const bool covered = it != stream_synced_.end() && it->second >= free_seq_;
      if (!covered && std::find_if(waits.begin(), waits.end(), [&](const auto& w) { return w.first == s->stream; }) ==
                          waits.end()) {
        waits.emplace_back(s->stream, free_seq_);
      }
    }
  }
  for (const auto& [stream, covers] : waits) device_.synchronize_stream(stream);
  std::lock_guard lock(mutex_);
  for (const auto& [stream, covers] : waits) {
    ++stats_.num_unmap_stream_syncs;
    std::uint64_t& synced = stream_synced_[stream];
    synced = std::max(synced, covers);
  }
  empty_cache_locked();
}

std::size_t CachingAllocator::allocation_size(void* ptr) const {
  std::lock_guard lock(mutex_);
  return lookup_allocated(ptr, "allocation_size")->size;
}

}  // namespace mg::allocator
