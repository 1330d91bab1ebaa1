// The FP8 recipe's linear and MLP nodes (autograd/fp8_linear.h).
#include "autograd/fp8_linear.h"

#include <array>
#include <map>
#include <memory>
#include <unordered_map>

#include "autograd/autocast_policy.h"
#include "autograd/autograd_meta.h"
#include "autograd/grad_mode.h"
#include "autograd/op_support.h"
#include "autograd/residual.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "kernels/fp8.h"
#include "kernels/norm.h"

namespace mg::autograd {

namespace {
using kernels::Fp8Accum;
using kernels::Fp8Epilogue;
using kernels::Fp8Format;
using kernels::Fp8Matrix;
using kernels::Fp8Of;
constexpr Fp8Format kE4M3 = Fp8Format::E4M3, kE5M2 = Fp8Format::E5M2;

bool half(DType d) { return d == DType::f16 || d == DType::bf16; }
int64_t rows_of(const Tensor& x) { return x.dim() == 0 ? 0 : x.numel() / x.size(-1); }

Shape with_last(const Tensor& x, int64_t n) {
  Shape s = x.sizes();
  s.back() = n;
  return s;
}

// dx-style GEMM: a's codes [M, K'] against b's transposed codes, accumulated as `acc` says.
Tensor gemm_t(const Fp8Matrix& a, const Fp8Matrix& b, DType dtype, Fp8Accum acc) {
  return kernels::fp8_gemm(a.codes, a.format, a.scale_inv, b.codes_t, b.format, b.scale_inv, Tensor(), dtype,
                           Fp8Epilogue::None, Tensor(), acc);
}
// dw-style GEMM: both operands' transposed codes.
Tensor gemm_tt(const Fp8Matrix& a, const Fp8Matrix& b, DType dtype, Fp8Accum acc) {
  return kernels::fp8_gemm(a.codes_t, a.format, a.scale_inv, b.codes_t, b.format, b.scale_inv, Tensor(), dtype,
                           Fp8Epilogue::None, Tensor(), acc);
}
// How the gradients' GEMMs of a layer made now accumulate (Fp8Autocast's Fp8Accumulation):
// taken at the forward, as its backward runs after the region has closed.
Fp8Accum gradient_accum() { return autocast_state().fp8_fast_grads ? Fp8Accum::Fast : Fp8Accum::Auto; }
// Only what backward reads: the transposed codes and the scale.
Fp8Matrix transposed_only(Fp8Matrix m) {
  m.codes = Tensor();
  return m;
}
using kernels::Fp8CastOutputs;
using kernels::Fp8History;

// Delayed scaling's histories of one layer's operands (its input, weight and output gradient),
// kept by the layer's weight: the f32 weight a cached cast came from (the same tensor every step,
// where its casts are new each region), else the weight itself, while it lives.
struct LayerHistories {
  std::weak_ptr<TensorImpl> owner;
  Fp8History x, w, g;
  // The weight's next cast, written by an optimizer's update (provide_fp8_weight_cast), with the
  // weight's version and the history's cast count when it was reserved.
  struct Provided {
    kernels::Fp8WeightCast cast;
    uint32_t version = 0;
    int64_t casts = 0;
  };
  std::optional<Provided> provided;
  // Whether the layer's last weight cast read the f32 weight the histories are kept by (not a
  // bf16 cast of it, which autocast gives a weight it also casts for another op): only then is an
  // update's cast of the f32 values the cast the forward would make.
  bool w_of_source = false;
};
thread_local std::unordered_map<const TensorImpl*, std::shared_ptr<LayerHistories>> tl_histories;

// What a layer's histories are kept by: the f32 weight whose cached cast w is, else w.
Tensor history_key(const Tensor& w) {
  const Tensor source = autocast::cast_source(w);
  return source.defined() ? source : w;
}

// The histories kept by `key` (history_key's), or null where it has none.
std::shared_ptr<LayerHistories> histories_by(const Tensor& key) {
  const auto it = tl_histories.find(key.impl());
  return it != tl_histories.end() && it->second->owner.lock() == key.impl_ptr() ? it->second : nullptr;
}

std::shared_ptr<LayerHistories> histories_of(const Tensor& w) {
  const Tensor key = history_key(w);
  if (std::shared_ptr<LayerHistories> h = histories_by(key)) return h;
  if (tl_histories.size() > 64)  // weights that are gone (their entries are never looked up again)
    std::erase_if(tl_histories, [](const auto& e) { return e.second->owner.expired(); });
  auto fresh = std::make_shared<LayerHistories>();
  fresh->owner = key.impl_ptr();
  tl_histories[key.impl()] = fresh;
  return fresh;
}

// The recipe's histories for a layer with weight w, or null where the cast uses current scaling:
// - under current scaling;
// - while a CUDA graph is captured (a history's slot is chosen on the host: a replayed graph
//   would use one slot for ever);
// - with grad off (an evaluation's activations would fill a training history), except in the
//   forward of a checkpoint region that records (its grad is off, its replay's on): the forward
//   keeps its casts' scales and the replay casts with them (RegionScales, forward_cast).
std::shared_ptr<LayerHistories> delayed_histories(const Tensor& x, const Tensor& w) {
  if (!autocast_state().fp8_delayed) return nullptr;
  if (x.is_cuda() && cuda::is_capturing(x.device().index)) return nullptr;
  const bool recorded_region = region_scales_put || region_scales_take;
  if (!recorded_region && !is_grad_enabled()) return nullptr;
  return histories_of(w);
}

// fp8_cast, or fp8_cast_delayed with the history h.
Fp8Matrix cast(const Tensor& t, Fp8Format f, Fp8CastOutputs o, Fp8History* h, Fp8Of of = Fp8Of::X) {
  return h ? kernels::fp8_cast_delayed(t, f, o, *h, 0, of) : kernels::fp8_cast(t, f, o, 0, of);
}

// A forward cast (x, w, the MLP's hidden activation): in a checkpoint region's replay, with the
// scale its forward's cast used (the history is left alone: it took that cast's amax already);
// elsewhere as cast() casts, its scale kept for the replay in a region's forward.
Fp8Matrix forward_cast(const Tensor& t, Fp8Format f, Fp8CastOutputs o, Fp8History* h, Fp8Of of = Fp8Of::X) {
  Fp8Matrix m;
  if (RegionScales* const rs = region_scales_take) {
    const auto [scale, scale_inv] = rs->take();
    m = kernels::fp8_cast_scaled(t, f, o, scale, scale_inv, of);
  } else {
    m = cast(t, f, o, h, of);
  }
  if (RegionScales* const rs = region_scales_put) rs->put(m.scale, m.scale_inv);
  return m;
}
Fp8History* of(const std::shared_ptr<LayerHistories>& h, Fp8History LayerHistories::*member) {
  return h ? &(h.get()->*member) : nullptr;
}

// A forward's cast of the weight w (its transpose too with `transposed`): the one an optimizer's
// update wrote (provide_fp8_weight_cast) where w and the history are as they were then, else
// forward_cast's. A checkpoint region's replay casts with its forward's scale and leaves it.
Fp8Matrix weight_cast(const Tensor& w, bool transposed, const std::shared_ptr<LayerHistories>& h) {
  if (h && !region_scales_take) h->w_of_source = !autocast::cast_source(w).defined();
  if (h && h->provided && !region_scales_take) {
    const LayerHistories::Provided p = std::move(*h->provided);
    h->provided.reset();
    if (h->w_of_source && p.version == w.version() && p.casts == h->w.casts) {
      ++h->w.casts;  // the update cast at this slot
      Fp8Matrix m;
      m.codes = p.cast.codes;
      if (transposed) m.codes_t = p.cast.codes_t;
      m.scale = p.cast.scale;
      m.scale_inv = p.cast.scale_inv;
      m.format = p.cast.format;
      if (RegionScales* const rs = region_scales_put) rs->put(m.scale, m.scale_inv);
      return m;
    }
    // The cast below takes the slot the update wrote: the amax of the weight as it was goes.
    if (p.casts == h->w.casts) raw::fill_(raw::slice(h->w.amax, 0, p.cast.slot, p.cast.slot + 1, 1), 0.0);
  }
  return forward_cast(w, kE4M3, {true, transposed, false}, of(h, &LayerHistories::w));
}

// The rows' sum in `dtype` (f32 for an f32 bias: the f32 sums not rounded to g2's type first).
Tensor bias_grad(const Tensor& g2, DType dtype) {
  return dtype == DType::f32 || dtype == g2.dtype() ? kernels::sum(g2, {0}, false, dtype)
                                                    : raw::to_dtype(kernels::sum(g2, {0}), dtype);
}
// The same from the f32 column sums a gradient's cast took on its way (Fp8CastOutputs::column_sums).
Tensor bias_grad_from_sums(const Tensor& sums, DType dtype) {
  return dtype == DType::f32 ? sums : raw::to_dtype(sums, dtype);
}
}  // namespace

std::optional<kernels::Fp8WeightCast> fp8_next_weight_cast(const Tensor& w) {
  if (!w.defined() || w.dtype() != DType::f32 || w.dim() != 2 || !w.is_contiguous()) return std::nullopt;
  if (w.is_cuda() && cuda::is_capturing(w.device().index)) return std::nullopt;
  const std::shared_ptr<LayerHistories> h = histories_by(history_key(w));
  if (!h || !h->w_of_source || h->w.casts == 0 || !h->w.amax.defined() || h->w.amax.device() != w.device())
    return std::nullopt;
  // The next forward's memory, counted as the casts that forward would make (as autocast's casts
  // an update writes are).
  MemoryCategoryGuard act(MemoryCategory::Activations);
  return kernels::fp8_reserve_delayed(w, kE4M3, h->w);
}

void provide_fp8_weight_cast(const Tensor& w, const kernels::Fp8WeightCast& cast) {
  MG_CHECK(w.defined() && cast.codes.defined(), ValueError, "provide_fp8_weight_cast: undefined tensor");
  const std::shared_ptr<LayerHistories> h = histories_by(history_key(w));
  MG_CHECK(h && h->w.amax.defined() && h->w.amax.impl() == cast.history.impl(), ValueError,
           "provide_fp8_weight_cast: the cast of weight ", shape_str(w.sizes()),
           " was not reserved against its layer's history (fp8_next_weight_cast)");
  h->provided = LayerHistories::Provided{cast, w.version(), h->w.casts};
}

bool fp8_weight_cast_provided(const Tensor& w) {
  const std::shared_ptr<LayerHistories> h = w.defined() ? histories_by(history_key(w)) : nullptr;
  return h && h->provided.has_value();
}

std::array<int64_t, 3> fp8_history_casts(const Tensor& weight) {
  const std::shared_ptr<LayerHistories> h = weight.defined() ? histories_by(history_key(weight)) : nullptr;
  if (!h) return {0, 0, 0};
  return {h->x.casts, h->w.casts, h->g.casts};
}

namespace {
constexpr std::array<std::pair<const char*, Fp8History LayerHistories::*>, 3> kOperands{
    {{"x", &LayerHistories::x}, {"w", &LayerHistories::w}, {"g", &LayerHistories::g}}};
}  // namespace

Fp8HistoryState::Fp8HistoryState(std::vector<std::pair<std::string, Tensor>> weights) : weights_(std::move(weights)) {
  for (const auto& [name, w] : weights_) {
    MG_CHECK(!name.empty(), ValueError, "Fp8HistoryState: a weight's name is empty");
    MG_CHECK(w.defined(), ValueError, "Fp8HistoryState: weight \"", name, "\" is undefined");
  }
}

StateDict Fp8HistoryState::state_dict() const {
  StateDict sd;
  for (const auto& [name, w] : weights_) {
    const std::shared_ptr<LayerHistories> layer = histories_by(history_key(w));
    if (!layer) continue;
    nlohmann::json counts = nlohmann::json::object();
    for (const auto& [op, member] : kOperands) {
      const Fp8History& h = layer.get()->*member;
      if (h.casts == 0 || !h.amax.defined()) continue;
      Tensor amax = h.amax.clone();
      // A cast an update wrote and no forward has taken yet: its slot saved empty, as the resumed
      // run's forward, casting the weight itself, finds it (an uninterrupted forward that takes
      // the cast writes the same amax there; one that cannot clears it first).
      if (member == &LayerHistories::w && layer->provided && layer->provided->casts == h.casts) {
        const int slot = layer->provided->cast.slot;
        raw::fill_(raw::slice(amax, 0, slot, slot + 1, 1), 0.0);
      }
      sd.tensors[name + "." + op] = amax;
      counts[op] = h.casts;
    }
    if (!counts.empty()) sd.meta[name] = counts;
  }
  return sd;
}

StagedLoad Fp8HistoryState::stage_state_dict(const StateDict& sd) {
  const char* op = "Fp8HistoryState::load_state_dict";
  struct Staged {
    Tensor weight;
    std::array<Fp8History, 3> h;
  };
  std::map<std::string, Staged> staged;
  for (const auto& [name, w] : weights_) staged[name].weight = w;
  for (const auto& [key, t] : sd.tensors) {
    const size_t dot = key.rfind('.');
    const std::string name = dot == key.npos ? key : key.substr(0, dot),
                      operand = dot == key.npos ? "" : key.substr(dot + 1);
    MG_CHECK(staged.count(name), ValueError, op, ": \"", key, "\" names no weight given to this state");
    int k = -1;
    for (int i = 0; i < 3; ++i)
      if (operand == kOperands[i].first) k = i;
    MG_CHECK(k >= 0, ValueError, op, ": \"", key, "\" names no operand (x, w or g)");
    MG_CHECK(t.defined() && t.dtype() == DType::f32 && t.dim() == 1 && t.numel() == kernels::kFp8HistorySlots,
             ValueError, op, ": \"", key, "\" must be f32 [", kernels::kFp8HistorySlots, "], got ",
             t.defined() ? dtype_name(t.dtype()) : "undefined", " ", t.defined() ? shape_str(t.sizes()) : "");
    const nlohmann::json* counts = sd.meta.contains(name) ? &sd.meta[name] : nullptr;
    MG_CHECK(counts && counts->is_object() && counts->contains(operand) && (*counts)[operand].is_number_integer() &&
                 (*counts)[operand].get<int64_t>() > 0,
             ValueError, op, ": \"", key, "\" has no positive cast count in meta[\"", name, "\"][\"", operand, "\"]");
    Fp8History& h = staged[name].h[k];
    h.amax = raw::to_device(t, staged[name].weight.device());
    if (h.amax.impl() == t.impl()) h.amax = t.clone();  // not the caller's tensor
    h.casts = (*counts)[operand].get<int64_t>();
  }
  for (const auto& [name, counts] : sd.meta.items()) {
    MG_CHECK(staged.count(name), ValueError, op, ": meta entry \"", name, "\" names no weight given to this state");
    MG_CHECK(counts.is_object(), ValueError, op, ": meta[\"", name, "\"] must be an object of cast counts");
    for (const auto& [operand, n] : counts.items())
      MG_CHECK(sd.tensors.count(name + "." + operand), ValueError, op, ": meta[\"", name, "\"][\"", operand,
               "\"] counts casts of a history the state does not hold");
  }
  // Each weight's entry made here (an empty one is the same as none), so the commit only assigns.
  std::vector<std::pair<std::shared_ptr<LayerHistories>, std::array<Fp8History, 3>>> commits;
  for (const auto& [name, s] : staged) commits.emplace_back(histories_of(s.weight), s.h);
  return [commits = std::move(commits)] {
    for (const auto& [h, hs] : commits) {
      for (int i = 0; i < 3; ++i) h.get()->*kOperands[i].second = hs[i];
      h->provided.reset();  // reserved against the history replaced
    }
  };
}

namespace {
// The recipe's rules for x [..., K] and w [N, K] but their dtypes: FP8 autocast on and autocast in
// f16 or bf16 for x's device, the sizes (fp8_linear_applies).
bool fp8_takes_shapes(const AutocastState& st, const Tensor& x, const Tensor& w) {
  if (!st.fp8 || !x.defined() || !w.defined() || x.dim() < 1 || w.dim() != 2) return false;
  const DeviceType dt = x.device().type;
  if (!st.enabled(dt) || !half(st.dtype(dt))) return false;
  if (x.size(-1) < st.fp8_min_features || w.size(0) < st.fp8_min_features) return false;
  return x.size(-1) % 16 == 0 && w.size(0) % 16 == 0 && rows_of(x) % 16 == 0 && rows_of(x) > 0;
}
}  // namespace

bool fp8_linear_applies(const Tensor& x, const Tensor& w) {
  const AutocastState st = autocast_state();
  if (!fp8_takes_shapes(st, x, w) || x.dtype() != st.dtype(x.device().type)) return false;
  return w.dtype() == x.dtype() || (w.dtype() == DType::f32 && w.device() == x.device());
}

bool fp8_keeps_f32_weight(const Tensor& x, const Tensor& w) {
  const AutocastState st = autocast_state();
  return fp8_takes_shapes(st, x, w) && w.dtype() == DType::f32 && w.device() == x.device() &&
         (x.dtype() == DType::f32 || half(x.dtype()));
}

namespace {
// A linear's backward under the recipe, from its output gradient g: {gx, gw, gb} (fp8_linear's,
// and fp8_norm_linear's, whose gx goes on into the norm's backward).
struct LinearBackward {
  bool need_x = false, need_w = false, need_b = false;
  int64_t n = 0;  // out features
  Shape xs;       // the input's shape
  DType dtype = DType::bf16, gw_dtype = DType::f32;
  Fp8Matrix xq, wq;  // transposed_only
  std::shared_ptr<LayerHistories> hist;
  Fp8Accum acc = Fp8Accum::Auto;
  Grads operator()(const Tensor& g) const {
    Tensor gx, gw, gb;
    const Tensor g2 = raw::reshape(g, {-1, n});
    if (need_x || need_w) {  // the bias gradient summed in the cast's pass over g
      const Fp8Matrix gq = cast(g2, kE5M2, {need_x, need_w, need_b}, of(hist, &LayerHistories::g));
      if (need_x) gx = raw::view(gemm_t(gq, wq, dtype, acc), xs);  // [M, N] @ w [N, K]
      if (need_w) gw = gemm_tt(gq, xq, gw_dtype, acc);             // g^T [N, M] @ x [M, K]
      if (need_b) gb = bias_grad_from_sums(gq.column_sums, gw_dtype);
    } else if (need_b) {
      gb = bias_grad(g2, gw_dtype);
    }
    return Grads{gx, gw, gb};
  }
};
}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType gw_dtype) {
  const bool grad = any_requires_grad({x, w, bias});
  const bool need_x = grad && needs_grad(x), need_w = grad && needs_grad(w), need_b = grad && needs_grad(bias);
  const int64_t n = w.size(0);
  const std::shared_ptr<LayerHistories> hist = delayed_histories(x, w);
  const Fp8Matrix xq =
      forward_cast(raw::reshape(x, {-1, x.size(-1)}), kE4M3, {true, need_w, false}, of(hist, &LayerHistories::x));
  const Fp8Matrix wq = weight_cast(w, need_x, hist);
  const Tensor out = raw::view(kernels::fp8_gemm(xq, wq, bias, x.dtype()), with_last(x, n));
  if (!grad) return out;
  record("linear", {x, w, bias}, out,
         [b = LinearBackward{need_x, need_w, need_b, n, x.sizes(), x.dtype(), gw_dtype, transposed_only(xq),
                             transposed_only(wq), hist, gradient_accum()}](const Grads& g) { return b(g[0]); });
  return out;
}

