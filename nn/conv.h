// Convolution, pooling and batch-norm layers as Modules (torch.nn.Conv2d, MaxPool2d,
// AvgPool2d, AdaptiveAvgPool2d, BatchNorm2d), thin wrappers over autograd/conv_functions.h.
#pragma once

#include <optional>

#include "autograd/conv_functions.h"
#include "core/random.h"
#include "nn/module.h"

namespace mg::nn {

// Input [N, C, H, W] (or [C, H, W]), NCHW or channels-last. On CUDA a channels-last input
// runs cuDNN's NHWC kernels and gives a channels-last output; memory_format = ChannelsLast
// (set_memory_format) makes every CUDA input channels-last first.
class Conv2d : public Module {
 public:
  // Parameters are allocated under MemoryCategory::Parameters; `gen` null = default generator.
  Conv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size, Int2 stride = 1, Int2 padding = 0,
         Int2 dilation = 1, int64_t groups = 1, bool bias = true, TensorOptions opts = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // PyTorch's init: kaiming_uniform_(weight, a = sqrt(5)), bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  // with fan_in = in_channels / groups * kH * kW.
  void reset_parameters(Generator* gen = nullptr);
  std::string extra_repr() const override;
  void on_memory_format(MemoryFormat fmt) override { memory_format = fmt; }

  const int64_t in_channels, out_channels;
  const Int2 kernel_size, stride, padding, dilation;
  const int64_t groups;
  Tensor& weight;  // [out, in / groups, kH, kW]
  Tensor& bias;    // [out], undefined when bias = false
  MemoryFormat memory_format = MemoryFormat::Contiguous;
};

// What MaxPool2d and AvgPool2d share: the window (stride defaults to kernel_size), checked.
class Pool2d : public Module {
 public:
  std::string extra_repr() const override;  // "kernel_size=.., stride=.., padding=.."
  Int2 kernel_size, stride, padding;
  bool ceil_mode;

 protected:
  Pool2d(const char* name, Int2 kernel_size, std::optional<Int2> stride, Int2 padding, bool ceil_mode);
};

class MaxPool2d : public Pool2d {
 public:
  explicit MaxPool2d(Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0, Int2 dilation = 1,
                     bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Int2 dilation;
};

class AvgPool2d : public Pool2d {
 public:
  explicit AvgPool2d(Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  bool count_include_pad;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Int2 output_size);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Int2 output_size;
};

// Per-channel normalization over (N, H, W) of a 4-D input. train(): batch statistics, and
// (with track_running_stats) running_mean/running_var updated with `momentum` (nullopt =
// cumulative average, 1/num_batches_tracked) and num_batches_tracked += 1. eval(): running
// statistics (or batch statistics when track_running_stats is false).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true, TensorOptions opts = {});
  Tensor forward(const Tensor& x) override;
  // relu((*this)(x)) as one op (mg::batch_norm_relu: fused on CUDA for channels-last inputs);
  // runs the forward pre-hooks as operator() does.
  Tensor forward_relu(const Tensor& x);
  // relu((*this)(x) + residual) as one op (mg::batch_norm_add_relu: the add and the ReLU
  // inside the normalization pass on CUDA for channels-last inputs): a residual block's output.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  // running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats();
  // reset_running_stats(), weight = 1, bias = 0.
  void reset_parameters();
  std::string extra_repr() const override;

  const int64_t num_features;
  const double eps;
  const std::optional<double> momentum;
  const bool affine, track_running_stats;
  Tensor& weight;               // [C], undefined when !affine
  Tensor& bias;                 // [C], undefined when !affine
  Tensor& running_mean;         // [C] buffer, undefined when !track_running_stats
  Tensor& running_var;          // [C] buffer
  Tensor& num_batches_tracked;  // i64 scalar buffer

 private:
  Tensor run(const Tensor& x, bool relu, const Tensor& residual = Tensor());
  Tensor one_;  // num_batches_tracked's increment, on its device
};

}  // namespace mg::nn
