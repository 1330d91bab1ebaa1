// Reduction CPU kernels. Sums accumulate in a wider type (double for floating inputs,
// int64 for integers) into a buffer of the kept shape, then convert once.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/strided_loop.h"
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

template <class T>
using acc_t = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, double, int64_t>;

// Strides that broadcast the kept-shape buffer (contiguous) over a's shape: 0 on reduced dims.
Shape bcast_strides(const Shape& in, const Shape& kept) {
  Shape st = contiguous_strides(kept);
  for (size_t d = 0; d < in.size(); ++d)
    if (kept[d] == 1) st[d] = 0;
  return st;
}

// acc[k] += a[i] over all elements i that reduce into k.
template <class T, class Acc>
void sum_into(const Tensor& a, const Shape& kept, std::vector<Acc>& acc) {
  acc.assign(static_cast<size_t>(shape_numel(kept)), Acc(0));
  const T* pa = static_cast<const T*>(a.raw_data());
  Acc* pk = acc.data();
  auto cv = [](T v) { return static_cast<Acc>(static_cast<opmath_t<T>>(v)); };
  strided_loop<2>(a.sizes(), {a.strides(), bcast_strides(a.sizes(), kept)}, [&](auto off, auto st, int64_t n) {
    const T* x = pa + off[0];
    Acc* k = pk + off[1];
    if (st[1] == 0) {
      // Four partial sums break the add dependency chain.
      Acc s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = 0;
      const int64_t sx = st[0];
      for (; i + 4 <= n; i += 4) {
        s0 += cv(x[i * sx]);
        s1 += cv(x[(i + 1) * sx]);
        s2 += cv(x[(i + 2) * sx]);
        s3 += cv(x[(i + 3) * sx]);
      }
      for (; i < n; ++i) s0 += cv(x[i * sx]);
      *k += (s0 + s1) + (s2 + s3);
    } else if (st[0] == 1 && st[1] == 1) {
      for (int64_t i = 0; i < n; ++i) k[i] += cv(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) k[i * st[1]] += cv(x[i * st[0]]);
    }
  });
}

template <class O, class Acc>
void store(const std::vector<Acc>& acc, const Tensor& out, double scale) {
  O* po = static_cast<O*>(out.raw_data());
  for (size_t i = 0; i < acc.size(); ++i) {
    if constexpr (std::is_same_v<O, bool>) {
      po[i] = acc[i] != 0;
    } else if constexpr (std::is_floating_point_v<opmath_t<O>>) {
      po[i] = static_cast<O>(static_cast<opmath_t<O>>(static_cast<double>(acc[i]) * scale));
    } else {
      po[i] = static_cast<O>(acc[i]);
    }
  }
}

}  // namespace

template <>
void CpuBackend::sum(const Tensor& a, const Tensor& out) {
  MG_DISPATCH_ALL(a.dtype(), "sum", [&] {
    using T = scalar_t;
    std::vector<acc_t<T>> acc;
    sum_into<T>(a, out.sizes(), acc);
    MG_DISPATCH_ALL(out.dtype(), "sum", [&] { store<scalar_t>(acc, out, 1.0); });
  });
}

template <>
void CpuBackend::mean(const Tensor& a, const Tensor& out) {
  MG_DISPATCH_FLOAT(a.dtype(), "mean", [&] {
    std::vector<double> acc;
    sum_into<scalar_t>(a, out.sizes(), acc);
    const int64_t count = out.numel() ? a.numel() / out.numel() : 0;
    store<scalar_t>(acc, out, 1.0 / static_cast<double>(count));
  });
}

template <>
void CpuBackend::var(const Tensor& a, int64_t correction, const Tensor& out) {
  MG_DISPATCH_FLOAT(a.dtype(), "var", [&] {
    using T = scalar_t;
    std::vector<double> mu;
    sum_into<T>(a, out.sizes(), mu);
    const int64_t count = out.numel() ? a.numel() / out.numel() : 0;
    for (double& m : mu) m /= static_cast<double>(count);
    std::vector<double> ss(mu.size(), 0.0);
    const T* pa = static_cast<const T*>(a.raw_data());
    strided_loop<2>(a.sizes(), {a.strides(), bcast_strides(a.sizes(), out.sizes())}, [&](auto off, auto st, int64_t n) {
      const T* x = pa + off[0];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = off[1] + i * st[1];
        const double d = static_cast<double>(static_cast<opmath_t<T>>(x[i * st[0]])) - mu[k];
        ss[k] += d * d;
      }
    });
    const double denom = std::max<double>(0.0, static_cast<double>(count - correction));
    store<T>(ss, out, 1.0 / denom);
  });
}

