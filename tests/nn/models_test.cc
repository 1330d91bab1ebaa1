// The reference models: published parameter counts (with shared weights counted once), tiny
// forward/backward runs with finite losses and gradients, and GPT's tied embedding/head.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <memory>

#include "autograd/functions.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "kernels/ops.h"
#include "tests/error_of.h"
#include "nn/models/gpt.h"
#include "nn/models/mobilenet.h"
#include "nn/models/resnet.h"
#include "nn/models/vit.h"
#include "nn/prune.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/step_in_backward.h"
#include "tests/autograd/gradcheck.h"

namespace mg::nn {
namespace {

const TensorOptions kF64{DType::f64};

// Prints the count so docs/layers.md can quote what the test measured.
int64_t count(const char* name, const Module& m) {
  const int64_t n = m.num_parameters();
  std::cout << "[params] " << name << " = " << n << "\n";
  return n;
}

void expect_finite_grads(const Module& m) {
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name << " got no gradient";
    EXPECT_FALSE(kernels::has_nonfinite(p.grad())) << name;
  }
}

// ---------------- published parameter counts ----------------

TEST(ParameterCounts, ResNet) {
  EXPECT_EQ(count("resnet18", *resnet18()), 11689512);
  EXPECT_EQ(count("resnet50", *resnet50()), 25557032);
}

TEST(ParameterCounts, Gpt2SmallTiedHead) {
  for (int64_t vocab : {50257, 50304}) {
    GPTConfig c;
    c.vocab_size = vocab;
    GPT gpt(c, {}, nullptr, /*init_weights=*/false);  // only counting: skip the GPT-2 init pass
    // One Parameter, two owners, listed once.
    ASSERT_TRUE(gpt.lm_head->weight.is_same(gpt.wte->weight));
    int64_t listed = 0;
    for (auto& p : gpt.parameters()) listed += p.is_same(gpt.wte->weight);
    EXPECT_EQ(listed, 1);
    EXPECT_EQ(gpt.named_parameters()[0].first, "transformer.wte.weight");
    const int64_t n = count(vocab == 50257 ? "gpt2 (vocab 50257, tied)" : "gpt2 (vocab 50304, tied)", gpt);
    EXPECT_EQ(n, vocab == 50257 ? 124439808 : 124475904);
  }
}

TEST(ParameterCounts, MobileNetAndViT) {
  EXPECT_EQ(count("mobilenet_v1", MobileNet()), 4231976);
  // torchvision's vit_b_16: the patch Linear has exactly the Conv2d(3, 768, 16, 16)'s weights.
  EXPECT_EQ(count("vit_b_16", ViT(ViTConfig{})), 86567656);
}

TEST(ParameterCounts, DepthwiseSeparableVersusStandardConv) {
  // One 3x3 block from 256 to 512 channels.
  DepthwiseSeparable ds(256, 512, 1);
  Conv2d standard(256, 512, 3, 1, 1, 1, 1, false);
  EXPECT_EQ(ds.depthwise->weight.numel() + ds.pointwise->weight.numel(), 9 * 256 + 256 * 512);
  EXPECT_EQ(standard.weight.numel(), 9 * 256 * 512);
  std::cout << "[params] 3x3 conv 256->512: standard " << standard.weight.numel() << ", depthwise-separable "
            << ds.depthwise->weight.numel() + ds.pointwise->weight.numel() << "\n";
  // The whole MobileNet with each block's depthwise + pointwise pair replaced by one standard
  // 3x3 conv of the same in/out channels (batch norms and the rest unchanged).
  MobileNet net;
  int64_t total = net.num_parameters();
  for (size_t i = 0; i < net.features->size(); ++i)
    if (auto* b = dynamic_cast<DepthwiseSeparable*>((*net.features)[i].get())) {
      total -= b->depthwise->weight.numel() + b->pointwise->weight.numel() + b->bn1->num_parameters();
      total += 9 * b->depthwise->in_channels * b->pointwise->out_channels;
    }
  EXPECT_EQ(total, 29294088);
  std::cout << "[params] mobilenet_v1 with standard 3x3 convs = " << total << "\n";
}

TEST(ParameterCounts, BottleneckVersusBasicBlockAtSameWidth) {
  // A ResNet-50 stage-1 block on 256 channels (1x1 256->64, 3x3 64->64, 1x1 64->256) against
  // a BasicBlock of two 3x3 convs on 256 channels.
  Bottleneck bottleneck(256, 64, 1, nullptr);
  BasicBlock basic(256, 256, 1, nullptr);
  const int64_t conv_b =
      bottleneck.conv1->weight.numel() + bottleneck.conv2->weight.numel() + bottleneck.conv3->weight.numel();
  const int64_t conv_s = basic.conv1->weight.numel() + basic.conv2->weight.numel();
  EXPECT_EQ(conv_b, 256 * 64 + 9 * 64 * 64 + 64 * 256);
  EXPECT_EQ(conv_s, 2 * 9 * 256 * 256);
  std::cout << "[params] 256-channel block convs: bottleneck " << conv_b << ", basic " << conv_s << "\n";
}

// ---------------- GPT ----------------

GPTConfig tiny_gpt(int64_t layers = 2, int64_t d = 32, int64_t vocab = 50, int64_t block = 8) {
  return {.vocab_size = vocab, .block_size = block, .n_layer = layers, .n_head = 4, .n_embd = d};
}

// GPT::forward leaves each residual add pending, with the c_proj bias before it, and fuses it
// into the next layer norm (add_layer_norm) and the MLP into one node (gelu_mlp). The same model composed the plain way
// (add, layer_norm, linear, gelu, linear) gives the same loss and gradients: in f64 on the CPU
// the two orders of the same operations agree to a few f64 roundings of the loss's scale. With
// some blocks checkpointed the pending add is flushed before them.
Tensor plain_gpt_loss(GPT& gpt, const Tensor& idx, const Tensor& targets) {
  Tensor pos = arange(0.0, static_cast<double>(idx.size(1)), 1.0, {DType::i64});
  Tensor x = add((*gpt.wte)(idx), (*gpt.wpe)(pos));  // dropout 0
  for (auto& child : gpt.h->children()) {
    auto& b = static_cast<TransformerBlock&>(*child);
    x = add(x, (*b.attn)((*b.ln_1)(x)));
    Tensor f = (*b.mlp->c_fc)((*b.ln_2)(x));
    x = add(x, (*b.mlp->c_proj)(gelu(f, true)));
  }
  return GPT::loss((*gpt.lm_head)((*gpt.ln_f)(x)), targets);
}

// Backpropagates `loss`, then ref(), on gpt's f64 parameters: the two losses and every
// parameter's gradient agree to 1e-12 (a few f64 roundings at these sizes).
void expect_same_loss_and_grads(GPT& gpt, const Tensor& loss, const std::function<Tensor()>& ref_of) {
  loss.backward();
  std::vector<Tensor> first;
  for (auto& p : gpt.parameters()) first.push_back(p.grad().clone()), p.set_grad(Tensor());
  Tensor ref = ref_of();
  ref.backward();
  EXPECT_NEAR(loss.item(), ref.item(), 1e-12);
  size_t i = 0;
  for (auto& p : gpt.parameters()) {
    const auto a = first[i++].to_vector<double>(), b = p.grad().to_vector<double>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], 1e-12) << "parameter " << i - 1 << " element " << j;
  }
}

