// The test helpers every op test shares: finite-difference gradient checking (analytic
// gradients from backward() against central differences, in f64) and device parity.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/random.h"

namespace mg {

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks d fn / d inputs[i] for every input that requires grad (those must be f64).
// fn may return any shape: a non-scalar output is contracted with fixed random weights, so
// every output element matters (a plain sum would hide e.g. softmax errors, whose gradients
// sum to zero). fn is evaluated many times: it must be deterministic (reseed inside it if it
// draws random numbers) and must not modify its inputs in place.
// Passes when |analytic - numeric| <= atol + rtol * |numeric| for every element.
// max_checked > 0 checks only that many elements per input, spread evenly (first and last
// included): each element costs two evaluations of fn, so large parity-sized inputs would
// otherwise take minutes; every element is still compared on the device by the parity check.
inline ::testing::AssertionResult gradcheck(const GradFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6,
                                            double atol = 1e-5, double rtol = 1e-4, int64_t max_checked = 0) {
  // Fresh leaves, so the caller's tensors and their .grad stay untouched.
  std::vector<Tensor> leaves;
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) {
      leaves.push_back(t);
      continue;
    }
    Tensor c = raw::clone(t);
    if (t.requires_grad()) {
      if (t.dtype() != DType::f64)
        return ::testing::AssertionFailure()
               << "gradcheck: input " << i << " requires grad but is " << t.dtype() << "; finite differences need f64";
      c.requires_grad_(true);
      checked.push_back(i);
    }
    leaves.push_back(c);
  }
  if (checked.empty()) return ::testing::AssertionFailure() << "gradcheck: no input requires grad";

  Tensor out;
  {
    EnableGradGuard grad_on(true);
    out = fn(leaves);
  }
  if (!out.defined()) return ::testing::AssertionFailure() << "gradcheck: fn returned an undefined tensor";
  if (!out.requires_grad())
    return ::testing::AssertionFailure() << "gradcheck: the output (shape " << shape_str(out.sizes())
                                         << ") does not require grad: no input that requires grad reaches it";
  Generator wgen(0x9c4ecc);
  Tensor w = out.numel() == 1 ? ones(out.sizes(), {DType::f64}) : randn(out.sizes(), {DType::f64}, &wgen);
  const std::vector<double> wv = w.to_vector<double>();
  try {
    EnableGradGuard grad_on(true);
    out.backward(w);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "gradcheck: backward threw: " << e.what();
  }

  // Plain copies for the numeric side (perturbed element by element).
  std::vector<Tensor> xs;
  for (const Tensor& t : leaves) xs.push_back(t.defined() ? raw::clone(t) : t);
  auto f = [&]() {
    NoGradGuard no_grad;
    Tensor o = fn(xs);
    std::vector<double> ov = o.to_vector<double>();
    double acc = 0;
    for (size_t k = 0; k < ov.size(); ++k) acc += ov[k] * wv[k];
    return acc;
  };

  std::ostringstream diff;
  int bad = 0;
  for (size_t i : checked) {
    Tensor g = leaves[i].grad();
    if (g.defined() && (g.sizes() != leaves[i].sizes() || g.dtype() != leaves[i].dtype())) {
      diff << "\n  input " << i << ": gradient has shape " << shape_str(g.sizes()) << " " << g.dtype() << ", expected "
           << shape_str(leaves[i].sizes()) << " " << leaves[i].dtype();
      ++bad;
      continue;
    }
    std::vector<double> analytic = g.defined() ? g.to_vector<double>() : std::vector<double>(leaves[i].numel(), 0.0);
    double* p = xs[i].data_ptr<double>();
    double max_err = 0;
    int shown = 0, wrong = 0;
    const int64_t n = xs[i].numel();
    const int64_t step = max_checked > 1 && n > max_checked ? (n - 1) / (max_checked - 1) : 1;
    int64_t tried = 0;
    for (int64_t j = 0; j < n; j = (j + step < n || j == n - 1) ? j + step : n - 1, ++tried) {
      const double orig = p[j];
      p[j] = orig + eps;
      const double fp = f();
      p[j] = orig - eps;
      const double fm = f();
      p[j] = orig;
      const double numeric = (fp - fm) / (2 * eps);
      const double err = std::abs(analytic[j] - numeric);
      max_err = std::max(max_err, err);
      if (!(err <= atol + rtol * std::abs(numeric))) {  // also catches NaN
        ++wrong;
        if (shown++ < 6)
          diff << "\n  input " << i << " " << shape_str(leaves[i].sizes()) << " element " << j << ": analytic "
               << analytic[j] << " vs numeric " << numeric << " (diff " << err << ")";
      }
    }
    if (wrong) {
      diff << "\n  input " << i << ": " << wrong << " of " << tried << " checked elements differ, max abs diff "
           << max_err;
      ++bad;
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << "gradcheck failed (eps " << eps << ", atol " << atol << ", rtol " << rtol
                                         << "):" << diff.str();
  return ::testing::AssertionSuccess();
}

// Device parity: `got` (any device, any floating dtype) against a reference `ref` of the same
// shape: |ref - got| <= tol * (|ref| + rms(ref)) + atol elementwise, so a tolerance is relative
// to the element or, for elements near zero, to the tensor's scale (cancellation leaves absolute
// error of that size); atol covers subnormal results, whose spacing is absolute. NaN must meet
// NaN, an infinity the same infinity.
inline ::testing::AssertionResult parity(const Tensor& ref, const Tensor& got, double tol, double atol = 0) {
  if (!ref.defined() || !got.defined())
    return ::testing::AssertionFailure() << "parity: " << (ref.defined() ? "result" : "reference") << " is undefined";
  if (ref.sizes() != got.sizes())
    return ::testing::AssertionFailure() << "parity: shape " << shape_str(got.sizes()) << " vs reference "
                                         << shape_str(ref.sizes());
  const std::vector<double> a = ref.to_vector<double>(), b = got.to_vector<double>();
  double rms = 0;
  int64_t finite = 0;
  for (double x : a)
    if (std::isfinite(x)) rms += x * x, ++finite;
  rms = finite ? std::sqrt(rms / finite) : 0;
  std::ostringstream diff;
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - b[i]);
    const bool ok = std::isnan(a[i])   ? std::isnan(b[i])
                    : std::isinf(a[i]) ? a[i] == b[i]
                                       : err <= tol * (std::abs(a[i]) + rms) + atol;
    if (ok) continue;
    if (std::isfinite(a[i])) worst = std::max(worst, err / (std::abs(a[i]) + rms));
    if (bad++ < 5) diff << "\n  element " << i << ": reference " << a[i] << " vs " << b[i] << " (diff " << err << ")";
  }
  if (bad)
    return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements of " << shape_str(ref.sizes())
                                         << " (" << got.dtype() << " on " << got.device() << ") off by more than "
                                         << tol << " x (|ref| + rms " << rms << "), worst " << worst << diff.str();
  return ::testing::AssertionSuccess();
}

}  // namespace mg