template <>
void CpuBackend::max_min(const Tensor& a, int64_t dim, bool is_max, const Tensor& values, const Tensor& indices) {
  MG_DISPATCH_ALL(a.dtype(), is_max ? "max" : "min", [&] {
    using T = scalar_t;
    using M = opmath_t<T>;
    const int64_t K = a.dim() ? a.size(dim) : 1;
    const int64_t sk = a.dim() ? a.stride(dim) : 0;
    const T* pa = static_cast<const T*>(a.raw_data());
    T* pv = static_cast<T*>(values.raw_data());
    int64_t* pi = static_cast<int64_t*>(indices.raw_data());
    strided_loop<3>(values.sizes(), {a.strides(), values.strides(), indices.strides()},
                    [&](auto off, auto st, int64_t n) {
                      for (int64_t i = 0; i < n; ++i) {
                        const T* x = pa + off[0] + i * st[0];
                        M best = static_cast<M>(x[0]);
                        int64_t bi = 0;
                        if constexpr (std::is_floating_point_v<M>) {
                          if (!std::isnan(best)) {
                            for (int64_t j = 1; j < K; ++j) {
                              const M v = static_cast<M>(x[j * sk]);
                              if (std::isnan(v)) {  // NaN wins, like PyTorch
                                best = v;
                                bi = j;
                                break;
                              }
                              if (is_max ? v > best : v < best) {
                                best = v;
                                bi = j;
                              }
                            }
                          }
                        } else {
                          for (int64_t j = 1; j < K; ++j) {
                            const M v = static_cast<M>(x[j * sk]);
                            if (is_max ? v > best : v < best) {
                              best = v;
                              bi = j;
                            }
                          }
                        }
                        pv[off[1] + i * st[1]] = static_cast<T>(best);
                        pi[off[2] + i * st[2]] = bi;
                      }
                    });
  });
}

template <>
void CpuBackend::sum_squares(const Tensor& a, const Tensor& out) {
  double total = 0;
  MG_DISPATCH_ALL(a.dtype(), "sum_squares", [&] {
    using T = scalar_t;
    const T* pa = static_cast<const T*>(a.raw_data());
    strided_loop<1>(a.sizes(), {a.strides()}, [&](auto off, auto st, int64_t n) {
      const T* x = pa + off[0];
      double s0 = 0, s1 = 0;
      int64_t i = 0;
      for (; i + 2 <= n; i += 2) {
        const double v0 = static_cast<double>(static_cast<opmath_t<T>>(x[i * st[0]]));
        const double v1 = static_cast<double>(static_cast<opmath_t<T>>(x[(i + 1) * st[0]]));
        s0 += v0 * v0;
        s1 += v1 * v1;
      }
      for (; i < n; ++i) {
        const double v = static_cast<double>(static_cast<opmath_t<T>>(x[i * st[0]]));
        s0 += v * v;
      }
      total += s0 + s1;
    });
  });
  if (a.numel() == 0) total = 0;
  if (out.dtype() == DType::f64)
    *static_cast<double*>(out.raw_data()) = total;
  else
    *static_cast<float*>(out.raw_data()) = static_cast<float>(total);
}

template <>
bool CpuBackend::has_nonfinite(const Tensor& a) {
  bool bad = false;
  if (!is_floating(a.dtype()) || a.numel() == 0) return false;
  MG_DISPATCH_FLOAT(a.dtype(), "has_nonfinite", [&] {
    using T = scalar_t;
    const T* pa = static_cast<const T*>(a.raw_data());
    strided_loop<1>(a.sizes(), {a.strides()}, [&](auto off, auto st, int64_t n) {
      if (bad) return;
      const T* x = pa + off[0];
      // x - x is 0 for finite x and NaN for inf/NaN; summing keeps the loop branch-free.
      opmath_t<T> s = 0;
      for (int64_t i = 0; i < n; ++i) {
        const opmath_t<T> v = static_cast<opmath_t<T>>(x[i * st[0]]);
        s += v - v;
      }
      if (s != 0 || std::isnan(s)) bad = true;
    });
  });
  return bad;
}

}  // namespace mg::kernels
