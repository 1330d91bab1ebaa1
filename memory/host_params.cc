#include "memory/host_params.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "autograd/autocast_policy.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/profiler.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "kernels/parallel.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "optim/adam.h"

namespace mg::memory {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// One gradient on its way home: the pinned block it lands in and the copy's event; and, once
// provide_casts() has been used, the device tensor the update's new cast is copied to.
struct HostParams::Task {
  size_t i = 0;
  bool step = true;
  DType dtype = DType::f32;  // the gradient's, as copied home
  cuda::PinnedBlock block;
  cuda::Event ready;   // on the compute stream, after the gradient and `next_cast` were made
  cuda::Event copied;  // the gradient is home
  Tensor next_cast;
};

HostParams::HostParams(std::vector<Tensor> params, Device device, HostOptimizerFactory make_optimizer, DType cast_dtype)
    : HostParams(params, device, std::move(make_optimizer), std::vector<DType>(params.size(), cast_dtype)) {}

HostParams::HostParams(std::vector<Tensor> params, Device device, HostOptimizerFactory make_optimizer,
                       std::vector<DType> cast_dtypes)
    : params_(std::move(params)), device_(device), cast_dtypes_(std::move(cast_dtypes)) {
  const char* op = "HostParams";
  MG_CHECK(device.is_cuda(), DeviceError, op, ": the parameters are read on a CUDA device, got ", device);
  MG_CHECK(cast_dtypes_.size() == params_.size(), ValueError, op, ": ", cast_dtypes_.size(), " cast dtypes for ",
           params_.size(), " parameters");
  for (DType d : cast_dtypes_)
    MG_CHECK(d == DType::bf16 || d == DType::f16 || d == DType::f32, DTypeError, op,
             ": the device casts are f16, bf16 or f32, got ", d);
  MG_CHECK(static_cast<bool>(make_optimizer), ValueError, op, ": no optimizer factory for the host parameters");
  std::unordered_set<const TensorImpl*> distinct;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined() && p.dtype() == DType::f32 && p.is_leaf() && p.requires_grad() && p.is_contiguous() &&
                 (p.device() == device || p.device().is_cpu()) && !p.grad().defined(),
             ValueError, op, ": params[", i, "] must be a contiguous f32 leaf that requires grad, on ", device,
             " or the CPU, without a gradient; got ",
             p.defined() ? detail::format(p.dtype(), " ", shape_str(p.sizes()), " on ", p.device(),
                                          p.grad().defined() ? " with a gradient" : "")
                         : std::string("undefined"));
    MG_CHECK(distinct.insert(p.impl()).second, ValueError, op, ": params[", i, "] is listed twice");
  }
  {
    NoGradGuard ng;
    MemoryCategoryGuard cat(MemoryCategory::Parameters);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& p = params_[i];
      nn::retarget(p, cuda::pin_memory(raw::to_device(p, Device::cpu())));
      Tensor c;
      if (cast_dtypes_[i] != DType::f32) {
        c = cuda::pin_memory(empty(p.sizes(), TensorOptions(cast_dtypes_[i])));
        kernels::write_low_copy(p, c);
      }
      casts_.push_back(c);
      cast_versions_.push_back(p.version());
    }
  }
  pending_.assign(params_.size(), 0);
  opt_ = make_optimizer(params_);
  MG_CHECK(opt_ != nullptr, ValueError, op, ": the optimizer factory returned no optimizer");
  // An Adam steps straight from the 16-bit gradient and writes the cast in the same pass: each
  // byte of the state is read and written once a step (kernels/cpu/optim.cc).
  if (auto* adam = dynamic_cast<optim::Adam*>(opt_.get())) {
    takes_16bit_grads_ = adam->widens_16bit_grads();
    for (size_t i = 0; i < params_.size(); ++i)
      if (casts_[i].defined()) adam->set_cast_target(params_[i], casts_[i]);
  }
  sums_.resize(params_.size());
  seen_.assign(params_.size(), 0);
  stream_ = cuda::Stream::create(device.index);
  cast_stream_ = cuda::Stream::create(device.index);
  ahead_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    index_[params_[i].impl()] = i;
    autograd::set_gradient_sink(params_[i], device,
                                [this, i](const Tensor&, Tensor g) { on_gradient(i, std::move(g)); });
  }
  // A region without the casts (a checkpoint's recomputation) copies them over again from
  // pinned memory. The worker writes a parameter's cast only after its gradient, which comes
  // after every recomputation reading it in the round, and on the stream after the copy.
  source_ = autocast::add_host_cast_source([this](const Tensor& w, const Device& d, DType dtype) {
    auto it = index_.find(w.impl());
    if (it == index_.end() || d != device_ || dtype != cast_dtypes_[it->second] || dtype == DType::f32) return Tensor();
    MemoryCategoryGuard act(MemoryCategory::Activations);
    // Under casts_on_first_use, the forward's first read of a parameter whose update was still
    // queued at provide_casts(): wait for it here.
    const auto t0 = std::chrono::steady_clock::now();
    Tensor c = take_cast(it->second);
    std::lock_guard<std::mutex> g(mu_);
    stats_.wait_ms += ms_since(t0);
    return c;
  });
  worker_ = std::thread([this] { run_worker(); });
}

