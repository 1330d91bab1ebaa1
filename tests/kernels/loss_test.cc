// The fused cross-entropy kernels (kernels/loss.h) against the composed definition
// (log_softmax + nll, softmax - onehot) on the CPU, and CUDA against CPU when a GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/device_runtime.h"
#include "core/random.h"
#include "kernels/ops.h"
#include "kernels/ops.h"

namespace mg {
namespace {
namespace k = mg::kernels;

Tensor targets(const std::vector<int64_t>& v) { return from_vector(v, {static_cast<int64_t>(v.size())}); }

TEST(CrossEntropyFused, MatchesLogSoftmaxNllAndSoftmaxMinusOnehot) {
  Generator g(3);
  Tensor x = uniform({5, 7}, -4, 4, {DType::f64}, &g);
  Tensor t = targets({0, 6, 3, -100, 2});
  for (double e : {0.0, 0.1}) {
    auto [loss, lse] = k::cross_entropy_forward(x, t, -100, e);
    ASSERT_EQ(loss.dtype(), DType::f64);
    Tensor lp = k::log_softmax(x, 1);
    std::vector<double> lpv = lp.to_vector<double>(), lv = loss.to_vector<double>(), lsev = lse.to_vector<double>(),
                        xv = x.to_vector<double>();
    std::vector<int64_t> tv = t.to_vector<int64_t>();
    Tensor coef = from_vector(std::vector<double>{0.5, -1.0, 2.0, 3.0, 1.5}, {5});
    std::vector<double> gv = k::cross_entropy_backward(coef, x, t, lse, -100, e).to_vector<double>();
    for (int64_t i = 0; i < 5; ++i) {
      double want = 0, smooth = 0;
      for (int64_t j = 0; j < 7; ++j) smooth -= lpv[i * 7 + j];
      if (tv[i] != -100) want = (1 - e) * -lpv[i * 7 + tv[i]] + e / 7 * smooth;
      EXPECT_NEAR(lv[i], want, 1e-12) << "row " << i << " e " << e;
      EXPECT_NEAR(lsev[i], xv[i * 7] - lpv[i * 7], 1e-12);
      const double c = std::vector<double>{0.5, -1.0, 2.0, 3.0, 1.5}[i];
      for (int64_t j = 0; j < 7; ++j) {
        const double p = std::exp(lpv[i * 7 + j]);
        const double want_g = tv[i] == -100 ? 0.0 : c * (p - e / 7 - (j == tv[i] ? 1 - e : 0.0));
        EXPECT_NEAR(gv[i * 7 + j], want_g, 1e-12) << i << "," << j;
      }
    }
  }
}

// cross_entropy_forward_backward is the two calls: the same loss, lse and gradient to the bit (CPU
// runs them in turn), into a separate `out` or over the logits; its argument errors name it.
TEST(CrossEntropyFused, ForwardBackwardIsTheTwoCalls) {
  Generator g(4);
  const Tensor x = uniform({5, 7}, -4, 4, {DType::f64}, &g);
  const Tensor t = targets({0, 6, 3, -100, 2});
  const Tensor coef = from_vector(std::vector<double>{0.5, -1.0, 2.0, 3.0, 1.5}, {5});
  for (double e : {0.0, 0.1}) {
    auto [loss, lse] = k::cross_entropy_forward(x, t, -100, e);
    const Tensor grad = k::cross_entropy_backward(coef, x, t, lse, -100, e);
    const Tensor out = empty({5, 7}, {DType::f64});
    auto [floss, flse] = k::cross_entropy_forward_backward(x, t, -100, e, coef, out);
    EXPECT_EQ(floss.to_vector<double>(), loss.to_vector<double>());
    EXPECT_EQ(flse.to_vector<double>(), lse.to_vector<double>());
    EXPECT_EQ(out.to_vector<double>(), grad.to_vector<double>());
    const Tensor over = x.clone();
    k::cross_entropy_forward_backward(over, t, -100, e, coef, over);
    EXPECT_EQ(over.to_vector<double>(), grad.to_vector<double>());
  }
  const Tensor out = empty({5, 7}, {DType::f64});
  EXPECT_THROW(k::cross_entropy_forward_backward(x, t, -100, 0.0, coef, Tensor()), ValueError);
  EXPECT_THROW(k::cross_entropy_forward_backward(x, t, -100, 0.0, from_vector(std::vector<double>{1, 2}, {2}), out),
               ShapeError);
  EXPECT_THROW(k::cross_entropy_forward_backward(x, t, -100, 0.0, coef, empty({5, 7}, {DType::f32})), ValueError);
  EXPECT_THROW(k::cross_entropy_forward_backward(x, t, -100, 0.0, coef, raw::slice(x, 1, 1, 7, 1)), ValueError);
  try {
    k::cross_entropy_forward_backward(x, targets({0, 7, 3, -100, 2}), -100, 0.0, coef, out);
    ADD_FAILURE() << "no error for class 7 of 7";
  } catch (const IndexError& err) {
    const std::string what = err.what();  // the CPU backend names the row too ("at position 1")
    EXPECT_NE(what.find("target 7"), std::string::npos) << what;
    EXPECT_NE(what.find("out of range for 7 classes"), std::string::npos) << what;
  }
}

// A masked vocabulary: -inf logits in a row leave its loss finite (the -inf terms add nothing
// to the logsumexp); without smoothing the loss is lse - x[t] exactly as for any row.
TEST(CrossEntropyFused, MaskedLogitsGiveAFiniteLoss) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = from_vector(std::vector<double>{-inf, -inf, 1.0, 2.0, 0.5, -inf}, {1, 6});
  auto [loss, lse] = k::cross_entropy_forward(x, targets({3}), -100, 0.0);
  const double want_lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5));
  EXPECT_NEAR(lse.to_vector<double>()[0], want_lse, 1e-12);
  EXPECT_NEAR(loss.to_vector<double>()[0], want_lse - 2.0, 1e-12);
}

