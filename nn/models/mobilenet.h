// MobileNet (v1): a 3x3 stem conv, then 13 depthwise-separable blocks, each a depthwise 3x3
// (groups = channels: one filter per channel) and a pointwise 1x1 that mixes channels.
#pragma once

#include <memory>

#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/sequential.h"

namespace mg::nn {

// depthwise 3x3 (stride s) + BN + ReLU, pointwise 1x1 + BN + ReLU. Weights: 9*C_in + C_in*C_out
// against 9*C_in*C_out for a standard 3x3 conv (and the same ratio in multiply-adds).
class DepthwiseSeparable : public Module {
 public:
  DepthwiseSeparable(int64_t in_channels, int64_t out_channels, int64_t stride, TensorOptions opts = {},
                     Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> depthwise, pointwise;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
};

class MobileNet : public Module {
 public:
  // width_mult scales every channel count (MobileNet's alpha); 1.0 is the published network
  // (4,231,976 parameters at 1000 classes).
  explicit MobileNet(int64_t num_classes = 1000, double width_mult = 1.0, TensorOptions opts = {},
                     Generator* gen = nullptr);
  // x [N, 3, H, W] -> logits [N, num_classes].
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Sequential> features;  // stem conv, bn, relu, then the 13 blocks
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;
};

}  // namespace mg::nn
