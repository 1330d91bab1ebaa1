#include "nn/models/vit.h"

#include "autograd/functions.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
const ViTConfig& checked(const ViTConfig& c) {
  MG_CHECK(c.image_size > 0 && c.patch_size > 0 && c.image_size % c.patch_size == 0, ValueError, "ViT: image_size (",
           c.image_size, ") must be a positive multiple of patch_size (", c.patch_size, ")");
  MG_CHECK(c.in_channels > 0 && c.num_classes > 0 && c.depth >= 0 && c.heads > 0 && c.dim % c.heads == 0, ValueError,
           "ViT: dim (", c.dim, ") must be a multiple of heads (", c.heads, "), and sizes positive");
  return c;
}

int64_t patches(const ViTConfig& c) { return (c.image_size / c.patch_size) * (c.image_size / c.patch_size); }
}  // namespace

ViT::ViT(const ViTConfig& cfg, TensorOptions opts, Generator* gen)
    : Module("ViT"),
      config(checked(cfg)),
      num_patches(patches(cfg)),
      patch_embed(register_module(
          "patch_embed",
          std::make_shared<Linear>(cfg.in_channels * cfg.patch_size * cfg.patch_size, cfg.dim, true, opts, gen))),
      cls_token(register_parameter("cls_token", init::empty_parameter({1, 1, cfg.dim}, opts))),
      pos_embedding(register_parameter("pos_embedding", init::empty_parameter({1, patches(cfg) + 1, cfg.dim}, opts))) {
  init::zeros_(cls_token);
  init::normal_(pos_embedding, 0.0, 0.02, gen);
  drop = register_module("drop", std::make_shared<Dropout>(config.dropout));
  TransformerBlockOptions bo;
  bo.n_embd = config.dim;
  bo.n_head = config.heads;
  bo.causal = false;
  bo.dropout = config.dropout;
  bo.gelu_approximate = "none";
  bo.ln_eps = config.ln_eps;
  bo.mlp_ratio = config.mlp_ratio;
  blocks = register_module("blocks", std::make_shared<Sequential>());
  for (int64_t i = 0; i < config.depth; ++i) blocks->push_back(std::make_shared<TransformerBlock>(bo, opts, gen));
  ln = register_module("ln", std::make_shared<LayerNorm>(config.dim, config.ln_eps, true, true, opts));
  head = register_module("head", std::make_shared<Linear>(config.dim, config.num_classes, true, opts, gen));
}

Tensor ViT::patchify(const Tensor& x) const {
  const int64_t S = config.image_size, p = config.patch_size, C = config.in_channels;
  MG_CHECK(x.defined() && x.dim() == 4 && x.size(1) == C && x.size(2) == S && x.size(3) == S, ShapeError,
           "ViT: expected images [B, ", C, ", ", S, ", ", S, "], got ",
           x.defined() ? shape_str(x.sizes()) : std::string("(undefined)"));
  const int64_t B = x.size(0), g = S / p;
  // [B, C, g, p, g, p] -> [B, g, g, C, p, p] -> [B, g*g, C*p*p]
  return x.reshape({B, C, g, p, g, p}).permute({0, 2, 4, 1, 3, 5}).reshape({B, g * g, C * p * p});
}

Tensor ViT::forward(const Tensor& x) {
  Tensor tokens = (*patch_embed)(patchify(x));  // [B, N, dim]
  const int64_t B = tokens.size(0);
  Tensor cls = cls_token.expand({B, 1, config.dim});
  Tensor h = (*drop)(add(cat({cls, tokens}, 1), pos_embedding));
  h = (*ln)((*blocks)(h));
  return (*head)(h.select(1, 0));
}

}  // namespace mg::nn
