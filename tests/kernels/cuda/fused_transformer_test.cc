// The GPT block's fused kernels on CUDA against f64 references computed on the CPU from the
// very (already rounded) values the device saw, at the block's own sizes:
//   - add_layer_norm with an f32 residual stream, an f32/f16/bf16 branch, an f32/f16/bf16
//     output and with or without the branch's bias (the mixed dtypes the op table, whose
//     inputs share one dtype, cannot express), forward and backward;
//   - gelu_mlp forward and the gradient reaching the GELU's argument (cuBLASLt's GELU and
//     DGELU epilogues in bf16, the GEMM and GELU kernels in f32).
// Bounds are derived per element from the roundings each path performs (see each test).
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/functions.h"
#include "autograd/transformer_functions.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/rounding.h"

namespace mg {
namespace {
namespace k = mg::kernels;
using namespace mg::testing;  // to_cuda, host, dstr, CudaTest, unit_roundoff, gamma_k, within

class FusedTransformer : public CudaTest {};

std::vector<double> values(const Tensor& t) { return raw::to_dtype(t, DType::f64).to_vector<double>(); }
Tensor f64(const Tensor& t) { return raw::to_dtype(raw::to_device(t, Device::cpu()), DType::f64); }

// ---------------------------------------------------------------- add_layer_norm

// Row statistics on the device are two-level sums: n/32 terms per lane in sequence, then 5
// warp-shuffle levels; each is off by at most gamma_k(f32) relative to the sum of magnitudes.
double row_gamma(int64_t n) { return gamma_k((n + 31) / 32 + 5, DType::f32); }

TEST_F(FusedTransformer, AddLayerNormMatchesF64ForMixedDtypes) {
  const double u32 = unit_roundoff(DType::f32);
  // 768, 1024, 256: the backward's one-pass kernel (rows of 128 kG elements), 256 over enough
  // rows that each warp takes several and the block partials are many; 1280, 1600 (GPT-2 large's
  // and XL's) and 100: the separate partial-sum pass; 66: the scalar path (n % 4 != 0).
  for (int64_t n : {768, 1024, 256, 1280, 1600, 100, 66}) {
    for (DType rdt : {DType::f32, DType::bf16, DType::f16}) {
      for (DType odt : {DType::bf16, DType::f16, DType::f32}) {
        // Half of the combinations add the branch's bias (a GPT-2 block's c_proj bias) too.
        const bool with_rb = odt != DType::f32;
        SCOPED_TRACE("n " + std::to_string(n) + " residual " + dstr(rdt) + " out " + dstr(odt) +
                     (with_rb ? " with the residual bias" : ""));
        Generator g(static_cast<uint64_t>(n) * 7 + static_cast<uint64_t>(rdt) * 3 + static_cast<uint64_t>(odt));
        const int64_t m = n == 256 ? 5000 : 37;
        Tensor x = host({m, n}, DType::f32, g), res = host({m, n}, rdt, g);
        Tensor w = host({n}, DType::f32, g, 0.5, 1.5), b = host({n}, DType::f32, g);
        Tensor rb = with_rb ? host({n}, DType::f32, g) : Tensor();
        Tensor gy = host({m, n}, odt, g), gh = host({m, n}, DType::f32, g);
        auto [h, y, mean, rstd] = k::add_layer_norm_forward(to_cuda(x), to_cuda(res), {n}, to_cuda(w), to_cuda(b), 1e-5,
                                                            odt, with_rb ? to_cuda(rb) : Tensor());
        ASSERT_EQ(h.dtype(), DType::f32);
        ASSERT_EQ(y.dtype(), odt);
        // h: x + res rounded once in f32; with the bias, a = x + res rounded and then a + rb
        // rounded: within u32 |a| (1 + u32) + u32 |h|.
        Tensor a_ref = k::add(f64(x), f64(res));
        Tensor h_ref = with_rb ? k::add(a_ref, f64(rb)) : a_ref;
        std::vector<double> hb;
        const std::vector<double> av = values(a_ref), hrv = values(h_ref);
        for (size_t e = 0; e < av.size(); ++e)
          hb.push_back(with_rb ? u32 * (1 + u32) * std::abs(av[e]) + u32 * std::abs(hrv[e]) : u32 * std::abs(hrv[e]));
        EXPECT_TRUE(within(f64(h), h_ref, hb));
        // y against the f64 norm of the device's own (rounded) h: the mean and variance sums
        // (row_gamma each, relative to |h| sums, i.e. about |xhat| + 1 in units of the row's
        // deviation for N(0, 1) rows), rstd (half the variance's error, plus the sqrt and
        // division roundings), the products by rstd and w and the bias add (a few u32 each):
        // within 8 row_gamma (|xhat| + 1) |w|, plus u32 |b| and the final rounding u(out) |y|.
        auto [y_ref, m_ref, r_ref] = k::layer_norm_forward(f64(h), {n}, f64(w), f64(b), 1e-5);
        const std::vector<double> yr = values(y_ref), hv = values(h), mr = values(m_ref), rr = values(r_ref);
        const std::vector<double> wv = values(w), bv = values(b);
        std::vector<double> yb;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            const double xhat = (hv[i * n + j] - mr[i]) * rr[i];
            yb.push_back(unit_roundoff(odt) * std::abs(yr[i * n + j]) +
                         8 * row_gamma(n) * (std::abs(xhat) + 1) * std::abs(wv[j]) + u32 * std::abs(bv[j]));
          }
        EXPECT_TRUE(within(f64(y), y_ref, yb));

        // Backward: grad of h = gh + layer norm backward of gy, from the device's mean/rstd.
        const k::AddLayerNormGrads gr =
            k::add_layer_norm_backward(to_cuda(gy), to_cuda(gh), h, {n}, mean, rstd, to_cuda(w), rdt, DType::f32,
                                       {true, true, true, true, with_rb});
        const Tensor &gx = gr.x, &glow = gr.residual, &gw = gr.weight, &gb = gr.bias;
        ASSERT_TRUE(gx.defined() && glow.defined() && gw.defined() && gb.defined());
        ASSERT_EQ(gr.residual_bias.defined(), with_rb);
        EXPECT_EQ(gx.dtype(), DType::f32);
        EXPECT_EQ(glow.dtype(), rdt);
        auto [gx_ln, gw_ref, gb_ref] = k::layer_norm_backward(f64(gy), f64(h), {n}, f64(mean), f64(rstd), f64(w));
        Tensor gx_ref = k::add(gx_ln, f64(gh));
        // dx = r (g w - mean(g w) - xhat mean(g w xhat)) + gh: the two row means are row sums
        // (row_gamma relative to the sums of |g w| and |g w xhat|), xhat's own error is
        // u32-sized; so within 4 row_gamma r (|g w| + mean|g w| (1 + |xhat|) + mean|g w xhat|
        // (1 + |xhat|)) plus the final add's u32 |dx|. The low copy adds its rounding u(rdt) |dx|.
        const std::vector<double> gyv = values(gy), gxr = values(gx_ref);
        std::vector<double> dxb, lowb;
        for (int64_t i = 0; i < m; ++i) {
          double sgw = 0, sgwx = 0;
          for (int64_t j = 0; j < n; ++j) {
            const double xhat = (hv[i * n + j] - mr[i]) * rr[i];
            sgw += std::abs(gyv[i * n + j] * wv[j]);
            sgwx += std::abs(gyv[i * n + j] * wv[j] * xhat);
          }
          sgw /= n, sgwx /= n;
          for (int64_t j = 0; j < n; ++j) {
            const double xhat = std::abs((hv[i * n + j] - mr[i]) * rr[i]);
            const double e = 4 * row_gamma(n) * rr[i] * (std::abs(gyv[i * n + j] * wv[j]) + (sgw + sgwx) * (1 + xhat)) +
                             2 * u32 * std::abs(gxr[i * n + j]);
            dxb.push_back(e);
            lowb.push_back(e + unit_roundoff(rdt) * std::abs(gxr[i * n + j]));
          }
        }
        EXPECT_TRUE(within(f64(gx), gx_ref, dxb));
        EXPECT_TRUE(within(f64(glow), gx_ref, lowb));
        // dweight / dbias: column sums over the m rows (per-chunk partials, then the chunks),
        // within gamma_m(f32) of the sums of |g xhat| and |g|, plus xhat's error (a few u32
        // |xhat| per term, covered by doubling the bound).
        std::vector<double> wb(n, 0), bb(n, 0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            const double xhat = std::abs((hv[i * n + j] - mr[i]) * rr[i]);
            wb[j] += 2 * gamma_k(m, DType::f32) * std::abs(gyv[i * n + j]) * (xhat + 1);
            bb[j] += 2 * gamma_k(m, DType::f32) * std::abs(gyv[i * n + j]);
          }
        EXPECT_TRUE(within(f64(gw), gw_ref, wb));
        EXPECT_TRUE(within(f64(gb), gb_ref, bb));
        if (with_rb) {
          // The residual bias's gradient: column sums of the device's dx over the m rows. With
          // e_i the bound of term i, |fl(sum d_i) - sum dx_i| <= gamma_m sum |d_i| + sum e_i <=
          // gamma_m sum |dx_i| + (1 + gamma_m) sum e_i.
          EXPECT_EQ(gr.residual_bias.dtype(), DType::f32);
          std::vector<double> rbb(n, 0);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
              rbb[j] +=
                  gamma_k(m, DType::f32) * std::abs(gxr[i * n + j]) + (1 + gamma_k(m, DType::f32)) * dxb[i * n + j];
          EXPECT_TRUE(within(f64(gr.residual_bias), k::sum(gx_ref, {0}), rbb));
        }
      }
    }
  }
}

// A GPT-2 block's layer norm weight gradient at its own size (8 x 1024 rows of 768), f32, from
// the one-pass backward: each warp adds its rows' g * xhat (ceil(rows / (8 chunks)) terms), the
// block its 8 warps' sums, then the chunks' partials are added in f64 and rounded once. So each
// column is within gamma_d(f32) of its sum of magnitudes with d = that depth + 8 + 1, doubled
// for xhat's own few-u32 error: the launch's depth, not gamma_rows. Prints the normwise error
// against f64 (the figure torch.nn.functional.layer_norm's CUDA backward is compared by).
TEST_F(FusedTransformer, LayerNormWeightGradientAtGptSizeIsNearF64) {
  const int64_t m = 8192, n = 768;
  Generator g(2024);
  Tensor x = host({m, n}, DType::f32, g), res = host({m, n}, DType::f32, g);
  Tensor w = host({n}, DType::f32, g, 0.5, 1.5), b = host({n}, DType::f32, g);
  Tensor gy = host({m, n}, DType::f32, g), gh = host({m, n}, DType::f32, g);
  auto [h, y, mean, rstd] =
      k::add_layer_norm_forward(to_cuda(x), to_cuda(res), {n}, to_cuda(w), to_cuda(b), 1e-5, DType::f32, Tensor());
  const k::AddLayerNormGrads gr = k::add_layer_norm_backward(to_cuda(gy), to_cuda(gh), h, {n}, mean, rstd, to_cuda(w),
                                                             DType::f32, DType::f32, {true, false, true, true, false});
  auto [gx_ref, gw_ref, gb_ref] = k::layer_norm_backward(f64(gy), f64(h), {n}, f64(mean), f64(rstd), f64(w));
  const std::vector<double> got = values(gr.weight), want = values(gw_ref);
  const std::vector<double> gyv = values(gy), hv = values(h), mr = values(mean), rr = values(rstd);
  // The chunks as the launcher picks them: three blocks an SM, never more than the rows need.
  const int64_t chunks = std::min<int64_t>((m + 7) / 8, 3 * cuda::get_device_properties(0).multi_processor_count);
  const int64_t depth = (m + 8 * chunks - 1) / (8 * chunks) + 8 + 1;
  std::vector<double> bound(n, 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      bound[j] +=
          2 * gamma_k(depth, DType::f32) * std::abs(gyv[i * n + j]) * (std::abs((hv[i * n + j] - mr[i]) * rr[i]) + 1);
  double err2 = 0, ref2 = 0;
  for (int64_t j = 0; j < n; ++j) {
    err2 += (got[j] - want[j]) * (got[j] - want[j]);
    ref2 += want[j] * want[j];
  }
  std::cout << "[layer norm dweight, 8192 x 768 f32] normwise error against f64: " << std::sqrt(err2 / ref2)
            << " (summation depth " << depth << ", " << chunks << " chunks)" << std::endl;
  EXPECT_TRUE(within(f64(gr.weight), gw_ref, bound));
}

// Without a residual the input is normalized and returned as h; with a residual and no
// gradient for the branch, the low copy is not written. n = 66 takes the scalar path (n % 4 !=
// 0), whose per-row arithmetic is layer_norm's warp kernel's, operation for operation.
TEST_F(FusedTransformer, AddLayerNormWithoutResidualAndMasks) {
  Generator g(3);
  Tensor x = to_cuda(host({8, 66}, DType::f32, g)), w = to_cuda(host({66}, DType::f32, g));
  auto [h, y, mean, rstd] = k::add_layer_norm_forward(x, Tensor(), {66}, w, Tensor(), 1e-5, DType::bf16);
  EXPECT_EQ(values(h), values(x));
  auto [y_ref, m_ref, r_ref] = k::layer_norm_forward(x, {66}, w, Tensor(), 1e-5);
  // Same kernel math as layer_norm's warp-per-row kernel, then one rounding to bf16.
  EXPECT_EQ(values(y), values(raw::to_dtype(y_ref, DType::bf16)));
  Tensor gy = to_cuda(host({8, 66}, DType::bf16, g));
  const k::AddLayerNormGrads gr = k::add_layer_norm_backward(gy, Tensor(), h, {66}, mean, rstd, w, DType::bf16,
                                                             DType::f32, {true, false, false, true, false});
  const Tensor &gx = gr.x, &glow = gr.residual, &gw = gr.weight, &gb = gr.bias;
  EXPECT_TRUE(gx.defined());
  EXPECT_FALSE(glow.defined());
  EXPECT_FALSE(gw.defined());
  EXPECT_TRUE(gb.defined());
  EXPECT_FALSE(gr.residual_bias.defined());
  auto [gx_ref, gw_ref, gb_ref] =
      k::layer_norm_backward(raw::to_dtype(gy, DType::f32), x, {66}, mean, rstd, w, {true, false, true});
  // The same per-row math on the same f32 values (the bf16 gradient widened exactly).
  EXPECT_EQ(values(gx), values(gx_ref));
  EXPECT_EQ(values(gb), values(gb_ref));
}

// ---------------------------------------------------------------- gelu_mlp

double gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

// Forward at a GPT-like shape (bf16: the epilogue; f32: GEMM, then the GELU kernel), against
// f64 from the rounded inputs.
// pre = x w^T + b accumulates k products in f32: off by gamma_k(f32) (|x| |w|^T + |b|). The
// epilogue's GELU reads that accumulator (|gelu'| <= 1.13) and may evaluate tanh with the
// hardware approximation (relative error <= 2^-11 on sm_90, so gelu is off by 2^-12 |pre|),
// then h is rounded: e_h = u(dt) |h| + 1.13 e_pre + 2^-12 |pre|. out = h w2^T + b2 adds
// |w2| e_h, its own f32 accumulation gamma_H (|h| |w2|^T + |b2|) and a rounding u(dt) |out|;
// second-order terms (a rounding of an error) are covered by a factor 1.1.
TEST_F(FusedTransformer, GeluMlpForwardMatchesF64) {
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dstr(dt));
    Generator g(11);
    const int64_t rows = 96, c = 128, hidden = 512;
    Tensor x = host({rows, c}, dt, g), w1 = host({hidden, c}, dt, g, -0.2, 0.2), b1 = host({hidden}, dt, g);
    Tensor w2 = host({c, hidden}, dt, g, -0.1, 0.1), b2 = host({c}, dt, g);
    Tensor out = gelu_mlp(to_cuda(x), to_cuda(w1), to_cuda(b1), to_cuda(w2), to_cuda(b2));
    ASSERT_EQ(out.dtype(), dt);
    const std::vector<double> xv = values(x), w1v = values(w1), b1v = values(b1), w2v = values(w2), b2v = values(b2);
    const double u = unit_roundoff(dt), g1 = gamma_k(c, DType::f32), g2 = gamma_k(hidden, DType::f32);
    std::vector<double> ref(rows * c), bound(rows * c);
    std::vector<double> h(hidden), eh(hidden);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < hidden; ++j) {
        double p = b1v[j], pa = std::abs(b1v[j]);
        for (int64_t i = 0; i < c; ++i)
          p += xv[r * c + i] * w1v[j * c + i], pa += std::abs(xv[r * c + i] * w1v[j * c + i]);
        h[j] = gelu_tanh(p);
        eh[j] = u * std::abs(h[j]) + 1.13 * g1 * pa + std::ldexp(std::abs(p), -12);
      }
      for (int64_t o = 0; o < c; ++o) {
        double y = b2v[o], ya = std::abs(b2v[o]), prop = 0;
        for (int64_t j = 0; j < hidden; ++j) {
          y += h[j] * w2v[o * hidden + j];
          ya += std::abs(h[j] * w2v[o * hidden + j]);
          prop += std::abs(w2v[o * hidden + j]) * eh[j];
        }
        ref[r * c + o] = y;
        bound[r * c + o] = 1.1 * (u * std::abs(y) + prop + g2 * ya);
      }
    }
    EXPECT_TRUE(within(f64(out), from_vector(ref, {rows, c}, {DType::f64}), bound));
  }
}

