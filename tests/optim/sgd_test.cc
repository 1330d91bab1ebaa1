// SGD against hand-computed updates (PyTorch's rule), param groups, lazy state, validation.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "nn/nn.h"
#include "optim/sgd.h"

namespace mg::optim {
namespace {

struct Case {
  const char* name;
  SGDOptions opts;
  std::vector<std::vector<double>> expected;  // p after steps 1, 2, 3
};

SGDOptions make(double lr, double momentum = 0, double dampening = 0, double wd = 0, bool nesterov = false,
                bool maximize = false) {
  return {.lr = lr,
          .momentum = momentum,
          .dampening = dampening,
          .weight_decay = wd,
          .nesterov = nesterov,
          .maximize = maximize};
}

// p0 = [1, -2]; gradients g1 = [0.5, 1], g2 = [-0.25, 0.5], g3 = [1, -1]. Expected values
// worked out from torch.optim.SGD's update rule (momentum, e.g.: b1 = g1, p1 = 1 - 0.1*0.5
// = 0.95; b2 = 0.9*0.5 - 0.25 = 0.2, p2 = 0.93; b3 = 0.18 + 1 = 1.18, p3 = 0.812).
const std::vector<Case> kCases = {
    {"plain", make(0.1), {{0.95, -2.1}, {0.975, -2.15}, {0.875, -2.05}}},
    {"momentum", make(0.1, 0.9), {{0.95, -2.1}, {0.93, -2.24}, {0.812, -2.266}}},
    {"nesterov", make(0.1, 0.9, 0, 0, true), {{0.905, -2.19}, {0.912, -2.366}, {0.7058, -2.2894}}},
    {"weight_decay", make(0.1, 0, 0, 0.01), {{0.949, -2.098}, {0.973051, -2.145902}, {0.872077949, -2.043756098}}},
    {"dampening", make(0.1, 0.9, 0.5), {{0.95, -2.1}, {0.9175, -2.215}, {0.83825, -2.2685}}},
    {"nesterov_weight_decay",
     make(0.05, 0.8, 0, 0.1, true),
     {{0.946, -2.072}, {0.940786, -2.123952}, {0.831931726, -2.044686032}}},
    {"maximize", make(0.1, 0.5, 0, 0, false, true), {{1.05, -1.9}, {1.05, -1.8}, {1.15, -1.85}}},
};

TEST(SGD, MatchesHandComputedUpdates) {
  const std::vector<std::vector<double>> grads = {{0.5, 1.0}, {-0.25, 0.5}, {1.0, -1.0}};
  for (const Case& c : kCases) {
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(std::string(c.name) + (dt == DType::f64 ? " f64" : " f32"));
      Tensor p = nn::parameter(from_vector<double>({1.0, -2.0}, {2}, {dt}));
      SGD opt({p}, c.opts);
      for (int s = 0; s < 3; ++s) {
        p.set_grad(from_vector<double>(grads[s], {2}, {dt}));
        const uint32_t v = p.version();
        opt.step();
        EXPECT_NE(p.version(), v) << "step must bump the parameter's version";
        auto got = p.to_vector<double>();
        const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
        EXPECT_NEAR(got[0], c.expected[s][0], tol) << "step " << s + 1;
        EXPECT_NEAR(got[1], c.expected[s][1], tol) << "step " << s + 1;
      }
      // The gradient itself is never modified by the update.
      EXPECT_EQ(p.grad().to_vector<double>(), grads[2]);
    }
  }
}

TEST(SGD, StateIsLazyAndCountedAsOptimizerState) {
  Tensor a = nn::parameter(ones({1000}));
  Tensor b = nn::parameter(ones({10}));
  SGD opt({a, b}, make(0.1, 0.9));
  EXPECT_EQ(opt.state_size(), 0u);
  EXPECT_EQ(opt.state(a), nullptr);
  auto& stats = CategoryStats::get(Device::cpu());
  const int64_t before = stats.counter(MemoryCategory::OptimizerState).current;
  a.set_grad(ones({1000}));
  opt.step();  // b has no gradient: no state for it
  EXPECT_EQ(opt.state_size(), 1u);
  ASSERT_NE(opt.state(a), nullptr);
  EXPECT_EQ(opt.state(b), nullptr);
  EXPECT_TRUE(opt.state(a)->buffers.at("momentum_buffer").defined());
  EXPECT_EQ(opt.state(a)->step, 1);
  EXPECT_EQ(opt.state_nbytes(), 4000);
  EXPECT_EQ(stats.counter(MemoryCategory::OptimizerState).current - before, 4000);
  // Without momentum there is no state at all.
  Tensor c = nn::parameter(ones({10}));
  SGD plain({c}, make(0.1));
  c.set_grad(ones({10}));
  plain.step();
  EXPECT_EQ(plain.state_size(), 0u);
}

TEST(SGD, ParamGroupsWithTheirOwnLr) {
  // The seeds' example: a pretrained backbone at 1e-5, a fresh head at 1e-3.
  auto backbone = std::make_shared<nn::Linear>(4, 4, true, TensorOptions(DType::f64));
  auto head = std::make_shared<nn::Linear>(4, 2, true, TensorOptions(DType::f64));
  SGD opt({{backbone->parameters(), {{"lr", 1e-5}}}, {head->parameters(), {{"lr", 1e-3}}}}, make(1e-2, 0.9));
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].lr(), 1e-5);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].lr(), 1e-3);
  // Unset options fall back to the defaults.
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].get("momentum"), 0.9);

  const auto bw = backbone->weight.to_vector<double>(), hw = head->weight.to_vector<double>();
  for (auto& p : backbone->parameters()) p.set_grad(ones_like(p));
  for (auto& p : head->parameters()) p.set_grad(ones_like(p));
  opt.step();
  auto bw1 = backbone->weight.to_vector<double>(), hw1 = head->weight.to_vector<double>();
  for (size_t i = 0; i < bw.size(); ++i) EXPECT_NEAR(bw[i] - bw1[i], 1e-5, 1e-9);
  for (size_t i = 0; i < hw.size(); ++i) EXPECT_NEAR(hw[i] - hw1[i], 1e-3, 1e-8);

  // A scheduler-style edit takes effect on the next step.
  opt.param_groups()[1].set_lr(0.0);
  opt.zero_grad();
  EXPECT_FALSE(head->weight.grad().defined());
  for (auto& p : head->parameters()) p.set_grad(zeros_like(p));
  opt.step();  // momentum carries on, but lr 0 leaves the head where it was
  auto hw2 = head->weight.to_vector<double>();
  for (size_t i = 0; i < hw.size(); ++i) EXPECT_EQ(hw1[i], hw2[i]);
}

