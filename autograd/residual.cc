#include "autograd/residual.h"

#include <optional>
#include <utility>

#include "autograd/fp8_linear.h"
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

Normed::Normed(Residual x, Shape normalized_shape, Tensor weight, Tensor bias, double eps)
    : s_(std::make_shared<State>(
          State{std::move(x), std::move(normalized_shape), std::move(weight), std::move(bias), eps, Tensor(), false})) {
  MG_CHECK(s_->stream.base().defined(), ValueError, "layer_norm: the residual stream is an undefined tensor");
}

const Tensor& Normed::value() const {
  if (!s_->value.defined()) s_->value = layer_norm(s_->stream, s_->normalized_shape, s_->weight, s_->bias, s_->eps);
  return s_->value;
}

void Normed::ran(Tensor sum) const {
  s_->stream.s_->base = std::move(sum);
  s_->stream.s_->pending = {};
  s_->ran = true;
}

namespace {
bool on_device_of(const Tensor& b, const Tensor& w) { return !b.defined() || b.device() == w.device(); }
}  // namespace

Tensor linear(const Normed& x, const Tensor& w, const Tensor& bias) {
  // fp8_norm_applies takes f32 weights on the stream's device only: their gradients come in f32. A
  // bias elsewhere (held in host memory) comes to the device through the plain linear's policy.
  if (autograd::fp8_norm_applies(x, w) && on_device_of(bias, w))
    return autograd::fp8_norm_linear(x, w, bias, DType::f32);
  return linear(x.value(), w, bias);
}

Tensor gelu_mlp(const Normed& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj) {
  if (autograd::fp8_norm_applies(x, w_fc) && autograd::fp8_norm_applies(x, w_proj) && w_fc.dim() == 2 &&
      w_proj.dim() == 2 && w_proj.size(1) == w_fc.size(0) && on_device_of(b_fc, w_fc) && on_device_of(b_proj, w_fc))
    return autograd::fp8_norm_gelu_mlp(x, w_fc, b_fc, w_proj, b_proj, DType::f32, DType::f32);
  return gelu_mlp(x.value(), w_fc, b_fc, w_proj, b_proj);
}

bool fp8_takes_linear(const Normed& x, const Tensor& w) { return fp8_takes_linear(x.stream().base(), w); }

bool fp8_takes_gelu_mlp(const Normed& x, const Tensor& w_fc, const Tensor& w_proj) {
  return fp8_takes_gelu_mlp(x.stream().base(), w_fc, w_proj);
}

}  // namespace mg
