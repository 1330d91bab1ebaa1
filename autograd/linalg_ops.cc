// matmul / bmm / linear: backward is two more matmuls (g @ b^T, a^T @ g), with broadcast
// batch dims summed back and 1-D operands' promoted dims removed again. gelu_mlp: the
// transformer MLP's two linears and GELU as one node whose GEMMs carry the GELU.
#include "autograd/fp8_linear.h"
#include "autograd/op_support.h"

#include <array>
#include <tuple>

namespace mg {

namespace {
Tensor mT(const Tensor& t) { return raw::transpose(t, -1, -2); }

// A linear layer's output shape: x's with `out_features` last.
Shape linear_shape(const Tensor& x, int64_t out_features) {
  Shape s = x.sizes();
  if (!s.empty()) s.back() = out_features;
  return s;
}

// The dtype a linear's weight (and bias) gradient is written in: f32 straight from the GEMM's
// accumulator when w is autocast's f16/bf16 cast of an f32 weight, whose "to" node takes f32 as it
// is (autograd::grad_dtype_for): no cast kernel back, and one rounding fewer. Else w's own.
DType weight_grad_dtype(const Tensor& w) {
  const DType d = autograd::grad_dtype_for(w);
  return d == DType::f32 && (w.dtype() == DType::f16 || w.dtype() == DType::bf16) ? d : w.dtype();
}
}  // namespace

namespace {
Tensor matmul_math(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::matmul(a, b);
  if (!any_requires_grad({a, b})) return out;
  const bool need_a = needs_grad(a), need_b = needs_grad(b);
  record("matmul", {a, b}, out,
         [need_a, need_b, sa = save_if(need_b, a, "matmul"), sb = save_if(need_a, b, "matmul"), as = a.sizes(),
          bs = b.sizes()](const Grads& g) {
           Tensor ga, gb;
           if (as.size() == 1 && bs.size() == 1) {  // dot product: g is 0-dim
             if (need_a) ga = kernels::mul(g[0], sb.unpack());
             if (need_b) gb = kernels::mul(g[0], sa.unpack());
             return Grads{ga, gb};
           }
           // Work on the promoted operands: a [k] -> [1, k], b [k] -> [k, 1].
           Tensor g2 = g[0];
           if (as.size() == 1) g2 = raw::unsqueeze(g2, -2);
           if (bs.size() == 1) g2 = raw::unsqueeze(g2, -1);
           if (need_a) {
             Tensor b2 = sb.unpack();
             if (bs.size() == 1) b2 = raw::unsqueeze(b2, 1);
             Shape a2 = as.size() == 1 ? Shape{1, as[0]} : as;
             ga = raw::reshape(kernels::sum_to(kernels::matmul(g2, mT(b2)), a2), as);
           }
           if (need_b) {
             Tensor a2 = sa.unpack();
             if (as.size() == 1) a2 = raw::unsqueeze(a2, 0);
             Shape b2 = bs.size() == 1 ? Shape{bs[0], 1} : bs;
             gb = raw::reshape(kernels::sum_to(kernels::matmul(mT(a2), g2), b2), bs);
           }
           return Grads{ga, gb};
         });
  return out;
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return around(policy::matmul, matmul_math, a, b); }

namespace {
Tensor bmm_math(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::bmm(a, b);
  if (!any_requires_grad({a, b})) return out;
  const bool need_a = needs_grad(a), need_b = needs_grad(b);
  record("bmm", {a, b}, out,
         [need_a, need_b, sa = save_if(need_b, a, "bmm"), sb = save_if(need_a, b, "bmm")](const Grads& g) {
           Tensor ga, gb;
           if (need_a) ga = kernels::bmm(g[0], mT(sb.unpack()));
           if (need_b) gb = kernels::bmm(mT(sa.unpack()), g[0]);
           return Grads{ga, gb};
         });
  return out;
}
}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) { return around(policy::bmm, bmm_math, a, b); }

namespace {
Tensor linear_math(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (autograd::fp8_linear_applies(x, w)) return autograd::fp8_linear(x, w, bias, weight_grad_dtype(w));
  const Tensor out = autograd::kept_or_run("linear", linear_shape(x, w.size(0)),
                                           [&] { return std::vector<Tensor>{kernels::linear(x, w, bias)}; })[0];
  if (!any_requires_grad({x, w, bias})) return out;
  const bool need_x = needs_grad(x), need_w = needs_grad(w), need_b = needs_grad(bias);
  record("linear", {x, w, bias}, out,
         [need_x, need_w, need_b, sx = save_if(need_w, x, "linear"), sw = save_if(need_x, w, "linear"), ws = w.sizes(),
          gw_dtype = weight_grad_dtype(w)](const Grads& g) {
           Tensor gx, gw, gb;
           if (need_x) gx = kernels::matmul(g[0], sw.unpack());  // [..., out] @ [out, in]
           if (need_w) {  // g^T x over all rows, and the bias gradient in the same GEMM where it can
             Tensor g2 = raw::reshape(g[0], {-1, ws[0]});
             Tensor x2 = raw::reshape(sx.unpack(), {-1, ws[1]});
             std::tie(gw, gb) = kernels::linear_weight_grads(g2, x2, need_b, gw_dtype);
           } else if (need_b) {
             gb = g[0];  // the engine sums it over the rows
           }
           return Grads{gx, gw, gb};
         });
  return out;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  // Under the FP8 recipe an f32 weight stays f32: its FP8 cast reads it (no bf16 copy made).
  if (autograd::fp8_keeps_f32_weight(x, w)) return around(policy::linear, linear_math, x, as_is(w), bias);
  return around(policy::linear, linear_math, x, w, bias);
}

bool fp8_takes_linear(const Tensor& x, const Tensor& w) {
  return autograd::fp8_keeps_f32_weight(x, w) || autograd::fp8_linear_applies(x, w);
}

namespace {
Tensor gelu_mlp_math(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                     const Tensor& b_proj) {
  if (autograd::fp8_linear_applies(x, w_fc) && autograd::fp8_linear_applies(x, w_proj) &&
      w_proj.size(1) == w_fc.size(0))
    return autograd::fp8_gelu_mlp(x, w_fc, b_fc, w_proj, b_proj, weight_grad_dtype(w_fc), weight_grad_dtype(w_proj));
  auto [h, pre] = kernels::linear_gelu(x, w_fc, b_fc);  // h = gelu(pre), pre = x @ w_fc^T + b_fc
  // In a checkpoint replay that kept the output, c_fc and the GELU still run (backward needs
  // pre and h, bitwise those of the forward); c_proj's GEMM does not.
  const Tensor out = autograd::kept_or_run("gelu_mlp", linear_shape(x, w_proj.size(0)),
                                           [&] { return std::vector<Tensor>{kernels::linear(h, w_proj, b_proj)}; })[0];
  if (!any_requires_grad({x, w_fc, b_fc, w_proj, b_proj})) return out;
  const std::array<bool, 5> need{needs_grad(x), needs_grad(w_fc), needs_grad(b_fc), needs_grad(w_proj),
                                 needs_grad(b_proj)};
  const bool need_pre = need[0] || need[1] || need[2];
  // Under a selective-recompute policy that rebuilds gelu, h is not kept: c_proj's weight
  // gradient rebuilds it from pre (kept anyway) with the GELU kernel, one elementwise pass.
  // That h is gelu(round(pre)), the forward's epilogue rounded gelu(pre) once: they can differ
  // by one rounding of the autocast dtype.
  const bool rebuild_h = need[3] && autograd::rebuilds("gelu");
  // h and pre are this node's own intermediates (nothing else can change them), saved as
  // SavedTensors so that an OffloadScope can move them to host memory.
  record("gelu_mlp", {x, w_fc, b_fc, w_proj, b_proj}, out,
         [need, need_pre, rebuild_h, sx = save_if(need[1], x, "gelu_mlp"), sw_fc = save_if(need[0], w_fc, "gelu_mlp"),
          sw_proj = save_if(need_pre, w_proj, "gelu_mlp"), sh = save_if(need[3] && !rebuild_h, h, "gelu_mlp"),
          spre = save_if(need_pre || rebuild_h, pre, "gelu_mlp"), dt_fc = weight_grad_dtype(w_fc),
          dt_proj = weight_grad_dtype(w_proj)](const Grads& g) {
           Tensor gx, gw_fc, gb_fc, gw_proj, gb_proj;
           const Tensor g2 = raw::reshape(g[0], {-1, g[0].size(-1)});
           const Tensor pre = spre.unpack();
           if (need[3]) {
             const Tensor hh = rebuild_h ? kernels::unary(kernels::Unary::GeluTanh, pre) : sh.unpack();
             std::tie(gw_proj, gb_proj) =
                 kernels::linear_weight_grads(g2, raw::reshape(hh, {-1, hh.size(-1)}), need[4], dt_proj);
           } else if (need[4])
             gb_proj = kernels::sum(g2, {0});
           if (need_pre) {
             const Tensor g_pre =
                 kernels::matmul_gelu_backward(g2, sw_proj.unpack(), raw::reshape(pre, {-1, pre.size(-1)}));
             if (need[1]) {  // c_fc's bias gradient inside its weight-gradient GEMM
               const Tensor x = sx.unpack();
               std::tie(gw_fc, gb_fc) =
                   kernels::linear_weight_grads(g_pre, raw::reshape(x, {-1, x.size(-1)}), need[2], dt_fc);
             } else if (need[2]) {
               gb_fc = kernels::sum(g_pre, {0});
             }
             if (need[0]) {
               Shape s = pre.sizes();
               s.back() = sw_fc.unpack().size(1);
               gx = raw::reshape(kernels::matmul(g_pre, sw_fc.unpack()), s);
             }
           }
           return Grads{gx, gw_fc, gb_fc, gw_proj, gb_proj};
         });
  return out;
}
}  // namespace

bool fp8_takes_gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& w_proj) {
  return fp8_takes_linear(x, w_fc) && fp8_takes_linear(x, w_proj) && w_proj.dim() == 2 && w_fc.dim() == 2 &&
         w_proj.size(1) == w_fc.size(0);
}

Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj) {
  if (autograd::fp8_keeps_f32_weight(x, w_fc) && autograd::fp8_keeps_f32_weight(x, w_proj) &&
      w_proj.size(1) == w_fc.size(0))  // as linear's: the recipe casts the f32 weights themselves
    return around(policy::gelu_mlp, gelu_mlp_math, x, as_is(w_fc), b_fc, as_is(w_proj), b_proj);
  return around(policy::gelu_mlp, gelu_mlp_math, x, w_fc, b_fc, w_proj, b_proj);
}

}  // namespace mg