// The gradient reaching the GELU's argument, g_pre = (g @ w) * gelu'(pre), against f64 from the
// rounded inputs: bf16 through cuBLASLt's DGELU epilogue, f32 (TF32 off) through the GEMM and the
// GELU backward kernel. The f32 accumulation is off by gamma_k (|g| |w|); gelu' (|gelu'| <= 1.13)
// multiplies it, its tanh possibly the hardware approximation (relative error 2^-11, which moves
// gelu' by at most 2^-11 (0.5 + 0.8 |pre| (1 + 0.134 pre^2))). The GEMM's result is rounded to dt
// before the derivative multiplies it (the op-by-op path stores it; the epilogue rounds it too:
// the H200 showed 1.45 u(bf16) with one rounding allowed), then the product is: 2 u(dt) |g_pre|.
// Second-order terms are covered by a factor 1.1.
TEST_F(FusedTransformer, MatmulGeluBackwardMatchesF64) {
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dstr(dt));
    Generator g(12);
    const int64_t rows = 64, c = 96, hidden = 256;
    Tensor gout = host({rows, c}, dt, g), w = host({c, hidden}, dt, g, -0.2, 0.2);
    Tensor pre = host({rows, hidden}, dt, g, -3, 3);
    Tensor gpre = k::matmul_gelu_backward(to_cuda(gout), to_cuda(w), to_cuda(pre));
    ASSERT_EQ(gpre.sizes(), (Shape{rows, hidden}));
    ASSERT_EQ(gpre.dtype(), dt);
    const std::vector<double> gv = values(gout), wv = values(w), pv = values(pre);
    const double u = unit_roundoff(dt), gk = gamma_k(c, DType::f32);
    const double cst = std::sqrt(2.0 / M_PI);
    std::vector<double> ref(rows * hidden), bound(rows * hidden);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < hidden; ++j) {
        double s = 0, sa = 0;
        for (int64_t i = 0; i < c; ++i)
          s += gv[r * c + i] * wv[i * hidden + j], sa += std::abs(gv[r * c + i] * wv[i * hidden + j]);
        const double p = pv[r * hidden + j], t = std::tanh(cst * (p + 0.044715 * p * p * p));
        const double d = 0.5 * (1 + t) + 0.5 * p * (1 - t * t) * cst * (1 + 3 * 0.044715 * p * p);
        const double dd = std::ldexp(0.5 + 0.8 * std::abs(p) * (1 + 0.134 * p * p), -11);
        ref[r * hidden + j] = s * d;
        bound[r * hidden + j] = 1.1 * (2 * u * std::abs(s * d) + 1.13 * gk * sa + dd * std::abs(s));
      }
    EXPECT_TRUE(within(f64(gpre), from_vector(ref, {rows, hidden}, {DType::f64}), bound));
  }
}

