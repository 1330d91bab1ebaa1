// DDP's reducer: buckets in reverse parameter order (the order backward produces gradients),
// a post-accumulate-grad hook per parameter that counts down its bucket, launch in bucket
// order (every rank issues the same collectives in the same order), and a finalize step that
// waits for the all-reduces and puts the averages into .grad.
#include "distributed/ddp.h"

#include <unordered_set>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/profiler.h"
#include "kernels/ops.h"

namespace mg::dist {

namespace {
// The slice of a bucket that holds one parameter's gradient, shaped like the parameter.
Tensor slot(const Tensor& flat, int64_t offset, const Tensor& p) {
  return raw::view(raw::slice(flat, 0, offset, offset + p.numel(), 1), p.sizes());
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                                                 DDPOptions opts)
    : nn::Module("DistributedDataParallel"), module_(std::move(module)), pg_(std::move(pg)), opts_(opts) {
  MG_CHECK(module_ != nullptr, ValueError, "DistributedDataParallel: module is null");
  MG_CHECK(pg_ != nullptr, ValueError, "DistributedDataParallel: process group is null");
  MG_CHECK(opts.bucket_cap_mb > 0 && opts.first_bucket_cap_mb > 0, ValueError,
           "DistributedDataParallel: bucket caps must be positive (got ", opts.bucket_cap_mb, " and ",
           opts.first_bucket_cap_mb, " MiB)");
  register_module("module", module_);
  for (auto& [name, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    MG_CHECK(p.device() == pg_->device(), DeviceError, "DistributedDataParallel: parameter '", name, "' is on ",
             p.device(), " but the process group (", pg_->describe(), ") works on ", pg_->device(),
             "; move the module there first");
    params_.push_back(p);
    names_.push_back(name);
  }
  build_buckets(opts);
  broadcast_state();
  ready_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    hooks_.push_back(
        autograd::register_post_accumulate_grad_hook(params_[i], [this, i](const Tensor&) { on_grad_ready(i); }));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (uint64_t h : hooks_) autograd::remove_post_accumulate_grad_hook(h);
  for (Bucket& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->synchronize();  // the collective still writes into b.flat
    } catch (const std::exception&) {
    }
  }
}

void DistributedDataParallel::build_buckets(const DDPOptions& opts) {
  // Reverse registration order approximates the order backward finishes gradients in.
  auto cap_bytes = [&](size_t bucket_index) {
    return static_cast<int64_t>((bucket_index == 0 ? opts.first_bucket_cap_mb : opts.bucket_cap_mb) * 1048576.0);
  };
  bucket_of_.assign(params_.size(), 0);
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    bool fresh =
        buckets_.empty() || buckets_.back().dtype != p.dtype() ||
        (buckets_.back().numel * static_cast<int64_t>(p.element_size()) + bytes > cap_bytes(buckets_.size() - 1) &&
         !buckets_.back().params.empty());
    if (fresh) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
    }
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bucket_of_[k] = buckets_.size() - 1;
  }
  MemoryCategoryGuard cat(MemoryCategory::Gradients);
  for (Bucket& b : buckets_) b.flat = zeros({b.numel}, {b.dtype, pg_->device()});
}

void DistributedDataParallel::broadcast_state() {
  if (pg_->size() == 1) return;
  NoGradGuard ng;
  // Parameters travel through the (not yet used) gradient buckets: one collective per bucket.
  for (Bucket& b : buckets_) {
    for (size_t j = 0; j < b.params.size(); ++j)
      kernels::copy_(slot(b.flat, b.offsets[j], params_[b.params[j]]), params_[b.params[j]]);
    pg_->broadcast(b.flat, 0);
    if (pg_->rank() != 0)
      for (size_t j = 0; j < b.params.size(); ++j)
        kernels::copy_(params_[b.params[j]], slot(b.flat, b.offsets[j], params_[b.params[j]]));
  }
  for (const Tensor& buf : module_->buffers()) pg_->broadcast(buf, 0);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  prepare_for_backward();
  Tensor y = module_->forward(x);
  after_forward(y);
  return y;
}

void DistributedDataParallel::prepare_for_backward() {
  if (!finalized_ && any_hook_fired_) {
    std::string missing = unready_names();
    abandon();
    MG_THROW(Error, "DistributedDataParallel (", pg_->describe(),
             "): the previous iteration's gradient reduction did not finish: parameter(s) ", missing,
             " received no gradient. Make every parameter take part in the loss, or construct DDP with "
             "find_unused_parameters = true");
  }
  if (!is_grad_enabled()) {
    armed_ = false;
    return;
  }
  if (opts_.broadcast_buffers && pg_->size() > 1) {
    NoGradGuard ng;
    for (const Tensor& buf : module_->buffers()) pg_->broadcast(buf, 0);
  }
  armed_ = sync_enabled_;
  finalized_ = !armed_;
  any_hook_fired_ = false;
  next_launch_ = 0;
  ready_.assign(params_.size(), false);
  for (Bucket& b : buckets_) b.pending = b.params.size();
}

