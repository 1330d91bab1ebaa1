// The tape's building blocks: SavedTensor's version check, AccumulateGrad, record() and the
// in-place bookkeeping (check_inplace, history rebase).
#include "autograd/node.h"

#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "autograd/offload.h"
#include "kernels/ops.h"

namespace mg::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};

constexpr const char* kSecondBackward =
    "Trying to backward through the graph a second time (or directly access saved tensors after they have "
    "already been freed); use retain_graph=true";

void fill_output_meta(Node& node, const std::vector<Tensor>& outputs) {
  node.num_outputs = static_cast<uint32_t>(outputs.size());
  node.output_shapes.clear();
  node.output_dtypes.clear();
  node.output_devices.clear();
  node.output_tensors.clear();
  for (const Tensor& o : outputs) {
    node.output_shapes.push_back(o.defined() ? o.sizes() : Shape{});
    node.output_dtypes.push_back(o.defined() ? o.dtype() : DType::f32);
    node.output_devices.push_back(o.defined() ? o.device() : Device::cpu());
    node.output_tensors.push_back(o.defined() ? std::weak_ptr<TensorImpl>(o.impl_ptr()) : std::weak_ptr<TensorImpl>());
  }
}

// Makes `t` an output of `node`: integer outputs never require grad.
void set_history(const Tensor& t, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  if (!t.defined() || !is_floating(t.dtype())) return;
  AutogradMeta& m = materialize_meta(t);
  m.requires_grad_ = true;
  m.grad_fn_ = node;
  m.output_nr_ = output_nr;
}

// The in-place legality check without the version bump.
void check_inplace_allowed(const Tensor& t, const char* op) {
  if (!is_grad_enabled() || !t.requires_grad()) return;
  MG_CHECK(!t.is_leaf(), AutogradError, "a leaf Variable that requires grad is being used in an in-place operation (",
           op, "); wrap it in mg::no_grad if this is an update (e.g. an optimizer step)");
  const AutogradMeta* base = t.impl()->view_base ? meta(*t.impl()->view_base) : nullptr;
  MG_CHECK(!(base && base->requires_grad_ && !base->grad_fn_), AutogradError,
           "a view of a leaf Variable that requires grad is being used in an in-place operation (", op, ")");
}
}  // namespace

thread_local RecomputeHook recompute_hook = nullptr;
thread_local RecomputeQuery recompute_query = nullptr;

// ---------------- RegionStash ----------------

thread_local RegionStash* region_stash = nullptr;
namespace {
thread_local int64_t t_stash_reuses = 0;
}

RegionStash::RegionStash(std::vector<std::string> ops, std::string region)
    : ops_(std::move(ops)), region_(std::move(region)) {}

bool RegionStash::keeps(const char* op) const {
  for (const std::string& o : ops_)
    if (o == op) return true;
  return false;
}

void RegionStash::put(const char* op, const std::vector<Tensor>& outs) {
  Entry e{op, {}};
  for (const Tensor& t : outs) e.outs.emplace_back(t, op);
  entries_.push_back(std::move(e));
}

std::vector<Tensor> RegionStash::take(const char* op) {
  MG_CHECK(next_ < entries_.size() && std::string(entries_[next_].op) == op, AutogradError, region_,
           ": the replay called ", op, " where the forward kept ",
           next_ < entries_.size() ? std::string(entries_[next_].op) + "'s outputs" : std::string("nothing more"),
           " (entry ", next_, " of ", entries_.size(), "; the region must be a function of its inputs)");
  std::vector<SavedTensor>& outs = entries_[next_++].outs;
  bool unchanged = true;
  for (const SavedTensor& s : outs) unchanged &= s.unchanged();
  std::vector<Tensor> out;
  if (unchanged)
    for (SavedTensor& s : outs) out.push_back(s.unpack());
  outs.clear();
  if (unchanged) ++t_stash_reuses;
  return out;
}

