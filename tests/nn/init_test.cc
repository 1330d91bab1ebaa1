// Initialisers: fan computation, gains, and the sample statistics of each distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "autograd/autograd_meta.h"
#include "nn/init.h"

namespace mg::nn::init {
namespace {

struct Stats {
  double mean, std, min, max;
};
Stats stats_of(const Tensor& t) {
  auto v = t.to_vector<double>();
  double m = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double s = 0, mn = v[0], mx = v[0];
  for (double x : v) {
    s += (x - m) * (x - m);
    mn = std::min(mn, x);
    mx = std::max(mx, x);
  }
  return {m, std::sqrt(s / (v.size() - 1)), mn, mx};
}

TEST(Init, FanAndGain) {
  auto [fi, fo] = calculate_fan_in_and_fan_out(empty({16, 8, 3, 3}));
  EXPECT_EQ(fi, 8 * 9);
  EXPECT_EQ(fo, 16 * 9);
  EXPECT_THROW(calculate_fan_in_and_fan_out(empty({5})), ValueError);
  EXPECT_DOUBLE_EQ(calculate_gain("relu"), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(calculate_gain("tanh"), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(calculate_gain("leaky_relu", std::sqrt(5.0)), std::sqrt(1.0 / 3.0));
  EXPECT_THROW(calculate_gain("swish"), ValueError);
}

// 200 x 500 = 100k samples: the sample std is within ~0.5% of the truth.
TEST(Init, KaimingUniform) {
  Generator g(1);
  Tensor w = empty({200, 500});
  kaiming_uniform_(w, 0.0, "fan_in", "relu", &g);
  const double bound = std::sqrt(2.0) * std::sqrt(3.0 / 500);
  Stats s = stats_of(w);
  EXPECT_NEAR(s.mean, 0.0, 0.01 * bound);
  EXPECT_NEAR(s.std, bound / std::sqrt(3.0), 0.02 * bound);
  EXPECT_GE(s.min, -bound);
  EXPECT_LE(s.max, bound);
  EXPECT_GT(s.max, 0.99 * bound);
  kaiming_uniform_(w, 0.0, "fan_out", "relu", &g);
  EXPECT_NEAR(stats_of(w).std, std::sqrt(2.0 / 200), 0.02 * std::sqrt(2.0 / 200));
  EXPECT_THROW(kaiming_uniform_(w, 0.0, "fan_sideways"), ValueError);
}

TEST(Init, KaimingNormal) {
  Generator g(2);
  Tensor w = empty({200, 500});
  kaiming_normal_(w, 0.0, "fan_in", "relu", &g);
  const double std = std::sqrt(2.0 / 500);
  Stats s = stats_of(w);
  EXPECT_NEAR(s.mean, 0.0, 0.02 * std);
  EXPECT_NEAR(s.std, std, 0.02 * std);
}

TEST(Init, Xavier) {
  Generator g(3);
  Tensor w = empty({300, 400});
  xavier_uniform_(w, 1.0, &g);
  const double bound = std::sqrt(6.0 / 700);
  Stats s = stats_of(w);
  EXPECT_NEAR(s.std, bound / std::sqrt(3.0), 0.02 * bound);
  EXPECT_LE(s.max, bound);
  xavier_normal_(w, 2.0, &g);
  EXPECT_NEAR(stats_of(w).std, 2.0 * std::sqrt(2.0 / 700), 0.04 * std::sqrt(2.0 / 700));
}

TEST(Init, UniformNormalConstant) {
  Generator g(4);
  Tensor t = empty({100000}, {DType::f64});
  init::uniform_(t, 2.0, 4.0, &g);
  Stats s = stats_of(t);
  EXPECT_NEAR(s.mean, 3.0, 0.01);
  EXPECT_GE(s.min, 2.0);
  EXPECT_LT(s.max, 4.0);
  init::normal_(t, -1.0, 0.5, &g);
  s = stats_of(t);
  EXPECT_NEAR(s.mean, -1.0, 0.01);
  EXPECT_NEAR(s.std, 0.5, 0.01);
  zeros_(t);
  EXPECT_EQ(stats_of(t).max, 0.0);
  ones_(t);
  EXPECT_EQ(stats_of(t).min, 1.0);
  constant_(t, 2.5);
  EXPECT_EQ(stats_of(t).mean, 2.5);
  EXPECT_THROW(init::uniform_(empty({2}, {DType::i64})), DTypeError);
}

TEST(Init, WorksOnParametersAndBumpsVersion) {
  Tensor p = zeros({4, 4}, {DType::f32, Device::cpu(), /*requires_grad=*/true});
  const uint32_t v = p.version();
  kaiming_uniform_(p);
  EXPECT_GT(p.version(), v);
  EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(autograd::grad_fn(p));
}

TEST(Init, SameSeedSameValues) {
  Generator a(9), b(9);
  Tensor x = empty({10, 10}), y = empty({10, 10});
  xavier_uniform_(x, 1.0, &a);
  xavier_uniform_(y, 1.0, &b);
  EXPECT_EQ(x.to_vector<double>(), y.to_vector<double>());
}

}  // namespace
}  // namespace mg::nn::init
