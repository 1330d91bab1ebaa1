// CUDA vs CPU parity of kernels/ops.h where the op table (tests/autograd/op_table_*.cc, which
// runs every differentiable op's forward and gradient on the device) cannot reach: in-place
// kernels, integer and bool dtypes, comparisons, casts, the backward kernels as ops of their
// own, gemm's transpose flags and beta, ties and NaN in max/argmax, non-finite inputs, -inf
// softmax rows, side streams. Same views (strided, transposed, broadcast; sizes 1, 33, 1000,
// 4097) on both devices, f64/f32/f16/bf16 with per-dtype tolerances. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda/dtype_cuda.cuh"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/deferred_checks.h"
#include "kernels/ops.h"
#include "tests/autograd/gradcheck.h"
#include "tests/autograd/layouts.h"
#include "tests/error_of.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/rounding.h"

namespace mg {
namespace {
namespace k = mg::kernels;
using View = std::function<Tensor(const Tensor&)>;

const std::vector<DType> kFloats = {DType::f32, DType::f16, DType::bf16, DType::f64};

double tol_of(DType t, bool matmul = false) {
  switch (t) {
    case DType::f64:
      return 1e-9;
    case DType::f32:
      return matmul ? 1e-4 : 1e-5;
    case DType::f16:
      return 1e-2;
    case DType::bf16:
      return 2e-2;
    default:
      return 0;  // integers and bools: exact
  }
}

// The shared helper (tests/autograd/gradcheck.h), plus what a kernel must keep across
// devices: the result lives on the device and has the CPU's dtype (the same promotion).
void expect_parity(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
  ASSERT_TRUE(gpu.is_cuda()) << what;
  ASSERT_EQ(cpu.dtype(), gpu.dtype()) << what;
  EXPECT_TRUE(parity(cpu, gpu, tol)) << what;
}

using namespace mg::testing;  // views applied identically on both devices, to_cuda, host

class CudaParity : public CudaTest {
 protected:
  Generator g{20240607};
};

// ---------------------------------------------------------------- elementwise

TEST_F(CudaParity, UnaryFloat) {
  using U = k::Unary;
  const std::vector<U> ops = {U::Neg,      U::Exp,     U::Log,  U::Sqrt, U::Rsqrt,      U::Abs,    U::Relu, U::Gelu,
                              U::GeluTanh, U::Sigmoid, U::Tanh, U::Sign, U::Reciprocal, U::Square, U::Silu};
  for (DType dt : kFloats)
    for (const auto& v : unary_layouts())
      for (U op : ops) {
        const bool positive = op == U::Log || op == U::Sqrt || op == U::Rsqrt || op == U::Reciprocal;
        Tensor base = host(v.base, dt, g, positive ? 0.1 : -3, 3);
        Tensor gb = to_cuda(base);
        const std::string what = "unary " + std::to_string(static_cast<int>(op)) + " " + v.name;
        // The others run out of place as op-table rows (same views, sizes and dtypes).
        if (op == U::Sign || op == U::Reciprocal)
          expect_parity(k::unary(op, v.view(base)), k::unary(op, v.view(gb)), tol_of(dt), what);
        // In place on the view.
        Tensor c = raw::clone(base), gc = raw::clone(gb);
        k::unary_(op, v.view(c));
        k::unary_(op, v.view(gc));
        expect_parity(c, gc, tol_of(dt), what + " in-place");
      }
}

TEST_F(CudaParity, UnaryIntegerAndLogicalNot) {
  using U = k::Unary;
  for (DType dt : {DType::i64, DType::i32, DType::u8})
    for (const auto& v : unary_layouts())
      for (U op : {U::Neg, U::Abs, U::Relu, U::Sign, U::Square, U::LogicalNot}) {
        Tensor base = host(v.base, dt, g, dt == DType::u8 ? 0 : -50, 50);
        expect_parity(k::unary(op, v.view(base)), k::unary(op, v.view(to_cuda(base))), 0,
                      "int unary " + std::to_string(static_cast<int>(op)) + " " + v.name);
      }
  Tensor b = host({1000}, DType::b8, g);
  expect_parity(k::unary(U::LogicalNot, b), k::unary(U::LogicalNot, to_cuda(b)), 0, "logical_not b8");
  // exp of an integer tensor promotes to f32.
  Tensor i = host({33}, DType::i32, g, -3, 3);
  expect_parity(k::unary(U::Exp, i), k::unary(U::Exp, to_cuda(i)), 1e-5, "exp i32");
}

TEST_F(CudaParity, BinaryFloat) {
  using B = k::Binary;
  const std::vector<B> ops = {B::Add,
                              B::Sub,
                              B::Mul,
                              B::Div,
                              B::Pow,
                              B::Maximum,
                              B::Minimum,
                              B::Eq,
                              B::Ne,
                              B::Lt,
                              B::Le,
                              B::Gt,
                              B::Ge,
                              B::ReluBackward,
                              B::GeluBackward,
                              B::GeluTanhBackward,
                              B::SigmoidBackward,
                              B::TanhBackward,
                              B::SiluBackward};
  for (DType dt : kFloats)
    for (const auto& c : binary_layouts())
      for (B op : ops) {
        const bool pos_a = op == B::Pow;
        Tensor a = host(c.a, dt, g, pos_a ? 0.1 : -2, 2);
        // Coarse values so comparisons see ties; away from 0 for Div.
        Tensor b = op == B::Div ? host(c.b, dt, g, 0.5, 2) : host(c.b, dt, g, -2, 2);
        if (op >= B::Eq && op <= B::Ge) {  // coarse values: comparisons see ties
          a = k::unary(k::Unary::Sign, a);
          b = k::unary(k::Unary::Sign, b);
        }
        const std::string what = "binary " + std::to_string(static_cast<int>(op)) + " " + c.name;
        Tensor ga = to_cuda(a), gb = to_cuda(b);
        // add, sub, mul, div, pow, maximum and minimum run out of place as op-table rows.
        if (op >= B::Eq)
          expect_parity(k::binary(op, c.va(a), c.vb(b)), k::binary(op, c.va(ga), c.vb(gb)), tol_of(dt), what);
        // In place where b broadcasts to a.
        Tensor av = c.va(a);
        if (k::broadcast_shapes(av.sizes(), c.vb(b).sizes(), "t") == av.sizes()) {
          Tensor x = raw::clone(a), gx = raw::clone(ga);
          k::binary_(op, c.va(x), c.vb(b));
          k::binary_(op, c.va(gx), c.vb(gb));
          expect_parity(x, gx, tol_of(dt), what + " in-place");
        }
      }
}

TEST_F(CudaParity, BinaryIntegerAndBool) {
  using B = k::Binary;
  for (DType dt : {DType::i64, DType::i32, DType::u8, DType::b8})
    for (const auto& c : binary_layouts())
      for (B op : {B::Add, B::Mul, B::Maximum, B::Minimum, B::Eq, B::Ne, B::Lt, B::Le, B::Gt, B::Ge, B::Sub, B::Div}) {
        if (dt == DType::b8 && op == B::Sub) continue;
        Tensor a = host(c.a, dt, g, 0, 9), b = host(c.b, dt, g, 1, 9);
        expect_parity(k::binary(op, c.va(a), c.vb(b)), k::binary(op, c.va(to_cuda(a)), c.vb(to_cuda(b))),
                      op == B::Div ? 1e-5 : 0, "int binary " + std::to_string(static_cast<int>(op)) + " " + c.name);
      }
  // Mixed dtypes promote the same way on both devices.
  Tensor i = host({33}, DType::i32, g, -5, 5), f = host({33}, DType::f16, g);
  expect_parity(k::add(i, f), k::add(to_cuda(i), to_cuda(f)), 1e-2, "i32 + f16");
}

TEST_F(CudaParity, ScalarClampAxpbyWhere) {
  for (DType dt : kFloats) {
    const double tol = tol_of(dt);
    for (const auto& v : unary_layouts()) {
      // add/mul/pow with a scalar and clamp run as op-table rows; their backward kernels here.
      Tensor a = host(v.base, dt, g, 0.1, 3), ga = to_cuda(a);
      Tensor gr = host(v.base, dt, g), ggr = to_cuda(gr);
      expect_parity(k::clamp_backward(v.view(gr), v.view(a), 0.5, 2.0),
                    k::clamp_backward(v.view(ggr), v.view(ga), 0.5, 2.0), tol, "clamp_backward " + v.name);
      expect_parity(k::axpby(v.view(a), 0.9, v.view(gr), -0.1), k::axpby(v.view(ga), 0.9, v.view(ggr), -0.1), tol,
                    "axpby " + v.name);
      Tensor x = raw::clone(a), gx = raw::clone(ga);
      k::axpby_(v.view(x), 0.5, v.view(gr), 2.0);
      k::axpby_(v.view(gx), 0.5, v.view(ggr), 2.0);
      expect_parity(x, gx, tol, "axpby_ " + v.name);
    }
    // Broadcast axpby (float where, broadcast and transposed, is an op-table row).
    Tensor a = host({33, 40}, dt, g), b = host({40}, dt, g);
    expect_parity(k::axpby(a, 2.0, b, 3.0), k::axpby(to_cuda(a), 2.0, to_cuda(b), 3.0), tol, "axpby bcast");
  }
  for (DType dt : {DType::i64, DType::i32, DType::u8}) {
    Tensor a = host({1000}, dt, g, 0, 100), b = host({1000}, dt, g, 0, 100);
    expect_parity(k::clamp(a, 10, 50), k::clamp(to_cuda(a), 10, 50), 0, "int clamp");
    expect_parity(k::clamp(a, 10, INFINITY), k::clamp(to_cuda(a), 10, INFINITY), 0, "int clamp inf");
    expect_parity(k::axpby(a, 1.0, b, 2.0), k::axpby(to_cuda(a), 1.0, to_cuda(b), 2.0), 0, "int axpby");
    Tensor c = host({1000}, DType::b8, g);
    expect_parity(k::where(c, a, b), k::where(to_cuda(c), to_cuda(a), to_cuda(b)), 0, "int where");
  }
}

TEST_F(CudaParity, CastFillCopy) {
  const std::vector<DType> all = {DType::f64, DType::f32, DType::f16, DType::bf16,
                                  DType::i64, DType::i32, DType::u8,  DType::b8};
  for (DType from : all)
    for (DType to : all) {
      Tensor a = host({33, 31}, from, g, 0, 100);
      expect_parity(k::cast(raw::transpose(a, 0, 1), to), k::cast(raw::transpose(to_cuda(a), 0, 1), to), 0,
                    std::string("cast ") + dtype_name(from) + "->" + dtype_name(to));
    }
  Tensor z = zeros({33, 40}), gz = to_cuda(z);
  k::fill_(raw::slice(z, 1, 0, 40, 3), 2.5);
  k::fill_(raw::slice(gz, 1, 0, 40, 3), 2.5);
  expect_parity(z, gz, 0, "fill_ stepped");
  Tensor s = host({40}, DType::f32, g);
  k::copy_(z, s);
  k::copy_(gz, to_cuda(s));
  expect_parity(z, gz, 0, "copy_ broadcast");
}

// The strided kernels divide indexes with mg::cuda::FastDiv (multiply-high + shift) below
// 2^31. Its host path is the same formula: check it against true division, no GPU needed.
TEST(FastDiv, MatchesDivisionOnHost) {
  std::vector<uint32_t> divisors = {1,
                                    2,
                                    3,
                                    5,
                                    7,
                                    31,
                                    32,
                                    33,
                                    1000,
                                    4097,
                                    65535,
                                    65536,
                                    65537,
                                    100003,
                                    (1u << 20) + 1,
                                    (1u << 30) - 1,
                                    1u << 30,
                                    (1u << 31) - 1};
  std::vector<uint32_t> dividends = {0, 1, 2, 3, 1000, 65535, 65536, 1u << 24, (1u << 31) - 2, (1u << 31) - 1};
  Generator g(7);
  Tensor r = randint(0, (int64_t{1} << 31) - 1, {2000}, {DType::i64}, &g);
  for (int64_t v : r.to_vector<int64_t>()) dividends.push_back(static_cast<uint32_t>(v));
  for (int64_t d : randint(1, (int64_t{1} << 31) - 1, {200}, {DType::i64}, &g).to_vector<int64_t>())
    divisors.push_back(static_cast<uint32_t>(d));
  for (uint32_t d : divisors) {
    const mg::cuda::FastDiv fd(d);
    for (uint32_t n : dividends) ASSERT_EQ(fd.div(n), n / d) << n << " / " << d;
    for (uint32_t k : {1u, 2u, 3u, 1000u}) {  // around multiples of d
      const uint64_t m = static_cast<uint64_t>(d) * k;
      for (int64_t n : {static_cast<int64_t>(m) - 1, static_cast<int64_t>(m)})
        if (n >= 0 && n < (int64_t{1} << 31))
          ASSERT_EQ(fd.div(static_cast<uint32_t>(n)), static_cast<uint32_t>(n) / d) << n << " / " << d;
    }
  }
}

// Large odd dims through the strided paths (copy, cast, broadcast binary, permuted unary).
TEST_F(CudaParity, StridedLargeOddDims) {
  for (DType dt : {DType::f32, DType::f16}) {
    Tensor a = host({3, 70001, 5}, dt, g);
    Tensor ga = to_cuda(a);
    expect_parity(raw::contiguous(raw::permute(a, {2, 0, 1})), raw::contiguous(raw::permute(ga, {2, 0, 1})), 0,
                  "permuted copy");
    expect_parity(k::cast(raw::permute(a, {1, 2, 0}), DType::f32), k::cast(raw::permute(ga, {1, 2, 0}), DType::f32), 0,
                  "permuted cast");
    expect_parity(k::cast(a, DType::bf16), k::cast(ga, DType::bf16), 0, "contiguous cast");
    Tensor rows = host({1001, 4097}, dt, g), bias = host({4097}, dt, g), col = host({1001, 1}, dt, g);
    expect_parity(k::add(rows, bias), k::add(to_cuda(rows), to_cuda(bias)), 0, "row-broadcast add");
    expect_parity(k::mul(rows, col), k::mul(to_cuda(rows), to_cuda(col)), 0, "column-broadcast mul");
    expect_parity(k::unary(k::Unary::Neg, raw::transpose(rows, 0, 1)),
                  k::unary(k::Unary::Neg, raw::transpose(to_cuda(rows), 0, 1)), 0, "transposed neg");
  }
}

// An operand that is a block of the trailing dims repeated over the leading ones ([T, C] against
// [B, T, C], GPT's position table; [3, T, C] against [2, 3, T, C]) takes the repeated-row kernel
// when the block is a multiple of the vector width, either operand, in either order (sub is not
// commutative), to a bool output too; [B, 1, C] is no such block and odd blocks keep the strided
// path. Exact: one rounding of the same op either way.
TEST_F(CudaParity, RepeatedBlockBroadcast) {
  using B = k::Binary;
  struct Case {
    Shape full, block;
  };
  const std::vector<Case> cases = {{{4, 64, 96}, {64, 96}},    {{4, 64, 96}, {1, 64, 96}},
                                   {{2, 3, 16, 40}, {16, 40}}, {{2, 3, 16, 40}, {3, 16, 40}},
                                   {{4, 64, 96}, {4, 1, 96}},  {{5, 7, 9}, {7, 9}}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (const Case& c : cases) {
      Tensor a = host(c.full, dt, g), b = host(c.block, dt, g);
      Tensor ga = to_cuda(a), gb = to_cuda(b);
      const std::string what = shape_str(c.full) + " with " + shape_str(c.block);
      for (B op : {B::Add, B::Sub, B::Ge}) {
        expect_parity(k::binary(op, a, b), k::binary(op, ga, gb), 0, "full op block " + what);
        expect_parity(k::binary(op, b, a), k::binary(op, gb, ga), 0, "block op full " + what);
      }
    }
}

// ---------------------------------------------------------------- reductions

struct RedCase {
  Shape shape;
  View view;
  std::vector<std::vector<int64_t>> dimsets;
};
std::vector<RedCase> red_cases() {
  auto id = [](const Tensor& t) { return t; };
  return {
      {{1}, id, {{}, {0}}},
      {{4097}, id, {{}, {0}}},
      {{5, 33, 17}, id, {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}}},
      {{17, 33, 5},
       [](const Tensor& t) {
         return raw::permute(t, {2, 1, 0});
       },
       {{}, {0}, {2}, {0, 1}}},
      {{3, 100000}, id, {{1}, {0}, {}}},  // long rows: split partials
      {{100000, 3}, id, {{0}, {1}}},      // long columns: split partials
      {{300, 1000}, id, {{0}, {1}}},
      {{2, 3000, 7}, id, {{1}, {0, 2}}},
  };
}

TEST_F(CudaParity, SumVarNaNAndIntegers) {
  // Float sum / mean / var over the reduction cases run as op-table rows, with gradients. What
  // stays: unbiased variance of one element (0/0 = NaN on both devices) and integer sums.
  for (DType dt : kFloats) {
    Tensor a = host({1}, dt, g, 0.5, 1.5);
    for (std::vector<int64_t> dims : {std::vector<int64_t>{}, {0}})
      expect_parity(k::var(a, dims, 1, false), k::var(to_cuda(a), dims, 1, false), 0, "var of one element");
  }
  for (DType dt : {DType::i64, DType::i32, DType::u8, DType::b8}) {
    Tensor a = host({33, 1000}, dt, g, 0, 100);
    for (std::vector<int64_t> dims : {std::vector<int64_t>{}, {0}, {1}})
      expect_parity(k::sum(a, dims), k::sum(to_cuda(a), dims), 0, std::string("int sum ") + dtype_name(dt));
  }
}

// Column sums split over row chunks (the bias gradients' [rows, C] sums: partial sums per chunk,
// then a kernel adding them in a fixed order). Against the f64 sum of the same values; bitwise
// the same on a second call and inside a CUDA-graph capture (deterministic). Tiles whole and
// partial (136 = 17 bf16 vectors of 8), every floating dtype.
TEST_F(CudaParity, SplitColumnSumsMatchReferenceAndRepeatBitwise) {
  for (DType dt : kFloats)
    for (Shape shape : {Shape{8192, 768}, Shape{8192, 2304}, Shape{3000, 136}, Shape{70000, 16}}) {
      const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape);
      SCOPED_TRACE(what);
      const Tensor x = host(shape, dt, g), gx = to_cuda(x);
      const Tensor once = k::sum(gx, {0});
      const Tensor again = k::sum(gx, {0});
      Tensor captured;
      {
        const cuda::Stream side = cuda::Stream::create();
        cuda::StreamGuard guard(side);
        cuda::Graph graph;
        graph.capture_begin();
        captured = k::sum(gx, {0});
        graph.capture_end();
        graph.replay();
        side.synchronize();
      }
      const std::vector<double> got = raw::to_device(once, Device::cpu()).to_vector<double>();
      EXPECT_EQ(raw::to_device(again, Device::cpu()).to_vector<double>(), got) << "second call";
      EXPECT_EQ(raw::to_device(captured, Device::cpu()).to_vector<double>(), got) << "in a capture";
      // f32 accumulation of R terms (gamma_R of the terms' magnitudes), then the result rounded
      // to dt (u |ref|): the bound of tests/rounding.h.
      const std::vector<double> xs = raw::to_dtype(x, DType::f64).to_vector<double>();
      const int64_t R = shape[0], C = shape[1];
      const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;
      int bad = 0;
      for (int64_t c = 0; c < C; ++c) {
        double ref = 0, mag = 0;
        for (int64_t r = 0; r < R; ++r) ref += xs[r * C + c], mag += std::abs(xs[r * C + c]);
        const double bound = mg::testing::gamma_k(R, acc) * mag + unit_roundoff(dt) * std::abs(ref);
        if (!(std::abs(got[c] - ref) <= bound) && ++bad <= 3)
          ADD_FAILURE() << "column " << c << ": " << got[c] << " vs " << ref << " (bound " << bound << ")";
      }
    }
}

// kernels::DeferredIndexChecks: inside a scope a bad index does not raise at the call (the gather
// skips it), and finish() raises the IndexError the call raises outside a scope, word for word.
// A scope left without finish() raises nothing; scopes nest, each finishing its own checks; the
// rows of good indices are right; checks past the 64 pinned slots are made at once.
TEST_F(CudaParity, DeferredIndexChecksRaiseAtFinish) {
  const Tensor ha = host({10, 4}, DType::f32, g), a = to_cuda(ha);
  const Tensor hgood = from_vector<int64_t>({0, 9, 4}, {3});
  const Tensor bad = to_cuda(from_vector<int64_t>({1, 12, 3}, {3})), good = to_cuda(hgood);
  const std::string direct = error_of<IndexError>([&] { k::index_select(a, 0, bad); });
  EXPECT_NE(direct.find("12"), std::string::npos) << direct;
  {
    k::DeferredIndexChecks scope;
    EXPECT_NO_THROW(k::index_select(a, 0, bad));
    k::index_select(a, 0, good);
    EXPECT_EQ(scope.pending(), 2u);
    EXPECT_EQ(error_of<IndexError>([&] { scope.finish(); }), direct);
    EXPECT_EQ(scope.pending(), 0u);
  }
  {
    k::DeferredIndexChecks left;  // destroyed without finish(): nothing raised
    k::index_select(a, 0, bad);
  }
  {
    k::DeferredIndexChecks outer;
    k::index_select(a, 0, good);
    {
      k::DeferredIndexChecks inner;
      k::index_select(a, 0, bad);
      EXPECT_EQ(outer.pending(), 1u);
      EXPECT_EQ(inner.pending(), 1u);
      EXPECT_EQ(error_of<IndexError>([&] { inner.finish(); }), direct);
    }
    EXPECT_NO_THROW(outer.finish());
  }
  {
    k::DeferredIndexChecks scope;
    const Tensor rows = k::index_select(a, 0, good);
    scope.finish();
    expect_parity(k::index_select(ha, 0, hgood), rows, 0, "index_select in a scope");
  }
  {
    k::DeferredIndexChecks scope;
    for (int i = 0; i < 70; ++i) k::index_select(a, 0, good);
    EXPECT_EQ(scope.pending(), 64u);
    EXPECT_EQ(error_of<IndexError>([&] { k::index_select(a, 0, bad); }), direct);  // no slot: at once
    EXPECT_NO_THROW(scope.finish());
  }
}

TEST_F(CudaParity, MaxMinArgmax) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64, DType::i32, DType::u8})
    for (const auto& c : red_cases())
      for (int64_t dim = 0; dim < static_cast<int64_t>(c.shape.size()); ++dim) {
        // Few distinct values: ties must resolve to the first index on both devices.
        Tensor a = host(c.shape, dt, g, 0, 8);
        if (is_floating(dt)) a = k::unary(k::Unary::Sign, k::add_scalar(a, -4));
        Tensor ga = to_cuda(a);
        const std::string what = std::string(dtype_name(dt)) + " " + shape_str(c.shape) + " dim " + std::to_string(dim);
        auto [v, i] = k::max(c.view(a), dim);
        auto [gv, gi] = k::max(c.view(ga), dim);
        expect_parity(v, gv, 0, "max values " + what);
        expect_parity(i, gi, 0, "max indices " + what);
        auto [v2, i2] = k::min(c.view(a), dim, true);
        auto [gv2, gi2] = k::min(c.view(ga), dim, true);
        expect_parity(v2, gv2, 0, "min values " + what);
        expect_parity(i2, gi2, 0, "min indices " + what);
        expect_parity(k::argmax(c.view(a), -1), k::argmax(c.view(ga), -1), 0, "argmax " + what);
      }
  // NaN wins, at its first index.
  Tensor a = host({4, 5000}, DType::f32, g);
  std::vector<float> v = a.to_vector<float>();
  v[3] = NAN, v[7] = NAN, v[5000 + 4999] = NAN;
  a = from_vector(v, {4, 5000});
  for (int64_t dim : {0, 1}) {
    auto [x, i] = k::max(a, dim);
    auto [gx, gi] = k::max(to_cuda(a), dim);
    expect_parity(x, gx, 0, "max NaN");
    expect_parity(i, gi, 0, "argmax NaN");
  }
  Tensor big = host({3000000}, DType::f32, g);
  expect_parity(k::max_all(big), k::max_all(to_cuda(big)), 0, "max_all 3M");
}

