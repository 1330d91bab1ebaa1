#include "nn/transformer.h"

#include <sstream>

#include "autograd/functions.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
Tensor make_param(const Shape& shape, TensorOptions opts) {
  MemoryCategoryGuard g(MemoryCategory::Parameters);
  return empty(shape, {opts.dtype, opts.device});
}

std::string shape_or_undefined(const Tensor& x) { return x.defined() ? shape_str(x.sizes()) : "(undefined)"; }
}  // namespace

// ---------------- LayerNorm ----------------

LayerNorm::LayerNorm(int64_t dim, double eps, bool elementwise_affine, bool bias, TensorOptions opts)
    : LayerNorm(Shape{dim}, eps, elementwise_affine, bias, opts) {}

LayerNorm::LayerNorm(Shape ns, double eps, bool affine, bool with_bias, TensorOptions opts)
    : Module("LayerNorm"),
      normalized_shape(std::move(ns)),
      eps(eps),
      weight(register_parameter("weight", affine ? make_param(normalized_shape, opts) : Tensor())),
      bias(register_parameter("bias", affine && with_bias ? make_param(normalized_shape, opts) : Tensor())) {
  MG_CHECK(!normalized_shape.empty(), ValueError, "LayerNorm: normalized_shape must not be empty");
  for (int64_t d : normalized_shape)
    MG_CHECK(d > 0, ValueError, "LayerNorm: normalized_shape ", shape_str(normalized_shape), " must be positive");
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& x) { return mg::layer_norm(x, normalized_shape, weight, bias, eps); }

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << shape_str(normalized_shape) << ", eps=" << eps
     << ", elementwise_affine=" << (weight.defined() ? "true" : "false");
  return os.str();
}

// ---------------- Embedding ----------------

Embedding::Embedding(int64_t n, int64_t dim, TensorOptions opts, Generator* gen)
    : Module("Embedding"),
      num_embeddings(n),
      embedding_dim(dim),
      weight(register_parameter("weight", make_param({n > 0 ? n : 0, dim > 0 ? dim : 0}, opts))) {
  MG_CHECK(n > 0 && dim > 0, ValueError, "Embedding: num_embeddings and embedding_dim must be positive, got ", n,
           " and ", dim);
  reset_parameters(gen);
}

void Embedding::reset_parameters(Generator* gen) { init::normal_(weight, 0.0, 1.0, gen); }

Tensor Embedding::forward(const Tensor& indices) { return mg::embedding(weight, indices); }

std::string Embedding::extra_repr() const {
  std::ostringstream os;
  os << num_embeddings << ", " << embedding_dim;
  return os.str();
}

// ---------------- activations ----------------

GELU::GELU(std::string approximate) : Module("GELU"), approximate(std::move(approximate)) {
  MG_CHECK(this->approximate == "none" || this->approximate == "tanh", ValueError,
           "GELU: approximate must be \"none\" or \"tanh\", got \"", this->approximate, "\"");
}

Tensor GELU::forward(const Tensor& x) { return mg::gelu(x, approximate == "tanh"); }

Tensor SiLU::forward(const Tensor& x) { return mg::silu(x); }

// ---------------- attention ----------------

MultiheadSelfAttention::MultiheadSelfAttention(int64_t embed_dim, int64_t num_heads, bool causal, double dropout,
                                               bool bias, TensorOptions opts, Generator* gen)
    : Module("MultiheadSelfAttention"), embed_dim(embed_dim), num_heads(num_heads), causal(causal), dropout(dropout) {
  MG_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0, ValueError,
           "MultiheadSelfAttention: embed_dim (", embed_dim, ") must be a positive multiple of num_heads (", num_heads,
           ")");
  c_attn = register_module("c_attn", std::make_shared<Linear>(embed_dim, 3 * embed_dim, bias, opts, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(embed_dim, embed_dim, bias, opts, gen));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(dropout));
}

Tensor MultiheadSelfAttention::forward(const Tensor& x) {
  MG_CHECK(x.defined() && x.dim() == 3 && x.size(2) == embed_dim, ShapeError,
           "MultiheadSelfAttention(embed_dim=", embed_dim, "): expected input [B, T, ", embed_dim, "], got ",
           shape_or_undefined(x));
  Tensor qkv = (*c_attn)(x);  // [B, T, 3C]
  // On CUDA the flash kernels read the heads straight out of qkv and write y as [B, T, C]: no
  // head split, merge or gradient concatenation copies (216 strided copies a GPT-2 step before).
  Tensor y = attention_packed_qkv(qkv, num_heads, causal, is_training() ? dropout : 0.0);
  return (*resid_dropout)((*c_proj)(y));
}

std::string MultiheadSelfAttention::extra_repr() const {
  std::ostringstream os;
  os << "embed_dim=" << embed_dim << ", num_heads=" << num_heads << ", causal=" << (causal ? "true" : "false")
     << ", dropout=" << dropout;
  return os.str();
}

// ---------------- MLP and block ----------------

MLP::MLP(const TransformerBlockOptions& o, TensorOptions opts, Generator* gen) : Module("MLP") {
  MG_CHECK(o.mlp_ratio > 0, ValueError, "MLP: mlp_ratio must be positive, got ", o.mlp_ratio);
  c_fc = register_module("c_fc", std::make_shared<Linear>(o.n_embd, o.mlp_ratio * o.n_embd, o.bias, opts, gen));
  gelu = register_module("gelu", std::make_shared<GELU>(o.gelu_approximate));
  c_proj = register_module("c_proj", std::make_shared<Linear>(o.mlp_ratio * o.n_embd, o.n_embd, o.bias, opts, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
}

Tensor MLP::forward(const Tensor& x) { return (*dropout)((*c_proj)((*gelu)((*c_fc)(x)))); }

TransformerBlock::TransformerBlock(const TransformerBlockOptions& o, TensorOptions opts, Generator* gen)
    : Module("TransformerBlock") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(o.n_embd, o.ln_eps, true, o.bias, opts));
  attn = register_module(
      "attn", std::make_shared<MultiheadSelfAttention>(o.n_embd, o.n_head, o.causal, o.dropout, o.bias, opts, gen));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(o.n_embd, o.ln_eps, true, o.bias, opts));
  mlp = register_module("mlp", std::make_shared<MLP>(o, opts, gen));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = add(x, (*attn)((*ln_1)(x)));
  return add(h, (*mlp)((*ln_2)(h)));
}

}  // namespace mg::nn
