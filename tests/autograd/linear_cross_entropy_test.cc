// linear_cross_entropy (the head and loss without logits) against the two ops it replaces,
// cross_entropy(linear(x, w)): same loss and gradients in f64 for every chunking, far less
// held between forward and backward, and the errors the composition would raise.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/error_of.h"
#include "tests/rounding.h"

namespace mg {
namespace {

void expect_close(const Tensor& a, const Tensor& b, double tol, const char* what) {
  const auto va = a.to(DType::f64).cpu().to_vector<double>(), vb = b.to(DType::f64).cpu().to_vector<double>();
  ASSERT_EQ(va.size(), vb.size()) << what;
  for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], tol * (1.0 + std::abs(vb[i]))) << what << " " << i;
}

// In f64 the fused op and the composition run the same products and sums, in other orders
// (chunked GEMMs, the logit gradient folded in before the 1 / count scaling): they agree to a
// few hundred f64 roundings (1e-12 relative) at these sizes.
TEST(LinearCrossEntropy, MatchesLinearThenCrossEntropyForEveryChunking) {
  Generator g(21);
  const int64_t B = 3, T = 5, K = 8, C = 37;
  Tensor x0 = randn({B, T, K}, {DType::f64}, &g), w0 = randn({C, K}, {DType::f64}, &g);
  std::vector<int64_t> labels = randint(0, C, {B * T}, {DType::i64}, &g).to_vector<int64_t>();
  labels[2] = labels[9] = -100;  // two ignored rows
  Tensor target = from_vector<int64_t>(labels, {B, T});
  for (const char* red : {"mean", "sum"}) {
    for (double e : {0.0, 0.1}) {
      for (int64_t chunk : {0, 1, 4, 7, 15, 100}) {
        SCOPED_TRACE(std::string(red) + " smoothing " + std::to_string(e) + " chunk_rows " + std::to_string(chunk));
        Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
        Tensor xr = x0.detach().requires_grad_(), wr = w0.detach().requires_grad_();
        Tensor fused = linear_cross_entropy(x, w, target, red, -100, e, chunk);
        // The fused op's classes are the last dim (a language model's [B, T, C] logits).
        Tensor ref = cross_entropy(linear(xr, wr).reshape({-1, C}), target.reshape({-1}), red, -100, e);
        EXPECT_NEAR(fused.item(), ref.item(), 1e-12 * (1.0 + std::abs(ref.item())));
        fused.backward();
        ref.backward();
        expect_close(x.grad(), xr.grad(), 1e-12, "grad x");
        expect_close(w.grad(), wr.grad(), 1e-12, "grad w");
      }
    }
  }
}

TEST(LinearCrossEntropy, OnlyTheInputThatNeedsAGradientGetsOne) {
  Generator g(22);
  Tensor x = randn({6, 4}, {DType::f64}, &g), w = randn({5, 4}, {DType::f64}, &g).requires_grad_();
  Tensor t = randint(0, 5, {6}, {DType::i64}, &g);
  linear_cross_entropy(x, w, t).backward();
  EXPECT_FALSE(x.grad().defined());
  Tensor wr = w.detach().requires_grad_();
  cross_entropy(linear(x, wr), t).backward();
  expect_close(w.grad(), wr.grad(), 1e-12, "grad w");
  // Without any gradient the loss alone, same value.
  Tensor l = linear_cross_entropy(x, w.detach(), t);
  EXPECT_FALSE(l.requires_grad());
  EXPECT_NEAR(l.item(), cross_entropy(linear(x, w.detach()), t).item(), 1e-12);
}

// Between forward and backward the composition keeps the [M, C] logits; the fused op keeps
// the two gradient accumulators, [M, K] and [C, K], plus O(M).
TEST(LinearCrossEntropy, HoldsNoLogitsBetweenForwardAndBackward) {
  const int64_t M = 2048, K = 16, C = 1000;
  Generator g(23);
  Tensor x = randn({M, K}, {DType::f32}, &g).requires_grad_(), w = randn({C, K}, {DType::f32}, &g).requires_grad_();
  Tensor t = randint(0, C, {M}, {DType::i64}, &g);
  auto& stats = CategoryStats::get(Device::cpu());
  auto held_by = [&](bool fused) {
    const int64_t before = stats.total().current;
    Tensor loss = fused ? linear_cross_entropy(x, w, t) : cross_entropy(linear(x, w), t);
    const int64_t held = stats.total().current - before;
    loss.backward();
    return held;
  };
  const int64_t composed = held_by(false), fused = held_by(true);
  std::printf("[linear_cross_entropy] graph holds %lld bytes fused, %lld composed (logits %lld)\n",
              static_cast<long long>(fused), static_cast<long long>(composed), static_cast<long long>(M * C * 4));
  EXPECT_GE(composed, M * C * 4);
  EXPECT_LE(fused, (M * K + C * K) * 4 + M * 64);
}

