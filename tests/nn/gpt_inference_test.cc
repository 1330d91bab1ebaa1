// GPT inference: the key-value cache gives the full forward's logits, generate() samples
// through it, and Hugging Face GPT-2 files (Conv1D weights [in, out]) load onto nn::GPT.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "serialize/serialize.h"
#include "core/random.h"
#include "nn/models/gpt.h"
#include "nn/models/gpt_pretrained.h"

namespace mg::nn {
namespace {

GPTConfig tiny_config() {
  // n_embd 16: c_attn 16 -> 48 and c_fc 16 -> 64 are not square; c_proj 16 -> 16 is.
  return {.vocab_size = 50, .block_size = 12, .n_layer = 2, .n_head = 2, .n_embd = 16};
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  const auto x = a.to(DType::f32).cpu().contiguous().to_vector<float>();
  const auto y = b.to(DType::f32).cpu().contiguous().to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(double(x[i]) - y[i]));
  return m;
}

// f32 logits of size ~1 summed over at most 64 products in a different order on each path:
// the paths differ by a few ulps of the inputs times sqrt(64), well under 2e-5.
constexpr double kF32Tol = 2e-5;

Tensor tokens(const std::vector<int64_t>& ids, int64_t b) {
  return from_vector(ids, {b, static_cast<int64_t>(ids.size()) / b});
}

TEST(GPTKVCache, PromptThenOneTokenAtATimeGivesTheFullForwardsLogits) {
  Generator gen(7);
  GPT model(tiny_config(), {}, &gen);
  model.eval();
  NoGradGuard ng;
  const Tensor idx = tokens({3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 49, 0, 1, 2, 33, 44, 20, 11, 19, 6}, 2);  // [2, 10]
  const Tensor full = model.forward(idx);
  KVCache cache = model.make_cache();
  std::vector<Tensor> parts = {model.forward_cached(idx.narrow(1, 0, 4), cache)};  // the prompt at once
  for (int64_t t = 4; t < 10; ++t) parts.push_back(model.forward_cached(idx.narrow(1, t, 1), cache));
  EXPECT_EQ(cache.length, 10);
  EXPECT_LT(max_abs_diff(cat(parts, 1), full), kF32Tol);
  // Several new tokens after cached ones run one at a time (the causal mask stays right).
  KVCache again = model.make_cache();
  Tensor head = model.forward_cached(idx.narrow(1, 0, 3), again);
  Tensor rest = model.forward_cached(idx.narrow(1, 3, 7), again);
  EXPECT_LT(max_abs_diff(cat({head, rest}, 1), full), kF32Tol);
}

TEST(GPTKVCache, OverfillingTheCacheIsAValueError) {
  GPT model(tiny_config());
  KVCache cache = model.make_cache();
  model.forward_cached(zeros({1, 12}, {DType::i64}), cache);
  EXPECT_THROW(model.forward_cached(zeros({1, 1}, {DType::i64}), cache), ValueError);
  KVCache small(1, 4);  // made for another model
  EXPECT_THROW(model.forward_cached(zeros({1, 1}, {DType::i64}), small), ValueError);
}

TEST(GPTGenerate, GreedyEqualsArgmaxOfTheFullForwardAndSlidesPastBlockSize) {
  Generator gen(3);
  GPT model(tiny_config(), {}, &gen);
  model.train();
  GenerateOptions o;
  o.max_new_tokens = 20;  // past block_size 12: the context slides
  o.temperature = 0;
  const std::vector<int64_t> prompt = {1, 2, 3};
  const std::vector<int64_t> out = generate(model, prompt, o);
  EXPECT_TRUE(model.is_training());  // restored
  ASSERT_EQ(out.size(), 20u);
  // The reference: a full forward over the same context the cache held for each new token.
  model.eval();
  NoGradGuard ng;
  std::vector<int64_t> seq = prompt;
  int64_t ctx_start = 0, block = tiny_config().block_size;
  for (size_t i = 0; i < out.size(); ++i) {
    if (static_cast<int64_t>(seq.size()) - ctx_start > block) ctx_start = seq.size() - block / 2;
    std::vector<int64_t> ctx(seq.begin() + ctx_start, seq.end());
    Tensor logits = model.forward(tokens(ctx, 1)).select(1, static_cast<int64_t>(ctx.size()) - 1);
    EXPECT_EQ(argmax(logits, 1).item<int64_t>(), out[i]) << "token " << i;
    seq.push_back(out[i]);
  }
}

TEST(GPTGenerate, TopKOneIsGreedyAndSamplesStayInTheVocabulary) {
  Generator gen(5);
  GPT model(tiny_config(), {}, &gen);
  GenerateOptions greedy;
  greedy.max_new_tokens = 8;
  greedy.temperature = 0;
  GenerateOptions top1 = greedy;
  top1.temperature = 1.5;
  top1.top_k = 1;
  EXPECT_EQ(generate(model, {4}, top1, &gen), generate(model, {4}, greedy));
  GenerateOptions sample;
  sample.max_new_tokens = 30;
  sample.top_k = 5;
  for (int64_t t : generate(model, {4}, sample, &gen)) EXPECT_TRUE(t >= 0 && t < 50);
  EXPECT_THROW(generate(model, {}, sample), ValueError);
}

// ---------------- Hugging Face GPT-2 layout ----------------

// A GPT-2 checkpoint as Hugging Face writes it, built by hand: Conv1D weights [in, out].
StateDict synthetic_hf(const GPTConfig& c, Generator& gen, const std::string& prefix = "") {
  StateDict sd;
  auto put = [&](const std::string& name, const Shape& shape, double std) {
    sd.tensors[prefix + name] = normal(shape, 0.0, std, {}, &gen);
  };
  const int64_t C = c.n_embd;
  put("wte.weight", {c.vocab_size, C}, 0.5);
  put("wpe.weight", {c.block_size, C}, 0.5);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      sd.tensors[prefix + h + ln + ".weight"] = add(normal({C}, 0.0, 0.1, {}, &gen), 1.0);
      put(h + ln + ".bias", {C}, 0.1);
    }
    put(h + "attn.c_attn.weight", {C, 3 * C}, 0.3);
    put(h + "attn.c_attn.bias", {3 * C}, 0.1);
    put(h + "attn.c_proj.weight", {C, C}, 0.3);
    put(h + "attn.c_proj.bias", {C}, 0.1);
    put(h + "mlp.c_fc.weight", {C, 4 * C}, 0.3);
    put(h + "mlp.c_fc.bias", {4 * C}, 0.1);
    put(h + "mlp.c_proj.weight", {4 * C, C}, 0.2);
    put(h + "mlp.c_proj.bias", {C}, 0.1);
  }
  sd.tensors[prefix + "ln_f.weight"] = add(normal({C}, 0.0, 0.1, {}, &gen), 1.0);
  put("ln_f.bias", {C}, 0.1);
  return sd;
}

