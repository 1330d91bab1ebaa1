// LayerNorm, Embedding, GELU, SiLU, MultiheadSelfAttention and TransformerBlock modules.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/autograd_meta.h"
#include "autograd/functions.h"
#include "autograd/recompute.h"
#include "kernels/ops.h"
#include "nn/nn.h"
#include "tests/autograd/gradcheck.h"
#include "tests/error_of.h"

namespace mg::nn {
namespace {

const TensorOptions kF64{DType::f64};

TEST(LayerNormModule, NormalizesRowsAndInitsAffine) {
  LayerNorm ln(6);
  EXPECT_EQ(ln.weight.to_vector<double>(), std::vector<double>(6, 1.0));
  EXPECT_EQ(ln.bias.to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(ln.parameters().size(), 2u);
  Tensor y = ln(add(mul(randn({4, 6}), 3.0), 2.0));
  auto m = mean(y, {-1}).to_vector<double>(), v = var(y, {-1}, 0).to_vector<double>();
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(m[i], 0.0, 1e-5);
    EXPECT_NEAR(v[i], 1.0, 1e-3);
  }
  LayerNorm two(Shape{2, 3}, 1e-5, false);
  EXPECT_TRUE(two.parameters().empty());
  EXPECT_EQ(two(randn({5, 2, 3})).sizes(), (Shape{5, 2, 3}));
  EXPECT_THROW(two(randn({5, 3, 2})), ShapeError);
  EXPECT_EQ(LayerNorm(4, 1e-5, true, /*bias=*/false).parameters().size(), 1u);
}

TEST(LayerNormModule, GradcheckThroughModule) {
  LayerNorm ln(Shape{3, 2}, 1e-5, true, true, kF64);
  init::normal_(ln.weight);
  init::normal_(ln.bias);
  EXPECT_TRUE(
      gradcheck([&](const std::vector<Tensor>& x) { return ln(x[0]); }, {randn({2, 3, 2}, kF64).requires_grad_(true)}));
}

// A residual bias goes with a residual: without one it is an error, on the fused op's path
// and on the plain ops' path that a policy rebuilding layer norms takes, and a residual
// stream refuses a branch that is a bias alone.
TEST(LayerNormModule, ResidualBiasWithoutResidualIsAnError) {
  LayerNorm ln(4);
  Tensor x = randn({2, 4}), b = zeros({4});
  const auto norm = [&](const Tensor& in) {
    return add_layer_norm(in, Tensor(), {4}, ln.weight, ln.bias, 1e-5, {}, b);
  };
  const std::string want = "add_layer_norm: a residual bias (shape [4]) needs a residual, got none";
  EXPECT_EQ(testing::error_of<ValueError>([&] { norm(x); }), want);
  EXPECT_EQ(testing::error_of<ValueError>([&] {
              Residual(x, Branch{Tensor(), b});
            }),
            "Residual: a branch bias (shape [4]) needs a branch output, got none");
  SelectiveRecompute policy(RecomputePolicy::cheap_ops());
  EXPECT_EQ(testing::error_of<ValueError>([&] { norm(x.requires_grad_(true)); }), want);
}

// On a residual stream the add waits for the next layer norm: ln(x + branch) is the norm of the
// sum, and the stream holds the sum afterwards; value() adds without a norm. f64: the fused op
// and the plain ops are two orders of the same adds.
TEST(LayerNormModule, ResidualStreamAddsInsideTheNorm) {
  Generator g(8);
  LayerNorm ln(Shape{6}, 1e-5, true, true, kF64);
  init::normal_(ln.weight, 0.0, 1.0, &g);
  init::normal_(ln.bias, 0.0, 1.0, &g);
  const Tensor x = randn({3, 6}, kF64, &g), out = randn({3, 6}, kF64, &g), bias = randn({6}, kF64, &g);
  const Tensor sum = add(add(x, out), bias);
  Residual r = Residual(x) + Branch{out, bias};
  ASSERT_TRUE(r.has_pending());
  const auto y = ln(r).value().to_vector<double>(), want = ln(sum).to_vector<double>();
  EXPECT_FALSE(r.has_pending());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-12);
  const auto h = r.value().to_vector<double>(), s = sum.to_vector<double>();
  for (size_t i = 0; i < h.size(); ++i) EXPECT_NEAR(h[i], s[i], 1e-12);
  Residual v = Residual(x) + Branch{out, bias};
  const auto hv = v.value().to_vector<double>();
  for (size_t i = 0; i < hv.size(); ++i) EXPECT_NEAR(hv[i], s[i], 1e-12);
}

TEST(EmbeddingModule, LooksUpRowsAndInitsStandardNormal) {
  Generator g(3);
  Embedding emb(1000, 16, {}, &g);
  EXPECT_EQ(emb.weight.sizes(), (Shape{1000, 16}));
  auto w = emb.weight.to_vector<double>();
  double s = 0, s2 = 0;
  for (double v : w) s += v, s2 += v * v;
  EXPECT_NEAR(s / w.size(), 0.0, 0.03);
  EXPECT_NEAR(s2 / w.size(), 1.0, 0.05);
  Tensor out = emb(from_vector<int64_t>({3, 999, 3}, {1, 3}));
  EXPECT_EQ(out.sizes(), (Shape{1, 3, 16}));
  EXPECT_EQ(out.select(1, 0).to_vector<double>(), out.select(1, 2).to_vector<double>());
  EXPECT_THROW(emb(from_vector<int64_t>({1000}, {1})), IndexError);
  EXPECT_THROW(Embedding(0, 4), ValueError);
}

TEST(Activations, GeluSiluValues) {
  Tensor x = tensor({-2.0, -0.5, 0.0, 1.0, 3.0}, {5}, kF64);
  auto e = GELU()(x).to_vector<double>(), t = GELU("tanh")(x).to_vector<double>(), s = SiLU()(x).to_vector<double>();
  auto xv = x.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i];
    EXPECT_NEAR(e[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-12);
    const double u = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
    EXPECT_NEAR(t[i], 0.5 * v * (1 + std::tanh(u)), 1e-12);
    EXPECT_NEAR(s[i], v / (1 + std::exp(-v)), 1e-12);
  }
  EXPECT_THROW(GELU("fast"), ValueError);
  EXPECT_EQ(GELU("tanh").str(), "GELU(approximate=tanh)");
}