TEST(GPT, PresetsAndParameterCounts) {
  // Hugging Face's parameter counts of GPT-2 at its own vocabulary of 50257 (tied head).
  const std::pair<const char*, int64_t> hf[] = {
      {"gpt2", 124439808}, {"gpt2-medium", 354823168}, {"gpt2-large", 774030080}, {"gpt2-xl", 1557611200}};
  for (const auto& [name, count] : hf) {
    GPTConfig c = gpt_preset(name);
    c.vocab_size = 50257;
    EXPECT_EQ(gpt_num_params(c), count) << name;
  }
  EXPECT_EQ(gpt_preset("gpt-6.7b").n_embd, 4096);
  EXPECT_EQ(gpt_preset_names().size(), 6u);
  // The formula counts what a built model holds, with and without biases and tying.
  for (bool bias : {true, false})
    for (bool tied : {true, false}) {
      GPTConfig c;
      c.vocab_size = 97, c.block_size = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 24, c.bias = bias;
      c.tied_head = tied;
      GPT m(c, {}, nullptr, false);
      int64_t n = 0;
      for (const Tensor& p : m.parameters()) n += p.numel();
      EXPECT_EQ(n, gpt_num_params(c)) << "bias " << bias << " tied " << tied;
    }
  EXPECT_NE(testing::error_of([] { gpt_preset("gpt2-xxl"); }).find("unknown model \"gpt2-xxl\" (valid: gpt2, "),
            std::string::npos);
  // llm.c's FLOPs a token, 6 N + 6 L C T: GPT-2 124M at T = 1024 (N = 124,475,904 at vocab 50304).
  const GPTConfig small = gpt_preset("gpt2");
  EXPECT_EQ(gpt_flops_per_token(small, 1024), 6.0 * 124475904 + 6.0 * 12 * 768 * 1024);
  // 400K tokens/s against a 989 TFLOP/s peak: 0.326 of it.
  EXPECT_NEAR(gpt_mfu(small, 1024, 4e5, 989e12), 4e5 * (6.0 * 124475904 + 6.0 * 12 * 768 * 1024) / 989e12, 1e-12);
  EXPECT_NE(testing::error_of([&] { gpt_mfu(small, 1024, 1.0, 0.0); }).find("peak must be > 0"), std::string::npos);
  EXPECT_EQ(dense_half_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(dense_half_peak_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(dense_half_peak_flops("NVIDIA A100-SXM4-80GB"), 0.0);  // not in the table: no MFU
}

TEST(GPT, FusedResidualNormAndMlpMatchPlainComposition) {
  const char* modes[] = {"no recompute",
                         "block 1 checkpointed",
                         "selective, GELU only",
                         "block 1 checkpointed, selective GELU only",
                         "blocks 0 and 1 checkpointed keeping gelu_mlp",
                         "the same with every c_proj bias pruned",
                         "every c_proj bias pruned, no recompute",
                         "block 1 checkpointed keeping gelu_mlp, every c_proj weight pruned"};
  for (int mode = 0; mode < 8; ++mode) {
    SCOPED_TRACE(modes[mode]);
    Generator g(4);
    GPT gpt(tiny_gpt(3), {DType::f64}, &g);
    if (mode == 1 || mode == 3) gpt.recompute.block_mask = {false, true, false};
    if (mode == 2 || mode == 3) gpt.recompute.selective = true, gpt.recompute.selective_ops = {"gelu"};
    // The checkpointed blocks take and return the pending branch; its c_proj bias goes along.
    if (mode == 4 || mode == 5) gpt.recompute.block_mask = {true, true, false}, gpt.recompute.keep_ops = {"gelu_mlp"};
    // A plain block hands its MLP's bias into the checkpointed block after it (captured by the region).
    if (mode == 7) gpt.recompute.block_mask = {false, true, false}, gpt.recompute.keep_ops = {"gelu_mlp"};
    // A pruned MLP bias (bias_orig * mask, made by c_proj's pre-hook) stays inside the MLP's GEMM:
    // made in a checkpointed block's forward, without grad, it would carry no history to
    // bias_orig. The attention's is added inside its own block. A pruned weight changes neither.
    if (mode >= 5)
      for (auto& child : gpt.h->children()) {
        auto& blk = static_cast<TransformerBlock&>(*child);
        const std::string what = mode == 7 ? "weight" : "bias";
        prune::l1_unstructured(*blk.mlp->c_proj, what, prune::Amount::fraction(0.5));
        prune::l1_unstructured(*blk.attn->c_proj, what, prune::Amount::fraction(0.5));
      }
    {
      NoGradGuard ng;
      EXPECT_EQ(gpt.block(0).mlp->branch(randn({1, 1, 32}, {DType::f64})).bias.defined(), mode != 5 && mode != 6);
    }
    Tensor idx = randint(0, 50, {2, 8}, {DType::i64}, &g), targets = randint(0, 50, {2, 8}, {DType::i64}, &g);
    Tensor loss = GPT::loss(gpt(idx), targets);
    expect_same_loss_and_grads(gpt, loss, [&] { return plain_gpt_loss(gpt, idx, targets); });
  }
}

// Under bf16 autocast the blocks hand the f32 c_proj biases to add_layer_norm beside bf16
// branches (on the CPU the op runs as its parts, widened to f32): every parameter, those biases
// among them, gets an f32 gradient with no NaN or infinity.
TEST(GPT, Bf16AutocastGivesTheProjectionBiasesF32Gradients) {
  Generator g(6);
  GPT gpt(tiny_gpt(2), {}, &g);
  Tensor idx = randint(0, 50, {2, 8}, {DType::i64}, &g), targets = randint(0, 50, {2, 8}, {DType::i64}, &g);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    gpt.forward_loss(idx, targets).backward();
  }
  expect_finite_grads(gpt);
  for (auto& [name, p] : gpt.named_parameters()) EXPECT_EQ(p.grad().dtype(), DType::f32) << name;
  NoGradGuard ng;
  auto& last = gpt.block(1);
  EXPECT_TRUE(
      last.mlp->branch(randn({1, 1, 32})).bias.is_same(last.mlp->c_proj->bias));  // the bias goes with the branch
}

// forward_loss (linear_cross_entropy: no logits) against loss(forward(idx)): the same products
// and sums in other orders, so in f64 they agree to a few f64 roundings of the loss's scale.
TEST(GPT, ForwardLossMatchesLossOfLogits) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied head" : "untied head");
    Generator g(5);
    GPTConfig c = tiny_gpt(2);
    c.tied_head = tied;
    GPT gpt(c, {DType::f64}, &g);
    Tensor idx = randint(0, 50, {2, 8}, {DType::i64}, &g), targets = randint(0, 50, {2, 8}, {DType::i64}, &g);
    for (int64_t chunk_rows : {0, 5}) {  // one chunk; at most 5 rows a chunk (16 rows: 4 balanced chunks)
      SCOPED_TRACE(chunk_rows);
      gpt.recompute.head_chunk_rows = chunk_rows;
      Tensor loss = gpt.forward_loss(idx, targets);
      expect_same_loss_and_grads(gpt, loss, [&] { return GPT::loss(gpt(idx), targets); });
      for (auto& p : gpt.parameters()) p.set_grad(Tensor());
    }
  }
  GPT gpt(tiny_gpt(1), {DType::f64});
  EXPECT_THROW(gpt.forward_loss(zeros({2, 8}, {DType::i64}), zeros({2, 7}, {DType::i64})), ShapeError);
}

