// The CPU backend: kernels/backend.h implemented with loops and Eigen, one file per op family;
// the declaration both backends share is kernels/backend_impl.h.
#pragma once

#include "kernels/backend_impl.h"
#include "kernels/parallel.h"

namespace mg::kernels {

using CpuBackend = BackendImpl<DeviceType::CPU>;

}  // namespace mg::kernels
