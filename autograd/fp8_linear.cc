// The FP8 recipe's linear and MLP nodes (autograd/fp8_linear.h).
#include "autograd/fp8_linear.h"

#include <array>

#include "autograd/op_support.h"
#include "core/autocast.h"
#include "kernels/fp8.h"

namespace mg::autograd {

namespace {
using kernels::Fp8Epilogue;
using kernels::Fp8Format;
using kernels::Fp8Matrix;
constexpr Fp8Format kE4M3 = Fp8Format::E4M3, kE5M2 = Fp8Format::E5M2;

bool half(DType d) { return d == DType::f16 || d == DType::bf16; }
int64_t rows_of(const Tensor& x) { return x.dim() == 0 ? 0 : x.numel() / x.size(-1); }

Shape with_last(const Tensor& x, int64_t n) {
  Shape s = x.sizes();
  s.back() = n;
  return s;
}

// dx-style GEMM: a's codes [M, K'] against b's transposed codes.
Tensor gemm_t(const Fp8Matrix& a, const Fp8Matrix& b, DType dtype) {
  return kernels::fp8_gemm(a.codes, a.format, a.scale_inv, b.codes_t, b.format, b.scale_inv, Tensor(), dtype);
}
// dw-style GEMM: both operands' transposed codes.
Tensor gemm_tt(const Fp8Matrix& a, const Fp8Matrix& b, DType dtype) {
  return kernels::fp8_gemm(a.codes_t, a.format, a.scale_inv, b.codes_t, b.format, b.scale_inv, Tensor(), dtype);
}
// Only what backward reads: the transposed codes and the scale.
Fp8Matrix transposed_only(Fp8Matrix m) {
  m.codes = Tensor();
  return m;
}
// The rows' sum in `dtype` (f32 for an f32 bias: the f32 sums not rounded to g2's type first).
Tensor bias_grad(const Tensor& g2, DType dtype) {
  return dtype == DType::f32 || dtype == g2.dtype() ? kernels::sum(g2, {0}, false, dtype)
                                                    : raw::to_dtype(kernels::sum(g2, {0}), dtype);
}
// The same from the f32 column sums a gradient's cast took on its way (Fp8CastOutputs::column_sums).
Tensor bias_grad_from_sums(const Tensor& sums, DType dtype) {
  return dtype == DType::f32 ? sums : raw::to_dtype(sums, dtype);
}
}  // namespace

bool fp8_linear_applies(const Tensor& x, const Tensor& w) {
  const AutocastState st = autocast_state();
  if (!st.fp8 || !x.defined() || !w.defined() || x.dim() < 1 || w.dim() != 2) return false;
  const DeviceType dt = x.device().type;
  if (!st.enabled(dt) || !half(st.dtype(dt)) || x.dtype() != st.dtype(dt) || w.dtype() != x.dtype()) return false;
  if (x.size(-1) < st.fp8_min_features || w.size(0) < st.fp8_min_features) return false;
  return x.size(-1) % 16 == 0 && w.size(0) % 16 == 0 && rows_of(x) % 16 == 0 && rows_of(x) > 0;
}

Tensor fp8_linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType gw_dtype) {
  const bool grad = any_requires_grad({x, w, bias});
  const bool need_x = grad && needs_grad(x), need_w = grad && needs_grad(w), need_b = grad && needs_grad(bias);
  const int64_t n = w.size(0);
  const Fp8Matrix xq = kernels::fp8_cast(raw::reshape(x, {-1, x.size(-1)}), kE4M3, true, need_w);
  const Fp8Matrix wq = kernels::fp8_cast(w, kE4M3, true, need_x);
  const Tensor out = raw::view(kernels::fp8_gemm(xq, wq, bias, x.dtype()), with_last(x, n));
  if (!grad) return out;
  record("linear", {x, w, bias}, out,
         [need_x, need_w, need_b, n, xs = x.sizes(), dtype = x.dtype(), gw_dtype, xq = transposed_only(xq),
          wq = transposed_only(wq)](const Grads& g) {
           Tensor gx, gw, gb;
           const Tensor g2 = raw::reshape(g[0], {-1, n});
           if (need_x || need_w) {  // the bias gradient summed in the cast's pass over g
             const Fp8Matrix gq = kernels::fp8_cast(g2, kE5M2, {need_x, need_w, need_b});
             if (need_x) gx = raw::view(gemm_t(gq, wq, dtype), xs);  // [M, N] @ w [N, K]
             if (need_w) gw = gemm_tt(gq, xq, gw_dtype);             // g^T [N, M] @ x [M, K]
             if (need_b) gb = bias_grad_from_sums(gq.column_sums, gw_dtype);
           } else if (need_b) {
             gb = bias_grad(g2, gw_dtype);
           }
           return Grads{gx, gw, gb};
         });
  return out;
}