TEST(CrossEntropyFused, BadTargetsAndShapes) {
  Tensor x = zeros({3, 4});
  EXPECT_THROW(k::cross_entropy_forward(x, targets({0, 4, 1}), -100, 0.0), IndexError);
  EXPECT_THROW(k::cross_entropy_forward(x, targets({0, 1}), -100, 0.0), ShapeError);
  EXPECT_THROW(k::cross_entropy_forward(x, targets({0, 1, 2}), -100, 2.0), ValueError);
  EXPECT_THROW(k::cross_entropy_forward(zeros({3}), targets({0, 1, 2}), -100, 0.0), ShapeError);
}

TEST(CrossEntropyFused, CudaMatchesCpu) {
  if (!mg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator g(5);
  // C = 50304 (GPT-2's padded vocab: 16-byte vector path), 37 (scalar path), 1000.
  for (int64_t C : {int64_t{50304}, int64_t{37}, int64_t{1000}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const int64_t M = 64;
      Tensor x = k::cast(uniform({M, C}, -6, 6, {DType::f32}, &g), dt);
      std::vector<int64_t> tv;
      for (int64_t i = 0; i < M; ++i) tv.push_back(i % 5 == 4 ? -100 : (i * 7919) % C);
      Tensor t = targets(tv);
      const Device cu = Device::cuda(0);
      for (double e : {0.0, 0.1}) {
        auto [l_c, s_c] = k::cross_entropy_forward(x, t, -100, e);
        auto [l_g, s_g] = k::cross_entropy_forward(raw::to_device(x, cu), raw::to_device(t, cu), -100, e);
        std::vector<float> a = l_c.to_vector<float>(), b = l_g.to_vector<float>();
        for (int64_t i = 0; i < M; ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * (1 + std::fabs(a[i]))) << C << " " << i;
        Tensor coef = uniform({M}, -1, 1, {DType::f32}, &g);
        Tensor gc = k::cast(k::cross_entropy_backward(coef, x, t, s_c, -100, e), DType::f32);
        Tensor gg = k::cast(k::cross_entropy_backward(raw::to_device(coef, cu), raw::to_device(x, cu),
                                                      raw::to_device(t, cu), s_g, -100, e),
                            DType::f32);
        std::vector<float> u = gc.to_vector<float>(), v = raw::to_device(gg, Device::cpu()).to_vector<float>();
        // f32: exp(x - lse) in f32 carries ~|x - lse| * 2^-24 relative error; halves round
        // the result to 8-11 bits. Plus a floor relative to the largest gradient.
        double big = 0;
        for (float w : u) big = std::max(big, static_cast<double>(std::fabs(w)));
        const double rel = dt == DType::f32 ? 2e-5 : 1e-2, floor = (dt == DType::f32 ? 1e-6 : 1e-3) * big;
        for (size_t i = 0; i < u.size(); ++i)
          ASSERT_NEAR(u[i], v[i], rel * std::fabs(u[i]) + floor) << "C " << C << " " << dt << " e " << e << " at " << i;
      }
    }
  EXPECT_THROW(k::cross_entropy_forward(raw::to_device(zeros({2, 3}), Device::cuda(0)),
                                        raw::to_device(targets({0, 3}), Device::cuda(0)), -100, 0.0),
               IndexError);
}

}  // namespace
}  // namespace mg
