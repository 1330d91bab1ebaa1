// Activation offload (autograd/offload.h): the copies to and from page-locked host memory, on
// two side streams per device, and the bookkeeping that gives device memory back.
#include "autograd/offload.h"

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "autograd/autocast_policy.h"
#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"

namespace mg {

namespace {
thread_local const OffloadOptions* tl_options = nullptr;

struct Counters {
  std::atomic<int64_t> offloaded_bytes{0}, fetched_bytes{0}, used_in_place{0}, device_bytes{0};
  std::atomic<int64_t> ahead_bytes{0};  // fetched back, not yet used
};
Counters& counters() {
  static auto* c = new Counters();  // never destroyed: saved tensors may die during exit
  return *c;
}
}  // namespace

OffloadScope::OffloadScope(OffloadOptions options) : prev_(tl_options), options_(options) {
  MG_CHECK(options_.min_bytes >= 0 && options_.prefetch_bytes >= 0, ValueError,
           "OffloadScope: min_bytes and prefetch_bytes must be >= 0, got ", options_.min_bytes, " and ",
           options_.prefetch_bytes);
  tl_options = &options_;
}

OffloadScope::~OffloadScope() {
  tl_options = prev_;
  autograd::poll_offload();
}

OffloadStats offload_stats() {
  Counters& c = counters();
  return {c.offloaded_bytes.load(), c.fetched_bytes.load(), c.used_in_place.load(), c.device_bytes.load()};
}

void reset_offload_stats() {
  Counters& c = counters();
  c.offloaded_bytes = 0;
  c.fetched_bytes = 0;
  c.used_in_place = 0;
}

namespace autograd {

namespace detail {
std::atomic<int64_t> offload_waiting{0};
}

// Fields are read and written under the engine's lock; the destructor touches only atomics
// and the device (it may run while the lock is held).
class OffloadedStorage {
 public:
  ~OffloadedStorage() {
    if (on_device)  // dropped before its copy to the host was seen finished
      counters().device_bytes.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    if (!fetching) detail::offload_waiting.fetch_sub(1, std::memory_order_relaxed);
    if (fetching && !waited) {
      counters().ahead_bytes.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
      // A copy back that nobody waited for may still be writing `fetched`: the block's next
      // user (work on the current stream, where the allocator hands it out) must wait for it.
      to_device.wait(cuda::Stream::current(device.index));
    }
  }

  uint64_t seq = 0;
  size_t nbytes = 0;
  Device device;
  MemoryCategory category = MemoryCategory::Other;
  int64_t prefetch_bytes = 0;
  Storage on_device;  // the saved storage itself, until its copy to the host has finished
  cuda::PinnedBlock host;
  cuda::Event to_host;
  Storage fetched;  // the copy back to the device
  cuda::Event to_device;
  bool fetching = false;
  bool used_in_place = false;  // backward took on_device before its copy out finished: kept
  bool waited = false;         // the current stream has been made to wait for `fetched`
  // The storage's version counter and value when copied: a later save of the same storage
  // reuses this copy only if nothing wrote to it in between.
  std::shared_ptr<uint32_t> version;
  uint32_t saved_version = 0;
};

namespace {

// `bytes` as a flat u8 tensor over the storage (copies move whole storages).
Tensor bytes_of(const Storage& st) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = st;
  impl->sizes = {static_cast<int64_t>(st->nbytes)};
  impl->strides = {1};
  impl->dtype = DType::u8;
  impl->version = std::make_shared<uint32_t>(0);
  return Tensor(impl);
}

class Engine {
 public:
  std::shared_ptr<OffloadedStorage> offload(const Tensor& t, const OffloadOptions& o) {
    const Storage& st = t.storage();
    const int dev = t.device().index;
    std::lock_guard<std::mutex> g(mu_);
    poll_locked();
    auto found = by_storage_.find(st.get());
    if (found != by_storage_.end()) {
      if (found->second.first.lock() == st) {
        auto e = found->second.second.lock();
        if (e && e->version == t.impl()->version && e->saved_version == t.version()) return e;
      }
      by_storage_.erase(found);
    }
    Queues& q = queues(dev);
    auto e = std::make_shared<OffloadedStorage>();
    e->seq = next_seq_++;
    e->nbytes = st->nbytes;
    e->device = t.device();
    e->category = st->category;
    e->prefetch_bytes = o.prefetch_bytes;
    e->version = t.impl()->version;
    e->saved_version = t.version();
    e->host = cuda::PinnedBlock::allocate(st->nbytes);
    // The copy starts once the work that made the tensor (queued on the current stream) is done.
    cuda::Event ready;
    ready.record(cuda::Stream::current(dev));
    ready.wait(q.to_host);
    {
      cuda::StreamGuard sg(q.to_host);
      raw::copy_(e->host.view({static_cast<int64_t>(e->nbytes)}, DType::u8), bytes_of(st), /*non_blocking=*/true);
    }
    e->to_host.record(q.to_host);
    e->host.record(q.to_host);
    e->on_device = st;
    detail::offload_waiting.fetch_add(1, std::memory_order_relaxed);
    counters().device_bytes.fetch_add(static_cast<int64_t>(e->nbytes), std::memory_order_relaxed);
    counters().offloaded_bytes.fetch_add(static_cast<int64_t>(e->nbytes), std::memory_order_relaxed);
    pending_.push_back(e);
    by_seq_[e->seq] = e;
    by_storage_[st.get()] = {st, e};
    ceiling(dev) = -1;  // a forward: the next backward sets it again
    if (++inserts_ % 256 == 0) sweep();
    return e;
  }