HostParams::~HostParams() {
  autocast::remove_host_cast_source(source_);
  for (const Tensor& p : params_) autograd::clear_gradient_sink(p);
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  try {
    release_sent_gradients(/*wait_all=*/true);  // the worker waited for each copy it took
  } catch (const CudaError&) {
  }
  // Casts copied ahead and never taken: their copies finish before their memory goes back. A
  // destructor throws nothing: where the CUDA runtime is already unloading (a HostParams that
  // outlives main()), there is no copy left to wait for.
  for (const std::unique_ptr<Ahead>& a : ahead_) {
    if (!a) continue;
    try {
      a->copied.synchronize();
    } catch (const CudaError&) {
    }
  }
}

// On the thread running backward: the gradient to pinned memory on the copy stream, once the
// work that made it (queued on the current stream) is done; the worker takes it from there.
void HostParams::on_gradient(size_t i, Tensor grad) {
  // While stepping, one gradient a round; with stepping off they add up, as many as come.
  if (step_) {
    MG_CHECK(!seen_[i], AutogradError, "HostParams: host parameter ", i, " of shape ", shape_str(params_[i].sizes()),
             " received a second gradient in one round while stepping (used by two separately accumulated "
             "paths, or two backward() calls without provide_casts() between them); its update would be split in "
             "two");
    seen_[i] = 1;
  }
  if (!grad.is_contiguous()) grad = raw::contiguous(grad);
  auto t = std::make_unique<Task>();
  t->i = i;
  t->step = step_;
  t->dtype = grad.dtype();
  t->block = cuda::PinnedBlock::allocate(static_cast<size_t>(grad.nbytes()));
  if (step_ && casts_ahead_ && casts_[i].defined()) {
    // The next forward's cast, copied by the worker as soon as the update wrote it (counted as
    // the casts that forward would make). Made here, on the compute stream: the copy waits for
    // `ready`, after whatever last used this memory.
    NoGradGuard ng;
    MemoryCategoryGuard act(MemoryCategory::Activations);
    t->next_cast = empty(params_[i].sizes(), TensorOptions(cast_dtypes_[i], device_));
  }
  const cuda::Stream compute = cuda::Stream::current(device_.index);
  t->ready.record(compute);
  t->ready.wait(stream_);
  {
    cuda::StreamGuard sg(stream_);
    raw::copy_(t->block.view(grad.sizes(), grad.dtype()), grad, /*non_blocking=*/true);
  }
  t->block.record(stream_);
  t->copied.record(stream_);
  const int64_t nbytes = grad.nbytes();
  {
    // The device memory is reused only after the copy: held until its event (not record_stream,
    // which ties the memory's release to stream_, which dies with this object).
    std::lock_guard<std::mutex> g(sending_mu_);
    sending_.emplace_back(t->copied, std::move(grad));
  }
  release_sent_gradients(/*wait_all=*/false);
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.gradients++;
    stats_.to_host_bytes += nbytes;
    pending_[i]++;
    queue_.push_back(std::move(t));
  }
  cv_.notify_one();
}

