// Max, average and adaptive-average 2-D pooling on CUDA, forward and backward, with the
// window rules of kernels/cpu/pool.cc (PyTorch's), on contiguous NCHW or channels-last (NHWC)
// tensors: a thread walks its tensor in memory order either way (in NHWC neighbouring threads
// take neighbouring channels, so loads coalesce), and a plane's pixel k lies at
// plane_base + k * pixel_step. One thread per
// output element forward; backward, one thread per input element gathers from the windows
// that cover it (no atomics, deterministic), except max pooling, whose backward has only
// the argmax indices and scatters with atomics (into an f32 buffer for f16/bf16).
#include <cstdint>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

// Geometry of one pooling call: P = N*C planes of H x W in, Ho x Wo out, in NCHW or NHWC.
struct PoolGeo {
  int64_t P, C, H, W, Ho, Wo;
  int kh, kw, sh, sw, ph, pw, dh, dw;
  bool count_include_pad, nhwc;
};

// nhwc: the input and output (grad_input and grad_output backward) are channels-last.
PoolGeo geo(const Shape& in, const Shape& out, const Pool2dArgs& a, bool nhwc) {
  PoolGeo g;
  g.P = in[0] * in[1], g.C = in[1], g.H = in[2], g.W = in[3], g.Ho = out[2], g.Wo = out[3];
  g.nhwc = nhwc;
  g.kh = static_cast<int>(a.kernel.h), g.kw = static_cast<int>(a.kernel.w);
  g.sh = static_cast<int>(a.stride.h), g.sw = static_cast<int>(a.stride.w);
  g.ph = static_cast<int>(a.padding.h), g.pw = static_cast<int>(a.padding.w);
  g.dh = static_cast<int>(a.dilation.h), g.dw = static_cast<int>(a.dilation.w);
  g.count_include_pad = a.count_include_pad;
  return g;
}

// Element i of a [P, H, W] tensor: plane q, row h, column w.
struct PlanePos {
  int64_t q, h, w;
};
__device__ __forceinline__ PlanePos plane_pos(int64_t i, int64_t H, int64_t W) {
  return {i / (W * H), (i / W) % H, i % W};
}

// Element i, in memory order, of a [N, C, h, w] tensor in g's layout: plane q = n*C + c.
__device__ __forceinline__ PlanePos pos_of(int64_t i, int64_t h, int64_t w, const PoolGeo& g) {
  if (!g.nhwc) return plane_pos(i, h, w);
  const int64_t c = i % g.C, t = i / g.C;
  return {(t / (w * h)) * g.C + c, (t / w) % h, t % w};
}
// Where plane q of a [N, C, h, w] tensor starts, and the step between its pixels.
__device__ __forceinline__ int64_t plane_base(int64_t q, int64_t h, int64_t w, const PoolGeo& g) {
  return g.nhwc ? (q / g.C) * h * w * g.C + q % g.C : q * h * w;
}
__device__ __forceinline__ int64_t pixel_step(const PoolGeo& g) { return g.nhwc ? g.C : 1; }

// Kernel taps k in [lo, hi) whose input position start + k*dil lies in [0, n) (cpu/pool.cc).
__device__ __forceinline__ void tap_range(int64_t start, int64_t k, int64_t dil, int64_t n, int64_t* lo, int64_t* hi) {
  *lo = start >= 0 ? 0 : (-start + dil - 1) / dil;
  *hi = start + (k - 1) * dil < n ? k : (start >= n ? 0 : (n - 1 - start) / dil + 1);
  if (*hi < *lo) *hi = *lo;
}

