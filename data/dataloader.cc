#include "data/dataloader.h"

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/cuda_memory.h"

namespace mg::data {

namespace {

// Rethrows `e` as an E with `ctx` in front of its message if it is an E; returns otherwise.
template <class E>
void rethrow_if(const std::exception_ptr& e, const std::string& ctx) {
  try {
    std::rethrow_exception(e);
  } catch (const E& x) {
    throw E(ctx + x.what());
  } catch (...) {
  }
}

// Rethrows `e` as the first of Es that it is, with `ctx` in front of its message; anything else
// (mg::Error itself, foreign exceptions) as an mg::Error.
template <class... Es>
[[noreturn]] void rethrow_as(const std::exception_ptr& e, const std::string& ctx) {
  (rethrow_if<Es>(e, ctx), ...);
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    throw Error(ctx + x.what());
  } catch (...) {
    throw Error(ctx + "unknown exception");
  }
}

// Rethrows `e` as the same mg::Error subclass with `ctx` in front of its message, so a
// worker's IndexError still reaches the consumer as an IndexError, now saying which batch.
[[noreturn]] void rethrow_with_context(const std::exception_ptr& e, const std::string& ctx) {
  rethrow_as<ShapeError, DTypeError, DeviceError, IndexError, ValueError, AutogradError, IOError, CudaError,
             OutOfMemoryError>(e, ctx);
}

}  // namespace

// Worker threads of one epoch. Workers claim batch numbers in increasing order, never more
// than `window` ahead of the consumer; finished batches wait in `done_` until taken in order.
class DataLoader::Workers {
 public:
  Workers(const DataLoader* loader, int n, int64_t window, int64_t num_batches)
      : loader_(loader), window_(window), num_batches_(num_batches) {
    threads_.reserve(n);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { run(i); });
  }

  ~Workers() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  Example take(int64_t b) {
    std::unique_lock<std::mutex> lk(mu_);
    MG_CHECK(b == next_deliver_, ValueError, "DataLoader: batch ", b, " asked for out of order (next is ",
             next_deliver_, ")");
    ready_cv_.wait(lk, [&] { return done_.count(b) > 0; });
    auto node = done_.extract(b);
    ++next_deliver_;
    lk.unlock();
    work_cv_.notify_all();  // the window moved: a worker may claim one more
    if (node.mapped().second) std::rethrow_exception(node.mapped().second);
    return std::move(node.mapped().first);
  }

 private:
  void run(int id) {
    for (;;) {
      int64_t b;
      {
        std::unique_lock<std::mutex> lk(mu_);
        work_cv_.wait(lk,
                      [&] { return stop_ || next_claim_ >= num_batches_ || next_claim_ < next_deliver_ + window_; });
        if (stop_ || next_claim_ >= num_batches_) return;
        b = next_claim_++;
      }
      Example batch;
      std::exception_ptr err;
      try {
        batch = loader_->load_host(b, id);
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        if (stop_) return;
        done_.emplace(b, std::make_pair(std::move(batch), err));
      }
      ready_cv_.notify_all();
    }
  }

  const DataLoader* loader_;
  const int64_t window_, num_batches_;
  std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  int64_t next_claim_ = 0, next_deliver_ = 0;
  bool stop_ = false;
  std::map<int64_t, std::pair<Example, std::exception_ptr>> done_;
  std::vector<std::thread> threads_;
};

// Page-locked buffers reused across batches. A buffer is free again once nothing but the pool
// refers to it: the consumer dropped the batch and no asynchronous copy holds it (the loader
// keeps the host batch of an in-flight copy alive until the copy's event has passed).
class DataLoader::PinnedPool {
 public:
  explicit PinnedPool(size_t capacity) : capacity_(capacity) {}

  Example pin(const Example& e) const { return {pin(e.data), pin(e.target)}; }

  int64_t size() const {
    std::lock_guard<std::mutex> g(mu_);
    return static_cast<int64_t>(buffers_.size());
  }

 private:
  Tensor pin(const Tensor& t) const {
    if (!t.defined()) return t;
    Tensor buf = acquire(t.sizes(), t.dtype());
    raw::copy_(buf, t);
    return buf;
  }

