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

LnShape check_layer_norm(const char* op, const Tensor& x, const Shape& ns, const Tensor& weight, const Tensor& bias) {
  MG_CHECK(x.defined(), ValueError, op, ": got an undefined input");
  MG_CHECK(is_floating(x.dtype()), DTypeError, op, ": input must be floating, got ", x.dtype());
  MG_CHECK(!ns.empty(), ValueError, op, ": normalized_shape must have at least one dim, got []");
  const int64_t k = static_cast<int64_t>(ns.size());
  Shape tail;
  if (k <= x.dim()) tail.assign(x.sizes().end() - k, x.sizes().end());
  MG_CHECK(k <= x.dim() && tail == ns, ShapeError, op, ": normalized_shape ", shape_str(ns),
           " must equal the input's last ", k, " dims, but the input has shape ", shape_str(x.sizes()));
  auto check_param = [&](const Tensor& p, const char* what) {
    if (!p.defined()) return;
    MG_CHECK(p.sizes() == ns, ShapeError, op, ": ", what, " has shape ", shape_str(p.sizes()),
             ", expected normalized_shape ", shape_str(ns));
    MG_CHECK(is_floating(p.dtype()), DTypeError, op, ": ", what, " must be floating, got ", p.dtype());
    check_same_device(op, x, p, what);
  };
  check_param(weight, "weight");
  check_param(bias, "bias");
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

// ---------------------------------------------------------------- batch norm

namespace {

// x [N, C, *] floating f32/f64; every defined per-channel tensor [C] of x's dtype.
int64_t check_batch_norm(const char* op, const Tensor& x,
                         std::initializer_list<std::pair<const Tensor*, const char*>> cs) {
  check_defined(op, x, "input");
  check_floating(op, x, "input");
  MG_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64 || x.is_cuda(), DTypeError, op,
           ": the CPU kernel supports f32 and f64 inputs, got ", x.dtype());
  MG_CHECK(x.dim() >= 2, ShapeError, op, ": expected an input of shape [N, C, *] (at least 2-D), got ",
           shape_str(x.sizes()));
  const int64_t C = x.size(1);
  for (auto& [t, what] : cs) {
    if (!t->defined()) continue;
    check_same_dtype(op, *t, what, x);
    MG_CHECK(t->dim() == 1 && t->size(0) == C, ShapeError, op, ": ", what, " shape ", shape_str(t->sizes()),
             " should be [", C, "] (the input ", shape_str(x.sizes()), " has ", C, " channels)");
  }
  return C;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> batch_norm_forward_training(const Tensor& x, const Tensor& weight,
                                                               const Tensor& bias, const Tensor& running_mean,
                                                               const Tensor& running_var, double momentum, double eps) {
  const char* op = "batch_norm";
  const Device dev = common_device(op, {&x, &weight, &bias, &running_mean, &running_var});
  const int64_t C = check_batch_norm(
      op, x, {{&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"}, {&running_var, "running_var"}});
  MG_CHECK(running_mean.defined() == running_var.defined(), ValueError, op,
           ": running_mean and running_var must be both given or both undefined");
  MG_CHECK(std::isfinite(momentum) && eps >= 0 && std::isfinite(eps), ValueError, op,
           ": momentum must be finite and eps non-negative, got momentum ", momentum, ", eps ", eps);
  MG_CHECK(x.numel() / std::max<int64_t>(C, 1) > 1, ValueError, op,
           ": expected more than 1 value per channel when training, got input of shape ", shape_str(x.sizes()));
  Tensor out = empty(x.sizes(), {x.dtype(), dev});
  Tensor mean = empty({C}, {x.dtype(), dev}), invstd = empty({C}, {x.dtype(), dev});
  // Running statistics are written in place; a strided one goes through a contiguous copy.
  Tensor rm = prep(running_mean, x.dtype()), rv = prep(running_var, x.dtype());
  backend(dev, "batch_norm_forward_training")
      .batch_norm_forward_training(prep(x, x.dtype()), prep(weight, x.dtype()), prep(bias, x.dtype()), rm, rv, momentum,
                                   eps, out, mean, invstd);
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
  check_batch_norm(
      op, x, {{&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"}, {&running_var, "running_var"}});
  MG_CHECK(running_mean.defined() && running_var.defined(), ValueError, op,
           ": running_mean and running_var are required when not training (eval mode)");
  MG_CHECK(eps >= 0 && std::isfinite(eps), ValueError, op, ": eps must be non-negative, got ", eps);
  Tensor out = empty(x.sizes(), {x.dtype(), dev});
  backend(dev, "batch_norm_forward_eval")
      .batch_norm_forward_eval(prep(x, x.dtype()), prep(weight, x.dtype()), prep(bias, x.dtype()),
                               prep(running_mean, x.dtype()), prep(running_var, x.dtype()), eps, out);
  return out;
}

std::tuple<Tensor, Tensor, Tensor> batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                                       const Tensor& mean, const Tensor& invstd, bool training) {
  const char* op = "batch_norm_backward";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, mean, "mean");
  check_defined(op, invstd, "invstd");
  const Device dev = common_device(op, {&grad_out, &x, &weight, &mean, &invstd});
  const int64_t C = check_batch_norm(op, x, {{&weight, "weight"}, {&mean, "mean"}, {&invstd, "invstd"}});
  MG_CHECK(grad_out.sizes() == x.sizes(), ShapeError, op, ": grad_output shape ", shape_str(grad_out.sizes()),
           " should be the input's ", shape_str(x.sizes()));
  Tensor gx = empty(x.sizes(), {x.dtype(), dev});
  Tensor gw = empty({C}, {x.dtype(), dev}), gb = empty({C}, {x.dtype(), dev});
  backend(dev, "batch_norm_backward")
      .batch_norm_backward(prep(grad_out, x.dtype()), prep(x, x.dtype()), prep(weight, x.dtype()),
                           prep(mean, x.dtype()), prep(invstd, x.dtype()), training, gx, gw, gb);
  return {gx, gw, gb};
}

}  // namespace mg::kernels
