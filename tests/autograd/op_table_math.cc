// Rows of the op table: elementwise, reductions, linear algebra, softmax and views. The
// generated sweeps (sizes 1 to 4097, transposed, stepped and unaligned views, broadcasts,
// long reductions) are the cases the kernel parity tables ran, now with gradients too.
#include <cmath>
#include <functional>

#include "autograd/functions.h"
#include "core/random.h"
#include "tests/autograd/layouts.h"
#include "tests/autograd/op_table.h"

namespace mg::op_table {
namespace {

// The accumulation growth of a length-K reduction: rounding errors add like a random walk.
double cond_for(int64_t k) { return 32 + 2 * std::sqrt(static_cast<double>(k)); }

// gradcheck contracts the output with random weights: over more than 10^4 outputs the sum's
// rounding (~1e-12) divided by the default step 1e-6 exceeds atol; a step of 1e-4 keeps the
// truncation error (eps^2 times the third derivative) far below it for these smooth ops.
constexpr double kLargeOutputEps = 1e-4;

using mg::testing::binary_layouts;
using mg::testing::BinaryLayout;
using mg::testing::Layout;
using mg::testing::unary_layouts;
using mg::testing::ViewFn;

void elementwise(Table& t) {
  t.add("add", "add", {{2, 3}, {2, 3}}, [](const V& x) { return add(x[0], x[1]); });
  t.add("add_broadcast_row", "add", {{2, 3}, {3}}, [](const V& x) { return x[0] + x[1]; });
  t.add("add_broadcast_both", "add", {{2, 1}, {1, 3}}, [](const V& x) { return x[0] + x[1]; });
  t.add("add_0dim", "add", {{2, 3}, {}}, [](const V& x) { return x[0] + x[1]; });
  t.add("sub_broadcast", "sub", {{4, 3}, {4, 1}}, [](const V& x) { return x[0] - x[1]; });
  t.add("mul_broadcast", "mul", {{2, 3, 4}, {3, 1}}, [](const V& x) { return x[0] * x[1]; });
  t.add("mul_same_input", "mul", {{3, 2}}, [](const V& x) { return x[0] * x[0]; });
  t.add(
      "div_broadcast", "div", {{3, 4}, {4}}, [](const V& x) { return x[0] / x[1]; }, Init::AwayFromZero);
  t.add("mixed_dtype_mul_f32_const", "mul", {{3, 2}}, [](const V& x) {
    return x[0] * on(x[0], tensor({1, 2, 3, 4, 5, 6}, {3, 2}, {DType::f32}));  // f32 const promotes to f64
  });
  t.add("add_scalar", "add", {{2, 3}}, [](const V& x) { return add(x[0], 2.5); });
  t.add("sub_scalar", "sub", {{2, 3}}, [](const V& x) { return x[0] - 1.5; });
  t.add("mul_scalar", "mul", {{2, 3}}, [](const V& x) { return -3.0 * x[0]; });
  t.add("div_scalar", "div", {{2, 3}}, [](const V& x) { return x[0] / 4.0; });
  t.add("rsub_scalar", "rsub", {{2, 3}}, [](const V& x) { return 2.0 - x[0]; });
  t.add("neg", "neg", {{2, 3}}, [](const V& x) { return -x[0]; });
  t.add("exp", "exp", {{2, 3}}, [](const V& x) { return exp(x[0]); });
  t.add(
      "log", "log", {{2, 3}}, [](const V& x) { return log(x[0]); }, Init::Positive);
  t.add(
      "sqrt", "sqrt", {{2, 3}}, [](const V& x) { return sqrt(x[0]); }, Init::Positive);
  t.add(
      "rsqrt", "rsqrt", {{2, 3}}, [](const V& x) { return rsqrt(x[0]); }, Init::Positive);
  t.add(
      "abs", "abs", {{2, 3}}, [](const V& x) { return abs(x[0]); }, Init::AwayFromZero);
  t.add("square", "square", {{2, 3}}, [](const V& x) { return square(x[0]); });
  t.add(
      "pow_scalar", "pow", {{2, 3}}, [](const V& x) { return pow(x[0], 2.5); }, Init::Positive);
  t.add("pow_scalar_int", "pow", {{2, 3}}, [](const V& x) { return pow(x[0], 3.0); });
  t.add(
      "pow_tensor", "pow", {{2, 3}, {2, 3}}, [](const V& x) { return pow(x[0], x[1]); }, Init::Positive);
  t.add(
      "pow_tensor_broadcast", "pow", {{2, 3}, {3}}, [](const V& x) { return pow(x[0], x[1]); }, Init::Positive);
  t.add("relu", "relu", {{3, 4}}, [](const V& x) { return relu(x[0]); });
  t.add("gelu_erf", "gelu", {{3, 4}}, [](const V& x) { return gelu(x[0]); });
  t.add("gelu_tanh", "gelu", {{3, 4}}, [](const V& x) { return gelu(x[0], true); });
  t.add("silu", "silu", {{3, 4}}, [](const V& x) { return silu(x[0]); });
  t.add("softplus_beta", "softplus", {{3, 4}}, [](const V& x) { return softplus(x[0], 2.5); });
  t.add("sigmoid", "sigmoid", {{3, 4}}, [](const V& x) { return sigmoid(x[0]); });
  t.add("tanh", "tanh", {{3, 4}}, [](const V& x) { return tanh(x[0]); });
  t.add("maximum", "maximum", {{3, 4}, {3, 4}}, [](const V& x) { return maximum(x[0], x[1]); });
  t.add("maximum_broadcast", "maximum", {{3, 4}, {4}}, [](const V& x) { return maximum(x[0], x[1]); });
  t.add("minimum", "minimum", {{3, 4}, {3, 4}}, [](const V& x) { return minimum(x[0], x[1]); });
  t.add("clamp", "clamp", {{4, 5}}, [](const V& x) { return clamp(x[0], -0.5, 0.7); });
  t.add("where", "where", {{2, 3}, {2, 3}}, [](const V& x) {
    return where(mask(x[0], {true, false, true, false, false, true}, {2, 3}), x[0], x[1]);
  });
  t.add("where_broadcast", "where", {{2, 3}, {3}}, [](const V& x) {
    return where(mask(x[0], {true, false, true, false, false, true}, {2, 3}), x[0], x[1]);
  });

  // Sweeps over sizes and layouts (from the kernel parity tables).
  struct Unary {
    std::string name;
    Tensor (*fn)(const Tensor&);
    bool positive;
  };
  const std::vector<Unary> unary = {
      {"neg", [](const Tensor& a) { return neg(a); }, false},
      {"exp", [](const Tensor& a) { return exp(a); }, false},
      {"log", [](const Tensor& a) { return log(a); }, true},
      {"sqrt", [](const Tensor& a) { return sqrt(a); }, true},
      {"rsqrt", [](const Tensor& a) { return rsqrt(a); }, true},
      {"abs", [](const Tensor& a) { return abs(a); }, false},
      {"relu", [](const Tensor& a) { return relu(a); }, false},
      {"gelu", [](const Tensor& a) { return gelu(a); }, false},
      {"gelu_tanh", [](const Tensor& a) { return gelu(a, true); }, false},
      {"sigmoid", [](const Tensor& a) { return sigmoid(a); }, false},
      {"tanh", [](const Tensor& a) { return tanh(a); }, false},
      {"square", [](const Tensor& a) { return square(a); }, false},
      {"silu", [](const Tensor& a) { return silu(a); }, false},
      {"softplus", [](const Tensor& a) { return softplus(a); }, false},
  };
  for (const Unary& u : unary)
    for (const Layout& l : unary_layouts()) {
      const std::string op = u.name == "gelu_tanh" ? "gelu" : u.name;
      Row& r = t.add(
          u.name + "_" + l.name, op, {l.base}, [f = u.fn, v = l.view](const V& x) { return f(v(x[0])); },
          Init::Uniform);
      r.lo = u.positive ? 0.1 : -3, r.hi = 3;
      // erf-gelu is x * 0.5 (1 + erf(x / sqrt(2))): the sum cancels for negative x, by up to
      // 1 / Phi(-3) ~ 740 at the range's end, in the f32 arithmetic of every dtype.
      if (u.name == "gelu") r.cond = 1024;
      // Their backward reads the rounded output y: 1 - y^2 (tanh) and y (1 - y) (sigmoid)
      // cancel as |y| -> 1, amplifying y's rounding by 2 y^2 / (1 - y^2) ~ 100 at x = 3 (tanh)
      // and y / (1 - y) ~ 20 (sigmoid).
      if (u.name == "tanh") r.grad_roundings = 64;
      if (u.name == "sigmoid") r.grad_roundings = 32;
    }

  struct Binary {
    std::string name;
    Tensor (*fn)(const Tensor&, const Tensor&);
    double lo, hi;  // div keeps its denominators and pow its bases away from zero
  };
  const std::vector<Binary> binary = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, -2, 2},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, -2, 2},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, -2, 2},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, 0.5, 2},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.1, 2},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, -2, 2},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, -2, 2},
  };
  for (const Binary& b : binary)
    for (const BinaryLayout& l : binary_layouts()) {
      Row& r = t.add(
          b.name + "_" + l.name, b.name, {l.a, l.b},
          [f = b.fn, va = l.va, vb = l.vb](const V& x) { return f(va(x[0]), vb(x[1])); }, Init::Uniform);
      r.lo = b.lo, r.hi = b.hi;
      // A broadcast input's gradient sums the rounded per-element gradients: with mixed signs
      // the sum can be several times smaller than its terms (seen: 14 roundings' worth in f16).
      if (l.name.rfind("bcast", 0) == 0 || l.name == "0dim_b") r.grad_roundings = 32;
      // The 0-dim input's gradient is one sum of 1000 mixed-sign terms, compared with its own
      // (possibly small) size: seen at 320 f32 roundings over 35 seeds.
      if (l.name == "0dim_b") r.cond = 512;
    }

  struct ScalarOp {
    std::string name, op;
    std::function<Tensor(const Tensor&)> fn;
  };
  const std::vector<ScalarOp> scalar_ops = {
      {"add_scalar", "add", [](const Tensor& a) { return add(a, 1.5); }},
      {"mul_scalar", "mul", [](const Tensor& a) { return mul(a, -0.5); }},
      {"pow_2", "pow", [](const Tensor& a) { return pow(a, 2.0); }},
      {"pow_0.5", "pow", [](const Tensor& a) { return pow(a, 0.5); }},
      {"pow_3", "pow", [](const Tensor& a) { return pow(a, 3.0); }},
      {"pow_-1.5", "pow", [](const Tensor& a) { return pow(a, -1.5); }},
      {"clamp_both", "clamp", [](const Tensor& a) { return clamp(a, 0.5, 2.0); }},
      {"clamp_hi", "clamp", [](const Tensor& a) { return clamp(a, -INFINITY, 1.0); }},
  };
  for (const ScalarOp& s : scalar_ops)
    for (const Layout& l : unary_layouts()) {
      std::string name = s.name + "_" + l.name;
      for (char& c : name)
        if (c == '.' || c == '-') c = '_';  // gtest names are identifiers
      Row& r = t.add(
          name, s.op, {l.base}, [f = s.fn, v = l.view](const V& x) { return f(v(x[0])); }, Init::Uniform);
      r.lo = 0.1, r.hi = 3;
    }
  // A fixed random [33, 1] condition: both devices must pick the same side.
  static const std::vector<bool> cond33 = [] {
    Generator g(33);
    std::vector<bool> c;
    for (double v : uniform({33}, 0, 1, {DType::f64}, &g).to_vector<double>()) c.push_back(v > 0.5);
    return c;
  }();
  t.add("where_bcast_cond_and_b", "where", {{33, 40}, {40}}, [](const V& x) {
    return where(mask(x[0], cond33, {33, 1}), x[0], x[1]);
  });
  t.add("where_transposed", "where", {{40, 33}, {40}}, [](const V& x) {
    return where(mask(x[0], cond33, {33, 1}), x[0].transpose(0, 1), x[1]);
  });
}

