// The autograd plumbing of conv2d, the poolings and batch_norm: partial requires_grad,
// unbatched and channels-last shapes, saved-tensor version checks, running statistics. Their
// gradients and device parity are rows of the op table (op_table_nn.cc).
#include <string>
#include <vector>

#include "autograd/node.h"
#include "kernels/ops.h"
#include "tests/autograd/gradcheck.h"

namespace mg {
namespace {

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

// batch_norm_relu is relu(batch_norm) (the op table checks its gradient): the same values and
// running statistics on the CPU, and batch norm's own errors for bad input.
TEST(ConvAutograd, BatchNormReluIsReluOfBatchNorm) {
  Tensor x = randn({4, 2, 3, 3}, {DType::f64}), w = randn({2}, {DType::f64}), b = randn({2}, {DType::f64});
  Tensor rm = zeros({2}, {DType::f64}), rv = ones({2}, {DType::f64});
  Tensor rm2 = zeros({2}, {DType::f64}), rv2 = ones({2}, {DType::f64});
  EXPECT_EQ(batch_norm_relu(x, rm, rv, w, b, true).to_vector<double>(),
            relu(batch_norm(x, rm2, rv2, w, b, true)).to_vector<double>());
  EXPECT_EQ(rm.to_vector<double>(), rm2.to_vector<double>());
  EXPECT_EQ(rv.to_vector<double>(), rv2.to_vector<double>());
  EXPECT_THROW(batch_norm_relu(randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true), ValueError);
  EXPECT_THROW(batch_norm_relu(x, rm, rv, ones({3}, {DType::f64}), Tensor(), true), ShapeError);
}

// batch_norm_add_relu is relu(batch_norm(x) + residual): the same values and running statistics
// on the CPU (where it runs as those ops), a residual of another dtype promoted as add promotes,
// and a residual of another shape (even a broadcastable one) an error naming both shapes.
TEST(ConvAutograd, BatchNormAddReluIsReluOfBatchNormPlusResidual) {
  Tensor x = randn({4, 2, 3, 3}, {DType::f64}), r = randn({4, 2, 3, 3}, {DType::f64});
  Tensor w = randn({2}, {DType::f64}), b = randn({2}, {DType::f64});
  Tensor rm = zeros({2}, {DType::f64}), rv = ones({2}, {DType::f64});
  Tensor rm2 = zeros({2}, {DType::f64}), rv2 = ones({2}, {DType::f64});
  EXPECT_EQ(batch_norm_add_relu(x, r, rm, rv, w, b, true).to_vector<double>(),
            relu(batch_norm(x, rm2, rv2, w, b, true) + r).to_vector<double>());
  EXPECT_EQ(rm.to_vector<double>(), rm2.to_vector<double>());
  EXPECT_EQ(rv.to_vector<double>(), rv2.to_vector<double>());
  const Tensor rf = r.to(DType::f32);
  Tensor y = batch_norm_add_relu(x, rf, Tensor(), Tensor(), w, b, true);
  EXPECT_EQ(y.dtype(), DType::f64);
  EXPECT_EQ(y.to_vector<double>(), relu(batch_norm(x, Tensor(), Tensor(), w, b, true) + rf).to_vector<double>());
  try {
    batch_norm_add_relu(x, randn({1, 2, 3, 3}, {DType::f64}), Tensor(), Tensor(), w, b, true);
    ADD_FAILURE() << "a broadcastable residual was accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 2, 3, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 2, 3, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(batch_norm_add_relu(x, Tensor(), Tensor(), Tensor(), w, b, true), ValueError);
}

}  // namespace
}  // namespace mg
