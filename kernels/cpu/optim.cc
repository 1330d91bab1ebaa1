// Optimizer CPU loops over lists of tensors; the per-element rules (optim_math.h) are the ones
// cuda/optim.cu runs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/optim.h"

#include "kernels/cpu/cpu_backend.h"
#include "kernels/optim_math.h"

namespace mg::kernels {
namespace {

// A capturable update's skip flag and lr, read where the CUDA kernels read them.
bool skipped(const DeviceScalars& d) { return d.found_inf.defined() && *d.found_inf.data_ptr<float>() != 0.0f; }
double lr_of(const DeviceScalars& d, double host_lr) { return d.lr.defined() ? *d.lr.data_ptr<double>() : host_lr; }

// A gradient element in the math type: f32/f64 as is, a 16-bit one widened (exactly).
template <class T, class G>
inline T widen(const G& g) {
  if constexpr (std::is_same_v<G, BFloat16>)
    return BFloat16::to_float(g.x);
  else if constexpr (std::is_same_v<G, Half>)
    return Half::to_float(g.x);
  else
    return g;
}

// adam_element over [0, n) for the common case (no amsgrad, no maximize), in a form the compiler
// vectorizes: the flags it leaves out are constants, the pointers do not alias, sqrt sets no
// errno (the library's -fno-math-errno), and an AVX2 clone runs where the CPU has it. The same
// operations on each element in the same order as the scalar loop: the same result, bitwise.
// G is the gradient's element type: T, or a 16-bit float widened as it is read.
template <class T, class G>
__attribute__((optimize("O3"), target_clones("avx2", "default"))) void adam_range(
    T* __restrict p, const G* __restrict g, T* __restrict m, T* __restrict v, int64_t n,
    const optim_math::AdamScalars<T>& s, T step_size, T bc2_sqrt) {
  const optim_math::AdamScalars<T> c{s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.decoupled, false, false};
  for (int64_t j = 0; j < n; ++j)
    optim_math::adam_element<T>(p[j], widen<T>(g[j]), m[j], v[j], nullptr, c, step_size, bc2_sqrt);
}

// BFloat16::from_float's rounding (nearest even, a NaN kept quiet) as a select, which vectorizes.
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// low[j] = p[j] rounded to nearest in bf16 (or f16: Half's rounding, one element at a time).
__attribute__((optimize("O3"), target_clones("avx2", "default"))) void low_range(const float* __restrict p,
                                                                                 uint16_t* __restrict low, int64_t n,
                                                                                 bool bf16) {
  if (bf16)
    for (int64_t j = 0; j < n; ++j) low[j] = bf16_bits(p[j]);
  else
    for (int64_t j = 0; j < n; ++j) low[j] = Half::from_float(p[j]);
}

// Where a parameter's low copy goes: its 16-bit codes (null: none) and whether they are bf16.
struct LowCopy {
  uint16_t* codes = nullptr;
  bool bf16 = false;
};
LowCopy low_copy_of(const AdamTensors& t, size_t i) {
  if (t.low_copies.empty() || !t.low_copies[i].defined()) return {};
  const Tensor& c = t.low_copies[i];
  return {static_cast<uint16_t*>(c.raw_data()), c.dtype() == DType::bf16};
}

// One parameter's update with gradient elements of type G, and its low copy (null, or 16-bit
// codes, bf16 when low_bf16, else f16). Elements are independent: split over the cores (host
// parameters step here at the host's memory bandwidth), the same result as one loop. The low
// copy of each tile is written right after the tile's update, from the cache: a host update
// (memory/host_params.h) reads and writes each byte of its state once.
template <class T, class G>
void adam_param(T* p, const G* g, T* m, T* v, T* vmax, uint16_t* low, bool low_bf16, int64_t n,
                const optim_math::AdamScalars<T>& s, T step_size, T bc2_sqrt) {
  constexpr int64_t kTile = 4096;  // 64 KiB of f32 state in the cache between the two loops
  cpu::parallel_for(n, int64_t{1} << 15, [&](int64_t b, int64_t e) {
    for (int64_t t0 = b; t0 < e; t0 += kTile) {
      const int64_t len = std::min(kTile, e - t0);
      if (!s.amsgrad && !s.maximize) {
        adam_range<T, G>(p + t0, g + t0, m + t0, v + t0, len, s, step_size, bc2_sqrt);
      } else {
        for (int64_t j = t0; j < t0 + len; ++j)
          optim_math::adam_element<T>(p[j], widen<T>(g[j]), m[j], v[j], vmax ? vmax + j : nullptr, s, step_size,
                                      bc2_sqrt);
      }
      if constexpr (std::is_same_v<T, float>)
        if (low) low_range(p + t0, low + t0, len, low_bf16);
    }
  });
}

// Returns whether the low copies were written (not when the update is skipped: the caller copies
// the parameters as they are).
template <class T>
bool adam_cpu(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) {
  if (skipped(d)) return false;
  const double lr = lr_of(d, h.lr);
  const optim_math::AdamScalars<T> s{
      T(lr), T(h.beta1), T(h.beta2), T(h.eps), T(h.weight_decay), h.decoupled_weight_decay, h.amsgrad, h.maximize};
  for (size_t i = 0; i < t.params.size(); ++i) {
    const double st = static_cast<double>(t.step_counts.empty() ? t.steps[i] : ++*t.step_counts[i].data_ptr<int64_t>());
    double step_size_d = 0, bc2_sqrt_d = 0;
    optim_math::adam_bias_corrections(lr, h.beta1, h.beta2, st, &step_size_d, &bc2_sqrt_d);
    const T step_size = T(step_size_d), bc2_sqrt = T(bc2_sqrt_d);
    T* p = t.params[i].data_ptr<T>();
    T* m = t.exp_avg[i].data_ptr<T>();
    T* v = t.exp_avg_sq[i].data_ptr<T>();
    T* vmax = h.amsgrad ? t.max_exp_avg_sq[i].data_ptr<T>() : nullptr;
    const auto [low, low_bf16] = low_copy_of(t, i);
    const Tensor& g = t.grads[i];
    const int64_t n = t.params[i].numel();
    if (g.dtype() == DType::bf16)
      adam_param<T>(p, g.data_ptr<BFloat16>(), m, v, vmax, low, low_bf16, n, s, step_size, bc2_sqrt);
    else if (g.dtype() == DType::f16)
      adam_param<T>(p, g.data_ptr<Half>(), m, v, vmax, low, low_bf16, n, s, step_size, bc2_sqrt);
    else
      adam_param<T>(p, g.data_ptr<T>(), m, v, vmax, low, low_bf16, n, s, step_size, bc2_sqrt);
  }
  return true;
}

// One quantization block of the 8-bit update before its moments are stored: each element's
// moments read through their codes and the block's scales, the AdamW rule applied (the parameter
// steps with the unrounded new moments), the new moments left in m and v. In the form the
// compiler vectorizes (the code lookups as gathers in the AVX2 clone): the same operations on
// each element in the same order as the scalar rule, so the same result, bitwise.
template <bool Maximize>
__attribute__((optimize("O3"), target_clones("avx2", "default"))) void adam8bit_block(
    float* __restrict p, const float* __restrict g, const uint8_t* __restrict mq, const uint8_t* __restrict vq,
    float am, float av, float* __restrict m, float* __restrict v, int64_t len, const optim_math::AdamScalars<float>& s,
    float step_size, float bc2_sqrt, const float* __restrict code_m, const float* __restrict code_v) {
  const optim_math::AdamScalars<float> c{s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.decoupled, false, Maximize};
  for (int64_t j = 0; j < len; ++j) {
    float mj = code_m[mq[j]] * am, vj = code_v[vq[j]] * av;
    optim_math::adam_element<float>(p[j], g[j], mj, vj, nullptr, c, step_size, bc2_sqrt);
    m[j] = mj;
    v[j] = vj;
  }
}

// optim_math::quantize_block (the block's absmax, then each value's nearest code by the bucket
// table), compiled where its loops vectorize: four gathers a value in the AVX2 clone, 1.5x the
// 8-bit host update of the search's ten (bench/results/cpu_adam8bit_lut32_2026-12-07.log).
__attribute__((optimize("O3"), target_clones("avx2", "default"))) float quantize_block_vec(
    const float* __restrict v, int64_t n, bool is_signed, unsigned char* __restrict q) {
  return optim_math::quantize_block(v, n, is_signed, q);
}

// 8-bit moments: block by block, the moments are read through their codes, updated with
// adam_element (the parameter stepping with the unrounded new moments), and stored against the
// block's new absmax; the low copy of the block's parameters (where asked) written right after,
// from the cache. Blocks are independent: parallel over them. Returns whether the low copies were
// written (not when the update is skipped).
bool adam8bit_cpu(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) {
  if (skipped(d)) return false;
  const double lr = lr_of(d, h.lr);
  const optim_math::AdamScalars<float> s{
      float(lr), float(h.beta1), float(h.beta2), float(h.eps), float(h.weight_decay), h.decoupled_weight_decay,
      false,     h.maximize};
  const float* code_m = quant_code(true);
  const float* code_v = quant_code(false);
  constexpr int64_t B = optim_math::kQuantBlock;
  for (size_t i = 0; i < t.params.size(); ++i) {
    const double st = static_cast<double>(t.step_counts.empty() ? t.steps[i] : ++*t.step_counts[i].data_ptr<int64_t>());
    double step_size_d = 0, bc2_sqrt_d = 0;
    optim_math::adam_bias_corrections(lr, h.beta1, h.beta2, st, &step_size_d, &bc2_sqrt_d);
    const float step_size = float(step_size_d), bc2_sqrt = float(bc2_sqrt_d);
    float* p = t.params[i].data_ptr<float>();
    const float* g = t.grads[i].data_ptr<float>();
    uint8_t* mq = t.exp_avg[i].data_ptr<uint8_t>();
    uint8_t* vq = t.exp_avg_sq[i].data_ptr<uint8_t>();
    float* am = t.exp_avg_absmax[i].data_ptr<float>();
    float* av = t.exp_avg_sq_absmax[i].data_ptr<float>();
    const auto [low, low_bf16] = low_copy_of(t, i);
    const int64_t n = t.params[i].numel();
    cpu::parallel_for(quant_blocks(n), 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> m(B), v(B);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t begin = b * B, len = std::min(B, n - begin);
        (s.maximize ? adam8bit_block<true> : adam8bit_block<false>)(p + begin, g + begin, mq + begin, vq + begin, am[b],
                                                                    av[b], m.data(), v.data(), len, s, step_size,
                                                                    bc2_sqrt, code_m, code_v);
        am[b] = quantize_block_vec(m.data(), len, true, mq + begin);
        av[b] = quantize_block_vec(v.data(), len, false, vq + begin);
        if (low) low_range(p + begin, low + begin, len, low_bf16);
      }
    });
  }
  return true;
}

