// Layer norm and batch norm. Layer norm: the fused kernel pair of kernels/norm.h, whose backward
// needs only x, weight and the row statistics. Batch norm: kernels/norm.h too, with autocast rules
// for half-precision activations and f32 running statistics.

#include <array>
#include <tuple>

#include "autograd/conv_functions.h"
#include "autograd/op_support.h"

namespace mg {

// ---------------- layer norm ----------------

namespace {
Tensor layer_norm_math(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                       double eps) {
  auto [out, mean, rstd] = kernels::layer_norm_forward(x, normalized_shape, weight, bias, eps);
  if (!any_requires_grad({x, weight, bias})) return out;
  const std::array<bool, 3> mask{needs_grad(x), needs_grad(weight), needs_grad(bias)};
  // The normalized activations are not saved: backward recomputes them from the statistics.
  record("layer_norm", {x, weight, bias}, out,
         [mask, normalized_shape, sx = SavedTensor(x, "layer_norm"),
          sw = weight.defined() ? SavedTensor(weight, "layer_norm") : SavedTensor(),
          smean = SavedTensor(mean, "layer_norm"), srstd = SavedTensor(rstd, "layer_norm")](const Grads& g) {
           auto [gx, gw, gb] = kernels::layer_norm_backward(g[0], sx.unpack(), normalized_shape, smean.unpack(),
                                                            srstd.unpack(), sw.unpack(), mask);
           return Grads{gx, gw, gb};
         });
  return out;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return around(policy::layer_norm, layer_norm_math, x, normalized_shape, weight, bias, eps);
}

Grads AddLayerNormBackward::operator()(const Tensor& gy, const Tensor& gh) const {
  if (!gy.defined()) {  // only the sum was used: its gradient passes to both inputs (never one tensor for both)
    Tensor gres = mask[1] && gh.defined() ? (gh.dtype() == res_t ? gh.clone() : gh.to(res_t)) : Tensor();
    Tensor grb = mask[4] && gh.defined() ? kernels::sum_to(gh, normalized_shape).to(rb_t) : Tensor();
    return Grads{gh, gres, Tensor(), Tensor(), grb};
  }
  kernels::AddLayerNormGrads r = kernels::add_layer_norm_backward(gy, gh, sum.unpack(), normalized_shape, mean, rstd,
                                                                  weight.unpack(), res_t, rb_t, mask);
  return Grads{r.x, r.residual, r.weight, r.bias, r.residual_bias};
}

namespace {
std::pair<Tensor, Tensor> add_layer_norm_math(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                              const Tensor& weight, const Tensor& bias, double eps,
                                              std::optional<DType> out_dtype, const Tensor& residual_bias) {
  const DType out_t = out_dtype.value_or(x.dtype());
  auto [h, y, mean, rstd] =
      kernels::add_layer_norm_forward(x, residual, normalized_shape, weight, bias, eps, out_t, residual_bias);
  const bool has_res = residual.defined();
  if (!any_requires_grad({x, residual, weight, bias, residual_bias})) return {h, y};
  const std::array<bool, 5> mask{needs_grad(x), needs_grad(residual), needs_grad(weight), needs_grad(bias),
                                 needs_grad(residual_bias)};
  // h is saved for backward (the norm's input), not the normalized y; without a residual, h is x.
  AddLayerNormBackward ln{mask,
                          has_res,
                          has_res ? residual.dtype() : x.dtype(),
                          residual_bias.defined() ? residual_bias.dtype() : x.dtype(),
                          normalized_shape,
                          SavedTensor(h, "add_layer_norm"),
                          weight.defined() ? SavedTensor(weight, "add_layer_norm") : SavedTensor(),
                          mean,
                          rstd};
  auto backward = [ln = std::move(ln)](const Grads& g) { return ln.has_res ? ln(g[1], g[0]) : ln(g[0], Tensor()); };
  if (has_res)
    record("add_layer_norm", {x, residual, weight, bias, residual_bias}, std::vector<Tensor>{h, y}, backward);
  else
    record("add_layer_norm", {x, residual, weight, bias, residual_bias}, y, backward);
  return {has_res ? h : x, y};
}

}  // namespace

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                         const Tensor& weight, const Tensor& bias, double eps,
                                         std::optional<DType> out_dtype, const Tensor& residual_bias) {
  // Checked here too: the plain ops below would add the bias to x alone.
  MG_CHECK(!residual_bias.defined() || residual.defined(), ValueError, "add_layer_norm: a residual bias (shape ",
           shape_str(residual_bias.sizes()), ") needs a residual, got none");
  // A policy that rebuilds layer_norm: the plain ops, whose layer_norm it can rebuild. Any other
  // policy (e.g. GELU only) keeps the fused kernel.
  if (autograd::rebuilds("layer_norm")) {
    Tensor h = residual.defined() ? add(x, residual) : x;
    if (residual_bias.defined()) h = add(h, residual_bias);
    Tensor y = layer_norm(h, normalized_shape, weight, bias, eps);
    return {h, out_dtype && y.dtype() != *out_dtype ? y.to(*out_dtype) : y};
  }
  // The residual stream keeps its dtype; the kernel adds it in f32.
  return around(policy::add_layer_norm, add_layer_norm_math, x, as_is(residual), normalized_shape, weight, bias, eps,
                out_dtype, residual_bias);
}

// ---------------- batch norm ----------------

namespace {

// batch_norm, and with relu the ReLU after it (with a residual, relu(batch_norm(x) + residual)):
// fused into the kernels' passes where the backend can (channels-last on CUDA;
// kernels::batch_norm_forward_training), its backward masking the gradient with the saved
// output. Under autocast a half-precision activation keeps its dtype on CUDA, and the CUDA
// kernels take its f32 weight, bias and running statistics as they are (statistics accumulate in
// f32; the saved statistics and the parameters' gradients come out f32): no casts, as PyTorch's
// cuDNN batch norm. The CPU kernel is f32-only: there the policy widens (policy::batch_norm).
Tensor batch_norm_math(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, bool relu,
                       const Tensor& residual) {
  const bool autocast_half =
      x.defined() && is_autocast_enabled(x.device().type) && (x.dtype() == DType::f16 || x.dtype() == DType::bf16);
  // A residual of another dtype than x's: the ops one by one, with add's type promotion.
  if (residual.defined() && x.defined() && residual.sizes() == x.sizes() && residual.dtype() != x.dtype())
    return mg::relu(
        mg::add(batch_norm_math(x, running_mean, running_var, weight, bias, training, momentum, eps, false, Tensor()),
                residual));
  // Half-precision parameters beside f32 running statistics: the parameters go f32 (the
  // kernels take one per-channel dtype).
  auto is_half = [&](const Tensor& t) { return t.defined() && t.dtype() == x.dtype(); };
  if (autocast_half && running_mean.defined() && running_mean.dtype() == DType::f32 &&
      (is_half(weight) || is_half(bias)))
    return batch_norm_math(x, running_mean, running_var, autocast::cached_cast(weight, DType::f32),
                           autocast::cached_cast(bias, DType::f32), training, momentum, eps, relu, residual);
  const bool grad = any_requires_grad({x, weight, bias, residual});
  const bool need_x = needs_grad(x), need_w = needs_grad(weight), need_b = needs_grad(bias);
  if (training) {
    Tensor rm = running_mean.defined() ? running_mean.detach() : running_mean;
    Tensor rv = running_var.defined() ? running_var.detach() : running_var;
    auto [out, mean, invstd] =
        kernels::batch_norm_forward_training(x, weight, bias, rm, rv, momentum, eps, relu, residual);
    if (grad && residual.defined()) {
      // The residual's gradient is grad_out masked by out > 0; batch norm's backward takes
      // that same masked gradient.
      record("batch_norm_add_relu", {x, weight, bias, residual}, out,
             [need_x, need_w, need_b, need_r = needs_grad(residual), sx = SavedTensor(x, "batch_norm_add_relu"),
              sw = SavedTensor(weight, "batch_norm_add_relu"), sy = SavedTensor(out, "batch_norm_add_relu"),
              mean = mean, invstd = invstd](const Grads& g) {
               const Tensor gm = kernels::binary(kernels::Binary::ReluBackward, g[0], sy.unpack());
               Tensor gx, gw, gb;
               if (need_x || need_w || need_b)
                 std::tie(gx, gw, gb) = kernels::batch_norm_backward(gm, sx.unpack(), sw.unpack(), mean, invstd, true);
               return Grads{need_x ? gx : Tensor(), need_w ? gw : Tensor(), need_b ? gb : Tensor(),
                            need_r ? gm : Tensor()};
             });
      return out;
    }
    if (grad)
      // mean/invstd are this op's own tensors: captured plainly, no version check needed.
      // With relu the output is saved too: its sign is the ReLU's gradient.
      record(relu ? "batch_norm_relu" : "batch_norm", {x, weight, bias}, out,
             [need_x, need_w, need_b, sx = SavedTensor(x, "batch_norm"), sw = SavedTensor(weight, "batch_norm"),
              sy = relu ? SavedTensor(out, "batch_norm_relu") : SavedTensor(), mean = mean,
              invstd = invstd](const Grads& g) {
               auto [gx, gw, gb] =
                   kernels::batch_norm_backward(g[0], sx.unpack(), sw.unpack(), mean, invstd, true, sy.unpack());
               return Grads{need_x ? gx : Tensor(), need_w ? gw : Tensor(), need_b ? gb : Tensor()};
             });
    return out;
  }
  if (relu && residual.defined())
    return mg::relu(mg::add(
        batch_norm_math(x, running_mean, running_var, weight, bias, false, momentum, eps, false, Tensor()), residual));
  if (relu)
    return mg::relu(batch_norm_math(x, running_mean, running_var, weight, bias, false, momentum, eps, false, Tensor()));
  Tensor out = kernels::batch_norm_forward_eval(x, weight, bias, running_mean, running_var, eps);
  if (grad)
    // Eval mode: the running statistics are constants of the function; saved with a version
    // check, since a training step before this backward would change them.
    record(
        "batch_norm", {x, weight, bias}, out,
        [need_x, need_w, need_b, eps, sx = SavedTensor(x, "batch_norm"), sw = SavedTensor(weight, "batch_norm"),
         srm = SavedTensor(running_mean, "batch_norm"), srv = SavedTensor(running_var, "batch_norm")](const Grads& g) {
          Tensor invstd = kernels::unary(kernels::Unary::Rsqrt, kernels::add_scalar(srv.unpack(), eps));
          auto [gx, gw, gb] = kernels::batch_norm_backward(g[0], sx.unpack(), sw.unpack(), srm.unpack(), invstd, false);
          return Grads{need_x ? gx : Tensor(), need_w ? gw : Tensor(), need_b ? gb : Tensor()};
        });
  return out;
}

// The running statistics are updated in place: autocast never casts them.
Tensor batch_norm_around(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                         const Tensor& bias, bool training, double momentum, double eps, bool relu,
                         const Tensor& residual) {
  return around(policy::batch_norm, batch_norm_math, x, as_is(running_mean), as_is(running_var), weight, bias, training,
                momentum, eps, relu, residual);
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_around(x, running_mean, running_var, weight, bias, training, momentum, eps, /*relu=*/false,
                           Tensor());
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_around(x, running_mean, running_var, weight, bias, training, momentum, eps, /*relu=*/true,
                           Tensor());
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum, double eps) {
  MG_CHECK(residual.defined(), ValueError, "batch_norm_add_relu: the residual is undefined");
  MG_CHECK(x.defined() && residual.sizes() == x.sizes(), ShapeError, "batch_norm_add_relu: residual shape ",
           shape_str(residual.sizes()), " must equal the input's ",
           x.defined() ? shape_str(x.sizes()) : std::string("(undefined)"));
  return batch_norm_around(x, running_mean, running_var, weight, bias, training, momentum, eps, /*relu=*/true,
                           residual);
}

}  // namespace mg
