// Elementwise kernels: broadcasting, promotion, comparisons, every unary and backward helper.
#include <cmath>
#include <functional>

#include "tests/kernels/test_util.h"
#include "tests/rounding.h"

namespace mg {
namespace {
using namespace mg::testing;
namespace k = mg::kernels;

TEST(Broadcast, Shapes) {
  EXPECT_EQ(k::broadcast_shapes({2, 1, 3}, {4, 1}, "add"), (Shape{2, 4, 3}));
  EXPECT_EQ(k::broadcast_shapes({}, {3}, "add"), (Shape{3}));
  EXPECT_EQ(k::broadcast_shapes({0, 1}, {1, 5}, "add"), (Shape{0, 5}));
  EXPECT_MG_ERROR(k::broadcast_shapes({2, 3}, {4}, "mul"), ShapeError, "mul");
}

TEST(Binary, AddBroadcast213With41) {
  Tensor a = T({1, 2, 3, 4, 5, 6}, {2, 1, 3});
  Tensor b = T({10, 20, 30, 40}, {4, 1});
  Tensor c = k::add(a, b);
  ASSERT_EQ(c.sizes(), (Shape{2, 4, 3}));
  std::vector<double> want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 3; ++l) want.push_back((i * 3 + l + 1) + (j + 1) * 10);
  expect_near(c, want);
  // Same result with the operands swapped and with a transposed (non-contiguous) view.
  expect_close(k::add(b, a), c);
  Tensor bt = raw::transpose(T({10, 20, 30, 40}, {1, 4}), 0, 1);
  expect_close(k::add(a, bt), c);
}

// Every arithmetic op on random broadcast operands vs a scalar loop with std:: functions.
TEST(Binary, ArithmeticRandomVsScalarLoop) {
  Generator g(1);
  Tensor a = randn({3, 4}, {DType::f64}, &g);
  Tensor b = randn({4}, {DType::f64}, &g);
  Tensor pa = k::add_scalar(k::unary(k::Unary::Abs, a), 0.5);
  std::vector<double> va = vals(a), vb = vals(b), vpa = vals(pa);
  struct Case {
    k::Binary op;
    std::function<double(double, double)> f;
    bool positive_base;
  };
  std::vector<Case> cases = {
      {k::Binary::Add, [](double x, double y) { return x + y; }, false},
      {k::Binary::Sub, [](double x, double y) { return x - y; }, false},
      {k::Binary::Mul, [](double x, double y) { return x * y; }, false},
      {k::Binary::Div, [](double x, double y) { return x / y; }, false},
      {k::Binary::Pow, [](double x, double y) { return std::pow(x, y); }, true},
      {k::Binary::Maximum, [](double x, double y) { return std::max(x, y); }, false},
      {k::Binary::Minimum, [](double x, double y) { return std::min(x, y); }, false},
      {k::Binary::Eq, [](double x, double y) { return double(x == y); }, false},
      {k::Binary::Ne, [](double x, double y) { return double(x != y); }, false},
      {k::Binary::Lt, [](double x, double y) { return double(x < y); }, false},
      {k::Binary::Le, [](double x, double y) { return double(x <= y); }, false},
      {k::Binary::Gt, [](double x, double y) { return double(x > y); }, false},
      {k::Binary::Ge, [](double x, double y) { return double(x >= y); }, false},
  };
  for (const Case& c : cases) {
    const Tensor& x = c.positive_base ? pa : a;
    const std::vector<double>& vx = c.positive_base ? vpa : va;
    Tensor r = k::binary(c.op, x, b);
    std::vector<double> want;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) want.push_back(c.f(vx[i * 4 + j], vb[j]));
    SCOPED_TRACE(static_cast<int>(c.op));
    expect_near(r, want, 1e-12);
    // f32 path agrees within f32 precision.
    Tensor r32 = k::binary(c.op, k::cast(x, DType::f32), k::cast(b, DType::f32));
    expect_near(r32, want, 1e-5);
  }
}

