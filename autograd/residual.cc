#include "autograd/residual.h"

#include <optional>
#include <utility>

#include "autograd/functions.h"
#include "core/autocast.h"

namespace mg {

Residual::Residual(Tensor x) : Residual() { s_->base = std::move(x); }

Residual::Residual(Tensor x, Branch b) : Residual(std::move(x)) {
  MG_CHECK(b.out.defined() || !b.bias.defined(), ValueError, "Residual: a branch bias (shape ",
           shape_str(b.bias.sizes()), ") needs a branch output, got none");
  if (b.p > 0.0)  // bias, dropout and add in one kernel, now: a dropout is never left pending
    s_->base = bias_dropout_add(s_->base, b.out, b.bias, b.p, /*training=*/true);
  else
    s_->pending = std::move(b);
}

Residual Residual::operator+(const Branch& b) const { return Residual(value(), b); }

const Tensor& Residual::value() const {
  if (has_pending()) {
    Branch b = std::move(s_->pending);
    s_->pending = {};
    s_->base = add(s_->base, b.out);  // (x + out) + bias: add_layer_norm's order
    if (b.bias.defined()) s_->base = add(s_->base, b.bias);
  }
  return s_->base;
}

Tensor layer_norm(const Residual& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  MG_CHECK(x.base().defined(), ValueError, "layer_norm: the residual stream is an undefined tensor");
  std::optional<DType> out;
  const DeviceType dev = x.base().device().type;
  if (is_autocast_enabled(dev)) out = autocast_dtype(dev);
  auto [h, y] = add_layer_norm(x.base(), x.pending().out, normalized_shape, weight, bias, eps, out, x.pending().bias);
  x.s_->base = std::move(h);
  x.s_->pending = {};
  return y;
}

}  // namespace mg