  Tensor acquire(const Shape& shape, DType dtype) const {
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const Tensor& b : buffers_)
        if (b.impl_ptr().use_count() == 1 && b.storage().use_count() == 1 && b.dtype() == dtype && b.sizes() == shape)
          return b;  // the copy handed out makes it busy before the lock is released
    }
    Tensor fresh = cuda::pin_memory(empty(shape, {dtype, Device::cpu()}));
    std::lock_guard<std::mutex> g(mu_);
    if (buffers_.size() < capacity_) buffers_.push_back(fresh);
    return fresh;
  }

  const size_t capacity_;
  mutable std::mutex mu_;
  mutable std::vector<Tensor> buffers_;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions opts)
    : dataset_(std::move(dataset)), opts_(std::move(opts)), own_gen_(opts_.seed) {
  MG_CHECK(dataset_ != nullptr, ValueError, "DataLoader: null dataset");
  MG_CHECK(opts_.batch_size >= 1, ValueError, "DataLoader: batch_size must be >= 1, got ", opts_.batch_size);
  MG_CHECK(opts_.num_workers >= 0, ValueError, "DataLoader: num_workers must be >= 0, got ", opts_.num_workers);
  MG_CHECK(opts_.prefetch_factor >= 1, ValueError, "DataLoader: prefetch_factor must be >= 1, got ",
           opts_.prefetch_factor);
  if (opts_.pin_memory)
    MG_CHECK(cuda::is_available(), DeviceError,
             "DataLoader: pin_memory needs a CUDA device, and none is visible (cuda::device_count() = ",
             cuda::device_count(), "); leave pin_memory off on CPU-only machines");
  if (opts_.device.is_cuda())
    MG_CHECK(opts_.device.index >= 0 && opts_.device.index < cuda::device_count(), DeviceError, "DataLoader: device ",
             opts_.device, " does not exist (", cuda::device_count(), " CUDA devices visible)");
  if (opts_.pin_memory) {
    const int64_t window = std::max(1, opts_.num_workers) * static_cast<int64_t>(opts_.prefetch_factor);
    pool_ = std::make_unique<PinnedPool>(static_cast<size_t>(2 * (window + 4)));  // data + target per batch
  }
  order_.resize(static_cast<size_t>(dataset_->size()));
  std::iota(order_.begin(), order_.end(), 0);
}

DataLoader::~DataLoader() {
  shutdown();
  // Pinned host batches must outlive the copies that read them.
  for (auto& f : in_flight_) f.first.synchronize();
}

