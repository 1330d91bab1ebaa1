// The cross-entropy kernels on CUDA (kernels/cuda/loss.cu): the one-pass kernel against the two
// kernels (the same bits) and against an f64 reference with rounding-derived bounds, masked rows
// against the CPU, and the label check deferred in a kernels::DeferredIndexChecks scope. Skips
// without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/deferred_checks.h"
#include "kernels/ops.h"
#include "tests/autograd/gradcheck.h"
#include "tests/error_of.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/rounding.h"

namespace mg {
namespace {
namespace k = mg::kernels;
using namespace mg::testing;  // to_cuda, host, dstr, the CudaTest skip fixture, rounding bounds

class CudaLossParity : public CudaTest {
 protected:
  Generator g{20240607};
};

// cross_entropy_forward_backward on CUDA is the two calls to the bit: rows held in shared memory
// (50304 classes in f32/f16/bf16, 1000 in every dtype) run one fused kernel with the two kernels'
// arithmetic in their order (f16/bf16 over 50304: two rows a block, the next one's copy in flight);
// rows too long for it (50304 in f64) or of an odd length (37) run the two kernels. An ignored row, label smoothing, a
// per-row and a single coefficient, and the gradient into a separate tensor and over the logits.
TEST_F(CudaLossParity, CrossEntropyForwardBackwardIsTheTwoCalls) {
  const auto host_doubles = [](const Tensor& t) {
    return raw::to_device(k::cast(t, DType::f64), Device::cpu()).to_vector<double>();
  };
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
    for (int64_t C : {int64_t{50304}, int64_t{1000}, int64_t{37}}) {
      // 300 rows over 50304: more than the H200's 132 SMs, so the two-row kernel's blocks walk
      // several rows each and the next row's copy overlaps the current one's arithmetic.
      const int64_t M = C == 50304 ? 300 : 6;
      const Tensor logits = to_cuda(host({M, C}, dt, g, -8, 8));
      std::vector<int64_t> labels(M);
      std::vector<double> coefs(M);
      for (int64_t i = 0; i < M; ++i) {
        labels[i] = i % 5 == 2 ? -100 : i == 1 ? C - 1 : (i * 7919) % C;  // an ignored row every five
        coefs[i] = 0.25 * static_cast<double>(i % 7) - 0.5;
      }
      const Tensor t = to_cuda(from_vector<int64_t>(labels, {M}));
      const DType ad = dt == DType::f64 ? DType::f64 : DType::f32;
      const Tensor per_row = to_cuda(k::cast(from_vector<double>(coefs, {M}), ad));
      const Tensor single = to_cuda(k::cast(from_vector<double>({0.125}, {1}), ad));
      for (double e : {0.0, 0.1})
        for (const Tensor* coef : {&per_row, &single}) {
          const std::string what = std::string(dtype_name(dt)) + " C=" + std::to_string(C) + " e=" + std::to_string(e) +
                                   (coef == &single ? " one coef" : " per-row coef");
          auto [loss, lse] = k::cross_entropy_forward(logits, t, -100, e);
          const Tensor grad = k::cross_entropy_backward(*coef, logits, t, lse, -100, e);
          const Tensor out = empty({M, C}, {dt, Device::cuda(0)});
          auto [floss, flse] = k::cross_entropy_forward_backward(logits, t, -100, e, *coef, out);
          EXPECT_EQ(host_doubles(floss), host_doubles(loss)) << what;
          EXPECT_EQ(host_doubles(flse), host_doubles(lse)) << what;
          EXPECT_EQ(host_doubles(out), host_doubles(grad)) << what;
          const Tensor over = logits.clone();
          k::cross_entropy_forward_backward(over, t, -100, e, *coef, over);
          EXPECT_EQ(host_doubles(over), host_doubles(grad)) << what << " over the logits";
        }
    }
}

// The one-pass cross-entropy against an f64 reference from the same rounded logits, with bounds
// derived from each rounding, at lengths that take the shared-memory kernels (1000 classes, and
// GPT-2's 50304: two rows a block in f16/bf16): the target in every lane of a 16-byte vector (the
// gradient subtracts it in the one vector that holds it), at the row's first and last column, an
// ignored row, a per-row coefficient, with and without label smoothing.
TEST_F(CudaLossParity, CrossEntropyForwardBackwardMatchesF64) {
  const auto host_doubles = [](const Tensor& t) {
    return raw::to_device(k::cast(t, DType::f64), Device::cpu()).to_vector<double>();
  };
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (int64_t C : {int64_t{1000}, int64_t{50304}})
      for (double e : {0.0, 0.1}) {
        // Over 50304, more rows than the H200's 132 SMs: the blocks of the two-row kernel that walk a
        // second row take it from the buffer the first one's arithmetic overlapped.
        const int64_t M = C == 50304 ? 160 : 24;
        const Tensor logits = host({M, C}, dt, g, -8, 8);
        const std::vector<double> x = raw::to_dtype(logits, DType::f64).to_vector<double>();
        std::vector<int64_t> labels(M);
        std::vector<double> coefs(M);
        for (int64_t r = 0; r < M; ++r) {
          labels[r] = r == 0 ? 0 : r == 1 ? C - 1 : r == 5 ? -100 : 8 * ((r * 37) % (C / 8)) + r % 8;
          coefs[r] = 0.25 * static_cast<double>(r % 7) - 0.75;
        }
        const Tensor coef = to_cuda(from_vector<float>(std::vector<float>(coefs.begin(), coefs.end()), {M}));
        const Tensor t = to_cuda(from_vector<int64_t>(labels, {M}));
        const Tensor grad = empty({M, C}, {dt, Device::cuda(0)});
        auto [loss, lse] = k::cross_entropy_forward_backward(to_cuda(logits), t, -100, e, coef, grad);
        const std::vector<double> gl = host_doubles(loss), ge = host_doubles(lse), gg = host_doubles(grad);
        const double u = unit_roundoff(DType::f32), ud = unit_roundoff(dt), sum_bound = gamma_k(C, DType::f32);
        const double sub_half_spacing = std::ldexp(1.0, dt == DType::f16 ? -25 : dt == DType::bf16 ? -134 : -150);
        const std::string what = dstr(dt) + " C=" + std::to_string(C) + " e=" + std::to_string(e);
        for (int64_t r = 0; r < M; ++r) {
          const double* xr = x.data() + r * C;
          double m = xr[0], s = 0, sx = 0, ax = 0;
          for (int64_t j = 0; j < C; ++j) m = std::max(m, xr[j]);
          for (int64_t j = 0; j < C; ++j) s += std::exp(xr[j] - m), sx += xr[j], ax += std::abs(xr[j]);
          const double l = m + std::log(s);
          // lse: the f32 sum of C terms in the kernel's order (gamma_C relative); each term's exp off
          // by its argument's roundings (x - m and the product by log2 e: about 2 u |x - m|) and the
          // fast exp's (a few u), once for the term and once for each rescale of a running sum (at most
          // one a vector a thread, 13 over 50304, and one a merge, 9): 64 u (|m| + |lse| + 4) in
          // all; then the log's few ulps of the result.
          const double lse_bound = sum_bound + 64 * u * (std::abs(m) + std::abs(l) + 4) + 4 * u * std::abs(l);
          EXPECT_NEAR(ge[r], l, lse_bound) << what << " lse row " << r;
          const int64_t tr = labels[r];
          if (tr == -100) {
            EXPECT_EQ(gl[r], 0.0) << what << " ignored row " << r;
          } else {
            const double ref = l - (1 - e) * xr[tr] - e / static_cast<double>(C) * sx;
            // lse's error, plus f32 roundings of the two terms (the smoothing sum: gamma_C of sum |x|).
            const double bound = lse_bound + 4 * u * (std::abs(l) + std::abs(xr[tr])) + e / C * sum_bound * ax;
            EXPECT_NEAR(gl[r], ref, bound) << what << " loss row " << r;
          }
          // The gradient from the kernel's own lse (its error is bounded above): c (p - e / C - (1 -
          // e) [j = t]) with p = exp(x - lse) good to the exp's argument rounding and the fast exp
          // (16 u (|x| + |lse| + 2)), the f32 arithmetic after it (4 u of the terms; a p under
          // 2^-126 may be flushed to 0), then the rounding to dt: ud of the result, or half the
          // subnormal spacing below dt's normal range.
          const double c = tr == -100 ? 0.0 : static_cast<double>(static_cast<float>(coefs[r]));
          for (int64_t j = 0; j < C; ++j) {
            const double p = std::exp(xr[j] - ge[r]), hit = j == tr ? 1 - e : 0.0;
            const double ref = c * (p - e / static_cast<double>(C) - hit);
            const double terms = std::abs(c) * (p + e / static_cast<double>(C) + hit);
            const double pre = std::abs(c) * p * 16 * u * (std::abs(xr[j]) + std::abs(ge[r]) + 2) + 4 * u * terms +
                               std::abs(c) * std::ldexp(1.0, -126);
            const double bound = pre + ud * (std::abs(ref) + pre) + sub_half_spacing;
            if (std::abs(gg[r * C + j] - ref) > bound) {
              ADD_FAILURE() << what << " grad row " << r << " col " << j << " (target " << tr << "): " << gg[r * C + j]
                            << " vs " << ref << " bound " << bound;
              break;
            }
          }
        }
      }
}

// The fused cross-entropy forward over rows that start with -inf (a masked vocabulary: the
// vector kernel's first eight values all -inf, then some), in each float dtype at GPT-2's
// vocabulary: the loss and logsumexp match the CPU's.
TEST_F(CudaLossParity, CrossEntropyMaskedLogits) {
  const int64_t M = 3, C = 50304;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor r = randn({M * C}, {DType::f32}, &g);
    std::vector<float> v = r.to_vector<float>();
    for (int64_t j = 0; j < 8; ++j) v[j] = -INFINITY;         // row 0: a whole first vector
    for (int64_t j = 0; j < C; j += 3) v[C + j] = -INFINITY;  // row 1: every third value
    Tensor logits = raw::to_dtype(from_vector(v, {M, C}), dt);
    Tensor target = from_vector<int64_t>({9, 1, 17}, {M});
    auto [loss, lse] = k::cross_entropy_forward(logits, target, -100, 0.0);
    auto [gloss, glse] = k::cross_entropy_forward(to_cuda(logits), to_cuda(target), -100, 0.0);
    // Both devices read the same rounded logits and sum in f32 (in different orders): f32's
    // tolerance of the parity tests (1e-5).
    EXPECT_TRUE(parity(loss, gloss, 1e-5)) << "cross_entropy loss " << dstr(dt);
    EXPECT_TRUE(parity(lse, glse, 1e-5)) << "cross_entropy lse " << dstr(dt);
  }
}

// cross_entropy's label check in a kernels::DeferredIndexChecks scope: the call does not raise, the
// bad row's loss is NaN, the other rows' losses are the ones a clean call gives (the same kernel:
// equal bits), the gradient stays finite, and finish() raises the call's own IndexError word for
// word; without finish() nothing is raised.
TEST_F(CudaLossParity, CrossEntropyLabelCheckDeferredInAScope) {
  const Tensor logits = to_cuda(host({4, 7}, DType::f32, g));
  const Tensor good = to_cuda(from_vector<int64_t>({0, 6, -100, 3}, {4}));
  const Tensor bad = to_cuda(from_vector<int64_t>({0, 6, 7, 3}, {4}));  // row 2: class 7 of 7
  const std::string direct = error_of<IndexError>([&] { k::cross_entropy_forward(logits, bad, -100, 0.0); });
  EXPECT_NE(direct.find("target 7"), std::string::npos) << direct;
  const auto host_floats = [](const Tensor& t) { return raw::to_device(t, Device::cpu()).to_vector<float>(); };
  const std::vector<float> clean = host_floats(std::get<0>(k::cross_entropy_forward(logits, good, -100, 0.0)));
  {
    k::DeferredIndexChecks scope;
    std::tuple<Tensor, Tensor> out;
    EXPECT_NO_THROW(out = k::cross_entropy_forward(logits, bad, -100, 0.0));
    const Tensor grad = k::cross_entropy_backward(full_like(std::get<0>(out), 0.25), logits, bad, std::get<1>(out),
                                                  -100, 0.0, Tensor());
    EXPECT_EQ(scope.pending(), 1u);
    EXPECT_EQ(error_of<IndexError>([&] { scope.finish(); }), direct);
    const std::vector<float> got = host_floats(std::get<0>(out));
    EXPECT_TRUE(std::isnan(got[2]));
    for (int r : {0, 1, 3}) EXPECT_EQ(got[r], clean[r]) << "row " << r;
    for (float v : host_floats(grad)) EXPECT_TRUE(std::isfinite(v));
  }
  {
    k::DeferredIndexChecks left;  // destroyed without finish(): nothing raised
    k::cross_entropy_forward(logits, bad, -100, 0.0);
  }
  {
    k::DeferredIndexChecks scope;
    k::cross_entropy_forward(logits, good, -100, 0.0);
    EXPECT_NO_THROW(scope.finish());
  }
  {  // the one-pass forward and backward (rows of 1000 held in shared memory) defers the same way
    const Tensor wide = to_cuda(host({4, 1000}, DType::f32, g)),
                 wide_bad = to_cuda(from_vector<int64_t>({0, 1000, 5, 9}, {4}));
    const Tensor coef = to_cuda(from_vector<float>({1.0f}, {1}));
    const Tensor out = empty({4, 1000}, {DType::f32, Device::cuda(0)});
    const std::string wide_direct =
        error_of<IndexError>([&] { k::cross_entropy_forward_backward(wide, wide_bad, -100, 0.0, coef, out); });
    EXPECT_NE(wide_direct.find("target 1000"), std::string::npos) << wide_direct;
    k::DeferredIndexChecks scope;
    EXPECT_NO_THROW(k::cross_entropy_forward_backward(wide, wide_bad, -100, 0.0, coef, out));
    EXPECT_EQ(error_of<IndexError>([&] { scope.finish(); }), wide_direct);
  }
}

}  // namespace
}  // namespace mg
