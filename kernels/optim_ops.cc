// Validation and dispatch for kernels/optim_ops.h, and the CPU loops (which share the
// per-element rules of optim_math.h with the CUDA kernels).
#include "kernels/optim_ops.h"

#include <cmath>
#include <limits>
#include <map>

#include "kernels/ops.h"
#include "kernels/optim_math.h"

#ifdef MG_WITH_CUDA
#include "kernels/cuda/optim_cuda.h"
#endif

namespace mg::kernels {
namespace {

bool device_has_fused(const Device& d) {
#ifdef MG_WITH_CUDA
  return true;
#else
  return !d.is_cuda();
#endif
}

bool dtype_fusable(const Tensor& t) {
  return t.dtype() == DType::f32 || (t.dtype() == DType::f64 && !t.is_cuda());
}

// Every list has params.size() entries, each defined, contiguous, of params[0]'s device and
// dtype and of its parameter's shape.
void check_lists(const char* op, const std::vector<Tensor>& params,
                 std::initializer_list<std::pair<const char*, const std::vector<Tensor>*>> lists) {
  if (params.empty()) return;
  const Device dev = params[0].device();
  const DType dt = params[0].dtype();
  MG_CHECK(dtype_fusable(params[0]), DTypeError, op, ": dtype ", dt, " on ", dev,
           " has no fused update (f32, or f64 on the CPU)");
  MG_CHECK(device_has_fused(dev), DeviceError, op, ": ", dev, " tensors in a build without CUDA");
  auto check_one = [&](const char* what, size_t i, const Tensor& t) {
    MG_CHECK(t.defined(), ValueError, op, ": ", what, "[", i, "] is undefined");
    MG_CHECK(t.device() == dev, DeviceError, op, ": ", what, "[", i, "] is on ", t.device(), ", params[0] on ", dev);
    MG_CHECK(t.dtype() == dt, DTypeError, op, ": ", what, "[", i, "] has dtype ", t.dtype(), ", params[0] has ", dt);
    MG_CHECK(t.is_contiguous(), ValueError, op, ": ", what, "[", i, "] (shape ", shape_str(t.sizes()),
             ") is not contiguous");
    MG_CHECK(t.sizes() == params[i].sizes(), ShapeError, op, ": ", what, "[", i, "] has shape ", shape_str(t.sizes()),
             ", its parameter ", shape_str(params[i].sizes()));
  };
  for (size_t i = 0; i < params.size(); ++i) check_one("params", i, params[i]);
  for (auto& [what, list] : lists) {
    MG_CHECK(list->size() == params.size(), ValueError, op, ": ", what, " has ", list->size(), " tensors, params ",
             params.size());
    for (size_t i = 0; i < list->size(); ++i) check_one(what, i, (*list)[i]);
  }
}

template <class T>
void adam_cpu(const AdamTensors& t, const AdamHyper& h) {
  const optim_math::AdamScalars<T> s{T(h.lr), T(h.beta1), T(h.beta2), T(h.eps), T(h.weight_decay),
                                     h.decoupled_weight_decay, h.amsgrad, h.maximize};
  for (size_t i = 0; i < t.params.size(); ++i) {
    const double st = static_cast<double>(t.steps[i]);
    const T step_size = T(h.lr / (1.0 - std::pow(h.beta1, st)));
    const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(h.beta2, st)));
    T* p = t.params[i].data_ptr<T>();
    const T* g = t.grads[i].data_ptr<T>();
    T* m = t.exp_avg[i].data_ptr<T>();
    T* v = t.exp_avg_sq[i].data_ptr<T>();
    T* vmax = h.amsgrad ? t.max_exp_avg_sq[i].data_ptr<T>() : nullptr;
    const int64_t n = t.params[i].numel();
    for (int64_t j = 0; j < n; ++j)
      optim_math::adam_element<T>(p[j], g[j], m[j], v[j], vmax ? vmax + j : nullptr, s, step_size, bc2_sqrt);
  }
}

template <class T>
void sgd_cpu(const SGDTensors& t, const SGDHyper& h) {
  const optim_math::SGDScalars<T> s{T(h.lr), T(h.momentum), T(h.dampening), T(h.weight_decay), h.nesterov,
                                    h.maximize};
  for (size_t i = 0; i < t.params.size(); ++i) {
    T* p = t.params[i].data_ptr<T>();
    const T* g = t.grads[i].data_ptr<T>();
    T* buf = t.momentum_buffers.empty() ? nullptr : t.momentum_buffers[i].data_ptr<T>();
    const bool first = !t.first_step.empty() && t.first_step[i];
    const int64_t n = t.params[i].numel();
    for (int64_t j = 0; j < n; ++j) optim_math::sgd_element<T>(p[j], g[j], buf ? buf + j : nullptr, first, s);
  }
}

// Sum of |x|^p (max |x| for p = inf) over one CPU tensor, accumulated in double.
double cpu_norm_partial(const Tensor& t0, double p) {
  const Tensor t = t0.contiguous();
  const int64_t n = t.numel();
  double acc = 0.0;
  MG_DISPATCH_FLOAT(t.dtype(), "multi_tensor_norm", [&] {
    const scalar_t* x = static_cast<const scalar_t*>(t.raw_data());
    for (int64_t j = 0; j < n; ++j) {
      const double a = std::fabs(static_cast<double>(static_cast<opmath_t<scalar_t>>(x[j])));
      if (std::isinf(p)) {
        if (a > acc || std::isnan(a)) acc = a;  // a NaN, once seen, stays
      } else if (p == 2.0) {
        acc += a * a;
      } else if (p == 1.0) {
        acc += a;
      } else {
        acc += std::pow(a, p);
      }
    }
  });
  return acc;
}

}  // namespace

