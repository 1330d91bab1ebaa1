#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/device_runtime.h"
#include "kernels/ops.h"
#include "kernels/optim.h"

namespace mg::optim {

namespace {
std::vector<Tensor> grads_of(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    MG_CHECK(params[i].defined(), ValueError, op, ": parameter ", i, " is undefined");
    Tensor g = params[i].grad();
    if (g.defined()) grads.push_back(g);
  }
  return grads;
}
}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  MG_CHECK(std::isfinite(max_norm) && max_norm >= 0.0, ValueError,
           "clip_grad_norm_: max_norm must be finite and >= 0, got ", max_norm);
  MG_CHECK(!std::isnan(norm_type) && norm_type > 0.0, ValueError, "clip_grad_norm_: norm_type must be > 0 or inf, got ",
           norm_type);
  NoGradGuard ng;
  const std::vector<Tensor> grads = grads_of(params, "clip_grad_norm_");
  if (grads.empty()) return 0.0;
  MG_CHECK(!grads[0].is_cuda() || !cuda::is_capturing(grads[0].device().index), ValueError,
           "clip_grad_norm_ returns the norm on the host, which a CUDA graph capture cannot read; use "
           "clip_grad_norm_on_device_ inside a captured step");
  const double total = kernels::multi_tensor_norm(grads, norm_type);
  MG_CHECK(!error_if_nonfinite || std::isfinite(total), ValueError, "clip_grad_norm_: the total norm of order ",
           norm_type, " of the gradients of ", grads.size(), " parameters is ", total,
           " (non-finite), so it cannot be clipped; pass error_if_nonfinite=false to scale by it anyway");
  // PyTorch clamps the coefficient at 1 and always multiplies; a factor of exactly 1 changes
  // nothing, so that launch is skipped. NaN stays NaN (std::min keeps its first argument).
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  if (coef != 1.0) kernels::multi_tensor_scale_(grads, coef);
  return total;
}

Tensor clip_grad_norm_on_device_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  NoGradGuard ng;
  const std::vector<Tensor> grads = grads_of(params, "clip_grad_norm_on_device_");
  if (grads.empty()) return Tensor();
  return kernels::multi_tensor_clip_(grads, max_norm, norm_type);
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  MG_CHECK(!std::isnan(clip_value) && clip_value >= 0.0, ValueError, "clip_grad_value_: clip_value must be >= 0, got ",
           clip_value);
  NoGradGuard ng;
  for (const Tensor& g : grads_of(params, "clip_grad_value_"))
    kernels::copy_(g, kernels::clamp(g, -clip_value, clip_value));
}

}  // namespace mg::optim
