#include "nn/models/resnet.h"

#include "autograd/functions.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride, TensorOptions opts, Generator* gen) {
  return std::make_shared<Conv2d>(in, out, 3, stride, 1, 1, 1, false, opts, gen);
}
std::shared_ptr<Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride, TensorOptions opts, Generator* gen) {
  return std::make_shared<Conv2d>(in, out, 1, stride, 0, 1, 1, false, opts, gen);
}
std::shared_ptr<BatchNorm2d> bn(int64_t c, TensorOptions opts) {
  return std::make_shared<BatchNorm2d>(c, 1e-5, 0.1, true, true, opts);
}
}  // namespace

ResidualBlock::ResidualBlock(std::string name, std::vector<std::shared_ptr<Conv2d>> convs, std::shared_ptr<Module> ds,
                             TensorOptions opts)
    : Module(std::move(name)) {
  std::shared_ptr<Conv2d>* conv_slots[] = {&conv1, &conv2, &conv3};
  std::shared_ptr<BatchNorm2d>* bn_slots[] = {&bn1, &bn2, &bn3};
  MG_CHECK(!convs.empty() && convs.size() <= 3, ValueError, type_name(), ": expected 1 to 3 convs, got ", convs.size());
  for (size_t i = 0; i < convs.size(); ++i) {
    const std::string n = std::to_string(i + 1);
    *conv_slots[i] = register_module("conv" + n, convs[i]);
    *bn_slots[i] = register_module("bn" + n, bn(convs[i]->out_channels, opts));
  }
  if (ds) downsample = register_module("downsample", std::move(ds));
}

// Each batch norm that a ReLU follows runs as one op with it (BatchNorm2d::forward_relu), the
// last one with the residual add too (BatchNorm2d::forward_add_relu: the block's output).
Tensor ResidualBlock::forward(const Tensor& x) {
  Tensor out = bn1->forward_relu((*conv1)(x));
  if (conv3) out = bn2->forward_relu((*conv2)(out));
  const Tensor identity = downsample ? (*downsample)(x) : x;
  return conv3 ? bn3->forward_add_relu((*conv3)(out), identity) : bn2->forward_add_relu((*conv2)(out), identity);
}

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> ds, TensorOptions opts,
                       Generator* gen)
    : ResidualBlock("BasicBlock", {conv3x3(inplanes, planes, stride, opts, gen), conv3x3(planes, planes, 1, opts, gen)},
                    std::move(ds), opts) {}

// The 3x3 (9 * planes^2 weights) works at the reduced width and never sees the wide
// planes * 4 tensor.
Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> ds, TensorOptions opts,
                       Generator* gen)
    : ResidualBlock("Bottleneck",
                    {conv1x1(inplanes, planes, 1, opts, gen), conv3x3(planes, planes, stride, opts, gen),
                     conv1x1(planes, planes * expansion, 1, opts, gen)},
                    std::move(ds), opts) {}

ResNet::ResNet(Block block, const std::vector<int64_t>& layers, int64_t num_classes, TensorOptions opts, Generator* gen)
    : Module("ResNet") {
  MG_CHECK(layers.size() == 4, ValueError, "ResNet: expected 4 stage sizes, got ", layers.size());
  MG_CHECK(num_classes > 0, ValueError, "ResNet: num_classes must be positive, got ", num_classes);
  conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 64, 7, 2, 3, 1, 1, false, opts, gen));
  bn1 = register_module("bn1", bn(64, opts));
  maxpool = register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));
  layer1 = register_module("layer1", make_layer(block, 64, layers[0], 1, opts, gen));
  layer2 = register_module("layer2", make_layer(block, 128, layers[1], 2, opts, gen));
  layer3 = register_module("layer3", make_layer(block, 256, layers[2], 2, opts, gen));
  layer4 = register_module("layer4", make_layer(block, 512, layers[3], 2, opts, gen));
  avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<Linear>(inplanes_, num_classes, true, opts, gen));
  // torchvision's init: kaiming_normal_(fan_out, relu) for convs; BN already weight 1, bias 0.
  for (auto& [name, m] : named_modules())
    if (auto* c = dynamic_cast<Conv2d*>(m)) init::kaiming_normal_(c->weight, 0.0, "fan_out", "relu", gen);
}

std::shared_ptr<Sequential> ResNet::make_layer(Block block, int64_t planes, int64_t blocks, int64_t stride,
                                               TensorOptions opts, Generator* gen) {
  const int64_t expansion = block == Block::Basic ? BasicBlock::expansion : Bottleneck::expansion;
  auto make = [&](int64_t s, std::shared_ptr<Module> ds) -> std::shared_ptr<Module> {
    if (block == Block::Basic) return std::make_shared<BasicBlock>(inplanes_, planes, s, std::move(ds), opts, gen);
    return std::make_shared<Bottleneck>(inplanes_, planes, s, std::move(ds), opts, gen);
  };
  std::shared_ptr<Module> ds;
  if (stride != 1 || inplanes_ != planes * expansion) {
    auto seq = std::make_shared<Sequential>();
    seq->push_back(conv1x1(inplanes_, planes * expansion, stride, opts, gen)).push_back(bn(planes * expansion, opts));
    ds = seq;
  }
  auto layer = std::make_shared<Sequential>();
  layer->push_back(make(stride, ds));
  inplanes_ = planes * expansion;
  for (int64_t i = 1; i < blocks; ++i) layer->push_back(make(1, nullptr));
  return layer;
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = (*maxpool)(bn1->forward_relu((*conv1)(x)));
  h = (*layer4)((*layer3)((*layer2)((*layer1)(h))));
  return (*fc)(flatten((*avgpool)(h), 1));
}

std::shared_ptr<ResNet> resnet18(int64_t num_classes, TensorOptions opts, Generator* gen) {
  return std::make_shared<ResNet>(ResNet::Block::Basic, std::vector<int64_t>{2, 2, 2, 2}, num_classes, opts, gen);
}

std::shared_ptr<ResNet> resnet50(int64_t num_classes, TensorOptions opts, Generator* gen) {
  return std::make_shared<ResNet>(ResNet::Block::Bottleneck, std::vector<int64_t>{3, 4, 6, 3}, num_classes, opts, gen);
}

}  // namespace mg::nn
