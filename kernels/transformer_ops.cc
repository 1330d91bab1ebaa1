// Validation and dispatch for kernels/transformer_ops.h. CPU tensors run the row loop in
// cpu/layernorm.cc, CUDA tensors the fused kernels of kernels/cuda/layernorm.cu (when built
// with MG_WITH_CUDA_NN_OPS); any other device runs the composed path (generic kernels that
// exist on every backend), which is also the loop kernel's test reference.
#include "kernels/transformer_ops.h"

#include <cmath>

#include "kernels/ops.h"

#if defined(MG_WITH_CUDA) && defined(MG_WITH_CUDA_NN_OPS)
#include "kernels/cuda/cuda_nn_ops.h"
#define MG_LN_HAS_CUDA 1
#define MG_LN_KERNEL(DEV, FN, ...)                             \
  do {                                                         \
    if ((DEV).is_cuda()) ::mg::kernels::cuda::FN(__VA_ARGS__); \
    else ::mg::kernels::cpu::FN(__VA_ARGS__);                  \
  } while (0)
#else
#define MG_LN_HAS_CUDA 0
#define MG_LN_KERNEL(DEV, FN, ...) ::mg::kernels::cpu::FN(__VA_ARGS__)
#endif

namespace mg::kernels {
namespace {

// Devices with a layer-norm kernel of their own (the rest take the composed path).
bool has_kernel(Device d) { return d.is_cpu() || (MG_LN_HAS_CUDA && d.is_cuda()); }

struct LnShape {
  int64_t rows = 0, n = 1;  // x viewed as [rows, n]
  Shape stats;              // x.shape[:-k] + [1] * k
};

void check_same_device(const char* op, const Tensor& x, const Tensor& t, const char* what) {
  if (t.defined())
    MG_CHECK(t.device() == x.device(), DeviceError, op, ": ", what, " is on ", t.device(), " but the input is on ",
             x.device());
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

// t as a contiguous [rows, n] (or [n]) tensor of dtype dt.
Tensor as_rows(const Tensor& t, DType dt, const Shape& shape) {
  Tensor c = t.dtype() == dt ? t : raw::to_dtype(t, dt);
  return raw::view(raw::contiguous(c), shape);
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
  if (!has_kernel(x.device())) return layer_norm_forward_composed(x, normalized_shape, weight, bias, eps);
  const DType st = layer_norm_stats_dtype(x.dtype());
  Tensor out = empty({s.rows, s.n}, {x.dtype(), x.device()});
  Tensor mean = empty({s.rows}, {st, x.device()});
  Tensor rstd = empty({s.rows}, {st, x.device()});
  if (s.rows > 0) {
    Tensor w = weight.defined() ? as_rows(weight, x.dtype(), {s.n}) : Tensor();
    Tensor b = bias.defined() ? as_rows(bias, x.dtype(), {s.n}) : Tensor();
    MG_LN_KERNEL(x.device(), layer_norm_forward, as_rows(x, x.dtype(), {s.rows, s.n}), w, b, eps, out, mean, rstd);
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
  if (!has_kernel(x.device()))
    return layer_norm_backward_composed(grad_out, x, normalized_shape, mean, rstd, weight, mask);
  const TensorOptions o{x.dtype(), x.device()};
  Tensor gx = mask[0] ? empty({s.rows, s.n}, o) : Tensor();
  Tensor gw = mask[1] ? zeros({s.n}, o) : Tensor();
  Tensor gb = mask[2] ? zeros({s.n}, o) : Tensor();
  if (s.rows > 0 && (mask[0] || mask[1] || mask[2])) {
    const DType st = layer_norm_stats_dtype(x.dtype());
    Tensor w = weight.defined() ? as_rows(weight, x.dtype(), {s.n}) : Tensor();
    MG_LN_KERNEL(x.device(), layer_norm_backward, as_rows(grad_out, x.dtype(), {s.rows, s.n}),
                 as_rows(x, x.dtype(), {s.rows, s.n}), as_rows(mean, st, {s.rows}), as_rows(rstd, st, {s.rows}), w, gx,
                 gw, gb);
  }
  return {gx.defined() ? raw::view(gx, x.sizes()) : gx, gw.defined() ? raw::view(gw, normalized_shape) : gw,
          gb.defined() ? raw::view(gb, normalized_shape) : gb};
}

// ---------------------------------------------------------------- composed reference

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward_composed(const Tensor& x, const Shape& normalized_shape,
                                                               const Tensor& weight, const Tensor& bias, double eps) {
  const LnShape s = check_layer_norm("layer_norm", x, normalized_shape, weight, bias);
  check_eps(eps);
  const DType st = layer_norm_stats_dtype(x.dtype());
  Tensor xf = as_rows(x, st, {s.rows, s.n});
  Tensor mean = kernels::mean(xf, {1}, true);  // [rows, 1]
  Tensor xc = sub(xf, mean);
  Tensor var = kernels::mean(mul(xc, xc), {1}, true);
  Tensor rstd = unary(Unary::Rsqrt, add_scalar(var, eps));
  Tensor y = mul(xc, rstd);
  if (weight.defined()) y = mul(y, as_rows(weight, st, {s.n}));
  if (bias.defined()) y = add(y, as_rows(bias, st, {s.n}));
  Tensor out = y.dtype() == x.dtype() ? y : cast(y, x.dtype());
  return {raw::view(out, x.sizes()), raw::view(mean, s.stats), raw::view(rstd, s.stats)};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_composed(const Tensor& grad_out, const Tensor& x,
                                                                const Shape& normalized_shape, const Tensor& mean,
                                                                const Tensor& rstd, const Tensor& weight,
                                                                std::array<bool, 3> mask) {
  const char* op = "layer_norm_backward";
  const LnShape s = check_layer_norm(op, x, normalized_shape, weight, Tensor());
  check_stats(op, s, x, mean, rstd);
  const DType st = layer_norm_stats_dtype(x.dtype());
  Tensor m = as_rows(mean, st, {s.rows, 1}), r = as_rows(rstd, st, {s.rows, 1});
  Tensor xhat = mul(sub(as_rows(x, st, {s.rows, s.n}), m), r);
  Tensor g = as_rows(grad_out, st, {s.rows, s.n});
  auto back = [&](const Tensor& t, const Shape& shape) {
    return raw::view(t.dtype() == x.dtype() ? raw::contiguous(t) : cast(t, x.dtype()), shape);
  };
  Tensor gx, gw, gb;
  if (mask[0]) {
    Tensor gwt = weight.defined() ? mul(g, as_rows(weight, st, {s.n})) : g;
    Tensor a = kernels::mean(gwt, {1}, true);
    Tensor b = kernels::mean(mul(gwt, xhat), {1}, true);
    gx = back(mul(r, sub(sub(gwt, a), mul(xhat, b))), x.sizes());
  }
  if (mask[1]) gw = back(kernels::sum(mul(g, xhat), {0}), normalized_shape);
  if (mask[2]) gb = back(kernels::sum(g, {0}), normalized_shape);
  return {gx, gw, gb};
}

}  // namespace mg::kernels
