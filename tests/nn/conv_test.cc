// Conv2d, the pooling layers and BatchNorm2d as Modules: shapes, PyTorch's init, train/eval
// semantics of the running statistics, and a small CNN end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "kernels/ops.h"
#include "nn/nn.h"

namespace mg::nn {
namespace {

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

TEST(Conv2d, ShapesAndMatchesFunctional) {
  Conv2d conv(3, 8, 3, /*stride=*/1, /*padding=*/1);
  EXPECT_EQ(conv.weight.sizes(), (Shape{8, 3, 3, 3}));
  EXPECT_EQ(conv.bias.sizes(), (Shape{8}));
  EXPECT_EQ(conv.num_parameters(), 8 * 27 + 8);
  Tensor x = randn({2, 3, 10, 9});
  Tensor y = conv(x);
  EXPECT_EQ(y.sizes(), (Shape{2, 8, 10, 9}));
  auto ref = conv2d(x, conv.weight, conv.bias, 1, 1).to_vector<double>(), got = y.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ref[i]);
  // Strided, non-square, grouped, no bias.
  Conv2d g(4, 6, {3, 1}, {2, 1}, {1, 0}, 1, /*groups=*/2, /*bias=*/false);
  EXPECT_EQ(g.weight.sizes(), (Shape{6, 2, 3, 1}));
  EXPECT_FALSE(g.bias.defined());
  EXPECT_EQ(g.parameters().size(), 1u);
  EXPECT_EQ(g(randn({1, 4, 7, 5})).sizes(), (Shape{1, 6, 4, 5}));
  // Unbatched input.
  EXPECT_EQ(conv(randn({3, 5, 5})).sizes(), (Shape{8, 5, 5}));
}

TEST(Conv2d, DefaultInitIsPyTorchs) {
  // kaiming_uniform(a = sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same bound.
  Conv2d conv(16, 32, 3);
  const double bound = 1.0 / std::sqrt(16.0 * 9.0);
  EXPECT_LE(max_abs(conv.weight), bound);
  EXPECT_GT(max_abs(conv.weight), 0.95 * bound);  // 4608 draws reach close to the edge
  EXPECT_LE(max_abs(conv.bias), bound);
  // fan_in counts in_channels / groups.
  Conv2d dw(8, 8, 3, 1, 1, 1, /*groups=*/8);
  EXPECT_LE(max_abs(dw.weight), 1.0 / 3.0);
  // A seeded generator makes init reproducible.
  Generator g1(7), g2(7);
  Conv2d a(2, 3, 2, 1, 0, 1, 1, true, {}, &g1), b(2, 3, 2, 1, 0, 1, 1, true, {}, &g2);
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>());
}

TEST(Conv2d, BadConfigurationAndInput) {
  EXPECT_THROW(Conv2d(3, 8, 3, 1, 0, 1, /*groups=*/2), ValueError);  // 3 % 2
  EXPECT_THROW(Conv2d(4, 6, 3, 1, 0, 1, /*groups=*/4), ValueError);  // 6 % 4
  EXPECT_THROW(Conv2d(0, 6, 3), ValueError);
  EXPECT_THROW(Conv2d(3, 6, 0), ValueError);
  EXPECT_THROW(Conv2d(3, 6, 3, 1, -1), ValueError);
  Conv2d conv(3, 4, 3);
  try {
    conv(randn({2, 5, 8, 8}));
    ADD_FAILURE() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("Conv2d(3, 4): expected input [N, 3, H, W]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(conv(randn({2, 3, 2, 2})), ShapeError);  // kernel larger than the input
}

TEST(Pooling, Modules) {
  Tensor x = randn({2, 3, 8, 6});
  MaxPool2d mp(2);
  EXPECT_EQ(mp.stride, Int2(2));  // defaults to the kernel size
  EXPECT_EQ(mp(x).sizes(), (Shape{2, 3, 4, 3}));
  EXPECT_EQ(MaxPool2d(3, Int2{1}, 1)(x).sizes(), (Shape{2, 3, 8, 6}));
  EXPECT_EQ(AvgPool2d(Int2{2, 3})(x).sizes(), (Shape{2, 3, 4, 2}));
  EXPECT_EQ(AdaptiveAvgPool2d({3, 4})(x).sizes(), (Shape{2, 3, 3, 4}));
  EXPECT_EQ(AdaptiveAvgPool2d(1)(x).sizes(), (Shape{2, 3, 1, 1}));
  EXPECT_TRUE(mp.parameters().empty());
  EXPECT_THROW(MaxPool2d(0), ValueError);
  EXPECT_THROW(AdaptiveAvgPool2d({0, 1}), ValueError);
}

TEST(BatchNorm2d, ParametersAndBuffers) {
  BatchNorm2d bn(4);
  EXPECT_EQ(bn.weight.to_vector<double>(), std::vector<double>(4, 1.0));
  EXPECT_EQ(bn.bias.to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_EQ(bn.running_mean.to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_EQ(bn.running_var.to_vector<double>(), std::vector<double>(4, 1.0));
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::i64);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  auto names = bn.named_buffers();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0].first, "running_mean");
  EXPECT_EQ(names[2].first, "num_batches_tracked");
  EXPECT_EQ(bn.parameters().size(), 2u);
  BatchNorm2d plain(4, 1e-5, 0.1, /*affine=*/false, /*track_running_stats=*/false);
  EXPECT_TRUE(plain.parameters().empty());
  EXPECT_TRUE(plain.buffers().empty());
}

TEST(BatchNorm2d, TrainUpdatesRunningStatsEvalUsesThem) {
  BatchNorm2d bn(2, 1e-5, 0.1);
  Tensor x = add(mul(randn({8, 2, 4, 4}, {DType::f32}), 3.0), 5.0);
  Tensor y = bn(x);
  // Training output is normalized per channel: mean ~0, biased variance ~1.
  for (double m : kernels::mean(y, {0, 2, 3}).to_vector<double>()) EXPECT_NEAR(m, 0.0, 1e-5);
  for (double v : kernels::var(y, {0, 2, 3}, 0).to_vector<double>()) EXPECT_NEAR(v, 1.0, 1e-3);
  auto bm = kernels::mean(x, {0, 2, 3}).to_vector<double>();
  auto bv = kernels::var(x, {0, 2, 3}, /*correction=*/1).to_vector<double>();
  auto rm = bn.running_mean.to_vector<double>(), rv = bn.running_var.to_vector<double>();
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(rm[c], 0.1 * bm[c], 1e-5);
    EXPECT_NEAR(rv[c], 0.9 + 0.1 * bv[c], 1e-4);  // unbiased variance
  }
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);

  bn.eval();
  Tensor z = bn(x);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(bn.running_mean.to_vector<double>(), rm);  // eval never updates
  // Eval normalizes with the running statistics: (x - rm) / sqrt(rv + eps).
  auto xv = x.to_vector<double>(), zv = z.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = static_cast<int>((i / 16) % 2);
    ASSERT_NEAR(zv[i], (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5), 1e-4);
  }
}