void HostParams::run_worker() {
  // The updates' loops leave a core to the thread running backward (it launches the device's work).
  kernels::cpu::ThreadCap cap(kernels::cpu::num_threads() - 1);
  for (;;) {
    std::unique_ptr<Task> t;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      t = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
    }
    std::exception_ptr err;
    bool failed;
    {
      std::lock_guard<std::mutex> g(mu_);
      failed = error_ != nullptr;
    }
    try {
      if (!failed) {  // after an error the remaining updates are dropped until wait()
        process(*t);
        if (t->next_cast.defined() && t->step) copy_cast_ahead(*t);
      }
    } catch (...) {
      err = std::current_exception();
    }
    const size_t i = t->i;
    t.reset();  // the pinned block back to its pool
    {
      std::lock_guard<std::mutex> g(mu_);
      if (err && !error_) error_ = err;
      --busy_;
      pending_[i]--;
    }
    idle_cv_.notify_all();
  }
}

void HostParams::process(Task& t) {
  t.copied.synchronize();
  profiler::Range range("host update", "optimizer");  // on the worker's track of a trace
  const Tensor& p = params_[t.i];
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::Gradients);
  Tensor g = t.block.view(p.sizes(), t.dtype);
  Tensor& sum = sums_[t.i];
  // A 16-bit gradient goes to an Adam as it came home (the update widens it as it reads it);
  // a sum, or another optimizer, takes it in f32 (exactly).
  if (t.dtype != DType::f32 && (sum.defined() || !t.step || !takes_16bit_grads_)) g = kernels::cast(g, DType::f32);
  if (sum.defined()) {
    sum = kernels::add(sum, g);
    g = sum;
  }
  if (!t.step) {
    if (!sum.defined()) sum = raw::clone(g);  // the block goes back to its pool
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  p.set_grad(g);
  struct Drop {  // the gradient is the block's, even when the step throws
    const Tensor& p;
    ~Drop() { p.set_grad(Tensor()); }
  } drop{p};
  const Tensor& cast = casts_[t.i];
  const uint32_t cast_version = cast.defined() ? cast.version() : 0;
  opt_->step();
  const double step_ms = ms_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  // An Adam writes the cast in its update's pass (a cast target); otherwise it is written here.
  if (cast.defined() && cast.version() == cast_version) kernels::write_low_copy(p, cast);
  cast_versions_[t.i] = p.version();
  sum = Tensor();
  std::lock_guard<std::mutex> lk(mu_);
  stats_.updates++;
  stats_.update_ms += step_ms;
  stats_.cast_ms += ms_since(t1);
}

// On the worker, right after parameter t.i's update wrote its cast: the cast to the device on
// the cast stream, while backward goes on; provide_casts() hands it over without copying.
void HostParams::copy_cast_ahead(Task& t) {
  cuda::DeviceGuard dg(device_);
  t.ready.wait(cast_stream_);
  {
    cuda::StreamGuard sg(cast_stream_);
    raw::copy_(t.next_cast, casts_[t.i], /*non_blocking=*/true);
  }
  // No record_stream: a cast handed to a region may outlive this object and its stream. The
  // compute stream waits for the copy before it reads the cast or drops it (take_cast); a cast
  // nobody took is waited for before its memory goes back (here, when a newer one replaces it,
  // and in the destructor).
  auto a = std::make_unique<Ahead>(Ahead{std::move(t.next_cast), cuda::Event(), cast_versions_[t.i]});
  a->copied.record(cast_stream_);
  std::unique_ptr<Ahead> untaken;  // a round without a forward left one
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.to_device_bytes += a->cast.nbytes();
    stats_.casts_ahead++;
    untaken = std::exchange(ahead_[t.i], std::move(a));
  }
  if (untaken) untaken->copied.synchronize();
}

