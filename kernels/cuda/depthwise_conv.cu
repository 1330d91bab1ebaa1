// Depthwise convolution over channels-last operands (see depthwise_conv.h). In NHWC a
// channel's values sit C apart, so a thread owns V adjacent channels (one 16-byte load of x or
// of grad_out a position) and loops over the filter's 3x3 taps, unrolled; the block's slice of
// the weight [C, 1, 3, 3] is staged in shared memory as [tap][channel]. Three kernels:
//   forward:      y[n, oh, ow, c] = sum_taps x[n, oh*s - p + kh*d, ow*s - p + kw*d, c] w[c, kh, kw]
//   input grad:   dx[n, ih, iw, c] = sum of dy[n, oh, ow, c] w[c, kh, kw] over the (oh, ow, kh, kw)
//                 that read (ih, iw): a gather, no atomics
//   weight grad:  dw[c, kh, kw] = sum over n, oh, ow of dy[n, oh, ow, c] x[n, ih, iw, c]: a block of
//                 (channel vectors) x (rows of positions) keeps a thread's taps x V sums in
//                 registers, adds its rows through shared memory and writes one chunk of
//                 partials; a last kernel adds the chunks in order (deterministic).
#include "kernels/cuda/depthwise_conv.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace mg::kernels::cuda {
namespace {

constexpr int kK = 3;  // 3x3 filters (MobileNet's, and most depthwise layers'); others go to cuDNN
constexpr int kTaps = kK * kK;
constexpr int kThreads = 256;

struct Geom {
  int64_t N, C, H, W, OH, OW, Cv;  // x [N, C, H, W], y [N, C, OH, OW], C / V vector columns
  int sh, sw, ph, pw, dh, dw;
};

// The tiling of the forward and input-gradient kernels: block (tx, ty), x over the vector
// columns of blockIdx.x's channel slice, y over spatial positions (grid-stride over
// blockIdx.y). The slice's weights sit in shared memory as [tap][channel] floats, so a thread
// reads its V channels' weight of a tap as one run (the tensor keeps them taps apart).
// Positions are decoded in 32-bit arithmetic (the launcher checks the sizes).
template <class T, int V>
__device__ __forceinline__ void load_weights(const T* w, float (*sw)[32 * V], int64_t c0, int nc) {
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < nc * kTaps; i += blockDim.x * blockDim.y) {
    const int c = i / kTaps, t = i - c * kTaps;
    sw[t][c] = to_float(w[(c0 + c) * kTaps + t]);
  }
  __syncthreads();
}

// Along one axis: the input index that output o's tap k reads (kFlip = false), or the output
// index that reads input o through tap k (kFlip = true); false when there is none.
template <bool kFlip>
__device__ __forceinline__ bool tap_source(int o, int k, int stride, int pad, int dil, int extent, int& i) {
  if constexpr (kFlip) {
    const int t = o + pad - k * dil;
    if (t < 0 || t % stride != 0) return false;
    i = t / stride;
  } else {
    i = o * stride - pad + k * dil;
  }
  return i >= 0 && i < extent;
}

// Calls f(tap, ih, iw) for each of position (oh, ow)'s kK x kK taps that has a source along both
// axes (tap_source): the tap loop of the forward, the input gradient and the filter gradient.
// Unrolled, so `tap` is a constant in each call (a register index).
template <bool kFlip, class F>
__device__ __forceinline__ void for_each_tap(uint32_t oh, uint32_t ow, const Geom& g, int IH, int IW, F&& f) {
#pragma unroll
  for (int kh = 0; kh < kK; ++kh) {
    int ih;
    if (!tap_source<kFlip>(static_cast<int>(oh), kh, g.sh, g.ph, g.dh, IH, ih)) continue;
#pragma unroll
    for (int kw = 0; kw < kK; ++kw) {
      int iw;
      if (!tap_source<kFlip>(static_cast<int>(ow), kw, g.sw, g.pw, g.dw, IW, iw)) continue;
      f(kh * kK + kw, ih, iw);
    }
  }
}

// kFlip = false: the forward, y[p] = sum over taps of x[p's tap] w[tap]. kFlip = true: the
// input gradient, dx[q] = sum over the (output, tap) pairs that read q of dy[output] w[tap].
template <class T, int V, bool kFlip>
__global__ void __launch_bounds__(kThreads) dw_apply_kernel(const T* in, const T* w, T* out, Geom g) {
  __shared__ float sw[kTaps][32 * V];  // a slice is at most 32 threads of V channels
  const int64_t c0 = blockIdx.x * static_cast<int64_t>(blockDim.x) * V;
  const int nc = static_cast<int>(min(static_cast<int64_t>(blockDim.x) * V, g.C - c0));
  load_weights<T, V>(w, sw, c0, nc);
  const int64_t cv = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (cv >= g.Cv) return;
  const int cl = threadIdx.x * V;  // this thread's first channel within the slice
  // Output positions (forward) or input positions (input gradient), and the other side's sizes.
  const uint32_t OW = static_cast<uint32_t>(kFlip ? g.W : g.OW), OH = static_cast<uint32_t>(kFlip ? g.H : g.OH);
  const int IH = static_cast<int>(kFlip ? g.OH : g.H), IW = static_cast<int>(kFlip ? g.OW : g.W);
  const uint32_t M = static_cast<uint32_t>(g.N) * OH * OW;
  for (uint32_t p = blockIdx.y * blockDim.y + threadIdx.y; p < M; p += gridDim.y * blockDim.y) {
    const uint32_t q = p / OW, ow = p - q * OW, oh = q % OH, n = q / OH;
    float acc[V] = {};
    for_each_tap<kFlip>(oh, ow, g, IH, IW, [&](int t, int ih, int iw) {
      float v[V];
      load_v<V>(in + ((static_cast<int64_t>(n) * IH + ih) * IW + iw) * g.C + cv * V, v);
      const float* wt = &sw[t][cl];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += v[k] * wt[k];
    });
    store_v<V>(out + static_cast<int64_t>(p) * g.C + cv * V, acc);
  }
}

