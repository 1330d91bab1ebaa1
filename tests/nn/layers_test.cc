// Linear, ReLU (in place), Dropout, Flatten and the loss modules.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "nn/nn.h"

namespace mg::nn {
namespace {

TEST(Linear, ShapesAndMatchesXWtPlusB) {
  Linear fc(5, 3);
  EXPECT_EQ(fc.weight.sizes(), (Shape{3, 5}));
  EXPECT_EQ(fc.bias.sizes(), (Shape{3}));
  Tensor x = randn({4, 5});
  Tensor y = fc(x);
  ASSERT_EQ(y.sizes(), (Shape{4, 3}));
  auto xv = x.to_vector<double>(), wv = fc.weight.to_vector<double>(), bv = fc.bias.to_vector<double>();
  auto yv = y.to_vector<double>();
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 3; ++o) {
      double ref = bv[o];
      for (int k = 0; k < 5; ++k) ref += xv[i * 5 + k] * wv[o * 5 + k];
      EXPECT_NEAR(yv[i * 3 + o], ref, 1e-5);
    }
  // Leading batch dims are kept.
  EXPECT_EQ(fc(randn({2, 6, 5})).sizes(), (Shape{2, 6, 3}));
  EXPECT_THROW(fc(randn({4, 6})), ShapeError);
  EXPECT_THROW(Linear(0, 3), ValueError);
}

TEST(Linear, NoBias) {
  Linear fc(4, 2, /*bias=*/false);
  EXPECT_FALSE(fc.bias.defined());
  EXPECT_EQ(fc.parameters().size(), 1u);
  Tensor x = randn({3, 4});
  auto y = fc(x).to_vector<double>();
  auto ref = matmul(x, fc.weight.t()).to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-5);
}

TEST(Linear, InitBoundAndSeedReproducible) {
  Generator g1(7), g2(7);
  Linear a(64, 32, true, {}, &g1), b(64, 32, true, {}, &g2);
  auto wa = a.weight.to_vector<double>(), wb = b.weight.to_vector<double>();
  EXPECT_EQ(wa, wb);
  const double bound = 1.0 / std::sqrt(64.0);
  double mx = 0;
  for (double v : wa) mx = std::max(mx, std::abs(v));
  EXPECT_LE(mx, bound + 1e-7);
  EXPECT_GT(mx, 0.9 * bound);
  for (double v : a.bias.to_vector<double>()) EXPECT_LE(std::abs(v), bound + 1e-7);
}

TEST(Linear, GradientsReachParameters) {
  Linear fc(3, 2);
  Tensor x = randn({5, 3});
  sum(fc(x)).backward();
  // d(sum(xW^T + b))/db = batch size; /dW[o, k] = sum_i x[i, k].
  for (double v : fc.bias.grad().to_vector<double>()) EXPECT_NEAR(v, 5.0, 1e-5);
  auto colsum = sum(x, {0}).to_vector<double>();
  auto gw = fc.weight.grad().to_vector<double>();
  for (int o = 0; o < 2; ++o)
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(gw[o * 3 + k], colsum[k], 1e-5);
}

TEST(ReLU, OutOfPlaceAndInPlace) {
  Tensor x = tensor({-1, 2, -3, 4}, {4});
  ReLU r;
  Tensor y = r(x);
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0, 2, 0, 4}));
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{-1, 2, -3, 4}));

  ReLU ri(/*inplace=*/true);
  Tensor x2 = tensor({-1, 2, -3, 4}, {4});
  Tensor y2 = ri(x2);
  EXPECT_TRUE(y2.is_same(x2));
  EXPECT_EQ(x2.to_vector<double>(), (std::vector<double>{0, 2, 0, 4}));
}

TEST(ReLU, InPlaceKeepsGradientsRight) {
  Tensor w = parameter(tensor({1, -1, 2}, {3}));
  // w itself is a leaf requiring grad: in place would be illegal, so it falls back.
  ReLU ri(true);
  Tensor y0 = ri(w);
  EXPECT_FALSE(y0.is_same(w));
  // On a non-leaf it runs in place and backward still sees the right mask.
  Tensor h = mul(w, 2.0);
  Tensor y = ri(h);
  sum(y).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{2, 0, 2}));
}

TEST(Dropout, TrainAndEval) {
  Dropout d(0.5);
  Tensor x = ones({1000});
  Tensor y = d(x);
  auto v = y.to_vector<double>();
  int zeros_n = 0;
  for (double e : v) {
    EXPECT_TRUE(e == 0.0 || std::abs(e - 2.0) < 1e-6);
    zeros_n += e == 0.0;
  }
  EXPECT_GT(zeros_n, 400);
  EXPECT_LT(zeros_n, 600);
  d.eval();
  EXPECT_EQ(d(x).to_vector<double>(), x.to_vector<double>());
  EXPECT_THROW(Dropout(1.0), ValueError);
  EXPECT_THROW(Dropout(-0.1), ValueError);
}

TEST(Flatten, Dims) {
  Flatten f;
  EXPECT_EQ(f(randn({2, 1, 4, 4})).sizes(), (Shape{2, 16}));
  Flatten g(0, -1);
  EXPECT_EQ(g(randn({2, 3})).sizes(), (Shape{6}));
}

TEST(Loss, CrossEntropyModuleMatchesFunction) {
  Tensor logits = randn({4, 5});
  Tensor target = from_vector<int64_t>({0, 4, 2, 1}, {4});
  CrossEntropyLoss ce;
  EXPECT_NEAR(ce(logits, target).item(), cross_entropy(logits, target).item(), 1e-6);
  CrossEntropyLoss ce_sum("sum");
  EXPECT_NEAR(ce_sum(logits, target).item(), cross_entropy(logits, target, "sum").item(), 1e-5);
  EXPECT_THROW(CrossEntropyLoss("avg"), ValueError);
  MSELoss mse;
  EXPECT_NEAR(mse(logits, logits).item(), 0.0, 1e-7);
}

}  // namespace
}  // namespace mg::nn
