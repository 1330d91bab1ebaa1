// matmul/bmm/gemm/linear vs a naive triple loop on random data: every matmul shape case,
// transposed and strided inputs, f16/bf16 through f32, and shape/dtype errors.
#include "tests/kernels/test_util.h"
#include "tests/rounding.h"

namespace mg {
namespace {
using namespace mg::testing;
namespace k = mg::kernels;

// Naive [n,k] @ [k,m] on host vectors (logical order).
std::vector<double> naive(const std::vector<double>& a, const std::vector<double>& b, int64_t n, int64_t kk,
                          int64_t m) {
  std::vector<double> c(n * m, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t l = 0; l < kk; ++l) c[i * m + j] += a[i * kk + l] * b[l * m + j];
  return c;
}

Tensor rn(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return randn(s, {dt}, &g);
}

TEST(Matmul, TwoD) {
  for (auto [n, kk, m] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 4, 5}, {17, 33, 9}, {64, 128, 70}}) {
    Tensor a = rn({n, kk}, 1), b = rn({kk, m}, 2);
    Tensor c = k::matmul(a, b);
    EXPECT_EQ(c.sizes(), (Shape{n, m}));
    expect_near(c, naive(vals(a), vals(b), n, kk, m), 1e-10);
    Tensor c32 = k::matmul(k::cast(a, DType::f32), k::cast(b, DType::f32));
    EXPECT_EQ(c32.dtype(), DType::f32);
    expect_near(c32, naive(vals(a), vals(b), n, kk, m), 1e-4);
  }
}

TEST(Matmul, OneD) {
  Tensor a = rn({5}, 3), b = rn({5}, 4), m = rn({5, 3}, 5), mt = rn({3, 5}, 6);
  Tensor d = k::matmul(a, b);
  EXPECT_EQ(d.dim(), 0);
  double want = 0;
  for (int i = 0; i < 5; ++i) want += vals(a)[i] * vals(b)[i];
  EXPECT_NEAR(d.item(), want, 1e-12);
  Tensor vm = k::matmul(a, m);
  EXPECT_EQ(vm.sizes(), (Shape{3}));
  expect_near(vm, naive(vals(a), vals(m), 1, 5, 3), 1e-12);
  Tensor mv = k::matmul(mt, a);
  EXPECT_EQ(mv.sizes(), (Shape{3}));
  expect_near(mv, naive(vals(mt), vals(a), 3, 5, 1), 1e-12);
}

TEST(Matmul, BatchedBroadcast) {
  // [2,1,3,4] @ [5,4,6] -> [2,5,3,6]
  Tensor a = rn({2, 1, 3, 4}, 7), b = rn({5, 4, 6}, 8);
  Tensor c = k::matmul(a, b);
  ASSERT_EQ(c.sizes(), (Shape{2, 5, 3, 6}));
  std::vector<double> va = vals(a), vb = vals(b), want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 5; ++j) {
      std::vector<double> ai(va.begin() + i * 12, va.begin() + (i + 1) * 12);
      std::vector<double> bj(vb.begin() + j * 24, vb.begin() + (j + 1) * 24);
      std::vector<double> r = naive(ai, bj, 3, 4, 6);
      want.insert(want.end(), r.begin(), r.end());
    }
  expect_near(c, want, 1e-12);
  // [B, n, k] @ [k, m] folds the batch into rows.
  Tensor w = rn({4, 6}, 9);
  Tensor c2 = k::matmul(a, w);
  EXPECT_EQ(c2.sizes(), (Shape{2, 1, 3, 6}));
  expect_near(c2, naive(va, vals(w), 6, 4, 6), 1e-12);
  // [k] @ [B, k, m] and [B, n, k] @ [k].
  Tensor v = rn({4}, 10);
  Tensor vb3 = k::matmul(v, b);
  EXPECT_EQ(vb3.sizes(), (Shape{5, 6}));
  Tensor av = k::matmul(a, v);
  EXPECT_EQ(av.sizes(), (Shape{2, 1, 3}));
  expect_near(av, naive(va, vals(v), 6, 4, 1), 1e-12);
  // [2,3,4] @ [2,4,6] equals bmm.
  Tensor x = rn({2, 3, 4}, 11), y = rn({2, 4, 6}, 12);
  expect_close(k::matmul(x, y), k::bmm(x, y), 1e-12);
}

