// Checks and dispatch for kernels/norm.h: layer norm (cpu/layer_norm.cc, cuda/layer_norm.cu)
// and batch norm (cpu/batch_norm.cc, cuda/batch_norm.cu).
#include "kernels/norm.h"

#include <cmath>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {

// ---------------------------------------------------------------- layer norm

namespace {

struct LnShape {
  int64_t rows = 0, n = 1;  // x viewed as [rows, n]
  Shape stats;              // x.shape[:-k] + [1] * k
};

// A per-element parameter of the norm (weight, bias, residual_bias): normalized_shape, floating,
// on x's device; undefined passes.
void check_norm_param(const char* op, const Tensor& x, const Shape& ns, const Tensor& p, const char* what) {
  if (!p.defined()) return;
  MG_CHECK(p.sizes() == ns, ShapeError, op, ": ", what, " has shape ", shape_str(p.sizes()),
           ", expected normalized_shape ", shape_str(ns));
  MG_CHECK(is_floating(p.dtype()), DTypeError, op, ": ", what, " must be floating, got ", p.dtype());
  check_same_device(op, x, p, what);
}

LnShape check_layer_norm(const char* op, const Tensor& x, const Shape& ns, const Tensor& weight, const Tensor& bias) {
  MG_CHECK(x.defined(), ValueError, op, ": got an undefined input");
  MG_CHECK(is_floating(x.dtype()), DTypeError, op, ": input must be floating, got ", x.dtype());
  MG_CHECK(!ns.empty(), ValueError, op, ": normalized_shape must have at least one dim, got []");
  const int64_t k = static_cast<int64_t>(ns.size());
  Shape tail;
  if (k <= x.dim()) tail.assign(x.sizes().end() - k, x.sizes().end());
  MG_CHECK(k <= x.dim() && tail == ns, ShapeError, op, ": normalized_shape ", shape_str(ns),
           " must equal the input's last ", k, " dims, but the input has shape ", shape_str(x.sizes()));
  check_norm_param(op, x, ns, weight, "weight");
  check_norm_param(op, x, ns, bias, "bias");
  LnShape s;
  s.n = shape_numel(ns);
  s.rows = s.n == 0 ? 0 : x.numel() / s.n;
  s.stats = x.sizes();
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) s.stats[d] = 1;
  return s;
}

void check_eps(double eps) {
  MG_CHECK(eps >= 0.0 && std::isfinite(eps), ValueError, "layer_norm: eps must be finite and >= 0, got ", eps);
}

void check_stats(const char* op, const LnShape& s, const Tensor& x, const Tensor& mean, const Tensor& rstd) {
  const DType st = layer_norm_stats_dtype(x.dtype());
  for (const Tensor* t : {&mean, &rstd}) {
    MG_CHECK(t->defined() && t->numel() == s.rows, ShapeError, op, ": mean/rstd must have ", s.rows,
             " elements (shape ", shape_str(s.stats), "), got ",
             t->defined() ? shape_str(t->sizes()) : std::string("undefined"));
    MG_CHECK(t->dtype() == st, DTypeError, op, ": mean/rstd must be ", st, " for ", x.dtype(), " input, got ",
             t->dtype());
    check_same_device(op, x, *t, "mean/rstd");
  }
}

}  // namespace

