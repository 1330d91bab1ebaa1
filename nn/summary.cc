// nn::summary. The peak estimate is parameters + optimizer state (computed for the named
// optimizer) + the peak of one measured forward/backward on the sample (activations,
// gradients, kernel workspaces): a model of the backward alone misses the workspaces
// (a convolution's column buffers are larger than its activations).
#include "nn/summary.h"

#include <algorithm>
#include <functional>
#include <iomanip>
#include <sstream>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/random.h"
#include "nn/sequential.h"

namespace mg::nn {

namespace {

int64_t state_buffers(const std::string& optimizer) {
  if (optimizer == "sgd") return 0;
  if (optimizer == "sgd_momentum") return 1;
  if (optimizer == "adam" || optimizer == "adamw") return 2;
  MG_THROW(ValueError, "summary: unknown optimizer \"", optimizer, "\" (known: sgd, sgd_momentum, adam, adamw)");
}

struct Layer {
  std::string name;
  Module* module;
};

void flatten(Module& m, const std::string& name, std::vector<Layer>& out) {
  if (auto* seq = dynamic_cast<Sequential*>(&m)) {
    for (size_t i = 0; i < seq->size(); ++i)
      flatten(*(*seq)[i], name.empty() ? std::to_string(i) : name + "." + std::to_string(i), out);
    return;
  }
  out.push_back({name.empty() ? m.type_name() : name, &m});
}

}  // namespace

ModelSummary summary(Module& model, const Tensor& sample, const SummaryOptions& opts) {
  MG_CHECK(sample.defined(), ValueError, "summary: the sample is undefined");
  const int64_t buffers = state_buffers(opts.optimizer);
  std::vector<Layer> layers;
  flatten(model, "", layers);
  ModelSummary s;
  std::unordered_set<const TensorImpl*> seen;  // shared parameters count once
  const Device dev = sample.device();
  // The model's gradients are stashed and restored: the measured backward must start from
  // none (as after zero_grad(set_to_none)) and must not leave anything behind.
  const auto params = model.parameters();
  std::vector<Tensor> stash;
  for (const Tensor& p : params) {
    stash.push_back(p.grad());
    p.set_grad(Tensor());
  }
  const int64_t base = memory_allocated(dev);
  reset_peak_memory_stats(dev);
  {
    EnableGradGuard grad(true);
    Tensor x = sample;
    // Measured after the previous output is released: an output the next layer does not
    // save (a Linear's before a ReLU, which keeps only its own output) is not activation memory.
    int64_t prev = memory_allocated(dev);
    for (const Layer& l : layers) {
      SummaryRow r;
      r.name = l.name;
      r.type = l.module->type_name();
      for (const Tensor& p : l.module->parameters()) {
        if (!seen.insert(p.impl()).second) continue;
        r.params += p.numel();
        r.param_bytes += p.nbytes();
        if (p.requires_grad()) {
          r.trainable += p.numel();
          r.grad_bytes += p.nbytes();
        }
      }
      x = (*l.module)(x);
      const int64_t now = memory_allocated(dev);
      r.activation_bytes = now - prev;
      prev = now;
      r.output_shape = x.sizes();
      r.output_bytes = x.nbytes();
      s.rows.push_back(r);
    }
    // Backward from a gradient the size of the output (what a loss hands back): its peak
    // holds the activations not yet freed, the gradients so far and the kernels' workspaces.
    if (x.requires_grad()) x.backward(ones_like(x));
  }
  const int64_t fwd_bwd_peak = max_memory_allocated(dev) - base;
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(stash[i]);
  for (const SummaryRow& r : s.rows) {
    s.total_params += r.params;
    s.trainable_params += r.trainable;
    s.parameter_bytes += r.param_bytes;
    s.gradient_bytes += r.grad_bytes;
    s.activation_bytes += r.activation_bytes;
  }
  s.optimizer_bytes = buffers * s.gradient_bytes;
  // Parameters and optimizer state are there throughout; on top, the larger of the
  // forward/backward peak (gradients persisting from the last step add theirs) and the
  // optimizer step's gradients.
  const int64_t fixed = s.parameter_bytes + s.optimizer_bytes;
  const int64_t during_backward = fwd_bwd_peak + (opts.grads_persist ? s.gradient_bytes : 0);
  s.peak_bytes = fixed + std::max(during_backward, s.gradient_bytes);
  s.activations_at_peak = std::max<int64_t>(0, s.peak_bytes - fixed - s.gradient_bytes);
  return s;
}

ModelSummary summary(Module& model, const Shape& input_shape, const SummaryOptions& opts) {
  const auto params = model.parameters();
  const DType dt = params.empty() ? DType::f32 : params.front().dtype();
  const Device dev = params.empty() ? Device::cpu() : params.front().device();
  return summary(model, randn(input_shape, {dt, dev}), opts);
}

std::string ModelSummary::str() const {
  std::ostringstream os;
  auto line = [&] { os << std::string(96, '=') << "\n"; };
  line();
  os << std::left << std::setw(22) << "Layer" << std::setw(20) << "Type" << std::setw(20) << "Output shape"
     << std::right << std::setw(12) << "Params" << std::setw(12) << "Trainable" << std::setw(10) << "Act."
     << "\n";
  line();
  for (const SummaryRow& r : rows)
    os << std::left << std::setw(22) << r.name << std::setw(20) << r.type << std::setw(20) << shape_str(r.output_shape)
       << std::right << std::setw(12) << r.params << std::setw(12) << r.trainable << std::setw(10)
       << format_bytes(r.activation_bytes) << "\n";
  line();
  os << "Total params: " << total_params << " (trainable " << trainable_params << ")\n";
  os << "Estimated peak training memory: " << format_bytes(peak_bytes) << "\n"
     << "  parameters        " << format_bytes(parameter_bytes) << "\n"
     << "  gradients         " << format_bytes(gradient_bytes) << "\n"
     << "  optimizer state   " << format_bytes(optimizer_bytes) << "\n"
     << "  activations       " << format_bytes(activation_bytes) << " kept by the forward; "
     << format_bytes(activations_at_peak) << " of activations and backward workspace at the peak\n";
  line();
  return os.str();
}

}  // namespace mg::nn
