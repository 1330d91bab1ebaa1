// Helpers shared by the kernels tests: building tensors, comparing to expected values,
// and checking that a call raises the right mg::Error subclass naming the op.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace mg::testing {

inline Tensor T(std::initializer_list<double> v, const Shape& s, DType dt = DType::f32) { return tensor(v, s, {dt}); }

inline std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

inline void expect_near(const Tensor& t, const std::vector<double>& want, double tol = 1e-5) {
  std::vector<double> got = vals(t);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "at " << i;
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "at " << i;
    }
  }
}

inline void expect_close(const Tensor& a, const Tensor& b, double tol = 1e-5) {
  ASSERT_EQ(a.sizes(), b.sizes()) << shape_str(a.sizes()) << " vs " << shape_str(b.sizes());
  expect_near(a, vals(b), tol);
}

}  // namespace mg::testing

// Expects `stmt` to throw ErrType whose message contains `substr`.
#define EXPECT_MG_ERROR(stmt, ErrType, substr)                                                  \
  do {                                                                                          \
    try {                                                                                       \
      stmt;                                                                                     \
      ADD_FAILURE() << "expected " #ErrType " from " #stmt;                                     \
    } catch (const ErrType& e) {                                                                \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos)                          \
          << "message '" << e.what() << "' does not mention '" << substr << "'";                \
    } catch (const std::exception& e) {                                                         \
      ADD_FAILURE() << "expected " #ErrType " from " #stmt ", got another error: " << e.what(); \
    }                                                                                           \
  } while (0)
