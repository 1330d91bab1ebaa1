// nn::summary: a torchinfo-like table of a model (layer, output shape, parameters,
// activation bytes) and an estimate of its peak training memory by category.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace mg::nn {

struct SummaryOptions {
  // Param-sized state buffers per trainable parameter: "sgd" 0, "sgd_momentum" 1,
  // "adam" / "adamw" 2 (exp_avg, exp_avg_sq).
  std::string optimizer = "adam";
  // zero_grad(set_to_none=false) keeps every .grad allocated through the forward too.
  bool grads_persist = false;
};

struct SummaryRow {
  std::string name;  // dotted path ("0", "features.3")
  std::string type;
  Shape output_shape;
  int64_t params = 0;     // scalars, shared parameters counted at their first use
  int64_t trainable = 0;  // of which require grad
  int64_t param_bytes = 0, grad_bytes = 0;
  // Growth of live memory over this layer's recorded forward, measured once the previous
  // layer's output is released (so it can be negative for an op that frees more than it keeps).
  int64_t activation_bytes = 0;
  int64_t output_bytes = 0;
};

struct ModelSummary {
  std::vector<SummaryRow> rows;  // the layers in execution order (Sequentials expanded)
  int64_t total_params = 0, trainable_params = 0;
  int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
  // The estimated peak of one training step (forward, backward, optimizer step), and what
  // at that moment is neither parameters, optimizer state nor gradients (activations not yet
  // freed and backward workspaces).
  int64_t peak_bytes = 0;
  int64_t activations_at_peak = 0;
  std::string str() const;
};

// Runs one recorded forward of `sample` through the model layer by layer (Sequentials,
// nested ones too, are expanded; any other module is one layer), measuring what each keeps
// for backward on the sample's device, then one backward (its peak feeds the estimate).
// The model's .grad tensors are left as they were; the device's peak counters are reset
// (reset_peak_memory_stats), as a profiler would.
ModelSummary summary(Module& model, const Tensor& sample, const SummaryOptions& opts = {});
// A random normal input of `input_shape` with the dtype and device of the model's first parameter.
ModelSummary summary(Module& model, const Shape& input_shape, const SummaryOptions& opts = {});

}  // namespace mg::nn
