// Shared helpers for the caching allocator tests: sizes, and an outside-in consistency check
// that compares the allocator's own view (snapshot, stats) with the fake device's ground truth.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "core/allocator/caching_allocator.h"
#include "core/allocator/fake_device.h"
#include "core/error.h"

namespace mg::allocator::testing {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

inline std::uintptr_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Allocates a block of each size, then frees them all: the blocks end up in the allocator's cache.
inline void fill_cache(CachingAllocator& a, std::initializer_list<std::size_t> sizes) {
  std::vector<void*> ps;
  for (std::size_t sz : sizes) ps.push_back(a.allocate(sz));
  for (void* p : ps) a.free(p);
}

// A block of `bytes` on `stream` that a kernel queued on that stream still uses.
inline void* allocate_in_use(CachingAllocator& a, FakeDevice& dev, std::size_t bytes, StreamId stream) {
  void* p = a.allocate(bytes, stream);
  dev.launch(stream, p, bytes);
  return p;
}

inline std::string oom_message(CachingAllocator& a, std::size_t bytes, StreamId stream = 0) {
  try {
    a.allocate(bytes, stream);
  } catch (const OutOfMemoryError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected OutOfMemoryError for " << bytes << " bytes";
  return "";
}

// live: pointer -> bytes the test asked for.
inline void expect_consistent(const CachingAllocator& a, const FakeDevice& dev,
                              const std::map<void*, std::size_t>& live) {
  a.check_invariants();  // the allocator's own walk: links, pools, counters
  const MemorySnapshot snap = a.snapshot();
  std::map<std::uintptr_t, BlockState> blocks;
  std::uintptr_t prev_end = 0;
  std::size_t reserved = 0;
  for (const SegmentInfo& s : snap.segments) {
    ASSERT_GE(s.address, prev_end) << "segments overlap";
    prev_end = s.address + s.total_size;
    reserved += s.total_size;
    std::uintptr_t cursor = s.address;
    for (const BlockInfo& b : s.blocks) {
      ASSERT_EQ(b.address, cursor) << "block outside or not tiling its segment";
      cursor += b.size;
      blocks[b.address] = b.state;
    }
    ASSERT_EQ(cursor, s.address + s.total_size);
  }
  std::size_t allocated = 0;
  for (const auto& [ptr, bytes] : live) {
    auto it = blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    ASSERT_NE(it, blocks.end()) << "live pointer is not the start of any block";
    ASSERT_EQ(it->second, BlockState::kActiveAllocated);
    const std::size_t got = a.allocation_size(ptr);
    ASSERT_GE(got, round_size(bytes));
    allocated += got;
  }
  const auto stats = a.memory_stats();
  ASSERT_EQ(a.memory_allocated(), allocated);
  ASSERT_EQ(static_cast<std::size_t>(stats.at("allocation.all.current")), live.size());
  ASSERT_EQ(a.memory_reserved(), reserved);
  ASSERT_EQ(a.memory_reserved(), dev.live_bytes());
  ASSERT_EQ(stats.at("num_device_alloc"), dev.malloc_calls() + dev.map_calls());
  ASSERT_EQ(stats.at("num_device_free"), dev.free_calls() + dev.unmap_calls());
  for (const auto& [key, value] : stats) {
    const auto dot = key.rfind(".current");
    if (dot != std::string::npos && dot + 8 == key.size()) {
      ASSERT_GE(stats.at(key.substr(0, dot) + ".peak"), value) << key;
      ASSERT_GE(value, 0) << key;
    }
  }
  if (a.memory_limit() != 0) {
    ASSERT_LE(a.memory_reserved(), a.memory_limit());
  }
}

}  // namespace mg::allocator::testing