void HostParams::wait() {
  {
    std::unique_lock<std::mutex> g(mu_);
    idle_cv_.wait(g, [&] { return queue_.empty() && busy_ == 0; });
  }
  release_sent_gradients(/*wait_all=*/true);  // every copy home is done or dropped: none is needed
  std::lock_guard<std::mutex> g(mu_);
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void HostParams::wait_for(size_t i) {
  bool failed;
  {
    std::unique_lock<std::mutex> g(mu_);
    idle_cv_.wait(g, [&] { return pending_[i] == 0 || error_ != nullptr; });
    failed = error_ != nullptr;
  }
  if (failed) wait();  // the updates after the error are dropped; rethrows it
}

void HostParams::copy_to_device(size_t i, const Tensor& dst) {
  wait_for(i);
  refresh_cast(i);
  const Tensor& src = casts_[i].defined() ? casts_[i] : params_[i];
  MG_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(), ValueError,
           "HostParams::copy_to_device: parameter ", i, " is ", src.dtype(), " ", shape_str(src.sizes()),
           ", the destination ", dst.dtype(), " ", shape_str(dst.sizes()));
  raw::copy_(dst, raw::view(src, dst.sizes()), /*non_blocking=*/true);
  std::lock_guard<std::mutex> g(mu_);
  stats_.to_device_bytes += dst.nbytes();
}

void HostParams::start_round() { std::fill(seen_.begin(), seen_.end(), 0); }

void HostParams::release_sent_gradients(bool wait_all) {
  std::deque<std::pair<cuda::Event, Tensor>> done;  // freed outside the lock
  {
    std::lock_guard<std::mutex> g(sending_mu_);
    while (!sending_.empty() && (wait_all || sending_.front().first.query())) {
      if (wait_all) sending_.front().first.synchronize();
      done.push_back(std::move(sending_.front()));
      sending_.pop_front();
    }
  }
}

void HostParams::provide_casts() {
  const auto t0 = std::chrono::steady_clock::now();
  NoGradGuard ng;
  // The next forward's memory, counted as the casts that forward would make.
  MemoryCategoryGuard act(MemoryCategory::Activations);
  // In the order backward queued the updates (the last parameters first). Under
  // casts_on_first_use a parameter whose update is still queued is left to the region's first
  // read of it (the host cast source above waits for it there).
  std::vector<Tensor> on_device(params_.size());
  for (size_t i = params_.size(); i-- > 0;) {
    if (casts_on_first_use_) {
      std::lock_guard<std::mutex> g(mu_);
      if (pending_[i] > 0) continue;
    }
    on_device[i] = take_cast(i);
  }
  if (!casts_on_first_use_) wait();
  release_sent_gradients(/*wait_all=*/false);
  casts_ahead_ = true;  // from now on each update's cast goes to the device behind it
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.wait_ms += ms_since(t0);
  }
  start_round();
  for (size_t i = 0; i < params_.size(); ++i)
    if (on_device[i].defined()) autocast::provide_cast(params_[i], on_device[i]);
}

Tensor HostParams::take_cast(size_t i) {
  wait_for(i);
  refresh_cast(i);
  std::unique_ptr<Ahead> a;
  {
    std::lock_guard<std::mutex> g(mu_);
    a = std::move(ahead_[i]);
  }
  // The worker's copy, unless the master changed after it (a loaded state dict). Either way the
  // compute stream waits for it before its memory is read or reused.
  if (a) a->copied.wait(cuda::Stream::current(device_.index));
  if (a && a->version == cast_versions_[i]) return std::move(a->cast);
  return device_cast(i);
}