template <class T>
void sgd_cpu(const SGDTensors& t, const SGDHyper& h, const DeviceScalars& d) {
  if (skipped(d)) return;
  const optim_math::SGDScalars<T> s{T(lr_of(d, h.lr)), T(h.momentum), T(h.dampening),
                                    T(h.weight_decay), h.nesterov,    h.maximize};
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
  const Tensor t = raw::contiguous(t0);
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

void write_low_copy(const Tensor& param, const Tensor& low) {
  MG_CHECK(param.defined() && low.defined() && param.dtype() == DType::f32 && param.device().is_cpu() &&
               param.is_contiguous() && (low.dtype() == DType::bf16 || low.dtype() == DType::f16) &&
               low.device().is_cpu() && low.is_contiguous() && low.sizes() == param.sizes(),
           ValueError, "write_low_copy: a contiguous f32 CPU tensor and a contiguous f16/bf16 CPU tensor of its shape ",
           "are needed; got ",
           param.defined() ? detail::format(param.dtype(), " ", shape_str(param.sizes()), " on ", param.device())
                           : std::string("undefined"),
           " and ",
           low.defined() ? detail::format(low.dtype(), " ", shape_str(low.sizes()), " on ", low.device())
                         : std::string("undefined"));
  const float* p = param.data_ptr<float>();
  auto* codes = static_cast<uint16_t*>(low.raw_data());
  const bool bf16 = low.dtype() == DType::bf16;
  cpu::parallel_for(param.numel(), int64_t{1} << 16,
                    [&](int64_t b, int64_t e) { low_range(p + b, codes + b, e - b, bf16); });
}

template <>
void CpuBackend::adam_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) {
  if (t.params[0].dtype() == DType::f64) {
    adam_cpu<double>(t, h, d);
    return;
  }
  if (!adam_cpu<float>(t, h, d))                      // else written in the update's pass
    for (size_t i = 0; i < t.low_copies.size(); ++i)  // skipped: the parameters as they are
      if (t.low_copies[i].defined()) write_low_copy(t.params[i], t.low_copies[i]);
  // The FP8 recipe's casts of the new values (of the parameters as they are where skipped): the
  // delayed cast itself, after the update. The CUDA backend does both in one pass.
  for (size_t i = 0; i < t.fp8_casts.size(); ++i)
    if (t.fp8_casts[i].codes.defined()) fp8_cast_reserved(t.params[i], t.fp8_casts[i]);
}

