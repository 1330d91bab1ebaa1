// The fused bias + dropout + residual (kernels::bias_dropout_add, mg::bias_dropout_add) and
// the dropout built on it, on the CPU: the mask is the one bernoulli_ draws at the same point of
// the generator's stream; in f32 and f64 the values are the composed ops' bits; f16/bf16 round
// once; gradients against the composed ops through autograd; bad input is a clear mg::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "tests/error_of.h"
#include "tests/rounding.h"

namespace mg {
namespace {
namespace k = mg::kernels;
using mg::testing::error_of;
using mg::testing::unit_roundoff;

Tensor uniform_of(const Shape& s, DType dt, Generator& g) {
  return raw::to_dtype(uniform(s, -2, 2, {DType::f64}, &g), dt);
}

// The mask bernoulli_(1 - p) draws from a generator in `state`, as b8.
Tensor bernoulli_mask(const Shape& s, double p, PhiloxState state) {
  Generator g;
  g.set_state(state);
  Tensor m = empty(s, {DType::f32});
  bernoulli_(m, 1.0 - p, &g);
  return k::cast(m, DType::b8);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const size_t n = static_cast<size_t>(a.numel()) * dtype_size(a.dtype());
  return std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), n) == 0;
}

// Shapes whose last dim is and is not a multiple of 4 (the CUDA kernel's vector path), and a
// count that is not a multiple of 4 (a partial last Philox block).
const std::vector<Shape> kShapes = {{6, 16}, {5, 7}, {3, 2, 12}, {1, 1}};

TEST(BiasDropoutAdd, MaskIsTheBernoulliDrawAtTheSamePoint) {
  for (const Shape& s : kShapes) {
    for (double p : {0.1, 0.5, 0.9}) {
      Generator g(77), data(1);
      g.manual_seed(77);
      (void)uniform({3}, 0, 1, {DType::f32}, &g);  // not at offset 0
      const PhiloxState before = g.get_state();
      auto [out, keep] = k::bias_dropout_add(Tensor(), uniform_of(s, DType::f32, data), Tensor(), p, &g);
      ASSERT_EQ(keep.dtype(), DType::b8);
      EXPECT_TRUE(same_bits(keep, bernoulli_mask(s, p, before))) << shape_str(s) << " p=" << p;
      // The generator moved on by what the fill would draw: the next draw is the same too.
      Generator f;
      f.set_state(before);
      Tensor m = empty(s, {DType::f32});
      bernoulli_(m, 1.0 - p, &f);
      EXPECT_EQ(g.get_state().offset, f.get_state().offset);
    }
  }
}

TEST(BiasDropoutAdd, KeepsAboutOneMinusP) {
  Generator g(5), data(6);
  const double p = 0.3;
  auto [out, keep] = k::bias_dropout_add(Tensor(), uniform_of({256, 256}, DType::f32, data), Tensor(), p, &g);
  const double kept = k::sum(k::cast(keep, DType::f64)).item<double>() / (256.0 * 256.0);
  // 65536 Bernoulli(0.7) draws: standard deviation sqrt(0.21 / 65536) = 0.0018; 5 of them.
  EXPECT_NEAR(kept, 0.7, 5 * std::sqrt(0.21 / 65536));
}

// In f32 and f64 one rounding per step of the composition, in its order: the same bits.
TEST(BiasDropoutAdd, F32AndF64AreTheComposedOpsBits) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Shape& s : kShapes) {
      for (bool with_x : {false, true}) {
        for (bool with_bias : {false, true}) {
          Generator data(3), g(11);
          Tensor x = with_x ? uniform_of(s, dt, data) : Tensor();
          Tensor b = uniform_of(s, dt, data);
          Tensor bias = with_bias ? uniform_of({s.back()}, dt, data) : Tensor();
          const double p = 0.25;
          const PhiloxState st = g.get_state();
          auto [out, keep] = k::bias_dropout_add(x, b, bias, p, &g);
          Tensor mask = k::mul_scalar(k::cast(bernoulli_mask(s, p, st), dt), 1.0 / (1.0 - p));
          Tensor ref = k::mul(with_bias ? k::add(b, bias) : b, mask);
          if (with_x) ref = k::add(x, ref);
          EXPECT_TRUE(same_bits(out, ref)) << dt << " " << shape_str(s) << " x=" << with_x << " bias=" << with_bias;
          // Backward: grad * mask, the composed dropout's backward, to the bit.
          Tensor gr = uniform_of(s, dt, data);
          EXPECT_TRUE(same_bits(k::dropout_backward(gr, keep, p), k::mul(gr, mask))) << dt << " " << shape_str(s);
        }
      }
    }
  }
}