void RegionStash::put_cast(const Tensor& source, const Tensor& cast) {
  for (const CastEntry& e : casts_)
    if (e.source.lock() == source.impl_ptr() && e.cast.dtype() == cast.dtype()) return;  // the first cast stands
  casts_.push_back({source.impl_ptr(), source.version(), cast.detach()});
}

Tensor RegionStash::take_cast(const Tensor& source, DType dtype) {
  for (CastEntry& e : casts_)
    if (e.source.lock() == source.impl_ptr() && e.cast.defined() && e.cast.dtype() == dtype &&
        e.cast.sizes() == source.sizes()) {
      Tensor c = std::move(e.cast);
      if (e.version != source.version()) return Tensor();  // the weight changed: cast it again
      ++t_stash_reuses;
      return c;
    }
  return Tensor();
}

void RegionStash::start_replay() {
  replaying_ = true;
  next_ = 0;
}

void RegionStash::finish_replay() {
  const size_t taken = next_, kept = entries_.size();
  entries_.clear();
  casts_.clear();  // casts are found by source: one the replay did not need is no error
  replaying_ = false;
  next_ = 0;
  MG_CHECK(taken == kept, AutogradError, region_, ": the replay took ", taken, " of the ", kept,
           " kept op outputs (the region must be a function of its inputs)");
}

namespace {
std::vector<Tensor> stash_take(const char* op, const Shape& want) {
  RegionStash* s = region_stash;
  if (!s || !s->replaying() || !s->keeps(op)) return {};
  std::vector<Tensor> kept = s->take(op);
  MG_CHECK(kept.empty() || kept[0].sizes() == want, AutogradError, op,
           ": the checkpoint replay's kept output has shape ", shape_str(kept[0].sizes()), ", this call makes ",
           shape_str(want), " (the region must be a function of its inputs)");
  return kept;
}

void stash_put(const char* op, const std::vector<Tensor>& outs) {
  RegionStash* s = region_stash;
  if (s && !s->replaying() && s->keeps(op)) s->put(op, outs);
}
}  // namespace

std::vector<Tensor> kept_or_run(const char* op, const Shape& want, const std::function<std::vector<Tensor>()>& run) {
  if (std::vector<Tensor> kept = stash_take(op, want); !kept.empty()) return kept;
  std::vector<Tensor> outs = run();
  stash_put(op, outs);
  return outs;
}

Tensor stash_take_cast(const Tensor& source, DType dtype) {
  RegionStash* s = region_stash;
  if (!s || !s->replaying() || !s->keeps("weight_casts")) return Tensor();
  return s->take_cast(source, dtype);
}

void stash_put_cast(const Tensor& source, const Tensor& cast) {
  RegionStash* s = region_stash;
  if (s && !s->replaying() && s->keeps("weight_casts")) s->put_cast(source, cast);
}

int64_t stash_reuse_count() { return t_stash_reuses; }

// ---------------- RegionScales ----------------

thread_local RegionScales* region_scales_put = nullptr;
thread_local RegionScales* region_scales_take = nullptr;

void RegionScales::put(const Tensor& scale, const Tensor& scale_inv) {
  for (RegionScales* r = this; r; r = r->enclosing) r->scales_.emplace_back(scale, scale_inv);
}

std::pair<Tensor, Tensor> RegionScales::take() {
  MG_CHECK(next_ < scales_.size(), AutogradError, region_, ": the replay made FP8 cast ", next_ + 1,
           " where the forward made ", scales_.size(), " (the region must be a function of its inputs)");
  return scales_[next_++];
}

void RegionScales::finish_replay() const {
  MG_CHECK(next_ == scales_.size(), AutogradError, region_, ": the replay made ", next_, " FP8 casts, the forward ",
           scales_.size(), " (the region must be a function of its inputs)");
}

// ---------------- SavedTensor ----------------

