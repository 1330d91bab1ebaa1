// The tape and the engine: accumulation, shared subexpressions, retain_graph, no_grad,
// saved-tensor freeing (measured), version counters, detach, autograd::grad, retain_grad.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <thread>

#include "autograd/engine.h"
#include "tests/error_of.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/random.h"

namespace mg {
namespace {

Tensor leaf(std::initializer_list<double> v, const Shape& s) {
  Tensor t = tensor(v, s, {DType::f64});
  t.requires_grad_(true);
  return t;
}

std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

using mg::testing::error_of;

TEST(Engine, AccumulatesAcrossBackwardCalls) {
  Tensor x = leaf({1, 2, 3}, {3});
  sum(x * x).backward();
  Tensor first = x.grad();
  EXPECT_EQ(vals(first), (std::vector<double>{2, 4, 6}));
  sum(x * x).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{4, 8, 12}));
  // Out of place: the gradient captured after the first call kept its values.
  EXPECT_EQ(vals(first), (std::vector<double>{2, 4, 6}));
}

TEST(Engine, SharedSubexpressionSumsBothPaths) {
  Tensor x = leaf({0.5, -1.0}, {2});
  Tensor y = x * x + exp(x);  // x used three times
  sum(y).backward();
  auto g = vals(x.grad());
  EXPECT_NEAR(g[0], 2 * 0.5 + std::exp(0.5), 1e-12);
  EXPECT_NEAR(g[1], -2.0 + std::exp(-1.0), 1e-12);

  // Diamond: a feeds b twice; add's backward hands the same gradient to both inputs.
  Tensor z = leaf({3.0}, {1});
  Tensor a = z * 2.0;
  Tensor b = a + a * a;  // db/dz = 2 + 2a * 2 = 2 + 24
  b.backward();
  EXPECT_NEAR(vals(z.grad())[0], 26.0, 1e-12);

  Tensor w = leaf({1.0, 2.0}, {2});
  sum(w + w).backward();
  EXPECT_EQ(vals(w.grad()), (std::vector<double>{2, 2}));
}

TEST(Engine, SecondBackwardNeedsRetainGraph) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(exp(x));
  y.backward();
  std::string msg = error_of<AutogradError>([&] { y.backward(); });
  EXPECT_NE(msg.find("Trying to backward through the graph a second time"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retain_graph=true"), std::string::npos) << msg;
}

TEST(Engine, RetainGraphAllowsSecondBackward) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  EXPECT_FALSE(autograd::grad_fn(y)->released);
  y.backward();
  EXPECT_NEAR(vals(x.grad())[0], 2 * std::exp(1.0), 1e-12);
  EXPECT_NEAR(vals(x.grad())[1], 2 * std::exp(2.0), 1e-12);
  EXPECT_TRUE(autograd::grad_fn(y)->released);
}

TEST(Engine, NoGradBuildsNoGraph) {
  Tensor x = leaf({1, 2}, {2});
  {
    no_grad guard;
    EXPECT_FALSE(is_grad_enabled());
    Tensor y = exp(x) * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(autograd::grad_fn(y), nullptr);
    EXPECT_TRUE(y.is_leaf());
    Tensor v = x.view({2, 1});
    EXPECT_FALSE(v.requires_grad());
    {
      EnableGradGuard on(true);
      EXPECT_TRUE((x * 2.0).requires_grad());
    }
    // Grad mode is thread-local: another thread still records.
    bool other_thread_records = false;
    std::thread([&] { other_thread_records = (x * 2.0).requires_grad(); }).join();
    EXPECT_TRUE(other_thread_records);
  }
  EXPECT_TRUE(is_grad_enabled());
  EXPECT_TRUE((x * 2.0).requires_grad());
}

// A chain of 10 elementwise ops on 1M elements: with a graph every intermediate is saved
// for backward, without one each dies as soon as the next op has read it.
int64_t peak_of_chain(bool grad) {
  Tensor x = randn({1 << 20}, {DType::f32});
  x.requires_grad_(true);
  EnableGradGuard mode(grad);
  const int64_t base = memory_allocated();
  reset_peak_memory_stats();
  Tensor y = x;
  for (int i = 0; i < 10; ++i) y = i % 2 ? tanh(y) : exp(y * 0.1);
  const int64_t peak = max_memory_allocated() - base;
  return peak;
}

TEST(Engine, NoGradUsesLessPeakMemory) {
  const int64_t with_graph = peak_of_chain(true);
  const int64_t without = peak_of_chain(false);
  const int64_t mb4 = 4 << 20;
  EXPECT_GE(with_graph, 9 * mb4) << "grad mode keeps the 10 exp/tanh outputs (4 MiB each) for backward";
  EXPECT_LE(without, 4 * mb4) << "no_grad keeps at most a few 4 MiB tensors alive";
  EXPECT_LT(without * 3, with_graph);  // measured: 12 MiB vs 40 MiB
}