// linear's weight and bias gradients on CUDA: gw from the weight-gradient GEMM, gb the column
// sum of g (memgrad's column reduction, or cuBLASLt's BGRADB epilogue under
// MG_BIAS_GRAD=epilogue). gb against the f64 sum of the same rounded g: f32 accumulation of
// `rows` terms in any order is within gamma_rows(f32) of the sum of |g|, then one rounding to
// gb's dtype (u(out) |gb|). GPT-2's widths (768, 2304, 3072) and an odd one (the scalar kernel).
TEST_F(FusedTransformer, LinearBiasGradientIsTheColumnSum) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const std::vector<DType> outs = dt == DType::f32 ? std::vector<DType>{dt} : std::vector<DType>{dt, DType::f32};
    for (DType out : outs) {
      for (int64_t n : {768, 2304, 3072, 77}) {
        SCOPED_TRACE(dstr(dt) + " -> " + dstr(out) + " n " + std::to_string(n));
        Generator g(static_cast<uint64_t>(n) + 3 * static_cast<uint64_t>(dt));
        const int64_t rows = 1500, kin = 64;
        Tensor gy = host({rows, n}, dt, g), x = host({rows, kin}, dt, g);
        auto [gw, gb] = k::linear_weight_grads(to_cuda(gy), to_cuda(x), true, out);
        ASSERT_TRUE(gb.defined());
        ASSERT_EQ(gb.dtype(), out);
        ASSERT_EQ(gw.dtype(), out);
        const std::vector<double> gv = values(gy);
        std::vector<double> ref(n, 0), mag(n, 0), bound(n);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < n; ++j) ref[j] += gv[i * n + j], mag[j] += std::abs(gv[i * n + j]);
        for (int64_t j = 0; j < n; ++j)
          bound[j] = gamma_k(rows, DType::f32) * mag[j] + unit_roundoff(out) * std::abs(ref[j]);
        EXPECT_TRUE(within(f64(gb), from_vector(ref, {n}, {DType::f64}), bound));
      }
    }
  }
}