TEST_F(CudaParity, SumToSumSquaresNonfinite) {
  for (DType dt : kFloats) {
    const double tol = std::max(tol_of(dt), 1e-5);
    Tensor gr = host({8, 33, 40}, dt, g, 0.5, 1.5);
    for (const Shape& s : {Shape{40}, Shape{33, 1}, Shape{1, 40}, Shape{8, 1, 40}, Shape{}})
      expect_parity(k::sum_to(gr, s), k::sum_to(to_cuda(gr), s), tol, "sum_to " + shape_str(s));
    for (int64_t n : {1, 33, 1000, 4097, 1000003}) {
      Tensor a = host({n}, dt, g);
      expect_parity(k::sum_squares(a), k::sum_squares(to_cuda(a)), std::max(tol_of(dt), 1e-5), "sum_squares");
      EXPECT_FALSE(k::has_nonfinite(to_cuda(a)));
      for (double bad : {INFINITY, -INFINITY, NAN}) {
        std::vector<double> v = a.to_vector<double>();
        v[n - 1] = bad;
        Tensor b = raw::to_dtype(from_vector(v, {n}, {DType::f64}), dt);
        EXPECT_TRUE(k::has_nonfinite(to_cuda(b))) << n;
        EXPECT_TRUE(k::has_nonfinite(raw::slice(to_cuda(b), 0, n - 1, n, 1)));
      }
    }
  }
  EXPECT_FALSE(k::has_nonfinite(to_cuda(host({33}, DType::i32, g))));
  Tensor t = raw::transpose(host({33, 40}, DType::f32, g), 0, 1);
  expect_parity(k::sum_squares(t), k::sum_squares(to_cuda(raw::contiguous(t))), 1e-5, "sum_squares transposed");
}

