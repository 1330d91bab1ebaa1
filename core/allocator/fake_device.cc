#include "core/allocator/fake_device.h"

#include <iterator>

#include "core/error.h"

namespace mg::allocator {
namespace {

std::string hex(std::uintptr_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

std::uintptr_t round_up(std::uintptr_t v, std::uintptr_t m) { return (v + m - 1) / m * m; }

}  // namespace

FakeDevice::FakeDevice(std::size_t capacity, bool virtual_memory, std::size_t granularity)
    : capacity_(capacity), virtual_memory_(virtual_memory), granularity_(granularity) {
  MG_CHECK(granularity > 0 && granularity % 512 == 0, ValueError,
           "FakeDevice: granularity must be a positive multiple of 512, got ", granularity);
}

bool FakeDevice::admit(std::size_t bytes) {
  if (fail_next_ > 0)
    --fail_next_;
  else if (malloc_bytes_ + mapped_bytes_ + external_ + bytes <= capacity_)
    return true;
  ++failed_calls_;
  return false;
}

void* FakeDevice::malloc(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  MG_CHECK(bytes > 0, ValueError, "FakeDevice::malloc: zero bytes");
  if (!admit(bytes)) return nullptr;
  ++malloc_calls_;
  // A bump pointer never reuses an address, so a stale pointer can't alias a new block.
  const std::uintptr_t addr = next_addr_;
  next_addr_ = round_up(next_addr_ + bytes, 512);
  allocations_[addr] = bytes;
  malloc_bytes_ += bytes;
  return reinterpret_cast<void*>(addr);
}

void FakeDevice::free(void* ptr) {
  std::lock_guard lock(mutex_);
  ++free_calls_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = allocations_.find(addr);
  MG_CHECK(it != allocations_.end(), Error, "FakeDevice::free: ", hex(addr),
           " is not a live allocation (double free or interior pointer)");
  malloc_bytes_ -= it->second;
  allocations_.erase(it);
}

void FakeDevice::mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  std::lock_guard lock(mutex_);
  const std::size_t used = malloc_bytes_ + mapped_bytes_ + external_;
  *free_bytes = used >= capacity_ ? 0 : capacity_ - used;
  *total_bytes = capacity_;
}

EventId FakeDevice::record_event(StreamId stream) {
  std::lock_guard lock(mutex_);
  const EventId id = next_event_++;
  events_[id] = Event{stream, false};
  return id;
}

bool FakeDevice::event_query(EventId event) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(event);
  MG_CHECK(it != events_.end(), Error, "FakeDevice::event_query: unknown event ", event);
  return it->second.done;
}

void FakeDevice::event_synchronize(EventId event) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(event);
  MG_CHECK(it != events_.end(), Error, "FakeDevice::event_synchronize: unknown event ", event);
  ++syncs_;
  it->second.done = true;  // waiting on an event means the stream ran up to it
}

void FakeDevice::destroy_event(EventId event) {
  std::lock_guard lock(mutex_);
  MG_CHECK(events_.erase(event) == 1, Error, "FakeDevice::destroy_event: unknown event ", event);
}

void* FakeDevice::reserve_address(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  MG_CHECK(virtual_memory_, Error, "FakeDevice::reserve_address: virtual memory is disabled");
  MG_CHECK(bytes > 0 && bytes % granularity_ == 0, Error, "FakeDevice::reserve_address: size ", bytes,
           " is not a multiple of ", granularity_);
  const std::uintptr_t addr = next_va_;
  next_va_ = round_up(next_va_ + bytes + granularity_, granularity_);  // a guard gap
  ranges_[addr] = Range{bytes, {}};
  return reinterpret_cast<void*>(addr);
}

FakeDevice::Range& FakeDevice::range_containing(std::uintptr_t addr, std::size_t bytes, const char* op) {
  MG_CHECK(bytes > 0 && addr % granularity_ == 0 && bytes % granularity_ == 0, Error, "FakeDevice::", op, ": ",
           hex(addr), " + ", bytes, " is not granularity-aligned");
  auto it = ranges_.upper_bound(addr);
  MG_CHECK(it != ranges_.begin(), Error, "FakeDevice::", op, ": ", hex(addr), " is not inside a reserved range");
  --it;
  MG_CHECK(addr + bytes <= it->first + it->second.size, Error, "FakeDevice::", op, ": ", hex(addr), " + ", bytes,
           " runs past the reserved range at ", hex(it->first));
  return it->second;
}