// Block (tx, ty): x over vector columns cv, y over positions of chunk blockIdx.y (`per`
// positions a chunk). partial[(chunk * kTaps + t) * C + c].
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    dw_bwd_filter_kernel(const T* x, const T* gy, float* partial, Geom g, uint32_t per) {
  __shared__ float red[kThreads * V];
  const int64_t cv = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const uint32_t OW = static_cast<uint32_t>(g.OW), OH = static_cast<uint32_t>(g.OH);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const uint32_t M = static_cast<uint32_t>(g.N) * OH * OW, p0 = blockIdx.y * per, p1 = min(M, p0 + per);
  float acc[kTaps][V] = {};
  if (cv < g.Cv)
    for (uint32_t p = p0 + threadIdx.y; p < p1; p += blockDim.y) {
      const uint32_t q = p / OW, ow = p - q * OW, oh = q % OH, n = q / OH;
      float gv[V];
      load_v<V>(gy + static_cast<int64_t>(p) * g.C + cv * V, gv);
      for_each_tap<false>(oh, ow, g, H, W, [&](int t, int ih, int iw) {
        float xv[V];
        load_v<V>(x + ((static_cast<int64_t>(n) * H + ih) * W + iw) * g.C + cv * V, xv);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[t][k] += gv[k] * xv[k];
      });
    }
  // The block's rows of each tap's sums: a tree over the rows when their count is a power of
  // two (every thread adding, log2(ty) steps), else row lane 0 adds them in order. Either way
  // the order is fixed.
  const int slot = (threadIdx.y * blockDim.x + threadIdx.x) * V, row = blockDim.x * V;
  const bool tree = (blockDim.y & (blockDim.y - 1)) == 0;
#pragma unroll
  for (int t = 0; t < kTaps; ++t) {
#pragma unroll
    for (int k = 0; k < V; ++k) red[slot + k] = acc[t][k];
    __syncthreads();
    float s[V];
    if (tree) {
      for (int half = blockDim.y / 2; half > 0; half /= 2) {
        if (static_cast<int>(threadIdx.y) < half)
#pragma unroll
          for (int k = 0; k < V; ++k) red[slot + k] += red[slot + half * row + k];
        __syncthreads();
      }
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] = red[slot + k];
    } else if (threadIdx.y == 0) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        s[k] = 0;
        for (int y = 0; y < static_cast<int>(blockDim.y); ++y) s[k] += red[y * row + threadIdx.x * V + k];
      }
    }
    if (threadIdx.y == 0 && cv < g.Cv)
#pragma unroll
      for (int k = 0; k < V; ++k) partial[(blockIdx.y * static_cast<int64_t>(kTaps) + t) * g.C + cv * V + k] = s[k];
    __syncthreads();
  }
}

// dw[c * taps + t] = the chunks' partials of j = t * C + c: block (32, kFinalY) takes 32
// consecutive j, thread (x, y) adds chunks y, y + kFinalY, ... (kFinalY loads in flight per
// output), then the kFinalY sums are added in order (deterministic).
constexpr int kFinalY = 16;
template <class T>
__global__ void dw_bwd_filter_final_kernel(const float* partial, T* dw, int64_t C, int64_t chunks) {
  __shared__ float red[kFinalY][33];
  const int64_t n = C * kTaps, j = blockIdx.x * 32LL + threadIdx.x;
  float s = 0;
  if (j < n)
    for (int64_t k = threadIdx.y; k < chunks; k += kFinalY) s += partial[k * n + j];
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= n) return;
  for (int y = 1; y < kFinalY; ++y) s += red[y][threadIdx.x];
  const int64_t t = j / C, c = j - t * C;
  dw[c * kTaps + t] = from_float<T>(s);
}

bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.raw_data()) & 15) == 0; }