SavedTensor::SavedTensor(const Tensor& t, const char* op) : op_(op), was_defined_(t.defined()) {
  const AutogradMeta* m = meta(t);
  if (m && m->grad_fn_ && m->grad_fn_->recomputes_outputs()) {
    // Only the very tensor the node produced (not a view of it) can be rebuilt as is.
    const auto& node = m->grad_fn_;
    const uint32_t nr = m->output_nr_;
    if (nr < node->output_tensors.size() && node->output_tensors[nr].lock() == t.impl_ptr()) {
      recompute_from_ = node;
      output_nr_ = nr;
      version_ = t.impl()->version;
      saved_version_ = t.version();
      return;
    }
  }
  poll_offload();
  if (!t.defined()) return;
  saved_version_ = t.version();
  if ((offloaded_ = offload(t))) {  // keep the geometry and version counter, not the storage
    auto shell = std::make_shared<TensorImpl>(*t.impl());
    shell->storage = nullptr;
    shell->autograd = nullptr;
    shell->view_base = nullptr;
    data_ = Tensor(std::move(shell));
    return;
  }
  data_ = t.detach();  // shares storage and the version counter, drops the history
}

Tensor SavedTensor::unpack() const {
  if (!was_defined_) return Tensor();
  if (recompute_from_) {
    MG_CHECK(*version_ == saved_version_, AutogradError,
             "one of the variables needed for gradient computation has been modified by an inplace operation: "
             "the tensor saved by '",
             op_, "' (recomputed from '", recompute_from_->name(), "') is at version ", *version_,
             ", expected version ", saved_version_);
    return recompute_from_->recompute_output(output_nr_);
  }
  MG_CHECK(data_.defined(), AutogradError, kSecondBackward, " (a tensor saved by '", op_, "' was already freed)");
  MG_CHECK(data_.version() == saved_version_, AutogradError,
           "one of the variables needed for gradient computation has been modified by an inplace operation: "
           "the tensor saved by '",
           op_, "' is at version ", data_.version(), ", expected version ", saved_version_, " (of shape ",
           shape_str(data_.sizes()), ", ", data_.dtype(),
           "); clone it before modifying it in place, or do the in-place op out of place");
  poll_offload(/*in_backward=*/true);
  if (offloaded_) {
    auto impl = std::make_shared<TensorImpl>(*data_.impl());
    impl->storage = fetch(*offloaded_);
    return Tensor(std::move(impl));
  }
  return data_;
}

// ---------------- post-accumulate-grad hooks ----------------

namespace {
struct HookEntry {
  uint64_t handle;
  std::weak_ptr<TensorImpl> leaf;  // guards against a new tensor at a dead one's address
  PostAccumulateGradHook fn;
};
struct HookRegistry {
  std::mutex mu;
  std::atomic<size_t> count{0};  // fast path: no lookup while nothing is registered
  uint64_t next_handle = 1;
  std::unordered_map<const TensorImpl*, std::vector<HookEntry>> by_leaf;
};
HookRegistry& hooks() {
  static HookRegistry* r = new HookRegistry();  // leaked: hooks may be removed during exit
  return *r;
}

void run_post_accumulate_hooks(const Tensor& t) {
  HookRegistry& r = hooks();
  if (r.count.load(std::memory_order_relaxed) == 0) return;
  std::vector<PostAccumulateGradHook> todo;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_leaf.find(t.impl());
    if (it == r.by_leaf.end()) return;
    for (const HookEntry& e : it->second)
      if (e.leaf.lock() == t.impl_ptr()) todo.push_back(e.fn);
  }
  for (auto& fn : todo) fn(t);  // outside the lock: a hook may register or remove hooks
}
}  // namespace

uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  MG_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(), AutogradError,
           "register_post_accumulate_grad_hook: the tensor must be a leaf that requires grad");
  HookRegistry& r = hooks();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& list = r.by_leaf[leaf.impl()];
  // Drop entries left by a dead tensor that had this address.
  std::erase_if(list, [&](const HookEntry& e) {
    bool stale = e.leaf.lock() != leaf.impl_ptr();
    if (stale) r.count--;
    return stale;
  });
  const uint64_t h = r.next_handle++;
  list.push_back({h, leaf.impl_ptr(), std::move(hook)});
  r.count++;
  return h;
}