TEST(Matmul, TransposedAndStridedInputs) {
  Tensor a = rn({6, 4}, 13), b = rn({5, 6}, 14);
  Tensor at = raw::transpose(a, 0, 1);  // [4, 6] column-major view
  Tensor bt = raw::transpose(b, 0, 1);  // [6, 5]
  Tensor want = k::matmul(raw::contiguous(at), raw::contiguous(bt));
  expect_near(want, naive(vals(at), vals(bt), 4, 6, 5), 1e-12);
  expect_close(k::matmul(at, bt), want, 1e-12);
  expect_close(k::matmul(at, raw::contiguous(bt)), want, 1e-12);
  expect_close(k::matmul(raw::contiguous(at), bt), want, 1e-12);
  // A stepped slice (neither row- nor column-major) and an expanded operand.
  Tensor big = rn({6, 10}, 15);
  Tensor stepped = raw::slice(big, 1, 0, 10, 2);  // [6, 5], strides [10, 2]
  expect_near(k::matmul(at, stepped), naive(vals(at), vals(stepped), 4, 6, 5), 1e-12);
  Tensor expanded = raw::expand(rn({1, 5}, 16), {6, 5});
  expect_near(k::matmul(at, expanded), naive(vals(at), vals(expanded), 4, 6, 5), 1e-12);
  // Transposed batch.
  Tensor x = rn({2, 4, 3}, 17);
  Tensor xt = raw::transpose(x, 1, 2);
  Tensor y = rn({2, 4, 5}, 18);
  expect_close(k::bmm(xt, y), k::bmm(raw::contiguous(xt), y), 1e-12);
}

TEST(Gemm, AlphaBetaTransposes) {
  Tensor a = rn({3, 4}, 19), b = rn({5, 4}, 20), c0 = rn({3, 5}, 21);
  std::vector<double> want = naive(vals(a), vals(raw::contiguous(raw::transpose(b, 0, 1))), 3, 4, 5);
  std::vector<double> vc = vals(c0);
  for (size_t i = 0; i < want.size(); ++i) want[i] = 2 * want[i] + 0.5 * vc[i];
  Tensor c = raw::clone(c0);
  uint32_t v = c.version();
  k::gemm(a, false, b, true, c, 2.0, 0.5);
  EXPECT_GT(c.version(), v);
  expect_near(c, want, 1e-12);
  // trans_a with a stored as [4, 3].
  Tensor c2 = raw::clone(c0);
  k::gemm(raw::contiguous(raw::transpose(a, 0, 1)), true, b, true, c2, 2.0, 0.5);
  expect_near(c2, want, 1e-12);
  // A column-major (transposed) output.
  Tensor ct = raw::contiguous(raw::transpose(c0, 0, 1));  // [5, 3]
  Tensor c3 = raw::transpose(ct, 0, 1);                   // [3, 5] view, column-major
  k::gemm(a, false, b, true, c3, 2.0, 0.5);
  expect_near(c3, want, 1e-12);
  // beta = 0 ignores NaN garbage in out.
  Tensor cn = full({3, 5}, NAN, {DType::f64});
  k::gemm(a, false, b, true, cn, 1.0, 0.0);
  expect_near(cn, naive(vals(a), vals(raw::contiguous(raw::transpose(b, 0, 1))), 3, 4, 5), 1e-12);
  // k = 0: out = beta * out.
  Tensor z = full({2, 2}, 3.0, {DType::f64});
  k::gemm(zeros({2, 0}, {DType::f64}), false, zeros({0, 2}, {DType::f64}), false, z, 1.0, 2.0);
  expect_near(z, {6, 6, 6, 6});
  Tensor z2 = full({2, 2}, NAN, {DType::f64});
  k::gemm(zeros({2, 0}, {DType::f64}), false, zeros({0, 2}, {DType::f64}), false, z2, 1.0, 0.0);
  expect_near(z2, {0, 0, 0, 0});
}

// |x| elementwise on host values: the magnitudes whose products bound a dot product's error.
std::vector<double> abs_of(std::vector<double> v) {
  for (double& x : v) x = std::abs(x);
  return v;
}

// Half types go through f32 and are rounded once at the end. The reference is the f64 product
// of the inputs after rounding them to dt (the values the kernel sees); each output, a dot
// product of k = 16 terms, is then within gamma_16(f32) * sum |a||b| + u(dt) |ref| (dot_bound).
TEST(Matmul, HalfTypesThroughF32) {
  Tensor a = rn({8, 16}, 22, DType::f32), b = rn({16, 4}, 23, DType::f32);
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto av = vals(rounded_f64(a, dt)), bv = vals(rounded_f64(b, dt));
    Tensor want = from_vector(naive(av, bv, 8, 16, 4), {8, 4});
    Tensor mag = from_vector(naive(abs_of(av), abs_of(bv), 8, 16, 4), {8, 4});
    const std::vector<double> bound = dot_bound(want, mag, 16, DType::f32, dt);
    Tensor c = k::matmul(k::cast(a, dt), k::cast(b, dt));
    EXPECT_EQ(c.dtype(), dt);
    EXPECT_TRUE(within(c, want, bound));
    Tensor bb = k::bmm(k::cast(raw::unsqueeze(a, 0), dt), k::cast(raw::unsqueeze(b, 0), dt));
    EXPECT_TRUE(within(raw::squeeze(bb, 0), want, bound));
  }
}

