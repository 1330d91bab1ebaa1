// Max, average and adaptive-average 2-D pooling on the CPU, forward and backward, one
// (n, c) plane at a time (planes are contiguous H*W blocks in NCHW). Window rules follow
// PyTorch's CPU kernels exactly, so outputs and gradients match it element for element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

struct Planes {
  int64_t P, H, W, Ho, Wo;  // P = N * C planes
};

Planes planes(const Shape& in, const Shape& out) { return {in[0] * in[1], in[2], in[3], out[2], out[3]}; }

// Kernel taps k in [lo, hi) whose input position start + k*dil lies in [0, n).
void tap_range(int64_t start, int64_t k, int64_t dil, int64_t n, int64_t* lo, int64_t* hi) {
  *lo = start >= 0 ? 0 : (-start + dil - 1) / dil;
  *hi = start + (k - 1) * dil < n ? k : (start >= n ? 0 : (n - 1 - start) / dil + 1);
  if (*hi < *lo) *hi = *lo;
}

// Branch-free select (the argmax position in real data is unpredictable, so a branch
// would mispredict about every other window).
template <class T, class U>
inline T pick(bool c, T a, T b) {
  U ua, ub;
  std::memcpy(&ua, &a, sizeof(T));
  std::memcpy(&ub, &b, sizeof(T));
  const U m = U(0) - static_cast<U>(c);
  const U r = (ua & m) | (ub & ~m);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}
template <class T>
inline T pick_value(bool c, T a, T b) {
  return pick<T, std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>>(c, a, b);
}
inline int64_t pick_index(bool c, int64_t a, int64_t b) { return pick<int64_t, uint64_t>(c, a, b); }

// Planes per thread: enough that each thread has ~64K input elements.
int64_t plane_grain(int64_t plane_elems) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(plane_elems, 1));
}

// One tap column of a row of windows: best[ow] = max(best[ow], row[ow * sw + off]) for ow in
// [lo, hi), with the argmax (flat index rbase + ow * sw + off) when `arg` is non-null.
// Plain parameters and __restrict let the compiler keep everything in registers.
template <class T>
void max_tap(const T* __restrict row, T* __restrict best, int64_t* __restrict arg, int64_t lo, int64_t hi, int64_t sw,
             int64_t off, int64_t rbase) {
  if (arg) {
    for (int64_t ow = lo; ow < hi; ++ow) {
      const T v = row[ow * sw + off], b = best[ow];
      const bool take = (v > b) | (v != v);  // NaN propagates (PyTorch: val > max || isnan(val))
      best[ow] = pick_value(take, v, b);
      arg[ow] = pick_index(take, rbase + ow * sw + off, arg[ow]);
    }
  } else {
    for (int64_t ow = lo; ow < hi; ++ow) {
      const T v = row[ow * sw + off], b = best[ow];
      best[ow] = pick_value((v > b) | (v != v), v, b);
    }
  }
}