TEST(Binary, ComparisonsReturnBool) {
  Tensor a = T({1, 2, 3}, {3});
  Tensor b = T({2, 2, 2}, {3}, DType::i64);
  Tensor r = k::binary(k::Binary::Lt, a, b);
  EXPECT_EQ(r.dtype(), DType::b8);
  expect_near(r, {1, 0, 0});
  expect_near(k::binary(k::Binary::Eq, a, b), {0, 1, 0});
  expect_near(k::binary(k::Binary::Ge, a, b), {0, 1, 1});
}

TEST(Binary, Promotion) {
  Tensor f32 = T({1, 2}, {2});
  Tensor i64 = T({1, 2}, {2}, DType::i64);
  Tensor i32 = T({1, 2}, {2}, DType::i32);
  Tensor f64 = T({1, 2}, {2}, DType::f64);
  EXPECT_EQ(k::add(f32, f64).dtype(), DType::f64);
  EXPECT_EQ(k::add(f32, i64).dtype(), DType::f32);
  EXPECT_EQ(k::add(i32, i64).dtype(), DType::i64);
  EXPECT_EQ(k::add(T({1}, {1}, DType::f16), T({1}, {1}, DType::bf16)).dtype(), DType::f32);
  // 0-dim operands of the same category do not promote a dimensioned tensor.
  EXPECT_EQ(k::add(f32, scalar_tensor(2.0, {DType::f64})).dtype(), DType::f32);
  EXPECT_EQ(k::add(scalar_tensor(2.0, {DType::f64}), f32).dtype(), DType::f32);
  EXPECT_EQ(k::add(i32, scalar_tensor(2.0, {DType::i64})).dtype(), DType::i32);
  // A higher category 0-dim operand gives that category's default.
  Tensor r = k::add(i64, scalar_tensor(0.5, {DType::f64}));
  EXPECT_EQ(r.dtype(), DType::f32);
  expect_near(r, {1.5, 2.5});
  EXPECT_EQ(k::add(T({1, 0}, {2}, DType::b8), scalar_tensor(3, {DType::i32})).dtype(), DType::i64);
  // Two 0-dim tensors promote normally.
  EXPECT_EQ(k::add(scalar_tensor(1, {DType::f32}), scalar_tensor(1, {DType::f64})).dtype(), DType::f64);
}

TEST(Binary, IntegerDivisionIsTrueDivision) {
  Tensor a = T({7, -7, 1}, {3}, DType::i64);
  Tensor b = T({2, 2, 4}, {3}, DType::i64);
  Tensor r = k::div(a, b);
  EXPECT_EQ(r.dtype(), DType::f32);
  expect_near(r, {3.5, -3.5, 0.25});
  Tensor m = k::mul(a, b);
  EXPECT_EQ(m.dtype(), DType::i64);
  expect_near(m, {14, -14, 4});
}

TEST(Binary, AllDtypesAdd) {
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    Tensor r = k::add(T({1, 2, 3}, {3}, dt), T({4, 5, 6}, {3}, dt));
    EXPECT_EQ(r.dtype(), dt);
    expect_near(r, {5, 7, 9});
  }
  Tensor bo = k::add(T({1, 0, 0}, {3}, DType::b8), T({1, 1, 0}, {3}, DType::b8));
  EXPECT_EQ(bo.dtype(), DType::b8);
  expect_near(bo, {1, 1, 0});
}

TEST(Binary, HalfTypesComputeInFloat) {
  Generator g(2);
  Tensor a = randn({17}, {DType::f32}, &g), b = randn({17}, {DType::f32}, &g);
  Tensor want = k::mul(a, b);
  expect_close(k::cast(k::mul(k::cast(a, DType::f16), k::cast(b, DType::f16)), DType::f32), want, 2e-3);
  expect_close(k::cast(k::mul(k::cast(a, DType::bf16), k::cast(b, DType::bf16)), DType::f32), want, 2e-2);
}

