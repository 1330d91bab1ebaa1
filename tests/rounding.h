// Error bounds derived from floating-point rounding, for tests that compare a low-precision
// result with an f64 reference computed from the very (already rounded) inputs the kernel saw.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "core/tensor.h"

namespace mg::testing {

// Unit roundoff u, half the spacing of dtype t at 1: rounding x to t moves it by at most u |x|
// (normal range). f64 2^-53, f32 2^-24, f16 2^-11, bf16 2^-8; 0 for integer types.
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64:
      return std::ldexp(1.0, -53);
    case DType::f32:
      return std::ldexp(1.0, -24);
    case DType::f16:
      return std::ldexp(1.0, -11);
    case DType::bf16:
      return std::ldexp(1.0, -8);
    default:
      return 0;
  }
}

// gamma_k = k u / (1 - k u): a sum of k terms accumulated in dtype acc, in any order, is off by
// at most gamma_k times the sum of the terms' magnitudes (Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., section 3.1). A dot product of k products is a sum of k terms.
inline double gamma_k(int64_t k, DType acc) {
  const double ku = static_cast<double>(k) * unit_roundoff(acc);
  return ku / (1 - ku);
}

// The values of t after rounding to dtype dt, as f64: the inputs a dt kernel actually sees.
inline Tensor rounded_f64(const Tensor& t, DType dt) { return raw::to_dtype(raw::to_dtype(t, dt), DType::f64); }

// |got - ref| <= bound elementwise; the first failures are listed with their bounds.
inline ::testing::AssertionResult within(const Tensor& got, const Tensor& ref, const std::vector<double>& bound) {
  if (got.sizes() != ref.sizes())
    return ::testing::AssertionFailure() << "shape " << shape_str(got.sizes()) << " vs reference "
                                         << shape_str(ref.sizes());
  const std::vector<double> g = got.to_vector<double>(), r = ref.to_vector<double>();
  if (bound.size() != r.size()) return ::testing::AssertionFailure() << "bound has " << bound.size() << " elements";
  std::ostringstream diff;
  int64_t bad = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (std::abs(g[i] - r[i]) <= bound[i]) continue;
    if (bad++ < 5)
      diff << "\n  element " << i << ": " << g[i] << " vs reference " << r[i] << " (diff " << std::abs(g[i] - r[i])
           << ", bound " << bound[i] << ")";
  }
  if (bad) return ::testing::AssertionFailure() << bad << " of " << r.size() << " elements off" << diff.str();
  return ::testing::AssertionSuccess();
}

// The bound for a sum of k products accumulated in `acc` and rounded once to `out`, against the
// exact f64 value `ref` of the same rounded inputs, where `mag` is the same sum over the terms'
// magnitudes (for a bilinear op: the op applied to |a| and |b|). The accumulation costs
// gamma_k(acc) * mag; the final rounding u(out) times the accumulated value, which is within
// |ref| + gamma_k * mag. The f64 reference's own error, gamma_k(f64) * mag, is added too.
inline std::vector<double> dot_bound(const Tensor& ref, const Tensor& mag, int64_t k, DType acc, DType out) {
  const std::vector<double> r = ref.to_vector<double>(), m = mag.to_vector<double>();
  const double u = unit_roundoff(out), g = gamma_k(k, acc), g64 = gamma_k(k, DType::f64);
  std::vector<double> b(r.size());
  for (size_t i = 0; i < r.size(); ++i) b[i] = u * std::abs(r[i]) + (1 + u) * g * m[i] + g64 * m[i];
  return b;
}

}  // namespace mg::testing