// ---------------------------------------------------------------- linear algebra

TEST_F(CudaParity, Gemm) {
  struct Dims {
    int64_t n, k, m;
  };
  for (DType dt : kFloats) {
    const double tol = tol_of(dt, true);
    for (Dims d : {Dims{33, 65, 17}, Dims{1, 1000, 1}, Dims{128, 64, 96}, Dims{5, 1, 7}, Dims{4097, 3, 2}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (double beta : {0.0, 0.5}) {
            Tensor a = host(ta ? Shape{d.k, d.n} : Shape{d.n, d.k}, dt, g);
            Tensor b = host(tb ? Shape{d.m, d.k} : Shape{d.k, d.m}, dt, g);
            Tensor c = host({d.n, d.m}, dt, g), gc = to_cuda(c);
            k::gemm(a, ta, b, tb, c, 1.5, beta);
            k::gemm(to_cuda(a), ta, to_cuda(b), tb, gc, 1.5, beta);
            expect_parity(c, gc, tol,
                          "gemm " + std::to_string(d.n) + "x" + std::to_string(d.k) + "x" + std::to_string(d.m) +
                              (ta ? " ta" : "") + (tb ? " tb" : ""));
          }
    // Operands that need a copy (stepped), a column-major output, and a stepped output.
    Tensor a = host({33, 130}, dt, g), b = host({65, 17}, dt, g);
    auto av = [](const Tensor& t) { return raw::slice(t, 1, 0, 130, 2); };
    Tensor c = empty({17, 33}, {dt}), gc = empty({17, 33}, {dt, Device::cuda(0)});
    k::gemm(av(a), false, b, false, raw::transpose(c, 0, 1), 1.0, 0.0);
    k::gemm(av(to_cuda(a)), false, to_cuda(b), false, raw::transpose(gc, 0, 1), 1.0, 0.0);
    expect_parity(c, gc, tol, "gemm stepped a, column-major out");
    Tensor c2 = zeros({33, 34}, {dt}), gc2 = zeros({33, 34}, {dt, Device::cuda(0)});
    k::gemm(av(a), false, b, false, raw::slice(c2, 1, 0, 34, 2), 1.0, 1.0);
    k::gemm(av(to_cuda(a)), false, to_cuda(b), false, raw::slice(gc2, 1, 0, 34, 2), 1.0, 1.0);
    expect_parity(c2, gc2, tol, "gemm stepped out");
  }
}

// ---------------------------------------------------------------- softmax family

TEST_F(CudaParity, SoftmaxNonFiniteAndTransposed) {
  // The shape sweep (rows of 1 to 20000, every dim) runs as op-table rows with gradients.
  // Rows with -inf entries, an all -inf row, and a transposed input.
  std::vector<float> v(4 * 40, 0.f);
  Generator g2(3);
  Tensor r = randn({4 * 40}, {DType::f32}, &g2);
  v = r.to_vector<float>();
  v[0] = -INFINITY, v[5] = -INFINITY;
  for (int j = 0; j < 40; ++j) v[40 + j] = -INFINITY;
  v[120] = INFINITY;
  Tensor a = from_vector(v, {4, 40});
  for (bool log : {false, true}) {
    expect_parity(log ? k::log_softmax(a, 1) : k::softmax(a, 1),
                  log ? k::log_softmax(to_cuda(a), 1) : k::softmax(to_cuda(a), 1), 1e-5, "softmax inf rows");
    Tensor t = raw::transpose(a, 0, 1);
    Tensor gt = raw::transpose(to_cuda(a), 0, 1);
    expect_parity(log ? k::log_softmax(t, 0) : k::softmax(t, 0), log ? k::log_softmax(gt, 0) : k::softmax(gt, 0), 1e-5,
                  "softmax transposed");
  }
}

// log_softmax's outputs near 0 at large logits, in f16/bf16: a row of one m and n - 1 values
// m - 16 has a maximum output of -log(1 + (n - 1) e^-16), about -7e-6 for n = 64. The
// exponentials must see x - m, not x log2(e) - m log2(e) with m log2(e) rounded, whose error of up
// to |m| 2^-24 (6e-5 at m = 1000) would land whole in those outputs. Against f64 from the same
// (exact) inputs: x - m exact, the sum of n terms off by (n - 1) u of itself and each term by its
// exp's 20 u or so, the log's and the subtraction's roundings, then the rounding to the dtype.
TEST_F(CudaParity, LogSoftmaxSmallOutputsAtLargeLogits) {
  const double u = unit_roundoff(DType::f32);
  for (DType dt : {DType::f16, DType::bf16})
    for (int64_t n : {int64_t{64}, int64_t{4096}})
      for (double m : {1000.0, -1000.0, 300.0}) {
        const int64_t M = 3;
        std::vector<double> v(M * n, m - 16);
        for (int64_t r = 0; r < M; ++r) v[r * n + (r * 37) % n] = m;  // the maximum somewhere else in each row
        const Tensor x = raw::to_dtype(from_vector<double>(v, {M, n}), dt);
        ASSERT_EQ(raw::to_dtype(x, DType::f64).to_vector<double>(), v);  // m and m - 16 are exact in dt
        const std::vector<double> got =
            raw::to_dtype(raw::to_device(k::log_softmax(to_cuda(x), 1), Device::cpu()), DType::f64).to_vector<double>();
        const double log_s = std::log1p(static_cast<double>(n - 1) * std::exp(-16.0));
        const double ud = unit_roundoff(dt), sub = dt == DType::f16 ? std::ldexp(1.0, -25) : std::ldexp(1.0, -134);
        for (int64_t i = 0; i < M * n; ++i) {
          const double ref = v[i] - m - log_s;
          const double pre = static_cast<double>(n + 22) * u + u * std::abs(ref);
          const double bound = pre + ud * (std::abs(ref) + pre) + sub;
          if (std::abs(got[i] - ref) > bound) {
            ADD_FAILURE() << dstr(dt) << " n=" << n << " m=" << m << " element " << i << ": " << got[i] << " vs " << ref
                          << " (bound " << bound << ")";
            break;
          }
        }
      }
}

TEST_F(CudaParity, SoftmaxLongRowsEachPath) {
  // Rows past 1024 elements take one of three paths: the row copied to shared memory (up to
  // the opt-in limit, 227 KiB on sm_90: 50304 in every dtype), read twice from memory past it
  // (60000 f32 is 234 KiB; in f16/bf16 it still fits) or when K is no multiple of the 16-byte
  // vector (4101), and, inside the shared-memory kernel, a scalar fallback for rows that start
  // off a 16-byte boundary (the views one element in). The reference is the f64 softmax of the
  // same values rounded to dt: the CPU's own f32 kernel sums a row in order, an error that grows
  // with K (5e-5 relative at 50304, seen), where the CUDA kernels' per-thread partial sums of at
  // most 59 terms and a 10-level tree stay within tol_of(f32) = 1e-5; each f16/bf16 output is
  // one rounding of an f32 result (tol_of).
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t K : {2048, 50304, 60000, 4101}) {
      Tensor a = host({3, K + 8}, dt, g, -5, 5), ga = to_cuda(a);
      for (int64_t start : {0, 1}) {
        Tensor v = raw::slice(a, 1, start, start + K, 1), gv = raw::slice(ga, 1, start, start + K, 1);
        Tensor v64 = raw::to_dtype(v, DType::f64);
        const std::string what =
            "softmax over " + std::to_string(K) + " from " + std::to_string(start) + ", " + dstr(dt);
        expect_parity(raw::to_dtype(k::softmax(v64, 1), dt), k::softmax(gv, 1), tol_of(dt), what);
        expect_parity(raw::to_dtype(k::log_softmax(v64, 1), dt), k::log_softmax(gv, 1), tol_of(dt), "log " + what);
      }
    }
  }
}

