// Activation offload on the CPU: an OffloadScope leaves CPU tensors where they are (nothing is
// copied, gradients unchanged), and its options are checked. The device cases are in
// offload_cuda_test.cc.
#include "autograd/offload.h"

#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "core/random.h"

namespace mg {
namespace {

Tensor param(const Shape& s, uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(s, {DType::f32}, &g);
  t.requires_grad_(true);
  return t;
}

TEST(Offload, CpuTensorsStayAndGradientsAreUnchanged) {
  Tensor w1 = param({64, 32}, 1), w2 = param({8, 64}, 2);
  Generator g(3);
  Tensor x = randn({16, 32}, {DType::f32}, &g);
  auto loss_of = [&] { return sum(linear(gelu(linear(x, w1)), w2)); };
  loss_of().backward();
  const std::vector<float> g1 = w1.grad().to_vector<float>(), g2 = w2.grad().to_vector<float>();
  w1.set_grad(Tensor());
  w2.set_grad(Tensor());
  reset_offload_stats();
  Tensor loss;
  {
    OffloadScope offload(OffloadOptions{.min_bytes = 0});
    loss = loss_of();
  }
  loss.backward();
  EXPECT_EQ(offload_stats().offloaded_bytes, 0);
  EXPECT_EQ(offload_stats().fetched_bytes, 0);
  EXPECT_EQ(w1.grad().to_vector<float>(), g1);
  EXPECT_EQ(w2.grad().to_vector<float>(), g2);
}

TEST(Offload, NegativeOptionsAreAValueErrorNamingThem) {
  try {
    OffloadScope offload(OffloadOptions{.min_bytes = -1});
    FAIL() << "expected mg::ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("OffloadScope: min_bytes and prefetch_bytes must be >= 0, got -1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(OffloadScope(OffloadOptions{.prefetch_bytes = -5}), ValueError);
}

}  // namespace
}  // namespace mg