TEST(Binary, InPlaceBumpsVersionAndCasts) {
  Tensor a = T({1, 2, 3, 4}, {2, 2});
  uint32_t v = a.version();
  k::binary_(k::Binary::Add, a, T({10, 20}, {2}, DType::f64));
  EXPECT_EQ(a.version(), v + 1);
  EXPECT_EQ(a.dtype(), DType::f32);
  expect_near(a, {11, 22, 13, 24});
  k::binary_(k::Binary::Gt, a, scalar_tensor(15));
  expect_near(a, {0, 1, 0, 1});
  EXPECT_MG_ERROR(k::binary_(k::Binary::Add, T({1, 2}, {2}), T({1, 2, 3, 4}, {2, 2})), ShapeError, "add");
  Tensor i = T({7, 8}, {2}, DType::i64);
  k::binary_(k::Binary::Div, i, T({2, 2}, {2}, DType::i64));  // true division, cast back
  expect_near(i, {3, 4});
}

TEST(Binary, ScalarForms) {
  Tensor a = T({1, 2, 3}, {3});
  expect_near(k::add_scalar(a, 1.5), {2.5, 3.5, 4.5});
  expect_near(k::mul_scalar(a, -2), {-2, -4, -6});
  expect_near(k::pow_scalar(a, 2), {1, 4, 9});
  expect_near(k::pow_scalar(a, 0.5), {1, std::sqrt(2.0), std::sqrt(3.0)});
  expect_near(k::pow_scalar(a, -1), {1, 0.5, 1.0 / 3});
  expect_near(k::pow_scalar(a, 3), {1, 8, 27});
  Tensor i = T({1, 2, 3}, {3}, DType::i64);
  EXPECT_EQ(k::mul_scalar(i, 2).dtype(), DType::i64);
  EXPECT_EQ(k::pow_scalar(i, 2).dtype(), DType::i64);
  EXPECT_EQ(k::pow_scalar(i, 0.5).dtype(), DType::f32);
  EXPECT_EQ(k::mul_scalar(T({1}, {1}, DType::f16), 3.0).dtype(), DType::f16);
}

double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(Unary, EachOpVsStd) {
  Generator g(3);
  Tensor x = randn({2, 5}, {DType::f64}, &g);
  Tensor pos = k::add_scalar(k::unary(k::Unary::Abs, x), 0.1);
  struct Case {
    k::Unary op;
    std::function<double(double)> f;
    bool positive;
  };
  std::vector<Case> cases = {
      {k::Unary::Neg, [](double v) { return -v; }, false},
      {k::Unary::Exp, [](double v) { return std::exp(v); }, false},
      {k::Unary::Log, [](double v) { return std::log(v); }, true},
      {k::Unary::Sqrt, [](double v) { return std::sqrt(v); }, true},
      {k::Unary::Rsqrt, [](double v) { return 1 / std::sqrt(v); }, true},
      {k::Unary::Abs, [](double v) { return std::abs(v); }, false},
      {k::Unary::Relu, [](double v) { return v > 0 ? v : 0; }, false},
      {k::Unary::Gelu, gelu, false},
      {k::Unary::GeluTanh, gelu_tanh, false},
      {k::Unary::Sigmoid, sigmoid, false},
      {k::Unary::Tanh, [](double v) { return std::tanh(v); }, false},
      {k::Unary::Sign, [](double v) { return double((v > 0) - (v < 0)); }, false},
      {k::Unary::Reciprocal, [](double v) { return 1 / v; }, true},
      {k::Unary::Square, [](double v) { return v * v; }, false},
      {k::Unary::Silu, [](double v) { return v * sigmoid(v); }, false},
      {k::Unary::LogicalNot, [](double v) { return double(v == 0); }, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.op));
    const Tensor& in = c.positive ? pos : x;
    std::vector<double> want;
    for (double v : vals(in)) want.push_back(c.f(v));
    Tensor r = k::unary(c.op, in);
    EXPECT_EQ(r.dtype(), c.op == k::Unary::LogicalNot ? DType::b8 : DType::f64);
    expect_near(r, want, 1e-12);
    expect_near(k::unary(c.op, k::cast(in, DType::f32)), want, 1e-5);
    // bf16: the kernel evaluates f in f32 on the rounded input and rounds once, so against f of
    // the rounded input (in f64) it is off by half a bf16 ulp of the value, u(bf16) |f|, plus the
    // f32 evaluation (a few f32 ulps for these functions: 16 u(f32), at least 16 u(f32) absolute).
    std::vector<double> want16, bound16;
    for (double v : vals(rounded_f64(in, DType::bf16))) {
      want16.push_back(c.f(v));
      const double a = std::abs(want16.back());
      bound16.push_back(unit_roundoff(DType::bf16) * a + 16 * unit_roundoff(DType::f32) * std::max(1.0, a));
    }
    EXPECT_TRUE(within(k::unary(c.op, k::cast(in, DType::bf16)), from_vector(want16, in.sizes()), bound16));
    // Strided input (every other column) gives the same values.
    Tensor wide = raw::contiguous(raw::expand(raw::unsqueeze(in, 2), {2, 5, 2}));
    Tensor strided = raw::select(wide, 2, 1);
    expect_near(k::unary(c.op, strided), want, 1e-12);
  }
}

