// ResNet (torchvision's layout, v1.5: the stride sits on the 3x3 conv of a Bottleneck):
// BasicBlock (two 3x3 convs) for resnet18/34, Bottleneck (1x1 reduce, 3x3, 1x1 expand x4)
// for resnet50/101/152. Parameter names match torchvision's ("layer1.0.conv1.weight").
#pragma once

#include <memory>
#include <vector>

#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/sequential.h"

namespace mg::nn {

class BasicBlock : public Module {
 public:
  static constexpr int64_t expansion = 1;
  // downsample (1x1 conv + BN on the identity path) is null when shapes already match.
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample,
             TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Module> downsample;
};

class Bottleneck : public Module {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample,
             TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> conv1, conv2, conv3;
  std::shared_ptr<BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<Module> downsample;
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
