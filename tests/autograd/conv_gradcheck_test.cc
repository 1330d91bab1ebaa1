// Finite-difference checks (f64) of conv2d, the poolings and batch_norm, one row per
// configuration (the table style of gradcheck_test.cc), plus their autograd plumbing:
// unbatched and channels-last inputs, partial requires_grad, saved-tensor version checks.
#include <string>
#include <vector>

#include "autograd/node.h"
#include "kernels/ops.h"
#include "tests/autograd/gradcheck.h"

namespace mg {
namespace {

using V = std::vector<Tensor>;

struct Row {
  std::string name;
  std::vector<Shape> shapes;  // one f64 leaf requiring grad per shape
  GradFn fn;
};

Tensor f64_param(const Shape& s, Generator* gen) {
  Tensor t = randn(s, {DType::f64}, gen);
  t.requires_grad_(true);
  return t;
}

std::vector<Row> rows() {
  std::vector<Row> r;
  auto conv = [&](std::string name, Shape x, Shape w, bool bias, Int2 s, Int2 p, Int2 d, int64_t g) {
    std::vector<Shape> shapes{x, w};
    if (bias) shapes.push_back({w[0]});
    r.push_back({std::move(name), shapes, [=](const V& v) {
                   return conv2d(v[0], v[1], bias ? v[2] : Tensor(), s, p, d, g);
                 }});
  };
  conv("conv2d_basic", {2, 3, 6, 6}, {4, 3, 3, 3}, true, 1, 0, 1, 1);
  conv("conv2d_odd_sizes", {2, 2, 7, 5}, {3, 2, 3, 2}, true, 1, 0, 1, 1);
  conv("conv2d_no_bias", {1, 3, 5, 5}, {2, 3, 3, 3}, false, 1, 1, 1, 1);
  conv("conv2d_stride_padding", {2, 2, 7, 6}, {3, 2, 3, 3}, true, {2, 1}, {1, 2}, 1, 1);
  conv("conv2d_dilation", {1, 2, 8, 7}, {2, 2, 3, 2}, true, 1, 1, {2, 3}, 1);
  conv("conv2d_groups", {2, 4, 5, 5}, {6, 2, 3, 3}, true, 1, 1, 1, 2);
  conv("conv2d_depthwise", {2, 3, 6, 5}, {3, 1, 3, 3}, false, 1, 1, 1, 3);
  conv("conv2d_depthwise_multiplier", {1, 2, 5, 5}, {4, 1, 2, 2}, true, 2, 0, 1, 2);
  conv("conv2d_1x1", {2, 5, 3, 4}, {3, 5, 1, 1}, true, 1, 0, 1, 1);
  conv("conv2d_everything", {2, 4, 9, 8}, {4, 2, 3, 2}, true, {2, 3}, {2, 1}, {2, 1}, 2);
  conv("conv2d_wide_map_per_sample_gemm", {2, 2, 9, 8}, {3, 2, 3, 3}, true, 1, 1, 1, 1);  // 72 outputs per map
  r.push_back({"conv2d_unbatched", {{2, 5, 4}, {3, 2, 2, 2}, {3}}, [](const V& v) {
                 return conv2d(v[0], v[1], v[2], 1, 1);
               }});
  r.push_back({"conv2d_channels_last", {{2, 5, 4, 3}, {2, 3, 3, 3}}, [](const V& v) {
                 return conv2d(v[0].permute({0, 3, 1, 2}), v[1], Tensor(), 1, 1);  // NHWC seen as NCHW
               }});

  // ---- pooling (random inputs: ties in a max window have probability 0) ----
  r.push_back({"max_pool2d_2x2", {{2, 3, 6, 6}}, [](const V& v) { return max_pool2d(v[0], 2); }});
  r.push_back({"max_pool2d_overlapping", {{1, 2, 7, 5}}, [](const V& v) { return max_pool2d(v[0], 3, 1); }});
  r.push_back({"max_pool2d_padding_stride", {{2, 2, 7, 6}}, [](const V& v) {
                 return max_pool2d(v[0], {3, 2}, Int2{2, 1}, {1, 1});
               }});
  r.push_back({"max_pool2d_dilation_ceil", {{1, 2, 7, 7}}, [](const V& v) {
                 return max_pool2d(v[0], 2, Int2{2}, 0, 2, /*ceil_mode=*/true);
               }});
  r.push_back({"avg_pool2d_2x2", {{2, 3, 6, 6}}, [](const V& v) { return avg_pool2d(v[0], 2); }});
  r.push_back({"avg_pool2d_overlap_padding", {{1, 2, 7, 5}}, [](const V& v) {
                 return avg_pool2d(v[0], 3, Int2{2}, 1);
               }});
  r.push_back({"avg_pool2d_exclude_pad_ceil", {{1, 2, 6, 5}}, [](const V& v) {
                 return avg_pool2d(v[0], {3, 2}, Int2{2, 2}, {1, 1}, /*ceil_mode=*/true, /*count_include_pad=*/false);
               }});
  r.push_back({"adaptive_avg_pool2d_divisible", {{2, 2, 6, 4}}, [](const V& v) { return adaptive_avg_pool2d(v[0], {3, 2}); }});
  r.push_back({"adaptive_avg_pool2d_non_divisible", {{1, 3, 7, 5}}, [](const V& v) {
                 return adaptive_avg_pool2d(v[0], {3, 4});
               }});
  r.push_back({"adaptive_avg_pool2d_upsample", {{1, 2, 2, 3}}, [](const V& v) { return adaptive_avg_pool2d(v[0], {5, 4}); }});
  r.push_back({"adaptive_avg_pool2d_global", {{3, 2, 5, 5}}, [](const V& v) { return adaptive_avg_pool2d(v[0], 1); }});

  // ---- batch norm: training mode differentiates through the batch statistics ----
  r.push_back({"batch_norm_train_4d", {{3, 2, 3, 4}, {2}, {2}}, [](const V& v) {
                 Tensor rm = zeros({2}, {DType::f64}), rv = ones({2}, {DType::f64});
                 return batch_norm(v[0], rm, rv, v[1], v[2], /*training=*/true, 0.1, 1e-5);
               }});
  r.push_back({"batch_norm_train_2d_no_running", {{5, 3}, {3}, {3}}, [](const V& v) {
                 return batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true);
               }});
  r.push_back({"batch_norm_train_no_affine", {{4, 3, 2, 2}}, [](const V& v) {
                 return batch_norm(v[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
               }});
  r.push_back({"batch_norm_eval", {{3, 2, 2, 3}, {2}, {2}}, [](const V& v) {
                 Tensor rm = tensor({0.3, -0.2}, {2}, {DType::f64}), rv = tensor({1.5, 0.7}, {2}, {DType::f64});
                 return batch_norm(v[0], rm, rv, v[1], v[2], /*training=*/false);
               }});
  r.push_back({"conv_bn_relu_pool_chain", {{2, 2, 6, 6}, {3, 2, 3, 3}, {3}}, [](const V& v) {
                 Tensor h = conv2d(v[0], v[1], Tensor(), 1, 1);
                 h = batch_norm(h, Tensor(), Tensor(), v[2], Tensor(), true);
                 return avg_pool2d(tanh(h), 2);
               }});
  return r;
}

class ConvGradcheck : public ::testing::TestWithParam<Row> {};

TEST_P(ConvGradcheck, MatchesFiniteDifferences) {
  const Row& row = GetParam();
  Generator gen(1234);
  V inputs;
  for (const Shape& s : row.shapes) inputs.push_back(f64_param(s, &gen));
  EXPECT_TRUE(gradcheck(row.fn, inputs)) << row.name;
}

INSTANTIATE_TEST_SUITE_P(Ops, ConvGradcheck, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& info) { return info.param.name; });

TEST(ConvAutograd, OnlyWeightRequiresGrad) {
  Tensor x = randn({2, 3, 5, 5}, {DType::f64});
  Tensor w = randn({4, 3, 3, 3}, {DType::f64});
  w.requires_grad_(true);
  Tensor y = conv2d(x, w);
  sum(y).backward();
  EXPECT_FALSE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().sizes(), w.sizes());
}

TEST(ConvAutograd, UnbatchedAndChannelsLastShapes) {
  Tensor x = randn({3, 6, 6});
  x.requires_grad_(true);
  Tensor y = max_pool2d(conv2d(x, randn({2, 3, 3, 3}), Tensor(), 1, 1), 2);
  EXPECT_EQ(y.sizes(), (Shape{2, 3, 3}));
  sum(y).backward();
  EXPECT_EQ(x.grad().sizes(), x.sizes());
  auto [v, idx] = max_pool2d_with_indices(randn({2, 4, 4}), 2);
  EXPECT_EQ(idx.sizes(), (Shape{2, 2, 2}));
  EXPECT_EQ(idx.dtype(), DType::i64);
}

TEST(ConvAutograd, InPlaceChangeOfSavedInputIsAnError) {
  Tensor w = randn({2, 3, 3, 3});
  w.requires_grad_(true);
  Tensor x = randn({1, 3, 4, 4});
  Tensor y = conv2d(x, w);  // saves x for the weight gradient
  kernels::fill_(x, 1.0);   // bumps x's version
  EXPECT_THROW(sum(y).backward(), AutogradError);
}

TEST(ConvAutograd, BatchNormTrainingUpdatesRunningStatsOnlyInTraining) {
  Tensor x = randn({4, 2, 3, 3}, {DType::f64});
  Tensor rm = zeros({2}, {DType::f64}), rv = ones({2}, {DType::f64});
  batch_norm(x, rm, rv, Tensor(), Tensor(), /*training=*/false);
  EXPECT_EQ(rm.to_vector<double>(), (std::vector<double>{0, 0}));
  batch_norm(x, rm, rv, Tensor(), Tensor(), /*training=*/true, /*momentum=*/0.5);
  Tensor batch_mean = kernels::mean(x, {0, 2, 3});
  auto m = batch_mean.to_vector<double>(), got = rm.to_vector<double>();
  for (int c = 0; c < 2; ++c) EXPECT_NEAR(got[c], 0.5 * m[c], 1e-12);
}

}  // namespace
}  // namespace mg