// GPT-2's forward written straight from the Hugging Face tensors (x @ W + b with W [in, out]).
Tensor hand_forward(const StateDict& hf, const GPTConfig& c, const Tensor& idx) {
  auto w = [&](const std::string& n) { return hf.tensors.at(n); };
  auto conv1d = [&](const Tensor& x, const std::string& n) { return add(matmul(x, w(n + ".weight")), w(n + ".bias")); };
  auto ln = [&](const Tensor& x, const std::string& n) {
    return layer_norm(x, {c.n_embd}, w(n + ".weight"), w(n + ".bias"), 1e-5);
  };
  const int64_t B = idx.size(0), T = idx.size(1), C = c.n_embd, H = c.n_head, D = C / H;
  Tensor x = add(embedding(w("wte.weight"), idx), embedding(w("wpe.weight"), arange(T)));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    Tensor qkv = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn");
    auto heads = [&](int64_t i) { return qkv.narrow(2, i * C, C).reshape({B, T, H, D}).transpose(1, 2); };
    Tensor y = scaled_dot_product_attention(heads(0), heads(1), heads(2), /*causal=*/true);
    x = add(x, conv1d(y.transpose(1, 2).reshape({B, T, C}), h + "attn.c_proj"));
    Tensor m = gelu(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc"), /*tanh_approx=*/true);
    x = add(x, conv1d(m, h + "mlp.c_proj"));
  }
  return matmul(ln(x, "ln_f"), w("wte.weight").t());  // lm_head tied to wte
}