TEST(Unary, SpecialValues) {
  Tensor x = T({0.0, -0.0, INFINITY, -INFINITY, NAN}, {5});
  expect_near(k::unary(k::Unary::Sigmoid, x), {0.5, 0.5, 1, 0, NAN});
  expect_near(k::unary(k::Unary::Relu, x), {0, 0, INFINITY, 0, NAN});
  expect_near(k::unary(k::Unary::Exp, T({-1000, 1000}, {2})), {0, INFINITY});
  expect_near(k::unary(k::Unary::Log, T({0}, {1})), {-INFINITY});
}

TEST(Unary, IntegerInputs) {
  Tensor i = T({-2, 0, 3}, {3}, DType::i64);
  EXPECT_EQ(k::unary(k::Unary::Neg, i).dtype(), DType::i64);
  expect_near(k::unary(k::Unary::Abs, i), {2, 0, 3});
  expect_near(k::unary(k::Unary::Relu, i), {0, 0, 3});
  expect_near(k::unary(k::Unary::Sign, i), {-1, 0, 1});
  expect_near(k::unary(k::Unary::Square, i), {4, 0, 9});
  Tensor e = k::unary(k::Unary::Exp, i);  // float-only op promotes to f32
  EXPECT_EQ(e.dtype(), DType::f32);
  expect_near(e, {std::exp(-2.0), 1, std::exp(3.0)});
  Tensor u = T({0, 200}, {2}, DType::u8);
  expect_near(k::unary(k::Unary::Abs, u), {0, 200});
  expect_near(k::unary(k::Unary::LogicalNot, T({1, 0}, {2}, DType::b8)), {0, 1});
  EXPECT_MG_ERROR(k::unary(k::Unary::Neg, T({1}, {1}, DType::b8)), DTypeError, "neg");
}

TEST(Unary, InPlace) {
  Tensor x = T({-1, 2}, {2});
  uint32_t v = x.version();
  k::unary_(k::Unary::Relu, x);
  EXPECT_EQ(x.version(), v + 1);
  expect_near(x, {0, 2});
  k::unary_(k::Unary::Exp, x);
  expect_near(x, {1, std::exp(2.0)});
  EXPECT_MG_ERROR(k::unary_(k::Unary::Exp, T({1}, {1}, DType::i64)), DTypeError, "exp");
}

// Backward helpers vs central finite differences of the forward functions.
TEST(Binary, BackwardHelpers) {
  Generator g(4);
  Tensor x = randn({7}, {DType::f64}, &g);
  Tensor gr = randn({7}, {DType::f64}, &g);
  std::vector<double> vx = vals(x), vg = vals(gr);
  auto fd = [](std::function<double(double)> f, double v) { return (f(v + 1e-6) - f(v - 1e-6)) / 2e-6; };
  struct Case {
    k::Binary op;
    k::Unary fwd;
    std::function<double(double)> f;
    bool uses_output;
  };
  std::vector<Case> cases = {
      {k::Binary::ReluBackward, k::Unary::Relu, [](double v) { return v > 0 ? v : 0; }, false},
      {k::Binary::GeluBackward, k::Unary::Gelu, gelu, false},
      {k::Binary::GeluTanhBackward, k::Unary::GeluTanh, gelu_tanh, false},
      {k::Binary::SigmoidBackward, k::Unary::Sigmoid, sigmoid, true},
      {k::Binary::TanhBackward, k::Unary::Tanh, [](double v) { return std::tanh(v); }, true},
      {k::Binary::SiluBackward, k::Unary::Silu, [](double v) { return v * sigmoid(v); }, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.op));
    Tensor b = c.uses_output ? k::unary(c.fwd, x) : x;
    Tensor r = k::binary(c.op, gr, b);
    std::vector<double> want;
    for (size_t i = 0; i < vx.size(); ++i) want.push_back(vg[i] * fd(c.f, vx[i]));
    expect_near(r, want, 1e-6);
    expect_near(k::binary(c.op, k::cast(gr, DType::f32), k::cast(b, DType::f32)), want, 1e-4);
  }
  EXPECT_MG_ERROR(k::binary(k::Binary::ReluBackward, T({1}, {1}, DType::i64), T({1}, {1}, DType::i64)), DTypeError,
                  "relu_backward");
}

