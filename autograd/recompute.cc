// Checkpoint regions: one tape node per region that keeps the region's inputs, the RNG
// state and the autocast state, and replays the region when its gradient (or, with
// recompute_outputs, one of its outputs) is needed.
#include "autograd/recompute.h"

#include <atomic>
#include <optional>
#include <string>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/random.h"

namespace mg {

namespace {

std::atomic<int64_t> g_replays{0};

class CheckpointNode final : public autograd::Node {
 public:
  CheckpointNode(CheckpointFn fn, const CheckpointOptions& opts, const std::vector<Tensor>& inputs)
      : fn_(std::move(fn)), opts_(opts), name_(opts.name ? opts.name : "checkpoint") {
    for (const Tensor& t : inputs) {
      saved_.emplace_back(t, name_.c_str());
      input_requires_grad_.push_back(t.defined() && t.requires_grad() && is_floating(t.dtype()));
    }
    rng_ = default_generator().get_state();
    autocast_ = autocast_state();
  }

  // The forward's stash, when the region keeps op outputs (set by checkpoint() before fn runs).
  std::shared_ptr<autograd::RegionStash> stash;
  // The forward's FP8 cast scales, under Fp8Autocast (set by checkpoint() before fn runs).
  std::shared_ptr<autograd::RegionScales> scales;

  std::string name() const override { return name_; }
  bool recomputes_outputs() const override { return opts_.recompute_outputs; }

  Tensor recompute_output(uint32_t nr) override {
    materialize();
    return replay_outputs_[nr].defined() ? replay_outputs_[nr].detach() : Tensor();
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    materialize();
    std::vector<Tensor> roots, root_grads;
    for (size_t i = 0; i < grads.size() && i < replay_outputs_.size(); ++i) {
      if (!grads[i].defined() || !replay_outputs_[i].defined() || !replay_outputs_[i].requires_grad()) continue;
      roots.push_back(replay_outputs_[i]);
      root_grads.push_back(grads[i]);
    }
    grads.clear();
    // The inner backward accumulates into the replay's detached inputs (leaves here) and
    // into the parameters the region used, exactly where a plain run would.
    if (!roots.empty()) autograd::backward(roots, root_grads);
    std::vector<Tensor> out(replay_inputs_.size());
    for (size_t i = 0; i < replay_inputs_.size(); ++i)
      if (input_requires_grad_[i] && replay_inputs_[i].defined()) out[i] = replay_inputs_[i].grad();
    replay_inputs_.clear();
    replay_outputs_.clear();
    return out;
  }

  void release_saved() override {
    saved_.clear();
    stash.reset();
    scales.reset();
    fn_ = nullptr;
    replay_inputs_.clear();
    replay_outputs_.clear();
  }

 private:
  // Replays the region once (with grad) and keeps the replay's graph until apply() has run:
  // a consumer's backward that rebuilds an output and this node's own backward share it.
  void materialize() {
    if (!replay_outputs_.empty() || num_outputs == 0) return;
    MG_CHECK(!released && fn_, AutogradError, name_,
             ": backward through a checkpoint region a second time (its inputs were freed after the first "
             "backward); use retain_graph=true");
    std::vector<Tensor> in;
    in.reserve(saved_.size());
    for (size_t i = 0; i < saved_.size(); ++i) {
      Tensor t = saved_[i].unpack();
      if (t.defined()) {
        t = t.detach();
        if (input_requires_grad_[i]) {
          t.requires_grad_(true);
          // apply() hands this .grad on once and drops the leaf: no copy of it is needed.
          autograd::materialize_meta(t).private_grad_ = true;
        }
      }
      in.push_back(std::move(t));
    }
    Generator& gen = default_generator();
    const PhiloxState rng_now = gen.get_state();
    const AutocastState autocast_now = autocast_state();
    // The replay must see the forward's RNG stream and autocast policy, and leave the
    // caller's (the backward pass's) state as it found it.
    if (opts_.preserve_rng_state) gen.set_state(rng_);
    set_autocast_state(autocast_);
    std::vector<Tensor> out;
    autograd::RegionStash* const stash_now = autograd::region_stash;
    autograd::RegionScales* const put_now = autograd::region_scales_put;
    autograd::RegionScales* const take_now = autograd::region_scales_take;
    auto restore = [&] {
      if (opts_.preserve_rng_state) gen.set_state(rng_now);
      set_autocast_state(autocast_now);
      autograd::region_stash = stash_now;
      autograd::region_scales_put = put_now;
      autograd::region_scales_take = take_now;
    };
    try {
      EnableGradGuard grad(true);
      MemoryCategoryGuard category(MemoryCategory::Activations);
      if (stash) {  // the kept op outputs stand in for those ops
        stash->start_replay();
        autograd::region_stash = stash.get();
      }
      // The FP8 casts take their forward's scales; a region made inside keeps its own.
      autograd::region_scales_put = nullptr;
      autograd::region_scales_take = scales.get();
      if (scales) scales->start_replay();
      out = fn_(in);
      if (stash) stash->finish_replay();
      if (scales) scales->finish_replay();
    } catch (...) {
      restore();
      stash.reset();
      throw;
    }
    restore();
    stash.reset();
    g_replays++;
    MG_CHECK(out.size() == num_outputs, AutogradError, name_, ": the replay returned ", out.size(),
             " outputs, the forward returned ", num_outputs, " (the region must be a function of its inputs)");
    for (size_t i = 0; i < out.size(); ++i) {
      const Shape want = output_shapes[i];
      MG_CHECK(!out[i].defined() || out[i].sizes() == want, AutogradError, name_, ": replay output ", i, " has shape ",
               shape_str(out[i].sizes()), ", the forward's had ", shape_str(want),
               " (the region must be a function of its inputs)");
    }
    replay_inputs_ = std::move(in);
    replay_outputs_ = std::move(out);
  }