Tensor fp8_gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj,
                    DType dt_fc, DType dt_proj) {
  const bool grad = any_requires_grad({x, w_fc, b_fc, w_proj, b_proj});
  const std::array<bool, 5> need{grad && needs_grad(x), grad && needs_grad(w_fc), grad && needs_grad(b_fc),
                                 grad && needs_grad(w_proj), grad && needs_grad(b_proj)};
  const bool need_pre = need[0] || need[1] || need[2];
  const DType dtype = x.dtype();
  const int64_t hidden = w_fc.size(0);
  const Fp8Matrix xq = kernels::fp8_cast(raw::reshape(x, {-1, x.size(-1)}), kE4M3, true, need[1]);
  const Fp8Matrix wfq = kernels::fp8_cast(w_fc, kE4M3, true, need[0]);
  Tensor pre = empty({rows_of(x), hidden}, TensorOptions(dtype, x.device()));
  const Tensor h = kernels::fp8_gemm(xq.codes, kE4M3, xq.scale_inv, wfq.codes, kE4M3, wfq.scale_inv, b_fc, dtype,
                                     Fp8Epilogue::GeluAux, pre);  // h = gelu(pre), pre = x @ w_fc^T + b_fc
  const Fp8Matrix hq = kernels::fp8_cast(h, kE4M3, true, need[3]);
  const Fp8Matrix wpq = kernels::fp8_cast(w_proj, kE4M3, true, need_pre);
  const Tensor out = raw::view(kernels::fp8_gemm(hq, wpq, b_proj, dtype), with_last(x, w_proj.size(0)));
  if (!grad) return out;
  record("gelu_mlp", {x, w_fc, b_fc, w_proj, b_proj}, out,
         [need, need_pre, xs = x.sizes(), dtype, dt_fc, dt_proj, xq = transposed_only(xq), wfq = transposed_only(wfq),
          hq = transposed_only(hq), wpq = transposed_only(wpq), pre = need_pre ? pre : Tensor()](const Grads& g) {
           Tensor gx, gw_fc, gb_fc, gw_proj, gb_proj;
           const Tensor g2 = raw::reshape(g[0], {-1, g[0].size(-1)});
           if (need_pre || need[3]) {
             const Fp8Matrix gq = kernels::fp8_cast(g2, kE5M2, {need_pre, need[3], need[4]});
             if (need[4]) gb_proj = bias_grad_from_sums(gq.column_sums, dt_proj);
             if (need[3]) gw_proj = gemm_tt(gq, hq, dt_proj);
             if (need_pre) {
               // g_pre = (g @ w_proj) * gelu'(pre): the GEMM, then the derivative in the pass that
               // takes g_pre's amax for its cast (or in the GEMM's epilogue when nothing casts it).
               Tensor g_pre;
               if (need[0] || need[1]) {
                 g_pre = kernels::fp8_gemm(gq.codes, kE5M2, gq.scale_inv, wpq.codes_t, kE4M3, wpq.scale_inv, Tensor(),
                                           dtype);
                 const Fp8Matrix gpq = kernels::fp8_cast_gelu_backward(g_pre, pre, kE5M2, {need[0], need[1], need[2]});
                 if (need[2]) gb_fc = bias_grad_from_sums(gpq.column_sums, dt_fc);
                 if (need[1]) gw_fc = gemm_tt(gpq, xq, dt_fc);
                 if (need[0]) gx = raw::view(gemm_t(gpq, wfq, dtype), xs);
               } else {
                 g_pre = kernels::fp8_gemm(gq.codes, kE5M2, gq.scale_inv, wpq.codes_t, kE4M3, wpq.scale_inv, Tensor(),
                                           dtype, Fp8Epilogue::DGelu, pre);
                 if (need[2]) gb_fc = bias_grad(g_pre, dt_fc);
               }
             }
           } else if (need[4]) {
             gb_proj = bias_grad(g2, dt_proj);
           }
           return Grads{gx, gw_fc, gb_fc, gw_proj, gb_proj};
         });
  return out;
}

}  // namespace mg::autograd