TEST(Elementwise, ClampAndBackward) {
  Tensor x = T({-2, -0.5, 0.5, 2, NAN}, {5});
  expect_near(k::clamp(x, -1, 1), {-1, -0.5, 0.5, 1, NAN});
  expect_near(k::clamp(x, 0, INFINITY), {0, 0, 0.5, 2, NAN});
  expect_near(k::clamp(x, -INFINITY, 0), {-2, -0.5, 0, 0, NAN});
  Tensor i = T({-5, 0, 5}, {3}, DType::i64);
  expect_near(k::clamp(i, -INFINITY, 1), {-5, 0, 1});
  expect_near(k::clamp(i, -1, INFINITY), {-1, 0, 5});
  Tensor g = T({1, 2, 3, 4, 5}, {5});
  expect_near(k::clamp_backward(g, x, -1, 1), {0, 2, 3, 0, 0});
  expect_near(k::clamp_backward(g, x, -INFINITY, 1), {1, 2, 3, 0, 0});
  EXPECT_MG_ERROR(k::clamp_backward(g, T({1}, {1}), 0, 1), ShapeError, "clamp_backward");
}

TEST(Elementwise, Axpby) {
  Tensor a = T({1, 2, 3, 4}, {2, 2});
  Tensor b = T({10, 20}, {2});
  expect_near(k::axpby(a, 2, b, 0.5), {7, 14, 11, 18});
  uint32_t v = a.version();
  k::axpby_(a, -1, b, 1);
  EXPECT_EQ(a.version(), v + 1);
  expect_near(a, {9, 18, 7, 16});
  Tensor h = k::cast(T({1, 2}, {2}), DType::bf16);
  k::axpby_(h, 0.5, T({2, 2}, {2}), 1);
  expect_near(h, {2.5, 3});
  EXPECT_MG_ERROR(k::axpby_(b, 1, a, 1), ShapeError, "axpby_");
}

TEST(Elementwise, WhereBroadcasts) {
  Tensor c = T({1, 0, 1}, {3}, DType::b8);
  Tensor a = T({1, 2}, {2, 1});
  Tensor b = scalar_tensor(-1, {DType::f64});
  Tensor r = k::where(c, a, b);
  EXPECT_EQ(r.sizes(), (Shape{2, 3}));
  EXPECT_EQ(r.dtype(), DType::f32);
  expect_near(r, {1, -1, 1, 2, -1, 2});
  EXPECT_MG_ERROR(k::where(T({1}, {1}), a, b), DTypeError, "where");
  EXPECT_MG_ERROR(k::where(T({1, 0}, {2}, DType::b8), T({1, 2, 3}, {3}), b), ShapeError, "where");
}

TEST(Elementwise, CastFillCopy) {
  Tensor a = T({1.7, -2.2, 0}, {3});
  expect_near(k::cast(a, DType::i64), {1, -2, 0});
  expect_near(k::cast(a, DType::b8), {1, 1, 0});
  expect_near(k::cast(k::cast(a, DType::f16), DType::f64), {1.7, -2.2, 0}, 1e-3);
  uint32_t v = a.version();
  k::fill_(a, 3);
  EXPECT_EQ(a.version(), v + 1);
  expect_near(a, {3, 3, 3});
  Tensor d = zeros({2, 3});
  k::copy_(d, T({1, 2, 3}, {3}, DType::i64));
  expect_near(d, {1, 2, 3, 1, 2, 3});
  EXPECT_GT(d.version(), 0u);
  EXPECT_MG_ERROR(k::copy_(d, T({1, 2}, {2})), ShapeError, "copy_");
}

