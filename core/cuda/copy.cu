// Copies (any dtype to any dtype, any strides, host<->device), fills and Philox random
// fills on CUDA. Registered as core's CUDA hooks, so raw::copy_/fill_/uniform_ just work.
#include <cuda_runtime.h>

#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/dtype_cuda.cuh"
#include "core/device_runtime.h"
#include "core/random.h"

namespace mg::cuda {

StridedIndexer make_indexer(const Tensor& t) {
  MG_CHECK(t.dim() <= kMaxDims, ShapeError, "CUDA kernels: at most ", kMaxDims, " dims supported, got ", t.dim());
  StridedIndexer ix;
  int nd = 0;  // dims kept so far, outermost first
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.sizes()[d], stride = t.strides()[d];
    if (size == 1) continue;
    if (nd > 0 && ix.strides[nd - 1] == stride * size) {  // the kept outer dim continues into this one
      ix.sizes[nd - 1] *= size;
      ix.strides[nd - 1] = stride;
      continue;
    }
    ix.sizes[nd] = size;
    ix.strides[nd] = stride;
    ++nd;
  }
  ix.ndim = nd;
  ix.small = t.numel() < (int64_t{1} << 31);
  if (ix.small)
    for (int d = 0; d < nd; ++d) ix.divs[d] = FastDiv(static_cast<uint32_t>(ix.sizes[d]));
  return ix;
}

namespace {

cudaStream_t current_stream(int device) { return static_cast<cudaStream_t>(Stream::current(device).handle()); }

template <class D, class S>
__global__ void copy_kernel(D* dst, StridedIndexer di, const S* src, StridedIndexer si, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[di(i)] = from_double<D>(to_double(src[si(i)]));
  }
}

// Casts between contiguous tensors (autocast's f32 <-> f16/bf16 traffic): no index math, four
// elements a thread through one vector load and one vector store when both sides are aligned,
// and half <-> float through float (exact), not double.
template <class D, class S>
__device__ __forceinline__ D cast_one(S x) {
  constexpr bool kViaFloat =
      !std::is_integral_v<D> && !std::is_integral_v<S> && !std::is_same_v<D, double> && !std::is_same_v<S, double>;
  if constexpr (kViaFloat)
    return from_float<D>(to_float(x));
  else
    return from_double<D>(to_double(x));
}

template <class D, class S, int V>
__global__ void cast_contig_kernel(D* dst, const S* src, int64_t n) {
  const int64_t nv = V > 1 ? n / V : 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nv;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const AlignedVec<S, V> in = reinterpret_cast<const AlignedVec<S, V>*>(src)[i];
    AlignedVec<D, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = cast_one<D>(in.v[j]);
    reinterpret_cast<AlignedVec<D, V>*>(dst)[i] = out;
  }
  for (int64_t i = nv * V + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = cast_one<D>(src[i]);
}

template <class T>
__global__ void copy_same_kernel(T* dst, StridedIndexer di, const T* src, StridedIndexer si, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[di(i)] = src[si(i)];
  }
}

// Same-dtype strided copy, V elements at a time: used when every run of V logical elements
// starting at a multiple of V is contiguous and 16-byte aligned in both tensors (e.g. the
// [B, T, H, D] <-> [B, H, T, D] head transposes: runs of D), so the index math is paid once
// per 16 bytes instead of once per element.
template <class T, int V>
__global__ void copy_vec_kernel(T* dst, StridedIndexer di, const T* src, StridedIndexer si, int64_t nvec) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nvec;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i * V;
    *reinterpret_cast<AlignedVec<T, V>*>(dst + di(e)) = *reinterpret_cast<const AlignedVec<T, V>*>(src + si(e));
  }
}

// True when `ix` (coalesced) keeps runs of v elements contiguous and aligned to v elements.
bool vec_ok(const StridedIndexer& ix, const void* base, int v, size_t esize) {
  if (ix.ndim == 0 || reinterpret_cast<uintptr_t>(base) % (v * esize) != 0 || ix.offset % v != 0) return false;
  if (ix.strides[ix.ndim - 1] != 1 || ix.sizes[ix.ndim - 1] % v != 0) return false;
  for (int d = 0; d < ix.ndim - 1; ++d)
    if (ix.strides[d] % v != 0) return false;
  return true;
}

