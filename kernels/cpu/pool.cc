// Max, average and adaptive-average 2-D pooling on the CPU, forward and backward, one
// (n, c) plane at a time (planes are contiguous H*W blocks in NCHW). Window rules follow
// PyTorch's CPU kernels exactly, so outputs and gradients match it element for element.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_ops.h"

namespace mg::kernels::cpu {
namespace {

struct Planes {
  int64_t P, H, W, Ho, Wo;  // P = N * C planes
};

Planes planes(const Shape& in, const Shape& out) { return {in[0] * in[1], in[2], in[3], out[2], out[3]}; }

template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

template <class T>
void max_pool_t(const Tensor& x, const Pool2dArgs& a, const Tensor& out, const Tensor& indices) {
  const Planes p = planes(x.sizes(), out.sizes());
  const T* px = cptr<T>(x);
  T* po = ptr<T>(out);
  int64_t* pi = ptr<int64_t>(indices);
  for (int64_t q = 0; q < p.P; ++q) {
    const T* plane = px + q * p.H * p.W;
    for (int64_t oh = 0; oh < p.Ho; ++oh) {
      const int64_t h0 = oh * a.stride.h - a.padding.h;
      for (int64_t ow = 0; ow < p.Wo; ++ow) {
        const int64_t w0 = ow * a.stride.w - a.padding.w;
        T best = -std::numeric_limits<T>::infinity();
        int64_t arg = -1;
        for (int64_t i = 0; i < a.kernel.h; ++i) {
          const int64_t ih = h0 + i * a.dilation.h;
          if (ih < 0 || ih >= p.H) continue;
          for (int64_t j = 0; j < a.kernel.w; ++j) {
            const int64_t iw = w0 + j * a.dilation.w;
            if (iw < 0 || iw >= p.W) continue;
            const T v = plane[ih * p.W + iw];
            // The first valid position wins ties and all -inf windows; NaN propagates
            // (the last NaN, as in PyTorch).
            if (arg < 0 || v > best || std::isnan(v)) {
              best = v;
              arg = ih * p.W + iw;
            }
          }
        }
        po[(q * p.Ho + oh) * p.Wo + ow] = best;
        pi[(q * p.Ho + oh) * p.Wo + ow] = arg;
      }
    }
  }
}

template <class T>
void max_pool_backward_t(const Tensor& gout, const Tensor& indices, const Tensor& gx) {
  const Planes p = planes(gx.sizes(), gout.sizes());
  const T* pg = cptr<T>(gout);
  const int64_t* pi = cptr<int64_t>(indices);
  T* pd = ptr<T>(gx);
  std::fill(pd, pd + gx.numel(), T(0));
  const int64_t L = p.Ho * p.Wo, HW = p.H * p.W;
  for (int64_t q = 0; q < p.P; ++q)
    for (int64_t l = 0; l < L; ++l) {
      const int64_t k = pi[q * L + l];
      if (k >= 0 && k < HW) pd[q * HW + k] += pg[q * L + l];
    }
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

template <class T>
void avg_pool_t(const Tensor& x, const Pool2dArgs& a, const Tensor& out) {
  const Planes p = planes(x.sizes(), out.sizes());
  const T* px = cptr<T>(x);
  T* po = ptr<T>(out);
  for (int64_t q = 0; q < p.P; ++q) {
    const T* plane = px + q * p.H * p.W;
    for (int64_t oh = 0; oh < p.Ho; ++oh)
      for (int64_t ow = 0; ow < p.Wo; ++ow) {
        const AvgWindow win = avg_window(a, p.H, p.W, oh, ow);
        double s = 0;
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) s += plane[ih * p.W + iw];
        po[(q * p.Ho + oh) * p.Wo + ow] = win.divisor > 0 ? static_cast<T>(s / win.divisor) : T(0);
      }
  }
}

template <class T>
void avg_pool_backward_t(const Tensor& gout, const Pool2dArgs& a, const Tensor& gx) {
  const Planes p = planes(gx.sizes(), gout.sizes());
  const T* pg = cptr<T>(gout);
  T* pd = ptr<T>(gx);
  std::fill(pd, pd + gx.numel(), T(0));
  for (int64_t q = 0; q < p.P; ++q) {
    T* plane = pd + q * p.H * p.W;
    for (int64_t oh = 0; oh < p.Ho; ++oh)
      for (int64_t ow = 0; ow < p.Wo; ++ow) {
        const AvgWindow win = avg_window(a, p.H, p.W, oh, ow);
        if (win.divisor == 0) continue;
        const T g = static_cast<T>(pg[(q * p.Ho + oh) * p.Wo + ow] / win.divisor);
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) plane[ih * p.W + iw] += g;
      }
  }
}

// Adaptive window along one dim: [floor(o*in/out), ceil((o+1)*in/out)).
inline int64_t start_index(int64_t o, int64_t out, int64_t in) { return (o * in) / out; }
inline int64_t end_index(int64_t o, int64_t out, int64_t in) { return ((o + 1) * in + out - 1) / out; }

template <class T>
void adaptive_avg_t(const Tensor& x, const Tensor& out) {
  const Planes p = planes(x.sizes(), out.sizes());
  const T* px = cptr<T>(x);
  T* po = ptr<T>(out);
  for (int64_t q = 0; q < p.P; ++q) {
    const T* plane = px + q * p.H * p.W;
    for (int64_t oh = 0; oh < p.Ho; ++oh) {
      const int64_t h0 = start_index(oh, p.Ho, p.H), h1 = end_index(oh, p.Ho, p.H);
      for (int64_t ow = 0; ow < p.Wo; ++ow) {
        const int64_t w0 = start_index(ow, p.Wo, p.W), w1 = end_index(ow, p.Wo, p.W);
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += plane[ih * p.W + iw];
        po[(q * p.Ho + oh) * p.Wo + ow] = static_cast<T>(s / static_cast<double>((h1 - h0) * (w1 - w0)));
      }
    }
  }
}

template <class T>
void adaptive_avg_backward_t(const Tensor& gout, const Tensor& gx) {
  const Planes p = planes(gx.sizes(), gout.sizes());
  const T* pg = cptr<T>(gout);
  T* pd = ptr<T>(gx);
  std::fill(pd, pd + gx.numel(), T(0));
  for (int64_t q = 0; q < p.P; ++q) {
    T* plane = pd + q * p.H * p.W;
    for (int64_t oh = 0; oh < p.Ho; ++oh) {
      const int64_t h0 = start_index(oh, p.Ho, p.H), h1 = end_index(oh, p.Ho, p.H);
      for (int64_t ow = 0; ow < p.Wo; ++ow) {
        const int64_t w0 = start_index(ow, p.Wo, p.W), w1 = end_index(ow, p.Wo, p.W);
        const T g = static_cast<T>(pg[(q * p.Ho + oh) * p.Wo + ow] / static_cast<double>((h1 - h0) * (w1 - w0)));
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) plane[ih * p.W + iw] += g;
      }
    }
  }
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

void max_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out, const Tensor& indices) {
  MG_POOL_DISPATCH(x.dtype(), max_pool_t, x, args, out, indices);
}
void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_x) {
  MG_POOL_DISPATCH(grad_x.dtype(), max_pool_backward_t, grad_out, indices, grad_x);
}
void avg_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out) {
  MG_POOL_DISPATCH(x.dtype(), avg_pool_t, x, args, out);
}
void avg_pool2d_backward(const Tensor& grad_out, const Pool2dArgs& args, const Tensor& grad_x) {
  MG_POOL_DISPATCH(grad_x.dtype(), avg_pool_backward_t, grad_out, args, grad_x);
}
void adaptive_avg_pool2d(const Tensor& x, const Tensor& out) { MG_POOL_DISPATCH(x.dtype(), adaptive_avg_t, x, out); }
void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_x) {
  MG_POOL_DISPATCH(grad_x.dtype(), adaptive_avg_backward_t, grad_out, grad_x);
}

#undef MG_POOL_DISPATCH

}  // namespace mg::kernels::cpu