TEST(Elementwise, EmptyTensors) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(k::add(e, T({1, 2, 3}, {3})).sizes(), (Shape{0, 3}));
  EXPECT_EQ(k::unary(k::Unary::Exp, e).numel(), 0);
  EXPECT_EQ(k::where(zeros({0}, {DType::b8}), zeros({0}), zeros({0})).numel(), 0);
  k::fill_(e, 1);
  k::binary_(k::Binary::Mul, e, scalar_tensor(2));
}

// Naive broadcast reference: value of `t` (shape s) at the output multi-index `idx`.
double at_bcast(const std::vector<double>& v, const Shape& s, const Shape& out, const std::vector<int64_t>& idx) {
  const size_t off = out.size() - s.size();
  int64_t flat = 0;
  for (size_t d = 0; d < s.size(); ++d) flat = flat * s[d] + (s[d] == 1 ? 0 : idx[off + d]);
  return v[flat];
}

TEST(Binary, RandomBroadcastShapesVsNaive) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 1, 3}, {4, 1}}, {{5}, {3, 1}}, {{1}, {2, 2}},          {{3, 1, 1}, {1, 4, 5}},
      {{2, 3, 4}, {4}},    {{}, {2, 3}},  {{1, 1, 7}, {6, 1, 1}}, {{4, 1, 3, 1}, {2, 1, 5}}};
  Generator g(50);
  for (const auto& [sa, sb] : cases) {
    Tensor a = randn(sa, {DType::f64}, &g), b = randn(sb, {DType::f64}, &g);
    Tensor r = k::mul(k::add(a, b), b);
    const Shape out = k::broadcast_shapes(sa, sb, "test");
    ASSERT_EQ(r.sizes(), out);
    std::vector<double> va = vals(a), vb = vals(b), want;
    std::vector<int64_t> idx(out.size(), 0);
    for (int64_t n = 0; n < shape_numel(out); ++n) {
      int64_t rem = n;
      for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
        idx[d] = rem % out[d];
        rem /= out[d];
      }
      const double x = at_bcast(va, sa, out, idx), y = at_bcast(vb, sb, out, idx);
      want.push_back((x + y) * y);
    }
    expect_near(r, want, 1e-12);
    // The same through f32 with a permuted (non-contiguous) copy of the output shape.
    if (out.size() >= 2) {
      Tensor a32 = k::cast(a, DType::f32), b32 = k::cast(b, DType::f32);
      Tensor full_a = raw::contiguous(raw::expand(a32, out));
      Tensor perm = raw::transpose(raw::contiguous(raw::transpose(full_a, 0, 1)), 0, 1);  // same values, strided
      expect_near(k::mul(k::add(perm, b32), b32), want, 1e-4);
    }
  }
}

TEST(Binary, InPlaceWithWiderOperandRoundsOnce) {
  // bf16 a += f32 b: computed in f32 and rounded once (b is not rounded to bf16 first).
  Tensor a = k::cast(T({256}, {1}), DType::bf16);
  // 256 + 1.00390625 = 257.0039 -> 258 in bf16 (step 2); rounding b first gives 256 + 1 = 257 -> 256 (ties to even).
  k::binary_(k::Binary::Add, a, T({1.00390625}, {1}));
  expect_near(a, {258});
  Tensor c = k::cast(T({1}, {1}), DType::bf16);
  // 1 + (2^-8 + 1e-6) -> 1.0078125 (step 2^-7); rounding b to bf16 first loses the 1e-6 and ties to 1.0.
  k::axpby_(c, 1.0, T({0.00390625 + 1e-6}, {1}), 1.0);
  expect_near(c, {1.0078125});
  Tensor i = T({1, 2}, {2}, DType::i64);
  k::binary_(k::Binary::Mul, i, scalar_tensor(2.5));  // computed in f32, truncated back
  expect_near(i, {2, 5});
}
}  // namespace
}  // namespace mg