bool FakeDevice::map(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  Range& r = range_containing(addr, bytes, "map");
  for (std::uintptr_t p = addr; p < addr + bytes; p += granularity_) {
    MG_CHECK(!r.mapped_pages.count(p), Error, "FakeDevice::map: page ", hex(p), " already mapped");
  }
  if (!admit(bytes)) return false;
  ++map_calls_;
  for (std::uintptr_t p = addr; p < addr + bytes; p += granularity_) r.mapped_pages.insert(p);
  mapped_bytes_ += bytes;
  return true;
}

void FakeDevice::unmap(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  ++unmap_calls_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  Range& r = range_containing(addr, bytes, "unmap");
  for (std::uintptr_t p = addr; p < addr + bytes; p += granularity_) {
    MG_CHECK(r.mapped_pages.count(p), Error, "FakeDevice::unmap: page ", hex(p), " is not mapped");
  }
  for (const auto& [stream, k] : kernels_) {
    MG_CHECK(k.addr + k.bytes <= addr || addr + bytes <= k.addr, Error, "FakeDevice::unmap: [", hex(addr), ", ",
             hex(addr + bytes), ") is still used by a kernel queued on stream ", stream, " at ", hex(k.addr));
  }
  for (std::uintptr_t p = addr; p < addr + bytes; p += granularity_) r.mapped_pages.erase(p);
  mapped_bytes_ -= bytes;
}

void FakeDevice::release_address(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = ranges_.find(addr);
  MG_CHECK(it != ranges_.end() && it->second.size == bytes, Error, "FakeDevice::release_address: ", hex(addr), " + ",
           bytes, " was not reserved");
  MG_CHECK(it->second.mapped_pages.empty(), Error, "FakeDevice::release_address: ", hex(addr), " still has ",
           it->second.mapped_pages.size(), " mapped pages");
  ranges_.erase(it);
}

void FakeDevice::launch(StreamId stream, void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  kernels_.emplace(stream, Kernel{reinterpret_cast<std::uintptr_t>(ptr), bytes, ++kernel_seq_});
}

void FakeDevice::run_stream(StreamId stream) {
  std::lock_guard lock(mutex_);
  run_stream_until(stream, next_event_, kernel_seq_);
}

// Completes the events and kernels of `stream` queued before the given marks.
void FakeDevice::run_stream_until(StreamId stream, EventId events_before, std::uint64_t kernels_upto) {
  for (auto& [id, ev] : events_) {
    if (ev.stream == stream && id < events_before) ev.done = true;
  }
  const auto [lo, hi] = kernels_.equal_range(stream);
  for (auto it = lo; it != hi;) it = it->second.seq <= kernels_upto ? kernels_.erase(it) : std::next(it);
}

void FakeDevice::on_synchronize_stream(std::function<void(StreamId)> hook) {
  std::lock_guard lock(mutex_);
  sync_hook_ = std::move(hook);
}

// Like cudaStreamSynchronize, waits only for what was queued before the call: work the hook
// queues meanwhile stays in flight.
void FakeDevice::synchronize_stream(StreamId stream) {
  std::function<void(StreamId)> hook;
  EventId events_before = 0;
  std::uint64_t kernels_upto = 0;
  {
    std::lock_guard lock(mutex_);
    ++stream_syncs_;
    hook = sync_hook_;
    events_before = next_event_;
    kernels_upto = kernel_seq_;
  }
  if (hook) hook(stream);
  std::lock_guard lock(mutex_);
  run_stream_until(stream, events_before, kernels_upto);
}

void FakeDevice::complete_all_events() {
  std::lock_guard lock(mutex_);
  for (auto& [id, ev] : events_) ev.done = true;
}

void FakeDevice::fail_next_allocations(int n) {
  std::lock_guard lock(mutex_);
  fail_next_ = n;
}

void FakeDevice::set_external_usage(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  external_ = bytes;
}

std::size_t FakeDevice::live_bytes() const {
  return locked([&] { return malloc_bytes_ + mapped_bytes_; });
}
std::size_t FakeDevice::live_allocations() const {
  return locked([&] { return allocations_.size(); });
}
std::size_t FakeDevice::mapped_bytes() const {
  return locked([&] { return mapped_bytes_; });
}
std::size_t FakeDevice::reserved_ranges() const {
  return locked([&] { return ranges_.size(); });
}
std::size_t FakeDevice::live_events() const {
  return locked([&] { return events_.size(); });
}
std::size_t FakeDevice::kernels_in_flight(StreamId stream) const {
  return locked([&] { return kernels_.count(stream); });
}

}  // namespace mg::allocator