void DistributedDataParallel::after_forward(const Tensor& output) {
  if (!armed_ || !opts_.find_unused_parameters) return;
  // Every leaf the graph reaches has an AccumulateGrad node; the rest will get no gradient.
  std::unordered_set<const TensorImpl*> reached;
  std::unordered_set<const autograd::Node*> seen;
  std::vector<autograd::Node*> stack;
  if (const auto& fn = autograd::grad_fn(output)) stack.push_back(fn.get());
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(n))
      if (auto leaf = acc->leaf.lock()) reached.insert(leaf.get());
    for (const autograd::Edge& e : n->next_edges)
      if (e.node) stack.push_back(e.node.get());
  }
  if (output.defined() && output.is_leaf() && output.requires_grad()) reached.insert(output.impl());
  for (size_t i = 0; i < params_.size(); ++i)
    if (!reached.count(params_[i].impl())) mark_ready(i);
}

void DistributedDataParallel::on_grad_ready(size_t i) {
  if (!armed_) return;  // no_sync, eval, or a backward whose forward did not go through DDP
  MG_CHECK(!ready_[i], Error, "DistributedDataParallel (", pg_->describe(), "): parameter '", names_[i],
           "' received its gradient twice in one iteration (a second backward without a new forward through DDP?)");
  any_hook_fired_ = true;
  mark_ready(i);
}

void DistributedDataParallel::mark_ready(size_t i) {
  ready_[i] = true;
  Bucket& b = buckets_[bucket_of_[i]];
  if (--b.pending == 0) launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  // Strictly in bucket order, so every rank issues the same sequence of collectives even if
  // its gradients become ready in a different order.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_++]);
    ++launched_in_backward_;
  }
  if (next_launch_ == buckets_.size()) finalize();
}

void DistributedDataParallel::launch(Bucket& b) {
  NoGradGuard ng;
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[b.params[j]];
    Tensor dst = slot(b.flat, b.offsets[j], p);
    Tensor g = p.grad();
    if (g.defined()) {
      if (g.raw_data() != dst.raw_data()) kernels::copy_(dst, g);  // a bucket-view grad may be the slot
    } else {
      kernels::fill_(dst, 0.0);  // an unused parameter contributes zero
    }
  }
  profiler::instant("ddp bucket all_reduce", "collective", {{"bytes", b.flat.nbytes()}});  // launched, not waited
  b.work = pg_->all_reduce_async(b.flat, ReduceOp::Avg);
}

void DistributedDataParallel::finalize() {
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::Gradients);
  for (Bucket& b : buckets_) {
    if (!b.work) continue;
    WorkPtr w = std::move(b.work);
    w->wait();
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor& p = params_[b.params[j]];
      Tensor avg = slot(b.flat, b.offsets[j], p);
      Tensor g = p.grad();
      if (opts_.gradient_as_bucket_view)
        p.set_grad(avg);
      else if (g.defined())
        kernels::copy_(g, avg);
      else
        p.set_grad(raw::clone(avg));
    }
  }
  finalized_ = true;
  armed_ = false;
}

void DistributedDataParallel::finish() {
  if (finalized_) return;
  if (!any_hook_fired_ && next_launch_ == 0) return;  // armed by forward, but no backward yet
  std::string missing = unready_names();
  abandon();
  MG_THROW(Error, "DistributedDataParallel (", pg_->describe(), "): backward ended before parameter(s) ", missing,
           " received a gradient, so their buckets were never reduced. Make every parameter take part in the "
           "loss, or construct DDP with find_unused_parameters = true");
}

void DistributedDataParallel::abandon() {
  // Collectives already launched must complete before the buckets are touched again.
  for (Bucket& b : buckets_)
    if (b.work) {
      WorkPtr w = std::move(b.work);
      w->synchronize();
    }
  armed_ = false;
  finalized_ = true;
}

std::string DistributedDataParallel::unready_names() const {
  std::string s;
  int shown = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (shown++ < 8) s += (s.empty() ? "'" : ", '") + names_[i] + "'";
  }
  if (shown > 8) s += " and " + std::to_string(shown - 8) + " more";
  return s;
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : buckets_) out.push_back(b.params);
  return out;
}

int64_t DistributedDataParallel::bucket_bytes() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += static_cast<int64_t>(b.flat.nbytes());
  return n;
}

}  // namespace mg::dist
