// softmax / log_softmax along any dim, stability with large logits, backward formulas.
#include <cmath>

#include "tests/kernels/test_util.h"
#include "tests/rounding.h"

namespace mg {
namespace {
using namespace mg::testing;
namespace k = mg::kernels;

std::vector<double> ref_softmax_rows(const std::vector<double>& v, int64_t rows, int64_t K, bool log) {
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < K; ++j) mx = std::max(mx, v[r * K + j]);
    for (int64_t j = 0; j < K; ++j) s += std::exp(v[r * K + j] - mx);
    for (int64_t j = 0; j < K; ++j)
      out[r * K + j] = log ? v[r * K + j] - mx - std::log(s) : std::exp(v[r * K + j] - mx) / s;
  }
  return out;
}

TEST(Softmax, RowsSumToOneAndMatchReference) {
  Generator g(30);
  Tensor a = randn({4, 10}, {DType::f64}, &g);
  Tensor s = k::softmax(a, 1);
  expect_near(s, ref_softmax_rows(vals(a), 4, 10, false), 1e-12);
  expect_near(k::sum(s, {1}), {1, 1, 1, 1}, 1e-12);
  expect_near(k::log_softmax(a, -1), ref_softmax_rows(vals(a), 4, 10, true), 1e-12);
  Tensor s32 = k::softmax(k::cast(a, DType::f32), 1);
  EXPECT_EQ(s32.dtype(), DType::f32);
  expect_near(s32, ref_softmax_rows(vals(a), 4, 10, false), 1e-5);
}

TEST(Softmax, AnyDim) {
  Generator g(31);
  Tensor a = randn({3, 4, 5}, {DType::f64}, &g);
  for (int64_t d = 0; d < 3; ++d) {
    // Move dim d last, compute by rows, compare with the kernel along d.
    Shape perm;
    for (int64_t i = 0; i < 3; ++i)
      if (i != d) perm.push_back(i);
    perm.push_back(d);
    Tensor moved = raw::contiguous(raw::permute(a, perm));
    const int64_t K = a.size(d), rows = a.numel() / K;
    for (bool log : {false, true}) {
      Tensor r = log ? k::log_softmax(a, d) : k::softmax(a, d);
      Tensor rm = raw::permute(r, perm);
      expect_near(rm, ref_softmax_rows(vals(moved), rows, K, log), 1e-12);
    }
  }
  // Non-contiguous input.
  Tensor at = raw::transpose(a, 0, 2);
  expect_close(k::softmax(at, 0), raw::transpose(k::softmax(a, 2), 0, 2), 1e-12);
}

TEST(Softmax, LargeLogitsStayFinite) {
  Tensor a = T({1000, 0, -1000, 1000, 1000, 999}, {2, 3});
  Tensor s = k::softmax(a, 1);
  EXPECT_FALSE(k::has_nonfinite(s));
  expect_near(s, {1, 0, 0, 1 / (2 + std::exp(-1.0)), 1 / (2 + std::exp(-1.0)), std::exp(-1.0) / (2 + std::exp(-1.0))},
              1e-6);
  Tensor ls = k::log_softmax(a, 1);
  EXPECT_FALSE(k::has_nonfinite(ls));
  expect_near(ls,
              {0, -1000, -2000, -std::log(2 + std::exp(-1.0)), -std::log(2 + std::exp(-1.0)),
               -1 - std::log(2 + std::exp(-1.0))},
              1e-6);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor h = k::softmax(k::cast(a, dt), 1);
    EXPECT_EQ(h.dtype(), dt);
    EXPECT_FALSE(k::has_nonfinite(h));
    // Against the f64 softmax of the rounded logits: the f32 computation (3 exps, a 3-term sum,
    // a division: 8 u(f32) relative) and one rounding to dt (u(dt) relative); 0 stays 0.
    Tensor ref = k::softmax(rounded_f64(a, dt), 1);
    std::vector<double> bound;
    for (double p : vals(ref)) bound.push_back((unit_roundoff(dt) + 8 * unit_roundoff(DType::f32)) * p);
    EXPECT_TRUE(within(h, ref, bound)) << dt;
  }
  // -inf entries get probability 0.
  expect_near(k::softmax(T({-INFINITY, 0}, {2}), 0), {0, 1});
}

TEST(Softmax, BackwardFormulas) {
  Generator g(32);
  Tensor a = randn({3, 6}, {DType::f64}, &g), gr = randn({3, 6}, {DType::f64}, &g);
  Tensor y = k::softmax(a, 1);
  std::vector<double> vy = vals(y), vg = vals(gr), want(18);
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int j = 0; j < 6; ++j) s += vg[r * 6 + j] * vy[r * 6 + j];
    for (int j = 0; j < 6; ++j) want[r * 6 + j] = vy[r * 6 + j] * (vg[r * 6 + j] - s);
  }
  expect_near(k::softmax_backward(gr, y, 1), want, 1e-12);
  Tensor ly = k::log_softmax(a, 1);
  std::vector<double> vly = vals(ly);
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int j = 0; j < 6; ++j) s += vg[r * 6 + j];
    for (int j = 0; j < 6; ++j) want[r * 6 + j] = vg[r * 6 + j] - std::exp(vly[r * 6 + j]) * s;
  }
  expect_near(k::log_softmax_backward(gr, ly, -1), want, 1e-12);
  // Finite-difference check of the softmax backward along dim 0.
  Tensor y0 = k::softmax(a, 0);
  Tensor gin = k::softmax_backward(gr, y0, 0);
  std::vector<double> va = vals(a);
  for (int idx : {0, 7, 17}) {
    auto f = [&](double delta) {
      std::vector<double> p = va;
      p[idx] += delta;
      Tensor yy = k::softmax(from_vector(p, {3, 6}), 0);
      std::vector<double> v = vals(yy);
      double s = 0;
      for (int i = 0; i < 18; ++i) s += v[i] * vg[i];
      return s;
    };
    EXPECT_NEAR(vals(gin)[idx], (f(1e-6) - f(-1e-6)) / 2e-6, 1e-6);
  }
}

TEST(Softmax, EdgeCasesAndErrors) {
  EXPECT_EQ(k::softmax(zeros({0, 5}), 1).numel(), 0);
  EXPECT_EQ(k::softmax(zeros({3, 0}), 1).numel(), 0);
  EXPECT_EQ(k::softmax(scalar_tensor(3.0), 0).item(), 1);
  EXPECT_MG_ERROR(k::softmax(zeros({2, 3}), 2), IndexError, "softmax");
  EXPECT_MG_ERROR(k::log_softmax(zeros({2, 3}, {DType::i64}), 1), DTypeError, "log_softmax");
  EXPECT_MG_ERROR(k::softmax_backward(zeros({2, 3}), zeros({3, 2}), 1), ShapeError, "softmax_backward");
}

}  // namespace
}  // namespace mg