// Both on the same device.
void device_copy(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard g(dst.device().index);
  cudaStream_t st = current_stream(dst.device().index);
  // Contiguous on both sides, or the same dense layout (two channels-last tensors): flat.
  const bool flat =
      (dst.is_contiguous() && src.is_contiguous() && src.sizes() == dst.sizes()) || same_dense_layout(dst, src);
  if (flat && dst.dtype() == src.dtype()) {
    MG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, st));
    return;
  }
  if (flat) {
    MG_CUDA_DISPATCH_ALL(dst.dtype(), "copy_", [&] {
      using D = scalar_t;
      MG_CUDA_DISPATCH_ALL(src.dtype(), "copy_", [&] {
        using S = scalar_t;
        constexpr int V = 4;
        D* pd = static_cast<D*>(dst.raw_data());
        const S* ps = static_cast<const S*>(src.raw_data());
        const bool aligned = reinterpret_cast<uintptr_t>(pd) % (sizeof(D) * V) == 0 &&
                             reinterpret_cast<uintptr_t>(ps) % (sizeof(S) * V) == 0;
        if (aligned)
          cast_contig_kernel<D, S, V><<<grid_for((n + V - 1) / V), 256, 0, st>>>(pd, ps, n);
        else
          cast_contig_kernel<D, S, 1><<<grid_for(n), 256, 0, st>>>(pd, ps, n);
      });
    });
    MG_CUDA_CHECK_LAUNCH("copy_");
    return;
  }
  StridedIndexer di = make_indexer(dst), si = make_indexer(src);
  if (dst.dtype() == src.dtype()) {
    MG_CUDA_DISPATCH_ALL(dst.dtype(), "copy_", [&] {
      constexpr int V = kVec16<scalar_t>;
      if (V > 1 && n % V == 0 && vec_ok(di, dst.raw_data(), V, sizeof(scalar_t)) &&
          vec_ok(si, src.raw_data(), V, sizeof(scalar_t))) {
        copy_vec_kernel<scalar_t, V><<<grid_for(n / V), 256, 0, st>>>(
            static_cast<scalar_t*>(dst.raw_data()), di, static_cast<const scalar_t*>(src.raw_data()), si, n / V);
        return;
      }
      copy_same_kernel<scalar_t><<<grid_for(n), 256, 0, st>>>(static_cast<scalar_t*>(dst.raw_data()), di,
                                                              static_cast<const scalar_t*>(src.raw_data()), si, n);
    });
  } else {
    MG_CUDA_DISPATCH_ALL(dst.dtype(), "copy_", [&] {
      using D = scalar_t;
      MG_CUDA_DISPATCH_ALL(src.dtype(), "copy_", [&] {
        copy_kernel<D, scalar_t><<<grid_for(n), 256, 0, st>>>(static_cast<D*>(dst.raw_data()), di,
                                                              static_cast<const scalar_t*>(src.raw_data()), si, n);
      });
    });
  }
  MG_CUDA_CHECK_LAUNCH("copy_");
}

void cuda_copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  if (dst.numel() == 0) return;
  if (dst.is_cuda() && src.is_cuda()) {
    if (dst.device() == src.device()) return device_copy(dst, src);
    // Peer copy through a contiguous staging tensor on the destination device.
    Tensor s = raw::contiguous(src);
    Tensor stage = empty(src.sizes(), {src.dtype(), dst.device()});
    MG_CUDA_CHECK(cudaMemcpyPeer(stage.raw_data(), dst.device().index, s.raw_data(), src.device().index, s.nbytes()));
    return device_copy(dst, stage);
  }
  const int capture_device = dst.is_cuda() ? dst.device().index : src.device().index;
  MG_CHECK(!is_capturing(capture_device), DeviceError, "copy_: a copy between ", src.device(), " and ", dst.device(),
           " during CUDA graph capture (item(), to(cpu) or a host tensor's upload); a captured step reads and "
           "writes device tensors only: copy inputs into static device tensors before replay()");
  if (dst.is_cuda()) {
    // Host -> device: make the host side contiguous in the destination dtype, then one memcpy.
    Tensor h = raw::contiguous(raw::to_dtype(src, dst.dtype()));
    DeviceGuard g(dst.device().index);
    cudaStream_t st = current_stream(dst.device().index);
    Tensor target = dst.is_contiguous() ? dst : empty(dst.sizes(), {dst.dtype(), dst.device()});
    MG_CUDA_CHECK(cudaMemcpyAsync(target.raw_data(), h.raw_data(), h.nbytes(), cudaMemcpyHostToDevice, st));
    if (!target.is_same(dst)) device_copy(dst, target);
    // The host buffer may be a temporary: without pinned, caller-owned memory, wait.
    if (!non_blocking || !h.is_same(src)) MG_CUDA_CHECK(cudaStreamSynchronize(st));
    return;
  }
  // Device -> host.
  DeviceGuard g(src.device().index);
  cudaStream_t st = current_stream(src.device().index);
  Tensor d = src.is_contiguous() ? src : raw::contiguous(src);
  Tensor h =
      (dst.is_contiguous() && dst.dtype() == src.dtype()) ? dst : empty(src.sizes(), {src.dtype(), Device::cpu()});
  MG_CUDA_CHECK(cudaMemcpyAsync(h.raw_data(), d.raw_data(), d.nbytes(), cudaMemcpyDeviceToHost, st));
  if (!non_blocking || !h.is_same(dst)) MG_CUDA_CHECK(cudaStreamSynchronize(st));
  if (!h.is_same(dst)) raw::copy_(dst, h);
}