DType layer_norm_stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward(const Tensor& x, const Shape& normalized_shape,
                                                      const Tensor& weight, const Tensor& bias, double eps) {
  const LnShape s = check_layer_norm("layer_norm", x, normalized_shape, weight, bias);
  check_eps(eps);
  const DType st = layer_norm_stats_dtype(x.dtype());
  Tensor out = empty({s.rows, s.n}, {x.dtype(), x.device()});
  Tensor mean = empty({s.rows}, {st, x.device()});
  Tensor rstd = empty({s.rows}, {st, x.device()});
  if (s.rows > 0) {
    Tensor w = weight.defined() ? as_rows(weight, x.dtype(), {s.n}) : Tensor();
    Tensor b = bias.defined() ? as_rows(bias, x.dtype(), {s.n}) : Tensor();
    backend(x.device(), "layer_norm_forward")
        .layer_norm_forward(as_rows(x, x.dtype(), {s.rows, s.n}), w, b, eps, out, mean, rstd);
  }
  return {raw::view(out, x.sizes()), raw::view(mean, s.stats), raw::view(rstd, s.stats)};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad_out, const Tensor& x,
                                                       const Shape& normalized_shape, const Tensor& mean,
                                                       const Tensor& rstd, const Tensor& weight,
                                                       std::array<bool, 3> mask) {
  const char* op = "layer_norm_backward";
  const LnShape s = check_layer_norm(op, x, normalized_shape, weight, Tensor());
  MG_CHECK(grad_out.defined() && grad_out.sizes() == x.sizes(), ShapeError, op, ": grad_out shape ",
           grad_out.defined() ? shape_str(grad_out.sizes()) : std::string("undefined"), " does not match input shape ",
           shape_str(x.sizes()));
  check_same_device(op, x, grad_out, "grad_out");
  check_stats(op, s, x, mean, rstd);
  const TensorOptions o{x.dtype(), x.device()};
  Tensor gx = mask[0] ? empty({s.rows, s.n}, o) : Tensor();
  Tensor gw = mask[1] ? zeros({s.n}, o) : Tensor();
  Tensor gb = mask[2] ? zeros({s.n}, o) : Tensor();
  if (s.rows > 0 && (mask[0] || mask[1] || mask[2])) {
    const DType st = layer_norm_stats_dtype(x.dtype());
    Tensor w = weight.defined() ? as_rows(weight, x.dtype(), {s.n}) : Tensor();
    backend(x.device(), "layer_norm_backward")
        .layer_norm_backward(as_rows(grad_out, x.dtype(), {s.rows, s.n}), as_rows(x, x.dtype(), {s.rows, s.n}),
                             as_rows(mean, st, {s.rows}), as_rows(rstd, st, {s.rows}), w, gx, gw, gb);
  }
  return {gx.defined() ? raw::view(gx, x.sizes()) : gx, gw.defined() ? raw::view(gw, normalized_shape) : gw,
          gb.defined() ? raw::view(gb, normalized_shape) : gb};
}

namespace {
// add_layer_norm_forward's checks: its arguments' shapes, dtypes and devices.
LnShape check_add_layer_norm(const char* op, const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                             const Tensor& weight, const Tensor& bias, double eps, DType out_dtype,
                             const Tensor& residual_bias) {
  const LnShape s = check_layer_norm(op, x, normalized_shape, weight, bias);
  check_eps(eps);
  MG_CHECK(is_floating(out_dtype), DTypeError, op, ": the output dtype must be floating, got ", out_dtype);
  if (residual.defined()) {
    MG_CHECK(residual.sizes() == x.sizes(), ShapeError, op, ": residual shape ", shape_str(residual.sizes()),
             " differs from the input's ", shape_str(x.sizes()));
    MG_CHECK(is_floating(residual.dtype()), DTypeError, op, ": residual must be floating, got ", residual.dtype());
    check_same_device(op, x, residual, "residual");
  }
  if (residual_bias.defined()) {
    MG_CHECK(residual.defined(), ValueError, op, ": a residual bias (shape ", shape_str(residual_bias.sizes()),
             ") needs a residual, got none");
    check_norm_param(op, x, normalized_shape, residual_bias, "residual_bias");
  }
  return s;
}
}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_forward(const Tensor& x, const Tensor& residual,
                                                                  const Shape& normalized_shape, const Tensor& weight,
                                                                  const Tensor& bias, double eps, DType out_dtype,
                                                                  const Tensor& residual_bias) {
  const char* op = "add_layer_norm";
  const LnShape s =
      check_add_layer_norm(op, x, residual, normalized_shape, weight, bias, eps, out_dtype, residual_bias);
  const DType st = layer_norm_stats_dtype(x.dtype());
  const auto same = [&](const Tensor& t) { return !t.defined() || t.dtype() == x.dtype(); };
  if (s.rows > 0 && same(weight) && same(bias) && same(residual_bias)) {
    const Tensor x2 = as_rows(x, x.dtype(), {s.rows, s.n});
    const Tensor r2 = residual.defined() ? as_rows(residual, residual.dtype(), {s.rows, s.n}) : Tensor();
    Tensor sum = residual.defined() ? empty({s.rows, s.n}, {x.dtype(), x.device()}) : x2;
    Tensor out = empty({s.rows, s.n}, {out_dtype, x.device()});
    Tensor mean = empty({s.rows}, {st, x.device()}), rstd = empty({s.rows}, {st, x.device()});
    const auto row = [&](const Tensor& t) { return t.defined() ? as_rows(t, x.dtype(), {s.n}) : Tensor(); };
    if (backend(x.device(), op)
            .fused_add_layer_norm_forward(x2, r2, row(residual_bias), row(weight), row(bias), eps, sum, out, mean,
                                          rstd))
      return {raw::view(sum, x.sizes()), raw::view(out, x.sizes()), raw::view(mean, s.stats), raw::view(rstd, s.stats)};
  }
  Tensor sum = residual.defined() ? add(x, cast(residual, x.dtype())) : x;
  if (residual_bias.defined()) sum = add(sum, cast(residual_bias, x.dtype()));  // (x + residual) + residual_bias
  auto [out, mean, rstd] = layer_norm_forward(sum, normalized_shape, weight, bias, eps);
  return {sum, out.dtype() == out_dtype ? out : cast(out, out_dtype), mean, rstd};
}