TEST(Engine, SavedTensorsFreedAfterBackward) {
  Tensor x = randn({1 << 20}, {DType::f32});
  x.requires_grad_(true);
  Tensor loss;
  {
    Tensor y = x;
    for (int i = 0; i < 10; ++i) y = i % 2 ? tanh(y) : exp(y * 0.1);
    loss = sum(y);
  }
  const int64_t before = memory_allocated();
  loss.backward();
  const int64_t after = memory_allocated();
  // 10 saved 4 MiB tensors freed; x.grad (4 MiB) allocated.
  EXPECT_LT(after, before - 6 * (4 << 20)) << "before " << before << " after " << after;
  EXPECT_TRUE(autograd::grad_fn(loss)->released);
  EXPECT_EQ(x.grad().numel(), 1 << 20);
  // What is left in the Gradients category after backward is exactly x.grad.
  EXPECT_GE(CategoryStats::get(Device::cpu()).counter(MemoryCategory::Gradients).current, 4 << 20);
}

TEST(Engine, VersionCounterErrorNamesTheOp) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor w = leaf({4, 5, 6}, {3});
  Tensor a = x + 0.0;    // non-leaf
  Tensor b = mul(a, w);  // saves a (for w's gradient)
  EXPECT_EQ(a.version(), 0u);
  mul_(a, 2.0);
  EXPECT_EQ(a.version(), 1u);
  std::string msg = error_of<AutogradError>([&] { sum(b).backward(); });
  EXPECT_NE(msg.find("modified by an inplace operation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the tensor saved by 'mul' is at version 1, expected version 0"), std::string::npos) << msg;

  // An op that saves its output: exp.
  Tensor y = exp(x);
  Tensor s = sum(y);
  add_(y, 1.0);
  msg = error_of<AutogradError>([&] { s.backward(); });
  EXPECT_NE(msg.find("'exp'"), std::string::npos) << msg;
}

TEST(Engine, InplaceOnLeafRequiringGradRaisesAtOnce) {
  Tensor x = leaf({1, 2}, {2});
  std::string msg = error_of<AutogradError>([&] { add_(x, 1.0); });
  EXPECT_NE(msg.find("a leaf Variable that requires grad is being used in an in-place operation (add_)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(x.version(), 0u);
  EXPECT_EQ(vals(x), (std::vector<double>{1, 2}));  // unchanged
  EXPECT_THROW(x.fill_(0.0), AutogradError);
  EXPECT_THROW(x.zero_(), AutogradError);
  EXPECT_THROW(x.copy_(ones({2}, {DType::f64})), AutogradError);
  Tensor v = x.view({2, 1});
  msg = error_of<AutogradError>([&] { mul_(v, 2.0); });
  EXPECT_NE(msg.find("view of a leaf"), std::string::npos) << msg;
  {
    no_grad guard;  // an optimizer step
    add_(x, 1.0);
  }
  EXPECT_EQ(x.version(), 1u);
  EXPECT_EQ(vals(x), (std::vector<double>{2, 3}));
}

TEST(Engine, InplaceRebasesHistory) {
  Tensor x = leaf({1, -2}, {2});
  Tensor y = x * 3.0;
  relu_(y);
  EXPECT_EQ(autograd::grad_fn(y)->name(), "relu_");
  EXPECT_EQ(y.version(), 1u);
  sum(y).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{3, 0}));
}

// A leaf's first gradient is kept without a copy when nothing else can reach its bytes, and
// copied when something can: a view whose base is otherwise unheld (a kernel's [1, C] output
// viewed as [C], as a reduction or layer norm hands back a bias gradient) is kept; a view of a
// base someone still holds, or one that spans only part of its storage, is copied.
TEST(Engine, FirstGradientKeptWithoutCopyOnlyWhenUnreachable) {
  const auto grad_via = [](const std::function<Tensor()>& make, const void** made) {
    Tensor b = leaf({1, 2, 3}, {3});
    Tensor y = b.detach();  // the op's output: its backward hands back make()'s tensor
    autograd::record("give", {b}, y, [make, made](const std::vector<Tensor>&) {
      Tensor g = make();
      *made = g.raw_data();
      return std::vector<Tensor>{g};
    });
    sum(y).backward();
    return b.grad();
  };
  const void* made = nullptr;
  // A [1, 3] buffer viewed as [3], the base dropped: kept as it is, and no longer a view.
  Tensor g1 = grad_via([] { return raw::view(tensor({4, 5, 6}, {1, 3}, {DType::f64}), {3}); }, &made);
  EXPECT_EQ(g1.raw_data(), made);
  EXPECT_EQ(g1.impl()->view_base, nullptr);
  EXPECT_EQ(vals(g1), (std::vector<double>{4, 5, 6}));
  // The base still held elsewhere: copied, so writing .grad never reaches the base.
  Tensor held = tensor({7, 8, 9}, {1, 3}, {DType::f64});
  Tensor g2 = grad_via([&] { return raw::view(held, {3}); }, &made);
  EXPECT_NE(g2.raw_data(), made);
  g2.fill_(0.0);
  EXPECT_EQ(vals(held), (std::vector<double>{7, 8, 9}));
  // A view over part of a larger buffer: copied (keeping it would pin the whole buffer).
  Tensor g3 = grad_via([] { return raw::slice(tensor({1, 2, 3, 4, 5, 6}, {6}, {DType::f64}), 0, 0, 3, 1); }, &made);
  EXPECT_NE(g3.raw_data(), made);
  EXPECT_EQ(vals(g3), (std::vector<double>{1, 2, 3}));
}