TEST(Linear, WithAndWithoutBias) {
  Tensor x = rn({2, 3, 4}, 24), w = rn({5, 4}, 25), bias = rn({5}, 26);
  std::vector<double> want = naive(vals(x), vals(raw::contiguous(raw::transpose(w, 0, 1))), 6, 4, 5);
  Tensor y0 = k::linear(x, w);
  EXPECT_EQ(y0.sizes(), (Shape{2, 3, 5}));
  expect_near(y0, want, 1e-12);
  std::vector<double> vb = vals(bias);
  for (size_t i = 0; i < want.size(); ++i) want[i] += vb[i % 5];
  expect_near(k::linear(x, w, bias), want, 1e-12);
  Tensor y1 = k::linear(raw::select(x, 0, 0), w, bias);  // 2-D input
  EXPECT_EQ(y1.sizes(), (Shape{3, 5}));
  Tensor v = k::linear(raw::select(raw::select(x, 0, 0), 0, 0), w, bias);  // 1-D input
  EXPECT_EQ(v.sizes(), (Shape{5}));
  expect_near(v, std::vector<double>(want.begin(), want.begin() + 5), 1e-12);
  // bf16: bias copied in exactly, 4 products accumulated onto it in f32, one rounding to bf16
  // (dot_bound with k = 5 terms), against the f64 result of the rounded inputs.
  const DType bf = DType::bf16;
  const auto xr = vals(rounded_f64(x, bf)), wtr = vals(rounded_f64(raw::contiguous(raw::transpose(w, 0, 1)), bf));
  const auto br = vals(rounded_f64(bias, bf));
  std::vector<double> want16 = naive(xr, wtr, 6, 4, 5), mag16 = naive(abs_of(xr), abs_of(wtr), 6, 4, 5);
  for (size_t i = 0; i < want16.size(); ++i) want16[i] += br[i % 5], mag16[i] += std::abs(br[i % 5]);
  Tensor want_t = from_vector(want16, {2, 3, 5}), mag_t = from_vector(mag16, {2, 3, 5});
  Tensor yb = k::linear(k::cast(x, bf), k::cast(w, bf), k::cast(bias, bf));
  EXPECT_EQ(yb.dtype(), bf);
  EXPECT_TRUE(within(yb, want_t, dot_bound(want_t, mag_t, 5, DType::f32, bf)));
}

TEST(Linalg, Errors) {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  EXPECT_MG_ERROR(k::matmul(a, b), ShapeError, "matmul: inner dimensions differ: [2, 3] @ [4, 5]");
  EXPECT_MG_ERROR(k::matmul(scalar_tensor(1), a), ShapeError, "matmul");
  EXPECT_MG_ERROR(k::matmul(a, zeros({3, 2}, {DType::f64})), DTypeError, "matmul");
  EXPECT_MG_ERROR(k::matmul(zeros({2, 3}, {DType::i64}), zeros({3, 2}, {DType::i64})), DTypeError, "matmul");
  EXPECT_MG_ERROR(k::matmul(zeros({2, 2, 3}), zeros({3, 3, 2})), ShapeError, "matmul");
  EXPECT_MG_ERROR(k::bmm(zeros({2, 2, 3}), zeros({3, 3, 2})), ShapeError, "bmm");
  EXPECT_MG_ERROR(k::bmm(a, a), ShapeError, "bmm");
  EXPECT_MG_ERROR(k::gemm(a, false, a, false, zeros({2, 3}), 1, 0), ShapeError, "gemm");
  EXPECT_MG_ERROR(k::gemm(a, false, a, true, zeros({3, 3}), 1, 0), ShapeError, "gemm");
  EXPECT_MG_ERROR(k::linear(a, zeros({4, 2})), ShapeError, "linear");
  EXPECT_MG_ERROR(k::linear(a, zeros({4, 3}), zeros({3})), ShapeError, "linear");
  EXPECT_MG_ERROR(k::linear(a, zeros({4, 3}), zeros({4}, {DType::f64})), DTypeError, "linear");
  // Empty sizes work.
  EXPECT_EQ(k::matmul(zeros({0, 3}), zeros({3, 4})).sizes(), (Shape{0, 4}));
  expect_near(k::matmul(zeros({2, 0}), zeros({0, 2})), {0, 0, 0, 0});
  EXPECT_EQ(k::linear(zeros({0, 3}), zeros({4, 3}), zeros({4})).sizes(), (Shape{0, 4}));
  EXPECT_EQ(k::bmm(zeros({0, 2, 3}), zeros({0, 3, 4})).sizes(), (Shape{0, 2, 4}));
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {
namespace k = mg::kernels;
TEST(Linalg, ZeroInnerDimWithBatch) {
  mg::testing::expect_near(k::matmul(zeros({2, 1, 0}), zeros({0, 2})), {0, 0, 0, 0});
  mg::testing::expect_near(k::linear(zeros({2, 0}), zeros({3, 0}), ones({3})), {1, 1, 1, 1, 1, 1});
}
}  // namespace
}  // namespace mg

namespace mg {
namespace {
namespace k = mg::kernels;
TEST(Gemm, OutputAliasingAnInput) {
  Generator g(70);
  Tensor a = randn({3, 3}, {DType::f64}, &g), b = randn({3, 3}, {DType::f64}, &g);
  Tensor want = k::matmul(a, b);
  Tensor a2 = raw::clone(a);
  k::gemm(a2, false, b, false, a2, 1.0, 0.0);  // a2 = a2 @ b
  mg::testing::expect_close(a2, want, 1e-12);
}
}  // namespace
}  // namespace mg