  Storage fetch(OffloadedStorage& e) {
    std::lock_guard<std::mutex> g(mu_);
    poll_locked();
    if (e.on_device) {  // backward got here before the copy to the host finished: use it, keep it
      if (!e.used_in_place) counters().used_in_place.fetch_add(1, std::memory_order_relaxed);
      e.used_in_place = true;
      return e.on_device;
    }
    const cuda::Stream compute = cuda::Stream::current(e.device.index);
    if (!e.fetching) start_fetch(e, compute);
    if (!e.waited) {
      e.to_device.wait(compute);
      e.waited = true;
      counters().ahead_bytes.fetch_sub(static_cast<int64_t>(e.nbytes), std::memory_order_relaxed);
    }
    prefetch_locked();
    return e.fetched;
  }

  void wait_all() {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& w : pending_)
      if (auto e = w.lock(); e && e->on_device && !e->used_in_place) e->to_host.synchronize();
    poll_locked();
  }

  void tick(bool in_backward) {
    std::lock_guard<std::mutex> g(mu_);
    poll_locked();
    if (in_backward) prefetch_locked();
  }

 private:
  struct Queues {
    cuda::Stream to_host, to_device;
  };

  Queues& queues(int dev) {
    if (queues_.size() <= static_cast<size_t>(dev)) queues_.resize(dev + 1);
    if (!queues_[dev])
      queues_[dev] = std::make_unique<Queues>(Queues{cuda::Stream::create(dev), cuda::Stream::create(dev)});
    return *queues_[dev];
  }

  // Copies to the host finish in the order they were queued (one stream per device): drop the
  // device storage of each finished one from the front.
  void poll_locked() {
    while (!pending_.empty()) {
      std::shared_ptr<OffloadedStorage> e = pending_.front().lock();
      if (e && e->on_device && !e->used_in_place) {
        if (!e->to_host.query()) break;
        e->on_device.reset();
        counters().device_bytes.fetch_sub(static_cast<int64_t>(e->nbytes), std::memory_order_relaxed);
      }
      pending_.pop_front();
    }
  }

  void start_fetch(OffloadedStorage& e, const cuda::Stream& compute) {
    Queues& q = queues(e.device.index);
    {
      // Allocated for the current stream, where it is used and freed: the copy waits for the
      // stream's work so far (a block just freed there may still be read).
      MemoryCategoryGuard cat(e.category);
      e.fetched = make_storage(e.nbytes, e.device);
    }
    cuda::Event ready;
    ready.record(compute);
    ready.wait(q.to_device);
    e.to_host.wait(q.to_device);
    {
      cuda::StreamGuard sg(q.to_device);
      raw::copy_(bytes_of(e.fetched), e.host.view({static_cast<int64_t>(e.nbytes)}, DType::u8), /*non_blocking=*/true);
    }
    e.to_device.record(q.to_device);
    e.host.record(q.to_device);
    e.fetching = true;
    detail::offload_waiting.fetch_sub(1, std::memory_order_relaxed);
    counters().fetched_bytes.fetch_add(static_cast<int64_t>(e.nbytes), std::memory_order_relaxed);
    counters().ahead_bytes.fetch_add(static_cast<int64_t>(e.nbytes), std::memory_order_relaxed);
  }

  // The device's live bytes when its backward began (-1 until then): fetches ahead stay under it.
  int64_t& ceiling(int dev) {
    if (ceilings_.size() <= static_cast<size_t>(dev)) ceilings_.resize(dev + 1, -1);
    return ceilings_[dev];
  }

