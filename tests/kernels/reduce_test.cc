// Reductions: sum/mean/var over dims with keepdim, max/min/argmax ties, sum_to, norms.
#include <cmath>

#include "tests/kernels/test_util.h"

namespace mg {
namespace {
using namespace mg::testing;
namespace k = mg::kernels;

// Naive reference: sum of a [2,3,4] tensor's values over a dim mask.
std::vector<double> ref_sum(const std::vector<double>& v, const Shape& s, std::vector<bool> red, bool mean) {
  Shape ks = s;
  for (size_t d = 0; d < s.size(); ++d)
    if (red[d]) ks[d] = 1;
  std::vector<double> out(shape_numel(ks), 0.0);
  Shape st = contiguous_strides(ks);
  int64_t count = shape_numel(s) / std::max<int64_t>(shape_numel(ks), 1);
  for (int64_t i = 0; i < shape_numel(s); ++i) {
    int64_t rem = i, o = 0;
    for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
      int64_t c = rem % s[d];
      rem /= s[d];
      if (!red[d]) o += c * st[d];
    }
    out[o] += v[i];
  }
  if (mean)
    for (double& x : out) x /= count;
  return out;
}

TEST(Reduce, SumMeanOverDims) {
  Generator g(10);
  Tensor a = randn({2, 3, 4}, {DType::f64}, &g);
  std::vector<double> v = vals(a);
  std::vector<std::vector<int64_t>> dimsets = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (const auto& dims : dimsets) {
    std::vector<bool> red(3, dims.empty());
    for (int64_t d : dims) red[(d + 3) % 3] = true;
    for (bool keep : {false, true}) {
      Tensor s = k::sum(a, dims, keep);
      Tensor m = k::mean(a, dims, keep);
      Shape want_shape;
      for (int d = 0; d < 3; ++d)
        if (!red[d])
          want_shape.push_back(a.size(d));
        else if (keep)
          want_shape.push_back(1);
      EXPECT_EQ(s.sizes(), want_shape);
      EXPECT_EQ(m.sizes(), want_shape);
      expect_near(s, ref_sum(v, a.sizes(), red, false), 1e-12);
      expect_near(m, ref_sum(v, a.sizes(), red, true), 1e-12);
    }
  }
  // Non-contiguous input (permuted) gives the permuted result.
  Tensor p = raw::permute(a, {2, 0, 1});
  expect_close(k::sum(p, {0}), k::sum(a, {2}), 1e-12);
  expect_close(k::sum(p, {1, 2}), k::sum(a, {0, 1}), 1e-12);
}

TEST(Reduce, SumDtypes) {
  Tensor i = T({1, 2, 3, 4}, {2, 2}, DType::i32);
  Tensor s = k::sum(i, {1});
  EXPECT_EQ(s.dtype(), DType::i64);
  expect_near(s, {3, 7});
  EXPECT_EQ(k::sum(T({1, 1, 0}, {3}, DType::b8)).item(), 2);
  Tensor h = k::cast(T({1, 2, 3}, {3}), DType::bf16);
  EXPECT_EQ(k::sum(h).dtype(), DType::bf16);
  EXPECT_EQ(k::sum(h).item(), 6);
  // f32 accumulates in double: 2^20 copies of 0.1f would drift badly in a float accumulator.
  // In double every partial sum is exact (0.1f has 24 significant bits, 2^20 of them need 44 < 53),
  // and the total 0.1f * 2^20 is an f32 value, so the result is exact.
  Tensor many = full({1 << 20}, 0.1f);
  EXPECT_EQ(k::sum(many).item(), static_cast<double>(0.1f) * (1 << 20));
  EXPECT_MG_ERROR(k::mean(i), DTypeError, "mean");
}

// sum(a, dims, keepdim, f32) of bf16 data keeps the f32 sum: 1 + 2^-8 is a tie between two bf16
// values (8 significant bits) and rounds to 1 in bf16, but is exact in f32. Other result dtypes
// are refused, not written in a type the backends do not produce.
TEST(Reduce, SumIntoF32KeepsTheSumOfHalfData) {
  const Tensor h = k::cast(T({1.0, 2.0, 0.00390625, 0.0}, {2, 2}), DType::bf16);
  const Tensor wide = k::sum(h, {0}, false, DType::f32);
  EXPECT_EQ(wide.dtype(), DType::f32);
  expect_near(wide, {1.00390625, 2.0}, 0.0);
  expect_near(k::cast(k::sum(h, {0}), DType::f32), {1.0, 2.0}, 0.0);
  EXPECT_EQ(k::sum(h, {0}, true, DType::bf16).sizes(), (Shape{1, 2}));
  EXPECT_MG_ERROR(k::sum(T({1, 2}, {2}), {}, false, DType::bf16), DTypeError, "f32 for f16/bf16 data");
  EXPECT_MG_ERROR(k::sum(T({1, 2}, {2}, DType::i32), {}, false, DType::i32), DTypeError, "expected floating data");
}

TEST(Reduce, Empty) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(k::sum(e).item(), 0);
  expect_near(k::sum(e, {0}), {0, 0, 0});
  EXPECT_EQ(k::sum(e, {1}).sizes(), (Shape{0}));
  EXPECT_TRUE(std::isnan(k::mean(e).item()));
  EXPECT_EQ(k::sum_squares(e).item(), 0);
  EXPECT_FALSE(k::has_nonfinite(e));
  EXPECT_MG_ERROR(k::max(e, 0), IndexError, "max");
  EXPECT_MG_ERROR(k::max_all(e), ValueError, "max_all");
  // Scalars reduce to themselves.
  EXPECT_EQ(k::sum(scalar_tensor(4)).item(), 4);
  EXPECT_EQ(k::sum(scalar_tensor(4), {0}).item(), 4);
}