// ---------------------------------------------------------------- indexing

Tensor idx_tensor(const std::vector<int64_t>& v, const Shape& s, DType dt = DType::i64) {
  return raw::to_dtype(from_vector(v, s), dt);
}

std::vector<int64_t> rand_idx(Generator& g, int64_t n, int64_t lo, int64_t hi) {
  return randint(lo, hi, {n}, {DType::i64}, &g).to_vector<int64_t>();
}

TEST_F(CudaParity, OneHotGatherScatter) {
  for (DType it : {DType::i64, DType::i32}) {
    Tensor lab = idx_tensor(rand_idx(g, 1000, 0, 10), {10, 100}, it);
    expect_parity(k::one_hot(lab, 10), k::one_hot(to_cuda(lab), 10), 0, "one_hot");
    EXPECT_THROW(k::one_hot(to_cuda(lab), 5), IndexError);
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64, DType::i32, DType::u8}) {
      Tensor a = host({33, 40}, dt, g, 0, 50), ga = to_cuda(a);
      for (int64_t dim : {0, 1}) {
        const int64_t size = a.size(dim);
        Tensor idx = idx_tensor(rand_idx(g, 20 * 30, 0, size), {20, 30}, it), gidx = to_cuda(idx);
        expect_parity(k::gather(a, dim, idx), k::gather(ga, dim, gidx), 0, "gather");
        const int64_t tsize = a.size(1 - dim);  // the transposed view's size along dim
        Tensor tidx = idx_tensor(rand_idx(g, 20 * 30, 0, tsize), {20, 30}, it);
        expect_parity(k::gather(raw::transpose(a, 0, 1), dim, tidx),
                      k::gather(raw::transpose(ga, 0, 1), dim, to_cuda(tidx)), 0, "gather transposed");
        // scatter_add_ (duplicates accumulate) into a copy.
        Tensor src = host({20, 30}, dt, g, 0, 5), gsrc = to_cuda(src);
        Tensor s = raw::clone(a), gs = raw::clone(ga);
        k::scatter_add_(s, dim, idx, src);
        k::scatter_add_(gs, dim, gidx, gsrc);
        expect_parity(s, gs, std::max(tol_of(dt), 1e-6), "scatter_add_");
        // scatter_ with unique targets along dim (a permutation per line), so order can't matter.
        Shape is = dim == 0 ? Shape{33, 30} : Shape{20, 40};
        std::vector<int64_t> u;
        const int64_t lines = dim == 0 ? 30 : 20;
        std::vector<std::vector<int64_t>> perms;
        for (int64_t l = 0; l < lines; ++l) perms.push_back(randperm(size, &g).to_vector<int64_t>());
        for (int64_t i = 0; i < is[0]; ++i)
          for (int64_t j = 0; j < is[1]; ++j) u.push_back(dim == 0 ? perms[j][i] : perms[i][j]);
        Tensor uidx = idx_tensor(u, is, it);
        Tensor src2 = host(is, dt, g, 0, 5);
        Tensor s2 = raw::clone(a), gs2 = raw::clone(ga);
        k::scatter_(s2, dim, uidx, src2);
        k::scatter_(gs2, dim, to_cuda(uidx), to_cuda(src2));
        expect_parity(s2, gs2, 0, "scatter_");
      }
      Tensor bad = idx_tensor({0, 40}, {1, 2}, it);
      EXPECT_THROW(k::gather(ga, 1, to_cuda(bad)), IndexError);
      EXPECT_THROW(k::scatter_add_(raw::clone(ga), 1, to_cuda(bad), to_cuda(host({1, 2}, dt, g))), IndexError);
    }
  }
}