// The module's output from its own weights, recomputed head by head.
TEST(MultiheadSelfAttention, MatchesPerHeadComputation) {
  Generator g(11);
  MultiheadSelfAttention attn(8, 2, /*causal=*/true, 0.0, true, kF64, &g);
  Tensor x = randn({2, 5, 8}, kF64, &g);
  Tensor y = attn(x);
  ASSERT_EQ(y.sizes(), (Shape{2, 5, 8}));
  Tensor qkv = linear(x, attn.c_attn->weight, attn.c_attn->bias);
  std::vector<Tensor> heads;
  for (int64_t h = 0; h < 2; ++h) {
    Tensor q = qkv.narrow(2, h * 4, 4), k = qkv.narrow(2, 8 + h * 4, 4), v = qkv.narrow(2, 16 + h * 4, 4);
    heads.push_back(sdpa_composed(q.contiguous(), k.contiguous(), v.contiguous(), true));
  }
  Tensor ref = linear(cat(heads, 2), attn.c_proj->weight, attn.c_proj->bias);
  auto a = y.to_vector<double>(), b = ref.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12);
  EXPECT_THROW(MultiheadSelfAttention(10, 3), ValueError);
  EXPECT_THROW(attn(randn({2, 5, 6}, kF64)), ShapeError);
}

