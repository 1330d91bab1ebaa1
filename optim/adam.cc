#include "optim/adam.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "autograd/autocast_policy.h"
#include "autograd/fp8_linear.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "kernels/optim_math.h"
#include "optim/bf16_update.h"

namespace mg::optim {

namespace {
std::map<std::string, double> to_map(const AdamOptions& o) {
  return {{"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

Tensor scalar_like(double v, const Tensor& t) { return scalar_tensor(v, {t.dtype(), t.device()}); }

// Updates the moments with gradient g (weight decay already folded in where it is L2) and
// returns m / (sqrt(v_hat) + eps) and the bias-corrected step size: the shared core of the
// f32 and the pure-bf16 paths.
Tensor adam_direction(const Tensor& g, ParamState& st, const kernels::AdamHyper& h, double* step_size) {
  Tensor& m = st.buffers["exp_avg"];
  Tensor& v = st.buffers["exp_avg_sq"];
  kernels::axpby_(m, h.beta1, g, 1.0 - h.beta1);
  kernels::axpby_(v, h.beta2, kernels::mul(g, g), 1.0 - h.beta2);
  Tensor vv = v;
  if (h.amsgrad) {
    Tensor& vmax = st.buffers["max_exp_avg_sq"];
    kernels::binary_(kernels::Binary::Maximum, vmax, v);
    vv = vmax;
  }
  const double t = static_cast<double>(st.step);
  *step_size = h.lr / (1.0 - std::pow(h.beta1, t));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, t));
  Tensor denom =
      kernels::add_scalar(kernels::div(kernels::unary(kernels::Unary::Sqrt, vv), scalar_like(bc2_sqrt, vv)), h.eps);
  return kernels::div(m, denom);
}

// The same rule as kernels/optim_math.h, one kernel per operation (PyTorch's foreach=False):
// for parameters the fused path does not take, and as the baseline it is measured against.
void adam_single(const Tensor& p, const Tensor& grad, ParamState& st, const kernels::AdamHyper& h) {
  Tensor g = h.maximize ? kernels::unary(kernels::Unary::Neg, grad) : grad;
  if (h.weight_decay != 0.0) {
    if (h.decoupled_weight_decay)
      kernels::binary_(kernels::Binary::Mul, p, scalar_like(1.0 - h.lr * h.weight_decay, p));
    else
      g = kernels::axpby(g, 1.0, p, h.weight_decay);
  }
  double step_size = 0;
  Tensor dir = adam_direction(g, st, h, &step_size);
  kernels::axpby_(p, 1.0, dir, -step_size);
}
// A pure-bf16 parameter (no f32 master copy): f32 state, the whole update computed in f32
// and added to the bf16 weights with stochastic rounding (optim/bf16_update.h), so updates
// far below bf16's resolution still move the weights in expectation.
void adam_bf16(const Tensor& p, const Tensor& grad, ParamState& st, const kernels::AdamHyper& h) {
  Tensor g = kernels::cast(grad, DType::f32);
  if (h.maximize) g = kernels::unary(kernels::Unary::Neg, g);
  const Tensor p32 = kernels::cast(p, DType::f32);
  if (h.weight_decay != 0.0 && !h.decoupled_weight_decay) g = kernels::axpby(g, 1.0, p32, h.weight_decay);
  double step_size = 0;
  Tensor delta = adam_direction(g, st, h, &step_size);
  // delta = -step_size * m / denom (- lr * wd * p for AdamW), applied once with rounding.
  delta = h.weight_decay != 0.0 && h.decoupled_weight_decay
              ? kernels::axpby(delta, -step_size, p32, -h.lr * h.weight_decay)
              : kernels::mul_scalar(delta, -step_size);
  bf16_add_(p, delta, 1.0, next_rounding_seed());
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions defaults)
    : Adam(std::vector<ParamGroup>{{std::move(params), {}}}, defaults) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults) : Adam("Adam", std::move(groups), defaults, false) {}

Adam::Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions defaults, bool decoupled)
    : Optimizer(name, to_map(defaults)),
      decoupled_(decoupled),
      fused_(defaults.fused),
      write_autocast_casts_(defaults.write_autocast_casts),
      state_bits_(defaults.state_bits),
      min_8bit_size_(defaults.min_8bit_size) {
  MG_CHECK(!groups.empty(), ValueError, name, ": got an empty list of parameter groups");
  MG_CHECK(state_bits_ == 8 || state_bits_ == 32, ValueError, name, ": state_bits must be 8 or 32, got ", state_bits_);
  MG_CHECK(state_bits_ == 32 || defaults.fused, ValueError, name, ": 8-bit state needs fused = true");
  MG_CHECK(min_8bit_size_ >= 1, ValueError, name, ": min_8bit_size must be >= 1, got ", min_8bit_size_);
  MG_CHECK(defaults.fused || !defaults.capturable, ValueError, name, ": capturable needs fused = true");
  capturable_ = defaults.capturable;
  for (auto& g : groups) add_param_group(std::move(g));
}

void Adam::validate(const ParamGroup& g) const {
  const double lr = g.get("lr"), b1 = g.get("beta1"), b2 = g.get("beta2"), eps = g.get("eps"),
               wd = g.get("weight_decay");
  MG_CHECK(std::isfinite(lr) && lr >= 0.0, ValueError, name(), ": invalid learning rate: ", lr, " (must be >= 0)");
  MG_CHECK(std::isfinite(eps) && eps >= 0.0, ValueError, name(), ": invalid epsilon value: ", eps, " (must be >= 0)");
  MG_CHECK(b1 >= 0.0 && b1 < 1.0, ValueError, name(), ": invalid beta parameter at index 0: ", b1,
           " (must be in [0, 1))");
  MG_CHECK(b2 >= 0.0 && b2 < 1.0, ValueError, name(), ": invalid beta parameter at index 1: ", b2,
           " (must be in [0, 1))");
  MG_CHECK(std::isfinite(wd) && wd >= 0.0, ValueError, name(), ": invalid weight_decay value: ", wd, " (must be >= 0)");
  for (const char* flag : {"amsgrad", "maximize"})
    MG_CHECK(g.get(flag) == 0.0 || g.get(flag) == 1.0, ValueError, name(), ": option \"", flag,
             "\" must be 0 or 1, got ", g.get(flag));
  MG_CHECK(state_bits_ == 32 || g.get("amsgrad") == 0.0, ValueError, name(),
           ": amsgrad has no 8-bit state (use AdamW with state_bits = 32)");
}

bool Adam::quantized(const Tensor& p) const {
  return state_bits_ == 8 && p.dtype() == DType::f32 && p.is_contiguous() && p.numel() >= min_8bit_size_;
}

Optimizer::StateSpec Adam::state_spec(const std::map<std::string, double>& options, const Tensor& p) const {
  // bf16 parameters keep f32 state (pure-bf16 training); others their own dtype. step() creates
  // max_exp_avg_sq once amsgrad is on and never drops it.
  const bool amsgrad = options.at("amsgrad") != 0.0;
  if (quantized(p)) {
    const Shape blocks{kernels::quant_blocks(p.numel())};
    return {{{"exp_avg", true, false, DType::u8},
             {"exp_avg_sq", true, false, DType::u8},
             {"exp_avg_absmax", true, true, DType::f32, blocks},
             {"exp_avg_sq_absmax", true, true, DType::f32, blocks}},
            DType::f32};
  }
  return {{{"exp_avg", true, false}, {"exp_avg_sq", true, true}, {"max_exp_avg_sq", amsgrad, true}},
          p.dtype() == DType::bf16 ? DType::f32 : p.dtype()};
}

std::unordered_map<const TensorImpl*, DType> Adam::next_region_casts() const {
  // The weights the next autocast region will cast, with their dtype (one a device); none when
  // casts are not written, or on a device whose stream is being captured (a graph casts itself).
  std::unordered_map<const TensorImpl*, DType> out;
  if (!write_autocast_casts_ || capturable_) return out;
  std::map<std::string, std::optional<DType>> device_dtype;  // nullopt: the device takes none
  for (const auto& [w, dt] : autocast::weights_cast_next_region()) {
    auto [it, fresh] = device_dtype.try_emplace(w.device().str(), dt);
    if (fresh && w.is_cuda() && cuda::is_capturing(w.device().index)) it->second.reset();
    if (it->second == dt) out.emplace(w.impl(), dt);
  }
  return out;
}

void Adam::set_cast_target(const Tensor& p, Tensor dst) {
  MG_CHECK(p.defined(), ValueError, name(), ".set_cast_target: undefined parameter");
  if (!dst.defined()) {
    cast_targets_.erase(p.impl());
    return;
  }
  MG_CHECK(p.dtype() == DType::f32 && (dst.dtype() == DType::bf16 || dst.dtype() == DType::f16) &&
               dst.sizes() == p.sizes() && dst.device() == p.device() && dst.is_contiguous(),
           ValueError, name(), ".set_cast_target: a contiguous f16/bf16 tensor of the f32 parameter's shape ",
           shape_str(p.sizes()), " on ", p.device(), " is needed; got ", p.dtype(), " parameter, ", dst.dtype(), " ",
           shape_str(dst.sizes()), " on ", dst.device());
  cast_targets_[p.impl()] = std::move(dst);
}

void Adam::step() {
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::OptimizerState);
  const std::unordered_map<const TensorImpl*, DType> next_casts = next_region_casts();
  for (size_t gi = 0; gi < param_groups().size(); ++gi) {
    ParamGroup& g = param_groups()[gi];
    validate(g);  // a scheduler or the user may have edited the options since
    kernels::AdamHyper h;
    h.lr = g.get("lr");
    h.beta1 = g.get("beta1");
    h.beta2 = g.get("beta2");
    h.eps = g.get("eps");
    h.weight_decay = g.get("weight_decay");
    h.amsgrad = g.get("amsgrad") != 0.0;
    h.maximize = g.get("maximize") != 0.0;
    h.decoupled_weight_decay = decoupled_;
    // Fused lists per (device, dtype), and the 8-bit ones per device: one multi-tensor call each.
    std::map<std::pair<std::string, DType>, kernels::AdamTensors> fused;
    std::map<std::string, kernels::AdamTensors> fused8;
    // A parameter's entry in a fused list: its gradient, moments, step and the low copy the next
    // autocast region would cast (AdamOptions::write_autocast_casts).
    auto add_to_list = [&](kernels::AdamTensors& l, const Tensor& p, const Tensor& grad, ParamState& st) {
      const auto cast = next_casts.find(p.impl());
      Tensor low;
      if (const auto target = cast_targets_.find(p.impl()); target != cast_targets_.end()) {
        low = target->second;
      } else if (cast != next_casts.end() && p.dtype() == DType::f32) {
        // The next forward's memory, counted as the casts that forward would make (not optimizer state).
        MemoryCategoryGuard act(MemoryCategory::Activations);
        low = empty(p.sizes(), {cast->second, p.device()});
      }
      l.low_copies.push_back(low);
      l.fp8_casts.emplace_back();  // the FP8 recipe's cast, below, for the f32 update's lists
      l.params.push_back(p);
      l.grads.push_back(grad);
      l.exp_avg.push_back(st.buffers["exp_avg"]);
      l.exp_avg_sq.push_back(st.buffers["exp_avg_sq"]);
      if (capturable_)
        l.step_counts.push_back(step_count_for(p, st));
      else
        l.steps.push_back(st.step);
    };
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      const Tensor& p = g.params[pi];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      MG_CHECK(grad.sizes() == p.sizes() && grad.device() == p.device(), ValueError, name(), ": gradient of shape ",
               shape_str(grad.sizes()), " on ", grad.device(), " does not match parameter ", shape_str(p.sizes()),
               " on ", p.device());
      if (capturable_) check_capturable(p, grad, gi, pi);
      ParamState& st = state_for(p);
      if (quantized(p)) {
        if (st.buffers.empty()) {  // a zero absmax reads every code as 0
          const Shape blocks{kernels::quant_blocks(p.numel())};
          st.buffers["exp_avg"] = zeros(p.sizes(), {DType::u8, p.device()});
          st.buffers["exp_avg_sq"] = zeros(p.sizes(), {DType::u8, p.device()});
          st.buffers["exp_avg_absmax"] = zeros(blocks, {DType::f32, p.device()});
          st.buffers["exp_avg_sq_absmax"] = zeros(blocks, {DType::f32, p.device()});
        }
        if (!capturable_) ++st.step;
        kernels::AdamTensors& l = fused8[p.device().str()];
        add_to_list(l, p, grad.is_contiguous() && grad.dtype() == DType::f32 ? grad : grad.to(DType::f32).contiguous(),
                    st);
        l.exp_avg_absmax.push_back(st.buffers["exp_avg_absmax"]);
        l.exp_avg_sq_absmax.push_back(st.buffers["exp_avg_sq_absmax"]);
        continue;
      }
      const DType sdt = state_spec(g.options, p).dtype;
      if (st.buffers.empty()) {
        st.buffers["exp_avg"] = zeros(p.sizes(), {sdt, p.device()});
        st.buffers["exp_avg_sq"] = zeros(p.sizes(), {sdt, p.device()});
      }
      if (h.amsgrad && !st.buffers.count("max_exp_avg_sq"))
        st.buffers["max_exp_avg_sq"] = zeros(p.sizes(), {sdt, p.device()});
      if (!capturable_) ++st.step;  // a capturable step counts on the device (l.step_counts)
      if (p.dtype() == DType::bf16) {
        adam_bf16(p, grad, st, h);
        continue;
      }
      // A 16-bit gradient of an f32 parameter on the CPU is widened inside the update (a host
      // update, memory/host_params.h): no f32 copy of it is made.
      const bool grad_fusable = (kernels::multi_tensor_supported(grad) && grad.dtype() == p.dtype()) ||
                                (kernels::adam_takes_16bit_grads(p) && grad.is_contiguous() &&
                                 (grad.dtype() == DType::bf16 || grad.dtype() == DType::f16));
      const bool fusable = fused_ && kernels::multi_tensor_supported(p) && grad_fusable &&
                           st.buffers["exp_avg"].dtype() == p.dtype() &&
                           st.buffers["exp_avg_sq"].dtype() == p.dtype() &&
                           (!h.amsgrad || st.buffers["max_exp_avg_sq"].dtype() == p.dtype());
      if (!fusable) {
        // The per-parameter ops compute in the gradient's dtype: a 16-bit one is widened first.
        adam_single(p, grad.dtype() == p.dtype() ? grad : grad.to(p.dtype()), st, h);
        continue;
      }
      kernels::AdamTensors& l = fused[{p.device().str(), p.dtype()}];
      add_to_list(l, p, grad, st);
      // The FP8 recipe's next cast of the weight, written by the update (as the low copies are).
      if (write_autocast_casts_ && !capturable_ && !h.amsgrad)
        if (std::optional<kernels::Fp8WeightCast> c = autograd::fp8_next_weight_cast(p)) l.fp8_casts.back() = *c;
      if (h.amsgrad) l.max_exp_avg_sq.push_back(st.buffers["max_exp_avg_sq"]);
    }
    auto run = [&](kernels::AdamTensors& l, bool eight_bit) {
      if (std::none_of(l.low_copies.begin(), l.low_copies.end(), [](const Tensor& c) { return c.defined(); }))
        l.low_copies.clear();
      if (std::none_of(l.fp8_casts.begin(), l.fp8_casts.end(), [](const auto& c) { return c.codes.defined(); }))
        l.fp8_casts.clear();
      const kernels::DeviceScalars d =
          capturable_ ? device_scalars(gi, l.params[0].device()) : kernels::DeviceScalars{};
      if (eight_bit)
        kernels::adam8bit_multi_tensor_(l, h, d);
      else
        kernels::adam_multi_tensor_(l, h, d);
      for (size_t i = 0; i < l.low_copies.size(); ++i)
        if (l.low_copies[i].defined() && !cast_targets_.count(l.params[i].impl()))
          autocast::provide_cast(l.params[i], l.low_copies[i]);
      for (size_t i = 0; i < l.fp8_casts.size(); ++i)
        if (l.fp8_casts[i].codes.defined()) autograd::provide_fp8_weight_cast(l.params[i], l.fp8_casts[i]);
    };
    for (auto& [key, l] : fused) run(l, false);
    for (auto& [key, l] : fused8) run(l, true);
  }
}