// idx may be null (inference: no indices wanted).
template <class T>
__global__ void max_pool_kernel(const T* x, T* out, int64_t* idx, PoolGeo g) {
  using M = math_t<T>;
  const int64_t total = g.P * g.Ho * g.Wo;
  MG_GRID_STRIDE(i, total) {
    const auto [q, oh, ow] = pos_of(i, g.Ho, g.Wo, g);
    const T* plane = x + plane_base(q, g.H, g.W, g);
    const int64_t ps = pixel_step(g);
    const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    int64_t ilo, ihi, jlo, jhi;
    tap_range(h0, g.kh, g.dh, g.H, &ilo, &ihi);
    tap_range(w0, g.kw, g.dw, g.W, &jlo, &jhi);
    if (ilo >= ihi || jlo >= jhi) {  // only dilation can leave a window without input
      out[i] = store_m<T>(-std::numeric_limits<M>::infinity());
      if (idx) idx[i] = -1;  // the backward skips it
      continue;
    }
    // The first input element seeds the max: ties and all -inf windows pick the first position;
    // NaN propagates and the last NaN wins (PyTorch's `val > max || isnan(val)`).
    int64_t arg = (h0 + ilo * g.dh) * g.W + w0 + jlo * g.dw;
    M best = load_m(plane[arg * ps]);
    for (int64_t a = ilo; a < ihi; ++a) {
      const int64_t row = (h0 + a * g.dh) * g.W + w0;
      for (int64_t b = jlo; b < jhi; ++b) {
        const M v = load_m(plane[(row + b * g.dw) * ps]);
        if (v > best || v != v) {
          best = v;
          arg = row + b * g.dw;
        }
      }
    }
    out[i] = store_m<T>(best);
    if (idx) idx[i] = arg;
  }
}

// gx (zeroed, accumulator type A) += grad_out at the argmax of each window.
template <class T, class A>
__global__ void max_pool_bwd_kernel(const T* gout, const int64_t* idx, A* gx, PoolGeo g) {
  MG_GRID_STRIDE(i, g.P * g.Ho * g.Wo) {
    const int64_t k = idx[i];
    if (k >= 0 && k < g.H * g.W) {
      const int64_t q = pos_of(i, g.Ho, g.Wo, g).q;
      atomicAdd(gx + plane_base(q, g.H, g.W, g) + k * pixel_step(g), static_cast<A>(load_m(gout[i])));
    }
  }
}

// PyTorch's avg-pool window (cpu/pool.cc's avg_window): clipped to the input for summing;
// the divisor counts the part inside the padded input when count_include_pad.
struct AvgWin {
  int64_t h0, h1, w0, w1, div;  // div 0: the window holds no input element
};
__device__ __forceinline__ AvgWin avg_window(const PoolGeo& g, int64_t oh, int64_t ow) {
  int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  int64_t h1 = min(h0 + g.kh, g.H + g.ph), w1 = min(w0 + g.kw, g.W + g.pw);
  const int64_t pool_size = (h1 - h0) * (w1 - w0);
  h0 = max(h0, int64_t{0}), w0 = max(w0, int64_t{0});
  h1 = min(h1, g.H), w1 = min(w1, g.W);
  if (h0 >= h1 || w0 >= w1) return {h0, h0, w0, w0, 0};
  return {h0, h1, w0, w1, g.count_include_pad ? pool_size : (h1 - h0) * (w1 - w0)};
}

// The sum of plane[h0:h1, w0:w1] (row length W, pixels ps apart), in math_t<T>.
template <class T>
__device__ __forceinline__ math_t<T> window_sum(const T* plane, int64_t W, int64_t ps, int64_t h0, int64_t h1,
                                                int64_t w0, int64_t w1) {
  math_t<T> s = 0;
  for (int64_t a = h0; a < h1; ++a)
    for (int64_t b = w0; b < w1; ++b) s += load_m(plane[(a * W + b) * ps]);
  return s;
}

template <class T>
__global__ void avg_pool_kernel(const T* x, T* out, PoolGeo g) {
  using M = math_t<T>;
  MG_GRID_STRIDE(i, g.P * g.Ho * g.Wo) {
    const auto [q, oh, ow] = pos_of(i, g.Ho, g.Wo, g);
    const AvgWin win = avg_window(g, oh, ow);
    const M s = window_sum(x + plane_base(q, g.H, g.W, g), g.W, pixel_step(g), win.h0, win.h1, win.w0, win.w1);
    out[i] = store_m<T>(win.div > 0 ? s / static_cast<M>(win.div) : M(0));
  }
}