// The common 2x2 / stride 2 / no padding case: four loads, the max in registers, one store.
template <class T>
void max_pool_2x2(const T* __restrict plane, int64_t W, int64_t Ho, int64_t Wo, T* __restrict out,
                  int64_t* __restrict arg) {
  for (int64_t oh = 0; oh < Ho; ++oh) {
    const T* r0 = plane + 2 * oh * W;
    const T* r1 = r0 + W;
    for (int64_t ow = 0; ow < Wo; ++ow) {
      const T c[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
      T best = c[0];
      int64_t k = 0;
      for (int64_t t = 1; t < 4; ++t) {
        const bool take = (c[t] > best) | (c[t] != c[t]);
        best = pick_value(take, c[t], best);
        k = pick_index(take, t, k);
      }
      out[oh * Wo + ow] = best;
      if (arg) arg[oh * Wo + ow] = 2 * oh * W + 2 * ow + (k >> 1) * W + (k & 1);
    }
  }
}

// One output row at a time, tap by tap (window rows, then columns: PyTorch's visiting
// order, so ties keep the first position and the last NaN wins). `indices` may be
// undefined (no autograd): then only the values are computed.
template <class T>
void max_pool_t(const Tensor& x, const Pool2dArgs& a, const Tensor& out, const Tensor& indices) {
  const Planes p = planes(x.sizes(), out.sizes());
  const T* px = data_as<const T>(x);
  T* po = data_as<T>(out);
  int64_t* pi = indices.defined() ? data_as<int64_t>(indices) : nullptr;
  // (ceil_mode can add partial windows at the bottom/right edge: those take the general path.)
  if (a.kernel == Int2(2) && a.stride == Int2(2) && a.padding == Int2(0) && a.dilation == Int2(1) && 2 * p.Ho <= p.H &&
      2 * p.Wo <= p.W) {
    cpu::parallel_for(p.P, plane_grain(p.H * p.W), [=](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q)
        max_pool_2x2(px + q * p.H * p.W, p.W, p.Ho, p.Wo, po + q * p.Ho * p.Wo, pi ? pi + q * p.Ho * p.Wo : nullptr);
    });
    return;
  }
  const int64_t sw = a.stride.w, pw = a.padding.w, dw = a.dilation.w, kw = a.kernel.w;
  // Per output column: its first valid tap (seeds the max); per tap column: the output
  // columns for which it is inside the input.
  std::vector<int64_t> jlo(p.Wo), jhi(p.Wo), owlo(kw), owhi(kw);
  for (int64_t ow = 0; ow < p.Wo; ++ow) tap_range(ow * sw - pw, kw, dw, p.W, &jlo[ow], &jhi[ow]);
  for (int64_t j = 0; j < kw; ++j) {
    const int64_t off = j * dw - pw;  // input column = ow * sw + off
    owlo[j] = off >= 0 ? 0 : (-off + sw - 1) / sw;
    owhi[j] = p.W - 1 - off < 0 ? 0 : std::min(p.Wo, (p.W - 1 - off) / sw + 1);
  }
  cpu::parallel_for(p.P, plane_grain(p.H * p.W), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const T* plane = px + q * p.H * p.W;
      for (int64_t oh = 0; oh < p.Ho; ++oh) {
        const int64_t h0 = oh * a.stride.h - a.padding.h;
        int64_t ilo, ihi;
        tap_range(h0, a.kernel.h, a.dilation.h, p.H, &ilo, &ihi);
        T* orow = po + (q * p.Ho + oh) * p.Wo;
        int64_t* irow = pi ? pi + (q * p.Ho + oh) * p.Wo : nullptr;
        for (int64_t ow = 0; ow < p.Wo; ++ow) {
          if (ilo >= ihi || jlo[ow] >= jhi[ow]) {  // only dilation can leave a window without input
            orow[ow] = -std::numeric_limits<T>::infinity();
            if (irow) irow[ow] = -1;  // the backward skips it
            continue;
          }
          const int64_t first = (h0 + ilo * a.dilation.h) * p.W + ow * sw - pw + jlo[ow] * dw;
          orow[ow] = plane[first];
          if (irow) irow[ow] = first;
        }
        for (int64_t i = ilo; i < ihi; ++i) {
          const int64_t rbase = (h0 + i * a.dilation.h) * p.W;
          for (int64_t j = 0; j < kw; ++j) max_tap(plane + rbase, orow, irow, owlo[j], owhi[j], sw, j * dw - pw, rbase);
        }
      }
    }
  });
}

template <class T>
void max_pool_backward_t(const Tensor& gout, const Tensor& indices, const Tensor& gx) {
  const Planes p = planes(gx.sizes(), gout.sizes());
  const T* pg = data_as<const T>(gout);
  const int64_t* pi = data_as<const int64_t>(indices);
  T* pd = data_as<T>(gx);
  std::fill(pd, pd + gx.numel(), T(0));
  const int64_t L = p.Ho * p.Wo, HW = p.H * p.W;
  cpu::parallel_for(p.P, plane_grain(HW), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t k = pi[q * L + l];
        if (k >= 0 && k < HW) pd[q * HW + k] += pg[q * L + l];
      }
  });
}

// PyTorch's avg-pool window: clipped to the input for summing; the divisor counts the part
// inside the padded input when count_include_pad.
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  double divisor;  // 0 when the window holds no input element
};

AvgWindow avg_window(const Pool2dArgs& a, int64_t H, int64_t W, int64_t oh, int64_t ow) {
  int64_t h0 = oh * a.stride.h - a.padding.h, w0 = ow * a.stride.w - a.padding.w;
  int64_t h1 = std::min(h0 + a.kernel.h, H + a.padding.h), w1 = std::min(w0 + a.kernel.w, W + a.padding.w);
  const int64_t pool_size = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, H), w1 = std::min(w1, W);
  if (h0 >= h1 || w0 >= w1) return {h0, h0, w0, w0, 0.0};
  const int64_t n = a.count_include_pad ? pool_size : (h1 - h0) * (w1 - w0);
  return {h0, h1, w0, w1, static_cast<double>(n)};
}