void remove_post_accumulate_grad_hook(uint64_t handle) {
  HookRegistry& r = hooks();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.by_leaf.begin(); it != r.by_leaf.end(); ++it) {
    auto& list = it->second;
    for (auto e = list.begin(); e != list.end(); ++e) {
      if (e->handle != handle) continue;
      list.erase(e);
      r.count--;
      if (list.empty()) r.by_leaf.erase(it);
      return;
    }
  }
}

// ---------------- AccumulateGrad ----------------

namespace {
// True for a view that is the only way to reach its bytes: a kernel's output reshaped on its
// way out (a bias gradient [C] viewed from a reduction's [1, C], a layer norm's [C] from its
// rows), whose base no one else holds, spanning the whole storage. Storing such a gradient as
// it is saves the copy (two small memcpys per layer norm and one per bias, every step).
bool sole_view(const Tensor& g) {
  const std::shared_ptr<TensorImpl>& base = g.impl()->view_base;
  return base && base.use_count() == 1 && !base->autograd && g.storage().use_count() == 2 &&
         g.nbytes() == g.storage()->nbytes;
}

// g's bytes as a tensor of their own (no view base), sharing the storage and version counter.
std::shared_ptr<TensorImpl> plain_impl(const Tensor& g) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = g.storage();
  impl->sizes = g.sizes();
  impl->strides = g.strides();
  impl->offset = 0;
  impl->dtype = g.dtype();
  impl->version = g.impl()->version;
  return impl;
}
}  // namespace

namespace {
struct SinkEntry {
  std::weak_ptr<TensorImpl> leaf;  // guards against a new tensor at a dead one's address
  Device device;
  GradientSink fn;
  std::optional<DType> grad_dtype;  // a wider dtype the sink takes the gradient in
};
struct SinkRegistry {
  std::mutex mu;
  std::atomic<size_t> count{0};  // fast path: no lookup while nothing is registered
  std::unordered_map<const TensorImpl*, SinkEntry> by_leaf;
};
SinkRegistry& sinks() {
  static SinkRegistry* r = new SinkRegistry();  // leaked: sinks may be cleared during exit
  return *r;
}
// The sink of `t`, if it has one (a copy: the sink may clear itself while running).
std::optional<SinkEntry> sink_of(const Tensor& t) {
  SinkRegistry& r = sinks();
  if (r.count.load(std::memory_order_relaxed) == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_leaf.find(t.impl());
  if (it == r.by_leaf.end() || it->second.leaf.lock() != t.impl_ptr()) return std::nullopt;
  return it->second;
}
// The device the engine brings `t`'s gradients to before its AccumulateGrad runs, and the wider
// dtype it takes them in as they come.
void set_accumulator_device(const Tensor& t, Device device, std::optional<DType> grad_dtype) {
  const AutogradMeta* m = meta(t);
  if (!m) return;
  if (auto node = m->grad_accumulator_.lock(); node && !node->output_devices.empty()) {
    node->output_devices[0] = device;
    node->accepts_grad_dtype = grad_dtype;
  }
}
}  // namespace

void set_gradient_sink(const Tensor& leaf, Device device, GradientSink sink, std::optional<DType> grad_dtype) {
  MG_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad() && sink, AutogradError,
           "set_gradient_sink: the tensor must be a leaf that requires grad, and the sink a function");
  if (grad_dtype && (!is_floating(*grad_dtype) || dtype_size(*grad_dtype) <= dtype_size(leaf.dtype())))
    grad_dtype.reset();  // only a wider floating dtype changes anything
  SinkRegistry& r = sinks();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    std::erase_if(r.by_leaf, [](const auto& kv) { return kv.second.leaf.expired(); });
    r.by_leaf[leaf.impl()] = SinkEntry{leaf.impl_ptr(), device, std::move(sink), grad_dtype};
    r.count = r.by_leaf.size();
  }
  set_accumulator_device(leaf, device, grad_dtype);
}