// An f32 residual stream with a bf16/f16 branch (autocast): out is f32, the branch and bias
// widened exactly, then the f32 composition's bits.
TEST(BiasDropoutAdd, F32StreamWithAHalfBranch) {
  for (DType half : {DType::bf16, DType::f16}) {
    Generator data(4), g(9);
    const Shape s = {4, 12};
    Tensor x = uniform_of(s, DType::f32, data), b = uniform_of(s, half, data), bias = uniform_of({12}, half, data);
    const double p = 0.1;
    const PhiloxState st = g.get_state();
    auto [out, keep] = k::bias_dropout_add(x, b, bias, p, &g);
    ASSERT_EQ(out.dtype(), DType::f32);
    Tensor mask = k::mul_scalar(k::cast(bernoulli_mask(s, p, st), DType::f32), 1.0 / (1.0 - p));
    Tensor ref = k::add(x, k::mul(k::add(k::cast(b, DType::f32), k::cast(bias, DType::f32)), mask));
    EXPECT_TRUE(same_bits(out, ref)) << half;
    // The gradient to the half branch: f32 grad * mask, rounded once to the branch's dtype.
    Tensor gr = uniform_of(s, DType::f32, data);
    EXPECT_TRUE(same_bits(k::dropout_backward(gr, keep, p, half), k::cast(k::mul(gr, mask), half))) << half;
  }
}

// f16/bf16 throughout: the math in f32, one rounding at the end. Against the f64 value of the
// same (already rounded) inputs: the final rounding is u(dt) |ref|; the f32 steps before it
// (bias add, scale, residual add, and the f32 scale 1 / (1 - p) itself) at most 4 u(f32) times
// the terms' magnitude |x| + |b + bias| / (1 - p).
TEST(BiasDropoutAdd, HalfPrecisionRoundsOnce) {
  for (DType dt : {DType::f16, DType::bf16}) {
    Generator data(8), g(12);
    const Shape s = {9, 20};
    Tensor x = uniform_of(s, dt, data), b = uniform_of(s, dt, data), bias = uniform_of({20}, dt, data);
    const double p = 0.2;
    const PhiloxState st = g.get_state();
    auto [out, keep] = k::bias_dropout_add(x, b, bias, p, &g);
    const std::vector<double> xv = k::cast(x, DType::f64).to_vector<double>(),
                              bv = k::cast(b, DType::f64).to_vector<double>(),
                              biv = k::cast(bias, DType::f64).to_vector<double>(),
                              mv = k::cast(bernoulli_mask(s, p, st), DType::f64).to_vector<double>(),
                              got = k::cast(out, DType::f64).to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = (bv[i] + biv[i % 20]) * mv[i] / (1.0 - p);
      const double ref = xv[i] + d;
      const double bound =
          unit_roundoff(dt) * std::abs(ref) + 4 * unit_roundoff(DType::f32) * (std::abs(xv[i]) + std::abs(d));
      ASSERT_LE(std::abs(got[i] - ref), bound) << dt << " element " << i;
    }
  }
}