TEST(GPT, TinyForwardBackwardFinite) {
  Generator g(1);
  GPT gpt(tiny_gpt(), {}, &g);
  Tensor idx = randint(0, 50, {2, 8}, {DType::i64}, &g), targets = randint(0, 50, {2, 8}, {DType::i64}, &g);
  Tensor logits = gpt(idx);
  ASSERT_EQ(logits.sizes(), (Shape{2, 8, 50}));
  Tensor loss = GPT::loss(logits, targets);
  const double l = loss.item();
  EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(l, std::log(50.0), 0.5);  // small init: close to uniform over the vocabulary
  loss.backward();
  expect_finite_grads(gpt);
  // Untied: the head is its own [vocab, d] Parameter.
  GPTConfig c = tiny_gpt();
  c.tied_head = false;
  GPT untied(c, {}, &g);
  EXPECT_FALSE(untied.lm_head->weight.is_same(untied.wte->weight));
  EXPECT_EQ(untied.num_parameters(), gpt.num_parameters() + 50 * 32);
}

double std_of(const Tensor& t) {
  auto v = t.to_vector<double>();
  double s2 = 0;
  for (double x : v) s2 += x * x;
  return std::sqrt(s2 / v.size());
}

TEST(GPT, Gpt2Init) {
  Generator g(8);
  GPT gpt(tiny_gpt(2, 64, 500, 64), {}, &g);
  EXPECT_NEAR(std_of(gpt.wte->weight), 0.02, 0.001);
  EXPECT_NEAR(std_of(gpt.wpe->weight), 0.02, 0.002);
  auto* block = dynamic_cast<TransformerBlock*>((*gpt.h)[0].get());
  ASSERT_NE(block, nullptr);
  EXPECT_NEAR(std_of(block->attn->c_attn->weight), 0.02, 0.001);
  EXPECT_NEAR(std_of(block->mlp->c_proj->weight), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_EQ(std_of(block->attn->c_attn->bias), 0.0);
  EXPECT_EQ(std_of(block->ln_1->weight), 1.0);
}

TEST(GPT, BadInput) {
  GPT gpt(tiny_gpt());
  EXPECT_THROW(gpt(zeros({1, 9}, {DType::i64})), ValueError);  // longer than block_size
  EXPECT_THROW(gpt(zeros({8}, {DType::i64})), ShapeError);
  EXPECT_THROW(gpt(full({1, 4}, 50, {DType::i64})), IndexError);  // token id outside the vocabulary
  EXPECT_THROW(GPT::loss(randn({1, 4, 50}), zeros({1, 5}, {DType::i64})), ShapeError);
}

// The tied weight's gradient is the sum of what flows in through the embedding lookup and
// through the head, and it is checked against finite differences in f64.
TEST(GPT, TiedWeightGradientIsEmbeddingPlusHead) {
  Generator g(2);
  GPT gpt(tiny_gpt(1, 8, 11, 6), kF64, &g);
  Tensor idx = randint(0, 11, {2, 5}, {DType::i64}, &g), targets = randint(0, 11, {2, 5}, {DType::i64}, &g);
  const Tensor w = gpt.wte->weight;
  auto loss_with = [&](const Tensor& emb_w, const Tensor& head_w) {
    gpt.wte->weight = emb_w;
    gpt.lm_head->weight = head_w;
    Tensor l = GPT::loss(gpt(idx), targets);
    gpt.wte->weight = w;
    gpt.lm_head->weight = w;
    return l;
  };
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return loss_with(x[0], x[0]); }, {w}));

  gpt.zero_grad();
  loss_with(w, w).backward();
  Tensor tied = raw::clone(w.grad());
  gpt.zero_grad();
  loss_with(w, w.detach()).backward();  // embedding path only
  Tensor via_embedding = raw::clone(w.grad());
  gpt.zero_grad();
  loss_with(w.detach(), w).backward();  // head path only
  Tensor via_head = raw::clone(w.grad());
  auto t = tied.to_vector<double>(), e = via_embedding.to_vector<double>(), h = via_head.to_vector<double>();
  double emb_norm = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_NEAR(t[i], e[i] + h[i], 1e-12);
    emb_norm += std::abs(e[i]);
  }
  EXPECT_GT(emb_norm, 0.0);  // both contributions are really there
}