void clear_gradient_sink(const Tensor& leaf) {
  if (!leaf.defined()) return;
  SinkRegistry& r = sinks();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.by_leaf.erase(leaf.impl());
    r.count = r.by_leaf.size();
  }
  set_accumulator_device(leaf, leaf.device(), std::nullopt);
}

AccumulateGrad::AccumulateGrad(const Tensor& t) : leaf(t.impl_ptr()) {
  // Leaves' sinks run as soon as they are ready, so their gradient buffers die early.
  sequence_nr = std::numeric_limits<uint64_t>::max();
  fill_output_meta(*this, {t});
  output_tensors.clear();  // the leaf is tracked through `leaf`
  // A leaf with a gradient sink takes its gradients where the sink wants them.
  if (auto s = sink_of(t)) {
    output_devices[0] = s->device;
    accepts_grad_dtype = s->grad_dtype;
  }
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  auto impl = leaf.lock();
  if (!impl || grads.empty() || !grads[0].defined()) return {};
  Tensor t(impl);
  Tensor g = std::move(grads[0]);
  grads.clear();
  MG_CHECK(g.sizes() == t.sizes(), AutogradError, "AccumulateGrad: gradient of shape ", shape_str(g.sizes()),
           " for a leaf of shape ", shape_str(t.sizes()));
  auto s = sink_of(t);
  if (g.dtype() != t.dtype() && !(s && s->grad_dtype == g.dtype())) g = kernels::cast(g, t.dtype());
  if (s) {
    if (g.device() != s->device) g = raw::to_device(g, s->device);
    s->fn(t, std::move(g));
    return {};
  }
  if (g.device() != t.device()) g = raw::to_device(g, t.device());
  Tensor old = t.grad();
  if (!old.defined()) {
    // Keep the incoming buffer only when nothing else can see it (no other path's gradient,
    // no view, dense); otherwise store a fresh copy so a later in-place update of .grad
    // (an optimizer, zero_grad) never writes into a gradient someone else holds.
    // (The engine itself never writes into a gradient: it sums out of place.)
    const AutogradMeta* m = meta(t);
    const bool dense = !g.impl()->autograd && g.is_contiguous() && g.offset() == 0;
    const bool unshared = (m && m->private_grad_) || (g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1);
    if (dense && unshared && !g.impl()->view_base) {
      t.set_grad(g);
    } else if (dense && g.impl_ptr().use_count() == 1 && sole_view(g)) {
      t.set_grad(Tensor(plain_impl(g)));
    } else {
      t.set_grad(raw::clone(g));
    }
  } else {
    // Out of place: a grad captured earlier (e.g. by the user) keeps its value.
    t.set_grad(kernels::add(old, g));
  }
  run_post_accumulate_hooks(t);
  return {};
}

// ---------------- FunctionNode ----------------

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
  MG_CHECK(!released && fn_, AutogradError, kSecondBackward, " (node '", op_name_,
           "' already ran and freed its saved tensors)");
  return fn_(grads);
}

FunctionNode::~FunctionNode() {
  thread_local std::vector<std::shared_ptr<Node>> pending;
  thread_local bool draining = false;
  for (Edge& e : next_edges)
    if (e.node && e.node.use_count() == 1) pending.push_back(std::move(e.node));
  if (draining) return;  // an outer destructor's loop owns `pending`
  draining = true;
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    n.reset();  // its destructor pushes its own last-owner children onto `pending`
  }
  draining = false;
}

// ---------------- edges and recording ----------------