  CheckpointFn fn_;
  CheckpointOptions opts_;
  std::string name_;
  std::vector<autograd::SavedTensor> saved_;
  std::vector<bool> input_requires_grad_;
  PhiloxState rng_;
  AutocastState autocast_;
  std::vector<Tensor> replay_inputs_, replay_outputs_;
};

// Points region_scales_put at a region's FP8 scales while its forward runs, the enclosing
// recording region (if any) linked behind it.
class ScalesScope {
 public:
  explicit ScalesScope(autograd::RegionScales* s) : s_(s), prev_(autograd::region_scales_put) {
    s->enclosing = prev_;
    autograd::region_scales_put = s;
  }
  ~ScalesScope() {
    s_->enclosing = nullptr;
    autograd::region_scales_put = prev_;
  }
  ScalesScope(const ScalesScope&) = delete;
  ScalesScope& operator=(const ScalesScope&) = delete;

 private:
  autograd::RegionScales* s_;
  autograd::RegionScales* prev_;
};

// Points region_stash at a region's stash while its forward runs.
class StashScope {
 public:
  explicit StashScope(autograd::RegionStash* s) : prev_(autograd::region_stash) { autograd::region_stash = s; }
  ~StashScope() { autograd::region_stash = prev_; }
  StashScope(const StashScope&) = delete;
  StashScope& operator=(const StashScope&) = delete;

