// clip_grad_norm_ / clip_grad_value_ against hand-computed norms, the multi-tensor norm
// against a direct sum, non-finite gradients, and freezing a backbone (memory drop).
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/random.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"

namespace mg::optim {
namespace {

std::vector<Tensor> params_with_grads(DType dt = DType::f32) {
  Tensor a = nn::parameter(zeros({2}, {dt})), b = nn::parameter(zeros({1, 1}, {dt})),
         c = nn::parameter(zeros({3}, {dt}));
  a.set_grad(from_vector<double>({3, -4}, {2}, {dt}));
  b.set_grad(from_vector<double>({12}, {1, 1}, {dt}));
  // c has no gradient: skipped
  return {a, b, c};
}

TEST(ClipGradNorm, NormsAndScaling) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto ps = params_with_grads(dt);
    EXPECT_DOUBLE_EQ(clip_grad_norm_(ps, 1e9), 13.0);  // sqrt(9 + 16 + 144), nothing clipped
    EXPECT_EQ(ps[0].grad().to_vector<double>(), (std::vector<double>{3, -4}));
    EXPECT_DOUBLE_EQ(clip_grad_norm_(ps, 1e9, 1.0), 19.0);
    EXPECT_DOUBLE_EQ(clip_grad_norm_(ps, 1e9, INFINITY), 12.0);
    EXPECT_NEAR(clip_grad_norm_(ps, 1e9, 3.0), std::cbrt(27.0 + 64.0 + 1728.0), 1e-12);
    // Clip to 6.5: every gradient scaled by 6.5 / (13 + 1e-6).
    EXPECT_DOUBLE_EQ(clip_grad_norm_(ps, 6.5), 13.0);
    const double k = 6.5 / (13.0 + 1e-6);
    const double tol = dt == DType::bf16 ? 2e-2 : 1e-6;
    auto ga = ps[0].grad().to_vector<double>();
    EXPECT_NEAR(ga[0], 3 * k, tol);
    EXPECT_NEAR(ga[1], -4 * k, tol);
    EXPECT_NEAR(ps[1].grad().item(), 12 * k, tol * 4);
    EXPECT_FALSE(ps[2].grad().defined());
  }
  EXPECT_EQ(clip_grad_norm_({nn::parameter(ones({3}))}, 1.0), 0.0);  // no gradients at all
}