void reductions(Table& t) {
  // N(0, 1) inputs summed to one number cancel: the result can be far smaller than its terms.
  t.add("sum_all", "sum", {{3, 4}}, [](const V& x) { return sum(x[0]); }).cond = 128;
  t.add("sum_dim", "sum", {{3, 4}}, [](const V& x) { return sum(x[0], {1}); });
  t.add("sum_dims_keepdim", "sum", {{2, 3, 4}}, [](const V& x) { return sum(x[0], {0, -1}, true); });
  t.add("mean_all", "mean", {{3, 4}}, [](const V& x) { return mean(x[0]); }).cond = 128;
  t.add("mean_dim", "mean", {{2, 3, 4}}, [](const V& x) { return mean(x[0], {1}); });
  t.add("mean_dim_keepdim", "mean", {{2, 3, 4}}, [](const V& x) { return mean(x[0], {2}, true); });
  t.add("max_dim", "max", {{3, 5}}, [](const V& x) { return max(x[0], 1); });
  t.add("max_dim0_keepdim", "max", {{3, 5}}, [](const V& x) { return max(x[0], 0, true); });
  t.add("amax", "amax", {{3, 5}}, [](const V& x) { return amax(x[0]); });
  t.add("var_all", "var", {{3, 4}}, [](const V& x) { return var(x[0]); });
  t.add("var_dim_unbiased", "var", {{3, 4}}, [](const V& x) { return var(x[0], {1}); });
  t.add("var_dim_population_keepdim", "var", {{3, 4}}, [](const V& x) { return var(x[0], {0}, 0, true); });

  // Sweep: short, long (split partials) and permuted reductions. Positive inputs: no
  // cancellation, so relative tolerances hold for long sums.
  struct Case {
    std::string name;
    Shape shape;
    ViewFn view;
    std::vector<std::vector<int64_t>> dimsets;
  };
  const ViewFn id = [](const Tensor& a) { return a; };
  const std::vector<Case> cases = {
      {"n1", {1}, id, {{}, {0}}},
      {"n4097", {4097}, id, {{}, {0}}},
      {"5x33x17", {5, 33, 17}, id, {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}}},
      {"permuted",
       {17, 33, 5},
       [](const Tensor& a) {
         return a.permute({2, 1, 0});
       },
       {{}, {0}, {2}, {0, 1}}},
      {"3x100000", {3, 100000}, id, {{1}, {0}, {}}},
      {"100000x3", {100000, 3}, id, {{0}, {1}}},
      {"300x1000", {300, 1000}, id, {{0}, {1}}},
      {"2x3000x7", {2, 3000, 7}, id, {{1}, {0, 2}}},
  };
  for (const Case& c : cases)
    for (const auto& dims : c.dimsets)
      for (bool keep : {false, true}) {
        int64_t k = 1;
        const Shape vs = c.view(zeros(c.shape)).sizes();
        if (dims.empty())
          for (int64_t s : vs) k *= s;
        for (int64_t d : dims) k *= vs[d < 0 ? d + static_cast<int64_t>(vs.size()) : d];
        std::string suffix = c.name + "_dims";
        for (int64_t d : dims) suffix += d < 0 ? "_m" + std::to_string(-d) : "_" + std::to_string(d);
        if (dims.empty()) suffix += "_all";
        if (keep) suffix += "_keepdim";
        int64_t out = 1;
        for (int64_t s : vs) out *= s;
        out /= k;
        auto row = [&](const std::string& name, GradFn fn) {
          Row& r = t.add(name + "_" + suffix, name.substr(0, 3) == "var" ? "var" : name, {c.shape}, std::move(fn),
                         Init::Uniform);
          r.lo = 0.5, r.hi = 1.5, r.cond = cond_for(k);
          if (out > 10000) r.eps = kLargeOutputEps;
          // var's backward is 2 (x - mean) / (N - c): x and mean are rounded to the dtype first,
          // and on [0.5, 1.5] |x| / |x - mean| ~ mean / std ~ 3.5 amplifies those roundings.
          if (name.substr(0, 3) == "var") r.grad_roundings = 24;
        };
        const ViewFn v = c.view;
        row("sum", [=](const V& x) { return sum(v(x[0]), dims, keep); });
        row("mean", [=](const V& x) { return mean(v(x[0]), dims, keep); });
        row("var_c0", [=](const V& x) { return var(v(x[0]), dims, 0, keep); });
        // Unbiased variance of one element is 0/0: nothing to differentiate (the kernel parity
        // test keeps that NaN case).
        if (k > 1) row("var_c1", [=](const V& x) { return var(v(x[0]), dims, 1, keep); });
      }
}

