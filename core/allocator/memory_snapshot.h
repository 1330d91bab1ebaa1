// Memory snapshots and allocation history: what the caching allocator holds right now and what
// it did over time, exported as JSON or as a self-contained HTML/SVG timeline to open in a browser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/allocator/device_memory.h"
#include "core/format_bytes.h"

namespace mg::allocator {

// PyTorch's names, so people who know torch.cuda.memory._snapshot() can read ours.
enum class BlockState {
  kActiveAllocated,    // handed out by allocate(), not yet freed
  kActivePendingFree,  // freed, but a stream recorded with record_stream may still use it
  kInactive,           // free and cached, ready for reuse
};
const char* to_string(BlockState state);

struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;            // bytes the block occupies (rounded)
  std::size_t requested_size = 0;  // bytes the caller asked for; 0 when inactive
  BlockState state = BlockState::kInactive;
  std::string context;  // AllocationContext at allocate() time
};

struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;  // bytes backed by device memory (mapped part, if expandable)
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  StreamId stream = kDefaultStream;
  bool is_small = false;  // small pool (requests <= 1 MiB)
  bool expandable = false;
  std::vector<BlockInfo> blocks;  // in address order, covering the segment exactly
};

enum class TraceAction {
  kAlloc,
  kFreeRequested,  // free() was called; the block may still wait for stream events
  kFreeCompleted,  // the block went back to the pool
  kSegmentAlloc,   // device malloc of a new segment
  kSegmentFree,    // segment returned to the device
  kSegmentMap,     // expandable segment grew
  kSegmentUnmap,   // expandable segment shrank
  kOom,            // allocation failed; size is what was asked, address is device free bytes
};
const char* to_string(TraceAction action);

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  StreamId stream = kDefaultStream;
  std::uint64_t seq = 0;      // strictly increasing over the allocator's life
  std::uint64_t time_ns = 0;  // steady clock, since the allocator was created
  std::string context;
};

struct MemorySnapshot {
  int device = 0;
  std::string device_name;
  std::vector<SegmentInfo> segments;          // in address order
  std::vector<TraceEntry> history;            // oldest first; empty unless record_history(true)
  std::uint64_t history_dropped = 0;          // entries that fell out of the ring buffer
  std::map<std::string, std::int64_t> stats;  // CachingAllocator::memory_stats()
};

// Raises mg::IOError when the file can't be written.
std::string snapshot_to_json(const MemorySnapshot& snapshot, int indent = 1);
void write_snapshot_json(const MemorySnapshot& snapshot, const std::string& path);
// A single HTML page, no external scripts or fonts: a stacked timeline of live allocations
// (PyTorch's "active memory timeline" idea) with reserved bytes and OOMs marked, a map of the
// segments and their blocks, and the headline stats. Hover a shape to see what it is.
std::string timeline_html(const MemorySnapshot& snapshot);
void write_timeline_html(const MemorySnapshot& snapshot, const std::string& path);

// Names the op that is allocating, for history and OOM messages. Nested contexts join with '/':
//   AllocationContext fwd("forward"); { AllocationContext mm("matmul"); ... }  -> "forward/matmul"
// Thread-local, so each thread labels its own allocations.
class AllocationContext {
 public:
  explicit AllocationContext(const std::string& name);
  ~AllocationContext();
  AllocationContext(const AllocationContext&) = delete;
  AllocationContext& operator=(const AllocationContext&) = delete;
  // "" outside any context.
  static const std::string& current();
  // The current context as a small integer (0 = none). Each distinct context string is interned
  // once, when a scope opens, so the allocator labels every block with an integer instead of
  // copying a string per allocation; name() maps an id back (the reference stays valid forever).
  // Distinct strings are kept for the life of the process: use a bounded set of names.
  static std::uint32_t current_id();
  static const std::string& name(std::uint32_t id);

 private:
  std::size_t previous_length_;
  std::uint32_t previous_id_;
};

}  // namespace mg::allocator
