// Registers the CUDA backend with kernels/backend.cc when this library is linked (alwayslink):
// a build without CUDA never links it, and backend(cuda_device, op) then raises DeviceError.
#include "kernels/cuda/cuda_backend.h"

namespace mg::kernels::cuda {
namespace {

CudaBackend& instance() {
  static CudaBackend b;
  return b;
}

const bool registered = register_backend(DeviceType::CUDA, &instance());

}  // namespace
}  // namespace mg::kernels::cuda
