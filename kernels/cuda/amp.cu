// CUDA kernels of kernels/amp.h. The unscale kernel takes a list of gradients in one
// launch: block b finds its tensor by a binary search over the per-tensor block offsets
// carried in the kernel argument, so a model's ~150 gradients cost 3 launches, not 150,
// and no host read (the GradScaler reads the flag once per step).
#include <cuda_runtime.h>

#include "kernels/amp_math.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/common.cuh"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

constexpr int kMaxListTensors = 64;
constexpr int kUnscaleThreads = 256;
constexpr int64_t kElemsPerBlock = kUnscaleThreads * 16;

// A gradient's dtype in the kernel arguments: DType's own value.
enum : uint8_t {
  kF64 = static_cast<uint8_t>(DType::f64),
  kF32 = static_cast<uint8_t>(DType::f32),
  kF16 = static_cast<uint8_t>(DType::f16),
  kBF16 = static_cast<uint8_t>(DType::bf16)
};

// 64 * (8 + 8 + 1) + 65 * 8 + 4 bytes: well inside the 4 KiB kernel-argument limit.
struct UnscaleList {
  void* ptr[kMaxListTensors];
  int64_t numel[kMaxListTensors];
  int64_t block_begin[kMaxListTensors + 1];  // block_begin[n] = blocks of the whole launch
  uint8_t dtype[kMaxListTensors];
  int n;
};
static_assert(sizeof(UnscaleList) <= 4096, "kernel arguments must fit in 4 KiB");

template <class T>
__device__ __forceinline__ bool unscale_range(T* p, int64_t begin, int64_t end, math_t<T> s) {
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const math_t<T> v = load_m(p[i]);
    bad |= !isfinite(v);
    p[i] = store_m<T>(v * s);
  }
  return bad;
}

// scale: null, or the device loss scale whose inverse replaces inv_scale (a capturable GradScaler).
__global__ void unscale_kernel(UnscaleList l, float* found_inf, float inv_scale, const float* scale) {
  if (scale) inv_scale = amp_math::inverse_scale(*scale);
  const int64_t b = blockIdx.x;
  int lo = 0, hi = l.n - 1;  // the tensor t with block_begin[t] <= b < block_begin[t + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (l.block_begin[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int t = lo;
  const int64_t begin = (b - l.block_begin[t]) * kElemsPerBlock;
  const int64_t end = min(begin + kElemsPerBlock, l.numel[t]);
  bool bad = false;
  switch (l.dtype[t]) {
    case kF32:
      bad = unscale_range(static_cast<float*>(l.ptr[t]), begin, end, inv_scale);
      break;
    case kF16:
      bad = unscale_range(static_cast<__half*>(l.ptr[t]), begin, end, inv_scale);
      break;
    case kBF16:
      bad = unscale_range(static_cast<__nv_bfloat16*>(l.ptr[t]), begin, end, inv_scale);
      break;
    default:
      bad = unscale_range(static_cast<double*>(l.ptr[t]), begin, end, static_cast<double>(inv_scale));
      break;
  }
  // Every writer stores the same value, so the race is benign (PyTorch's kernel does the same).
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

uint8_t code_of(DType t) {
  MG_CHECK(is_floating(t), DTypeError, "amp_unscale_: expected a floating gradient, got ", t);
  return static_cast<uint8_t>(t);
}

template <class U>
__global__ void stochastic_bf16_kernel(uint16_t* p, const U* u, int64_t n, float alpha, uint64_t seed) {
  MG_GRID_STRIDE(i, n) {
    // Explicit roundings: an fma here would differ from the CPU's multiply-then-add in the
    // last bit, and the stochastic rounding would then occasionally pick the other neighbour.
    const float v = __fadd_rn(__uint_as_float(static_cast<uint32_t>(p[i]) << 16), __fmul_rn(alpha, load_m(u[i])));
    p[i] = amp_math::bf16_stochastic_bits(v, static_cast<uint32_t>(amp_math::mix(seed, static_cast<uint64_t>(i))));
  }
}

__global__ void update_scale_kernel(float* scale, int64_t* growth_tracker, int64_t* skipped, const float* found_inf,
                                    double growth_factor, double backoff_factor, int64_t growth_interval) {
  amp_math::update_scale(*scale, *growth_tracker, *skipped, *found_inf != 0.0f, growth_factor, backoff_factor,
                         growth_interval);
}

}  // namespace

template <>
void CudaBackend::amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped,
                                   const Tensor& found_inf, double growth_factor, double backoff_factor,
                                   int64_t growth_interval) {
  mg::cuda::DeviceGuard guard(scale.device());
  update_scale_kernel<<<1, 1, 0, stream_of(scale)>>>(
      static_cast<float*>(scale.raw_data()), static_cast<int64_t*>(growth_tracker.raw_data()),
      static_cast<int64_t*>(skipped.raw_data()), static_cast<const float*>(found_inf.raw_data()), growth_factor,
      backoff_factor, growth_interval);
  MG_CUDA_CHECK_LAUNCH("amp_update_scale_");
}

template <>
void CudaBackend::amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, float inv_scale,
                              const Tensor& scale) {
  if (grads.empty()) return;
  const float* device_scale = scale.defined() ? static_cast<const float*>(scale.raw_data()) : nullptr;
  mg::cuda::DeviceGuard guard(found_inf.device());
  cudaStream_t st = stream_of(found_inf);
  float* flag = static_cast<float*>(found_inf.raw_data());
  UnscaleList l{};
  auto launch = [&] {
    if (l.n == 0) return;
    const int64_t blocks = l.block_begin[l.n];
    unscale_kernel<<<static_cast<unsigned>(blocks), kUnscaleThreads, 0, st>>>(l, flag, inv_scale, device_scale);
    MG_CUDA_CHECK_LAUNCH("amp_unscale_");
    l = UnscaleList{};
  };
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    if (l.n == kMaxListTensors) launch();
    l.ptr[l.n] = g.raw_data();
    l.numel[l.n] = g.numel();
    l.dtype[l.n] = code_of(g.dtype());
    l.block_begin[l.n + 1] = l.block_begin[l.n] + (g.numel() + kElemsPerBlock - 1) / kElemsPerBlock;
    ++l.n;
  }
  launch();
}

template <>
void CudaBackend::add_stochastic_bf16(const Tensor& param, const Tensor& update, float alpha, uint64_t seed) {
  const int64_t n = param.numel();
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(param.device());
  cudaStream_t st = stream_of(param);
  auto* p = static_cast<uint16_t*>(param.raw_data());
  if (update.dtype() == DType::f32)
    stochastic_bf16_kernel<float>
        <<<blocks_for(n), kBlock, 0, st>>>(p, static_cast<const float*>(update.raw_data()), n, alpha, seed);
  else
    stochastic_bf16_kernel<__nv_bfloat16>
        <<<blocks_for(n), kBlock, 0, st>>>(p, static_cast<const __nv_bfloat16*>(update.raw_data()), n, alpha, seed);
  MG_CUDA_CHECK_LAUNCH("add_stochastic_bf16_");
}

}  // namespace mg::kernels
