// Checks and the CPU loops of kernels/amp_ops.h; CUDA tensors go to kernels/cuda/amp.cu.
#include "kernels/amp_ops.h"

#include <cmath>

#include "kernels/amp_math.h"

#ifdef MG_WITH_CUDA
#include "kernels/cuda/amp_cuda.h"
#endif

namespace mg::kernels {

namespace {

template <class T>
bool unscale_cpu(const Tensor& g, double inv_scale) {
  using M = opmath_t<T>;
  T* p = static_cast<T*>(g.raw_data());
  const int64_t n = g.numel();
  const M s = static_cast<M>(inv_scale);
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const M v = static_cast<M>(p[i]);
    bad |= !std::isfinite(v);
    p[i] = static_cast<T>(v * s);
  }
  return bad;
}

template <class U>
void stochastic_cpu(const Tensor& param, const Tensor& update, float alpha, uint64_t seed) {
  auto* p = static_cast<uint16_t*>(param.raw_data());
  const U* u = static_cast<const U*>(update.raw_data());
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = BFloat16::to_float(p[i]) + alpha * static_cast<float>(u[i]);
    p[i] = amp_math::bf16_stochastic_bits(v, static_cast<uint32_t>(amp_math::mix(seed, static_cast<uint64_t>(i))));
  }
}

// Runs `f` on a contiguous tensor with t's values and writes the result back into t.
template <class F>
void on_contiguous(const Tensor& t, F f) {
  if (t.is_contiguous()) return f(t);
  Tensor c = raw::contiguous(t);
  f(c);
  raw::copy_(t, c);
}

}  // namespace

void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, double inv_scale) {
  const char* op = "amp_unscale_";
  MG_CHECK(found_inf.defined() && found_inf.numel() == 1, ShapeError, op,
           ": found_inf must be a one-element tensor, got ",
           found_inf.defined() ? shape_str(found_inf.sizes()) : std::string("an undefined tensor"));
  MG_CHECK(found_inf.dtype() == DType::f32, DTypeError, op, ": found_inf must be f32, got ", found_inf.dtype());
  MG_CHECK(std::isfinite(inv_scale), ValueError, op, ": inv_scale must be finite, got ", inv_scale);
  const Device dev = found_inf.device();
  std::vector<Tensor> work;  // contiguous views the kernels write; copied back below when needed
  work.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    MG_CHECK(g.device() == dev, DeviceError, op, ": gradient ", i, " is on ", g.device(), " but found_inf is on ", dev);
    MG_CHECK(is_floating(g.dtype()), DTypeError, op, ": gradient ", i, " has non-floating dtype ", g.dtype());
    work.push_back(g.is_contiguous() ? g : raw::contiguous(g));
  }
#ifdef MG_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::amp_unscale(work, found_inf, static_cast<float>(inv_scale));
  } else
#endif
  {
    MG_CHECK(!dev.is_cuda(), DeviceError, op, ": this build has no CUDA kernels");
    bool bad = false;
    for (const Tensor& g : work) MG_DISPATCH_FLOAT(g.dtype(), op, [&] { bad |= unscale_cpu<scalar_t>(g, inv_scale); });
    if (bad) raw::fill_(found_inf, 1.0);
  }
  size_t k = 0;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    if (!work[k].is_same(g)) raw::copy_(g, work[k]);
    g.bump_version();
    ++k;
  }
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
#ifdef MG_WITH_CUDA
    if (p.is_cuda()) return cuda::add_stochastic_bf16(p, u, static_cast<float>(alpha), seed);
#endif
    MG_CHECK(!p.is_cuda(), DeviceError, op, ": this build has no CUDA kernels");
    if (u.dtype() == DType::f32)
      stochastic_cpu<float>(p, u, static_cast<float>(alpha), seed);
    else
      stochastic_cpu<BFloat16>(p, u, static_cast<float>(alpha), seed);
  });
  param.bump_version();
}

void batch_norm_update_stats_(const Tensor& running_mean, const Tensor& running_var, const Tensor& mean,
                              const Tensor& invstd, int64_t count, double momentum, double eps) {
  const char* op = "batch_norm_update_stats_";
  for (const Tensor* t : {&running_mean, &running_var, &mean, &invstd})
    MG_CHECK(t->defined(), ValueError, op, ": undefined tensor");
  MG_CHECK(running_mean.dtype() == DType::f32 && running_var.dtype() == DType::f32, DTypeError, op,
           ": running statistics must be f32, got ", running_mean.dtype(), " and ", running_var.dtype());
  MG_CHECK(mean.dtype() == invstd.dtype() && is_floating(mean.dtype()), DTypeError, op,
           ": mean and invstd must share one floating dtype, got ", mean.dtype(), " and ", invstd.dtype());
  const int64_t c = running_mean.numel();
  for (const Tensor* t : {&running_var, &mean, &invstd})
    MG_CHECK(t->dim() == 1 && t->numel() == c && t->is_contiguous(), ShapeError, op,
             ": expected contiguous [", c, "] tensors, got ", shape_str(t->sizes()));
  MG_CHECK(running_mean.dim() == 1 && running_mean.is_contiguous(), ShapeError, op,
           ": running_mean must be a contiguous 1-D tensor, got ", shape_str(running_mean.sizes()));
  for (const Tensor* t : {&running_var, &mean, &invstd})
    MG_CHECK(t->device() == running_mean.device(), DeviceError, op, ": tensors on ", running_mean.device(), " and ",
             t->device());
  const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
#ifdef MG_WITH_CUDA
  if (running_mean.is_cuda()) {
    cuda::batch_norm_update_stats(running_mean, running_var, mean, invstd, unbias, momentum, eps);
  } else
#endif
  {
    MG_CHECK(!running_mean.is_cuda(), DeviceError, op, ": this build has no CUDA kernels");
    float* rm = static_cast<float*>(running_mean.raw_data());
    float* rv = static_cast<float*>(running_var.raw_data());
    MG_DISPATCH_FLOAT(mean.dtype(), op, [&] {
      const auto* m = static_cast<const scalar_t*>(mean.raw_data());
      const auto* is = static_cast<const scalar_t*>(invstd.raw_data());
      for (int64_t i = 0; i < c; ++i) {
        const double inv = static_cast<double>(is[i]);
        rm[i] = static_cast<float>((1 - momentum) * rm[i] + momentum * static_cast<double>(m[i]));
        rv[i] = static_cast<float>((1 - momentum) * rv[i] + momentum * unbias * (1.0 / (inv * inv) - eps));
      }
    });
  }
  running_mean.bump_version();
  running_var.bump_version();
}

}  // namespace mg::kernels
