#include "memory/host_params.h"

#include "autograd/autocast_policy.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "kernels/ops.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace mg::memory {

HostParams::HostParams(std::vector<Tensor> params, Device device, DType cast_dtype)
    : params_(std::move(params)), device_(device), cast_dtype_(cast_dtype) {
  const char* op = "HostParams";
  MG_CHECK(device.is_cuda(), DeviceError, op, ": the parameters are read on a CUDA device, got ", device);
  MG_CHECK(cast_dtype == DType::bf16 || cast_dtype == DType::f16, DTypeError, op,
           ": the device casts are f16 or bf16, got ", cast_dtype);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined() && p.dtype() == DType::f32 && p.is_leaf() && p.requires_grad() && p.is_contiguous() &&
                 p.device() == device && !p.grad().defined(),
             ValueError, op, ": params[", i, "] must be a contiguous f32 leaf that requires grad, on ", device,
             ", without a gradient; got ",
             p.defined() ? detail::format(p.dtype(), " ", shape_str(p.sizes()), " on ", p.device(),
                                          p.grad().defined() ? " with a gradient" : "")
                         : std::string("undefined"));
  }
  NoGradGuard ng;
  for (const Tensor& p : params_) nn::retarget(p, cuda::pin_memory(raw::to_device(p, Device::cpu())));
}

void HostParams::provide_casts() const {
  NoGradGuard ng;
  // The next forward's memory, counted as the casts that forward would make.
  MemoryCategoryGuard act(MemoryCategory::Activations);
  for (const Tensor& p : params_) autocast::provide_cast(p, raw::to_device(kernels::cast(p, cast_dtype_), device_));
}

int64_t HostParams::host_bytes() const {
  int64_t n = 0;
  for (const Tensor& p : params_) n += p.nbytes();
  return n;
}

std::vector<Tensor> gpt_linear_params(nn::GPT& model) {
  std::vector<Tensor> out;
  for (const auto& [name, m] : model.h->named_modules())
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) {
      out.push_back(lin->weight);
      if (lin->bias.defined()) out.push_back(lin->bias);
    }
  return out;
}

}  // namespace mg::memory
