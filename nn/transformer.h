// Transformer layers as Modules (torch.nn.LayerNorm, Embedding), causal self-attention with a
// fused qkv projection, the MLP, and the pre-norm GPT-2 block built from them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "autograd/residual.h"
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
  using Module::operator();
  // The norm of a residual stream, left for the layer that reads it (mg::Normed): a pending add
  // runs inside it (mg::layer_norm(Residual)), under autocast the output comes in the autocast
  // dtype, and under the FP8 recipe the linear after it runs it, its output cast to FP8 in its pass.
  Normed operator()(const Residual& x);
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

// Self-attention over x [B, T, C]: one Linear makes q, k and v together (c_attn, C -> 3C),
// heads of C / num_heads attend through mg::attention_packed_qkv (straight from c_attn's
// output, no head split/merge copies on CUDA), c_proj mixes them back. Dropout on the attention weights and on the
// output, in training mode only.
class MultiheadSelfAttention : public Module {
 public:
  MultiheadSelfAttention(int64_t embed_dim, int64_t num_heads, bool causal = false, double dropout = 0.0,
                         bool bias = true, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // forward(x) as a residual branch: c_proj's bias and the output dropout left to the stream.
  Branch branch(const Tensor& x);
  Branch branch(const Normed& x);  // of a pending norm, which c_attn runs (Linear(Normed))
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
  template <class X>
  Tensor attend(const X& x);  // the heads' output [B, T, C], before c_proj
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

// c_fc (C -> 4C), GELU, c_proj (4C -> C), dropout. With GPT-2's GELU ("tanh") the three layers
// run as one node, mg::gelu_mlp (the GELU inside the GEMMs' epilogues).
class MLP : public Module {
 public:
  MLP(const TransformerBlockOptions& o, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // forward(x) as a residual branch: the dropout, and c_proj's bias where Linear::leaves_bias
  // says so, left to the stream.
  Branch branch(const Tensor& x, bool bias_pending = true);
  Branch branch(const Normed& x, bool bias_pending = true);  // of a pending norm, which c_fc runs
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Dropout> dropout;

 private:
  template <class X>
  Branch branch_of(const X& x, bool bias_pending);
  template <class X>
  Tensor fused(const X& x, bool with_bias);  // the gelu_mlp node, without the dropout
};

// Pre-norm residual block (GPT-2): x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). On a residual
// stream (mg::Residual) each add is left for the next layer norm, which runs it in its kernel.
class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockOptions& o, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // output(x) without the pre-hooks
  Residual forward(Residual x);
  using Module::operator();
  Residual operator()(const Residual& x);  // forward(x) after the pre-hooks
  // The block when no layer norm reads its output next (a checkpoint region's edge, a model
  // without a final norm): the MLP's bias stays in its GEMM and the last add runs here, once.
  // Runs the pre-hooks.
  Tensor output(const Residual& x);
  Tensor forward_cached(const Tensor& x, KVCache& cache, size_t layer);
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<MultiheadSelfAttention> attn;
  std::shared_ptr<MLP> mlp;

 private:
  Tensor forward_output(Residual x);
};

}  // namespace mg::nn