template <>
void CpuBackend::adam8bit_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d) {
  if (adam8bit_cpu(t, h, d)) return;                // the low copies were written in the update's pass
  for (size_t i = 0; i < t.low_copies.size(); ++i)  // skipped: the parameters as they are
    if (t.low_copies[i].defined()) write_low_copy(t.params[i], t.low_copies[i]);
}

template <>
void CpuBackend::sgd_multi_tensor(const SGDTensors& t, const SGDHyper& h, const DeviceScalars& d) {
  if (t.params[0].dtype() == DType::f64) return sgd_cpu<double>(t, h, d);
  sgd_cpu<float>(t, h, d);
}

template <>
double CpuBackend::multi_tensor_norm_partial(const std::vector<Tensor>& ts, double norm_type) {
  double total = 0.0;
  for (const Tensor& t : ts) {
    const double part = cpu_norm_partial(t, norm_type);
    if (std::isinf(norm_type))
      total = (std::isnan(total) || total >= part) ? total : part;
    else
      total += part;
  }
  return total;
}

template <>
void CpuBackend::multi_tensor_scale(const std::vector<Tensor>& ts, double scale) {
  for (const Tensor& t : ts)
    binary(Binary::Mul, t, raw::expand(scalar_tensor(scale, {t.dtype(), t.device()}), t.sizes()), t);
}

template <>
void CpuBackend::multi_tensor_cast(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  for (size_t i = 0; i < src.size(); ++i) raw::copy_(dst[i], src[i]);
}

template <>
void CpuBackend::multi_tensor_clip(const std::vector<Tensor>& ts, double max_norm, double norm_type,
                                   const Tensor& total_norm) {
  const double total = optim_math::finish_norm(multi_tensor_norm_partial(ts, norm_type), norm_type);
  *total_norm.data_ptr<float>() = static_cast<float>(total);
  const float coef = static_cast<float>(optim_math::clip_coefficient(total, max_norm));
  for (const Tensor& t : ts) {
    float* x = t.data_ptr<float>();
    for (int64_t j = 0; j < t.numel(); ++j) x[j] *= coef;
  }
}

}  // namespace mg::kernels