Fp8NormCast add_layer_norm_fp8_delayed(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                       const Tensor& weight, const Tensor& bias, double eps, DType out_dtype,
                                       const Tensor& residual_bias, Fp8Format format, Fp8CastOutputs outputs,
                                       Fp8History& history, int margin) {
  const char* op = "add_layer_norm_fp8_delayed";
  const LnShape s =
      check_add_layer_norm(op, x, residual, normalized_shape, weight, bias, eps, out_dtype, residual_bias);
  const auto f32 = [&](const Tensor& t) { return !t.defined() || t.dtype() == DType::f32; };
  const Tensor& h = history.amax;
  // The fused kernel's case; anything else (and a history's first cast, which uses current
  // scaling) is the two calls in turn, which also make their checks.
  if (s.rows > 0 && normalized_shape.size() == 1 && x.dtype() == DType::f32 && f32(weight) && f32(bias) &&
      f32(residual_bias) && (out_dtype == DType::f16 || out_dtype == DType::bf16) && margin >= 0 &&
      (outputs.rows || outputs.transposed) && !outputs.column_sums && history.casts > 0 && h.defined() &&
      h.dtype() == DType::f32 && h.numel() == kFp8HistorySlots && h.device() == x.device()) {
    const TensorOptions f32o(DType::f32, x.device()), u8(DType::u8, x.device());
    const DType st = layer_norm_stats_dtype(x.dtype());
    const Tensor x2 = as_rows(x, x.dtype(), {s.rows, s.n});
    const Tensor r2 = residual.defined() ? as_rows(residual, residual.dtype(), {s.rows, s.n}) : Tensor();
    const Tensor sum = residual.defined() ? empty({s.rows, s.n}, {x.dtype(), x.device()}) : x2;
    const Tensor mean = empty({s.rows}, {st, x.device()}), rstd = empty({s.rows}, {st, x.device()});
    Fp8Matrix m;
    m.format = format;
    m.scale = empty({1}, f32o);
    m.scale_inv = empty({1}, f32o);
    if (outputs.rows) m.codes = empty({s.rows, s.n}, u8);
    if (outputs.transposed) m.codes_t = empty({s.n, s.rows}, u8);
    const auto row = [&](const Tensor& t) { return t.defined() ? as_rows(t, x.dtype(), {s.n}) : Tensor(); };
    if (backend(x.device(), op)
            .fused_add_layer_norm_fp8(x2, r2, row(residual_bias), row(weight), row(bias), eps, out_dtype, sum, mean,
                                      rstd, h, history.slot(), format, margin, m.scale, m.scale_inv, m.codes,
                                      m.codes_t)) {
      ++history.casts;
      return {raw::view(sum, x.sizes()), raw::view(mean, s.stats), raw::view(rstd, s.stats), m};
    }
  }
  auto [sum, out, mean, rstd] =
      add_layer_norm_forward(x, residual, normalized_shape, weight, bias, eps, out_dtype, residual_bias);
  return {sum, mean, rstd, fp8_cast_delayed(raw::reshape(out, {s.rows, s.n}), format, outputs, history, margin)};
}