TEST(BatchNorm2d, CumulativeMomentumAndNoTracking) {
  BatchNorm2d cma(1, 1e-5, std::nullopt);  // momentum None: plain average of the batch means
  Tensor a = full({4, 1, 2, 2}, 2.0), b = full({4, 1, 2, 2}, 4.0);
  a = add(a, mul(randn({4, 1, 2, 2}), 0.1));
  b = add(b, mul(randn({4, 1, 2, 2}), 0.1));
  cma(a);
  cma(b);
  const double want = (kernels::mean(a).item() + kernels::mean(b).item()) / 2;
  EXPECT_NEAR(cma.running_mean.item(), want, 1e-5);
  EXPECT_EQ(cma.num_batches_tracked.item<int64_t>(), 2);

  // No running statistics: eval mode still normalizes with the batch's own statistics.
  BatchNorm2d bn(2, 1e-5, 0.1, true, /*track_running_stats=*/false);
  bn.eval();
  Tensor y = bn(add(mul(randn({6, 2, 3, 3}), 2.0), 7.0));
  for (double m : kernels::mean(y, {0, 2, 3}).to_vector<double>()) EXPECT_NEAR(m, 0.0, 1e-5);
}

TEST(BatchNorm2d, BadInputAndDtypeMove) {
  BatchNorm2d bn(3);
  EXPECT_THROW(bn(randn({2, 4, 5, 5})), ShapeError);
  EXPECT_THROW(bn(randn({2, 3})), ShapeError);
  EXPECT_THROW(bn(randn({1, 3, 1, 1})), ValueError);  // one value per channel in training
  EXPECT_THROW(BatchNorm2d(0), ValueError);
  bn.to(DType::f64);
  EXPECT_EQ(bn.running_var.dtype(), DType::f64);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::i64);  // integer buffers are not cast
  EXPECT_EQ(bn(randn({2, 3, 2, 2}, {DType::f64})).dtype(), DType::f64);
}

TEST(Cnn, TrainsEndToEndAndEveryParameterGetsAGradient) {
  manual_seed(3);
  auto model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(1, 4, 3, 1, 1), std::make_shared<BatchNorm2d>(4), std::make_shared<ReLU>(true),
      std::make_shared<MaxPool2d>(2), std::make_shared<Conv2d>(4, 8, 3, 1, 1), std::make_shared<BatchNorm2d>(8),
      std::make_shared<ReLU>(true), std::make_shared<AdaptiveAvgPool2d>(1), std::make_shared<Flatten>(),
      std::make_shared<Linear>(8, 3)});
  EXPECT_EQ(model->named_buffers()[0].first, "1.running_mean");
  Tensor x = randn({6, 1, 8, 8});
  Tensor target = from_vector<int64_t>({0, 1, 2, 0, 1, 2}, {6});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    model->zero_grad();
    Tensor loss = cross_entropy((*model)(x), target);
    loss.backward();
    if (step == 0) {
      for (auto& [name, p] : model->named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
      first = loss.item();
    }
    last = loss.item();
    NoGradGuard no_grad;
    for (Tensor& p : model->parameters()) kernels::axpby_(p, 1.0, p.grad(), -0.1);
  }
  EXPECT_LT(last, 0.5 * first);  // memorizes six examples
  model->eval();
  EXPECT_EQ((*model)(x).sizes(), (Shape{6, 3}));
}

}  // namespace
}  // namespace mg::nn