TEST(Reduce, MaxMinArgmaxTies) {
  Tensor a = T({1, 5, 5, 2, -1, 7, 7, 0}, {2, 4});
  auto [v, i] = k::max(a, 1);
  expect_near(v, {5, 7});
  expect_near(i, {1, 1});  // first occurrence of a tie
  EXPECT_EQ(i.dtype(), DType::i64);
  auto [v0, i0] = k::max(a, 0, true);
  EXPECT_EQ(v0.sizes(), (Shape{1, 4}));
  expect_near(v0, {1, 7, 7, 2});
  expect_near(i0, {0, 1, 1, 0});
  auto [mv, mi] = k::min(a, -1);
  expect_near(mv, {1, -1});
  expect_near(mi, {0, 0});
  expect_near(k::argmax(a, 1), {1, 1});
  EXPECT_EQ(k::max_all(a).item(), 7);
  EXPECT_EQ(k::max_all(a).dim(), 0);
  auto [iv, ii] = k::max(T({3, 9, 9}, {3}, DType::i32), 0);
  EXPECT_EQ(iv.item(), 9);
  EXPECT_EQ(ii.item(), 1);
  // NaN wins like in PyTorch.
  auto [nv, ni] = k::max(T({1, NAN, 3}, {3}), 0);
  EXPECT_TRUE(std::isnan(nv.item()));
  EXPECT_EQ(ni.item(), 1);
  // Transposed input.
  Tensor at = raw::transpose(a, 0, 1);
  expect_near(k::argmax(at, 0), {1, 1});
}