void linalg(Table& t) {
  auto mm = [&](std::string name, std::vector<Shape> shapes, GradFn fn, int64_t k) {
    t.add(std::move(name), "matmul", std::move(shapes), std::move(fn)).cond = cond_for(k);
  };
  auto matmul_fn = [](const V& x) { return matmul(x[0], x[1]); };
  mm("matmul_1d_1d", {{4}, {4}}, matmul_fn, 4);
  mm("matmul_2d_2d", {{3, 4}, {4, 2}}, matmul_fn, 4);
  mm("matmul_1d_2d", {{4}, {4, 2}}, matmul_fn, 4);
  mm("matmul_2d_1d", {{3, 4}, {4}}, matmul_fn, 4);
  mm("matmul_batched_2d", {{2, 3, 4}, {4, 2}}, matmul_fn, 4);
  mm("matmul_batched_broadcast", {{2, 1, 3, 4}, {3, 4, 2}}, matmul_fn, 4);
  mm("matmul_1d_batched", {{4}, {2, 4, 3}}, matmul_fn, 4);
  mm("matmul_batched_1d", {{2, 3, 4}, {4}}, matmul_fn, 4);
  // Sizes from the kernel parity table (the longest reduction sets the tolerance).
  mm("matmul_7_7", {{7}, {7}}, matmul_fn, 7);
  mm("matmul_7_7x5", {{7}, {7, 5}}, matmul_fn, 7);
  mm("matmul_3x7_7", {{3, 7}, {7}}, matmul_fn, 7);
  mm("matmul_33x65_65x17", {{33, 65}, {65, 17}}, matmul_fn, 65);
  mm("matmul_2x5x7_7x4", {{2, 5, 7}, {7, 4}}, matmul_fn, 7);
  mm("matmul_2x1x5x7_3x7x4", {{2, 1, 5, 7}, {3, 7, 4}}, matmul_fn, 21);
  mm("matmul_4x33x65_4x65x17", {{4, 33, 65}, {4, 65, 17}}, matmul_fn, 65);
  mm("matmul_1x1000_1000x1", {{1, 1000}, {1000, 1}}, matmul_fn, 1000);
  t.add("bmm", "bmm", {{2, 3, 4}, {2, 4, 5}}, [](const V& x) { return bmm(x[0], x[1]); });
  t.add("bmm_transposed_broadcast_batch", "bmm", {{6, 65, 33}, {1, 65, 17}}, [](const V& x) {
     return bmm(x[0].transpose(1, 2), x[1].expand({6, 65, 17}));  // a stride-0 batch
   }).cond = cond_for(6 * 65);
  t.add("linear_bias", "linear", {{3, 4}, {5, 4}, {5}}, [](const V& x) { return linear(x[0], x[1], x[2]); });
  t.add("linear_no_bias", "linear", {{3, 4}, {5, 4}}, [](const V& x) { return linear(x[0], x[1]); });
  t.add("linear_3d_input", "linear", {{2, 3, 4}, {5, 4}, {5}}, [](const V& x) { return linear(x[0], x[1], x[2]); });
  t.add("linear_1d_input", "linear", {{4}, {5, 4}, {5}}, [](const V& x) { return linear(x[0], x[1], x[2]); });
  t.add("linear_4x33x65_bias", "linear", {{4, 33, 65}, {17, 65}, {17}}, [](const V& x) {
     return linear(x[0], x[1], x[2]);
   }).cond = cond_for(4 * 33);
  t.add("linear_4x33x65", "linear", {{4, 33, 65}, {17, 65}}, [](const V& x) { return linear(x[0], x[1]); }).cond =
      cond_for(4 * 33);
  // The MLP node: hidden 16 takes cuBLASLt's GELU epilogues on CUDA (the auxiliary matrix needs
  // a leading dim that is a multiple of 8), hidden 6 the fallback (linear, GELU kernel). Two
  // GEMMs and the GELU, each rounded, as the composed linear -> gelu -> linear would be.
  t.add("gelu_mlp_bias", "gelu_mlp", {{2, 3, 4}, {16, 4}, {16}, {4, 16}, {4}}, [](const V& x) {
     return gelu_mlp(x[0], x[1], x[2], x[3], x[4]);
   }).roundings = 12;
  t.add("gelu_mlp_no_bias_hidden_6", "gelu_mlp", {{3, 4}, {6, 4}, {5, 6}}, [](const V& x) {
     return gelu_mlp(x[0], x[1], Tensor(), x[2], Tensor());
   }).roundings = 12;
}