void HostParams::refresh_cast(size_t i) {
  const uint32_t v = params_[i].version();
  if (v == cast_versions_[i]) return;
  if (casts_[i].defined()) {
    // An earlier round's copy of this cast to the device may still be in flight (rare: the
    // master changed outside the update, e.g. a loaded checkpoint).
    cuda::synchronize(device_.index);
    kernels::write_low_copy(params_[i], casts_[i]);
  }
  cast_versions_[i] = v;
}

StateDict HostParams::state_dict() {
  wait();
  return opt_->state_dict();
}

StagedLoad HostParams::stage_state_dict(const StateDict& sd) {
  wait();  // no update may run between the check and the commit
  return opt_->stage_state_dict(sd);
}

Tensor HostParams::device_cast(size_t i) {
  const Tensor& src = casts_[i].defined() ? casts_[i] : params_[i];
  Tensor c = empty(params_[i].sizes(), TensorOptions(src.dtype(), device_));
  raw::copy_(c, src, /*non_blocking=*/true);  // on the current stream, ahead of its readers
  std::lock_guard<std::mutex> g(mu_);
  stats_.to_device_bytes += c.nbytes();
  return c;
}

std::vector<Tensor> HostParams::others(const std::vector<Tensor>& all) const {
  std::unordered_set<const TensorImpl*> host;
  for (const Tensor& p : params_) host.insert(p.impl());
  std::vector<Tensor> out;
  for (const Tensor& t : all)
    if (!host.count(t.impl())) out.push_back(t);
  return out;
}

int64_t HostParams::host_bytes() const {
  int64_t n = 0;
  for (const Tensor& p : params_) n += p.nbytes();
  return n;
}

HostParams::Stats HostParams::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void HostParams::reset_stats() {
  wait();
  std::lock_guard<std::mutex> g(mu_);
  stats_ = Stats{};
}

double measure_host_copy_bandwidth(int64_t bytes, int repeats) {
  MG_CHECK(bytes >= 1024 && repeats >= 1, ValueError, "measure_host_copy_bandwidth: bytes must be >= 1024 and ",
           "repeats >= 1, got ", bytes, " and ", repeats);
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  std::vector<double> per_ms;
  for (int r = 0; r <= repeats; ++r) {  // the first pass warms the pages
    const auto t0 = std::chrono::steady_clock::now();
    kernels::cpu::parallel_for(bytes, int64_t{1} << 20,
                               [&](int64_t s, int64_t e) { std::memcpy(b.data() + s, a.data() + s, e - s); });
    if (r > 0) per_ms.push_back(2.0 * static_cast<double>(bytes) / ms_since(t0));
  }
  std::sort(per_ms.begin(), per_ms.end());
  return per_ms[per_ms.size() / 2];
}

HostBlocksPlan plan_host_param_blocks(const HostBlocksInput& in) {
  const char* op = "plan_host_param_blocks";
  MG_CHECK(in.n_layer >= 1, ValueError, op, ": n_layer must be >= 1, got ", in.n_layer);
  MG_CHECK(in.forward_ms >= 0 && in.backward_ms > 0 && in.block_update_ms >= 0 && in.block_copy_ms >= 0, ValueError, op,
           ": the times must be >= 0 (backward > 0), got forward ", in.forward_ms, " ms, backward ", in.backward_ms,
           " ms, block update ", in.block_update_ms, " ms, block copy ", in.block_copy_ms, " ms");
  MG_CHECK(in.max_step_ratio >= 1.0, ValueError, op, ": max_step_ratio must be >= 1, got ", in.max_step_ratio);
  HostBlocksPlan plan;
  plan.resident_ms = in.forward_ms + in.backward_ms;
  const double layers = static_cast<double>(in.n_layer), slice = in.backward_ms / layers;
  double worker_done = 0;  // from backward's start, when the worker finishes the j-th block offloaded
  plan.step_ms.push_back(plan.resident_ms);
  for (int64_t j = 1; j <= in.n_layer; ++j) {
    worker_done = std::max(worker_done, static_cast<double>(j) * slice) + in.block_update_ms;
    const double cast_ready = worker_done + in.block_copy_ms;  // the j-th block's, the last to come
    if (in.casts_on_first_use)                                 // needed when the next forward reaches block n_layer - j
      plan.step_ms.push_back(
          plan.resident_ms +
          std::max(0.0, cast_ready - in.backward_ms - in.forward_ms * static_cast<double>(in.n_layer - j) / layers));
    else
      plan.step_ms.push_back(in.forward_ms + std::max(in.backward_ms, cast_ready));
  }
  for (int64_t n = 0; n <= in.n_layer; ++n)
    if (plan.step_ms[n] <= in.max_step_ratio * plan.resident_ms) plan.blocks = n;
  plan.predicted_ms = plan.step_ms[plan.blocks];
  return plan;
}