TEST(GPT, SgdUpdatesTiedWeightOnce) {
  Generator g(3);
  GPT gpt(tiny_gpt(1, 8, 11, 6), kF64, &g);
  Tensor idx = randint(0, 11, {2, 5}, {DType::i64}, &g), targets = randint(0, 11, {2, 5}, {DType::i64}, &g);
  optim::SGDOptions o;
  o.lr = 0.5;
  optim::SGD sgd(gpt.parameters(), o);
  GPT::loss(gpt(idx), targets).backward();
  Tensor before = raw::clone(gpt.wte->weight), grad = raw::clone(gpt.wte->weight.grad());
  sgd.step();
  Tensor expected = kernels::axpby(before, 1.0, grad, -0.5);  // w - lr * g, applied once
  auto a = gpt.wte->weight.to_vector<double>(), b = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-14);
  EXPECT_TRUE(gpt.lm_head->weight.is_same(gpt.wte->weight));  // still one tensor after the step
}

// The optimizer stepped inside backward (optim::StepInBackward, a bucket per parameter here)
// against step() after backward, over three AdamW steps of a GPT with its tied head and two
// checkpointed blocks (whose replays accumulate into the parameters from an inner backward):
// the same update kernel on the same gradients, so the parameters agree bit for bit.
TEST(GPT, StepInBackwardMatchesStepAfterBackward) {
  auto train = [](bool in_backward) {
    Generator g(6);
    GPT gpt(tiny_gpt(3), {DType::f32}, &g);
    gpt.recompute.block_mask = {true, false, true};
    optim::AdamWOptions o;
    o.lr = 1e-2;
    optim::AdamW opt(gpt.parameters(), o);
    std::unique_ptr<optim::StepInBackward> sib;
    if (in_backward) sib = std::make_unique<optim::StepInBackward>(opt, 1);
    for (int step = 0; step < 3; ++step) {
      Tensor idx = randint(0, 50, {2, 8}, {DType::i64}, &g), targets = randint(0, 50, {2, 8}, {DType::i64}, &g);
      opt.zero_grad();
      gpt.forward_loss(idx, targets).backward();
      if (sib) {
        for (auto& p : gpt.parameters()) EXPECT_FALSE(p.grad().defined());
        EXPECT_EQ(sib->buckets_stepped(), static_cast<int64_t>((step + 1) * gpt.parameters().size()));
      } else {
        opt.step();
      }
    }
    std::vector<std::vector<float>> out;
    for (auto& p : gpt.parameters()) out.push_back(p.to_vector<float>());
    return out;
  };
  const auto a = train(false), b = train(true);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "parameter " << i;
}

