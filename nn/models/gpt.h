// A GPT-2 style decoder (nanoGPT's layout and parameter names): token + position
// embeddings, pre-norm causal blocks, a final LayerNorm and an lm head tied to wte.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/models/recompute_plan.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace mg::nn {

struct GPTConfig {
  int64_t vocab_size = 50304;  // GPT-2's 50257 padded up to a multiple of 64
  int64_t block_size = 1024;   // longest sequence (rows of the position embedding)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  bool bias = true;       // biases in the Linears and LayerNorms (GPT-2 has them)
  bool tied_head = true;  // lm_head.weight IS transformer.wte.weight (one Parameter)
};

// Model sizes by name, at GPT-2's padded vocabulary (50304) and context (1024):
//   gpt2 (124M: 12 layers, 768 wide, 12 heads), gpt2-medium (350M: 24, 1024, 16),
//   gpt2-large (774M: 36, 1280, 20), gpt2-xl (1.56B: 48, 1600, 25), and GPT-3's shapes
//   gpt-2.7b (32, 2560, 32) and gpt-6.7b (32, 4096, 32).
// Any other name is a ValueError listing these.
GPTConfig gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();
// The number of parameters GPT(cfg) holds (a tied head counted once), without building it:
// V d + T d + L (12 d^2 + 13 d) + 2 d with biases.
int64_t gpt_num_params(const GPTConfig& cfg);
// Training FLOPs per token at sequence length T, llm.c's count: 6 N (forward and backward of
// every weight) + 6 L C T (the attention scores and their weighted sum, forward and backward).
double gpt_flops_per_token(const GPTConfig& cfg, int64_t T);
// The dense f16/bf16 tensor-core peak of the card named `device_name` (a CUDA device's name): 989
// TFLOP/s for the H100 and H200 SXM, 0 for a card this table does not know.
double dense_half_peak_flops(const std::string& device_name);
// Model FLOPs utilization: `tokens_per_s` times gpt_flops_per_token, over `peak_flops`.
double gpt_mfu(const GPTConfig& cfg, int64_t T, double tokens_per_s, double peak_flops);

class GPT : public Module {
 public:
  // GPT-2's init: every Linear and Embedding weight ~ N(0, 0.02), biases 0, and the residual
  // projections (attn.c_proj, mlp.c_proj) ~ N(0, 0.02 / sqrt(2 * n_layer)). init_weights =
  // false skips that pass (the layers keep their own default init): for counting parameters
  // or before loading a checkpoint, it saves ~124M normal draws on GPT-2 small.
  explicit GPT(const GPTConfig& config, TensorOptions opts = {}, Generator* gen = nullptr, bool init_weights = true);

  // idx: i64 token ids [B, T] with T <= block_size -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& idx) override;
  // The mean next-token loss of idx against targets (both [B, T]): loss(forward(idx), targets)
  // without the [B, T, vocab_size] logits or their gradient (linear_cross_entropy): the
  // training step's form. At GPT-2's vocabulary that is 2 * B * T * 50304 * 2 bytes less at
  // the peak under bf16 autocast (1.6 GB at B = 8, T = 1024). Rows of logits are made
  // recompute.head_chunk_rows at a time.
  Tensor forward_loss(const Tensor& idx, const Tensor& targets, int64_t ignore_index = -100);
  // Inference with a key-value cache (under no_grad, dropout off): idx [B, Tn] are the tokens at
  // positions cache.length .. cache.length + Tn - 1; returns their logits [B, Tn, vocab_size] and
  // advances cache.length by Tn. A prompt goes in whole, then one token per call; several new
  // tokens after cached ones are run one at a time. Equals forward() on the whole sequence.
  Tensor forward_cached(const Tensor& idx, KVCache& cache);
  // A cache for up to block_size positions.
  KVCache make_cache() const { return KVCache(config.n_layer, config.block_size); }
  // Mean next-token cross-entropy of logits [B, T, V] against targets [B, T] (the inputs
  // shifted by one); positions whose target is ignore_index do not count.
  static Tensor loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

  const GPTConfig config;
  GPTRecompute recompute;               // read by forward(); off by default (nn/models/recompute_plan.h)
  std::shared_ptr<Module> transformer;  // wte, wpe, drop, h, ln_f (nanoGPT's ModuleDict)
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> h;  // n_layer TransformerBlocks
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;  // no bias; its weight is wte's when tied
  TransformerBlock& block(int64_t i) { return static_cast<TransformerBlock&>(*(*h)[i]); }

 private:
  Tensor embed(const Tensor& idx, int64_t start);  // wte(idx) + wpe(start ..), dropout
  Tensor hidden(const Tensor& idx);                // the blocks and ln_f: lm_head's input
};

// The units a GPT's parameters split into where they live elsewhere between uses (ZeRO-3
// shards, host memory: autograd/param_units.h): unit 0 the root (wte, wpe, ln_f, an untied
// head), unit i + 1 block i's. Give the ParamUnits made of them to model.recompute.units.
std::vector<std::vector<Tensor>> gpt_param_units(GPT& model);
// Every Linear weight and bias of the GPT's blocks from `first_block` on (0: all of them): the
// parameters the blocks read only through autocast's casts (the embeddings, the norms and the
// tied head read f32). A ValueError names a first_block outside [0, n_layer].
std::vector<Tensor> gpt_linear_params(GPT& model, int64_t first_block = 0);
// ParamUnitsOptions::dtype for bf16 (or f16) autocast: the blocks' Linear weights and biases in
// `compute` (what autocast casts them to, so the step is the same), every other parameter in
// its own dtype (the layer norms and embeddings read f32).
std::function<DType(const Tensor&)> gpt_unit_dtype(GPT& model, DType compute);

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // <= 0: greedy (argmax)
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens only
};

// Continues `prompt` (token ids, non-empty) by sampling max_new_tokens tokens one at a time from
// the model's next-token distribution (softmax(logits / temperature), top-k filtered) with
// `gen`, through the key-value cache. When the cache is full the last block_size / 2 tokens are
// fed again as a fresh prompt (the context slides). Returns the new tokens only. Runs in eval
// mode under no_grad and restores the model's training flag.
std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                              Generator* gen = nullptr);

}  // namespace mg::nn