  // Starts the copies back of the offloaded tensors backward needs next (the latest saved
  // first) while fewer than their options' prefetch_bytes are fetched and unused and the
  // device's live bytes stay under its ceiling. Stops at the first that does not fit: fetches
  // go in backward's order.
  void prefetch_locked() {
    for (auto it = by_seq_.end(); it != by_seq_.begin();) {
      --it;
      std::shared_ptr<OffloadedStorage> p = it->second.lock();
      if (!p) {
        it = by_seq_.erase(it);
        continue;
      }
      if (p->on_device || p->fetching) continue;
      const int dev = p->device.index;
      const int64_t live = CategoryStats::get(p->device).total().current;
      if (ceiling(dev) < 0) ceiling(dev) = live;
      const int64_t n = static_cast<int64_t>(p->nbytes);
      if (counters().ahead_bytes.load() + n > p->prefetch_bytes || live + n > ceiling(dev)) return;
      start_fetch(*p, cuda::Stream::current(dev));
    }
  }

  void sweep() {
    for (auto it = by_seq_.begin(); it != by_seq_.end();) it = it->second.expired() ? by_seq_.erase(it) : std::next(it);
    for (auto it = by_storage_.begin(); it != by_storage_.end();)
      it = it->second.second.expired() || it->second.first.expired() ? by_storage_.erase(it) : std::next(it);
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<Queues>> queues_;
  std::deque<std::weak_ptr<OffloadedStorage>> pending_;
  std::map<uint64_t, std::weak_ptr<OffloadedStorage>> by_seq_;
  std::unordered_map<const StorageImpl*, std::pair<std::weak_ptr<StorageImpl>, std::weak_ptr<OffloadedStorage>>>
      by_storage_;
  std::vector<int64_t> ceilings_;
  uint64_t next_seq_ = 0;
  uint64_t inserts_ = 0;
};

Engine& engine() {
  static auto* e = new Engine();  // never destroyed: saved tensors may die during exit
  return *e;
}

}  // namespace

std::shared_ptr<OffloadedStorage> offload(const Tensor& t) {
  const OffloadOptions* o = tl_options;
  if (!o || !t.defined() || !t.is_cuda()) return nullptr;
  const Storage& st = t.storage();
  if (!st || static_cast<int64_t>(st->nbytes) < std::max<int64_t>(o->min_bytes, 1)) return nullptr;
  if (t.is_leaf() && t.requires_grad()) return nullptr;  // a parameter: it stays anyway
  if (autocast::is_cached_cast(t)) return nullptr;       // a weight cast: alive all step
  if (cuda::is_capturing(t.device().index)) return nullptr;
  return engine().offload(t, *o);
}

Storage fetch(OffloadedStorage& s) { return engine().fetch(s); }

}  // namespace autograd

void offload_wait() {
  if (autograd::detail::offload_waiting.load() > 0) autograd::engine().wait_all();
}

HostLink measure_host_link(Device device, int64_t bytes, int repeats) {
  MG_CHECK(device.is_cuda(), ValueError, "measure_host_link: needs a CUDA device, got ", device.str());
  MG_CHECK(bytes > 0 && repeats >= 1, ValueError, "measure_host_link: bytes and repeats must be >= 1, got ", bytes,
           " and ", repeats);
  const size_t n = static_cast<size_t>(bytes);
  const Storage dev = make_storage(n, device);
  cuda::PinnedBlock host = cuda::PinnedBlock::allocate(n);
  const cuda::Stream side = cuda::Stream::create(device.index);
  cuda::synchronize(device.index);  // `dev` was allocated for the current stream
  auto per_ms = [&](bool to_host) {
    const Tensor d = autograd::bytes_of(dev), h = host.view({static_cast<int64_t>(n)}, DType::u8);
    std::vector<double> ms;
    for (int r = 0; r <= repeats; ++r) {
      cuda::Event begin(true), end(true);
      cuda::StreamGuard sg(side);
      begin.record(side);
      raw::copy_(to_host ? h : d, to_host ? d : h, /*non_blocking=*/true);
      end.record(side);
      end.synchronize();
      if (r > 0) ms.push_back(begin.elapsed_ms(end));
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(bytes) / std::max(ms[ms.size() / 2], 1e-6);
  };
  HostLink link;
  link.to_host_bytes_per_ms = per_ms(true);
  link.to_device_bytes_per_ms = per_ms(false);
  return link;
}

namespace autograd {

void detail::offload_tick(bool in_backward) { engine().tick(in_backward); }

}  // namespace autograd
}  // namespace mg