 private:
  autograd::RegionStash* prev_;
};

thread_local const RecomputePolicy* t_policy = nullptr;
thread_local int t_inside_region = 0;  // the op's own call inside its region runs plainly

bool selective_query(const char* op) {
  return !t_inside_region && t_policy && is_grad_enabled() && t_policy->recomputes(op);
}

Tensor selective_hook(const char* op, const Tensor& x, const std::function<Tensor(const Tensor&)>& fn) {
  if (!selective_query(op)) return Tensor();
  CheckpointOptions opts;
  opts.recompute_outputs = true;
  opts.name = op;  // a string literal at every call site
  return checkpoint(
      [fn](const Tensor& in) {
        ++t_inside_region;
        try {
          Tensor r = fn(in);
          --t_inside_region;
          return r;
        } catch (...) {
          --t_inside_region;
          throw;
        }
      },
      x, opts);
}

}  // namespace

RecomputePolicy RecomputePolicy::cheap_ops() { return {{"gelu", "silu", "layer_norm", "dropout", "softmax"}}; }

bool RecomputePolicy::recomputes(const char* op) const {
  for (const std::string& o : ops)
    if (o == op) return true;
  return false;
}

SelectiveRecompute::SelectiveRecompute(RecomputePolicy policy) : policy_(std::move(policy)), prev_(t_policy) {
  static const char* known[] = {"gelu", "silu", "relu", "layer_norm", "dropout", "softmax"};
  for (const std::string& o : policy_.ops) {
    bool ok = false;
    for (const char* k : known) ok |= o == k;
    MG_CHECK(ok, ValueError, "SelectiveRecompute: unknown op kind \"", o,
             "\" (known: gelu, silu, relu, layer_norm, dropout, softmax)");
  }
  t_policy = &policy_;
  autograd::recompute_hook = selective_hook;
  autograd::recompute_query = selective_query;
}

SelectiveRecompute::~SelectiveRecompute() {
  t_policy = prev_;
  if (!prev_) autograd::recompute_hook = nullptr, autograd::recompute_query = nullptr;
}

int64_t checkpoint_replay_count() { return g_replays.load(); }

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& opts) {
  MG_CHECK(fn != nullptr, ValueError, "checkpoint: fn is empty");
  static const char* const keepable[] = {"attention", "gelu_mlp", "linear", "weight_casts"};
  for (const std::string& o : opts.keep_ops) {
    bool ok = false;
    for (const char* k : keepable) ok |= o == k;
    MG_CHECK(ok, ValueError, opts.name ? opts.name : "checkpoint", ": keep_ops names \"", o,
             "\", which no op keeps (known: attention, gelu_mlp, linear, weight_casts)");
  }
  if (!is_grad_enabled()) return fn(inputs);  // nothing to record: e.g. inside an outer region's forward

  // The node is built before the forward runs so it captures the RNG state fn starts from.
  auto node = std::make_shared<CheckpointNode>(fn, opts, inputs);
  // Inside another region (its forward or its replay) the outer stash stays in charge, so that
  // the outer replay finds every output its forward kept.
  std::optional<StashScope> stash_scope;
  if (!opts.keep_ops.empty() && !autograd::region_stash) {
    node->stash = std::make_shared<autograd::RegionStash>(opts.keep_ops, node->name());
    stash_scope.emplace(node->stash.get());
  }
  // Every recorded region keeps its FP8 casts' scales (none where fn makes no FP8 cast).
  node->scales = std::make_shared<autograd::RegionScales>(node->name());
  std::optional<ScalesScope> scales_scope(std::in_place, node->scales.get());
  std::vector<Tensor> raw_out;
  bool needs_node = autograd::any_requires_grad(inputs);
  if (needs_node) {
    NoGradGuard no_grad;  // the point: no graph, intermediates die as soon as fn drops them
    raw_out = fn(inputs);
  } else {
    // No input requires grad, but fn may use parameters that do: run it recording, look
    // at its outputs, then drop the graph (the peak is one region's activations, the same
    // as the replay's in backward).
    raw_out = fn(inputs);
    for (const Tensor& o : raw_out) needs_node |= o.defined() && o.requires_grad();
  }
  stash_scope.reset();
  scales_scope.reset();
  std::vector<Tensor> out;
  out.reserve(raw_out.size());
  for (const Tensor& o : raw_out) out.push_back(o.defined() ? o.detach() : Tensor());
  raw_out.clear();
  if (node->stash && node->stash->size() == 0) node->stash.reset();  // nothing was kept
  if (!needs_node) return out;
  autograd::record_node(node, inputs, out);
  return out;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, const CheckpointOptions& opts) {
  MG_CHECK(fn != nullptr, ValueError, "checkpoint: fn is empty");
  // Captured by value: the node replays it during backward, after this call has returned.
  auto out = checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                        std::vector<Tensor>{input}, opts);
  return out[0];
}

Tensor checkpoint_segments(const std::vector<std::function<Tensor(const Tensor&)>>& functions,
                           const std::vector<int64_t>& bounds, const std::vector<bool>& checkpointed,
                           const Tensor& input, const CheckpointOptions& opts) {
  const int64_t n = static_cast<int64_t>(functions.size());
  MG_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == n, ValueError,
           "checkpoint_segments: bounds must run from 0 to ", n, " (the number of functions), got ", bounds.size(),
           " bounds");
  MG_CHECK(checkpointed.size() + 1 == bounds.size(), ValueError, "checkpoint_segments: ", bounds.size() - 1,
           " segments but ", checkpointed.size(), " checkpoint flags");
  for (size_t i = 1; i < bounds.size(); ++i)
    MG_CHECK(bounds[i] > bounds[i - 1], ValueError, "checkpoint_segments: bounds must increase, got ", bounds[i - 1],
             " then ", bounds[i]);
  Tensor x = input;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const int64_t a = bounds[s], b = bounds[s + 1];
    // Each region owns a copy of its functions: the replay runs in backward, when the
    // caller's vector may be gone.
    std::vector<std::function<Tensor(const Tensor&)>> seg(functions.begin() + a, functions.begin() + b);
    auto run = [seg = std::move(seg)](const Tensor& in) {
      Tensor y = in;
      for (const auto& f : seg) y = f(y);
      return y;
    };
    x = checkpointed[s] ? checkpoint(run, x, opts) : run(x);
  }
  return x;
}

Tensor checkpoint_sequential(const std::vector<std::function<Tensor(const Tensor&)>>& functions, int64_t segments,
                             const Tensor& input, const CheckpointOptions& opts) {
  const int64_t n = static_cast<int64_t>(functions.size());
  MG_CHECK(n > 0, ValueError, "checkpoint_sequential: no functions");
  MG_CHECK(segments >= 1 && segments <= n, ValueError, "checkpoint_sequential: segments must be in [1, ", n,
           "] (the number of functions), got ", segments);
  std::vector<int64_t> bounds{0};
  for (int64_t s = 1; s <= segments; ++s) bounds.push_back(s * n / segments);
  std::vector<bool> flags(segments, true);
  flags.back() = false;  // its activations are used right away by backward
  return checkpoint_segments(functions, bounds, flags, input, opts);
}

}  // namespace mg
