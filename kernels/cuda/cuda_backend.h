// The CUDA backend: kernels/backend.h implemented with our kernels, cuBLAS(Lt) and cuDNN, one
// file per op family; the declaration both backends share is kernels/backend_impl.h.
#pragma once

#include "kernels/backend_impl.h"

namespace mg::kernels {

using CudaBackend = BackendImpl<DeviceType::CUDA>;

}  // namespace mg::kernels