int64_t DataLoader::size() const {
  const int64_t n = dataset_->size(), b = opts_.batch_size;
  return opts_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> DataLoader::batch_indices(int64_t b) const {
  MG_CHECK(b >= 0 && b < size(), IndexError, "DataLoader: batch ", b, " out of range [0, ", size(), ")");
  const int64_t start = b * opts_.batch_size;
  const int64_t stop = std::min<int64_t>(start + opts_.batch_size, static_cast<int64_t>(order_.size()));
  return std::vector<int64_t>(order_.begin() + start, order_.begin() + stop);
}

void DataLoader::shutdown() { workers_.reset(); }

int64_t DataLoader::pinned_buffers() const { return pool_ ? pool_->size() : 0; }

Example DataLoader::load_host(int64_t b, int worker) const {
  // order_ and epoch_ only change in begin(), after the workers of the last epoch are joined.
  std::vector<int64_t> idx = batch_indices(b);
  try {
    MemoryCategoryGuard g(MemoryCategory::Data);
    Example batch;
    if (!opts_.transform && !opts_.collate) {
      batch = dataset_->get_batch(idx);
    } else {
      std::vector<Example> examples;
      examples.reserve(idx.size());
      for (int64_t i : idx) {
        Example e = dataset_->get(i);
        if (opts_.transform) {
          SampleRng rng = SampleRng::for_sample(opts_.seed, epoch_, i);
          e.data = (*opts_.transform)(e.data, rng);
        }
        examples.push_back(std::move(e));
      }
      batch = opts_.collate ? opts_.collate(examples) : collate_stack(examples);
    }
    if (pool_) batch = pool_->pin(batch);
    return batch;
  } catch (...) {
    std::string ctx = detail::format("DataLoader: batch ", b, " of epoch ", epoch_, " (samples ");
    for (size_t k = 0; k < idx.size() && k < 8; ++k) ctx += (k ? ", " : "") + std::to_string(idx[k]);
    ctx += idx.size() > 8 ? ", ...)" : ")";
    if (worker >= 0) ctx += detail::format(" in worker ", worker);
    rethrow_with_context(std::current_exception(), ctx + ": ");
  }
}

Example DataLoader::to_device(Example host) {
  if (!opts_.device.is_cuda()) return host;
  const int dev = opts_.device.index;
  cuda::DeviceGuard dg(dev);
  // Copies that have finished release their host batches (and so their pinned buffers).
  std::erase_if(in_flight_, [](const auto& f) { return f.first.query(); });
  if (!copy_stream_) copy_stream_ = std::make_unique<cuda::Stream>(cuda::Stream::create(dev));
  const cuda::Stream consumer = cuda::Stream::current(dev);
  MemoryCategoryGuard g(MemoryCategory::Data);
  Example out;
  {
    // Allocated and copied on the side stream: the copy overlaps whatever the consumer
    // stream is still running (the step on the previous batch).
    cuda::StreamGuard sg(*copy_stream_);
    if (host.data.defined()) out.data = raw::to_device(host.data, opts_.device, /*non_blocking=*/true);
    if (host.target.defined()) out.target = raw::to_device(host.target, opts_.device, /*non_blocking=*/true);
  }
  cuda::Event copied;
  copied.record(*copy_stream_);
  copied.wait(consumer);  // on the device: the consumer's next kernels start after the copy
  // The memory was allocated on the side stream but is used on the consumer's: without this
  // the caching allocator could hand it out again while consumer kernels still read it.
  if (out.data.defined()) cuda::record_stream(out.data, consumer);
  if (out.target.defined()) cuda::record_stream(out.target, consumer);
  in_flight_.emplace_back(copied, std::move(host));
  return out;
}

Example DataLoader::next(int64_t b) {
  Example host = workers_ ? workers_->take(b) : load_host(b, -1);
  return to_device(std::move(host));
}

void DataLoader::set_epoch(int64_t epochs_done) {
  MG_CHECK(epochs_done >= 0, ValueError, "DataLoader::set_epoch: epochs_done must be >= 0, got ", epochs_done);
  shutdown();
  if (opts_.shuffle && !opts_.generator) {
    own_gen_.set_state(Generator(opts_.seed).get_state());
    MemoryCategoryGuard g(MemoryCategory::Data);
    for (int64_t e = 0; e < epochs_done; ++e) randperm(dataset_->size(), &own_gen_);  // same draws as begin()
  }
  epoch_ = epochs_done;
}

DataLoader::Iterator DataLoader::begin() {
  shutdown();
  const int64_t n = dataset_->size();
  MG_CHECK(static_cast<int64_t>(order_.size()) == n, ValueError, "DataLoader: the dataset changed size from ",
           order_.size(), " to ", n);
  if (opts_.shuffle) {
    MemoryCategoryGuard g(MemoryCategory::Data);  // the sampler's permutation is data too
    Tensor perm = randperm(n, opts_.generator ? opts_.generator : &own_gen_);
    const int64_t* p = perm.data_ptr<int64_t>();
    order_.assign(p, p + n);
  }
  ++epoch_;
  if (opts_.num_workers > 0 && size() > 0)
    workers_ = std::make_unique<Workers>(this, opts_.num_workers,
                                         static_cast<int64_t>(opts_.num_workers) * opts_.prefetch_factor, size());
  return Iterator(this, 0);
}

DataLoader::Iterator DataLoader::end() { return Iterator(nullptr, size()); }

DataLoader::Iterator::Iterator(DataLoader* loader, int64_t batch) : loader_(loader), batch_(batch) {
  if (loader_ && batch_ < loader_->size()) current_ = loader_->next(batch_);
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++batch_;
  // Release the previous batch before loading the next, so only one is alive at a time.
  current_ = Example();
  if (loader_ && batch_ < loader_->size()) current_ = loader_->next(batch_);
  if (loader_ && batch_ >= loader_->size()) loader_->shutdown();  // epoch done: join the workers
  return *this;
}

}  // namespace mg::data