HostBlocksSearch search_host_param_blocks(int64_t n_layer, int64_t first, double resident_ms, double max_step_ratio,
                                          const std::function<double(int64_t)>& step_ms) {
  const char* op = "search_host_param_blocks";
  MG_CHECK(n_layer >= 1 && first >= 0 && first <= n_layer, ValueError, op,
           ": need n_layer >= 1 and 0 <= first <= n_layer, got n_layer ", n_layer, " and first ", first);
  MG_CHECK(resident_ms > 0 && max_step_ratio >= 1.0, ValueError, op,
           ": need resident_ms > 0 and max_step_ratio >= 1, got ", resident_ms, " ms and ", max_step_ratio);
  MG_CHECK(static_cast<bool>(step_ms), ValueError, op, ": no step timing function");
  HostBlocksSearch out;
  auto within = [&](int64_t n) {
    const double ms = step_ms(n);
    out.trials.emplace_back(n, ms);
    return ms <= max_step_ratio * resident_ms;
  };
  int64_t lo = 0, hi = first;  // lo is within the ratio (0 is: the resident step), hi is not
  if (first > 0 && within(first)) {
    lo = first;
    hi = n_layer + 1;
    for (int64_t step = 1; lo + step <= n_layer; step *= 2) {
      if (!within(lo + step)) {
        hi = lo + step;
        break;
      }
      lo += step;
    }
  }
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (within(mid) ? lo : hi) = mid;
  }
  out.blocks = lo;
  return out;
}

double measure_host_params_update_ms(const std::vector<Tensor>& like, Device device,
                                     const HostOptimizerFactory& make_optimizer, int repeats) {
  const char* op = "measure_host_params_update_ms";
  MG_CHECK(device.is_cuda(), DeviceError, op, ": the gradients come from a CUDA device, got ", device);
  MG_CHECK(!like.empty(), ValueError, op, ": no parameter shapes to measure");
  MG_CHECK(repeats >= 1, ValueError, op, ": repeats must be >= 1, got ", repeats);
  MG_CHECK(static_cast<bool>(make_optimizer), ValueError, op, ": no optimizer factory");
  std::vector<Tensor> params, grads;
  {
    NoGradGuard ng;
    for (const Tensor& p : like) {
      params.push_back(full(p.sizes(), 0.5, TensorOptions(DType::f32, device, /*rg=*/true)));
      grads.push_back(full(p.sizes(), 1e-3, TensorOptions(DType::bf16, device)));
    }
  }
  HostParams hp(params, device, make_optimizer);
  std::vector<double> ms;
  for (int r = 0; r <= repeats; ++r) {  // the first round creates the state
    const HostParams::Stats before = hp.stats();
    hp.start_round();
    for (size_t i = 0; i < grads.size(); ++i) hp.add_gradient(i, grads[i]);
    hp.wait();
    const HostParams::Stats after = hp.stats();
    if (r > 0) ms.push_back(after.update_ms + after.cast_ms - before.update_ms - before.cast_ms);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace mg::memory
