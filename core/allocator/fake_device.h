// A pretend GPU of N bytes for testing the caching allocator on any CPU: it hands out fake
// addresses, checks every free/unmap against what is live, and lets the test decide when events complete.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "core/allocator/device_memory.h"

namespace mg::allocator {

// Addresses are integers cast to void* and are never dereferenced. Misuse (double free, freeing
// an interior pointer, mapping twice, releasing a range that is still mapped, unmapping pages that
// queued work still uses) throws mg::Error, so an allocator bug fails the test loudly instead of
// silently "working".
class FakeDevice final : public DeviceMemory {
 public:
  explicit FakeDevice(std::size_t capacity, bool virtual_memory = true, std::size_t granularity = std::size_t{2} << 20);
  ~FakeDevice() override = default;

  void* malloc(std::size_t bytes) override;
  void free(void* ptr) override;
  void mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) override;

  EventId record_event(StreamId stream) override;
  bool event_query(EventId event) override;
  void event_synchronize(EventId event) override;
  void destroy_event(EventId event) override;
  void synchronize_stream(StreamId stream) override;  // runs the stream (see run_stream)

  bool supports_virtual_memory() const override { return virtual_memory_; }
  std::size_t granularity() const override { return granularity_; }
  void* reserve_address(std::size_t bytes) override;
  bool map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  void release_address(void* addr, std::size_t bytes) override;

  std::string name() const override { return "FakeDevice"; }

  // --- test controls ---
  // Queues "a kernel" on `stream` that uses [ptr, ptr + bytes) until the stream runs: unmapping
  // any of those pages before then throws (cuMemUnmap under a running kernel corrupts it).
  void launch(StreamId stream, void* ptr, std::size_t bytes);
  // The stream "ran": every event recorded and every kernel launched on it so far completes.
  void run_stream(StreamId stream);
  // Called at the start of every synchronize_stream, without the device's lock (a test can
  // act from inside the wait: free a block, queue more work, check who holds which lock).
  void on_synchronize_stream(std::function<void(StreamId)> hook);
  void complete_all_events();
  // The next n malloc/map calls fail even if memory is free (device-side fragmentation).
  void fail_next_allocations(int n);
  // Memory held by "another process": counts against capacity, not against live_bytes().
  void set_external_usage(std::size_t bytes);

  // --- observations ---
  std::size_t capacity() const { return capacity_; }
  std::size_t live_bytes() const;  // malloc'd + mapped
  std::size_t live_allocations() const;
  std::size_t mapped_bytes() const;
  std::size_t reserved_ranges() const;
  std::size_t live_events() const;
  // Successful calls only; failed malloc/map attempts are counted by failed_calls().
  std::int64_t malloc_calls() const { return malloc_calls_; }
  std::int64_t free_calls() const { return free_calls_; }
  std::int64_t map_calls() const { return map_calls_; }
  std::int64_t unmap_calls() const { return unmap_calls_; }
  std::int64_t failed_calls() const { return failed_calls_; }
  std::int64_t event_syncs() const { return syncs_; }
  std::int64_t stream_syncs() const { return stream_syncs_; }
  std::size_t kernels_in_flight(StreamId stream) const;  // launched and not yet run

 private:
  struct Event {
    StreamId stream;
    bool done;
  };
  struct Range {
    std::size_t size;
    std::set<std::uintptr_t> mapped_pages;
  };

  Range& range_containing(std::uintptr_t addr, std::size_t bytes, const char* op);
  // Whether a malloc or map of `bytes` may succeed: not while fail_next_allocations is in
  // force, nor past capacity. Counts the failures. mutex_ held.
  bool admit(std::size_t bytes);
  // f() under the lock: how the observations read the counters.
  template <class F>
  auto locked(F f) const {
    std::lock_guard lock(mutex_);
    return f();
  }
  void run_stream_until(StreamId stream, EventId events_before, std::uint64_t kernels_upto);  // mutex_ held

  const std::size_t capacity_;
  const bool virtual_memory_;
  const std::size_t granularity_;

  mutable std::mutex mutex_;
  std::uintptr_t next_addr_ = 0x10000000;       // plain mallocs
  std::uintptr_t next_va_ = 0x700000000000ULL;  // reserved virtual ranges, far from mallocs
  std::map<std::uintptr_t, std::size_t> allocations_;
  std::map<std::uintptr_t, Range> ranges_;
  std::size_t malloc_bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
  std::size_t external_ = 0;
  int fail_next_ = 0;
  std::map<EventId, Event> events_;
  struct Kernel {
    std::uintptr_t addr;
    std::size_t bytes;
    std::uint64_t seq;  // launch order: a stream wait covers what was queued before it began
  };
  std::multimap<StreamId, Kernel> kernels_;  // in flight
  std::uint64_t kernel_seq_ = 0;
  std::function<void(StreamId)> sync_hook_;
  EventId next_event_ = 1;
  // Call counters: bumped under mutex_, atomic so the observations read them without it.
  std::atomic<std::int64_t> malloc_calls_ = 0, free_calls_ = 0, map_calls_ = 0, unmap_calls_ = 0, syncs_ = 0;
  std::atomic<std::int64_t> stream_syncs_ = 0;
  std::atomic<std::int64_t> failed_calls_ = 0;
};

}  // namespace mg::allocator