// Through autograd, in f64: the fused op against x + dropout(branch + bias) from the same seed
// (the same mask): the output's bits, and the gradients of x, branch and bias (the bias's a
// column sum, in another order than the engine's broadcast reduction: 2 u(f64) per row summed).
TEST(BiasDropoutAdd, AutogradMatchesTheComposedOps) {
  Generator data(21);
  const Shape s = {3, 5, 8};
  Tensor x0 = uniform_of(s, DType::f64, data), b0 = uniform_of(s, DType::f64, data),
         bias0 = uniform_of({8}, DType::f64, data), gout = uniform_of(s, DType::f64, data);
  const auto run = [&](bool fused) {
    Tensor x = x0.detach().requires_grad_(true), b = b0.detach().requires_grad_(true),
           bias = bias0.detach().requires_grad_(true);
    manual_seed(314);
    Tensor y = fused ? bias_dropout_add(x, b, bias, 0.4, true) : add(x, dropout(add(b, bias), 0.4, true));
    y.backward(gout);
    return std::vector<Tensor>{y.detach(), x.grad(), b.grad(), bias.grad()};
  };
  const std::vector<Tensor> f = run(true), c = run(false);
  EXPECT_TRUE(same_bits(f[0], c[0]));
  EXPECT_TRUE(same_bits(f[1], c[1]));
  EXPECT_TRUE(same_bits(f[2], c[2]));
  const std::vector<double> gf = f[3].to_vector<double>(), gc = c[3].to_vector<double>();
  // 15 terms of magnitude at most |g| / (1 - p) < 2 / 0.6, summed in two orders.
  const double tol = 2 * mg::testing::gamma_k(15, DType::f64) * 15 * (2.0 / 0.6);
  for (size_t i = 0; i < gf.size(); ++i) EXPECT_NEAR(gf[i], gc[i], tol);
}

TEST(BiasDropoutAdd, OffIsThePlainAdds) {
  Generator data(2);
  Tensor x = uniform_of({4, 6}, DType::f32, data), b = uniform_of({4, 6}, DType::f32, data),
         bias = uniform_of({6}, DType::f32, data);
  const PhiloxState st = default_generator().get_state();
  for (auto [p, training] : {std::pair{0.5, false}, std::pair{0.0, true}}) {
    Tensor y = bias_dropout_add(x, b, bias, p, training);
    EXPECT_TRUE(same_bits(y, add(x, add(b, bias))));
  }
  EXPECT_EQ(default_generator().get_state().offset, st.offset) << "no draw when dropout is off";
}

TEST(BiasDropoutAdd, BadInputIsAClearError) {
  Generator data(2);
  Tensor b = uniform_of({4, 6}, DType::f32, data);
  std::string m = error_of<ValueError>([&] { k::bias_dropout_add(Tensor(), b, Tensor(), 1.0); });
  EXPECT_NE(m.find("bias_dropout_add"), std::string::npos) << m;
  EXPECT_NE(m.find("[0, 1)"), std::string::npos) << m;
  m = error_of<ValueError>([&] { bias_dropout_add(Tensor(), b, Tensor(), -0.25, true); });
  EXPECT_NE(m.find("-0.25"), std::string::npos) << m;
  m = error_of<ShapeError>([&] { k::bias_dropout_add(Tensor(), b, uniform_of({5}, DType::f32, data), 0.1); });
  EXPECT_NE(m.find("bias must be [6]"), std::string::npos) << m;
  m = error_of<ShapeError>([&] { k::bias_dropout_add(uniform_of({4, 5}, DType::f32, data), b, Tensor(), 0.1); });
  EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
  m = error_of<DTypeError>([&] {
    k::bias_dropout_add(uniform_of({4, 6}, DType::f16, data), k::cast(b, DType::bf16), Tensor(), 0.1);
  });
  EXPECT_NE(m.find("residual dtype"), std::string::npos) << m;
  m = error_of<DTypeError>([&] { k::bias_dropout_add(Tensor(), k::cast(b, DType::i64), Tensor(), 0.1); });
  EXPECT_NE(m.find("floating"), std::string::npos) << m;
  m = error_of<DTypeError>([&] { k::dropout_backward(b, b, 0.1); });
  EXPECT_NE(m.find("mask must be b8"), std::string::npos) << m;
  m = error_of<ShapeError>([&] { k::dropout_backward(b, empty({4, 5}, {DType::b8}), 0.1); });
  EXPECT_NE(m.find("dropout_backward"), std::string::npos) << m;
  m = error_of<ValueError>([&] { bias_dropout_add(Tensor(), Tensor(), Tensor(), 0.1, true); });
  EXPECT_NE(m.find("undefined"), std::string::npos) << m;
}

}  // namespace
}  // namespace mg