// Adaptive window along each dim: [floor(o*in/out), ceil((o+1)*in/out)), averaged over its area.
inline int64_t start_index(int64_t o, int64_t out, int64_t in) { return (o * in) / out; }
inline int64_t end_index(int64_t o, int64_t out, int64_t in) { return ((o + 1) * in + out - 1) / out; }
AvgWindow adaptive_window(const Planes& p, int64_t oh, int64_t ow) {
  const int64_t h0 = start_index(oh, p.Ho, p.H), h1 = end_index(oh, p.Ho, p.H);
  const int64_t w0 = start_index(ow, p.Wo, p.W), w1 = end_index(ow, p.Wo, p.W);
  return {h0, h1, w0, w1, static_cast<double>((h1 - h0) * (w1 - w0))};
}

// Average pooling forward and backward for a window rule window(planes, oh, ow) -> AvgWindow:
// avg_window for avg_pool2d, adaptive_window for adaptive_avg_pool2d.
template <class T, class Window>
void avg_pool_t(const Tensor& x, const Tensor& out, Window window) {
  const Planes p = planes(x.sizes(), out.sizes());
  const T* px = data_as<const T>(x);
  T* po = data_as<T>(out);
  cpu::parallel_for(p.P, plane_grain(p.H * p.W), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const T* plane = px + q * p.H * p.W;
      for (int64_t oh = 0; oh < p.Ho; ++oh)
        for (int64_t ow = 0; ow < p.Wo; ++ow) {
          const AvgWindow win = window(p, oh, ow);
          double s = 0;
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) s += plane[ih * p.W + iw];
          po[(q * p.Ho + oh) * p.Wo + ow] = win.divisor > 0 ? static_cast<T>(s / win.divisor) : T(0);
        }
    }
  });
}

template <class T, class Window>
void avg_pool_backward_t(const Tensor& gout, const Tensor& gx, Window window) {
  const Planes p = planes(gx.sizes(), gout.sizes());
  const T* pg = data_as<const T>(gout);
  T* pd = data_as<T>(gx);
  std::fill(pd, pd + gx.numel(), T(0));
  cpu::parallel_for(p.P, plane_grain(p.H * p.W), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      T* plane = pd + q * p.H * p.W;
      for (int64_t oh = 0; oh < p.Ho; ++oh)
        for (int64_t ow = 0; ow < p.Wo; ++ow) {
          const AvgWindow win = window(p, oh, ow);
          if (win.divisor == 0) continue;
          const T g = static_cast<T>(pg[(q * p.Ho + oh) * p.Wo + ow] / win.divisor);
          for (int64_t ih = win.h0; ih < win.h1; ++ih)
            for (int64_t iw = win.w0; iw < win.w1; ++iw) plane[ih * p.W + iw] += g;
        }
    }
  });
}

}  // namespace

// f64 or f32 (nn_ops.cc has converted anything else).
#define MG_POOL_DISPATCH(DT, FN, ...) \
  do {                                \
    if ((DT) == DType::f64)           \
      FN<double>(__VA_ARGS__);        \
    else                              \
      FN<float>(__VA_ARGS__);         \
  } while (0)

template <>
void CpuBackend::max_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out, const Tensor& indices) {
  MG_POOL_DISPATCH(x.dtype(), max_pool_t, x, args, out, indices);
}
template <>
void CpuBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_x) {
  MG_POOL_DISPATCH(grad_x.dtype(), max_pool_backward_t, grad_out, indices, grad_x);
}
template <>
void CpuBackend::avg_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out) {
  const auto window = [&](const Planes& p, int64_t oh, int64_t ow) { return avg_window(args, p.H, p.W, oh, ow); };
  MG_POOL_DISPATCH(x.dtype(), avg_pool_t, x, out, window);
}
template <>
void CpuBackend::avg_pool2d_backward(const Tensor& grad_out, const Pool2dArgs& args, const Tensor& grad_x) {
  const auto window = [&](const Planes& p, int64_t oh, int64_t ow) { return avg_window(args, p.H, p.W, oh, ow); };
  MG_POOL_DISPATCH(grad_x.dtype(), avg_pool_backward_t, grad_out, grad_x, window);
}
template <>
void CpuBackend::adaptive_avg_pool2d(const Tensor& x, const Tensor& out) {
  MG_POOL_DISPATCH(x.dtype(), avg_pool_t, x, out, adaptive_window);
}
template <>
void CpuBackend::adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_x) {
  MG_POOL_DISPATCH(grad_x.dtype(), avg_pool_backward_t, grad_out, grad_x, adaptive_window);
}

#undef MG_POOL_DISPATCH

}  // namespace mg::kernels