// ---------------- ViT ----------------

ViTConfig tiny_vit() { return {.image_size = 8, .patch_size = 4, .num_classes = 5, .dim = 16, .depth = 2, .heads = 2}; }

TEST(ViT, TinyForwardBackwardFinite) {
  Generator g(4);
  ViT vit(tiny_vit(), {}, &g);
  EXPECT_EQ(vit.num_patches, 4);
  Tensor x = randn({2, 3, 8, 8}, {}, &g);
  Tensor logits = vit(x);
  ASSERT_EQ(logits.sizes(), (Shape{2, 5}));
  Tensor loss = cross_entropy(logits, from_vector<int64_t>({1, 4}, {2}));
  EXPECT_TRUE(std::isfinite(loss.item()));
  loss.backward();
  expect_finite_grads(vit);
  EXPECT_THROW(vit(randn({2, 3, 9, 9})), ShapeError);
}

TEST(ViT, PatchLinearEqualsStridedConv) {
  Generator g(5);
  ViT vit(tiny_vit(), kF64, &g);
  Tensor x = randn({2, 3, 8, 8}, kF64, &g);
  Tensor tokens = (*vit.patch_embed)(vit.patchify(x));  // [2, 4, 16]
  Tensor w = vit.patch_embed->weight.reshape({16, 3, 4, 4});
  Tensor conv = conv2d(x, w, vit.patch_embed->bias, 4);  // [2, 16, 2, 2]
  Tensor ref = conv.flatten(2).transpose(1, 2);
  auto a = tokens.to_vector<double>(), b = ref.to_vector<double>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12);
}

