// The CPU has no flash-attention kernels: attention_kernel (kernels/attention.cc) picks the
// composed path for CPU tensors, so reaching these is a dispatch bug, reported as such.
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {

template <>
void CpuBackend::flash_attention_forward(AttentionKernel, const Tensor& q, const Tensor&, const Tensor&, bool, double,
                                         const Tensor&, const Tensor&) {
  MG_THROW(DeviceError, "flash_attention_forward: no flash kernels for ", q.device(),
           " (attention_kernel chooses the composed path there)");
}

template <>
void CpuBackend::flash_attention_backward(AttentionKernel, const Tensor&, const Tensor& q, const Tensor&, const Tensor&,
                                          const Tensor&, const Tensor&, bool, double, const Tensor&, const Tensor&,
                                          const Tensor&, bool) {
  MG_THROW(DeviceError, "flash_attention_backward: no flash kernels for ", q.device(),
           " (attention_kernel chooses the composed path there)");
}

}  // namespace mg::kernels