TEST(Reduce, Var) {
  Generator g(11);
  Tensor a = randn({3, 5}, {DType::f64}, &g);
  std::vector<double> v = vals(a);
  for (int64_t corr : {0, 1}) {
    Tensor r = k::var(a, {1}, corr);
    for (int i = 0; i < 3; ++i) {
      double m = 0, s = 0;
      for (int j = 0; j < 5; ++j) m += v[i * 5 + j] / 5;
      for (int j = 0; j < 5; ++j) s += (v[i * 5 + j] - m) * (v[i * 5 + j] - m);
      EXPECT_NEAR(vals(r)[i], s / (5 - corr), 1e-12);
    }
  }
  expect_near(k::var(T({1, 2, 3, 4}, {4})), {5.0 / 3});
  expect_near(k::var(T({1, 2, 3, 4}, {2, 2}), {0}, 0, true), {1, 1});
  EXPECT_EQ(k::var(T({1, 2, 3, 4}, {2, 2}), {0}, 0, true).sizes(), (Shape{1, 2}));
  EXPECT_MG_ERROR(k::var(T({1, 2}, {2}, DType::i64)), DTypeError, "var");
}

TEST(Reduce, SumTo) {
  Generator g(12);
  Tensor gr = randn({2, 3, 4}, {DType::f64}, &g);
  expect_close(k::sum_to(gr, {3, 4}), k::sum(gr, {0}), 1e-12);
  expect_close(k::sum_to(gr, {3, 1}), raw::reshape(k::sum(gr, {0, 2}), {3, 1}), 1e-12);
  expect_close(k::sum_to(gr, {2, 1, 4}), k::sum(gr, {1}, true), 1e-12);
  EXPECT_EQ(k::sum_to(gr, {}).dim(), 0);
  EXPECT_NEAR(k::sum_to(gr, {}).item(), k::sum(gr).item(), 1e-12);
  EXPECT_TRUE(k::sum_to(gr, {2, 3, 4}).is_same(gr));
  EXPECT_MG_ERROR(k::sum_to(gr, {5, 4}), ShapeError, "sum_to");
  EXPECT_MG_ERROR(k::sum_to(gr, {1, 2, 3, 4}), ShapeError, "sum_to");
  // Bias-gradient shape: [N, C] -> [C] keeps the dtype.
  Tensor g32 = k::cast(gr, DType::f32);
  EXPECT_EQ(k::sum_to(g32, {4}).dtype(), DType::f32);
}

TEST(Reduce, SumSquaresAndNonfinite) {
  Tensor a = T({1, -2, 3}, {3});
  Tensor s = k::sum_squares(a);
  EXPECT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(s.item(), 14);
  EXPECT_EQ(k::sum_squares(T({1, 2}, {2}, DType::f64)).dtype(), DType::f64);
  EXPECT_EQ(k::sum_squares(k::cast(a, DType::f16)).item(), 14);
  EXPECT_EQ(k::sum_squares(raw::select(T({1, 2, 3, 4}, {2, 2}), 1, 1)).item(), 20);
  EXPECT_FALSE(k::has_nonfinite(a));
  EXPECT_TRUE(k::has_nonfinite(T({1, INFINITY}, {2})));
  EXPECT_TRUE(k::has_nonfinite(T({NAN, 1}, {2})));
  EXPECT_TRUE(k::has_nonfinite(k::cast(T({1, -INFINITY}, {2}), DType::bf16)));
  EXPECT_TRUE(k::has_nonfinite(k::cast(T({1e6}, {1}), DType::f16)));  // overflows to inf in f16
  EXPECT_FALSE(k::has_nonfinite(T({1, 2}, {2}, DType::i64)));
}

TEST(Reduce, BadDims) {
  Tensor a = zeros({2, 3});
  EXPECT_MG_ERROR(k::sum(a, {2}), IndexError, "sum");
  EXPECT_MG_ERROR(k::mean(a, {-3}), IndexError, "mean");
  EXPECT_MG_ERROR(k::sum(a, {0, -2}), ValueError, "sum");
  EXPECT_MG_ERROR(k::max(a, 5), IndexError, "max");
  EXPECT_MG_ERROR(k::var(a, {0}, -1), ValueError, "var");
}

}  // namespace
}  // namespace mg