namespace {
// A view whose history predates an in-place write through another view of the same base
// (the base's grad_fn is a CopySlices newer than the view's own grad_fn) would backpropagate
// around that write. Its history is regenerated from the base's current one, the way
// PyTorch regenerates a view's grad_fn: the gradient lands in the view's elements of the base.
void refresh_stale_view(const Tensor& t) {
  const auto& b = t.impl()->view_base;
  const AutogradMeta& m = *meta(t);
  const AutogradMeta* bm = b ? meta(*b) : nullptr;
  if (b == t.impl_ptr() || !bm || !bm->grad_fn_) return;
  const Node& bn = *bm->grad_fn_;
  if (bn.sequence_nr <= m.grad_fn_->sequence_nr || bn.name().rfind("CopySlices", 0) != 0) return;
  Tensor base(b);
  const Shape sizes = t.sizes(), strides = t.strides(), base_shape = base.sizes();
  const int64_t offset = t.offset() - base.offset();
  auto node = std::make_shared<FunctionNode>("AsStridedView",
                                             [sizes, strides, offset, base_shape](const std::vector<Tensor>& g) {
                                               Tensor z = zeros(base_shape, {g[0].dtype(), g[0].device()});
                                               raw::copy_(raw::as_strided(z, sizes, strides, offset), g[0]);
                                               return std::vector<Tensor>{z};
                                             });
  node->sequence_nr = g_next_sequence_nr++;
  node->next_edges.push_back({bm->grad_fn_, bm->output_nr_});
  fill_output_meta(*node, {t});
  set_history(t, node, 0);
}
}  // namespace

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta(t);
  if (!m) return {};
  if (m->grad_fn_) {
    refresh_stale_view(t);
    return {m->grad_fn_, m->output_nr_};
  }
  if (!m->requires_grad_) return {};
  std::shared_ptr<Node> acc = m->grad_accumulator_.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator_ = acc;
  }
  return {acc, 0};
}

DType grad_dtype_for(const Tensor& t) {
  const AutogradMeta* m = t.defined() ? meta(t) : nullptr;
  if (m && m->grad_fn_ && m->output_nr_ == 0 && m->grad_fn_->accepts_grad_dtype)
    return *m->grad_fn_->accepts_grad_dtype;
  if (m && !m->grad_fn_ && m->requires_grad_)  // a leaf whose sink takes a wider gradient
    if (auto s = sink_of(t); s && s->grad_dtype) return *s->grad_dtype;
  return t.dtype();
}

void accept_source_dtype_grads(const Tensor& cast, DType from) {
  AutogradMeta* m = cast.defined() ? meta(cast) : nullptr;
  if (!m || !m->grad_fn_ || !is_floating(from) || !is_floating(cast.dtype())) return;
  if (dtype_size(from) > dtype_size(cast.dtype())) m->grad_fn_->accepts_grad_dtype = from;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (needs_grad(t)) return true;
  return false;
}

void record_node(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs) {
  node->sequence_nr = g_next_sequence_nr++;
  node->next_edges.clear();
  node->next_edges.reserve(inputs.size());
  for (const Tensor& i : inputs)
    node->next_edges.push_back(is_grad_enabled() && needs_grad(i) ? gradient_edge(i) : Edge{});
  fill_output_meta(*node, outputs);
  for (size_t k = 0; k < outputs.size(); ++k) set_history(outputs[k], node, static_cast<uint32_t>(k));
}

void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            FunctionNode::Backward fn) {
  if (!any_requires_grad(inputs)) return;
  for (const Tensor& o : outputs)
    for (const Tensor& i : inputs)
      MG_CHECK(!(o.defined() && o.is_same(i)), AutogradError, "record(", op,
               "): an output is the same tensor object as an input (return a new view or use record_inplace)");
  auto node = std::make_shared<FunctionNode>(op, std::move(fn));
  node->sequence_nr = g_next_sequence_nr++;
  node->next_edges.reserve(inputs.size());
  for (const Tensor& i : inputs) node->next_edges.push_back(needs_grad(i) ? gradient_edge(i) : Edge{});
  fill_output_meta(*node, outputs);
  for (size_t k = 0; k < outputs.size(); ++k) set_history(outputs[k], node, static_cast<uint32_t>(k));
}

