// The block-caching device allocator: PyTorch's CUDACachingAllocator semantics (pools, best-fit,
// split/coalesce, stream-ordered reuse, limits, retry-then-OOM, stats), over any DeviceMemory.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator/device_memory.h"
#include "core/allocator/memory_snapshot.h"

namespace mg::allocator {

// PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp), same meaning.
inline constexpr std::size_t kMinBlockSize = 512;                   // every size rounds up to this
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;     // largest "small" request
inline constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;   // small-pool segment size
inline constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;  // segment for 1-10 MiB
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kRoundLarge = std::size_t{2} << 20;  // segment rounding above 10 MiB
// memgrad's fragmentation policies (not in PyTorch), see set_reserved_slack and
// set_segment_reuse_ratio.
inline constexpr double kDefaultReservedSlack = 0.02;
inline constexpr double kDefaultSegmentReuseRatio = 8.0;

// One counter, tracked PyTorch-style: current value, high-water mark, and totals of increases
// ("allocated") and decreases ("freed") since the last reset.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;
  void update(std::int64_t delta) {
    current += delta;
    if (delta > 0) {
      allocated += delta;
      if (current > peak) peak = current;
    } else {
      freed -= delta;
    }
  }
};

enum StatType : int { kAllPools = 0, kSmallPool = 1, kLargePool = 2 };
using StatArray = std::array<Stat, 3>;  // indexed by StatType

struct DeviceStats {
  StatArray allocation;      // blocks handed out by allocate()
  StatArray segment;         // device allocations (segments)
  StatArray active;          // allocated + pending-free blocks
  StatArray inactive_split;  // free blocks that are part of a split segment
  StatArray allocated_bytes;
  StatArray reserved_bytes;  // bytes held from the device
  StatArray active_bytes;
  StatArray inactive_split_bytes;  // memory that fragmentation may strand
  StatArray requested_bytes;       // what callers asked for, before rounding
  Stat oversize_allocations;       // allocations >= max_split_size
  Stat oversize_segments;
  std::int64_t num_alloc_retries = 0;  // allocations that had to free cache and retry
  std::int64_t num_ooms = 0;
  std::int64_t num_device_alloc = 0;      // successful malloc + map calls
  std::int64_t num_device_free = 0;       // free + unmap calls
  std::int64_t num_sync_all_streams = 0;  // times the allocator waited for every pending event
  // Stream waits before unmapping expandable-segment pages (one per stream, until more frees).
  std::int64_t num_unmap_stream_syncs = 0;
};

// Where the cache loses memory to fragmentation. ratio = 1 - largest_free / free_cached:
// 0 means all cached memory is one usable block, near 1 means it is shattered.
struct FragmentationInfo {
  std::size_t largest_free_block = 0;
  std::size_t free_cached = 0;           // inactive blocks (reusable now)
  std::size_t reserved_unallocated = 0;  // reserved - allocated (includes pending frees)
  double ratio = 0.0;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(DeviceMemory& device, int device_index = 0);
  // Returns every segment to the device; pointers still allocated become invalid.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // nullptr for 0 bytes. Throws mg::OutOfMemoryError (state unchanged) when nothing works.
  void* allocate(std::size_t bytes, StreamId stream = kDefaultStream);
  // nullptr is a no-op; anything else must be a pointer allocate() returned (mg::ValueError).
  void free(void* ptr);
  // The block's usable size (>= the rounded request).
  std::size_t allocation_size(void* ptr) const;
  // ptr is (also) used by work queued on `stream`: on free, reuse waits for that work.
  void record_stream(void* ptr, StreamId stream);

  // Waits for pending frees, then returns every fully free segment (and free tail pages of
  // expandable segments) to the device. Unmapping waits for the streams of the expandable
  // segments being shrunk (not the device), with the allocator unlocked while it waits.
  void empty_cache();

  // Caps reserved bytes at fraction * device total; fraction in (0, 1].
  void set_memory_fraction(double fraction);
  // Caps reserved bytes at `bytes` (> 0). Does not free anything by itself: when the cache is
  // over the new cap, later allocations free cache before growing.
  void set_memory_limit(std::size_t bytes);
  void clear_memory_limit();
  std::size_t memory_limit() const;  // 0 when unlimited