bool multi_tensor_supported(const Tensor& t) {
  return t.defined() && t.is_contiguous() && dtype_fusable(t) && device_has_fused(t.device());
}

void adam_multi_tensor_(const AdamTensors& t, const AdamHyper& h) {
  const char* op = "adam_multi_tensor_";
  if (t.params.empty()) return;
  check_lists(op, t.params, {{"grads", &t.grads}, {"exp_avg", &t.exp_avg}, {"exp_avg_sq", &t.exp_avg_sq}});
  if (h.amsgrad) check_lists(op, t.params, {{"max_exp_avg_sq", &t.max_exp_avg_sq}});
  MG_CHECK(t.steps.size() == t.params.size(), ValueError, op, ": ", t.steps.size(), " step counts for ",
           t.params.size(), " params");
  for (size_t i = 0; i < t.steps.size(); ++i)
    MG_CHECK(t.steps[i] >= 1, ValueError, op, ": step count of params[", i, "] is ", t.steps[i], " (must be >= 1)");
  const Device dev = t.params[0].device();
#ifdef MG_WITH_CUDA
  if (dev.is_cuda()) cuda::adam_multi_tensor(t, h);
  else
#endif
  if (t.params[0].dtype() == DType::f64) adam_cpu<double>(t, h);
  else adam_cpu<float>(t, h);
  (void)dev;
  for (const Tensor& p : t.params) p.bump_version();
}

void sgd_multi_tensor_(const SGDTensors& t, const SGDHyper& h) {
  const char* op = "sgd_multi_tensor_";
  if (t.params.empty()) return;
  check_lists(op, t.params, {{"grads", &t.grads}});
  if (h.momentum != 0.0) {
    check_lists(op, t.params, {{"momentum_buffers", &t.momentum_buffers}});
    MG_CHECK(t.first_step.size() == t.params.size(), ValueError, op, ": ", t.first_step.size(),
             " first-step flags for ", t.params.size(), " params");
  }
  SGDTensors u = t;
  if (h.momentum == 0.0) u.momentum_buffers.clear();
#ifdef MG_WITH_CUDA
  if (t.params[0].is_cuda()) cuda::sgd_multi_tensor(u, h);
  else
#endif
  if (t.params[0].dtype() == DType::f64) sgd_cpu<double>(u, h);
  else sgd_cpu<float>(u, h);
  for (const Tensor& p : t.params) p.bump_version();
}

double multi_tensor_norm(const std::vector<Tensor>& ts, double norm_type) {
  MG_CHECK(!std::isnan(norm_type) && norm_type > 0.0, ValueError, "multi_tensor_norm: norm_type must be > 0 (or inf), got ",
           norm_type);
  const bool inf = std::isinf(norm_type);
  // One partial per device: CUDA f32 tensors of a device share launches; the rest (other
  // dtypes, strided views) are made contiguous f32 copies first on CUDA, or looped on the CPU.
  std::map<std::pair<int, int>, std::vector<Tensor>> by_device;
  double total = 0.0;
  auto combine = [&](double part) {
    if (inf) total = (std::isnan(total) || total >= part) ? total : part;  // a NaN, once seen, stays
    else total += part;
  };
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    MG_CHECK(t.defined(), ValueError, "multi_tensor_norm: tensor ", i, " is undefined");
    MG_CHECK(is_floating(t.dtype()), DTypeError, "multi_tensor_norm: tensor ", i, " has dtype ", t.dtype(),
             " (expected floating)");
    if (t.numel() == 0) continue;
    if (!t.is_cuda()) {
      combine(cpu_norm_partial(t, norm_type));
      continue;
    }
    MG_CHECK(device_has_fused(t.device()), DeviceError, "multi_tensor_norm: ", t.device(),
             " tensor in a build without CUDA");
    by_device[{static_cast<int>(t.device().type), t.device().index}].push_back(
        t.dtype() == DType::f32 && t.is_contiguous() ? t : kernels::cast(t.contiguous(), DType::f32));
  }
#ifdef MG_WITH_CUDA
  for (auto& [key, list] : by_device) combine(cuda::multi_tensor_norm_partial(list, norm_type));
#endif
  if (inf) return total;
  return norm_type == 1.0 ? total : (norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type));
}

void multi_tensor_scale_(const std::vector<Tensor>& ts, double scale) {
  std::vector<Tensor> fused;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    MG_CHECK(t.defined(), ValueError, "multi_tensor_scale_: tensor ", i, " is undefined");
    MG_CHECK(is_floating(t.dtype()), DTypeError, "multi_tensor_scale_: tensor ", i, " has dtype ", t.dtype(),
             " (expected floating)");
    if (t.is_cuda() && t.dtype() == DType::f32 && t.is_contiguous()) {
      fused.push_back(t);
    } else {
      kernels::binary_(Binary::Mul, t, scalar_tensor(scale, {t.dtype(), t.device()}));
    }
  }
#ifdef MG_WITH_CUDA
  // Grouped by device: one list per launch sequence.
  std::map<int, std::vector<Tensor>> by_device;
  for (auto& t : fused) by_device[t.device().index].push_back(t);
  for (auto& [d, list] : by_device) {
    cuda::multi_tensor_scale(list, scale);
    for (auto& t : list) t.bump_version();
  }
#else
  MG_CHECK(fused.empty(), DeviceError, "multi_tensor_scale_: CUDA tensors in a build without CUDA");
#endif
}

}  // namespace mg::kernels