// Outputs o in [lo, hi) whose window [o*s - p, o*s - p + k) along one dim covers input i.
__device__ __forceinline__ void covering(int64_t i, int64_t k, int64_t s, int64_t p, int64_t n_out, int64_t* lo,
                                         int64_t* hi) {
  const int64_t t = i + p - k + 1;  // o*s >= t
  *lo = t <= 0 ? 0 : (t + s - 1) / s;
  *hi = min((i + p) / s + 1, n_out);
}

template <class T>
__global__ void avg_pool_bwd_kernel(const T* gout, T* gx, PoolGeo g) {
  using M = math_t<T>;
  MG_GRID_STRIDE(i, g.P * g.H * g.W) {
    const auto [q, ih, iw] = pos_of(i, g.H, g.W, g);
    const T* gp = gout + plane_base(q, g.Ho, g.Wo, g);
    const int64_t ps = pixel_step(g);
    int64_t olo, ohi, wlo, whi;
    covering(ih, g.kh, g.sh, g.ph, g.Ho, &olo, &ohi);
    covering(iw, g.kw, g.sw, g.pw, g.Wo, &wlo, &whi);
    M s = 0;
    for (int64_t oh = olo; oh < ohi; ++oh)
      for (int64_t ow = wlo; ow < whi; ++ow) {
        const AvgWin win = avg_window(g, oh, ow);
        if (win.div > 0 && ih >= win.h0 && ih < win.h1 && iw >= win.w0 && iw < win.w1)
          s += load_m(gp[(oh * g.Wo + ow) * ps]) / static_cast<M>(win.div);
      }
    gx[i] = store_m<T>(s);
  }
}

// Adaptive window along one dim: [floor(o*in/out), ceil((o+1)*in/out)).
__device__ __forceinline__ int64_t start_index(int64_t o, int64_t out, int64_t in) { return (o * in) / out; }
__device__ __forceinline__ int64_t end_index(int64_t o, int64_t out, int64_t in) {
  return ((o + 1) * in + out - 1) / out;
}

template <class T>
__global__ void adaptive_avg_kernel(const T* x, T* out, PoolGeo g) {
  using M = math_t<T>;
  MG_GRID_STRIDE(i, g.P * g.Ho * g.Wo) {
    const auto [q, oh, ow] = pos_of(i, g.Ho, g.Wo, g);
    const int64_t h0 = start_index(oh, g.Ho, g.H), h1 = end_index(oh, g.Ho, g.H);
    const int64_t w0 = start_index(ow, g.Wo, g.W), w1 = end_index(ow, g.Wo, g.W);
    const M s = window_sum(x + plane_base(q, g.H, g.W, g), g.W, pixel_step(g), h0, h1, w0, w1);
    out[i] = store_m<T>(s / static_cast<M>((h1 - h0) * (w1 - w0)));
  }
}

// Input ih lies in output oh's window exactly for oh in [start_index(ih, H, Ho), end_index(ih, H, Ho)).
template <class T>
__global__ void adaptive_avg_bwd_kernel(const T* gout, T* gx, PoolGeo g) {
  using M = math_t<T>;
  MG_GRID_STRIDE(i, g.P * g.H * g.W) {
    const auto [q, ih, iw] = pos_of(i, g.H, g.W, g);
    const T* gp = gout + plane_base(q, g.Ho, g.Wo, g);
    const int64_t ps = pixel_step(g);
    const int64_t olo = start_index(ih, g.H, g.Ho), ohi = end_index(ih, g.H, g.Ho);
    const int64_t wlo = start_index(iw, g.W, g.Wo), whi = end_index(iw, g.W, g.Wo);
    M s = 0;
    for (int64_t oh = olo; oh < ohi; ++oh) {
      const int64_t kh = end_index(oh, g.Ho, g.H) - start_index(oh, g.Ho, g.H);
      for (int64_t ow = wlo; ow < whi; ++ow) {
        const int64_t kw = end_index(ow, g.Wo, g.W) - start_index(ow, g.Wo, g.W);
        s += load_m(gp[(oh * g.Wo + ow) * ps]) / static_cast<M>(kh * kw);
      }
    }
    gx[i] = store_m<T>(s);
  }
}