TEST(MultiheadSelfAttention, CausalOutputIgnoresFutureTokens) {
  Generator g(12);
  MultiheadSelfAttention attn(8, 4, true, 0.0, true, kF64, &g);
  Tensor x = randn({1, 6, 8}, kF64, &g);
  Tensor x2 = raw::clone(x);
  raw::copy_(raw::slice(x2, 1, 3, 6, 1), randn({1, 3, 8}, kF64, &g));
  auto a = attn(x).narrow(1, 0, 3).to_vector<double>(), b = attn(x2).narrow(1, 0, 3).to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12);
  // Without the mask the early positions see the change.
  MultiheadSelfAttention full(8, 4, false, 0.0, true, kF64, &g);
  EXPECT_NE(full(x).narrow(1, 0, 3).to_vector<double>(), full(x2).narrow(1, 0, 3).to_vector<double>());
}

// GPT-2's block at 8 channels and 2 heads.
TransformerBlockOptions small_block() {
  TransformerBlockOptions o;
  o.n_embd = 8;
  o.n_head = 2;
  return o;
}

TEST(TransformerBlock, GradcheckInputAndParametersGetGradients) {
  Generator g(13);
  TransformerBlockOptions o = small_block();
  TransformerBlock block(o, kF64, &g);
  EXPECT_EQ(block.num_parameters(), 2 * 16 + (8 * 24 + 24) + (8 * 8 + 8) + (8 * 32 + 32) + (32 * 8 + 8));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return block(x[0]); },
                        {randn({2, 3, 8}, kF64, &g).requires_grad_(true)}));
  sum(block(randn({2, 3, 8}, kF64, &g))).backward();
  for (auto& [name, p] : block.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_FALSE(kernels::has_nonfinite(p.grad())) << name;
  }
}

// The c_proj biases are left to the next residual add (add_layer_norm) only where nothing
// comes between: the output dropouts off (p = 0, or eval mode) and the projection's bias the
// parameter itself.
TEST(TransformerBlock, BranchCarriesTheProjectionBiasToTheStreamWithoutDropout) {
  Generator g(5);
  TransformerBlockOptions o = small_block();
  TransformerBlock block(o, kF64, &g);
  Tensor x = randn({2, 3, 8}, kF64, &g);
  const auto mlp_bias = [&](TransformerBlock& b) { return b(Residual(x)).pending().bias; };
  const auto attn_bias = [&](TransformerBlock& b) { return b.attn->branch((*b.ln_1)(x)).bias; };
  Residual r = block(Residual(x));
  ASSERT_TRUE(r.has_pending());
  EXPECT_TRUE(r.pending().bias.is_same(block.mlp->c_proj->bias));
  EXPECT_TRUE(attn_bias(block).is_same(block.attn->c_proj->bias));
  // The stream adds up to the block's output on a plain tensor, and to the plain composition's.
  Tensor plain = add(x, (*block.attn)((*block.ln_1)(x)));
  plain = add(plain, (*block.mlp)((*block.ln_2)(plain)));
  const auto a = r.value().to_vector<double>(), b = block(x).to_vector<double>(), c = plain.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-12);
    EXPECT_NEAR(a[i], c[i], 1e-12);  // two orders of the same f64 adds
  }

  o.dropout = 0.1;
  TransformerBlock dropping(o, kF64, &g);
  EXPECT_FALSE(dropping(Residual(x)).has_pending());  // training: the dropout is on, added in the block
  EXPECT_EQ(dropping.attn->branch((*dropping.ln_1)(x)).p, 0.1);
  dropping.eval();
  EXPECT_TRUE(mlp_bias(dropping).is_same(dropping.mlp->c_proj->bias));
  EXPECT_TRUE(attn_bias(dropping).is_same(dropping.attn->c_proj->bias));

  o.dropout = 0.0;
  o.gelu_approximate = "none";  // the MLP runs as its modules; c_proj still leaves its bias
  TransformerBlock erf(o, kF64, &g);
  EXPECT_TRUE(mlp_bias(erf).is_same(erf.mlp->c_proj->bias));
  o.gelu_approximate = "tanh";
  o.bias = false;
  TransformerBlock unbiased(o, kF64, &g);
  EXPECT_FALSE(mlp_bias(unbiased).defined());
}

