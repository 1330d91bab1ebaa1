// One table: every differentiable op and view, checked against finite differences in f64.
// Adding an op = adding one row.
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "kernels/ops.h"
#include "tests/autograd/gradcheck.h"

namespace mg {
namespace {

using V = std::vector<Tensor>;

// How a row's random inputs are shaped so the op is smooth around them.
enum class Init {
  Normal,        // N(0, 1)
  Positive,      // |N(0, 1)| + 0.5      (log, sqrt, pow)
  AwayFromZero,  // sign(z) (|z| + 0.5)  (abs, div denominators)
};

struct Row {
  std::string name;
  std::vector<Shape> shapes;
  GradFn fn;
  Init init = Init::Normal;
  double eps = 1e-6, atol = 1e-5, rtol = 1e-4;
};

Tensor idx(const std::vector<int64_t>& v, const Shape& shape) { return from_vector<int64_t>(v, shape); }
Tensor f64(std::initializer_list<double> v, const Shape& shape) { return tensor(v, shape, {DType::f64}); }
Tensor mask(const std::vector<bool>& v, const Shape& shape) { return from_vector<bool>(v, shape); }

std::vector<Row> rows() {
  std::vector<Row> r;
  auto add_row = [&](std::string name, std::vector<Shape> shapes, GradFn fn, Init init = Init::Normal) {
    r.push_back(Row{std::move(name), std::move(shapes), std::move(fn), init});
  };

  // ---- elementwise, broadcasting ----
  add_row("add", {{2, 3}, {2, 3}}, [](const V& x) { return add(x[0], x[1]); });
  add_row("add_broadcast_row", {{2, 3}, {3}}, [](const V& x) { return x[0] + x[1]; });
  add_row("add_broadcast_both", {{2, 1}, {1, 3}}, [](const V& x) { return x[0] + x[1]; });
  add_row("add_0dim", {{2, 3}, {}}, [](const V& x) { return x[0] + x[1]; });
  add_row("sub_broadcast", {{4, 3}, {4, 1}}, [](const V& x) { return x[0] - x[1]; });
  add_row("mul_broadcast", {{2, 3, 4}, {3, 1}}, [](const V& x) { return x[0] * x[1]; });
  add_row("mul_same_input", {{3, 2}}, [](const V& x) { return x[0] * x[0]; });
  add_row("div_broadcast", {{3, 4}, {4}}, [](const V& x) { return x[0] / x[1]; }, Init::AwayFromZero);
  add_row("mixed_dtype_add_f32_const", {{3, 2}}, [](const V& x) {
    return x[0] * tensor({1, 2, 3, 4, 5, 6}, {3, 2}, {DType::f32});  // f32 const promotes to f64
  });
  add_row("add_scalar", {{2, 3}}, [](const V& x) { return add(x[0], 2.5); });
  add_row("sub_scalar", {{2, 3}}, [](const V& x) { return x[0] - 1.5; });
  add_row("mul_scalar", {{2, 3}}, [](const V& x) { return -3.0 * x[0]; });
  add_row("div_scalar", {{2, 3}}, [](const V& x) { return x[0] / 4.0; });
  add_row("rsub_scalar", {{2, 3}}, [](const V& x) { return 2.0 - x[0]; });
  add_row("neg", {{2, 3}}, [](const V& x) { return -x[0]; });
  add_row("exp", {{2, 3}}, [](const V& x) { return exp(x[0]); });
  add_row("log", {{2, 3}}, [](const V& x) { return log(x[0]); }, Init::Positive);
  add_row("sqrt", {{2, 3}}, [](const V& x) { return sqrt(x[0]); }, Init::Positive);
  add_row("rsqrt", {{2, 3}}, [](const V& x) { return rsqrt(x[0]); }, Init::Positive);
  add_row("abs", {{2, 3}}, [](const V& x) { return abs(x[0]); }, Init::AwayFromZero);
  add_row("square", {{2, 3}}, [](const V& x) { return square(x[0]); });
  add_row("pow_scalar", {{2, 3}}, [](const V& x) { return pow(x[0], 2.5); }, Init::Positive);
  add_row("pow_scalar_int", {{2, 3}}, [](const V& x) { return pow(x[0], 3.0); });
  add_row("pow_tensor", {{2, 3}, {2, 3}}, [](const V& x) { return pow(x[0], x[1]); }, Init::Positive);
  add_row("pow_tensor_broadcast", {{2, 3}, {3}}, [](const V& x) { return pow(x[0], x[1]); }, Init::Positive);
  add_row("relu", {{3, 4}}, [](const V& x) { return relu(x[0]); });
  add_row("gelu_erf", {{3, 4}}, [](const V& x) { return gelu(x[0]); });
  add_row("gelu_tanh", {{3, 4}}, [](const V& x) { return gelu(x[0], true); });
  add_row("silu", {{3, 4}}, [](const V& x) { return silu(x[0]); });
  add_row("sigmoid", {{3, 4}}, [](const V& x) { return sigmoid(x[0]); });
  add_row("tanh", {{3, 4}}, [](const V& x) { return tanh(x[0]); });
  add_row("maximum", {{3, 4}, {3, 4}}, [](const V& x) { return maximum(x[0], x[1]); });
  add_row("maximum_broadcast", {{3, 4}, {4}}, [](const V& x) { return maximum(x[0], x[1]); });
  add_row("minimum", {{3, 4}, {3, 4}}, [](const V& x) { return minimum(x[0], x[1]); });
  add_row("clamp", {{4, 5}}, [](const V& x) { return clamp(x[0], -0.5, 0.7); });
  add_row("where", {{2, 3}, {2, 3}}, [](const V& x) {
    return where(mask({true, false, true, false, false, true}, {2, 3}), x[0], x[1]);
  });
  add_row("where_broadcast", {{2, 3}, {3}}, [](const V& x) {
    return where(mask({true, false, true, false, false, true}, {2, 3}), x[0], x[1]);
  });

  // ---- reductions ----
  add_row("sum_all", {{3, 4}}, [](const V& x) { return sum(x[0]); });
  add_row("sum_dim", {{3, 4}}, [](const V& x) { return sum(x[0], {1}); });
  add_row("sum_dims_keepdim", {{2, 3, 4}}, [](const V& x) { return sum(x[0], {0, -1}, true); });
  add_row("mean_all", {{3, 4}}, [](const V& x) { return mean(x[0]); });
  add_row("mean_dim", {{2, 3, 4}}, [](const V& x) { return mean(x[0], {1}); });
  add_row("mean_dim_keepdim", {{2, 3, 4}}, [](const V& x) { return mean(x[0], {2}, true); });
  add_row("max_dim", {{3, 5}}, [](const V& x) { return max(x[0], 1); });
  add_row("max_dim0_keepdim", {{3, 5}}, [](const V& x) { return max(x[0], 0, true); });
  add_row("amax", {{3, 5}}, [](const V& x) { return amax(x[0]); });
  add_row("var_all", {{3, 4}}, [](const V& x) { return var(x[0]); });
  add_row("var_dim_unbiased", {{3, 4}}, [](const V& x) { return var(x[0], {1}); });
  add_row("var_dim_population_keepdim", {{3, 4}}, [](const V& x) { return var(x[0], {0}, 0, true); });

  // ---- linear algebra ----
  add_row("matmul_1d_1d", {{4}, {4}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("matmul_2d_2d", {{3, 4}, {4, 2}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("matmul_1d_2d", {{4}, {4, 2}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("matmul_2d_1d", {{3, 4}, {4}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("matmul_batched_2d", {{2, 3, 4}, {4, 2}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("matmul_batched_broadcast", {{2, 1, 3, 4}, {3, 4, 2}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("matmul_1d_batched", {{4}, {2, 4, 3}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("matmul_batched_1d", {{2, 3, 4}, {4}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_row("bmm", {{2, 3, 4}, {2, 4, 5}}, [](const V& x) { return bmm(x[0], x[1]); });
  add_row("linear_bias", {{3, 4}, {5, 4}, {5}}, [](const V& x) { return linear(x[0], x[1], x[2]); });
  add_row("linear_no_bias", {{3, 4}, {5, 4}}, [](const V& x) { return linear(x[0], x[1]); });
  add_row("linear_3d_input", {{2, 3, 4}, {5, 4}, {5}}, [](const V& x) { return linear(x[0], x[1], x[2]); });
  add_row("linear_1d_input", {{4}, {5, 4}, {5}}, [](const V& x) { return linear(x[0], x[1], x[2]); });

  // ---- softmax family ----
  add_row("softmax_last", {{3, 5}}, [](const V& x) { return softmax(x[0], -1); });
  add_row("softmax_dim0", {{3, 5}}, [](const V& x) { return softmax(x[0], 0); });
  add_row("log_softmax", {{3, 5}}, [](const V& x) { return log_softmax(x[0], 1); });
  add_row("log_softmax_3d_mid", {{2, 3, 4}}, [](const V& x) { return log_softmax(x[0], 1); });

  // ---- views and copies (the gradient must come back through the inverse shape change) ----
  add_row("view", {{2, 6}}, [](const V& x) { return x[0].view({3, 4}); });
  add_row("view_infer", {{2, 6}}, [](const V& x) { return x[0].view({-1, 2}); });
  add_row("reshape_noncontiguous", {{3, 4}}, [](const V& x) { return x[0].t().reshape({2, 6}); });
  add_row("reshape_free_fn", {{3, 4}}, [](const V& x) { return reshape(x[0], {12}); });
  add_row("permute", {{2, 3, 4}}, [](const V& x) { return x[0].permute({2, 0, 1}); });
  add_row("permute_free_fn", {{2, 3, 4}}, [](const V& x) { return permute(x[0], {1, 2, 0}); });
  add_row("transpose", {{2, 3, 4}}, [](const V& x) { return x[0].transpose(0, 2); });
  add_row("transpose_free_fn", {{2, 3, 4}}, [](const V& x) { return transpose(x[0], -1, 1); });
  add_row("t", {{3, 4}}, [](const V& x) { return x[0].t(); });
  add_row("t_1d", {{4}}, [](const V& x) { return x[0].t(); });
  add_row("unsqueeze", {{3, 4}}, [](const V& x) { return x[0].unsqueeze(1); });
  add_row("unsqueeze_last", {{3, 4}}, [](const V& x) { return x[0].unsqueeze(-1); });
  add_row("squeeze_dim", {{3, 1, 4}}, [](const V& x) { return x[0].squeeze(1); });
  add_row("squeeze_all", {{1, 3, 1, 4}}, [](const V& x) { return x[0].squeeze(); });
  add_row("flatten", {{2, 3, 4}}, [](const V& x) { return x[0].flatten(); });
  add_row("flatten_range", {{2, 3, 4, 2}}, [](const V& x) { return flatten(x[0], 1, 2); });
  add_row("narrow", {{4, 5}}, [](const V& x) { return x[0].narrow(1, 1, 3); });
  add_row("slice_step2", {{4, 7}}, [](const V& x) { return x[0].slice(1, 1, 7, 2); });
  add_row("slice_negative", {{5, 3}}, [](const V& x) { return x[0].slice(0, -3, -1); });
  add_row("select", {{3, 4}}, [](const V& x) { return x[0].select(0, 1); });
  add_row("select_negative", {{3, 4, 2}}, [](const V& x) { return x[0].select(-1, -1); });
  add_row("expand", {{3, 1}}, [](const V& x) { return x[0].expand({2, 3, 4}); });
  add_row("expand_keep", {{1, 4}}, [](const V& x) { return x[0].expand({3, -1}); });
  add_row("contiguous", {{3, 4}}, [](const V& x) { return x[0].t().contiguous(); });
  add_row("clone", {{3, 4}}, [](const V& x) { return x[0].clone(); });
  add_row("chained_views", {{2, 3, 4}}, [](const V& x) {
    return x[0].transpose(0, 1).slice(2, 0, 4, 3).unsqueeze(0).expand({2, 3, 2, 2}) * x[0].select(2, 0).t().unsqueeze(-1);
  });
  {
    Row to_f32{"to_f32_and_back", {{3, 4}}, [](const V& x) { return x[0].to(DType::f32).to(DType::f64) * 2.0; }};
    to_f32.eps = 1e-2;  // f32 rounding: a large step, the function is linear
    to_f32.atol = 1e-4;
    to_f32.rtol = 1e-4;
    r.push_back(to_f32);
  }
  {
    Row to_f32{"to_f32_op_in_f32", {{3, 4}}, [](const V& x) { return exp(x[0].to(DType::f32)); }};
    to_f32.eps = 1e-3;
    to_f32.atol = 1e-3;
    to_f32.rtol = 1e-3;
    r.push_back(to_f32);
  }
  add_row("to_cpu_same_device", {{3, 4}}, [](const V& x) { return x[0].to(Device::cpu()) * 1.0; });

  // ---- joining and indexing ----
  add_row("cat_dim0", {{2, 3}, {1, 3}, {3, 3}}, [](const V& x) { return cat({x[0], x[1], x[2]}, 0); });
  add_row("cat_dim1", {{2, 3}, {2, 2}}, [](const V& x) { return cat({x[0], x[1]}, -1); });
  add_row("stack_dim0", {{2, 3}, {2, 3}}, [](const V& x) { return stack({x[0], x[1]}, 0); });
  add_row("stack_dim_last", {{2, 3}, {2, 3}, {2, 3}}, [](const V& x) { return stack({x[0], x[1], x[2]}, -1); });
  add_row("gather_dim1", {{3, 4}}, [](const V& x) { return gather(x[0], 1, idx({0, 3, 3, 1, 2, 0}, {3, 2})); });
  add_row("gather_dim0_repeats", {{3, 4}}, [](const V& x) {
    return gather(x[0], 0, idx({2, 2, 0, 1, 0, 0, 0, 0}, {2, 4}));
  });
  add_row("index_select", {{4, 3}}, [](const V& x) { return index_select(x[0], 0, idx({3, 0, 3}, {3})); });
  add_row("index_select_dim1", {{2, 5}}, [](const V& x) { return index_select(x[0], 1, idx({1, 4, 1, 1}, {4})); });

  // ---- losses ----
  const Tensor t4 = idx({1, 0, 4, 2}, {4});
  add_row("cross_entropy_mean", {{4, 5}}, [t4](const V& x) { return cross_entropy(x[0], t4); });
  add_row("cross_entropy_sum", {{4, 5}}, [t4](const V& x) { return cross_entropy(x[0], t4, "sum"); });
  add_row("cross_entropy_none", {{4, 5}}, [t4](const V& x) { return cross_entropy(x[0], t4, "none"); });
  add_row("cross_entropy_ignore_index", {{4, 5}}, [](const V& x) {
    return cross_entropy(x[0], idx({1, -100, 4, -100}, {4}));
  });
  add_row("cross_entropy_ignore_custom_sum", {{4, 5}}, [](const V& x) {
    return cross_entropy(x[0], idx({1, 3, 3, 0}, {4}), "sum", 3);
  });
  add_row("cross_entropy_label_smoothing", {{4, 5}}, [t4](const V& x) {
    return cross_entropy(x[0], t4, "mean", -100, 0.1);
  });
  add_row("cross_entropy_smoothing_ignore", {{4, 5}}, [](const V& x) {
    return cross_entropy(x[0], idx({1, -100, 4, 2}, {4}), "mean", -100, 0.2);
  });
  add_row("cross_entropy_smoothing_none", {{4, 5}}, [t4](const V& x) {
    return cross_entropy(x[0], t4, "none", -100, 0.3);
  });
  add_row("cross_entropy_spatial", {{2, 3, 2, 2}}, [](const V& x) {
    return cross_entropy(x[0], idx({0, 1, 2, 2, 1, 0, 0, 1}, {2, 2, 2}));
  });
  // Probability targets (soft labels), with respect to the logits and to the target itself.
  add_row("cross_entropy_probs_mean", {{4, 5}, {4, 5}}, [](const V& x) { return cross_entropy(x[0], softmax(x[1], 1)); });
  add_row("cross_entropy_probs_smoothing_sum", {{4, 5}, {4, 5}},
          [](const V& x) { return cross_entropy(x[0], softmax(x[1], 1), "sum", -100, 0.2); });
  add_row("nll_loss_mean", {{4, 5}}, [t4](const V& x) { return nll_loss(log_softmax(x[0], 1), t4); });
  add_row("nll_loss_raw_sum", {{4, 5}}, [t4](const V& x) { return nll_loss(x[0], t4, "sum"); });
  add_row("nll_loss_none_ignore", {{4, 5}}, [](const V& x) {
    return nll_loss(x[0], idx({1, -100, 4, 0}, {4}), "none");
  });
  add_row("mse_loss_mean", {{3, 4}, {3, 4}}, [](const V& x) { return mse_loss(x[0], x[1]); });
  add_row("mse_loss_sum", {{3, 4}, {3, 4}}, [](const V& x) { return mse_loss(x[0], x[1], "sum"); });
  add_row("mse_loss_none", {{3, 4}, {3, 4}}, [](const V& x) { return mse_loss(x[0], x[1], "none"); });

  // ---- dropout ----
  add_row("dropout_eval_identity", {{3, 4}}, [](const V& x) { return dropout(x[0], 0.5, false); });
  add_row("dropout_p0_identity", {{3, 4}}, [](const V& x) { return dropout(x[0], 0.0, true) * 1.0; });
  add_row("dropout_train_seeded", {{4, 6}}, [](const V& x) {
    manual_seed(1234);  // the same mask on every evaluation
    return dropout(x[0], 0.4, true);
  });

  // ---- in-place ops on non-leaf tensors (history rebase) ----
  add_row("inplace_add_", {{3, 4}, {4}}, [](const V& x) {
    Tensor y = x[0] * 2.0;
    add_(y, x[1]);
    return y * x[0];
  });
  add_row("inplace_add_scalar_", {{3, 4}}, [](const V& x) {
    Tensor y = exp(x[0]) * 1.0;
    add_(y, 3.0);
    return y * y;
  });
  add_row("inplace_mul_", {{3, 4}, {3, 4}}, [](const V& x) {
    Tensor y = x[0] + 1.0;
    mul_(y, x[1]);
    return y;
  });
  add_row("inplace_mul_broadcast_", {{3, 4}, {3, 1}}, [](const V& x) {
    Tensor y = tanh(x[0]) * 1.0;
    mul_(y, x[1]);
    return square(y);
  });
  add_row("inplace_mul_scalar_", {{3, 4}}, [](const V& x) {
    Tensor y = sigmoid(x[0]) * 1.0;
    mul_(y, -2.5);
    return y;
  });
  add_row("inplace_relu_", {{3, 4}}, [](const V& x) {
    Tensor y = x[0] * 1.5;
    relu_(y);
    return y * x[0];
  });
  add_row("inplace_fill_", {{3, 4}}, [](const V& x) {
    Tensor y = x[0] * 2.0;
    fill_(y, 0.25);
    return y * x[0];
  });
  add_row("inplace_zero_", {{3, 4}}, [](const V& x) {
    Tensor y = square(x[0]);
    zero_(y);
    return add(y, x[0]);
  });
  add_row("inplace_method_fill_zero", {{3, 4}, {3, 4}}, [](const V& x) {
    Tensor y = x[0] * 1.0, z = x[1] * 1.0;
    y.fill_(2.0);
    z.zero_();
    return y * x[1] + z;
  });
  add_row("inplace_copy_", {{3, 4}, {4}}, [](const V& x) {
    Tensor y = x[0] * 3.0;
    y.copy_(x[1]);  // broadcast copy: x[1]'s grad sums over rows, x[0] gets nothing through y
    return y * x[0];
  });
  add_row("inplace_scatter_", {{3, 4}, {3, 2}}, [](const V& x) {
    Tensor y = x[0] * 1.0;
    scatter_(y, 1, idx({0, 2, 3, 1, 1, 0}, {3, 2}), x[1]);
    return y * y;
  });
  add_row("inplace_into_leaf_free_tensor", {{3, 4}}, [](const V& x) {
    Tensor y = zeros({3, 4}, {DType::f64});  // plain tensor, gains history from the in-place op
    add_(y, x[0]);
    return exp(y);
  });
  return r;
}

uint64_t test_seed() {
  const char* s = std::getenv("MG_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20240611;
}

class GradcheckTest : public ::testing::TestWithParam<Row> {};

TEST_P(GradcheckTest, MatchesFiniteDifferences) {
  const Row& row = GetParam();
  Generator gen(test_seed() + std::hash<std::string>{}(row.name));
  V inputs;
  for (const Shape& s : row.shapes) {
    Tensor z = randn(s, {DType::f64}, &gen);
    if (row.init == Init::Positive) {
      z = add(abs(z), 0.5);
    } else if (row.init == Init::AwayFromZero) {
      Tensor sign = kernels::unary(kernels::Unary::Sign, z);
      z = mul(sign, add(abs(z), 0.5));
    }
    inputs.push_back(z.detach().requires_grad_(true));
  }
  EXPECT_TRUE(gradcheck(row.fn, inputs, row.eps, row.atol, row.rtol)) << "row: " << row.name;
}

INSTANTIATE_TEST_SUITE_P(AllOps, GradcheckTest, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& info) { return info.param.name; });

// The checker itself must fail on a wrong backward, and say where.
TEST(GradcheckSelfTest, CatchesAWrongGradient) {
  GradFn wrong_square = [](const V& x) {
    Tensor out = kernels::unary(kernels::Unary::Square, x[0]);
    autograd::record("wrong_square", {x[0]}, out, [](const V& g) { return V{g[0]}; });  // forgot the 2x
    return out;
  };
  Generator gen(1);
  Tensor x = randn({2, 3}, {DType::f64}, &gen);
  x.requires_grad_(true);
  ::testing::AssertionResult r = gradcheck(wrong_square, {x});
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("input 0 [2, 3] element 0: analytic"), std::string::npos) << r.message();
  EXPECT_TRUE(gradcheck([](const V& v) { return square(v[0]); }, {x}));
  EXPECT_FALSE(x.grad().defined()) << "gradcheck works on copies of the inputs";
  EXPECT_FALSE(gradcheck([](const V& v) { return square(v[0]); }, {x.detach()})) << "nothing requires grad";
}

// The table itself: names are unique (gtest needs it) and it covers at least the ops the
// design asks for.
TEST(GradcheckTable, HasEveryOp) {
  auto all = rows();
  EXPECT_GE(all.size(), 130u);
  std::set<std::string> names;
  for (const Row& row : all) EXPECT_TRUE(names.insert(row.name).second) << "duplicate row " << row.name;
}

}  // namespace
}  // namespace mg