namespace {
// An in-place op on a view also changes the view's base: without this, later uses of the
// base would backpropagate through its old history as if nothing had been written (a wrong
// gradient, silently). The base's history becomes a node that hands the base's gradient
// through the op for the view's elements and unchanged elsewhere (PyTorch's CopySlices).
// `inputs` are {self, others...} as the op's node saw them; `fn` is its backward.
void rebase_view_base(const char* op, const Tensor& self, const std::vector<Tensor>& inputs,
                      const FunctionNode::Backward& fn, bool self_had_history) {
  const auto& base_impl = self.impl()->view_base;
  if (!base_impl || base_impl == self.impl_ptr()) return;
  // A view with a history of its own over a base autograd never saw (an op's output that is a
  // raw view of the op's scratch tensor, e.g. linear's reshaped product) shares storage, not
  // history: nothing can backpropagate through that base, so there is nothing to rebase.
  const AutogradMeta* bm = meta(*base_impl);
  if (self_had_history && (!bm || (!bm->grad_fn_ && !bm->requires_grad_))) return;
  Tensor base(base_impl);
  if (!is_floating(base.dtype())) return;
  MG_CHECK(base.is_contiguous(), AutogradError, "in-place ", op, " on a view of a non-contiguous tensor (shape ",
           shape_str(base.sizes()), ") that takes part in autograd is not supported; make the base contiguous first");
  const Shape sizes = self.sizes(), strides = self.strides();
  const int64_t offset = self.offset() - base.offset();
  const Shape base_shape = base.sizes();
  const size_t n_others = inputs.size() - 1;
  auto node =
      std::make_shared<FunctionNode>(std::string("CopySlices(") + op + ")",
                                     [fn, sizes, strides, offset, base_shape, n_others](const std::vector<Tensor>& g) {
                                       Tensor gb = raw::clone(g[0]);  // contiguous, the base's layout
                                       Tensor region = raw::as_strided(gb, sizes, strides, offset);
                                       std::vector<Tensor> r = fn({raw::clone(region)});
                                       if (!r.empty() && r[0].defined())
                                         raw::copy_(region, r[0]);
                                       else
                                         raw::fill_(region, 0.0);
                                       std::vector<Tensor> out{gb};
                                       for (size_t i = 0; i < n_others; ++i)
                                         out.push_back(i + 1 < r.size() ? r[i + 1] : Tensor());
                                       return out;
                                     });
  node->sequence_nr = g_next_sequence_nr++;
  node->next_edges.push_back(needs_grad(base) ? gradient_edge(base) : Edge{});
  for (size_t i = 1; i < inputs.size(); ++i)
    node->next_edges.push_back(needs_grad(inputs[i]) ? gradient_edge(inputs[i]) : Edge{});
  fill_output_meta(*node, {base});
  set_history(base, node, 0);
}
}  // namespace

void record_inplace(const char* op, const Tensor& self, const std::vector<Tensor>& others, FunctionNode::Backward fn) {
  std::vector<Tensor> inputs;
  inputs.reserve(others.size() + 1);
  inputs.push_back(self);
  inputs.insert(inputs.end(), others.begin(), others.end());
  if (!any_requires_grad(inputs) || !is_floating(self.dtype())) return;
  const bool had_history = grad_fn(self) != nullptr;
  auto node = std::make_shared<FunctionNode>(op, fn);
  node->sequence_nr = g_next_sequence_nr++;
  node->next_edges.reserve(inputs.size());
  for (const Tensor& i : inputs) node->next_edges.push_back(needs_grad(i) ? gradient_edge(i) : Edge{});
  fill_output_meta(*node, {self});
  set_history(self, node, 0);
  rebase_view_base(op, self, inputs, fn, had_history);
}

void check_inplace(const Tensor& t, const char* op) {
  check_inplace_allowed(t, op);
  t.bump_version();
}

void inplace_update(const Tensor& t, const char* op, const std::function<void()>& write) {
  check_inplace_allowed(t, op);
  const uint32_t v0 = t.version();
  try {
    write();
  } catch (...) {
    *t.impl()->version = v0;
    throw;
  }
  *t.impl()->version = v0 + 1;
}

}  // namespace mg::autograd
