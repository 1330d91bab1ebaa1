#include "nn/models/mobilenet.h"

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "nn/activation.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
std::shared_ptr<BatchNorm2d> bn(int64_t c, TensorOptions opts) {
  return std::make_shared<BatchNorm2d>(c, 1e-5, 0.1, true, true, opts);
}
}  // namespace

DepthwiseSeparable::DepthwiseSeparable(int64_t in, int64_t out, int64_t stride, TensorOptions opts, Generator* gen)
    : Module("DepthwiseSeparable") {
  depthwise =
      register_module("depthwise", std::make_shared<Conv2d>(in, in, 3, stride, 1, 1, /*groups=*/in, false, opts, gen));
  bn1 = register_module("bn1", bn(in, opts));
  pointwise = register_module("pointwise", std::make_shared<Conv2d>(in, out, 1, 1, 0, 1, 1, false, opts, gen));
  bn2 = register_module("bn2", bn(out, opts));
}

// Each batch norm runs with its ReLU as one op (BatchNorm2d::forward_relu: fused into the
// channels-last passes on CUDA).
Tensor DepthwiseSeparable::forward(const Tensor& x) {
  Tensor h = bn1->forward_relu((*depthwise)(x));
  return bn2->forward_relu((*pointwise)(h));
}

MobileNet::MobileNet(int64_t num_classes, double width_mult, TensorOptions opts, Generator* gen) : Module("MobileNet") {
  MG_CHECK(num_classes > 0 && width_mult > 0, ValueError, "MobileNet: num_classes and width_mult must be positive");
  auto w = [&](int64_t c) { return std::max<int64_t>(1, static_cast<int64_t>(std::lround(c * width_mult))); };
  // (out_channels, stride) of the 13 blocks.
  const int64_t cfg[13][2] = {{64, 1},  {128, 2}, {128, 1}, {256, 2}, {256, 1},  {512, 2}, {512, 1},
                              {512, 1}, {512, 1}, {512, 1}, {512, 1}, {1024, 2}, {1024, 1}};
  features = register_module("features", std::make_shared<Sequential>());
  features->push_back(std::make_shared<Conv2d>(3, w(32), 3, 2, 1, 1, 1, false, opts, gen));
  features->push_back(bn(w(32), opts)).push_back(std::make_shared<ReLU>(true));
  int64_t in = w(32);
  for (auto& c : cfg) {
    features->push_back(std::make_shared<DepthwiseSeparable>(in, w(c[0]), c[1], opts, gen));
    in = w(c[0]);
  }
  avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<Linear>(in, num_classes, true, opts, gen));
  for (auto& [name, m] : named_modules())
    if (auto* c = dynamic_cast<Conv2d*>(m)) init::kaiming_normal_(c->weight, 0.0, "fan_out", "relu", gen);
}

Tensor MobileNet::forward(const Tensor& x) { return (*fc)(flatten((*avgpool)((*features)(x)), 1)); }

}  // namespace mg::nn