  // Settings (apply to segments created afterwards).
  // Expandable segments need DeviceMemory::supports_virtual_memory(); otherwise ignored.
  void set_expandable_segments(bool enabled);
  // Growth budget (beyond PyTorch; docs/caching_allocator.md "Keeping reserved close to
  // allocated"): when a request needs new device memory and reserved would exceed
  // (1 + slack) x the most ever allocated, cached memory pays for it first: expandable
  // segments unmap free pages, fixed segments free entirely free segments smaller than the new
  // one. Default 0.02; a negative value turns it off (PyTorch: cache is only freed on OOM).
  void set_reserved_slack(double slack);
  // Fixed segments: a request may split an entirely free cached segment larger than 20 MiB only
  // if that segment is at most `ratio` times the request; otherwise it gets its own segment
  // (and still takes the big one when the device or the limit refuses). Default 8; 0 turns
  // it off (PyTorch's plain best fit).
  void set_segment_reuse_ratio(double ratio);
  // Blocks >= this are never split, and small requests never take them. > 20 MiB, or SIZE_MAX.
  void set_max_split_size(std::size_t bytes);
  // PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "expandable_segments:True,max_split_size_mb:128".
  // Also understands per_process_memory_fraction:0.5, reserved_slack:0.02 and
  // segment_reuse_ratio:8. Unknown keys raise mg::ValueError.
  void configure(const std::string& config);

  // --- torch.cuda-style accessors ---
  std::size_t memory_allocated() const;
  std::size_t max_memory_allocated() const;
  std::size_t memory_reserved() const;
  std::size_t max_memory_reserved() const;
  void reset_peak_memory_stats();
  void reset_accumulated_memory_stats();
  DeviceStats stats() const;
  // Keys as in torch.cuda.memory_stats(): "allocated_bytes.all.current", "segment.large_pool.peak",
  // "num_alloc_retries", ... plus "fragmentation.*" and "memory_limit".
  std::map<std::string, std::int64_t> memory_stats() const;
  FragmentationInfo fragmentation() const;
  std::string memory_summary() const;

  // --- snapshots and history ---
  MemorySnapshot snapshot() const;
  // Keeps the last max_entries trace entries in a ring buffer; disabling clears it.
  void record_history(bool enabled, std::size_t max_entries = 100000);
  void write_snapshot_json(const std::string& path) const;
  void write_timeline_html(const std::string& path) const;

  // Walks every segment, block, pool and counter and raises mg::Error on the first broken
  // invariant. O(blocks); meant for tests and debugging.
  void check_invariants() const;

  int device_index() const { return device_index_; }

  // --- private pools for captured graphs (docs/caching_allocator.md "Captured graphs") ---
  // A captured graph replays fixed addresses, so the blocks it used must never go to eager code
  // while it lives. Blocks allocated into a private pool are reused only by allocations routed
  // to the same pool (graphs that share it), empty_cache and the retry path never free them, and
  // they always sit in fixed segments (never expandable ones: unmapping would need a stream).
  using PoolId = std::uint64_t;
  // A new pool, held once.
  PoolId create_pool();
  // One more holder (another graph sharing the pool). mg::ValueError for an unknown or released pool.
  void retain_pool(PoolId id);
  // Drops one hold. At zero the pool is gone: its free segments go back to the device now, the
  // others when their last block is freed (tensors a graph produced may outlive it).
  void release_pool(PoolId id);
  // Until end_allocate_to_pool(stream), allocations on `stream` come from pool `id` (a capture,
  // and the warm-up before it). Meanwhile nothing is returned to the device and pending-event
  // queries are deferred: both are illegal while a stream is being captured.
  void begin_allocate_to_pool(PoolId id, StreamId stream);
  void end_allocate_to_pool(StreamId stream);
  // Bytes reserved (segments) by pool `id`; 0 for an unknown pool.
  std::size_t pool_reserved_bytes(PoolId id) const;

 private:
  struct Segment;
  struct Block;
  // A pool's blocks and segments carry this stream key instead of a real stream: the pools are
  // ordered by stream first, so eager requests (real streams) can never find them. Real stream
  // handles are user-space addresses, below 2^63.
  static constexpr StreamId kPoolKeyBit = StreamId{1} << 63;
  static bool is_pool_key(StreamId s) { return (s & kPoolKeyBit) != 0; }
  static StreamId pool_key(PoolId id) { return kPoolKeyBit | id; }
  // The stream key an allocation on `stream` uses: its pool's key while routed, else itself.
  StreamId route(StreamId stream) const {
    for (const auto& [s, key] : routes_)
      if (s == stream) return key;
    return stream;
  }
  // Whether a segment may be given back to the device now.
  bool releasable_pool_segment(const Segment& s) const;
  void release_if_orphaned(Segment* s);
  void release_orphaned_segments();