// GEMM autotuning (kernels::set_gemm_autotune): the first cuBLASLt call of a shape times the
// heuristic's candidates on its own operands and keeps the fastest; whichever wins, the result is
// an f32 accumulation of the same products: within gamma_k(f32) of the sum of |x||w| (+ |b|), then
// one rounding to the output dtype. Shapes no other test uses, so their plans are made tuned.
TEST_F(FusedTransformer, AutotunedGemmsKeepTheirResults) {
  k::set_gemm_autotune(true);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dstr(dt));
    Generator g(5 + static_cast<uint64_t>(dt));
    const int64_t rows = 1000, kin = 200, n = 136;
    Tensor x = host({rows, kin}, dt, g), w = host({n, kin}, dt, g, -0.3, 0.3), b = host({n}, dt, g);
    for (int rep = 0; rep < 2; ++rep) {  // the tuning call, then the plan's chosen algorithm
      Tensor y = k::linear(to_cuda(x), to_cuda(w), to_cuda(b));
      const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
      std::vector<double> ref(rows * n), bound(rows * n);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n; ++o) {
          double s = bv[o], a = std::abs(bv[o]);
          for (int64_t i = 0; i < kin; ++i)
            s += xv[r * kin + i] * wv[o * kin + i], a += std::abs(xv[r * kin + i] * wv[o * kin + i]);
          ref[r * n + o] = s;
          bound[r * n + o] = gamma_k(kin + 1, DType::f32) * a + unit_roundoff(dt) * std::abs(s);
        }
      EXPECT_TRUE(within(f64(y), from_vector(ref, {rows, n}, {DType::f64}), bound));
    }
  }
  k::set_gemm_autotune(false);
}

}  // namespace
}  // namespace mg
