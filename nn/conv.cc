#include "nn/conv.h"

#include <cmath>
#include <sstream>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "kernels/ops.h"
#include "nn/init.h"

namespace mg::nn {

namespace {

std::string pair_str(Int2 v) {
  std::ostringstream os;
  os << "(" << v.h << ", " << v.w << ")";
  return os.str();
}

int64_t positive(int64_t n, const char* layer, const char* what) {
  MG_CHECK(n > 0, ValueError, layer, ": ", what, " must be positive, got ", n);
  return n;
}

Int2 positive(Int2 v, const char* layer, const char* what) {
  MG_CHECK(v.h > 0 && v.w > 0, ValueError, layer, ": ", what, " must be positive, got ", pair_str(v));
  return v;
}

Int2 non_negative(Int2 v, const char* layer, const char* what) {
  MG_CHECK(v.h >= 0 && v.w >= 0, ValueError, layer, ": ", what, " must be non-negative, got ", pair_str(v));
  return v;
}

int64_t check_groups(int64_t in, int64_t out, int64_t groups) {
  positive(groups, "Conv2d", "groups");
  MG_CHECK(in % groups == 0, ValueError, "Conv2d: in_channels (", in, ") must be divisible by groups (", groups, ")");
  MG_CHECK(out % groups == 0, ValueError, "Conv2d: out_channels (", out, ") must be divisible by groups (", groups,
           ")");
  return groups;
}

}  // namespace

// ---------------- Conv2d ----------------

Conv2d::Conv2d(int64_t in, int64_t out, Int2 k, Int2 s, Int2 p, Int2 d, int64_t g, bool with_bias, TensorOptions opts,
               Generator* gen)
    : Module("Conv2d"),
      in_channels(positive(in, "Conv2d", "in_channels")),
      out_channels(positive(out, "Conv2d", "out_channels")),
      kernel_size(positive(k, "Conv2d", "kernel_size")),
      stride(positive(s, "Conv2d", "stride")),
      padding(non_negative(p, "Conv2d", "padding")),
      dilation(positive(d, "Conv2d", "dilation")),
      groups(check_groups(in, out, g)),
      weight(register_parameter("weight", init::empty_parameter({out, in / g, k.h, k.w}, opts))),
      bias(register_parameter("bias", with_bias ? init::empty_parameter({out}, opts) : Tensor())) {
  reset_parameters(gen);
}

void Conv2d::reset_parameters(Generator* gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), "fan_in", "leaky_relu", gen);
  if (bias.defined()) {
    const double fan_in = static_cast<double>(in_channels / groups * kernel_size.h * kernel_size.w);
    const double bound = 1.0 / std::sqrt(fan_in);
    init::uniform_(bias, -bound, bound, gen);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  MG_CHECK(x.defined() && (x.dim() == 3 || x.dim() == 4) && x.size(x.dim() - 3) == in_channels, ShapeError, "Conv2d(",
           in_channels, ", ", out_channels, "): expected input [N, ", in_channels, ", H, W] or [", in_channels,
           ", H, W], got shape ", x.defined() ? shape_str(x.sizes()) : std::string("(undefined)"));
  if (memory_format == MemoryFormat::ChannelsLast && x.dim() == 4 && x.is_cuda())
    return mg::conv2d(x.contiguous(MemoryFormat::ChannelsLast), weight, bias, stride, padding, dilation, groups);
  return mg::conv2d(x, weight, bias, stride, padding, dilation, groups);
}

std::string Conv2d::extra_repr() const {
  std::ostringstream os;
  os << in_channels << ", " << out_channels << ", kernel_size=" << pair_str(kernel_size)
     << ", stride=" << pair_str(stride);
  if (!(padding == Int2(0))) os << ", padding=" << pair_str(padding);
  if (!(dilation == Int2(1))) os << ", dilation=" << pair_str(dilation);
  if (groups != 1) os << ", groups=" << groups;
  if (!bias.defined()) os << ", bias=false";
  if (memory_format != MemoryFormat::Contiguous) os << ", memory_format=" << memory_format;
  return os.str();
}

// ---------------- pooling ----------------

Pool2d::Pool2d(const char* name, Int2 k, std::optional<Int2> s, Int2 p, bool ceil)
    : Module(name),
      kernel_size(positive(k, name, "kernel_size")),
      stride(positive(s.value_or(k), name, "stride")),
      padding(non_negative(p, name, "padding")),
      ceil_mode(ceil) {}

std::string Pool2d::extra_repr() const {
  return "kernel_size=" + pair_str(kernel_size) + ", stride=" + pair_str(stride) + ", padding=" + pair_str(padding);
}

