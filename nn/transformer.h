// Transformer layers as Modules (torch.nn.LayerNorm, Embedding, GELU, SiLU), causal
// self-attention with a fused qkv projection, and the pre-norm GPT-2 block built from them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace mg::nn {

// Normalizes over the trailing dims normalized_shape; weight = 1, bias = 0 at init.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
                     TensorOptions opts = {});
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
                     TensorOptions opts = {});
  Tensor forward(const Tensor& x) override;
  // The pre-LN residual step: (h, ln(h)) with h = x + residual (residual may be undefined: h is
  // x), through add_layer_norm. Under autocast ln(h) comes out in the autocast dtype, for the
  // linear that reads it. Runs the forward pre-hooks like operator().
  // residual_bias: see mg::add_layer_norm (a branch's bias added with the branch).
  std::pair<Tensor, Tensor> forward_residual(const Tensor& x, const Tensor& residual,
                                             const Tensor& residual_bias = Tensor());
  void reset_parameters();
  std::string extra_repr() const override;

  const Shape normalized_shape;
  const double eps;
  Tensor& weight;  // normalized_shape, undefined without elementwise_affine
  Tensor& bias;    // normalized_shape, undefined without elementwise_affine or bias
};

// A lookup table [num_embeddings, embedding_dim], initialised N(0, 1) like PyTorch. forward
// takes integer indices of any shape and returns [*indices.shape, embedding_dim].
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& indices) override;
  void reset_parameters(Generator* gen = nullptr);
  std::string extra_repr() const override;

  const int64_t num_embeddings, embedding_dim;
  Tensor& weight;  // bound to the registry: assign to tie it with another module's weight
};

// approximate: "none" (erf, exact) or "tanh" (GPT-2's approximation).
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "approximate=" + approximate; }
  const std::string approximate;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

// Keys and values of the positions seen so far, one [B, num_heads, capacity, head_dim] pair per
// layer, for decoding one token at a time (GPT::forward_cached). Each layer's pair is allocated at
// its first use with the dtype and device of that layer's projections; `length` positions are filled.
struct KVCache {
  explicit KVCache(int64_t n_layer, int64_t capacity) : k(n_layer), v(n_layer), capacity(capacity) {}
  std::vector<Tensor> k, v;
  int64_t capacity;
  int64_t length = 0;
  void clear() { length = 0; }
};

// A branch's output whose add into the residual stream is left to the next layer norm
// (mg::add_layer_norm), with the bias of the Linear that made it when that Linear left its bias
// out (undefined otherwise): the stream's next value is (x + out) + bias. With dropout > 0 (a
// training-mode dropout after the Linear) the next value is x + dropout(out + bias): one
// bias_dropout_add kernel, done by the block itself, never left to the next one.
struct PendingBranch {
  Tensor out, bias;
  double dropout = 0.0;
  // The stream's next value, the add done here (x alone when out is undefined).
  Tensor added_to(const Tensor& x) const;
};

// Self-attention over x [B, T, C]: one Linear makes q, k and v together (c_attn, C -> 3C),
// heads of C / num_heads attend through mg::attention_packed_qkv (straight from c_attn's
// output, no head split/merge copies on CUDA), c_proj mixes them back. Dropout on the attention weights and on the
// output, in training mode only.
class MultiheadSelfAttention : public Module {
 public:
  MultiheadSelfAttention(int64_t embed_dim, int64_t num_heads, bool causal = false, double dropout = 0.0,
                         bool bias = true, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // forward(x) with c_proj's bias left for the residual add (PendingBranch) where nothing comes
  // between them: c_proj has a bias and the output dropout is off (p = 0 or eval mode). With
  // the dropout on, c_proj's output without its bias, the bias and p: the caller runs the bias,
  // the dropout and the residual add as one bias_dropout_add.
  PendingBranch forward_branch(const Tensor& x);
  // The bias forward_branch leaves out now, or an undefined tensor.
  Tensor pending_bias() const;
  // Inference on the next x.size(1) positions after cache.length: their keys and values are
  // written into layer `layer` of the cache and the queries attend to every cached position.
  // Causal (the model's mask) needs cache.length == 0 or one new position (no dropout either way).
  Tensor forward_cached(const Tensor& x, KVCache& cache, size_t layer);
  std::string extra_repr() const override;

  const int64_t embed_dim, num_heads;
  const bool causal;
  const double dropout;
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;

 private:
  Tensor attend(const Tensor& x);  // the heads' output [B, T, C], before c_proj
};

struct TransformerBlockOptions {
  int64_t n_embd = 768;
  int64_t n_head = 12;
  bool causal = true;
  double dropout = 0.0;
  bool bias = true;                       // in the Linears and the LayerNorms
  std::string gelu_approximate = "tanh";  // "tanh" (GPT-2) or "none" (ViT)
  double ln_eps = 1e-5;
  int64_t mlp_ratio = 4;  // hidden width = mlp_ratio * n_embd
};

// c_fc (C -> 4C), GELU, c_proj (4C -> C), dropout.
class MLP : public Module {
 public:
  MLP(const TransformerBlockOptions& o, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // forward(x) with c_proj's bias left for the residual add (PendingBranch) where the MLP is the
  // fused gelu_mlp node (GELU "tanh") with a c_proj bias, the dropout off and the bias not a
  // derived parameter: the bias leaves the block (into the next one, perhaps across a checkpoint
  // region's edge), so it must be the parameter itself. A derived bias (pruning's bias_orig *
  // mask, made by c_proj's pre-hook) would be made inside a checkpointed block's forward without
  // grad, and reach the next norm with no history: it stays in the GEMM. (A pruned weight does
  // not stop the fold.) With the dropout on (training, p > 0): c_proj's output without its
  // bias, the bias and p, for one bias_dropout_add in the block.
  PendingBranch forward_branch(const Tensor& x);
  // The bias forward_branch leaves out now, or an undefined tensor.
  Tensor pending_bias() const;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Dropout> dropout;

 private:
  Tensor fused(const Tensor& x, bool with_bias);  // the gelu_mlp node, without the dropout
};

// Pre-norm residual block (GPT-2): x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockOptions& o, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // The block with the residual stream's last add left open: given x and the previous block's
  // pending branch (empty for the first block), returns (h, m) where this block's output is
  // m.added_to(h). A stack of blocks passes (h, m) on, so each add, with the c_proj bias before
  // it, is fused into the next layer norm (add_layer_norm) and never runs on its own. With
  // mlp_bias_pending false the MLP adds its bias in its GEMM (m.bias undefined), for a caller
  // that adds m at once: forward(x) is forward_pending(x, {}, false) with the add done.
  std::pair<Tensor, PendingBranch> forward_pending(const Tensor& x, const PendingBranch& pending,
                                                   bool mlp_bias_pending = true);
  Tensor forward_cached(const Tensor& x, KVCache& cache, size_t layer);
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<MultiheadSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

}  // namespace mg::nn
