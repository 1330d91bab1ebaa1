// What the CUDA-vs-CPU parity tests share: inputs made on the CPU and copied to the device,
// dtype names for messages, and a fixture base that skips without a CUDA device.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace mg::testing {

// t copied to CUDA device 0 (an undefined tensor stays undefined).
inline Tensor to_cuda(const Tensor& t) { return t.defined() ? raw::to_device(t, Device::cuda(0)) : t; }

// Uniform values in [lo, hi) of dtype `dt` on the CPU (integers: rounded down; bool: above the
// middle of the range).
inline Tensor host(const Shape& s, DType dt, Generator& g, double lo = -2, double hi = 2) {
  Tensor f = uniform(s, lo, hi, {DType::f64}, &g);
  if (dt == DType::b8) return kernels::binary(kernels::Binary::Gt, f, scalar_tensor(0.5 * (lo + hi), {DType::f64}));
  if (!is_floating(dt)) {
    std::vector<double> v = f.to_vector<double>();
    for (double& x : v) x = std::floor(x);
    return raw::to_dtype(from_vector(v, s, {DType::f64}), dt);
  }
  return raw::to_dtype(f, dt);
}

// The dtype's name ("f32", "bf16", ...) for failure messages.
inline std::string dstr(DType t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

// The parity fixtures' base: every test skips without a CUDA device.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace mg::testing
