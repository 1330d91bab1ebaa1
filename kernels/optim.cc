// Checks and dispatch for kernels/optim.h; the loops are in cpu/optim.cc and
// cuda/optim.cu, which share the per-element rules of optim_math.h.
#include "kernels/optim.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "kernels/dispatch.h"
#include "kernels/ops.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/optim_math.h"

namespace mg::kernels {
namespace {

// A tensor as an error names it: dtype, shape and device, or "undefined".
std::string described(const Tensor& t) {
  return t.defined() ? detail::format(t.dtype(), " ", shape_str(t.sizes()), " on ", t.device()) : "undefined";
}

bool device_has_fused(const Device& d) { return has_backend(d); }

bool dtype_fusable(const Tensor& t) { return t.dtype() == DType::f32 || (t.dtype() == DType::f64 && !t.is_cuda()); }

// Every list has params.size() entries, each defined, contiguous, of params[0]'s device and
// dtype (or, with half_ok, f16/bf16) and of its parameter's shape.
void check_lists(const char* op, const std::vector<Tensor>& params,
                 std::initializer_list<std::pair<const char*, const std::vector<Tensor>*>> lists,
                 bool half_ok = false) {
  if (params.empty()) return;
  const Device dev = params[0].device();
  const DType dt = params[0].dtype();
  MG_CHECK(dtype_fusable(params[0]), DTypeError, op, ": dtype ", dt, " on ", dev,
           " has no fused update (f32, or f64 on the CPU)");
  MG_CHECK(device_has_fused(dev), DeviceError, op, ": ", dev, " tensors in a build without CUDA");
  auto check_one = [&](const char* what, size_t i, const Tensor& t) {
    MG_CHECK(t.defined(), ValueError, op, ": ", what, "[", i, "] is undefined");
    MG_CHECK(t.device() == dev, DeviceError, op, ": ", what, "[", i, "] is on ", t.device(), ", params[0] on ", dev);
    const bool half = half_ok && (t.dtype() == DType::f16 || t.dtype() == DType::bf16);
    MG_CHECK(t.dtype() == dt || half, DTypeError, op, ": ", what, "[", i, "] has dtype ", t.dtype(), ", params[0] has ",
             dt, half_ok ? " (or f16/bf16)" : "");
    MG_CHECK(t.is_contiguous(), ValueError, op, ": ", what, "[", i, "] (shape ", shape_str(t.sizes()),
             ") is not contiguous");
    MG_CHECK(t.sizes() == params[i].sizes(), ShapeError, op, ": ", what, "[", i, "] has shape ", shape_str(t.sizes()),
             ", its parameter ", shape_str(params[i].sizes()));
  };
  for (size_t i = 0; i < params.size(); ++i) check_one("params", i, params[i]);
  for (auto& [what, list] : lists) {
    MG_CHECK(list->size() == params.size(), ValueError, op, ": ", what, " has ", list->size(), " tensors, params ",
             params.size());
    for (size_t i = 0; i < list->size(); ++i) check_one(what, i, (*list)[i]);
  }
}

// The DeviceScalars of a capturable update: one-element tensors on the parameters' device.
void check_device_scalars(const char* op, const Device& dev, const DeviceScalars& d) {
  auto check = [&](const char* what, const Tensor& t, DType dt) {
    if (!t.defined()) return;
    MG_CHECK(t.numel() == 1 && t.dtype() == dt && t.device() == dev, ValueError, op, ": ", what,
             " must be a one-element ", dt, " tensor on ", dev, ", got ", shape_str(t.sizes()), " ", t.dtype(), " on ",
             t.device());
  };
  check("the device lr", d.lr, DType::f64);
  check("found_inf", d.found_inf, DType::f32);
}

}  // namespace

bool multi_tensor_supported(const Tensor& t) {
  return t.defined() && t.is_contiguous() && dtype_fusable(t) && device_has_fused(t.device());
}

bool adam_takes_16bit_grads(const Tensor& p) { return p.defined() && p.device().is_cpu() && p.dtype() == DType::f32; }

namespace {
// The checks adam_multi_tensor_ and adam8bit_multi_tensor_ share: step counts, device scalars
// and low copies.
void check_adam_steps(const char* op, const AdamTensors& t, const DeviceScalars& d) {
  const Device dev = t.params[0].device();
  check_device_scalars(op, dev, d);
  if (!t.step_counts.empty()) {
    MG_CHECK(t.step_counts.size() == t.params.size(), ValueError, op, ": ", t.step_counts.size(), " step counters for ",
             t.params.size(), " params");
    for (size_t i = 0; i < t.step_counts.size(); ++i) {
      const Tensor& c = t.step_counts[i];
      MG_CHECK(c.defined() && c.numel() == 1 && c.dtype() == DType::i64 && c.device() == dev, ValueError, op,
               ": step_counts[", i, "] must be a one-element i64 tensor on ", dev);
    }
  } else {
    for (size_t i = 0; i < t.steps.size(); ++i)
      MG_CHECK(t.steps[i] >= 1, ValueError, op, ": step count of params[", i, "] is ", t.steps[i], " (must be >= 1)");
  }
  if (!t.low_copies.empty()) {
    MG_CHECK(t.low_copies.size() == t.params.size(), ValueError, op, ": ", t.low_copies.size(), " low copies for ",
             t.params.size(), " params");
    MG_CHECK(t.params[0].dtype() == DType::f32, DTypeError, op, ": low copies need f32 params, got ",
             t.params[0].dtype());
    std::optional<DType> low;
    for (size_t i = 0; i < t.low_copies.size(); ++i) {
      const Tensor& c = t.low_copies[i];
      if (!c.defined()) continue;
      MG_CHECK(c.dtype() == DType::f16 || c.dtype() == DType::bf16, DTypeError, op, ": low_copies[", i, "] has dtype ",
               c.dtype(), " (f16 or bf16)");
      MG_CHECK(!low || c.dtype() == *low, DTypeError, op, ": low_copies[", i, "] has dtype ", c.dtype(),
               ", an earlier one ", *low, " (one dtype a call)");
      low = c.dtype();
      MG_CHECK(c.device() == dev, DeviceError, op, ": low_copies[", i, "] is on ", c.device(), ", params[0] on ", dev);
      MG_CHECK(c.sizes() == t.params[i].sizes(), ShapeError, op, ": low_copies[", i, "] has shape ",
               shape_str(c.sizes()), ", its parameter ", shape_str(t.params[i].sizes()));
      MG_CHECK(c.is_contiguous(), ValueError, op, ": low_copies[", i, "] is not contiguous");
    }
  }
}

// The FP8 weight casts an update writes (AdamTensors::fp8_casts): each defined entry's codes and
// history fit its parameter, 2-D f32, on the parameters' device; device step counts (a captured
// update) take none, as they take no low copies from a region ahead.
void check_fp8_casts(const char* op, const AdamTensors& t, const DeviceScalars& d) {
  if (t.fp8_casts.empty()) return;
  MG_CHECK(t.fp8_casts.size() == t.params.size(), ValueError, op, ": ", t.fp8_casts.size(), " FP8 casts for ",
           t.params.size(), " params");
  const Device dev = t.params[0].device();
  for (size_t i = 0; i < t.fp8_casts.size(); ++i) {
    const Fp8WeightCast& c = t.fp8_casts[i];
    if (!c.codes.defined()) continue;
    MG_CHECK(t.step_counts.empty() && !d.lr.defined(), ValueError, op, ": fp8_casts[", i,
             "]: a captured update writes no FP8 casts (its graph casts in the forward)");
    const Tensor& p = t.params[i];
    MG_CHECK(p.dtype() == DType::f32 && p.dim() == 2, DTypeError, op, ": fp8_casts[", i,
             "] needs a 2-D f32 parameter, got ", p.dtype(), " ", shape_str(p.sizes()));
    const int64_t r = p.size(0), k = p.size(1);
    const auto u8_of = [&](const Tensor& q, int64_t a, int64_t b) {
      return q.defined() && q.dtype() == DType::u8 && q.device() == dev && q.is_contiguous() && q.dim() == 2 &&
             q.size(0) == a && q.size(1) == b;
    };
    MG_CHECK(u8_of(c.codes, r, k) && u8_of(c.codes_t, k, r), ValueError, op, ": fp8_casts[", i,
             "] needs contiguous u8 codes [", r, ", ", k, "] and codes_t [", k, ", ", r, "] on ", dev, ", got ",
             described(c.codes), " and ", described(c.codes_t));
    const auto f32_of = [&](const Tensor& x, int64_t n) {
      return x.defined() && x.dtype() == DType::f32 && x.device() == dev && x.is_contiguous() && x.numel() == n;
    };
    MG_CHECK(f32_of(c.history, kFp8HistorySlots) && f32_of(c.scale, 1) && f32_of(c.scale_inv, 1), ValueError, op,
             ": fp8_casts[", i, "] needs an f32 history of ", kFp8HistorySlots,
             " slots and one-element f32 scale and scale_inv on ", dev, ", got ", described(c.history), ", ",
             described(c.scale), " and ", described(c.scale_inv));
    MG_CHECK(c.slot >= 0 && c.slot < kFp8HistorySlots && c.margin >= 0, ValueError, op, ": fp8_casts[", i, "]: slot ",
             c.slot, " (0 to ", kFp8HistorySlots - 1, ") and margin ", c.margin, " (>= 0)");
  }
}

// Bumps the versions of what an Adam update wrote.
void bump_adam_outputs(const AdamTensors& t) {
  for (const Tensor& p : t.params) p.bump_version();
  for (const Tensor& c : t.low_copies)
    if (c.defined()) c.bump_version();
  for (const Fp8WeightCast& c : t.fp8_casts)
    if (c.codes.defined()) {
      c.codes.bump_version();
      c.codes_t.bump_version();
      c.history.bump_version();
    }
}
}  // namespace

void adam_multi_tensor_(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) {
  const char* op = "adam_multi_tensor_";
  if (t.params.empty()) return;
  check_lists(op, t.params, {{"exp_avg", &t.exp_avg}, {"exp_avg_sq", &t.exp_avg_sq}});
  // f16/bf16 gradients of f32 CPU parameters are widened as they are read (a host update
  // straight from the gradient the device copied home, memory/host_params.h).
  check_lists(op, t.params, {{"grads", &t.grads}}, adam_takes_16bit_grads(t.params[0]));
  if (h.amsgrad) check_lists(op, t.params, {{"max_exp_avg_sq", &t.max_exp_avg_sq}});
  MG_CHECK(!t.step_counts.empty() || t.steps.size() == t.params.size(), ValueError, op, ": ", t.steps.size(),
           " step counts for ", t.params.size(), " params");
  check_adam_steps(op, t, d);
  check_fp8_casts(op, t, d);
  backend(t.params[0].device(), op).adam_multi_tensor(t, h, d);
  bump_adam_outputs(t);
}

int64_t quant_blocks(int64_t n) { return (n + optim_math::kQuantBlock - 1) / optim_math::kQuantBlock; }

const float* quant_code(bool is_signed) { return is_signed ? optim_math::kCodeSigned.v : optim_math::kCodeUnsigned.v; }

void adam8bit_multi_tensor_(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) {
  const char* op = "adam8bit_multi_tensor_";
  if (t.params.empty()) return;
  check_lists(op, t.params, {{"grads", &t.grads}});
  MG_CHECK(t.params[0].dtype() == DType::f32, DTypeError, op, ": 8-bit state needs f32 params, got ",
           t.params[0].dtype());
  MG_CHECK(!h.amsgrad, ValueError, op, ": amsgrad has no 8-bit state (use the f32 Adam)");
  MG_CHECK(!t.step_counts.empty() || t.steps.size() == t.params.size(), ValueError, op, ": ", t.steps.size(),
           " step counts for ", t.params.size(), " params");
  const Device dev = t.params[0].device();
  const std::pair<const char*, const std::vector<Tensor>*> codes[] = {{"exp_avg", &t.exp_avg},
                                                                      {"exp_avg_sq", &t.exp_avg_sq}};
  const std::pair<const char*, const std::vector<Tensor>*> scales[] = {{"exp_avg_absmax", &t.exp_avg_absmax},
                                                                       {"exp_avg_sq_absmax", &t.exp_avg_sq_absmax}};
  for (int k = 0; k < 2; ++k) {
    for (const auto& [what, list] : {codes[k], scales[k]})
      MG_CHECK(list->size() == t.params.size(), ValueError, op, ": ", what, " has ", list->size(), " tensors, params ",
               t.params.size());
    for (size_t i = 0; i < t.params.size(); ++i) {
      const Tensor& q = (*codes[k].second)[i];
      const Tensor& a = (*scales[k].second)[i];
      const int64_t n = t.params[i].numel();
      MG_CHECK(q.defined() && q.dtype() == DType::u8 && q.device() == dev && q.is_contiguous() && q.numel() == n,
               ValueError, op, ": ", codes[k].first, "[", i, "] must be a contiguous u8 tensor of ", n, " elements on ",
               dev, ", got ", described(q));
      MG_CHECK(a.defined() && a.dtype() == DType::f32 && a.device() == dev && a.is_contiguous() &&
                   a.numel() == quant_blocks(n),
               ValueError, op, ": ", scales[k].first, "[", i, "] must be a contiguous f32 tensor of ", quant_blocks(n),
               " elements (one per 2048) on ", dev, ", got ", described(a));
    }
  }
  check_adam_steps(op, t, d);
  backend(dev, op).adam8bit_multi_tensor(t, h, d);
  bump_adam_outputs(t);
  for (const auto& list : {&t.exp_avg, &t.exp_avg_sq, &t.exp_avg_absmax, &t.exp_avg_sq_absmax})
    for (const Tensor& x : *list) x.bump_version();
}

void sgd_multi_tensor_(const SGDTensors& t, const SGDHyper& h, const DeviceScalars& d) {
  const char* op = "sgd_multi_tensor_";
  if (t.params.empty()) return;
  check_lists(op, t.params, {{"grads", &t.grads}});
  if (h.momentum != 0.0) {
    check_lists(op, t.params, {{"momentum_buffers", &t.momentum_buffers}});
    MG_CHECK(t.first_step.size() == t.params.size(), ValueError, op, ": ", t.first_step.size(),
             " first-step flags for ", t.params.size(), " params");
  }
  check_device_scalars(op, t.params[0].device(), d);
  SGDTensors u = t;
  if (h.momentum == 0.0) u.momentum_buffers.clear();
  backend(t.params[0].device(), op).sgd_multi_tensor(u, h, d);
  for (const Tensor& p : t.params) p.bump_version();
}

double multi_tensor_norm(const std::vector<Tensor>& ts, double norm_type) {
  MG_CHECK(!std::isnan(norm_type) && norm_type > 0.0, ValueError,
           "multi_tensor_norm: norm_type must be > 0 (or inf), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  // One partial per device: CUDA f32 tensors of a device share launches; the rest (other
  // dtypes, strided views) are made contiguous f32 copies first on CUDA, or looped on the CPU.
  std::map<std::pair<int, int>, std::vector<Tensor>> by_device;
  double total = 0.0;
  auto combine = [&](double part) {
    if (inf)
      total = (std::isnan(total) || total >= part) ? total : part;  // a NaN, once seen, stays
    else
      total += part;
  };
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    MG_CHECK(t.defined(), ValueError, "multi_tensor_norm: tensor ", i, " is undefined");
    MG_CHECK(is_floating(t.dtype()), DTypeError, "multi_tensor_norm: tensor ", i, " has dtype ", t.dtype(),
             " (expected floating)");
    if (t.numel() == 0) continue;
    if (!t.is_cuda()) {
      combine(backend(t.device(), "multi_tensor_norm").multi_tensor_norm_partial({t}, norm_type));
      continue;
    }
    MG_CHECK(device_has_fused(t.device()), DeviceError, "multi_tensor_norm: ", t.device(),
             " tensor in a build without CUDA");
    by_device[{static_cast<int>(t.device().type), t.device().index}].push_back(
        t.dtype() == DType::f32 && t.is_contiguous() ? t : kernels::cast(t.contiguous(), DType::f32));
  }
  for (auto& [key, list] : by_device)
    combine(backend(list[0].device(), "multi_tensor_norm").multi_tensor_norm_partial(list, norm_type));
  return optim_math::finish_norm(total, norm_type);
}

Tensor multi_tensor_clip_(const std::vector<Tensor>& ts, double max_norm, double norm_type) {
  const char* op = "multi_tensor_clip_";
  MG_CHECK(std::isfinite(max_norm) && max_norm >= 0.0, ValueError, op, ": max_norm must be finite and >= 0, got ",
           max_norm);
  MG_CHECK(!std::isnan(norm_type) && norm_type > 0.0, ValueError, op, ": norm_type must be > 0 (or inf), got ",
           norm_type);
  MG_CHECK(!ts.empty(), ValueError, op, ": no tensors");
  const Device dev = ts[0].device();
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    MG_CHECK(t.defined(), ValueError, op, ": tensor ", i, " is undefined");
    MG_CHECK(t.device() == dev, DeviceError, op, ": tensor ", i, " is on ", t.device(), ", tensor 0 on ", dev,
             " (the device-side clip works on one device)");
    MG_CHECK(t.dtype() == DType::f32, DTypeError, op, ": tensor ", i, " has dtype ", t.dtype(), " (expected f32)");
    MG_CHECK(t.is_contiguous(), ValueError, op, ": tensor ", i, " (shape ", shape_str(t.sizes()),
             ") is not contiguous");
  }
  Tensor total = empty({1}, {DType::f32, dev});
  backend(dev, op).multi_tensor_clip(ts, max_norm, norm_type, total);
  for (const Tensor& t : ts) t.bump_version();
  return total;
}