TEST(SGD, AddParamGroupAndDuplicates) {
  Tensor a = nn::parameter(ones({2})), b = nn::parameter(ones({2}));
  SGD opt({a, a}, make(0.1));  // a repeat within a group is folded
  EXPECT_EQ(opt.param_groups()[0].params.size(), 1u);
  EXPECT_THROW(opt.add_param_group({{a}, {}}), ValueError);  // already in group 0
  opt.add_param_group({{b}, {{"lr", 0.5}}});
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].lr(), 0.5);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].get("momentum"), 0.0);
}

TEST(SGD, BadOptionsAreValueErrors) {
  Tensor p = nn::parameter(ones({2}));
  EXPECT_THROW(SGD({p}, make(-0.1)), ValueError);
  EXPECT_THROW(SGD({p}, make(0.1, -0.5)), ValueError);
  EXPECT_THROW(SGD({p}, make(0.1, 0.9, 0, -1)), ValueError);
  EXPECT_THROW(SGD({p}, make(0.1, 0, 0, 0, /*nesterov=*/true)), ValueError);
  EXPECT_THROW(SGD({p}, make(0.1, 0.9, 0.1, 0, /*nesterov=*/true)), ValueError);
  EXPECT_THROW(SGD(std::vector<ParamGroup>{{{p}, {{"learning_rate", 0.1}}}}, make(0.1)), ValueError);
  EXPECT_THROW(SGD(std::vector<ParamGroup>{{{p}, {{"lr", -1.0}}}}, make(0.1)), ValueError);
  try {
    SGD({p}, make(-0.1));
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("learning rate"), std::string::npos) << e.what();
  }
  // A non-leaf cannot be optimized; neither can an integer tensor.
  Tensor nonleaf = mul(p, 2.0);
  EXPECT_THROW(SGD({nonleaf}, make(0.1)), ValueError);
  EXPECT_THROW(SGD({zeros({2}, {DType::i64})}, make(0.1)), DTypeError);
  // A group made invalid after construction is caught at step().
  SGD opt({p}, make(0.1));
  opt.param_groups()[0].set_lr(-1.0);
  p.set_grad(ones({2}));
  EXPECT_THROW(opt.step(), ValueError);
}

TEST(SGD, ZeroGradModes) {
  Tensor p = nn::parameter(ones({3}));
  SGD opt({p}, make(0.1));
  p.set_grad(ones({3}));
  opt.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().to_vector<double>(), (std::vector<double>{0, 0, 0}));
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  opt.step();  // no gradient: nothing happens
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1, 1, 1}));
}

TEST(SGD, TrainsALinearRegression) {
  // y = 3x - 1 from 64 points; SGD with momentum recovers the coefficients.
  manual_seed(0);
  Tensor x = randn({64, 1});
  Tensor y = add(mul(x, 3.0), -1.0);
  nn::Linear fc(1, 1);
  SGD opt(fc.parameters(), make(0.1, 0.9));
  double loss = 0;
  for (int i = 0; i < 200; ++i) {
    opt.zero_grad();
    Tensor l = mse_loss(fc(x), y);
    l.backward();
    opt.step();
    loss = l.item();
  }
  EXPECT_LT(loss, 1e-6);
  EXPECT_NEAR(fc.weight.item(), 3.0, 1e-3);
  EXPECT_NEAR(fc.bias.item(), -1.0, 1e-3);
}

}  // namespace
}  // namespace mg::optim
