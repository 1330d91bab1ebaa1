// Parameter initialisers with PyTorch's names and formulas (torch.nn.init): each fills a
// tensor in place under NoGradGuard, draws from `gen` (default generator when null).
#pragma once

#include <string>
#include <utility>

#include "core/random.h"
#include "core/tensor.h"

namespace mg::nn::init {

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (dim >= 2).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);
// Recommended gain for a nonlinearity: "linear", "conv*", "sigmoid" -> 1, "tanh" -> 5/3,
// "relu" -> sqrt(2), "leaky_relu" -> sqrt(2 / (1 + param^2)), "selu" -> 3/4.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

// An uninitialised tensor for a module's parameter or buffer, counted under
// MemoryCategory::Parameters in the allocator's stats; a reset_parameters() then fills it.
Tensor empty_parameter(const Shape& shape, TensorOptions opts);

const Tensor& uniform_(const Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
const Tensor& normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
const Tensor& constant_(const Tensor& t, double value);
const Tensor& zeros_(const Tensor& t);
const Tensor& ones_(const Tensor& t);

// mode: "fan_in" (preserve forward variance) or "fan_out" (backward).
// kaiming_uniform_: U(-b, b), b = gain * sqrt(3 / fan). nn.Linear uses a = sqrt(5).
const Tensor& kaiming_uniform_(const Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                               const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
// kaiming_normal_: N(0, std^2), std = gain / sqrt(fan).
const Tensor& kaiming_normal_(const Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                              const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
// xavier_uniform_: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out)).
const Tensor& xavier_uniform_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);
// xavier_normal_: N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
const Tensor& xavier_normal_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace mg::nn::init
