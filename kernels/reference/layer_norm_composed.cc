// The composed layer norm: every step a generic kernel, in the statistics dtype.
#include "kernels/reference/layer_norm_composed.h"

#include "kernels/ops.h"

namespace mg::kernels {
namespace {

struct Rows {
  int64_t rows = 0, n = 1;
  Shape stats;  // x.shape[:-k] + [1] * k
};

Rows rows_of(const Tensor& x, const Shape& ns) {
  Rows r;
  r.n = shape_numel(ns);
  r.rows = r.n == 0 ? 0 : x.numel() / r.n;
  r.stats = x.sizes();
  for (int64_t d = x.dim() - static_cast<int64_t>(ns.size()); d < x.dim(); ++d) r.stats[d] = 1;
  return r;
}

Tensor as_rows(const Tensor& t, DType dt, const Shape& shape) {
  return raw::view(raw::contiguous(t.dtype() == dt ? t : raw::to_dtype(t, dt)), shape);
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward_composed(const Tensor& x, const Shape& normalized_shape,
                                                               const Tensor& weight, const Tensor& bias, double eps) {
  const Rows s = rows_of(x, normalized_shape);
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
  const Rows s = rows_of(x, normalized_shape);
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
