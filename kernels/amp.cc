// Checks and dispatch for kernels/amp.h; the loops are in cpu/amp.cc and cuda/amp.cu, which
// share the per-element rules of amp_math.h.
#include "kernels/amp.h"

#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {

namespace {

// Runs `f` on a contiguous tensor with t's values and writes the result back into t.
template <class F>
void on_contiguous(const Tensor& t, F f) {
  if (t.is_contiguous()) return f(t);
  Tensor c = raw::contiguous(t);
  f(c);
  raw::copy_(t, c);
}

}  // namespace

namespace {
void unscale_impl(const std::vector<Tensor>& grads, const Tensor& found_inf, double inv_scale, const Tensor& scale) {
  const char* op = "amp_unscale_";
  MG_CHECK(found_inf.defined() && found_inf.numel() == 1, ShapeError, op,
           ": found_inf must be a one-element tensor, got ",
           found_inf.defined() ? shape_str(found_inf.sizes()) : std::string("an undefined tensor"));
  MG_CHECK(found_inf.dtype() == DType::f32, DTypeError, op, ": found_inf must be f32, got ", found_inf.dtype());
  MG_CHECK(std::isfinite(inv_scale), ValueError, op, ": inv_scale must be finite, got ", inv_scale);
  const Device dev = found_inf.device();
  MG_CHECK(!scale.defined() || (scale.numel() == 1 && scale.dtype() == DType::f32 && scale.device() == dev), ValueError,
           op, ": the device scale must be a one-element f32 tensor on ", dev);
  std::vector<Tensor> work;  // contiguous views the kernels write; copied back below when needed
  work.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    MG_CHECK(g.device() == dev, DeviceError, op, ": gradient ", i, " is on ", g.device(), " but found_inf is on ", dev);
    MG_CHECK(is_floating(g.dtype()), DTypeError, op, ": gradient ", i, " has non-floating dtype ", g.dtype());
    work.push_back(g.is_contiguous() ? g : raw::contiguous(g));
  }
  backend(dev, op).amp_unscale(work, found_inf, static_cast<float>(inv_scale), scale);
  size_t k = 0;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    if (!work[k].is_same(g)) raw::copy_(g, work[k]);
    g.bump_version();
    ++k;
  }
}
}  // namespace

void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, double inv_scale) {
  unscale_impl(grads, found_inf, inv_scale, Tensor());
}
void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& scale) {
  MG_CHECK(scale.defined(), ValueError, "amp_unscale_: undefined device scale");
  unscale_impl(grads, found_inf, 1.0, scale);
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped,
                       const Tensor& found_inf, double growth_factor, double backoff_factor, int64_t growth_interval) {
  const char* op = "amp_update_scale_";
  MG_CHECK(scale.defined(), ValueError, op, ": undefined scale");
  const Device dev = scale.device();
  auto check = [&](const char* what, const Tensor& t, DType dt) {
    MG_CHECK(t.defined() && t.numel() == 1 && t.dtype() == dt && t.device() == dev && t.is_contiguous(), ValueError, op,
             ": ", what, " must be a one-element ", dt, " tensor on ", dev);
  };
  check("scale", scale, DType::f32);
  check("found_inf", found_inf, DType::f32);
  check("growth_tracker", growth_tracker, DType::i64);
  check("skipped", skipped, DType::i64);
  MG_CHECK(growth_interval > 0 && growth_factor > 1.0 && backoff_factor > 0.0 && backoff_factor < 1.0, ValueError, op,
           ": growth_interval ", growth_interval, ", growth_factor ", growth_factor, ", backoff_factor ",
           backoff_factor, " out of range");
  backend(dev, op).amp_update_scale(scale, growth_tracker, skipped, found_inf, growth_factor, backoff_factor,
                                    growth_interval);
  for (const Tensor* t : {&scale, &growth_tracker, &skipped}) t->bump_version();
}

void add_stochastic_bf16_(const Tensor& param, const Tensor& update, double alpha, uint64_t seed) {
  const char* op = "add_stochastic_bf16_";
  MG_CHECK(param.defined() && update.defined(), ValueError, op, ": undefined tensor");
  MG_CHECK(param.dtype() == DType::bf16, DTypeError, op, ": param must be bf16, got ", param.dtype());
  MG_CHECK(is_floating(update.dtype()), DTypeError, op, ": update must be floating, got ", update.dtype());
  MG_CHECK(param.sizes() == update.sizes(), ShapeError, op, ": param shape ", shape_str(param.sizes()),
           " and update shape ", shape_str(update.sizes()), " differ");
  MG_CHECK(param.device() == update.device(), DeviceError, op, ": param on ", param.device(), ", update on ",
           update.device());
  Tensor u = update.dtype() == DType::f32 || update.dtype() == DType::bf16 ? raw::contiguous(update)
                                                                           : raw::to_dtype(update, DType::f32);
  if (!u.is_contiguous()) u = raw::contiguous(u);
  on_contiguous(param, [&](const Tensor& p) {
    backend(p.device(), op).add_stochastic_bf16(p, u, static_cast<float>(alpha), seed);
  });
  param.bump_version();
}

}  // namespace mg::kernels