void softmaxes(Table& t) {
  t.add("softmax_last", "softmax", {{3, 5}}, [](const V& x) { return softmax(x[0], -1); });
  t.add("softmax_dim0", "softmax", {{3, 5}}, [](const V& x) { return softmax(x[0], 0); });
  t.add("log_softmax", "log_softmax", {{3, 5}}, [](const V& x) { return log_softmax(x[0], 1); });
  t.add("log_softmax_3d_mid", "log_softmax", {{2, 3, 4}}, [](const V& x) { return log_softmax(x[0], 1); });
  struct Case {
    Shape s;
    int64_t dim;
  };
  for (const Case& c :
       {Case{{33, 1000}, -1}, Case{{33, 1000}, 0}, Case{{4, 5000}, 1}, Case{{2, 20000}, -1}, Case{{64, 3, 7}, 1},
        Case{{10, 70}, 0}, Case{{3000, 20}, 0}, Case{{1}, 0}, Case{{4097}, 0}, Case{{5, 1}, 1}}) {
    const int64_t d = c.dim < 0 ? c.dim + static_cast<int64_t>(c.s.size()) : c.dim;
    std::string suffix;
    for (int64_t s : c.s) suffix += (suffix.empty() ? "" : "x") + std::to_string(s);
    suffix += "_dim" + std::to_string(d);
    for (bool logsm : {false, true}) {
      const int64_t dim = c.dim;
      Row& r = t.add((logsm ? "log_softmax_" : "softmax_") + suffix, logsm ? "log_softmax" : "softmax", {c.s},
                     [dim, logsm](const V& x) { return logsm ? log_softmax(x[0], dim) : softmax(x[0], dim); },
                     Init::Uniform);
      // The backward y (g - sum(g y)) cancels in g - sum(g y) (more so in short rows): in the
      // rounded inputs (grad_roundings) and in the f32 arithmetic (the 4x on cond).
      r.lo = -8, r.hi = 8, r.cond = 4 * cond_for(c.s[d]);
      r.grad_roundings = 16;
      int64_t n = 1;
      for (int64_t s : c.s) n *= s;
      if (n > 10000) r.eps = kLargeOutputEps;
    }
  }
}