TEST(Engine, Detach) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 2.0;
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(autograd::grad_fn(d), nullptr);
  EXPECT_EQ(d.raw_data(), y.raw_data());
  {
    no_grad guard;
    d.fill_(7.0);
  }
  EXPECT_EQ(vals(y), (std::vector<double>{7, 7}));
  EXPECT_EQ(y.version(), d.version());
  EXPECT_FALSE((d * 2.0).requires_grad());
}

TEST(Engine, AutogradGradLeavesDotGradAlone) {
  Tensor x = leaf({1, 2}, {2});
  Tensor w = leaf({3, 4}, {2});
  Tensor h = x * w;
  Tensor out = sum(h * x);  // x^2 w
  auto g = autograd::grad({out}, {x, w, h}, {}, /*retain_graph=*/true);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(vals(g[0]), (std::vector<double>{6, 16}));  // 2 x w
  EXPECT_EQ(vals(g[1]), (std::vector<double>{1, 4}));   // x^2
  EXPECT_EQ(vals(g[2]), (std::vector<double>{1, 2}));   // d out / d h = x
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(g[0].requires_grad());

  Tensor unused = leaf({1}, {1});
  std::string msg = error_of<AutogradError>([&] { autograd::grad({out}, {unused}, {}, true); });
  EXPECT_NE(msg.find("allow_unused"), std::string::npos) << msg;
  auto g2 = autograd::grad({out}, {unused, x}, {}, false, /*allow_unused=*/true);
  EXPECT_FALSE(g2[0].defined());
  EXPECT_EQ(vals(g2[1]), (std::vector<double>{6, 16}));
  EXPECT_THROW(autograd::grad({out}, {tensor({1}, {1})}), AutogradError);
}

TEST(Engine, NonScalarRootNeedsGradient) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = x * 2.0;
  std::string msg = error_of<AutogradError>([&] { y.backward(); });
  EXPECT_NE(msg.find("grad can be implicitly created only for scalar outputs, got shape [2, 3]"), std::string::npos)
      << msg;
  EXPECT_THROW(y.backward(ones({3, 2}, {DType::f64})), ShapeError);
  y.backward(full({2, 3}, 0.5, {DType::f64}));
  EXPECT_EQ(vals(x.grad()), (std::vector<double>(6, 1.0)));
}

TEST(Engine, RootThatDoesNotRequireGrad) {
  Tensor t = tensor({1, 2}, {2});
  EXPECT_THROW(sum(t).backward(), AutogradError);
}

TEST(Engine, RetainGradOnNonLeaf) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 3.0;
  y.retain_grad();
  Tensor z = y * 2.0;  // not retained
  sum(z * z).backward();
  EXPECT_EQ(vals(y.grad()), (std::vector<double>{4 * 2 * 3, 4 * 2 * 6}));  // d/dy (2y)^2 = 8y
  EXPECT_FALSE(z.grad().defined());
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{72, 144}));
}

TEST(Engine, IntegerOutputsNeverRequireGrad) {
  Tensor x = leaf({1, 5, 3}, {3});
  EXPECT_FALSE(argmax(x, 0).requires_grad());
  EXPECT_FALSE(x.to(DType::i64).requires_grad());
  EXPECT_FALSE(gt(x, x).requires_grad());
  EXPECT_THROW(tensor({1}, {1}, {DType::i64}).requires_grad_(true), AutogradError);
}

TEST(Engine, RequiresGradOnlyOnLeaves) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 2.0;
  EXPECT_THROW(y.requires_grad_(true), AutogradError);
  EXPECT_THROW(arange(3).requires_grad_(true), AutogradError);
  Tensor d = y.detach();
  d.requires_grad_(true);  // a detached tensor is a leaf again
  EXPECT_TRUE(d.requires_grad());
}