// ---------------- CNNs ----------------

TEST(ResNet, Resnet18TinyInputForwardBackwardFinite) {
  Generator g(6);
  auto net = resnet18(10, {}, &g);
  Tensor x = randn({2, 3, 32, 32}, {}, &g);
  Tensor logits = (*net)(x);
  ASSERT_EQ(logits.sizes(), (Shape{2, 10}));
  Tensor loss = cross_entropy(logits, from_vector<int64_t>({3, 7}, {2}));
  EXPECT_TRUE(std::isfinite(loss.item()));
  loss.backward();
  expect_finite_grads(*net);
  // One 32x32 image in eval mode (running statistics; batch statistics of a 1x1 map are degenerate).
  net->eval();
  Tensor one = randn({1, 3, 32, 32}, {}, &g).requires_grad_(true);
  sum((*net)(one)).backward();
  EXPECT_FALSE(kernels::has_nonfinite(one.grad()));
}

TEST(ResNet, Resnet50TinyForward) {
  auto net = resnet50(10);
  net->eval();
  NoGradGuard ng;
  Tensor y = (*net)(randn({1, 3, 32, 32}));
  ASSERT_EQ(y.sizes(), (Shape{1, 10}));
  EXPECT_FALSE(kernels::has_nonfinite(y));
}

TEST(MobileNet, TinyForwardBackwardFinite) {
  Generator g(7);
  MobileNet net(10, 0.25, {}, &g);
  Tensor logits = net(randn({2, 3, 32, 32}, {}, &g));
  ASSERT_EQ(logits.sizes(), (Shape{2, 10}));
  Tensor loss = cross_entropy(logits, from_vector<int64_t>({0, 9}, {2}));
  EXPECT_TRUE(std::isfinite(loss.item()));
  loss.backward();
  expect_finite_grads(net);
}