namespace {
// The 8-bit codes and per-block absmax of f32 values `v` (kernels/optim_math.h's rule, as a step
// stores them), and the f32 values codes and scales stand for.
std::pair<std::vector<uint8_t>, std::vector<float>> quantize_blocks(const std::vector<float>& v, bool is_signed) {
  const int64_t n = static_cast<int64_t>(v.size()), nb = kernels::quant_blocks(n), B = kernels::optim_math::kQuantBlock;
  std::vector<uint8_t> q(v.size());
  std::vector<float> absmax(nb);
  for (int64_t b = 0; b < nb; ++b)
    absmax[b] =
        kernels::optim_math::quantize_block(v.data() + b * B, std::min(B, n - b * B), is_signed, q.data() + b * B);
  return {q, absmax};
}
std::vector<float> dequantize_blocks(const std::vector<uint8_t>& q, const std::vector<float>& absmax, bool is_signed) {
  const float* code = kernels::quant_code(is_signed);
  std::vector<float> v(q.size());
  for (size_t i = 0; i < q.size(); ++i) v[i] = code[q[i]] * absmax[i / kernels::optim_math::kQuantBlock];
  return v;
}
}  // namespace

std::optional<StateDict> Adam::converted_state_dict(const StateDict& sd, const std::string& saved_type) const {
  const bool to_8bit = name() == "AdamW8bit" && saved_type == "AdamW";
  const bool from_8bit = name() == "AdamW" && saved_type == "AdamW8bit";
  if (!to_8bit && !from_8bit) return std::nullopt;
  StateDict out = sd;
  out.meta["type"] = name();
  std::vector<const Tensor*> params;
  for (const ParamGroup& g : param_groups())
    for (const Tensor& p : g.params) params.push_back(&p);
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string pre = "state." + std::to_string(i) + ".";
    auto m = out.tensors.find(pre + "exp_avg"), v = out.tensors.find(pre + "exp_avg_sq");
    if (m == out.tensors.end() || v == out.tensors.end()) continue;  // no state, or a malformed one: checked later
    const Tensor& p = *params[i];
    const bool codes = m->second.dtype() == DType::u8 && out.tensors.count(pre + "exp_avg_absmax") &&
                       out.tensors.count(pre + "exp_avg_sq_absmax");
    if (to_8bit && quantized(p) && !codes && m->second.numel() == p.numel() && v->second.numel() == p.numel()) {
      for (auto [it, is_signed, scale] :
           {std::tuple{m, true, "exp_avg_absmax"}, std::tuple{v, false, "exp_avg_sq_absmax"}}) {
        auto [q, absmax] = quantize_blocks(it->second.to(DType::f32).to_vector<float>(), is_signed);
        it->second = from_vector<uint8_t>(q, p.sizes());
        out.tensors[pre + scale] = from_vector<float>(absmax, {static_cast<int64_t>(absmax.size())});
      }
    } else if (from_8bit && codes) {
      for (auto [it, is_signed, scale] :
           {std::tuple{m, true, "exp_avg_absmax"}, std::tuple{v, false, "exp_avg_sq_absmax"}}) {
        const Tensor& a = out.tensors.at(pre + scale);
        it->second = from_vector<float>(
            dequantize_blocks(it->second.to_vector<uint8_t>(), a.to(DType::f32).to_vector<float>(), is_signed),
            it->second.sizes());
        out.tensors.erase(pre + scale);
      }
    }
  }
  return out;
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions defaults)
    : AdamW(std::vector<ParamGroup>{{std::move(params), {}}}, defaults) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults)
    : Adam("AdamW", std::move(groups), defaults, true) {}

AdamW8bit::AdamW8bit(std::vector<Tensor> params, AdamW8bitOptions defaults)
    : AdamW8bit(std::vector<ParamGroup>{{std::move(params), {}}}, defaults) {}

AdamW8bit::AdamW8bit(std::vector<ParamGroup> groups, AdamW8bitOptions defaults)
    : Adam("AdamW8bit", std::move(groups), defaults, true) {}

}  // namespace mg::optim