AddLayerNormGrads add_layer_norm_backward(const Tensor& grad_out, const Tensor& grad_sum, const Tensor& sum,
                                          const Shape& normalized_shape, const Tensor& mean, const Tensor& rstd,
                                          const Tensor& weight, DType residual_dtype, DType residual_bias_dtype,
                                          std::array<bool, 5> mask) {
  const char* op = "add_layer_norm_backward";
  const LnShape s = check_layer_norm(op, sum, normalized_shape, weight, Tensor());
  for (const Tensor* g : {&grad_out, &grad_sum}) {
    if (g == &grad_sum && !g->defined()) continue;
    MG_CHECK(g->defined() && g->sizes() == sum.sizes(), ShapeError, op, ": gradient shape ",
             g->defined() ? shape_str(g->sizes()) : std::string("undefined"), " does not match the sum's shape ",
             shape_str(sum.sizes()));
    MG_CHECK(is_floating(g->dtype()), DTypeError, op, ": gradients must be floating, got ", g->dtype());
    check_same_device(op, sum, *g, "gradient");
  }
  check_stats(op, s, sum, mean, rstd);
  const bool need_sum_grad = mask[0] || mask[1] || mask[4];
  const TensorOptions o{sum.dtype(), sum.device()};
  const auto shaped = [&](const Tensor& t, const Shape& sh) { return t.defined() ? raw::view(t, sh) : t; };
  if (s.rows > 0 && (!weight.defined() || weight.dtype() == sum.dtype()) &&
      (!mask[4] || residual_bias_dtype == sum.dtype())) {
    const DType st = layer_norm_stats_dtype(sum.dtype());
    Tensor gx = mask[0] ? empty({s.rows, s.n}, o) : Tensor();
    Tensor glow = mask[1] ? empty({s.rows, s.n}, {residual_dtype, sum.device()}) : Tensor();
    Tensor gw = mask[2] ? empty({s.n}, o) : Tensor();
    Tensor gb = mask[3] ? empty({s.n}, o) : Tensor();
    Tensor grb = mask[4] ? empty({s.n}, o) : Tensor();
    const Tensor w = weight.defined() ? as_rows(weight, sum.dtype(), {s.n}) : Tensor();
    const Tensor gs = grad_sum.defined() ? as_rows(grad_sum, sum.dtype(), {s.rows, s.n}) : Tensor();
    if (backend(sum.device(), op)
            .fused_add_layer_norm_backward(as_rows(grad_out, grad_out.dtype(), {s.rows, s.n}), gs,
                                           as_rows(sum, sum.dtype(), {s.rows, s.n}), as_rows(mean, st, {s.rows}),
                                           as_rows(rstd, st, {s.rows}), w, gx, glow, gw, gb, grb))
      return {shaped(gx, sum.sizes()), shaped(glow, sum.sizes()), shaped(gw, normalized_shape),
              shaped(gb, normalized_shape), shaped(grb, normalized_shape)};
  }
  const Tensor g = grad_out.dtype() == sum.dtype() ? grad_out : cast(grad_out, sum.dtype());
  auto [gx, gw, gb] =
      layer_norm_backward(g, sum, normalized_shape, mean, rstd, weight, {need_sum_grad, mask[2], mask[3]});
  if (need_sum_grad && grad_sum.defined()) gx = add(gx, grad_sum);
  // The residual bias's gradient: the sum's gradient summed over the rows.
  Tensor grb;
  if (mask[4]) {
    grb = sum_to(gx, normalized_shape);
    if (grb.dtype() != residual_bias_dtype) grb = cast(grb, residual_bias_dtype);
  }
  // The residual's gradient is its own tensor, never an alias of grad_x's.
  Tensor gres;
  if (mask[1]) gres = residual_dtype != sum.dtype() ? cast(gx, residual_dtype) : mask[0] ? raw::clone(gx) : gx;
  return {mask[0] ? gx : Tensor(), gres, gw, gb, grb};
}

