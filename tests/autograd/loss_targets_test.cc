// One-hot probability targets vs class-index targets (the seeds' memory comparison): same
// loss and same logit gradient, but the index path saves O(N) and the one-hot path O(N * C).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mg {
namespace {

TEST(LossTargets, OneHotProbabilitiesEqualClassIndices) {
  Generator g(11);
  const int64_t N = 6, C = 9;
  Tensor idx = randint(0, C, {N}, {DType::i64}, &g);
  Tensor onehot = one_hot(idx, C).to(DType::f64);
  for (double e : {0.0, 0.1}) {
    Tensor a = randn({N, C}, {DType::f64}, &g).requires_grad_();
    Tensor b = a.detach().requires_grad_();
    Tensor la = cross_entropy(a, idx, "mean", -100, e), lb = cross_entropy(b, onehot, "mean", -100, e);
    EXPECT_NEAR(la.item(), lb.item(), 1e-12);
    la.backward();
    lb.backward();
    std::vector<double> ga = a.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
    for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ga[i], gb[i], 1e-12) << i;
  }
}

// What each keeps for backward at N = 4096 rows of C = 1000 classes (f32), measured by the
// allocator's live-byte counter between forward and backward.
TEST(LossTargets, ClassIndicesSaveFarLessThanOneHot) {
  const int64_t N = 4096, C = 1000;
  Generator g(12);
  Tensor logits = randn({N, C}, {DType::f32}, &g).requires_grad_();
  Tensor idx = randint(0, C, {N}, {DType::i64}, &g);
  Tensor onehot = one_hot(idx, C).to(DType::f32);
  auto& stats = CategoryStats::get(Device::cpu());
  auto peak_of = [&](const Tensor& target) {
    const int64_t before = stats.total().current;
    Tensor loss = cross_entropy(logits, target);
    const int64_t held = stats.total().current - before;  // what the graph keeps alive until backward
    loss.backward();
    return held;
  };
  const int64_t by_index = peak_of(idx), by_onehot = peak_of(onehot);
  std::printf("[loss targets] graph holds %lld bytes with class indices, %lld with one-hot (logits %lld)\n",
              static_cast<long long>(by_index), static_cast<long long>(by_onehot), static_cast<long long>(N * C * 4));
  EXPECT_LT(by_index, N * 64);      // O(N): a logsumexp and a loss per row
  EXPECT_GE(by_onehot, N * C * 4);  // at least the [N, C] log-probabilities
}

}  // namespace
}  // namespace mg