// The average pools, forward and backward: one thread per element of `out` runs
// kernel(in, out, g), with T out's dtype. kernel_for(T{}) names kernel<T> (a kernel template
// cannot be passed as such).
template <class KernelFor>
void launch_per_output(const char* op, const Tensor& in, const Tensor& out, const PoolGeo& g, KernelFor kernel_for) {
  if (out.numel() == 0) return;
  mg::cuda::DeviceGuard guard(out.device());
  MG_CUDA_DISPATCH_FLOAT(out.dtype(), op, [&] {
    kernel_for(scalar_t{})<<<blocks_for(out.numel()), kBlock, 0, stream_of(out)>>>(data_as<const scalar_t>(in),
                                                                                   data_as<scalar_t>(out), g);
    MG_CUDA_CHECK_LAUNCH(op);
  });
}

}  // namespace

template <>
void CudaBackend::max_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out, const Tensor& indices) {
  if (out.numel() == 0) return;
  mg::cuda::DeviceGuard guard(out.device());
  const PoolGeo g = geo(x.sizes(), out.sizes(), args, is_channels_last(x));
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    max_pool_kernel<scalar_t><<<blocks_for(out.numel()), kBlock, 0, stream_of(out)>>>(
        data_as<const scalar_t>(x), data_as<scalar_t>(out), data_as<int64_t>(indices), g);
    MG_CUDA_CHECK_LAUNCH("max_pool2d");
  });
}

template <>
void CudaBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_x) {
  if (grad_x.numel() == 0) return;
  mg::cuda::DeviceGuard guard(grad_x.device());
  cudaStream_t st = stream_of(grad_x);
  const PoolGeo g = geo(grad_x.sizes(), grad_out.sizes(), Pool2dArgs{}, is_channels_last(grad_x));
  const unsigned blocks = blocks_for(grad_out.numel());
  MG_CUDA_DISPATCH_FLOAT(grad_x.dtype(), "max_pool2d_backward", [&] {
    using T = scalar_t;
    using A = math_t<T>;  // f32 for f16/bf16: overlapping windows add up in f32, rounded once
    Tensor acc = std::is_same_v<T, A>
                     ? grad_x
                     : empty(grad_x.sizes(), {dtype_of<A>, grad_x.device()}, suggest_memory_format(grad_x));
    MG_CUDA_CHECK(cudaMemsetAsync(acc.raw_data(), 0, acc.nbytes(), st));
    if (grad_out.numel() > 0) {
      max_pool_bwd_kernel<T, A>
          <<<blocks, kBlock, 0, st>>>(data_as<const T>(grad_out), data_as<const int64_t>(indices), data_as<A>(acc), g);
      MG_CUDA_CHECK_LAUNCH("max_pool2d_backward");
    }
    if (!acc.is_same(grad_x)) raw::copy_(grad_x, acc);
  });
}

template <>
void CudaBackend::avg_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out) {
  launch_per_output("avg_pool2d", x, out, geo(x.sizes(), out.sizes(), args, is_channels_last(x)),
                    [](auto t) { return avg_pool_kernel<decltype(t)>; });
}

template <>
void CudaBackend::avg_pool2d_backward(const Tensor& grad_out, const Pool2dArgs& args, const Tensor& grad_x) {
  launch_per_output("avg_pool2d_backward", grad_out, grad_x,
                    geo(grad_x.sizes(), grad_out.sizes(), args, is_channels_last(grad_x)),
                    [](auto t) { return avg_pool_bwd_kernel<decltype(t)>; });
}

template <>
void CudaBackend::adaptive_avg_pool2d(const Tensor& x, const Tensor& out) {
  launch_per_output("adaptive_avg_pool2d", x, out, geo(x.sizes(), out.sizes(), Pool2dArgs{}, is_channels_last(x)),
                    [](auto t) { return adaptive_avg_kernel<decltype(t)>; });
}

template <>
void CudaBackend::adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_x) {
  launch_per_output("adaptive_avg_pool2d_backward", grad_out, grad_x,
                    geo(grad_x.sizes(), grad_out.sizes(), Pool2dArgs{}, is_channels_last(grad_x)),
                    [](auto t) { return adaptive_avg_bwd_kernel<decltype(t)>; });
}

}  // namespace mg::kernels
