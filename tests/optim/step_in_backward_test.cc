// StepInBackward: the optimizer stepped a bucket at a time inside backward gives the parameters
// plain step() gives (the same update kernel on the same gradients, so bit for bit), drops
// each gradient after its update, handles accumulation, unused parameters and tied weights,
// and refuses a parameter accumulated twice in one round.
#include <gtest/gtest.h>

#include <memory>

#include "autograd/functions.h"
#include "core/random.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/step_in_backward.h"

namespace mg::optim {
namespace {

// A small MLP with a weight used twice (the first layer's weight also scores the output, as a
// tied head does) and, when asked, a parameter no loss reaches.
struct Net {
  std::shared_ptr<nn::Linear> l1, l2;
  Tensor unused;
  std::vector<Tensor> params() const {
    std::vector<Tensor> p = l1->parameters();
    for (const Tensor& t : l2->parameters()) p.push_back(t);
    if (unused.defined()) p.push_back(unused);
    return p;
  }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    Tensor h = relu(l1->forward(x));  // [N, 16]
    Tensor o = l2->forward(h);        // [N, 8]
    // l1's weight [16, 8] again as a head over 16 classes: two uses, one accumulation.
    return add(cross_entropy(matmul(o, l1->weight.t()), y), mean(square(o)));
  }
};

Net make_net(uint64_t seed, bool with_unused) {
  manual_seed(seed);
  Net n;
  n.l1 = std::make_shared<nn::Linear>(8, 16);
  n.l2 = std::make_shared<nn::Linear>(16, 8);
  if (with_unused) n.unused = nn::parameter(randn({5}));
  return n;
}

void expect_same(const Net& a, const Net& b) {
  const auto pa = a.params(), pb = b.params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].to_vector<float>(), pb[i].to_vector<float>()) << "parameter " << i;
}

std::unique_ptr<Optimizer> adamw(const std::vector<Tensor>& p) {
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return std::make_unique<AdamW>(p, o);
}

TEST(StepInBackward, EqualsPlainStepAndDropsGradients) {
  for (int64_t bucket : {int64_t{1}, int64_t{600}, int64_t{1} << 30}) {  // per parameter, a few, one bucket
    Net a = make_net(3, false), b = make_net(3, false);
    auto oa = adamw(a.params()), ob = adamw(b.params());
    StepInBackward sib(*ob, bucket);
    manual_seed(7);
    for (int step = 0; step < 4; ++step) {
      Tensor x = randn({6, 8}), y = randint(0, 16, {6}, {DType::i64});
      oa->zero_grad();
      a.loss(x, y).backward();
      oa->step();
      b.loss(x, y).backward();  // every parameter reports: the round ends by itself
      for (const Tensor& p : b.params()) EXPECT_FALSE(p.grad().defined()) << "a gradient outlived its update";
    }
    expect_same(a, b);
    // 4 steps: each of the 4 parameters its own bucket, or all of them one.
    const int64_t per_step = bucket == 1 ? 4 : bucket == (int64_t{1} << 30) ? 1 : sib.buckets_stepped() / 4;
    EXPECT_EQ(sib.buckets_stepped(), 4 * per_step);
  }
}

TEST(StepInBackward, AccumulationStepsOnTheLastMicroBatch) {
  Net a = make_net(4, false), b = make_net(4, false);
  SGDOptions so{.lr = 0.05, .momentum = 0.9};
  SGD oa(a.params(), so), ob(b.params(), so);
  StepInBackward sib(ob, 1);
  manual_seed(8);
  for (int step = 0; step < 3; ++step) {
    oa.zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      Tensor x = randn({4, 8}), y = randint(0, 16, {4}, {DType::i64});
      a.loss(x, y).backward();
      sib.set_enabled(micro == 2);  // the last micro-batch's hooks see the summed gradients
      b.loss(x, y).backward();
    }
    oa.step();
  }
  expect_same(a, b);
}

TEST(StepInBackward, UnusedParameterNeedsFinishAndASecondRoundWithoutItRaises) {
  Net a = make_net(5, true), b = make_net(5, true);
  auto oa = adamw(a.params()), ob = adamw(b.params());
  StepInBackward sib(*ob, int64_t{1} << 30);  // one bucket: nothing steps before finish()
  manual_seed(9);
  for (int step = 0; step < 2; ++step) {
    Tensor x = randn({6, 8}), y = randint(0, 16, {6}, {DType::i64});
    oa->zero_grad();
    a.loss(x, y).backward();
    oa->step();
    b.loss(x, y).backward();
    EXPECT_TRUE(b.l1->weight.grad().defined()) << "stepped before the round could be known to be over";
    sib.finish();
    EXPECT_FALSE(b.l1->weight.grad().defined());
  }
  expect_same(a, b);
  EXPECT_FALSE(b.unused.grad().defined());
  // Without finish(), the next backward's first parameter has already reported this round.
  Tensor x = randn({6, 8}), y = randint(0, 16, {6}, {DType::i64});
  b.loss(x, y).backward();
  EXPECT_THROW(b.loss(x, y).backward(), AutogradError);
  sib.abandon();  // the failed round is dropped: the next one runs
  b.loss(x, y).backward();
  sib.finish();
  EXPECT_FALSE(b.l1->weight.grad().defined());
}

// An optimizer step that throws inside backward (here its group's lr made invalid) leaves the
// gradients of the parameters outside the bucket where they were; abandon() then drops the
// bucket's own and the next round runs.
TEST(StepInBackward, AStepThatThrowsKeepsTheOtherGradients) {
  Net b = make_net(7, false);
  SGD ob(b.params(), SGDOptions{.lr = 0.05});
  StepInBackward sib(ob, 1);  // each parameter its own bucket
  manual_seed(10);
  Tensor x = randn({4, 8}), y = randint(0, 16, {4}, {DType::i64});
  sib.set_enabled(false);
  b.loss(x, y).backward();  // every parameter holds a gradient (an earlier micro-batch)
  sib.set_enabled(true);
  ob.param_groups()[0].set_lr(-1.0);
  EXPECT_THROW(b.loss(x, y).backward(), ValueError);
  int with_grad = 0;
  for (const Tensor& p : b.params()) with_grad += p.grad().defined();
  EXPECT_EQ(with_grad, 4) << "gradients set aside for the failed step were lost";
  sib.abandon();
  ob.param_groups()[0].set_lr(0.05);
  ob.zero_grad();
  b.loss(x, y).backward();
  for (const Tensor& p : b.params()) EXPECT_FALSE(p.grad().defined());
}

TEST(StepInBackward, RejectsANegativeBucket) {
  Net b = make_net(6, false);
  auto ob = adamw(b.params());
  EXPECT_THROW(StepInBackward(*ob, -1), ValueError);
}

}  // namespace
}  // namespace mg::optim