double rel_norm_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to(DType::f64).cpu().to_vector<double>(), vb = b.to(DType::f64).cpu().to_vector<double>();
  double d = 0, n = 0;
  for (size_t i = 0; i < va.size(); ++i) d += (va[i] - vb[i]) * (va[i] - vb[i]), n += vb[i] * vb[i];
  return std::sqrt(d / n);
}

// GPT-2's head on the device under autocast: 2048 rows, 768 features, 50304 classes, in chunks
// of 512 rows (the f32 weight-gradient accumulator and the in-place logit gradient), against
// the composition under the same autocast. Both round the logits and the logit gradient to the
// autocast dtype once and the gradients once more (the fused op at the engine's cast, the
// composition at its GEMMs' outputs); everything else accumulates in f32. So the losses agree
// to f32 sums (rows: sqrt(M) u_f32 each), the gradients normwise to the two roundings on each
// side: 4 u(dtype). f16 scales the composition's loss by 1024 (a GradScaler's job): unscaled,
// its logit gradients (about 1 / (50304 * 2048)) are below f16's smallest subnormal.
// The paths that compose (per-row losses, and CPU bf16 autocast, whose kernels are f32/f64) take
// a language model's [B, T, K] input and [B, T] targets too: the composition runs on the rows and
// gives exactly what cross_entropy gives on the flattened logits, per-row losses shaped [B, T].
TEST(LinearCrossEntropy, ComposedPathsTakeBatchedRows) {
  Generator g(25);
  const int64_t B = 2, T = 4, K = 8, C = 11;
  Tensor x = randn({B, T, K}, {DType::f32}, &g), w = randn({C, K}, {DType::f32}, &g);
  Tensor t = randint(0, C, {B, T}, {DType::i64}, &g);
  const Tensor per = linear_cross_entropy(x, w, t, "none");
  ASSERT_EQ(per.sizes(), (Shape{B, T}));
  EXPECT_EQ(per.to_vector<float>(),
            cross_entropy(linear(x, w).reshape({-1, C}), t.reshape({-1}), "none").to_vector<float>());
  Autocast ac(DeviceType::CPU, DType::bf16);
  const Tensor mean_loss = linear_cross_entropy(x, w, t);
  EXPECT_EQ(mean_loss.item(), cross_entropy(linear(x, w).reshape({-1, C}), t.reshape({-1})).item());
}

TEST(LinearCrossEntropy, CudaHalfAutocastMatchesComposition) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t M = 2048, K = 768, C = 50304;
  const Device dev = Device::cuda(0);
  Generator g(24);
  Tensor x0 = randn({M, K}, {DType::f32, dev}, &g), w0 = mul(randn({C, K}, {DType::f32, dev}, &g), 0.02);
  Tensor t = randint(0, C, {M}, {DType::i64, dev}, &g);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double scale = dt == DType::f16 ? 1024.0 : 1.0, u = testing::unit_roundoff(dt);
    Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
    Tensor xr = x0.detach().requires_grad_(), wr = w0.detach().requires_grad_();
    Tensor fused, ref;
    {
      Autocast ac(DeviceType::CUDA, dt);
      fused = linear_cross_entropy(x, w, t, "mean", -100, 0.0, 512);
      ref = cross_entropy(linear(xr, wr), t);
    }
    EXPECT_NEAR(fused.item(), ref.item(), 16 * std::sqrt(double(M)) * std::ldexp(1.0, -24) * ref.item());
    fused.backward();
    mul(ref, scale).backward();
    EXPECT_LE(rel_norm_diff(x.grad(), div(xr.grad(), scale)), 4 * u);
    EXPECT_LE(rel_norm_diff(w.grad(), div(wr.grad(), scale)), 4 * u);
  }
}

TEST(LinearCrossEntropy, BadInputRaisesNamingTheOp) {
  Tensor x = randn({6, 4}), w = randn({5, 4}), t = from_vector<int64_t>({0, 1, 2, 3, 4, 0}, {6});
  EXPECT_THROW(linear_cross_entropy(x, randn({5, 3}), t), ShapeError);
  EXPECT_THROW(linear_cross_entropy(x, randn({5}), t), ShapeError);
  EXPECT_THROW(linear_cross_entropy(x, w, from_vector<int64_t>({0, 1}, {2})), ShapeError);
  EXPECT_THROW(linear_cross_entropy(x, w, randn({6})), DTypeError);
  EXPECT_THROW(linear_cross_entropy(x, w.to(DType::f64), t), DTypeError);
  EXPECT_THROW(linear_cross_entropy(x, w, t, "avg"), ValueError);
  EXPECT_THROW(linear_cross_entropy(x, w, t, "mean", -100, 1.5), ValueError);
  EXPECT_THROW(linear_cross_entropy(x, w, t, "mean", -100, 0.0, -1), ValueError);
  const std::string msg = testing::error_of([&] {
    linear_cross_entropy(x, w, from_vector<int64_t>({0, 1, 7, 3, 4, 0}, {6}));
  });
  EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("7"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mg