TEST_F(CudaParity, IndexSelectIndexAddNll) {
  for (DType it : {DType::i64, DType::i32})
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64, DType::i32}) {
      Tensor a = host({33, 40, 5}, dt, g, 0, 50), ga = to_cuda(a);
      for (int64_t dim : {0, 1, 2}) {
        const int64_t size = a.size(dim);
        Tensor idx = idx_tensor(rand_idx(g, 77, 0, size), {77}, it), gidx = to_cuda(idx);
        expect_parity(k::index_select(a, dim, idx), k::index_select(ga, dim, gidx), 0, "index_select");
        expect_parity(k::index_select(raw::permute(a, {2, 0, 1}), (dim + 1) % 3, idx),
                      k::index_select(raw::permute(ga, {2, 0, 1}), (dim + 1) % 3, gidx), 0, "index_select permuted");
        Shape ss = a.sizes();
        ss[dim] = 77;
        Tensor src = host(ss, dt, g, 0, 5);
        Tensor s = raw::clone(a), gs = raw::clone(ga);
        k::index_add_(s, dim, idx, src);
        k::index_add_(gs, dim, gidx, to_cuda(src));
        expect_parity(s, gs, std::max(tol_of(dt), 1e-6), "index_add_");
        // Indices the caller vouches for (the embedding backward): the same sums, no check.
        Tensor gs2 = raw::clone(ga);
        k::index_add_(gs2, dim, gidx, to_cuda(src), k::IndexBounds::Checked);
        expect_parity(s, gs2, std::max(tol_of(dt), 1e-6), "index_add_ (checked by the caller)");
      }
      Tensor scalar_idx = idx_tensor({2}, {}, it);
      expect_parity(k::index_select(a, 1, scalar_idx), k::index_select(ga, 1, to_cuda(scalar_idx)), 0,
                    "index_select 0-d index");
      EXPECT_THROW(k::index_select(ga, 0, to_cuda(idx_tensor({33}, {1}, it))), IndexError);
      EXPECT_THROW(k::index_select(ga, 0, to_cuda(idx_tensor({-1}, {1}, it))), IndexError);
    }
  for (DType dt : kFloats)
    for (DType it : {DType::i64, DType::i32}) {
      Tensor lp = k::log_softmax(host({64, 10}, dt, g), 1);
      std::vector<int64_t> t = rand_idx(g, 64, 0, 10);
      t[3] = -100, t[10] = -100;
      Tensor tg = idx_tensor(t, {64}, it);
      expect_parity(k::nll_loss_forward(lp, tg), k::nll_loss_forward(to_cuda(lp), to_cuda(tg)), 0, "nll 2-D");
      Tensor lp4 = host({2, 10, 3, 4}, dt, g);
      Tensor tg4 = idx_tensor(rand_idx(g, 24, 0, 10), {2, 3, 4}, it);
      expect_parity(k::nll_loss_forward(lp4, tg4, 7), k::nll_loss_forward(to_cuda(lp4), to_cuda(tg4), 7), 0, "nll 4-D");
      Tensor lp1 = host({10}, dt, g);
      Tensor tg0 = idx_tensor({4}, {}, it);
      expect_parity(k::nll_loss_forward(lp1, tg0), k::nll_loss_forward(to_cuda(lp1), to_cuda(tg0)), 0, "nll 1-D");
      t[5] = 10;
      EXPECT_THROW(k::nll_loss_forward(to_cuda(lp), to_cuda(idx_tensor(t, {64}, it))), IndexError);
    }
}