TEST(ClipGradNorm, NonFiniteIsReportedNotHidden) {
  auto ps = params_with_grads();
  ps[1].set_grad(from_vector<double>({INFINITY}, {1, 1}, {DType::f32}));
  try {
    clip_grad_norm_(ps, 1.0, 2.0, /*error_if_nonfinite=*/true);
    FAIL() << "an infinite norm was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ps[0].grad().to_vector<double>(), (std::vector<double>{3, -4}));  // untouched
  EXPECT_TRUE(std::isinf(clip_grad_norm_(ps, 1.0)));                          // returned, like PyTorch
  ps[1].set_grad(from_vector<double>({NAN}, {1, 1}, {DType::f32}));
  EXPECT_TRUE(std::isnan(clip_grad_norm_(ps, 1.0, INFINITY)));
  // NaN first, finite values after: still NaN, for every norm type.
  std::vector<Tensor> ts = {from_vector<double>({1, NAN, 2}, {3}), from_vector<double>({5, 6}, {2})};
  for (double p : {1.0, 2.0, 3.0, double(INFINITY)})
    EXPECT_TRUE(std::isnan(kernels::multi_tensor_norm(ts, p))) << "norm_type " << p;
  EXPECT_THROW(clip_grad_norm_(ps, -1.0), ValueError);
  EXPECT_THROW(clip_grad_norm_(ps, 1.0, 0.0), ValueError);
}

TEST(ClipGradValue, Clamps) {
  auto ps = params_with_grads();
  clip_grad_value_(ps, 3.5);
  EXPECT_EQ(ps[0].grad().to_vector<double>(), (std::vector<double>{3, -3.5}));
  EXPECT_EQ(ps[1].grad().item(), 3.5);
  EXPECT_THROW(clip_grad_value_(ps, -1.0), ValueError);
}

TEST(MultiTensorNorm, ManyTensorsMatchADirectSum) {
  manual_seed(4);
  std::vector<Tensor> ts;
  double sq = 0, mx = 0;
  for (int i = 0; i < 50; ++i) {
    Tensor t = randn({i * 37 + 1});
    if (i == 7) t = randn({8, 6}).t();  // strided
    ts.push_back(t);
    sq += kernels::sum_squares(t).item();
    mx = std::max(mx, kernels::max_all(kernels::unary(kernels::Unary::Abs, t)).item());
  }
  EXPECT_NEAR(kernels::multi_tensor_norm(ts, 2.0), std::sqrt(sq), 1e-9 * std::sqrt(sq));
  EXPECT_EQ(kernels::multi_tensor_norm(ts, INFINITY), mx);
  kernels::multi_tensor_scale_(ts, 0.5);
  EXPECT_NEAR(kernels::multi_tensor_norm(ts, 2.0), 0.5 * std::sqrt(sq), 1e-9 * std::sqrt(sq));
}

// A 3-layer backbone and a head; `frozen` turns the backbone's requires_grad off.
struct StepMemory {
  int64_t activations_peak, gradients, optimizer_state;
  int64_t backbone_nodes_grad;  // backbone params with a .grad
};

StepMemory train_step(bool frozen) {
  manual_seed(5);
  auto backbone = std::make_shared<nn::Sequential>();
  backbone->push_back(std::make_shared<nn::Linear>(256, 512));
  backbone->push_back(std::make_shared<nn::ReLU>());
  backbone->push_back(std::make_shared<nn::Linear>(512, 512));
  backbone->push_back(std::make_shared<nn::ReLU>());
  auto head = std::make_shared<nn::Linear>(512, 10);
  if (frozen) backbone->requires_grad_(false);
  std::vector<Tensor> all = backbone->parameters();
  for (auto& p : head->parameters()) all.push_back(p);
  Adam opt(all, AdamOptions());
  Tensor x = randn({64, 256});
  Tensor y = randint(0, 10, {64});

  auto& st = CategoryStats::get(Device::cpu());
  const int64_t act0 = st.counter(MemoryCategory::Activations).current;
  const int64_t grad0 = st.counter(MemoryCategory::Gradients).current;
  const int64_t opt0 = st.counter(MemoryCategory::OptimizerState).current;
  st.reset_peak();
  Tensor loss;
  {
    MemoryCategoryGuard g(MemoryCategory::Activations);
    Tensor feat = (*backbone)(x);
    EXPECT_EQ(feat.requires_grad(), !frozen) << "a frozen backbone must not record nodes";
    loss = cross_entropy((*head)(feat), y);
  }
  loss.backward();
  opt.step();
  StepMemory r;
  r.activations_peak = st.counter(MemoryCategory::Activations).peak - act0;
  r.gradients = st.counter(MemoryCategory::Gradients).current - grad0;
  r.optimizer_state = st.counter(MemoryCategory::OptimizerState).current - opt0;
  r.backbone_nodes_grad = 0;
  for (auto& p : backbone->parameters()) r.backbone_nodes_grad += p.grad().defined();
  return r;
}

TEST(Freeze, FrozenBackboneSavesActivationsGradientsAndState) {
  const StepMemory full = train_step(false), frozen = train_step(true);
  EXPECT_EQ(full.backbone_nodes_grad, 4);
  EXPECT_EQ(frozen.backbone_nodes_grad, 0);
  // Backbone parameters: 256*512 + 512 + 512*512 + 512 floats; head: 512*10 + 10.
  const int64_t backbone_bytes = 4 * (256 * 512 + 512 + 512 * 512 + 512), head_bytes = 4 * (512 * 10 + 10);
  EXPECT_EQ(full.gradients, backbone_bytes + head_bytes);
  EXPECT_EQ(frozen.gradients, head_bytes);
  EXPECT_EQ(full.optimizer_state, 2 * (backbone_bytes + head_bytes));
  EXPECT_EQ(frozen.optimizer_state, 2 * head_bytes);
  // Without the tape through the backbone its intermediate activations are freed as soon as
  // the next layer has read them: only the features the head saves stay.
  EXPECT_LT(frozen.activations_peak, full.activations_peak);
  std::cout << "activations peak: full " << full.activations_peak << " B, frozen " << frozen.activations_peak
            << " B; gradients " << full.gradients << " -> " << frozen.gradients << " B; optimizer state "
            << full.optimizer_state << " -> " << frozen.optimizer_state << " B\n";
}

}  // namespace
}  // namespace mg::optim