namespace {
// The MLP's backward under the recipe, from its output gradient g: the gradients of x, w_fc,
// b_fc, w_proj and b_proj (fp8_gelu_mlp's, and fp8_norm_gelu_mlp's, whose gx goes on into the
// norm's backward).
struct MlpBackward {
  std::array<bool, 5> need{};
  bool need_pre = false;
  Shape xs;
  DType dtype = DType::bf16, dt_fc = DType::f32, dt_proj = DType::f32;
  Fp8Matrix xq, wfq, hq, wpq;  // transposed_only
  Tensor pre;                  // c_fc's output, GELU's argument (where the gradient reaches it)
  std::shared_ptr<LayerHistories> h_fc, h_proj;
  Fp8Accum acc = Fp8Accum::Auto;
  Grads operator()(const Tensor& g) const {
    Tensor gx, gw_fc, gb_fc, gw_proj, gb_proj;
    const Tensor g2 = raw::reshape(g, {-1, g.size(-1)});
    if (need_pre || need[3]) {
      const Fp8Matrix gq = cast(g2, kE5M2, {need_pre, need[3], need[4]}, of(h_proj, &LayerHistories::g));
      if (need[4]) gb_proj = bias_grad_from_sums(gq.column_sums, dt_proj);
      if (need[3]) gw_proj = gemm_tt(gq, hq, dt_proj, acc);
      if (need_pre) {
        // g_pre = (g @ w_proj) * gelu'(pre): the GEMM, then the derivative in the pass that
        // casts g_pre under delayed scaling (g_pre never written), in the pass that takes its
        // amax under current scaling, in the GEMM's epilogue when nothing casts it.
        Tensor g_pre;
        if ((need[0] || need[1]) && h_fc) {
          const Tensor g_h = kernels::fp8_gemm(gq.codes, kE5M2, gq.scale_inv, wpq.codes_t, kE4M3, wpq.scale_inv,
                                               Tensor(), dtype, Fp8Epilogue::None, Tensor(),
                                               acc);  // the gradient at GELU's output
          const Fp8Matrix gpq =
              kernels::fp8_cast_gelu_backward_delayed(g_h, pre, kE5M2, {need[0], need[1], need[2]}, h_fc->g);
          if (need[2]) gb_fc = bias_grad_from_sums(gpq.column_sums, dt_fc);
          if (need[1]) gw_fc = gemm_tt(gpq, xq, dt_fc, acc);
          if (need[0]) gx = raw::view(gemm_t(gpq, wfq, dtype, acc), xs);
        } else if (need[0] || need[1]) {
          g_pre = kernels::fp8_gemm(gq.codes, kE5M2, gq.scale_inv, wpq.codes_t, kE4M3, wpq.scale_inv, Tensor(), dtype,
                                    Fp8Epilogue::None, Tensor(), acc);
          const Fp8Matrix gpq = kernels::fp8_cast_gelu_backward(g_pre, pre, kE5M2, {need[0], need[1], need[2]});
          if (need[2]) gb_fc = bias_grad_from_sums(gpq.column_sums, dt_fc);
          if (need[1]) gw_fc = gemm_tt(gpq, xq, dt_fc, acc);
          if (need[0]) gx = raw::view(gemm_t(gpq, wfq, dtype, acc), xs);
        } else {
          g_pre = kernels::fp8_gemm(gq.codes, kE5M2, gq.scale_inv, wpq.codes_t, kE4M3, wpq.scale_inv, Tensor(), dtype,
                                    Fp8Epilogue::DGelu, pre, acc);
          if (need[2]) gb_fc = bias_grad(g_pre, dt_fc);
        }
      }
    } else if (need[4]) {
      gb_proj = bias_grad(g2, dt_proj);
    }
    return Grads{gx, gw_fc, gb_fc, gw_proj, gb_proj};
  }
};

// The MLP from its input's cast xq (x [..., K] as xs says): pre = x @ w_fc^T + b_fc, the hidden
// activation gelu(pre) cast from it, the GELU taken in the cast's passes (the activation is never
// written in the region's dtype, and the GEMM has only the bias in its epilogue), then c_proj.
// Fills `b` with what its backward keeps.
Tensor mlp_from_cast(const Fp8Matrix& xq, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                     const Tensor& b_proj, MlpBackward& b) {
  const Fp8Matrix wfq = weight_cast(w_fc, b.need[0], b.h_fc);
  const Tensor pre = kernels::fp8_gemm(xq, wfq, b_fc, b.dtype);
  const Fp8Matrix hq =
      forward_cast(pre, kE4M3, {true, b.need[3], false}, of(b.h_proj, &LayerHistories::x), Fp8Of::GeluOfX);
  const Fp8Matrix wpq = weight_cast(w_proj, b.need_pre, b.h_proj);
  Shape out_shape = b.xs;
  out_shape.back() = w_proj.size(0);
  const Tensor out = raw::view(kernels::fp8_gemm(hq, wpq, b_proj, b.dtype), out_shape);
  b.xq = transposed_only(xq);
  b.wfq = transposed_only(wfq);
  b.hq = transposed_only(hq);
  b.wpq = transposed_only(wpq);
  if (b.need_pre) b.pre = pre;
  b.acc = gradient_accum();
  return out;
}
}  // namespace