  // A pool position without a Block: what lookups and order checks compare against.
  struct BlockKey {
    StreamId stream;
    std::size_t size;
    std::uintptr_t addr;
  };
  // Pool order: (stream, size, address). Transparent, so lower_bound takes a BlockKey.
  struct BlockLess {
    using is_transparent = void;
    static BlockKey key(const Block* b);
    static BlockKey key(const BlockKey& k) { return k; }
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      const BlockKey x = key(a), y = key(b);
      if (x.stream != y.stream) return x.stream < y.stream;
      if (x.size != y.size) return x.size < y.size;
      return x.addr < y.addr;
    }
  };
  using BlockSet = std::set<Block*, BlockLess>;
  struct Block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::size_t requested = 0;
    StreamId stream = kDefaultStream;
    Segment* segment = nullptr;
    Block* prev = nullptr;
    Block* next = nullptr;
    int event_count = 0;  // outstanding events before reuse
    // free_seq_ when the block (or the last of the blocks merged into it) became free: its last
    // use on the segment's stream was queued before then (see wait_before_unmap).
    std::uint64_t freed_at = 0;
    std::uint32_t context = 0;  // AllocationContext::current_id() at allocate()
    bool allocated = false;
    bool mapped = true;          // false: unbacked address range of an expandable segment
    bool oversize = false;       // counted in oversize_allocations
    bool counted_split = false;  // counted in inactive_split while in the pool
    std::vector<StreamId> stream_uses;
    BlockSet::iterator pool_it;  // where it sits in its pool; valid only while pooled
    bool is_free() const { return !allocated && event_count == 0; }
    // Free and backed: exactly the blocks that sit in a pool.
    bool pooled() const { return mapped && !allocated && event_count == 0; }
    std::uintptr_t end() const { return addr + size; }
  };
  // A fixed segment is one device allocation. An expandable segment is a reserved address range
  // that blocks tile completely; each block is mapped (backed) or not, so free pages anywhere in
  // it can be given back and the range grows wherever the cheapest free run is.
  struct Segment {
    std::uintptr_t addr = 0;
    std::size_t size = 0;     // backed bytes (what counts as reserved)
    std::size_t va_size = 0;  // reserved address range (expandable only)
    std::size_t gran = 0;     // device mapping granularity (expandable only)
    std::size_t page = 0;     // mapping unit when growing into the end (expandable only)
    StreamId stream = kDefaultStream;
    bool small = false;
    bool expandable = false;
    bool oversize = false;
    Block* head = nullptr;
  };
  struct BlockPool {
    BlockSet blocks;
  };
  struct PendingEvent {
    EventId event;
    Block* block;
  };
  // Allocated blocks by address: open addressing with linear probing and backward-shift
  // deletion, so free() finds its block without a node allocation or a pointer chase per probe.
  class BlockIndex {
   public:
    BlockIndex() : slots_(64) {}
    Block* find(std::uintptr_t key) const {
      for (std::size_t i = home(key);; i = (i + 1) & mask_) {
        if (slots_[i].key == key) return slots_[i].block;
        if (slots_[i].key == 0) return nullptr;
      }
    }
    void insert(std::uintptr_t key, Block* b);  // key must be absent (and non-zero)
    void erase(std::uintptr_t key);             // key must be present
    std::size_t size() const { return size_; }

   private:
    struct Slot {
      std::uintptr_t key = 0;
      Block* block = nullptr;
    };
    std::size_t home(std::uintptr_t key) const {
      return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
    }
    std::vector<Slot> slots_;
    std::size_t mask_ = 63;
    std::size_t size_ = 0;
    int shift_ = 58;  // 64 - log2(slots)
  };

  // caching_allocator.cc: the allocation machinery.
  BlockPool& pool_for(bool small) { return small ? small_pool_ : large_pool_; }
  const BlockPool& pool_for(bool small) const { return small ? small_pool_ : large_pool_; }
  Block* new_block();
  void delete_block(Block* b);
  void pool_insert(Block* b);
  void pool_erase(Block* b);
  void pool_update(Block* b, std::uintptr_t addr, std::size_t size);
  void count_split(Block* b);
  void uncount_split(Block* b);
  Block* find_free_block(bool small, StreamId stream, std::size_t size, bool strict = true);
  std::size_t growth_budget(std::size_t request) const;
  Block* get_new_memory(bool small, StreamId stream, std::size_t size, bool* limit_hit);
  Block* alloc_segment(bool small, StreamId stream, std::size_t size, bool* limit_hit);
  Segment* add_segment(std::uintptr_t addr, std::size_t span, bool small, StreamId stream);
  Block* grow_expandable(bool small, StreamId stream, std::size_t size, bool* limit_hit);
  Segment* expandable_segment(bool small, StreamId stream, std::size_t size);
  std::size_t unmap_free_pages(Block* b, std::size_t max_bytes);
  std::size_t reclaim_pages(std::size_t need, std::uintptr_t keep_lo, std::uintptr_t keep_hi);
  void release_expandable(Segment* s);
  Block* insert_free(Block* b);
  std::size_t reserved() const { return static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current); }
  std::size_t bytes_to_release(std::size_t want);
  std::size_t release_cached(std::size_t needed, std::size_t below = SIZE_MAX);
  std::size_t releasable_bytes(const Segment& s) const;
  std::size_t release_segment(Segment* s);
  bool should_split(const Block* b, std::size_t size) const;
  void* take_block(Block* b, std::size_t size, std::size_t requested);
  void free_block(Block* b);
  void insert_events(Block* b);
  void process_events();
  void synchronize_and_free_events();
  // Before unmapping pages of pooled block b: waits for b's segment stream unless a
  // synchronization of that stream already covers b's last use.
  void wait_before_unmap(const Block* b);
  void empty_cache_locked();
  Block* lookup_allocated(void* ptr, const char* op) const;
  // Appends to the history; callers check history_enabled_ first (the hot path stays cheap).
  void trace(TraceAction action, std::uintptr_t addr, std::size_t size, StreamId stream, std::uint32_t context);
  void update(StatArray& stat, bool small, std::int64_t delta);
  std::size_t read_all_pools(const StatArray& stat, bool peak) const;  // locked read of the "all" entry

  static void unlink(Block* b);

  // caching_allocator_stats.cc: reporting and settings.
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, StreamId stream, bool limit_hit);
  FragmentationInfo fragmentation_locked() const;
  std::map<std::string, std::int64_t> memory_stats_locked() const;
  MemorySnapshot snapshot_locked() const;

  DeviceMemory& device_;
  const int device_index_;
  mutable std::mutex mutex_;

  BlockPool small_pool_;
  BlockPool large_pool_;
  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments_;
  std::map<std::pair<bool, StreamId>, Segment*> expandable_segments_;  // (small, stream)
  BlockIndex allocated_blocks_;
  std::map<StreamId, std::deque<PendingEvent>> events_;  // per stream, in record order
  // Recycled Block objects and pool-set nodes: a split or a merge reuses them instead of
  // going to the heap, so a steady alloc/free pair makes no heap allocation at all.
  std::vector<Block*> spare_blocks_;
  std::vector<BlockSet::node_type> spare_nodes_;

  // Private pools: holds per live pool, and the streams currently routed to a pool's key.
  std::map<PoolId, int> pool_holds_;
  std::vector<std::pair<StreamId, StreamId>> routes_;  // (stream, pool key)
  PoolId next_pool_ = 1;

  DeviceStats stats_;
  std::size_t limit_ = 0;  // 0 = unlimited
  double fraction_ = 0.0;  // what set_memory_fraction asked, for messages
  bool expandable_ = false;
  std::size_t max_split_size_ = SIZE_MAX;
  double reserved_slack_ = kDefaultReservedSlack;           // < 0: off
  double segment_reuse_ratio_ = kDefaultSegmentReuseRatio;  // 0: off
  // The most ever allocated at once, kept across reset_peak_memory_stats (which only resets
  // what users see): the growth budget is measured against it.
  std::size_t allocated_hwm_ = 0;
  Segment* growing_ = nullptr;  // the expandable segment grow_expandable is working on
  // Unmapping needs the pages' last use finished. Every block freed gets the next free_seq_;
  // stream_synced_[s] = n records that a synchronize_stream(s) began after the n-th free, so
  // it covers every block of s with freed_at <= n: one stream wait serves all later unmaps
  // until blocks of that stream are freed again.
  std::uint64_t free_seq_ = 0;
  std::map<StreamId, std::uint64_t> stream_synced_;

  bool history_enabled_ = false;
  std::size_t history_max_ = 0;
  std::deque<TraceEntry> history_;
  std::uint64_t history_dropped_ = 0;
  std::uint64_t seq_ = 0;
  const std::chrono::steady_clock::time_point start_;
};

inline CachingAllocator::BlockKey CachingAllocator::BlockLess::key(const Block* b) {
  return BlockKey{b->stream, b->size, b->addr};
}

// The size a request is rounded to (multiple of 512, at least 512).
std::size_t round_size(std::size_t bytes);
// The segment size a new device allocation gets for a rounded request (non-expandable).
std::size_t segment_size_for(std::size_t rounded);

}  // namespace mg::allocator