TEST(GPT, CudaMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator g1(9), g2(9);
  GPT cpu(tiny_gpt(), {}, &g1), gpu(tiny_gpt(), {}, &g2);  // same seed: same weights
  gpu.to(Device::cuda(0));
  ASSERT_TRUE(gpu.lm_head->weight.is_same(gpu.wte->weight));  // still tied after the move
  Generator g(10);
  Tensor idx = randint(0, 50, {2, 8}, {DType::i64}, &g), targets = randint(0, 50, {2, 8}, {DType::i64}, &g);
  Tensor la = GPT::loss(cpu(idx), targets);
  Tensor lb = GPT::loss(gpu(idx.cuda()), targets.cuda());
  EXPECT_NEAR(lb.cpu().item(), la.item(), 1e-4);
  la.backward();
  lb.backward();
  auto a = cpu.wte->weight.grad().to_vector<double>(), b = gpu.wte->weight.grad().cpu().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], 1e-4) << i;
}

// forward_loss reads the token ids' bounds check with the loss's own (kernels/deferred_checks.h):
// a token outside the vocabulary still raises from forward_loss, naming the lookup and the value,
// on the CPU and on CUDA, and the device works on after it (the lookup skipped the bad row); a
// good batch after it trains as before.
// The CPU, and the first GPU where there is one.
std::vector<Device> cpu_and_cuda() {
  std::vector<Device> devices = {Device::cpu()};
  if (cuda::is_available()) devices.push_back(Device::cuda(0));
  return devices;
}

// After a raised error the model works on: a good batch gives a finite loss and a backward pass.
void expect_trains_after_error(GPT& gpt, const Tensor& ids, const Tensor& targets) {
  Tensor loss = gpt.forward_loss(ids, targets);
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item()));
}

TEST(GPT, ForwardLossRaisesForATokenOutsideTheVocabulary) {
  for (const Device& d : cpu_and_cuda()) {
    SCOPED_TRACE(d.str());
    Generator g(11);
    GPT gpt(tiny_gpt(), {DType::f32, d}, &g);
    std::vector<int64_t> ids(16, 3);
    ids[5] = 57;  // the vocabulary is 50
    const Tensor bad = from_vector<int64_t>(ids, {2, 8}).to(d), targets = zeros({2, 8}, {DType::i64, d});
    const std::string what = mg::testing::error_of<IndexError>([&] { gpt.forward_loss(bad, targets); });
    // The CPU's lookup names the embedding, CUDA's the index_select under it; both the value.
    EXPECT_NE(what.find(d.is_cuda() ? "index_select: index 57" : "embedding: index 57"), std::string::npos) << what;
    expect_trains_after_error(gpt, full({2, 8}, 3, {DType::i64, d}), targets);
  }
}

// A label outside the vocabulary raises from forward_loss, naming it, on both devices: on CUDA the
// head's label checks (one a chunk of rows, here four) are read once, after the loss
// (kernels::DeferredIndexChecks), and the bad label sits in the third chunk. The same model then
// trains on good labels.
TEST(GPT, ForwardLossRaisesForALabelOutsideTheVocabulary) {
  for (const Device& d : cpu_and_cuda()) {
    SCOPED_TRACE(d.str());
    Generator g(12);
    GPT gpt(tiny_gpt(), {DType::f32, d}, &g);
    gpt.recompute.head_chunk_rows = 4;
    const Tensor ids = full({2, 8}, 3, {DType::i64, d});
    std::vector<int64_t> labels(16, 1);
    labels[9] = 50;  // the vocabulary is 50
    const Tensor bad = from_vector<int64_t>(labels, {2, 8}).to(d);
    const std::string what = mg::testing::error_of<IndexError>([&] { gpt.forward_loss(ids, bad); });
    EXPECT_NE(what.find("target 50"), std::string::npos) << what;
    expect_trains_after_error(gpt, ids, full({2, 8}, 1, {DType::i64, d}));
  }
}

}  // namespace
}  // namespace mg::nn