template <class T>
__global__ void fill_kernel(T* dst, StridedIndexer di, T v, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[di(i)] = v;
}

template <class T>
T host_value(double v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0;
  else if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<long long>(v));
  else
    return static_cast<T>(v);
}

void cuda_fill(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard g(dst.device().index);
  cudaStream_t st = current_stream(dst.device().index);
  if (value == 0.0 && dst.is_contiguous()) {
    MG_CUDA_CHECK(cudaMemsetAsync(dst.raw_data(), 0, dst.nbytes(), st));
    return;
  }
  StridedIndexer di = make_indexer(dst);
  MG_CUDA_DISPATCH_ALL(dst.dtype(), "fill_", [&] {
    scalar_t v = host_value<scalar_t>(value);
    fill_kernel<scalar_t><<<grid_for(n), 256, 0, st>>>(static_cast<scalar_t*>(dst.raw_data()), di, v, n);
  });
  MG_CUDA_CHECK_LAUNCH("fill_");
}

template <class T>
__global__ void philox_kernel(T* dst, StridedIndexer di, int kind, uint64_t seed, uint64_t base, double a, double b,
                              int64_t n, const int64_t* device_offset) {
  if (device_offset) base += static_cast<uint64_t>(*device_offset);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t r[4];
    double v;
    if (kind == 1) {
      philox4x32(base + static_cast<uint64_t>(i) / 2, 0, seed, r);
      int j = static_cast<int>(i & 1) * 2;
      double u1 = 1.0 - (r[j] >> 8) * (1.0 / 16777216.0);
      double u2 = (r[j + 1] >> 8) * (1.0 / 16777216.0);
      v = a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    } else {
      philox4x32(base + static_cast<uint64_t>(i) / 4, 0, seed, r);
      double u = (r[i & 3] >> 8) * (1.0 / 16777216.0);
      v = kind == 2 ? (u < a ? 1.0 : 0.0) : a + (b - a) * u;
    }
    if constexpr (std::is_same_v<T, double>)
      dst[di(i)] = v;
    else
      dst[di(i)] = from_float<T>(static_cast<float>(v));
  }
}

void cuda_philox_fill(const Tensor& dst, int kind, uint64_t seed, uint64_t offset, double a, double b,
                      const int64_t* device_offset) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard g(dst.device().index);
  cudaStream_t st = current_stream(dst.device().index);
  StridedIndexer di = make_indexer(dst);
  MG_CUDA_DISPATCH_FLOAT(dst.dtype(), "random fill", [&] {
    philox_kernel<scalar_t><<<grid_for(n), 256, 0, st>>>(static_cast<scalar_t*>(dst.raw_data()), di, kind, seed, offset,
                                                         a, b, n, device_offset);
  });
  MG_CUDA_CHECK_LAUNCH("random fill");
}

}  // namespace

// Called once from the CUDA backend's registration (core/cuda/register_backend.cc).
void register_copy_hooks() {
  cuda_hooks().copy = &cuda_copy;
  cuda_hooks().fill = &cuda_fill;
  cuda_hooks().philox_fill = &cuda_philox_fill;
}

}  // namespace mg::cuda
