// Finite-difference gradient checking for any differentiable memgrad function: analytic
// gradients from backward() against central differences, in f64, with a readable diff.
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
inline ::testing::AssertionResult gradcheck(const GradFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6,
                                            double atol = 1e-5, double rtol = 1e-4) {
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
        return ::testing::AssertionFailure() << "gradcheck: input " << i << " requires grad but is " << t.dtype()
                                             << "; finite differences need f64";
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
      diff << "\n  input " << i << ": gradient has shape " << shape_str(g.sizes()) << " " << g.dtype()
           << ", expected " << shape_str(leaves[i].sizes()) << " " << leaves[i].dtype();
      ++bad;
      continue;
    }
    std::vector<double> analytic = g.defined() ? g.to_vector<double>() : std::vector<double>(leaves[i].numel(), 0.0);
    double* p = xs[i].data_ptr<double>();
    double max_err = 0;
    int shown = 0, wrong = 0;
    for (int64_t j = 0; j < xs[i].numel(); ++j) {
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
      diff << "\n  input " << i << ": " << wrong << " of " << xs[i].numel() << " elements differ, max abs diff "
           << max_err;
      ++bad;
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << "gradcheck failed (eps " << eps << ", atol " << atol << ", rtol " << rtol
                                         << "):" << diff.str();
  return ::testing::AssertionSuccess();
}

}  // namespace mg
