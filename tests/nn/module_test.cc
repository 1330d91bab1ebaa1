// Module registration, recursive walks, weight sharing, train/eval, zero_grad, to().
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "nn/nn.h"

namespace mg::nn {
namespace {

class Block : public Module {
 public:
  Block() : Module("Block") {
    fc = register_module("fc", std::make_shared<Linear>(4, 3));
    scale = &register_parameter("scale", ones({3}));
    running = &register_buffer("running", zeros({3}));
  }
  Tensor forward(const Tensor& x) override { return mul(fc->forward(x), *scale); }
  std::shared_ptr<Linear> fc;
  Tensor* scale;
  Tensor* running;
};

TEST(Module, ParameterHelperMakesLeafRequiringGrad) {
  Tensor t = zeros({2});
  Tensor p = parameter(t);
  EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(parameter(p).is_same(p));  // already a parameter: same identity
  EXPECT_THROW(parameter(zeros({2}, {DType::i64})), DTypeError);
}

TEST(Module, RegistrationAndDottedNames) {
  Block b;
  auto named = b.named_parameters();
  ASSERT_EQ(named.size(), 3u);
  EXPECT_EQ(named[0].first, "scale");
  EXPECT_EQ(named[1].first, "fc.weight");
  EXPECT_EQ(named[2].first, "fc.bias");
  EXPECT_EQ(b.named_parameters(/*recurse=*/false).size(), 1u);
  auto bufs = b.named_buffers();
  ASSERT_EQ(bufs.size(), 1u);
  EXPECT_EQ(bufs[0].first, "running");
  EXPECT_FALSE(bufs[0].second.requires_grad());
  EXPECT_EQ(b.children().size(), 1u);
  EXPECT_EQ(b.named_children()[0].first, "fc");
  EXPECT_EQ(b.num_parameters(), 3 + 4 * 3 + 3);
  EXPECT_TRUE(b.param("scale").is_same(*b.scale));
  EXPECT_THROW(b.param("nope"), ValueError);
  EXPECT_THROW(b.child("nope"), ValueError);
}

TEST(Module, BadNamesAreRejected) {
  Module m;
  EXPECT_THROW(m.register_parameter("", zeros({1})), ValueError);
  EXPECT_THROW(m.register_parameter("a.b", zeros({1})), ValueError);
  m.register_parameter("w", zeros({1}));
  EXPECT_THROW(m.register_buffer("w", zeros({1})), ValueError);
  EXPECT_THROW(m.register_module("w", std::make_shared<ReLU>()), ValueError);
  EXPECT_THROW(m.register_module("x", std::shared_ptr<Module>()), ValueError);
  EXPECT_THROW(m.forward(zeros({1})), ValueError);
}

TEST(Module, SequentialNamesAndForward) {
  auto seq = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 8), std::make_shared<ReLU>(), std::make_shared<Linear>(8, 2)});
  auto named = seq->named_parameters();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[0].first, "0.weight");
  EXPECT_EQ(named[1].first, "0.bias");
  EXPECT_EQ(named[2].first, "2.weight");
  EXPECT_EQ(named[3].first, "2.bias");
  EXPECT_EQ(seq->size(), 3u);
  Tensor y = (*seq)(randn({5, 4}));
  EXPECT_EQ(y.sizes(), (Shape{5, 2}));
  seq->push_back(std::make_shared<Linear>(2, 1));
  EXPECT_EQ(seq->named_parameters().back().first, "3.bias");
  EXPECT_EQ((*seq)(randn({5, 4})).sizes(), (Shape{5, 1}));
  EXPECT_THROW((*seq)[7], IndexError);
  EXPECT_NE(seq->str().find("(2): Linear(in_features=8, out_features=2, bias=true)"), std::string::npos) << seq->str();
}

TEST(Module, SharedParameterListedOnce) {
  auto a = std::make_shared<Linear>(3, 3);
  auto b = std::make_shared<Linear>(3, 3);
  b->weight = a->weight;  // tie: re-points b's registered "weight"
  Sequential seq{a, b};
  auto params = seq.parameters();
  EXPECT_EQ(params.size(), 3u);  // shared weight once + two biases
  EXPECT_EQ(seq.num_parameters(), 9 + 3 + 3);
  auto named = seq.named_parameters();
  EXPECT_EQ(named[0].first, "0.weight");
  EXPECT_TRUE(b->param("weight").is_same(a->weight));

  // The same module reached twice is walked once.
  auto shared = std::make_shared<Linear>(2, 2);
  Sequential twice{shared, shared};
  EXPECT_EQ(twice.parameters().size(), 2u);

  // Gradients from both uses accumulate into the one tensor.
  Tensor x = randn({2, 3});
  sum(seq(x)).backward();
  EXPECT_TRUE(a->weight.grad().defined());
}

TEST(Module, TrainEvalPropagates) {
  auto inner = std::make_shared<Sequential>(
      std::initializer_list<std::shared_ptr<Module>>{std::make_shared<Dropout>(0.5), std::make_shared<ReLU>()});
  Sequential outer{std::make_shared<Linear>(2, 2), inner};
  EXPECT_TRUE(outer.is_training());
  outer.eval();
  EXPECT_FALSE(outer.is_training());
  EXPECT_FALSE(inner->is_training());
  EXPECT_FALSE((*inner)[0]->is_training());
  outer.train();
  EXPECT_TRUE((*inner)[1]->is_training());
  inner->train(false);
  EXPECT_TRUE(outer.is_training());
  EXPECT_FALSE((*inner)[0]->is_training());
}

TEST(Module, ZeroGrad) {
  Linear fc(3, 2);
  sum(fc(randn({4, 3}))).backward();
  ASSERT_TRUE(fc.weight.grad().defined());
  fc.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(fc.weight.grad().defined());
  for (double v : fc.weight.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
  fc.zero_grad();  // default: set_to_none
  EXPECT_FALSE(fc.weight.grad().defined());
  EXPECT_FALSE(fc.bias.grad().defined());
}

TEST(Module, ToDTypeKeepsIdentity) {
  Block b;
  Tensor w = b.fc->weight;
  const std::vector<double> before = w.to_vector<double>();
  const uint32_t v0 = w.version();
  b.to(DType::f64);
  EXPECT_TRUE(b.fc->weight.is_same(w));  // same TensorImpl, new storage
  EXPECT_EQ(w.dtype(), DType::f64);
  EXPECT_EQ(b.running->dtype(), DType::f64);
  EXPECT_GT(w.version(), v0);
  EXPECT_TRUE(w.requires_grad());
  auto after = w.to_vector<double>();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_DOUBLE_EQ(after[i], before[i]);
  EXPECT_EQ(b(randn({2, 4}, {DType::f64})).dtype(), DType::f64);
  EXPECT_THROW(b.to(DType::i64), DTypeError);
  b.to(Device::cpu());  // no-op
  EXPECT_TRUE(b.fc->weight.is_same(w));
}

TEST(Module, ParametersAreCountedAsParameters) {
  auto& stats = CategoryStats::get(Device::cpu());
  const int64_t before = stats.counter(MemoryCategory::Parameters).current;
  {
    Linear fc(100, 10);
    EXPECT_EQ(stats.counter(MemoryCategory::Parameters).current - before, (100 * 10 + 10) * 4);
  }
  EXPECT_EQ(stats.counter(MemoryCategory::Parameters).current, before);
}

}  // namespace
}  // namespace mg::nn