// ---------------------------------------------------------------- batch norm

namespace {

// x [N, C, *] floating (f32/f64 on the CPU); every defined per-channel tensor [C], all of one
// dtype: x's, or on CUDA with an f16/bf16 input f32 (autocast's f32 parameters and running
// statistics, read and written as they are). Returns C; *pd = the per-channel dtype.
int64_t check_batch_norm(const char* op, const Tensor& x,
                         std::initializer_list<std::pair<const Tensor*, const char*>> cs, DType* pd = nullptr) {
  check_defined(op, x, "input");
  check_floating(op, x, "input");
  MG_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64 || x.is_cuda(), DTypeError, op,
           ": the CPU kernel supports f32 and f64 inputs, got ", x.dtype());
  MG_CHECK(x.dim() >= 2, ShapeError, op, ": expected an input of shape [N, C, *] (at least 2-D), got ",
           shape_str(x.sizes()));
  const int64_t C = x.size(1);
  const bool half = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  const Tensor* first = nullptr;
  const char* first_what = "";
  for (auto& [t, what] : cs) {
    if (!t->defined()) continue;
    if (!first) first = t, first_what = what;
    MG_CHECK(t->dtype() == first->dtype(), DTypeError, op, ": ", what, " dtype ", t->dtype(), " differs from ",
             first_what, "'s ", first->dtype(), " (the per-channel tensors share one dtype)");
    MG_CHECK(t->dim() == 1 && t->size(0) == C, ShapeError, op, ": ", what, " shape ", shape_str(t->sizes()),
             " should be [", C, "] (the input ", shape_str(x.sizes()), " has ", C, " channels)");
  }
  const DType d = first ? first->dtype() : x.dtype();
  MG_CHECK(d == x.dtype() || (half && x.is_cuda() && d == DType::f32), DTypeError, op, ": ", first_what, " dtype ", d,
           " differs from the input's ", x.dtype(), " (an f16/bf16 input on CUDA also takes f32 ones)");
  if (pd) *pd = d;
  return C;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> batch_norm_forward_training(const Tensor& x, const Tensor& weight,
                                                               const Tensor& bias, const Tensor& running_mean,
                                                               const Tensor& running_var, double momentum, double eps,
                                                               bool relu, const Tensor& residual) {
  const char* op = "batch_norm";
  const Device dev = common_device(op, {&x, &weight, &bias, &running_mean, &running_var});
  DType pd;
  const int64_t C = check_batch_norm(
      op, x, {{&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"}, {&running_var, "running_var"}},
      &pd);
  MG_CHECK(running_mean.defined() == running_var.defined(), ValueError, op,
           ": running_mean and running_var must be both given or both undefined");
  MG_CHECK(std::isfinite(momentum) && eps >= 0 && std::isfinite(eps), ValueError, op,
           ": momentum must be finite and eps non-negative, got momentum ", momentum, ", eps ", eps);
  MG_CHECK(x.numel() / std::max<int64_t>(C, 1) > 1, ValueError, op,
           ": expected more than 1 value per channel when training, got input of shape ", shape_str(x.sizes()));
  if (residual.defined()) {
    MG_CHECK(relu, ValueError, op, ": a residual is added only before the fused ReLU (relu = true)");
    MG_CHECK(residual.sizes() == x.sizes() && residual.dtype() == x.dtype() && residual.device() == dev, ShapeError, op,
             ": residual must match the input (", shape_str(x.sizes()), " ", dtype_name(x.dtype()), " on ", dev.str(),
             "), got ", shape_str(residual.sizes()), " ", dtype_name(residual.dtype()), " on ",
             residual.device().str());
  }
  const MemoryFormat fmt = device_format(x, dev);  // NHWC stays NHWC on CUDA
  Tensor out = empty(x.sizes(), {x.dtype(), dev}, fmt);
  Tensor mean = empty({C}, {pd, dev}), invstd = empty({C}, {pd, dev});
  // Running statistics are written in place; a strided one goes through a contiguous copy.
  Tensor rm = prep(running_mean, pd), rv = prep(running_var, pd);
  Backend& be = backend(dev, "batch_norm_forward_training");
  const Tensor xp = prep(x, x.dtype(), fmt), wp = prep(weight, pd), bp = prep(bias, pd);
  const Tensor res = residual.defined() ? prep(residual, x.dtype(), fmt) : residual;
  if (!relu || !be.batch_norm_relu_forward_training(xp, wp, bp, rm, rv, momentum, eps, out, mean, invstd, res)) {
    be.batch_norm_forward_training(xp, wp, bp, rm, rv, momentum, eps, out, mean, invstd);
    if (res.defined()) binary_(Binary::Add, out, res);
    if (relu) unary_(Unary::Relu, out);
  }
  if (running_mean.defined()) {
    if (!rm.is_same(running_mean)) raw::copy_(running_mean, rm);
    if (!rv.is_same(running_var)) raw::copy_(running_var, rv);
    running_mean.bump_version();
    running_var.bump_version();
  }
  return {out, mean, invstd};
}

Tensor batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, double eps) {
  const char* op = "batch_norm";
  const Device dev = common_device(op, {&x, &weight, &bias, &running_mean, &running_var});
  DType pd;
  check_batch_norm(
      op, x, {{&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"}, {&running_var, "running_var"}},
      &pd);
  MG_CHECK(running_mean.defined() && running_var.defined(), ValueError, op,
           ": running_mean and running_var are required when not training (eval mode)");
  MG_CHECK(eps >= 0 && std::isfinite(eps), ValueError, op, ": eps must be non-negative, got ", eps);
  const MemoryFormat fmt = device_format(x, dev);  // NHWC stays NHWC on CUDA
  Tensor out = empty(x.sizes(), {x.dtype(), dev}, fmt);
  backend(dev, "batch_norm_forward_eval")
      .batch_norm_forward_eval(prep(x, x.dtype(), fmt), prep(weight, pd), prep(bias, pd), prep(running_mean, pd),
                               prep(running_var, pd), eps, out);
  return out;
}

std::tuple<Tensor, Tensor, Tensor> batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                                       const Tensor& mean, const Tensor& invstd, bool training,
                                                       const Tensor& relu_out) {
  const char* op = "batch_norm_backward";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, mean, "mean");
  check_defined(op, invstd, "invstd");
  const Device dev = common_device(op, {&grad_out, &x, &weight, &mean, &invstd, &relu_out});
  DType pd;
  const int64_t C = check_batch_norm(op, x, {{&weight, "weight"}, {&mean, "mean"}, {&invstd, "invstd"}}, &pd);
  MG_CHECK(grad_out.sizes() == x.sizes(), ShapeError, op, ": grad_output shape ", shape_str(grad_out.sizes()),
           " should be the input's ", shape_str(x.sizes()));
  const MemoryFormat fmt = device_format(x, dev);  // NHWC stays NHWC on CUDA
  Tensor gx = empty(x.sizes(), {x.dtype(), dev}, fmt);
  Tensor gw = empty({C}, {pd, dev}), gb = empty({C}, {pd, dev});
  MG_CHECK(!relu_out.defined() || (training && relu_out.sizes() == x.sizes()), ValueError, op,
           ": relu_out must be the training forward's output, of the input's shape ", shape_str(x.sizes()));
  Backend& be = backend(dev, "batch_norm_backward");
  const Tensor xp = prep(x, x.dtype(), fmt), wp = prep(weight, pd), mp = prep(mean, pd), ip = prep(invstd, pd);
  if (relu_out.defined() && be.batch_norm_relu_backward(prep(grad_out, x.dtype(), fmt), prep(relu_out, x.dtype(), fmt),
                                                        xp, wp, mp, ip, gx, gw, gb))
    return {gx, gw, gb};
  const Tensor g = relu_out.defined() ? binary(Binary::ReluBackward, grad_out, relu_out) : grad_out;
  be.batch_norm_backward(prep(g, x.dtype(), fmt), xp, wp, mp, ip, training, gx, gw, gb);
  return {gx, gw, gb};
}

}  // namespace mg::kernels
