// In-place ops through the differentiable layer: slice assignment (narrow().fill_,
// narrow().copy_, narrow().add_) reaches the base's later uses; an in-place op on a tensor
// backward needs is an AutogradError at backward naming the op, never a wrong gradient;
// nn::ReLU(inplace); and what naming every intermediate costs vs reusing one name.
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "nn/activation.h"

namespace mg {
namespace {

Tensor leaf(std::initializer_list<double> v) {
  Tensor t = tensor(v, {static_cast<int64_t>(v.size())}, {DType::f64});
  t.requires_grad_(true);
  return t;
}
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

TEST(InPlaceViews, NarrowFillCutsTheGradientOfTheFilledElements) {
  Tensor x = leaf({1, 2, 3, 4});
  Tensor h = mul(x, 2.0);
  h.narrow(0, 1, 2).fill_(0.0);  // h[1:3] = 0
  EXPECT_EQ(vals(h), (std::vector<double>{2, 0, 0, 8}));
  sum(mul(h, h)).backward();  // d/dx of sum (2x)^2 = 8x, 0 where overwritten
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{8, 0, 0, 32}));
}

TEST(InPlaceViews, SliceAssignmentIntoABufferCarriesTheSourceGradient) {
  Tensor x = leaf({1, 2}), w = leaf({3, 4, 5, 6});
  Tensor buf = zeros({4}, {DType::f64});  // x[:] style: buf[1:3] = x
  buf.narrow(0, 1, 2).copy_(x);
  ASSERT_TRUE(buf.requires_grad());
  sum(mul(buf, w)).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{4, 5}));
  EXPECT_EQ(vals(w.grad()), (std::vector<double>{0, 1, 2, 0}));
}

TEST(InPlaceViews, AddIntoAViewOfARow) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}), y = leaf({10, 20});
  Tensor h = mul(x, 1.0).reshape({2, 3});
  Tensor row = h.select(0, 1);        // x[3], x[4], x[5]
  Tensor part = row.narrow(0, 0, 2);  // a view of a view: one base
  add_(part, y);                      // h[1, 0:2] += y
  Tensor loss = sum(mul(h, h));
  loss.backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{2, 4, 6, 28, 50, 12}));
  EXPECT_EQ(vals(y.grad()), (std::vector<double>{28, 50}));
}

TEST(InPlaceSafety, ReluInPlaceOnATensorExpNeedsIsAnErrorAtBackward) {
  Tensor x = leaf({-1, 0.5, 2});
  Tensor y = exp(x);  // exp saves its output
  Tensor z = sub(y, 1.0);
  relu_(y);
  try {
    sum(z).backward();  // z's history reaches exp, whose output changed
    FAIL() << "expected AutogradError";
  } catch (const AutogradError& e) {
    EXPECT_NE(std::string(e.what()).find("'exp'"), std::string::npos) << e.what();
  }
}

TEST(InPlaceSafety, SliceWriteIntoASavedTensorIsAnError) {
  Tensor x = leaf({1, 2, 3});
  Tensor h = mul(x, 2.0);
  Tensor z = mul(h, h);  // saves h
  h.narrow(0, 0, 1).fill_(0.0);
  EXPECT_THROW(sum(z).backward(), AutogradError);
}

TEST(InPlaceSafety, MulInPlaceAfterUseIsAnErrorNotAWrongGradient) {
  Tensor x = leaf({1, 2, 3});
  Tensor h = mul(x, 2.0);
  Tensor z = sum(mul(h, x));  // saves h and x
  mul_(h, 3.0);
  EXPECT_THROW(z.backward(), AutogradError);
}

TEST(InPlaceReLU, ModuleInplaceMatchesOutOfPlace) {
  Tensor x = leaf({-2, -1, 0.5, 3});
  nn::ReLU inplace(true), plain(false);
  sum(mul(inplace(mul(x, 2.0)), x)).backward();
  auto want_from = vals(x.grad());
  x.set_grad(Tensor());
  sum(mul(plain(mul(x, 2.0)), x)).backward();
  EXPECT_EQ(vals(x.grad()), want_from);
}

// The seeds' "x1, x2, x3 vs reusing x": what stays alive after a chain of four elementwise
// ops over a 1 MiB tensor, with and without a graph.
int64_t live_after_chain(bool reuse, bool grad, Tensor& keep) {
  keep = Tensor();                           // the previous call's result must not be freed inside the measurement
  Tensor w = ones({1 << 17}, {DType::f64});  // 1 MiB
  w.requires_grad_(true);
  EnableGradGuard g(grad);
  const int64_t base = memory_allocated();
  int64_t live = 0;
  if (reuse) {
    Tensor x = mul(w, 2.0);
    x = relu(x);
    x = exp(x);
    x = add(x, 1.0);
    keep = x;
    live = memory_allocated() - base;
  } else {
    Tensor x1 = mul(w, 2.0), x2 = relu(x1), x3 = exp(x2), x4 = add(x3, 1.0);
    keep = x4;
    live = memory_allocated() - base;
  }
  return live / (1 << 20);
}

TEST(Intermediates, NamingEveryStepCostsUnderNoGradButNotUnderTraining) {
  Tensor keep;
  // No graph: reusing the name frees each step as soon as the next exists.
  EXPECT_EQ(live_after_chain(false, false, keep), 4);
  EXPECT_EQ(live_after_chain(true, false, keep), 1);
  // Training: relu saves its output and exp saves its output, so x2 and x3 live either way;
  // only x1 (mul by a constant saves nothing) dies when the name is reused.
  EXPECT_EQ(live_after_chain(false, true, keep), 4);
  EXPECT_EQ(live_after_chain(true, true, keep), 3);
  // Backward frees the saved tensors: only the result and the gradient remain.
  sum(keep).backward();
}

}  // namespace
}  // namespace mg
