#include "nn/transformer.h"

#include <sstream>

#include "autograd/functions.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
std::string shape_or_undefined(const Tensor& x) { return x.defined() ? shape_str(x.sizes()) : "(undefined)"; }
std::string shape_or_undefined(const Normed& x) { return shape_str(x.sizes()); }
// The shape of a layer's input, a tensor or a pending norm's output, without running the norm.
const Shape* shape_of(const Tensor& x) { return x.defined() ? &x.sizes() : nullptr; }
const Shape* shape_of(const Normed& x) { return &x.sizes(); }
}  // namespace

// ---------------- LayerNorm ----------------

LayerNorm::LayerNorm(int64_t dim, double eps, bool elementwise_affine, bool bias, TensorOptions opts)
    : LayerNorm(Shape{dim}, eps, elementwise_affine, bias, opts) {}

LayerNorm::LayerNorm(Shape ns, double eps, bool affine, bool with_bias, TensorOptions opts)
    : Module("LayerNorm"),
      normalized_shape(std::move(ns)),
      eps(eps),
      weight(register_parameter("weight", affine ? init::empty_parameter(normalized_shape, opts) : Tensor())),
      bias(register_parameter("bias", affine && with_bias ? init::empty_parameter(normalized_shape, opts) : Tensor())) {
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

Normed LayerNorm::operator()(const Residual& x) {
  run_forward_pre_hooks();
  return Normed(x, normalized_shape, weight, bias, eps);
}

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
      weight(register_parameter("weight", init::empty_parameter({n > 0 ? n : 0, dim > 0 ? dim : 0}, opts))) {
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

template <class X>
Tensor MultiheadSelfAttention::attend(const X& x) {
  const Shape* s = shape_of(x);
  MG_CHECK(s && s->size() == 3 && (*s)[2] == embed_dim, ShapeError, "MultiheadSelfAttention(embed_dim=", embed_dim,
           "): expected input [B, T, ", embed_dim, "], got ", shape_or_undefined(x));
  Tensor qkv = (*c_attn)(x);  // [B, T, 3C]
  // On CUDA the flash kernels read the heads straight out of qkv and write y as [B, T, C]: no
  // head split, merge or gradient concatenation copies (216 strided copies a GPT-2 step before).
  return attention_packed_qkv(qkv, num_heads, causal, is_training() ? dropout : 0.0);
}

Tensor MultiheadSelfAttention::forward(const Tensor& x) { return (*resid_dropout)((*c_proj)(attend(x))); }

Branch MultiheadSelfAttention::branch(const Tensor& x) {
  run_forward_pre_hooks();
  return resid_dropout->branch(c_proj->branch(attend(x)));
}

Branch MultiheadSelfAttention::branch(const Normed& x) {
  run_forward_pre_hooks();
  return resid_dropout->branch(c_proj->branch(attend(x)));
}

Tensor MultiheadSelfAttention::forward_cached(const Tensor& x, KVCache& cache, size_t layer) {
  MG_CHECK(x.defined() && x.dim() == 3 && x.size(2) == embed_dim, ShapeError,
           "MultiheadSelfAttention::forward_cached(embed_dim=", embed_dim, "): expected input [B, T, ", embed_dim,
           "], got ", shape_or_undefined(x));
  MG_CHECK(layer < cache.k.size(), ValueError, "MultiheadSelfAttention::forward_cached: layer ", layer,
           " but the cache has ", cache.k.size(), " layers");
  const int64_t B = x.size(0), T = x.size(1), D = embed_dim / num_heads, pos = cache.length;
  MG_CHECK(pos + T <= cache.capacity, ValueError, "MultiheadSelfAttention::forward_cached: ", pos, " cached + ", T,
           " new positions exceed the cache's capacity ", cache.capacity);
  // With both old and new positions, the causal mask would need bottom-right alignment
  // (scaled_dot_product_attention aligns top-left); one new token attends to everything anyway.
  MG_CHECK(!causal || pos == 0 || T == 1, ValueError, "MultiheadSelfAttention::forward_cached: ", T,
           " new positions after ", pos, " cached ones (causal attention takes a prompt or one token at a time)");
  Tensor qkv = (*c_attn)(x);  // [B, T, 3C]
  auto heads = [&](int64_t i) {
    return qkv.narrow(2, i * embed_dim, embed_dim).reshape({B, T, num_heads, D}).transpose(1, 2);
  };
  Tensor& k = cache.k[layer];
  Tensor& v = cache.v[layer];
  if (!k.defined() || k.size(0) != B || k.dtype() != qkv.dtype() || k.device() != qkv.device()) {
    MG_CHECK(pos == 0, ValueError, "MultiheadSelfAttention::forward_cached: the cache holds ", pos,
             " positions of another batch size, dtype or device (clear it first)");
    k = empty({B, num_heads, cache.capacity, D}, {qkv.dtype(), qkv.device()});
    v = empty({B, num_heads, cache.capacity, D}, {qkv.dtype(), qkv.device()});
  }
  k.narrow(2, pos, T).copy_(heads(1));
  v.narrow(2, pos, T).copy_(heads(2));
  Tensor y = scaled_dot_product_attention(heads(0), k.narrow(2, 0, pos + T), v.narrow(2, 0, pos + T),
                                          causal && T > 1);  // [B, H, T, D]
  return (*resid_dropout)((*c_proj)(y.transpose(1, 2).reshape({B, T, embed_dim})));
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

Tensor MLP::forward(const Tensor& x) {
  if (gelu->approximate != "tanh") return (*dropout)((*c_proj)((*gelu)((*c_fc)(x))));
  return (*dropout)(fused(x, true));
}

Branch MLP::branch(const Tensor& x, bool bias_pending) { return branch_of(x, bias_pending); }
Branch MLP::branch(const Normed& x, bool bias_pending) { return branch_of(x, bias_pending); }

template <class X>
Branch MLP::branch_of(const X& x, bool bias_pending) {
  run_forward_pre_hooks();
  if (gelu->approximate != "tanh") return dropout->branch(c_proj->branch((*gelu)((*c_fc)(x)), bias_pending));
  // Under the FP8 recipe c_proj's bias stays in its GEMM (fp8_takes_linear says why).
  const bool leaves = c_proj->leaves_bias(bias_pending) && !fp8_takes_gelu_mlp(x, c_fc->weight, c_proj->weight);
  return dropout->branch({fused(x, !leaves), leaves ? c_proj->bias : Tensor()});
}

// The MLP as one node whose GEMMs carry the GELU (autograd/linalg_ops.cc), with or without
// c_proj's bias; the children's pre-hooks (pruning) still run first.
template <class X>
Tensor MLP::fused(const X& x, bool with_bias) {
  const Shape* s = shape_of(x);
  MG_CHECK(s && !s->empty() && s->back() == c_fc->in_features, ShapeError, "MLP(n_embd=", c_fc->in_features,
           "): input's last dim must be ", c_fc->in_features, ", got shape ", shape_or_undefined(x));
  c_fc->run_forward_pre_hooks();
  c_proj->run_forward_pre_hooks();
  return gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, with_bias ? c_proj->bias : Tensor());
}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& o, TensorOptions opts, Generator* gen)
    : Module("TransformerBlock") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(o.n_embd, o.ln_eps, true, o.bias, opts));
  attn = register_module(
      "attn", std::make_shared<MultiheadSelfAttention>(o.n_embd, o.n_head, o.causal, o.dropout, o.bias, opts, gen));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(o.n_embd, o.ln_eps, true, o.bias, opts));
  mlp = register_module("mlp", std::make_shared<MLP>(o, opts, gen));
}

Residual TransformerBlock::forward(Residual x) {
  x = x + attn->branch((*ln_1)(x));
  x = x + mlp->branch((*ln_2)(x));
  return x;
}

Tensor TransformerBlock::forward_output(Residual x) {
  x = x + attn->branch((*ln_1)(x));
  return (x + mlp->branch((*ln_2)(x), /*bias_pending=*/false)).value();
}

Tensor TransformerBlock::forward(const Tensor& x) { return forward_output(x); }

Tensor TransformerBlock::output(const Residual& x) {
  run_forward_pre_hooks();
  return forward_output(x);
}

Residual TransformerBlock::operator()(const Residual& x) {
  run_forward_pre_hooks();
  return forward(x);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KVCache& cache, size_t layer) {
  Tensor h = add(x, attn->forward_cached((*ln_1)(x), cache, layer));
  return add(h, (*mlp)((*ln_2)(h)));
}

}  // namespace mg::nn