void views(Table& t) {
  // The gradient must come back through the inverse shape change.
  t.add("view", "Tensor::view", {{2, 6}}, [](const V& x) { return x[0].view({3, 4}); });
  t.add("view_infer", "Tensor::view", {{2, 6}}, [](const V& x) { return x[0].view({-1, 2}); });
  t.add("reshape_noncontiguous", "reshape", {{3, 4}}, [](const V& x) { return x[0].t().reshape({2, 6}); });
  t.add("reshape_free_fn", "reshape", {{3, 4}}, [](const V& x) { return reshape(x[0], {12}); });
  t.add("permute", "permute", {{2, 3, 4}}, [](const V& x) { return x[0].permute({2, 0, 1}); });
  t.add("permute_free_fn", "permute", {{2, 3, 4}}, [](const V& x) { return permute(x[0], {1, 2, 0}); });
  t.add("transpose", "transpose", {{2, 3, 4}}, [](const V& x) { return x[0].transpose(0, 2); });
  t.add("transpose_free_fn", "transpose", {{2, 3, 4}}, [](const V& x) { return transpose(x[0], -1, 1); });
  t.add("t", "Tensor::t", {{3, 4}}, [](const V& x) { return x[0].t(); });
  t.add("t_1d", "Tensor::t", {{4}}, [](const V& x) { return x[0].t(); });
  t.add("unsqueeze", "Tensor::unsqueeze", {{3, 4}}, [](const V& x) { return x[0].unsqueeze(1); });
  t.add("unsqueeze_last", "Tensor::unsqueeze", {{3, 4}}, [](const V& x) { return x[0].unsqueeze(-1); });
  t.add("squeeze_dim", "Tensor::squeeze", {{3, 1, 4}}, [](const V& x) { return x[0].squeeze(1); });
  t.add("squeeze_all", "Tensor::squeeze", {{1, 3, 1, 4}}, [](const V& x) { return x[0].squeeze(); });
  t.add("flatten", "flatten", {{2, 3, 4}}, [](const V& x) { return x[0].flatten(); });
  t.add("flatten_range", "flatten", {{2, 3, 4, 2}}, [](const V& x) { return flatten(x[0], 1, 2); });
  t.add("narrow", "Tensor::narrow", {{4, 5}}, [](const V& x) { return x[0].narrow(1, 1, 3); });
  t.add("slice_step2", "Tensor::slice", {{4, 7}}, [](const V& x) { return x[0].slice(1, 1, 7, 2); });
  t.add("slice_negative", "Tensor::slice", {{5, 3}}, [](const V& x) { return x[0].slice(0, -3, -1); });
  t.add("select", "Tensor::select", {{3, 4}}, [](const V& x) { return x[0].select(0, 1); });
  t.add("select_negative", "Tensor::select", {{3, 4, 2}}, [](const V& x) { return x[0].select(-1, -1); });
  t.add("expand", "Tensor::expand", {{3, 1}}, [](const V& x) { return x[0].expand({2, 3, 4}); });
  t.add("expand_keep", "Tensor::expand", {{1, 4}}, [](const V& x) { return x[0].expand({3, -1}); });
  t.add("contiguous", "Tensor::contiguous", {{3, 4}}, [](const V& x) { return x[0].t().contiguous(); });
  t.add("clone", "Tensor::clone", {{3, 4}}, [](const V& x) { return x[0].clone(); });
  t.add("chained_views", "Tensor::view", {{2, 3, 4}}, [](const V& x) {
    return x[0].transpose(0, 1).slice(2, 0, 4, 3).unsqueeze(0).expand({2, 3, 2, 2}) *
           x[0].select(2, 0).t().unsqueeze(-1);
  });
  {
    // f32 rounding: a large step; the function is linear.
    Row& r = t.add("to_f32_and_back", "Tensor::to", {{3, 4}},
                   [](const V& x) { return x[0].to(DType::f32).to(DType::f64) * 2.0; });
    r.eps = 1e-2, r.atol = 1e-4, r.rtol = 1e-4;
  }
  {
    Row& r = t.add("to_f32_op_in_f32", "Tensor::to", {{3, 4}}, [](const V& x) { return exp(x[0].to(DType::f32)); });
    r.eps = 1e-3, r.atol = 1e-3, r.rtol = 1e-3;
    // The op runs in f32 whatever the input: an f64 run would hold f32 work to f64's bound.
    r.device_dtypes = {DType::f32, DType::f16, DType::bf16};
  }
  // CPU only: the op is a move to the CPU, so a device run would compare the CPU with itself.
  t.add("to_cpu_same_device", "Tensor::to", {{3, 4}}, [](const V& x) {
     return x[0].to(Device::cpu()) * 1.0;
   }).device_dtypes = {};
}

}  // namespace

std::vector<Row> math_rows() { return Table::of({elementwise, reductions, linalg, softmaxes, views}); }

}  // namespace mg::op_table