Tensor fp8_gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj,
                    DType dt_fc, DType dt_proj) {
  const bool grad = any_requires_grad({x, w_fc, b_fc, w_proj, b_proj});
  MlpBackward b;
  b.need = {grad && needs_grad(x), grad && needs_grad(w_fc), grad && needs_grad(b_fc), grad && needs_grad(w_proj),
            grad && needs_grad(b_proj)};
  b.need_pre = b.need[0] || b.need[1] || b.need[2];
  b.xs = x.sizes();
  b.dtype = x.dtype();
  b.dt_fc = dt_fc;
  b.dt_proj = dt_proj;
  b.h_fc = delayed_histories(x, w_fc);
  b.h_proj = delayed_histories(x, w_proj);
  const Fp8Matrix xq =
      forward_cast(raw::reshape(x, {-1, x.size(-1)}), kE4M3, {true, b.need[1], false}, of(b.h_fc, &LayerHistories::x));
  const Tensor out = mlp_from_cast(xq, w_fc, b_fc, w_proj, b_proj, b);
  if (!grad) return out;
  record("gelu_mlp", {x, w_fc, b_fc, w_proj, b_proj}, out, [b = std::move(b)](const Grads& g) { return b(g[0]); });
  return out;
}

namespace {
thread_local bool tl_norm_casts = true;

// The norm's part of a fused norm-and-linear node: its five inputs (the stream's value without
// its pending branch, the branch, the norm's weight and bias, the branch's bias).
std::array<Tensor, 5> norm_inputs(const Normed& x) {
  const Residual& r = x.stream();
  return {r.base(), r.pending().out, x.weight(), x.bias(), r.pending().bias};
}

// The norm of x run inside the op, its output cast for the first GEMM (kernels::
// add_layer_norm_fp8_delayed with the layer's input history), the stream told (Normed::ran), and
// the norm's backward filled.
Fp8Matrix norm_cast(const Normed& x, const std::array<Tensor, 5>& in, bool transposed, Fp8History& hx, bool grad,
                    AddLayerNormBackward& ln) {
  const DType dtype = autocast_state().dtype(in[0].device().type);
  kernels::Fp8NormCast nc = kernels::add_layer_norm_fp8_delayed(
      in[0], in[1], x.normalized_shape(), in[2], in[3], x.eps(), dtype, in[4], kE4M3, {true, transposed, false}, hx);
  const bool has_res = in[1].defined();
  // Without a residual the stream keeps its tensor (nc.sum is a view of it, outside the graph), as
  // add_layer_norm returns it.
  x.ran(has_res ? nc.sum : in[0]);
  if (grad) {
    ln.mask = {needs_grad(in[0]), needs_grad(in[1]), needs_grad(in[2]), needs_grad(in[3]), needs_grad(in[4])};
    ln.has_res = has_res;
    ln.res_t = has_res ? in[1].dtype() : in[0].dtype();
    ln.rb_t = in[4].defined() ? in[4].dtype() : in[0].dtype();
    ln.normalized_shape = x.normalized_shape();
    ln.sum = SavedTensor(nc.sum, "add_layer_norm");
    if (in[2].defined()) ln.weight = SavedTensor(in[2], "add_layer_norm");
    ln.mean = nc.mean;
    ln.rstd = nc.rstd;
  }
  return nc.out;
}

// Records a fused node: inputs the norm's five (norm_inputs, taken before the norm ran) then the
// layer's, outputs the stream's sum (where the norm had a pending branch and an input of it needs a
// gradient, as add_layer_norm records it) and the layer's output; `layer` maps the output's
// gradient to {the norm output's gradient, the layer's parameters' gradients...}. An output
// nothing used keeps its gradient undefined (Node::materialize_grads): its part of the backward
// is skipped, as the separate op's node would not run.
// A bias as autocast's policy for the linears lowers it (op_policy.h): the region's dtype, the
// gradient back in f32 through the cast's node.
Tensor lowered(const Tensor& b) { return b.defined() ? autocast::lower(b) : b; }

template <class Layer>
void record_norm_node(const char* name, const Normed& x, const std::array<Tensor, 5>& in, std::vector<Tensor> params,
                      const Tensor& out, AddLayerNormBackward ln, Layer layer) {
  std::vector<Tensor> inputs(in.begin(), in.end());
  inputs.insert(inputs.end(), params.begin(), params.end());
  const bool norm_grads = ln.mask[0] || ln.mask[1] || ln.mask[2] || ln.mask[3] || ln.mask[4];
  const bool sum_out = ln.has_res && norm_grads;
  const size_t n_params = params.size();
  // The norm's output as the plain norm node would have it: zeros when the layer did not run (the
  // engine gives a node zeros for an output nothing used).
  const Shape y_shape = in[0].sizes();
  const TensorOptions y_opts(autocast_state().dtype(in[0].device().type), in[0].device());
  auto backward = [ln = std::move(ln), layer = std::move(layer), n_params, sum_out, norm_grads, y_shape,
                   y_opts](const Grads& g) {
    const Tensor gh = sum_out ? g[0] : Tensor(), gout = sum_out ? g[1] : g[0];
    Grads lg = gout.defined() ? layer(gout) : Grads(1 + n_params);
    const bool run_norm = norm_grads && (lg[0].defined() || gh.defined());
    Grads grads = run_norm ? ln(lg[0].defined() ? lg[0] : zeros(y_shape, y_opts), gh) : Grads(5);
    grads.insert(grads.end(), lg.begin() + 1, lg.end());
    return grads;
  };
  if (sum_out)
    record(name, inputs, std::vector<Tensor>{x.stream().base(), out}, backward);
  else
    record(name, inputs, out, backward);
  grad_fn(out)->materialize_grads = false;
}
}  // namespace

