#include "nn/init.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "kernels/ops.h"

namespace mg::nn::init {

Tensor empty_parameter(const Shape& shape, TensorOptions opts) {
  MemoryCategoryGuard g(MemoryCategory::Parameters);
  return empty(shape, {opts.dtype, opts.device});
}

namespace {
void check_float(const Tensor& t, const char* op) {
  MG_CHECK(t.defined(), ValueError, op, ": undefined tensor");
  MG_CHECK(is_floating(t.dtype()), DTypeError, op, ": expected a floating tensor, got ", t.dtype());
}

int64_t fan(const Tensor& t, const std::string& mode, const char* op) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  if (mode == "fan_in") return fan_in;
  if (mode == "fan_out") return fan_out;
  MG_THROW(ValueError, op, ": mode must be \"fan_in\" or \"fan_out\", got \"", mode, "\"");
}
}  // namespace

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  MG_CHECK(t.defined() && t.dim() >= 2, ValueError,
           "calculate_fan_in_and_fan_out: fan in and fan out need a tensor with at least 2 dims, got shape ",
           t.defined() ? shape_str(t.sizes()) : std::string("(undefined)"));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const std::string& nl, double param) {
  if (nl == "linear" || nl == "sigmoid" || nl.rfind("conv", 0) == 0) return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nl == "selu") return 0.75;
  MG_THROW(ValueError, "calculate_gain: unsupported nonlinearity \"", nl,
           "\" (valid: linear, conv1d, conv2d, conv3d, sigmoid, tanh, relu, leaky_relu, selu)");
}

const Tensor& uniform_(const Tensor& t, double low, double high, Generator* gen) {
  check_float(t, "init::uniform_");
  MG_CHECK(low <= high, ValueError, "init::uniform_: low (", low, ") must be <= high (", high, ")");
  NoGradGuard ng;
  mg::uniform_(t, low, high, gen);
  t.bump_version();
  return t;
}

const Tensor& normal_(const Tensor& t, double mean, double std, Generator* gen) {
  check_float(t, "init::normal_");
  MG_CHECK(std >= 0, ValueError, "init::normal_: std must be >= 0, got ", std);
  NoGradGuard ng;
  mg::normal_(t, mean, std, gen);
  t.bump_version();
  return t;
}

const Tensor& constant_(const Tensor& t, double value) {
  check_float(t, "init::constant_");
  NoGradGuard ng;
  raw::fill_(t, value);
  t.bump_version();
  return t;
}
const Tensor& zeros_(const Tensor& t) { return constant_(t, 0.0); }
const Tensor& ones_(const Tensor& t) { return constant_(t, 1.0); }

const Tensor& kaiming_uniform_(const Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                               Generator* gen) {
  check_float(t, "init::kaiming_uniform_");
  if (t.numel() == 0) return t;  // PyTorch: a no-op on zero-element tensors
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode, "kaiming_uniform_")));
  const double bound = std::sqrt(3.0) * std;
  return init::uniform_(t, -bound, bound, gen);
}

const Tensor& kaiming_normal_(const Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                              Generator* gen) {
  check_float(t, "init::kaiming_normal_");
  if (t.numel() == 0) return t;  // PyTorch: a no-op on zero-element tensors
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode, "kaiming_normal_")));
  return init::normal_(t, 0.0, std, gen);
}

const Tensor& xavier_uniform_(const Tensor& t, double gain, Generator* gen) {
  check_float(t, "init::xavier_uniform_");
  if (t.numel() == 0) return t;  // PyTorch: a no-op on zero-element tensors
  auto [fi, fo] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fi + fo));
  return init::uniform_(t, -bound, bound, gen);
}

const Tensor& xavier_normal_(const Tensor& t, double gain, Generator* gen) {
  check_float(t, "init::xavier_normal_");
  if (t.numel() == 0) return t;  // PyTorch: a no-op on zero-element tensors
  auto [fi, fo] = calculate_fan_in_and_fan_out(t);
  return init::normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fi + fo)), gen);
}

}  // namespace mg::nn::init