// On a plain tensor (no layer norm reads the output next) the block adds its MLP branch once,
// with c_proj's bias inside the fused MLP's GEMM: the output's node is one add whose inputs are
// the stream (from add_layer_norm) and the gelu_mlp node itself, not a second add of the bias.
TEST(TransformerBlock, PlainOutputAddsTheMlpOnceWithItsBiasInTheGemm) {
  Generator g(9);
  TransformerBlock block(small_block(), kF64, &g);
  Tensor x = randn({2, 3, 8}, kF64, &g).requires_grad_(true);
  Tensor y = block(x);
  ASSERT_EQ(autograd::grad_fn(y)->name(), "add");
  std::vector<std::string> inputs;
  for (const auto& e : autograd::grad_fn(y)->next_edges) inputs.push_back(e.node ? e.node->name() : "");
  EXPECT_EQ(inputs, (std::vector<std::string>{"add_layer_norm", "gelu_mlp"}));
  Residual r = block(Residual(x));  // a norm reads this one: the bias is left to it
  EXPECT_TRUE(r.pending().bias.is_same(block.mlp->c_proj->bias));
}

// With the output dropouts on (training), each branch's c_proj bias, dropout and residual add
// run as one bias_dropout_add (the stream's value never left pending), drawing the masks the
// plain composition draws from the same seed: the block's output and every gradient are the
// composition's, in f64 up to the order of its adds (the bias in the GEMM or in the kernel).
TEST(TransformerBlock, TrainingDropoutIsTheFusedKernelWithTheComposedValues) {
  for (const char* gelu : {"tanh", "none"}) {
    Generator g(17);
    TransformerBlockOptions o = small_block();
    o.dropout = 0.3;
    o.gelu_approximate = gelu;
    TransformerBlock block(o, kF64, &g);
    const Tensor x0 = randn({2, 5, 8}, kF64, &g), gout = randn({2, 5, 8}, kF64, &g);
    const auto run = [&](bool fused) {
      block.zero_grad();
      Tensor x = x0.detach().requires_grad_(true);
      manual_seed(2718);
      Tensor y;
      if (fused) {
        Residual r = block(Residual(x));
        EXPECT_FALSE(r.has_pending()) << "a dropped branch is added in the block";
        y = r.value();
        EXPECT_EQ(autograd::grad_fn(y)->name(), "bias_dropout_add");
      } else {
        y = add(x, (*block.attn)((*block.ln_1)(x)));
        y = add(y, (*block.mlp)((*block.ln_2)(y)));
      }
      y.backward(gout);
      std::vector<std::vector<double>> r{y.to_vector<double>(), x.grad().to_vector<double>()};
      for (auto& [name, p] : block.named_parameters()) r.push_back(p.grad().to_vector<double>());
      return r;
    };
    const auto f = run(true), c = run(false);
    ASSERT_EQ(f.size(), c.size());
    for (size_t t = 0; t < f.size(); ++t)
      for (size_t i = 0; i < f[t].size(); ++i) EXPECT_NEAR(f[t][i], c[t][i], 1e-11) << gelu << " tensor " << t;
  }
}

TEST(TransformerBlock, DropoutOnlyInTraining) {
  TransformerBlockOptions o = small_block();
  o.dropout = 0.5;
  TransformerBlock block(o);
  Tensor x = randn({2, 4, 8});
  block.eval();
  EXPECT_EQ(block(x).to_vector<double>(), block(x).to_vector<double>());
  block.train();
  EXPECT_NE(block(x).to_vector<double>(), block(x).to_vector<double>());
}

}  // namespace
}  // namespace mg::nn