template <class T, int V>
void launch(DepthwiseDir dir, const Tensor& x, const Tensor& w, const Tensor& y, Geom g) {
  cudaStream_t st = stream_of(y);
  const int tx = static_cast<int>(std::min<int64_t>(g.Cv, 32)), ty = kThreads / tx;
  const int64_t gx = (g.Cv + tx - 1) / tx;
  const dim3 block(tx, ty);
  // Enough blocks for about eight an SM, each walking its positions in steps of the grid.
  auto apply_grid = [&](int64_t positions) {
    const int64_t gy = std::clamp<int64_t>((8 * sm_count(y.device()) + gx - 1) / gx, 1, (positions + ty - 1) / ty);
    return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(std::min<int64_t>(gy, 65535)));
  };
  const T* wp = static_cast<const T*>(w.raw_data());
  switch (dir) {
    case DepthwiseDir::Fwd:
      dw_apply_kernel<T, V, false><<<apply_grid(g.N * g.OH * g.OW), block, 0, st>>>(
          static_cast<const T*>(x.raw_data()), wp, static_cast<T*>(y.raw_data()), g);
      break;
    case DepthwiseDir::BwdData:
      dw_apply_kernel<T, V, true><<<apply_grid(g.N * g.H * g.W), block, 0, st>>>(static_cast<const T*>(y.raw_data()),
                                                                                 wp, static_cast<T*>(x.raw_data()), g);
      break;
    case DepthwiseDir::BwdFilter: {
      const int64_t M = g.N * g.OH * g.OW;
      // About four blocks an SM over the grid, each chunk at least 4 positions a row lane.
      const int64_t chunks = std::clamp<int64_t>(
          std::min<int64_t>((4 * sm_count(y.device()) + gx - 1) / gx, (M + 4 * ty - 1) / (4 * ty)), 1, 65535);
      const int64_t per = (M + chunks - 1) / chunks;
      Tensor partial = empty({chunks * kTaps * g.C}, {DType::f32, y.device()});
      dw_bwd_filter_kernel<T, V><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(chunks)), block, 0, st>>>(
          static_cast<const T*>(x.raw_data()), static_cast<const T*>(y.raw_data()), partial.data_ptr<float>(), g,
          static_cast<uint32_t>(per));
      MG_CUDA_CHECK_LAUNCH("conv2d_backward_weight (depthwise)");
      dw_bwd_filter_final_kernel<T><<<static_cast<unsigned>((g.C * kTaps + 31) / 32), dim3(32, kFinalY), 0, st>>>(
          partial.data_ptr<float>(), static_cast<T*>(w.raw_data()), g.C, chunks);
      break;
    }
  }
  MG_CUDA_CHECK_LAUNCH("conv2d (depthwise, channels-last)");
}

template <class T>
void dispatch(DepthwiseDir dir, const Tensor& x, const Tensor& w, const Tensor& y, Geom g) {
  constexpr int kV = kVec16<T>;
  if (g.C % kV == 0 && aligned16(x) && aligned16(y)) {
    g.Cv = g.C / kV;
    launch<T, kV>(dir, x, w, y, g);
  } else {
    g.Cv = g.C;
    launch<T, 1>(dir, x, w, y, g);
  }
}

}  // namespace

bool depthwise_conv_nhwc(DepthwiseDir dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dArgs& a) {
  const MemoryFormat cl = MemoryFormat::ChannelsLast;
  if (x.dim() != 4 || w.dim() != 4 || y.dim() != 4) return false;
  const int64_t C = x.size(1);
  if (a.groups != C || w.size(0) != C || w.size(1) != 1 || y.size(1) != C || y.size(0) != x.size(0)) return false;
  if (w.size(2) != kK || w.size(3) != kK) return false;
  const DType dt = x.dtype();
  if ((dt != DType::f32 && dt != DType::f16 && dt != DType::bf16) || w.dtype() != dt || y.dtype() != dt) return false;
  if (!x.is_contiguous(cl) || !y.is_contiguous(cl) || !w.is_contiguous()) return false;
  if (x.numel() == 0 || y.numel() == 0) return false;
  Geom g{};
  g.N = x.size(0), g.C = C, g.H = x.size(2), g.W = x.size(3), g.OH = y.size(2), g.OW = y.size(3);
  g.sh = static_cast<int>(a.stride.h), g.sw = static_cast<int>(a.stride.w);
  g.ph = static_cast<int>(a.padding.h), g.pw = static_cast<int>(a.padding.w);
  g.dh = static_cast<int>(a.dilation.h), g.dw = static_cast<int>(a.dilation.w);
  if (g.sh <= 0 || g.sw <= 0 || g.dh <= 0 || g.dw <= 0) return false;
  // Positions and rows in 32-bit arithmetic inside the kernels.
  if (g.N * std::max(g.H * g.W, g.OH * g.OW) >= (int64_t{1} << 31) || std::max(g.H, g.W) >= (1 << 20)) return false;
  mg::cuda::DeviceGuard guard(y.device());
  switch (dt) {
    case DType::f32:
      dispatch<float>(dir, x, w, y, g);
      break;
    case DType::f16:
      dispatch<__half>(dir, x, w, y, g);
      break;
    default:
      dispatch<__nv_bfloat16>(dir, x, w, y, g);
      break;
  }
  return true;
}

}  // namespace mg::kernels::cuda
