// Indexing: one_hot, gather/scatter(_add), index_select/index_add, cat/stack, nll_loss.
#include "tests/kernels/test_util.h"

namespace mg {
namespace {
using namespace mg::testing;
namespace k = mg::kernels;

TEST(Index, OneHot) {
  Tensor l = T({0, 2, 1}, {3}, DType::i64);
  Tensor o = k::one_hot(l, 3);
  EXPECT_EQ(o.dtype(), DType::i64);
  EXPECT_EQ(o.sizes(), (Shape{3, 3}));
  expect_near(o, {1, 0, 0, 0, 0, 1, 0, 1, 0});
  EXPECT_EQ(k::one_hot(T({1, 0, 3, 2}, {2, 2}, DType::i32), 4).sizes(), (Shape{2, 2, 4}));
  expect_near(k::one_hot(raw::slice(T({0, 9, 1, 9}, {4}, DType::i64), 0, 0, 4, 2), 2), {1, 0, 0, 1});
  EXPECT_MG_ERROR(k::one_hot(T({12}, {1}, DType::i64), 10), IndexError, "one_hot: class index 12 out of range [0, 10)");
  EXPECT_MG_ERROR(k::one_hot(T({-1}, {1}, DType::i64), 10), IndexError, "one_hot");
  EXPECT_MG_ERROR(k::one_hot(T({1}, {1}), 10), DTypeError, "one_hot");
  EXPECT_EQ(k::one_hot(zeros({0}, {DType::i64}), 5).sizes(), (Shape{0, 5}));
}

TEST(Index, Gather) {
  Tensor a = T({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor i1 = T({2, 0, 1, 1}, {2, 2}, DType::i64);
  Tensor g = k::gather(a, 1, i1);
  EXPECT_EQ(g.sizes(), (Shape{2, 2}));
  expect_near(g, {3, 1, 5, 5});
  Tensor i0 = T({1, 0, 1}, {1, 3}, DType::i32);
  expect_near(k::gather(a, 0, i0), {4, 2, 6});
  expect_near(k::gather(raw::transpose(a, 0, 1), 0, T({1, 2}, {1, 2}, DType::i64)), {2, 6});
  EXPECT_MG_ERROR(k::gather(a, 1, T({-1}, {1, 1}, DType::i64)), IndexError, "gather: index -1");  // like PyTorch
  EXPECT_MG_ERROR(k::gather(a, 1, T({3}, {1, 1}, DType::i64)), IndexError, "gather: index 3");
  EXPECT_MG_ERROR(k::gather(a, 1, T({0}, {1}, DType::i64)), ShapeError, "gather");
  EXPECT_MG_ERROR(k::gather(a, 0, T({0, 0, 0, 0}, {1, 4}, DType::i64)), ShapeError, "gather");
  EXPECT_MG_ERROR(k::gather(a, 2, i1), IndexError, "gather");
}

TEST(Index, ScatterAndScatterAdd) {
  Tensor s = zeros({2, 3});
  uint32_t v = s.version();
  k::scatter_(s, 1, T({2, 0, 1, 1}, {2, 2}, DType::i64), T({10, 20, 30, 40, 50, 60}, {2, 3}));
  EXPECT_EQ(s.version(), v + 1);
  expect_near(s, {20, 0, 10, 0, 50, 0});  // duplicate index: last write wins on the CPU
  Tensor sa = zeros({3});
  k::scatter_add_(sa, 0, T({0, 2, 0, 2, 2}, {5}, DType::i64), T({1, 2, 3, 4, 5}, {5}));
  expect_near(sa, {4, 0, 11});
  // gather then scatter_add along dim 1 round-trips a one-hot selection (the nll gradient pattern).
  Tensor grad = zeros({2, 3});
  k::scatter_add_(grad, 1, T({2, 0}, {2, 1}, DType::i64), T({-1, -1}, {2, 1}));
  expect_near(grad, {0, 0, -1, -1, 0, 0});
  EXPECT_MG_ERROR(k::scatter_(s, 1, T({3}, {1, 1}, DType::i64), T({1}, {1, 1})), IndexError, "scatter_");
  EXPECT_MG_ERROR(k::scatter_add_(s, 1, T({0}, {1, 1}, DType::i64), T({1}, {1, 1}, DType::f64)), DTypeError,
                  "scatter_add_");
  EXPECT_MG_ERROR(k::scatter_(s, 0, T({0, 0}, {1, 2}, DType::i64), T({1}, {1, 1})), ShapeError, "scatter_");
}

TEST(Index, IndexSelectAndIndexAdd) {
  Tensor a = T({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor r = k::index_select(a, 0, T({2, 0, 2}, {3}, DType::i64));
  EXPECT_EQ(r.sizes(), (Shape{3, 2}));
  expect_near(r, {5, 6, 1, 2, 5, 6});
  expect_near(k::index_select(a, 1, T({1}, {1}, DType::i32)), {2, 4, 6});
  EXPECT_EQ(k::index_select(a, 0, zeros({0}, {DType::i64})).sizes(), (Shape{0, 2}));
  EXPECT_MG_ERROR(k::index_select(a, 0, T({3}, {1}, DType::i64)), IndexError, "index_select: index 3");
  EXPECT_MG_ERROR(k::index_select(a, 0, T({0}, {1, 1}, DType::i64)), ShapeError, "index_select");
  Tensor s = zeros({3, 2});
  uint32_t v = s.version();
  k::index_add_(s, 0, T({0, 2, 0}, {3}, DType::i64), T({1, 1, 2, 2, 3, 3}, {3, 2}));
  EXPECT_EQ(s.version(), v + 1);
  expect_near(s, {4, 4, 0, 0, 2, 2});
  EXPECT_MG_ERROR(k::index_add_(s, 0, T({5}, {1}, DType::i64), T({1, 1}, {1, 2})), IndexError, "index_add_");
  EXPECT_MG_ERROR(k::index_add_(s, 0, T({0}, {1}, DType::i64), T({1, 1, 1}, {1, 3})), ShapeError, "index_add_");
  expect_near(s, {4, 4, 0, 0, 2, 2});  // a failed check leaves self untouched
  // IndexBounds::Checked only lets CUDA skip its synchronizing check: the CPU checks anyway.
  EXPECT_MG_ERROR(k::index_add_(s, 0, T({5}, {1}, DType::i64), T({1, 1}, {1, 2}), k::IndexBounds::Checked), IndexError,
                  "index_add_");
  k::index_add_(s, 0, T({1}, {1}, DType::i64), T({1, 2}, {1, 2}), k::IndexBounds::Checked);
  expect_near(s, {4, 4, 1, 2, 2, 2});
}

TEST(Index, CatStack) {
  Tensor a = T({1, 2, 3, 4}, {2, 2}), b = T({5, 6}, {1, 2});
  Tensor c = k::cat({a, b}, 0);
  EXPECT_EQ(c.sizes(), (Shape{3, 2}));
  expect_near(c, {1, 2, 3, 4, 5, 6});
  Tensor c1 = k::cat({a, raw::transpose(a, 0, 1)}, 1);
  expect_near(c1, {1, 2, 1, 3, 3, 4, 2, 4});
  EXPECT_EQ(k::cat({a, T({1, 2}, {1, 2}, DType::f64)}, 0).dtype(), DType::f64);
  EXPECT_EQ(k::cat({zeros({0}), a}, 0).sizes(), (Shape{2, 2}));  // legacy empty 1-D is skipped
  Tensor s = k::stack({T({1, 2}, {2}), T({3, 4}, {2})}, 1);
  EXPECT_EQ(s.sizes(), (Shape{2, 2}));
  expect_near(s, {1, 3, 2, 4});
  EXPECT_EQ(k::stack({a, a, a}, 0).sizes(), (Shape{3, 2, 2}));
  EXPECT_EQ(k::stack({a, a}, -1).sizes(), (Shape{2, 2, 2}));
  EXPECT_MG_ERROR(k::cat({a, T({1, 2, 3}, {1, 3})}, 0), ShapeError, "cat");
  EXPECT_MG_ERROR(k::cat({a, T({1, 2}, {2})}, 0), ShapeError, "cat");
  EXPECT_MG_ERROR(k::cat({}, 0), ValueError, "cat");
  EXPECT_MG_ERROR(k::cat({a}, 2), IndexError, "cat");
  EXPECT_MG_ERROR(k::stack({a, b}, 0), ShapeError, "stack");
  EXPECT_MG_ERROR(k::stack({a}, 3), IndexError, "stack");
}

TEST(Index, NllLossForward) {
  Generator g(40);
  Tensor lp = k::log_softmax(randn({4, 5}, {DType::f64}, &g), 1);
  Tensor t = T({1, 4, -100, 0}, {4}, DType::i64);
  Tensor l = k::nll_loss_forward(lp, t);
  EXPECT_EQ(l.sizes(), (Shape{4}));
  std::vector<double> v = vals(lp);
  expect_near(l, {-v[1], -v[9], 0, -v[15]}, 1e-12);
  expect_near(k::nll_loss_forward(lp, T({1, 4, 3, 0}, {4}, DType::i64), 3), {-v[1], -v[9], 0, -v[15]}, 1e-12);
  // [N, C, d] input with [N, d] target.
  Tensor lp3 = k::log_softmax(randn({2, 3, 2}, {DType::f32}, &g), 1);
  Tensor t3 = T({0, 2, 1, 1}, {2, 2}, DType::i64);
  std::vector<double> v3 = vals(lp3);
  expect_near(k::nll_loss_forward(lp3, t3), {-v3[0], -v3[5], -v3[8], -v3[9]}, 1e-6);
  // 1-D input with a 0-dim target.
  EXPECT_NEAR(k::nll_loss_forward(raw::select(lp, 0, 0), scalar_tensor(2, {DType::i64})).item(), -v[2], 1e-12);
  EXPECT_MG_ERROR(k::nll_loss_forward(lp, T({1, 5, 0, 0}, {4}, DType::i64)), IndexError,
                  "nll_loss_forward: target 5 out of range [0, 5)");
  EXPECT_MG_ERROR(k::nll_loss_forward(lp, T({1, 0}, {2}, DType::i64)), ShapeError, "nll_loss_forward");
  EXPECT_MG_ERROR(k::nll_loss_forward(lp, k::cast(k::one_hot(T({1, 4, 0, 0}, {4}, DType::i64), 5), DType::f32)),
                  DTypeError, "nll_loss_forward");
}

TEST(Index, StridedAndNegativeIndices) {
  Generator g(60);
  Tensor a = randn({4, 5}, {DType::f64}, &g);
  Tensor at = raw::transpose(a, 0, 1);  // [5, 4], not contiguous: the per-slice path
  Tensor idx = T({3, 4, 0}, {3}, DType::i64);
  Tensor r = k::index_select(at, 0, idx);
  Tensor want = k::index_select(raw::contiguous(at), 0, idx);
  expect_close(r, want, 0);
  expect_close(raw::select(r, 0, 1), raw::select(at, 0, 4), 0);
  expect_close(k::index_select(a, 1, idx), raw::transpose(r, 0, 1), 0);
  EXPECT_MG_ERROR(k::index_select(at, 0, T({-1}, {1}, DType::i64)), IndexError, "index_select: index -1");
  EXPECT_MG_ERROR(k::index_select(a, 0, T({-1}, {1}, DType::i64)), IndexError, "index_select: index -1");
  // gather/scatter on 3-D, other dtypes.
  Tensor b = k::cast(k::mul_scalar(randn({2, 3, 4}, {DType::f32}, &g), 10), DType::i64);
  Tensor gi = randint(0, 3, {2, 2, 4}, {DType::i64}, &g);
  Tensor gb = k::gather(b, 1, gi);
  std::vector<double> vb = vals(b), vi = vals(gi), vg = vals(gb);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 4; ++l)
        EXPECT_EQ(vg[(i * 2 + j) * 4 + l], vb[(i * 3 + static_cast<int>(vi[(i * 2 + j) * 4 + l])) * 4 + l]);
  Tensor h = k::cast(T({1, 2, 3}, {3}), DType::f16);
  expect_near(k::gather(h, 0, T({2, 2}, {2}, DType::i32)), {3, 3});
  Tensor s = zeros({2, 3, 4}, {DType::i64});
  k::scatter_add_(s, 1, gi, k::gather(b, 1, gi));
  EXPECT_EQ(k::sum(s).item(), k::sum(gb).item());
}

}  // namespace
}  // namespace mg