MaxPool2d::MaxPool2d(Int2 k, std::optional<Int2> s, Int2 p, Int2 d, bool ceil)
    : Pool2d("MaxPool2d", k, s, p, ceil), dilation(positive(d, "MaxPool2d", "dilation")) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return mg::max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return Pool2d::extra_repr() + ", dilation=" + pair_str(dilation) + ", ceil_mode=" + (ceil_mode ? "true" : "false");
}

AvgPool2d::AvgPool2d(Int2 k, std::optional<Int2> s, Int2 p, bool ceil, bool include_pad)
    : Pool2d("AvgPool2d", k, s, p, ceil), count_include_pad(include_pad) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return mg::avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Int2 out)
    : Module("AdaptiveAvgPool2d"), output_size(positive(out, "AdaptiveAvgPool2d", "output_size")) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return mg::adaptive_avg_pool2d(x, output_size); }

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + pair_str(output_size); }

// ---------------- BatchNorm2d ----------------

BatchNorm2d::BatchNorm2d(int64_t n, double eps_, std::optional<double> momentum_, bool affine_, bool track,
                         TensorOptions opts)
    : Module("BatchNorm2d"),
      num_features(positive(n, "BatchNorm2d", "num_features")),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track),
      weight(register_parameter("weight", affine_ ? init::empty_parameter({n}, opts) : Tensor())),
      bias(register_parameter("bias", affine_ ? init::empty_parameter({n}, opts) : Tensor())),
      running_mean(register_buffer("running_mean", track ? init::empty_parameter({n}, opts) : Tensor())),
      running_var(register_buffer("running_var", track ? init::empty_parameter({n}, opts) : Tensor())),
      num_batches_tracked(register_buffer("num_batches_tracked",
                                          track ? init::empty_parameter({}, {DType::i64, opts.device}) : Tensor())) {
  MG_CHECK(eps_ >= 0, ValueError, "BatchNorm2d: eps must be non-negative, got ", eps_);
  MG_CHECK(!momentum_ || (*momentum_ >= 0 && *momentum_ <= 1), ValueError,
           "BatchNorm2d: momentum must be in [0, 1] (or nullopt for a cumulative average), got ", *momentum_);
  reset_parameters();
}

void BatchNorm2d::reset_running_stats() {
  if (!track_running_stats) return;
  NoGradGuard no_grad;
  raw::fill_(running_mean, 0.0);
  raw::fill_(running_var, 1.0);
  raw::fill_(num_batches_tracked, 0.0);
  for (const Tensor* t : {&running_mean, &running_var, &num_batches_tracked}) t->bump_version();
}

void BatchNorm2d::reset_parameters() {
  reset_running_stats();
  if (affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) { return run(x, /*relu=*/false); }

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  run_forward_pre_hooks();  // as operator() does
  return run(x, /*relu=*/true);
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  run_forward_pre_hooks();
  return run(x, /*relu=*/true, residual);
}

Tensor BatchNorm2d::run(const Tensor& x, bool relu, const Tensor& residual) {
  MG_CHECK(x.defined() && x.dim() == 4, ShapeError, "BatchNorm2d: expected a 4-D input [N, C, H, W], got shape ",
           x.defined() ? shape_str(x.sizes()) : std::string("(undefined)"));
  MG_CHECK(x.size(1) == num_features, ShapeError, "BatchNorm2d(", num_features, "): input has ", x.size(1),
           " channels (shape ", shape_str(x.sizes()), "), expected ", num_features);
  double factor = momentum.value_or(0.0);
  if (is_training() && track_running_stats) {
    NoGradGuard no_grad;
    // A kept 0-dim one: the increment is one launch, not an allocation, a fill and an add.
    if (!one_.defined() || one_.device() != num_batches_tracked.device())
      one_ = ones({}, {DType::i64, num_batches_tracked.device()});
    kernels::binary_(kernels::Binary::Add, num_batches_tracked, one_);
    if (!momentum) factor = 1.0 / num_batches_tracked.item();  // cumulative moving average
  }
  // Batch statistics in training, and in eval too when no running statistics are kept.
  const bool use_batch_stats = is_training() || !track_running_stats;
  const bool update = is_training() && track_running_stats;
  const Tensor rm = update || !use_batch_stats ? running_mean : Tensor();
  const Tensor rv = update || !use_batch_stats ? running_var : Tensor();
  if (residual.defined())
    return mg::batch_norm_add_relu(x, residual, rm, rv, weight, bias, use_batch_stats, factor, eps);
  return relu ? mg::batch_norm_relu(x, rm, rv, weight, bias, use_batch_stats, factor, eps)
              : mg::batch_norm(x, rm, rv, weight, bias, use_batch_stats, factor, eps);
}

std::string BatchNorm2d::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << eps << ", momentum=";
  if (momentum)
    os << *momentum;
  else
    os << "None";
  os << ", affine=" << (affine ? "true" : "false")
     << ", track_running_stats=" << (track_running_stats ? "true" : "false");
  return os.str();
}

}  // namespace mg::nn