void set_fp8_norm_casts(bool on) { tl_norm_casts = on; }

bool fp8_norm_applies(const Normed& x, const Tensor& w) {
  if (!tl_norm_casts || !x.pending() || !w.defined()) return false;
  const AutocastState st = autocast_state();
  if (!st.fp8 || !st.fp8_delayed || !is_grad_enabled() || region_scales_put || region_scales_take) return false;
  const std::array<Tensor, 5> in = norm_inputs(x);
  const Tensor& base = in[0];
  if (!base.defined() || base.dtype() != DType::f32 || !fp8_keeps_f32_weight(base, w)) return false;
  if (base.is_cuda() && cuda::is_capturing(base.device().index)) return false;
  if (x.normalized_shape().size() != 1 || x.normalized_shape()[0] != base.size(-1)) return false;
  // The norm's parameters (and the branch's bias) as add_layer_norm's policy leaves them (f32: it
  // widens others), everything on the stream's device (a parameter held in host memory comes to it
  // through the plain ops); the branch itself is read in its dtype either way.
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].defined() && (in[i].device() != base.device() || (i >= 2 && in[i].dtype() != DType::f32))) return false;
  return !rebuilds("layer_norm");
}

Tensor fp8_norm_linear(const Normed& x, const Tensor& w, const Tensor& bias_arg, DType gw_dtype) {
  const Tensor bias = lowered(bias_arg);
  const std::array<Tensor, 5> in = norm_inputs(x);
  const bool grad = any_requires_grad({in[0], in[1], in[2], in[3], in[4], w, bias});
  const bool need_x = grad && any_requires_grad({in[0], in[1], in[2], in[3], in[4]});
  const bool need_w = grad && needs_grad(w), need_b = grad && needs_grad(bias);
  const std::shared_ptr<LayerHistories> hist = delayed_histories(in[0], w);
  const DType dtype = autocast_state().dtype(in[0].device().type);
  const Shape xs = in[0].sizes();
  AddLayerNormBackward ln;
  const Fp8Matrix xq = norm_cast(x, in, need_w, hist->x, grad, ln);
  const Fp8Matrix wq = weight_cast(w, need_x, hist);
  const Tensor out = raw::view(kernels::fp8_gemm(xq, wq, bias, dtype), with_last(in[0], w.size(0)));
  if (!grad) return out;
  record_norm_node("add_layer_norm_linear", x, in, {w, bias}, out, std::move(ln),
                   LinearBackward{need_x, need_w, need_b, w.size(0), xs, dtype, gw_dtype, transposed_only(xq),
                                  transposed_only(wq), hist, gradient_accum()});
  return out;
}

