// Batch normalization on CUDA over x viewed as [N, C, S] (contiguous), one block per
// channel: the block reduces its channel's N*S values (f32 accumulation, f64 for f64), in
// two passes like kernels/cpu/norm.cc (mean, then squared deviations, which stays accurate
// where E[x^2] - E[x]^2 would cancel), then writes the normalized values in a third. Eval
// mode is one elementwise pass. Backward: one block per channel reduces sum(g) and
// sum(g * (x - mean)) and writes grad_x in the same kernel.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_nn_ops.h"

namespace mg::kernels::cuda {
namespace {

constexpr int kNormBlock = 512;

struct NCS {
  int64_t N, C, S;
};

NCS ncs(const Tensor& x) {
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
  return {x.size(0), x.size(1), S};
}

// Element m in [0, N*S) of channel c.
__device__ __forceinline__ int64_t at(const NCS& s, int64_t c, int64_t m) {
  const int64_t n = m / s.S;
  return (n * s.C + c) * s.S + (m - n * s.S);
}

template <class T>
__device__ __forceinline__ math_t<T> opt(const T* p, int64_t c, math_t<T> dflt) {
  return p ? load_m(p[c]) : dflt;
}

template <class T>
__global__ void bn_train_kernel(const T* x, const T* w, const T* b, T* rmean, T* rvar, T* out, T* smean,
                                T* sinvstd, NCS s, double momentum, double eps) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x, M = s.N * s.S;
  A sum = 0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) sum += load_m(x[at(s, c, m)]);
  const A mean = block_sum(sum, shm) / static_cast<A>(M);
  A sq = 0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const A d = load_m(x[at(s, c, m)]) - mean;
    sq += d * d;
  }
  const A var = block_sum(sq, shm) / static_cast<A>(M);
  const A invstd = A(1) / m_sqrt(var + static_cast<A>(eps));
  if (threadIdx.x == 0) {
    smean[c] = store_m<T>(mean);
    sinvstd[c] = store_m<T>(invstd);
    if (rmean) {
      const A mom = static_cast<A>(momentum);
      rmean[c] = store_m<T>((A(1) - mom) * load_m(rmean[c]) + mom * mean);
      rvar[c] = store_m<T>((A(1) - mom) * load_m(rvar[c]) + mom * var * static_cast<A>(M) / static_cast<A>(M - 1));
    }
  }
  const A scale = opt(w, c, A(1)) * invstd;
  const A shift = opt(b, c, A(0)) - mean * scale;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t i = at(s, c, m);
    out[i] = store_m<T>(load_m(x[i]) * scale + shift);
  }
}

template <class T>
__global__ void bn_eval_kernel(const T* x, const T* w, const T* b, const T* rmean, const T* rvar, T* out, NCS s,
                               double eps) {
  using A = math_t<T>;
  MG_GRID_STRIDE(i, s.N * s.C * s.S) {
    const int64_t c = (i / s.S) % s.C;
    const A invstd = A(1) / m_sqrt(load_m(rvar[c]) + static_cast<A>(eps));
    const A scale = opt(w, c, A(1)) * invstd;
    out[i] = store_m<T>(load_m(x[i]) * scale + (opt(b, c, A(0)) - load_m(rmean[c]) * scale));
  }
}

// training: dx = w*is * (g - mean(g) - (x - mu) * is^2 * mean(g * (x - mu)));
// eval: the statistics are constants, dx = w*is * g.
template <class T>
__global__ void bn_bwd_kernel(const T* g, const T* x, const T* w, const T* mean, const T* invstd, T* dx, T* dw,
                              T* db, NCS s, bool training) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x, M = s.N * s.S;
  const A mu = load_m(mean[c]), is = load_m(invstd[c]);
  A sg = 0, sgd = 0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t i = at(s, c, m);
    const A gv = load_m(g[i]);
    sg += gv;
    sgd += gv * (load_m(x[i]) - mu);
  }
  sg = block_sum(sg, shm);
  sgd = block_sum(sgd, shm);
  if (threadIdx.x == 0) {
    if (dw) dw[c] = store_m<T>(sgd * is);
    if (db) db[c] = store_m<T>(sg);
  }
  if (!dx) return;
  const A a = opt(w, c, A(1)) * is;
  const A mg = training ? sg / static_cast<A>(M) : A(0);
  const A k2 = training ? is * is * sgd / static_cast<A>(M) : A(0);
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t i = at(s, c, m);
    dx[i] = store_m<T>(a * (load_m(g[i]) - mg - (load_m(x[i]) - mu) * k2));
  }
}

template <class T>
const T* cp(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}
template <class T>
T* mp(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

unsigned channel_blocks(int64_t C, const char* op) {
  MG_CHECK(C <= 0x7fffffff, ShapeError, op, ": too many channels (", C, ")");
  return static_cast<unsigned>(C);
}

}  // namespace

void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, double momentum, double eps, const Tensor& out,
                                 const Tensor& save_mean, const Tensor& save_invstd) {
  const NCS s = ncs(x);
  if (s.C == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    bn_train_kernel<T><<<channel_blocks(s.C, "batch_norm"), kNormBlock, 0, stream_of(x)>>>(
        cp<T>(x), cp<T>(weight), cp<T>(bias), mp<T>(running_mean), mp<T>(running_var), mp<T>(out), mp<T>(save_mean),
        mp<T>(save_invstd), s, momentum, eps);
    MG_CUDA_CHECK_LAUNCH("batch_norm");
  });
}

void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, double eps, const Tensor& out) {
  if (x.numel() == 0) return;
  const NCS s = ncs(x);
  mg::cuda::DeviceGuard guard(x.device());
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    bn_eval_kernel<T><<<blocks_for(x.numel()), kBlock, 0, stream_of(x)>>>(
        cp<T>(x), cp<T>(weight), cp<T>(bias), cp<T>(running_mean), cp<T>(running_var), mp<T>(out), s, eps);
    MG_CUDA_CHECK_LAUNCH("batch_norm");
  });
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& invstd, bool training, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias) {
  const NCS s = ncs(x);
  if (s.C == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm_backward", [&] {
    using T = scalar_t;
    bn_bwd_kernel<T><<<channel_blocks(s.C, "batch_norm_backward"), kNormBlock, 0, stream_of(x)>>>(
        cp<T>(grad_out), cp<T>(x), cp<T>(weight), cp<T>(mean), cp<T>(invstd), mp<T>(grad_x), mp<T>(grad_weight),
        mp<T>(grad_bias), s, training);
    MG_CUDA_CHECK_LAUNCH("batch_norm_backward");
  });
}

}  // namespace mg::kernels::cuda
