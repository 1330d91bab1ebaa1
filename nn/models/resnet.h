// ResNet (torchvision's layout, v1.5: the stride sits on the 3x3 conv of a Bottleneck):
// BasicBlock (two 3x3 convs) for resnet18/34, Bottleneck (1x1 reduce, 3x3, 1x1 expand x4)
// for resnet50/101/152. Parameter names match torchvision's ("layer1.0.conv1.weight").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/sequential.h"

namespace mg::nn {

// A residual block: conv + BN stages with a ReLU between them, the identity added after the
// last stage (through `downsample`, a 1x1 conv + BN, when the shapes change; null when they
// already match), then a final ReLU.
class ResidualBlock : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> conv1, conv2, conv3;  // conv3 is null in a BasicBlock
  std::shared_ptr<BatchNorm2d> bn1, bn2, bn3;   // bn3 likewise
  std::shared_ptr<Module> downsample;

 protected:
  // Registers convs[i] as "conv<i+1>", each followed by a BatchNorm2d "bn<i+1>" over its
  // output channels, then `downsample` (torchvision's parameter order).
  ResidualBlock(std::string name, std::vector<std::shared_ptr<Conv2d>> convs, std::shared_ptr<Module> downsample,
                TensorOptions opts);
};

// Two 3x3 convs, the first with the stride.
class BasicBlock : public ResidualBlock {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample,
             TensorOptions opts = {}, Generator* gen = nullptr);
};

// 1x1 reduce to `planes`, 3x3 with the stride, 1x1 expand to planes * 4.
class Bottleneck : public ResidualBlock {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample,
             TensorOptions opts = {}, Generator* gen = nullptr);
};

class ResNet : public Module {
 public:
  enum class Block { Basic, Bottleneck };
  // layers: blocks per stage, e.g. {2, 2, 2, 2} (resnet18) or {3, 4, 6, 3} (resnet50).
  ResNet(Block block, const std::vector<int64_t>& layers, int64_t num_classes = 1000, TensorOptions opts = {},
         Generator* gen = nullptr);
  // x [N, 3, H, W] -> logits [N, num_classes]; any H, W >= 32 works (adaptive pooling).
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<MaxPool2d> maxpool;
  std::shared_ptr<Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;

 private:
  std::shared_ptr<Sequential> make_layer(Block block, int64_t planes, int64_t blocks, int64_t stride,
                                         TensorOptions opts, Generator* gen);
  int64_t inplanes_ = 64;
};

std::shared_ptr<ResNet> resnet18(int64_t num_classes = 1000, TensorOptions opts = {}, Generator* gen = nullptr);
std::shared_ptr<ResNet> resnet50(int64_t num_classes = 1000, TensorOptions opts = {}, Generator* gen = nullptr);

}  // namespace mg::nn
