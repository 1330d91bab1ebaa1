// Finite-difference checks of whole modules in f64: gradients flow through Linear, the
// in-place ReLU and Dropout (reseeded per evaluation) to the input and every parameter.
#include <gtest/gtest.h>

#include "nn/nn.h"
#include "tests/autograd/gradcheck.h"

namespace mg::nn {
namespace {

TEST(ModuleGradcheck, MlpWithInPlaceReluAndDropout) {
  const TensorOptions f64(DType::f64);
  auto fc1 = std::make_shared<Linear>(5, 7, true, f64);
  auto fc2 = std::make_shared<Linear>(7, 3, true, f64);
  Sequential mlp{fc1, std::make_shared<ReLU>(/*inplace=*/true), std::make_shared<Dropout>(0.3), fc2};
  // gradcheck hands fn fresh leaves; binding them to the module's slots makes them its parameters.
  auto fn = [&](const std::vector<Tensor>& in) {
    fc1->weight = in[1];
    fc1->bias = in[2];
    fc2->weight = in[3];
    fc2->bias = in[4];
    manual_seed(123);  // the same dropout mask at every evaluation
    return mlp(in[0]);
  };
  Tensor x = randn({4, 5}, f64).requires_grad_();
  std::vector<Tensor> inputs = {x};
  for (auto& p : mlp.parameters()) inputs.push_back(p);
  ASSERT_EQ(inputs.size(), 5u);
  EXPECT_TRUE(gradcheck(fn, inputs));
}

TEST(ModuleGradcheck, CrossEntropyOfLinear) {
  const TensorOptions f64(DType::f64);
  Linear fc(6, 4, true, f64);
  CrossEntropyLoss ce;
  Tensor target = from_vector<int64_t>({0, 3, 1}, {3});
  auto fn = [&](const std::vector<Tensor>& in) {
    fc.weight = in[1];
    fc.bias = in[2];
    return ce(fc(in[0]), target);
  };
  EXPECT_TRUE(gradcheck(fn, {randn({3, 6}, f64).requires_grad_(), fc.weight, fc.bias}));
}

}  // namespace
}  // namespace mg::nn
