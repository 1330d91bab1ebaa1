// LR schedulers step by step against sequences worked out by hand from PyTorch's closed forms
// (and, for ReduceLROnPlateau, its documented rules), plus chaining and state_dict resumes.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/nn.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"

namespace mg::optim {
namespace {

std::unique_ptr<SGD> make_sgd(double lr, int groups = 1) {
  std::vector<ParamGroup> gs;
  for (int i = 0; i < groups; ++i) gs.push_back({{nn::parameter(ones({2}))}, {{"lr", lr * (i + 1)}}});
  SGDOptions o;
  o.lr = lr;
  o.momentum = 0.9;
  return std::make_unique<SGD>(gs, o);
}

// lr of group 0 at epochs 0, 1, ... (the value after construction, then after each step()).
std::vector<double> run(LRScheduler& s, Optimizer& opt, size_t n) {
  std::vector<double> out = {opt.param_groups()[0].lr()};
  while (out.size() < n) {
    s.step();
    out.push_back(opt.param_groups()[0].lr());
    EXPECT_DOUBLE_EQ(s.get_last_lr()[0], out.back());
  }
  return out;
}

void expect_seq(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << "epoch " << i;
}

TEST(LRScheduler, StepLR) {
  auto opt = make_sgd(0.1);
  StepLR s(*opt, 2, 0.5);
  expect_seq(run(s, *opt, 7), {0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.0125});
}

TEST(LRScheduler, MultiStepLR) {
  auto opt = make_sgd(1.0);
  MultiStepLR s(*opt, {2, 5, 5}, 0.1);  // a repeated milestone counts twice
  expect_seq(run(s, *opt, 7), {1, 1, 0.1, 0.1, 0.1, 0.001, 0.001});
}

TEST(LRScheduler, ExponentialLR) {
  auto opt = make_sgd(2.0);
  ExponentialLR s(*opt, 0.5);
  expect_seq(run(s, *opt, 5), {2, 1, 0.5, 0.25, 0.125});
}

TEST(LRScheduler, CosineAnnealingLR) {
  // eta_min + (base - eta_min)(1 + cos(pi e / 4)) / 2 with base 1, eta_min 0.2:
  // cos(pi/4) = 0.70710678..., so e=1: 0.2 + 0.8 * 0.85355339 = 0.88284271...
  auto opt = make_sgd(1.0);
  CosineAnnealingLR s(*opt, 4, 0.2);
  const double c = std::sqrt(0.5);
  expect_seq(run(s, *opt, 9), {1.0, 0.2 + 0.4 * (1 + c), 0.6, 0.2 + 0.4 * (1 - c), 0.2, 0.2 + 0.4 * (1 - c), 0.6,
                               0.2 + 0.4 * (1 + c), 1.0});
}

TEST(LRScheduler, LinearWarmup) {
  auto opt = make_sgd(0.4);
  LinearLR s(*opt, 0.25, 1.0, 3);
  expect_seq(run(s, *opt, 6), {0.1, 0.2, 0.3, 0.4, 0.4, 0.4});
}

TEST(LRScheduler, SequentialWarmupThenCosine) {
  auto opt = make_sgd(1.0, 2);
  auto warm = std::make_shared<LinearLR>(*opt, 0.25, 1.0, 3);
  auto cos = std::make_shared<CosineAnnealingLR>(*opt, 4);
  SequentialLR s(*opt, {warm, cos}, {3});
  // The cosine counts from 0 again at the milestone, from the same base lr.
  expect_seq(run(s, *opt, 9), {0.25, 0.5, 0.75, 1.0, (1 + std::sqrt(0.5)) / 2, 0.5, (1 - std::sqrt(0.5)) / 2, 0.0,
                               (1 - std::sqrt(0.5)) / 2});
  // The second group (base 2) follows the same schedule at twice the value.
  EXPECT_NEAR(opt->param_groups()[1].lr(), 2 * (1 - std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_THROW(SequentialLR(*opt, {warm, cos}, {}), ValueError);
  auto other = make_sgd(1.0);
  auto foreign = std::make_shared<StepLR>(*other, 1);
  EXPECT_THROW(SequentialLR(*opt, {warm, foreign}, {3}), ValueError);
}

TEST(LRScheduler, ChainedWarmupTimesExponential) {
  // PyTorch's ChainedScheduler(LinearLR(0.5, 1, 2), ExponentialLR(0.5)) from lr 1: the
  // factors multiply: 0.5 * 1, 0.75 * 0.5, 1 * 0.25, 1 * 0.125.
  auto opt = make_sgd(1.0);
  auto warm = std::make_shared<LinearLR>(*opt, 0.5, 1.0, 2);
  auto decay = std::make_shared<ExponentialLR>(*opt, 0.5);
  ChainedScheduler s(*opt, {warm, decay});
  expect_seq(run(s, *opt, 5), {0.5, 0.375, 0.25, 0.125, 0.0625});
  EXPECT_THROW(ChainedScheduler(*opt, {}), ValueError);
}

TEST(LRScheduler, BadArgumentsAreValueErrors) {
  auto opt = make_sgd(0.1);
  EXPECT_THROW(StepLR(*opt, 0), ValueError);
  EXPECT_THROW(CosineAnnealingLR(*opt, 0), ValueError);
  EXPECT_THROW(LinearLR(*opt, 0.0), ValueError);
  EXPECT_THROW(LinearLR(*opt, 0.5, 1.5), ValueError);
  EXPECT_THROW(MultiStepLR(*opt, {5, 2}), ValueError);
  PlateauOptions p;
  p.factor = 1.0;
  EXPECT_THROW(ReduceLROnPlateau(*opt, p), ValueError);
  p = PlateauOptions();
  p.mode = "minimum";
  EXPECT_THROW(ReduceLROnPlateau(*opt, p), ValueError);
  p = PlateauOptions();
  p.min_lr = {0.1, 0.2, 0.3};
  EXPECT_THROW(ReduceLROnPlateau(*opt, p), ValueError);
}

TEST(LRScheduler, StateDictResumes) {
  auto a = make_sgd(1.0);
  CosineAnnealingLR sa(*a, 10, 0.1);
  for (int i = 0; i < 4; ++i) sa.step();
  StateDict sd = sa.state_dict();
  StateDict osd = a->state_dict();
  sd.meta = nlohmann::json::parse(sd.meta.dump());
  osd.meta = nlohmann::json::parse(osd.meta.dump());

  auto b = make_sgd(1.0);
  CosineAnnealingLR sb(*b, 10, 0.1);
  b->load_state_dict(osd);  // carries "initial_lr" too
  sb.load_state_dict(sd);
  EXPECT_EQ(sb.last_epoch(), 4);
  EXPECT_EQ(b->param_groups()[0].lr(), a->param_groups()[0].lr());
  for (int i = 0; i < 5; ++i) {
    sa.step();
    sb.step();
    EXPECT_EQ(b->param_groups()[0].lr(), a->param_groups()[0].lr()) << "step " << i;
  }
  StepLR wrong(*b, 3);
  EXPECT_THROW(wrong.load_state_dict(sd), ValueError);
}

TEST(ReduceLROnPlateau, MinRelWithCooldownAndMinLr) {
  // Worked by hand from PyTorch's rules: better means metric < best * (1 - 0.1); after
  // patience 2 is exceeded the lr halves (never below min_lr 0.01), then 1 cooldown epoch
  // ignores bad epochs.
  auto opt = make_sgd(0.1);
  PlateauOptions p;
  p.factor = 0.5;
  p.patience = 2;
  p.threshold = 0.1;
  p.cooldown = 1;
  p.min_lr = {0.01};
  ReduceLROnPlateau s(*opt, p);
  const std::vector<double> metrics = {1.0, 0.95, 0.93, 0.92, 0.85, 0.85, 0.85, 0.85, 0.5, 0.5,
                                       0.5, 0.5,  0.5,  0.5,  0.5,  0.5,  0.5,  0.5,  0.5, 0.5};
  const std::vector<double> want = {0.1,   0.1,    0.1,    0.05,   0.05,   0.05, 0.05, 0.025, 0.025, 0.025,
                                    0.025, 0.0125, 0.0125, 0.0125, 0.0125, 0.01, 0.01, 0.01,  0.01,  0.01};
  for (size_t i = 0; i < metrics.size(); ++i) {
    s.step(metrics[i]);
    EXPECT_NEAR(opt->param_groups()[0].lr(), want[i], 1e-15) << "epoch " << i + 1;
  }
  EXPECT_DOUBLE_EQ(s.best(), 0.5);
}

TEST(ReduceLROnPlateau, MaxAbsAndStateDict) {
  auto opt = make_sgd(1.0);
  PlateauOptions p;
  p.mode = "max";
  p.threshold_mode = "abs";
  p.threshold = 0.5;
  p.patience = 0;
  p.factor = 0.1;
  ReduceLROnPlateau s(*opt, p);
  const std::vector<double> metrics = {1.0, 1.4, 2.0, 2.4, 2.6};
  const std::vector<double> want = {1.0, 0.1, 0.1, 0.01, 0.01};
  for (size_t i = 0; i < 3; ++i) {
    s.step(metrics[i]);
    EXPECT_NEAR(opt->param_groups()[0].lr(), want[i], 1e-15) << "epoch " << i + 1;
  }
  StateDict sd = s.state_dict();
  sd.meta = nlohmann::json::parse(sd.meta.dump());
  ReduceLROnPlateau r(*opt, p);
  r.load_state_dict(sd);
  EXPECT_DOUBLE_EQ(r.best(), 2.0);
  for (size_t i = 3; i < metrics.size(); ++i) {
    r.step(metrics[i]);
    EXPECT_NEAR(opt->param_groups()[0].lr(), want[i], 1e-15) << "epoch " << i + 1;
  }
  // A fresh scheduler's best is -inf for "max": saved as null, loaded back.
  ReduceLROnPlateau fresh(*opt, p);
  StateDict fsd = fresh.state_dict();
  EXPECT_TRUE(fsd.meta["best"].is_null());
  r.load_state_dict(fsd);
  EXPECT_EQ(r.best(), -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace mg::optim