Tensor fp8_norm_gelu_mlp(const Normed& x, const Tensor& w_fc, const Tensor& b_fc_arg, const Tensor& w_proj,
                         const Tensor& b_proj_arg, DType dt_fc, DType dt_proj) {
  const Tensor b_fc = lowered(b_fc_arg), b_proj = lowered(b_proj_arg);
  const std::array<Tensor, 5> in = norm_inputs(x);
  const bool grad = any_requires_grad({in[0], in[1], in[2], in[3], in[4], w_fc, b_fc, w_proj, b_proj});
  MlpBackward b;
  b.need = {grad && any_requires_grad({in[0], in[1], in[2], in[3], in[4]}), grad && needs_grad(w_fc),
            grad && needs_grad(b_fc), grad && needs_grad(w_proj), grad && needs_grad(b_proj)};
  b.need_pre = b.need[0] || b.need[1] || b.need[2];
  b.xs = in[0].sizes();
  b.dtype = autocast_state().dtype(in[0].device().type);
  b.dt_fc = dt_fc;
  b.dt_proj = dt_proj;
  b.h_fc = delayed_histories(in[0], w_fc);
  b.h_proj = delayed_histories(in[0], w_proj);
  AddLayerNormBackward ln;
  const Fp8Matrix xq = norm_cast(x, in, b.need[1], b.h_fc->x, grad, ln);
  const Tensor out = mlp_from_cast(xq, w_fc, b_fc, w_proj, b_proj, b);
  if (!grad) return out;
  record_norm_node("add_layer_norm_gelu_mlp", x, in, {w_fc, b_fc, w_proj, b_proj}, out, std::move(ln), std::move(b));
  return out;
}

}  // namespace mg::autograd
