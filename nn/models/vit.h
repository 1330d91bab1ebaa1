// A Vision Transformer (torchvision's vit_b_16 layout): non-overlapping patches embedded by
// one Linear, a class token, learned position embeddings, pre-norm blocks, a linear head.
#pragma once

#include <memory>

#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace mg::nn {

struct ViTConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  int64_t dim = 768;
  int64_t depth = 12;
  int64_t heads = 12;
  int64_t mlp_ratio = 4;
  double dropout = 0.0;
  double ln_eps = 1e-6;
};

class ViT : public Module {
 public:
  explicit ViT(const ViTConfig& config, TensorOptions opts = {}, Generator* gen = nullptr);
  // x [B, C, H, W] with H == W == image_size -> logits [B, num_classes] (from the class token).
  Tensor forward(const Tensor& x) override;
  // [B, C, H, W] -> [B, N, C * p * p], each patch flattened in (c, kh, kw) order: a
  // Conv2d(kernel = stride = p) weight [dim, C, p, p] reshaped to [dim, C*p*p] is patch_embed's.
  Tensor patchify(const Tensor& x) const;

  const ViTConfig config;
  const int64_t num_patches;
  std::shared_ptr<Linear> patch_embed;  // C*p*p -> dim (the same parameters as the Conv2d)
  Tensor& cls_token;                    // [1, 1, dim]
  Tensor& pos_embedding;                // [1, num_patches + 1, dim]
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> ln;
  std::shared_ptr<Linear> head;
};

}  // namespace mg::nn