TEST_F(CudaParity, CatStack) {
  // f32 and bf16 cat / stack are op-table rows (cat_transposed_part, stack_same_input_dim1).
  for (DType dt : {DType::i64}) {
    Tensor a = host({3, 33}, dt, g), b = host({5, 33}, dt, g), c = raw::transpose(host({33, 2}, dt, g), 0, 1);
    expect_parity(k::cat({a, b, c}, 0),
                  k::cat({to_cuda(a), to_cuda(b), raw::transpose(to_cuda(raw::transpose(c, 0, 1)), 0, 1)}, 0), 0,
                  "cat");
    expect_parity(k::stack({a, a}, 1), k::stack({to_cuda(a), to_cuda(a)}, 1), 0, "stack");
  }
}

TEST_F(CudaParity, NonDefaultStream) {
  // Every op launches on the current stream: results are right under a StreamGuard too.
  mg::cuda::Stream s = mg::cuda::Stream::create(0);
  Tensor a = host({33, 65}, DType::f32, g), b = host({65, 17}, DType::f32, g);
  Tensor ga = to_cuda(a), gb = to_cuda(b);
  Tensor r, y, m;
  {
    mg::cuda::StreamGuard guard(s);
    r = k::matmul(ga, gb);
    y = k::softmax(r, 1);
    m = k::sum(y, {0});
    s.synchronize();
  }
  expect_parity(k::matmul(a, b), r, 1e-4, "matmul on a side stream");
  expect_parity(k::sum(k::softmax(k::matmul(a, b), 1), {0}), m, 1e-4, "softmax+sum on a side stream");
}

}  // namespace
}  // namespace mg