TEST(Engine, MixedDtypesGetTheirInputsDtype) {
  Tensor x = tensor({1, 2, 3}, {3, 1}, {DType::f32});
  x.requires_grad_(true);
  Tensor y = leaf({1, 2, 3, 4}, {4});
  Tensor z = x * y;  // f64 [3, 4]
  EXPECT_EQ(z.dtype(), DType::f64);
  sum(z).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().sizes(), (Shape{3, 1}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{10, 10, 10}));
  EXPECT_EQ(y.grad().dtype(), DType::f64);
  EXPECT_EQ(vals(y.grad()), (std::vector<double>{6, 6, 6, 6}));
}

TEST(Engine, DeepChainDoesNotOverflow) {
  // Backward and graph teardown are both iterative (a loss accumulated over many steps).
  Tensor x = leaf({1.0}, {1});
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = y + 1.0;
  sum(y).backward();
  EXPECT_EQ(vals(x.grad())[0], 1.0);
  Tensor z = x;
  for (int i = 0; i < 200000; ++i) z = z * 1.0;
  z = Tensor();  // destroyed without ever running backward
}

TEST(Engine, BackwardFromLeafAndMultipleRoots) {
  Tensor x = leaf({1, 2}, {2});
  x.backward(ones({2}, {DType::f64}));
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{1, 1}));
  Tensor a = sum(x * 2.0), b = sum(x * 3.0);
  autograd::backward({a, b});
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{6, 6}));
}

TEST(Engine, DropoutIsReproducibleUnderManualSeed) {
  Tensor x = ones({1000}, {DType::f64});
  manual_seed(7);
  Tensor a = dropout(x, 0.3, true);
  manual_seed(7);
  Tensor b = dropout(x, 0.3, true);
  EXPECT_EQ(vals(a), vals(b));
  int kept = 0;
  for (double v : vals(a)) {
    if (v != 0) {
      ++kept;
      EXPECT_NEAR(v, 1.0 / 0.7, 1e-12);
    }
  }
  EXPECT_GT(kept, 600);
  EXPECT_LT(kept, 800);
  EXPECT_TRUE(dropout(x, 0.3, false).is_same(x));
}

// ---- views share storage (tensor_methods) ----

TEST(TensorMethods, ViewsShareStorageAndSeeWrites) {
  Tensor base = arange(0.0, 12.0, 1.0, {DType::f64}).reshape({3, 4});
  Tensor v = base.view({4, 3});
  Tensor t = base.t();
  Tensor row = base.select(0, 1);
  Tensor cols = base.slice(1, 0, 4, 2);
  Tensor e = base.select(1, 0).unsqueeze(1).expand({3, 5});
  for (const Tensor& view : {v, t, row, cols}) EXPECT_EQ(view.storage(), base.storage());
  row.fill_(-1.0);
  EXPECT_EQ(vals(base), (std::vector<double>{0, 1, 2, 3, -1, -1, -1, -1, 8, 9, 10, 11}));
  EXPECT_EQ(vals(t.select(0, 0)), (std::vector<double>{0, -1, 8}));
  EXPECT_EQ(vals(cols), (std::vector<double>{0, 2, -1, -1, 8, 10}));
  EXPECT_EQ(vals(e.select(1, 4)), (std::vector<double>{0, -1, 8}));
  EXPECT_EQ(base.version(), 1u);  // one counter for all views
  EXPECT_EQ(v.version(), 1u);
  Tensor c = base.contiguous();
  EXPECT_TRUE(c.is_same(base));
  Tensor tc = t.contiguous();
  EXPECT_TRUE(tc.is_contiguous());
  EXPECT_NE(tc.storage(), base.storage());
  EXPECT_NE(base.clone().storage(), base.storage());
  EXPECT_TRUE(base.to(DType::f64).is_same(base));
  EXPECT_EQ(base.to(DType::f32).dtype(), DType::f32);
}

TEST(TensorMethods, ViewOfNonLeafGetsGradient) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = x.t().reshape({6}).narrow(0, 1, 3);  // x[1,0], x[0,1], x[1,1]
  sum(v * v).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{0, 4, 0, 8, 10, 0}));
}

TEST(TensorMethods, CopyFromNonDifferentiableSourceCutsHistory) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 2.0;
  y.copy_(tensor({5, 6}, {2}, {DType::f32}));  // converts
  EXPECT_EQ(vals(y), (std::vector<double>{5, 6}));
  sum(y * x).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{5, 6}));
}

}  // namespace
}  // namespace mg