std::string tmp_path(const std::string& name) {
  const char* d = std::getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

TEST(HFGPT2, SyntheticFileLoadsToTheLogitsOfTheSameWeightsByHand) {
  GPTConfig c = tiny_config();
  c.n_head = 4;  // head dim 4: n_head is not in the file, it is passed
  Generator gen(11);
  const StateDict hf = synthetic_hf(c, gen);
  const std::string path = tmp_path("hf_gpt2.safetensors");
  serialize::save(hf, path);
  auto model = gpt2_from_hf_safetensors(path, {}, /*n_head=*/4);
  EXPECT_EQ(model->config.vocab_size, 50);
  EXPECT_EQ(model->config.block_size, 12);
  EXPECT_EQ(model->config.n_layer, 2);
  EXPECT_EQ(model->config.n_embd, 16);
  // The Conv1D transposition: nn::Linear keeps [out, in].
  auto* block = static_cast<TransformerBlock*>(model->h->children()[1].get());
  EXPECT_EQ(max_abs_diff(block->attn->c_proj->weight, hf.tensors.at("h.1.attn.c_proj.weight").t()), 0.0);
  EXPECT_TRUE(model->lm_head->weight.is_same(model->wte->weight));
  model->eval();
  NoGradGuard ng;
  const Tensor idx = tokens({1, 7, 49, 3, 3, 0, 12, 30, 8, 2, 41, 5}, 2);
  const Tensor expect = hand_forward(hf, c, idx);
  EXPECT_LT(max_abs_diff(model->forward(idx), expect), kF32Tol * 10);  // logits here reach ~20
  // And written back out, the same tensors.
  const StateDict back = hf_gpt2_state_dict(*model);
  ASSERT_EQ(back.tensors.size(), hf.tensors.size());
  for (const auto& [name, t] : hf.tensors) EXPECT_EQ(max_abs_diff(back.tensors.at(name), t), 0.0) << name;
}

TEST(HFGPT2, AcceptsThePrefixTheTiedHeadAndMaskBuffers) {
  const GPTConfig c = tiny_config();
  Generator gen(2);
  StateDict hf = synthetic_hf(c, gen, "transformer.");
  hf.tensors["lm_head.weight"] = hf.tensors.at("transformer.wte.weight");
  hf.tensors["transformer.h.0.attn.bias"] = ones({1, 1, 12, 12});
  hf.tensors["transformer.h.1.attn.masked_bias"] = scalar_tensor(-1e4);
  EXPECT_EQ(hf_gpt2_config(hf).n_layer, 2);
  EXPECT_EQ(hf_gpt2_config(hf).n_head, 1);  // 16 / 64 rounds to at least one head
  GPT model(c);
  load_hf_gpt2(model, hf);
  EXPECT_EQ(max_abs_diff(model.wpe->weight, hf.tensors.at("transformer.wpe.weight")), 0.0);
}

TEST(HFGPT2, WrongShapesMissingAndUnknownTensorsAreValueErrors) {
  const GPTConfig c = tiny_config();
  Generator gen(4);
  GPT model(c);
  const Tensor before = model.wte->weight.clone();
  StateDict hf = synthetic_hf(c, gen);
  // A Linear-layout ([out, in]) c_attn: the error names it and the Conv1D shape it needs.
  StateDict wrong = hf;
  wrong.tensors["h.0.attn.c_attn.weight"] = zeros({48, 16});
  try {
    load_hf_gpt2(model, wrong);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.attn.c_attn.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[16, 48]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(max_abs_diff(model.wte->weight, before), 0.0);  // unchanged after the error
  StateDict missing = hf;
  missing.tensors.erase("h.1.mlp.c_fc.bias");
  EXPECT_THROW(load_hf_gpt2(model, missing), ValueError);
  StateDict extra = hf;
  extra.tensors["h.2.ln_1.weight"] = ones({16});  // a third layer the model lacks
  EXPECT_THROW(load_hf_gpt2(model, extra), ValueError);
  EXPECT_THROW(hf_gpt2_config(StateDict{}), ValueError);
}

}  // namespace
}  // namespace mg::nn
