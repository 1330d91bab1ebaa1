// //core linked alone, without //autograd: Tensor's views, conversions and in-place methods
// fall back to the raw ones, and asking for gradients fails with an error that says why.
#include <gtest/gtest.h>

#include <string>
#include <typeinfo>
#include <vector>

#include "core/autograd_hooks.h"
#include "core/tensor.h"

namespace mg {
namespace {

Tensor iota(const Shape& shape) { return raw::to_dtype(raw::reshape(arange(shape_numel(shape)), shape), DType::f32); }

template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const auto& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

TEST(NoAutograd, TheDefaultHooksAreInstalled) { EXPECT_EQ(typeid(autograd_hooks()), typeid(AutogradHooks)); }

TEST(NoAutograd, ViewsShareStorageAndCarryNoState) {
  Tensor x = iota({2, 3, 4});
  const std::vector<Tensor> views = {x.view({6, 4}),
                                     x.reshape({4, -1}),
                                     x.permute({2, 0, 1}),
                                     x.transpose(0, 2),
                                     x.unsqueeze(1),
                                     x.flatten(),
                                     x.flatten(1),
                                     x.narrow(2, 1, 2),
                                     x.slice(1, 0, 3, 2),
                                     x.select(0, 1),
                                     x.view({2, 1, 12}).squeeze(),
                                     x.view({2, 1, 12}).squeeze(1),
                                     x.select(0, 0).t()};
  for (const Tensor& v : views) {
    EXPECT_EQ(v.storage(), x.storage());
    EXPECT_FALSE(v.requires_grad());
    EXPECT_TRUE(v.is_leaf());
    EXPECT_EQ(v.impl()->autograd, nullptr);
  }
}

TEST(NoAutograd, ViewsHaveTheRightValues) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(x.transpose(0, 2).sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(x.permute({2, 0, 1}).contiguous().to_vector<float>()[3], 12.0f);
  EXPECT_EQ(x.select(1, 2).to_vector<float>(), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(x.narrow(2, 1, 2).flatten().to_vector<float>()[0], 1.0f);
  EXPECT_EQ(x.flatten(0, 1).sizes(), (Shape{6, 4}));
  EXPECT_EQ(x.select(0, 0).t().contiguous().to_vector<float>()[1], 4.0f);
  Tensor col = iota({3, 1});
  EXPECT_EQ(col.expand({3, 4}).strides(), (Shape{1, 0}));
  EXPECT_EQ(col.expand({3, 4}).contiguous().to_vector<float>()[5], 1.0f);
}

TEST(NoAutograd, ReshapeOfANonViewableTensorCopies) {
  Tensor x = iota({3, 4});
  Tensor r = x.t().reshape({12});
  EXPECT_NE(r.storage(), x.storage());
  EXPECT_EQ(r.to_vector<float>()[1], 4.0f);
}

TEST(NoAutograd, ConversionsAndCopies) {
  Tensor x = iota({2, 2});
  Tensor c = x.clone();
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(c.to_vector<float>(), x.to_vector<float>());
  EXPECT_TRUE(x.to(DType::f32).is_same(x));
  EXPECT_TRUE(x.cpu().is_same(x));
  Tensor h = x.to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_TRUE(x.contiguous().is_same(x));
}

TEST(NoAutograd, InPlaceMethodsWriteAndBumpTheVersionOnce) {
  Tensor x = zeros({2, 3});
  Tensor v = x.select(0, 1);
  uint32_t ver = x.version();
  v.copy_(tensor({1, 2, 3}, {3}));
  EXPECT_EQ(x.version(), ver + 1);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 0, 0, 1, 2, 3}));
  x.copy_(tensor({7, 8, 9}, {3}));  // broadcast over rows
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{7, 8, 9, 7, 8, 9}));
  x.fill_(2.5);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(6, 2.5f));
  ver = x.version();
  x.zero_();
  EXPECT_EQ(x.version(), ver + 1);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(6, 0.0f));
}

TEST(NoAutograd, AskingForGradientsSaysAutogradIsNotLinked) {
  Tensor x = ones({2});
  expect_error<AutogradError>([&] { x.requires_grad_(); }, {"requires_grad_", "//autograd"});
  expect_error<AutogradError>([] { ones({2}, {DType::f32, Device::cpu(), true}); }, {"requires_grad_", "//autograd"});
  expect_error<AutogradError>([&] { x.retain_grad(); }, {"retain_grad", "//autograd"});
  expect_error<AutogradError>([&] { x.set_grad(ones({2})); }, {"set_grad", "//autograd"});
  expect_error<AutogradError>([&] { x.backward(); }, {"backward", "//autograd"});
  // What needs no autograd state still works.
  x.requires_grad_(false);
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(x.requires_grad());
  EXPECT_TRUE(x.detach().is_leaf());
}

TEST(NoAutograd, BadInputNamesTheOp) {
  Tensor x = iota({2, 3, 4});
  expect_error<ShapeError>([&] { x.transpose(0, 1).view({24}); }, {"view", "without copying"});
  expect_error<ShapeError>([&] { x.reshape({5, -1}); }, {"reshape"});
  expect_error<ValueError>([&] { x.flatten(2, 1); }, {"flatten", "start_dim"});
  expect_error<ShapeError>([&] { x.t(); }, {"t: expects a tensor with <= 2 dims"});
  expect_error<IndexError>([&] { x.narrow(1, 2, 2); }, {"narrow"});
  expect_error<IndexError>([&] { x.select(0, 5); }, {"select"});
  expect_error<IndexError>([&] { x.unsqueeze(4); }, {"unsqueeze"});
  expect_error<ShapeError>([&] { x.expand({3, 3, 4}); }, {"expand"});
  expect_error<ShapeError>([&] { x.permute({0, 0, 1}); }, {"permute"});
  expect_error<ValueError>([&] { x.copy_(Tensor()); }, {"copy_"});
  expect_error<ShapeError>([&] { x.copy_(ones({5})); }, {"expand"});
}

}  // namespace
}  // namespace mg