void multi_tensor_scale_(const std::vector<Tensor>& ts, double scale) {
  std::vector<Tensor> fused;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    MG_CHECK(t.defined(), ValueError, "multi_tensor_scale_: tensor ", i, " is undefined");
    MG_CHECK(is_floating(t.dtype()), DTypeError, "multi_tensor_scale_: tensor ", i, " has dtype ", t.dtype(),
             " (expected floating)");
    if (t.is_cuda() && t.dtype() == DType::f32 && t.is_contiguous()) {
      fused.push_back(t);
    } else {
      kernels::binary_(Binary::Mul, t, scalar_tensor(scale, {t.dtype(), t.device()}));
    }
  }
  // Grouped by device: one list per launch sequence.
  std::map<int, std::vector<Tensor>> by_device;
  for (auto& t : fused) by_device[t.device().index].push_back(t);
  for (auto& [d, list] : by_device) {
    backend(list[0].device(), "multi_tensor_scale_").multi_tensor_scale(list, scale);
    for (auto& t : list) t.bump_version();
  }
}

void multi_tensor_cast_(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  const char* op = "multi_tensor_cast_";
  MG_CHECK(src.size() == dst.size(), ValueError, op, ": ", src.size(), " sources but ", dst.size(), " destinations");
  if (src.empty()) return;
  const Device dev = src[0].defined() ? src[0].device() : Device::cpu();
  const DType to = dst[0].defined() ? dst[0].dtype() : DType::bf16;
  for (size_t i = 0; i < src.size(); ++i) {
    const Tensor &s = src[i], &d = dst[i];
    MG_CHECK(s.defined() && d.defined(), ValueError, op, ": pair ", i, " has an undefined tensor");
    MG_CHECK(s.dtype() == DType::f32 && (d.dtype() == DType::f16 || d.dtype() == DType::bf16) && d.dtype() == to,
             DTypeError, op, ": pair ", i, " casts ", s.dtype(), " to ", d.dtype(),
             " (expected f32 to one of f16, bf16; ", "the list's first is ", to, ")");
    MG_CHECK(s.device() == dev && d.device() == dev, DeviceError, op, ": pair ", i, " is on ", s.device(), " and ",
             d.device(), ", the list on ", dev);
    MG_CHECK(s.sizes() == d.sizes() && s.is_contiguous() && d.is_contiguous(), ValueError, op, ": pair ", i,
             " has shapes ", shape_str(s.sizes()), " and ", shape_str(d.sizes()), " (both contiguous, equal shapes)");
  }
  backend(dev, op).multi_tensor_cast(src, dst);
  for (const Tensor& d : dst) d.bump_version();
}

}  // namespace mg::kernels
