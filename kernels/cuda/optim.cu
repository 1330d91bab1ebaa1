// Multi-tensor launches for the optimizers: a kernel argument carries up to kMaxTensors
// tensors' pointers and a block->(tensor, chunk) table, so one launch updates many parameters
// (the apex/PyTorch multi_tensor_apply scheme) instead of one launch per op per parameter.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/optim_math.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

constexpr int kMaxTensors = 32;
constexpr int kMaxBlocks = 320;
// Elements per block: 64K for large lists (few launches), down to 2K for small ones so their
// blocks still cover the device (the main job's MLP, 235K parameters, would get 4 blocks of 64K
// on 132 SMs: the fused SGD step was 27% of its captured training step).
constexpr int64_t kMaxChunk = 65536, kMinChunk = 2048, kTargetBlocks = 512;
int64_t chunk_for(const std::vector<int64_t>& numel) {
  int64_t total = 0;
  for (int64_t n : numel) total += n;
  int64_t chunk = kMinChunk;
  while (chunk < kMaxChunk && chunk * kTargetBlocks < total) chunk *= 2;
  return chunk;
}
constexpr int kThreads = 512;

// Kept under the classic 4 KiB kernel-parameter limit: 6*32*8 + 2*32*8 + 2*32*4 + 320 + 320*4.
template <int Depth, int Tensors = kMaxTensors>
struct TensorListMeta {
  static constexpr int kTensors = Tensors;
  float* ptr[Depth][Tensors];
  int64_t* step[Tensors];  // capturable Adam: the parameter's device step count, else null
  int64_t numel[Tensors];
  int64_t chunk;      // elements per block, chunk_for() of the whole list
  float s0[Tensors];  // per tensor scalar: Adam step size, SGD first-step flag
  float s1[Tensors];  // per tensor scalar: Adam sqrt(1 - beta2^t)
  unsigned char block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};
static_assert(sizeof(TensorListMeta<6>) + 64 <= 4096, "kernel parameters must fit in 4 KiB");

// Walks the tensors in chunks, filling `meta` and calling launch(meta, nblocks) whenever the
// block table or the tensor table is full, and once at the end. A tensor cut by a launch is
// carried into the next table with its remaining chunks. `chunk`: the elements a block takes
// (default: chunk_for() of the list).
template <int Depth, int Tensors = kMaxTensors, class FillTensor, class Launch>
void multi_tensor_apply(size_t ntensors, const std::vector<int64_t>& numel, FillTensor fill, Launch launch,
                        int64_t chunk = 0) {
  TensorListMeta<Depth, Tensors> meta;
  std::memset(&meta, 0, sizeof(meta));
  meta.chunk = chunk > 0 ? chunk : chunk_for(numel);
  const int64_t chunk_elems = meta.chunk;
  int nt = 0, nb = 0;
  for (size_t i = 0; i < ntensors; ++i) {
    if (numel[i] == 0) continue;
    fill(meta, nt, i);
    meta.numel[nt] = numel[i];
    const int64_t chunks = (numel[i] + chunk_elems - 1) / chunk_elems;
    ++nt;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_tensor[nb] = static_cast<unsigned char>(nt - 1);
      meta.block_chunk[nb] = static_cast<int>(c);
      ++nb;
      const bool blocks_full = nb == kMaxBlocks;
      const bool tensors_full = nt == Tensors && c == chunks - 1;
      if (blocks_full || tensors_full) {
        launch(meta, nb);
        nb = 0;
        if (c == chunks - 1) {
          nt = 0;
        } else {  // carry the current tensor over as entry 0
          for (int d = 0; d < Depth; ++d) meta.ptr[d][0] = meta.ptr[d][nt - 1];
          meta.step[0] = meta.step[nt - 1];
          meta.numel[0] = meta.numel[nt - 1];
          meta.s0[0] = meta.s0[nt - 1];
          meta.s1[0] = meta.s1[nt - 1];
          nt = 1;
        }
      }
    }
  }
  if (nb > 0) launch(meta, nb);
}

// This block's tensor t and its elements [begin, end).
struct BlockRange {
  int t;
  int64_t begin, end;
};
template <class Meta>
__device__ __forceinline__ BlockRange block_range(const Meta& m) {
  const int t = m.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(m.block_chunk[blockIdx.x]) * m.chunk;
  return {t, begin, min(begin + m.chunk, m.numel[t])};
}

// What a capturable update reads from device memory (kernels/types.h DeviceScalars): null
// pointers mean the launch arguments hold the values.
struct DeviceArgs {
  const double* lr = nullptr;
  const float* found_inf = nullptr;
  double beta1 = 0, beta2 = 0;  // Adam with device step counts: bias corrections on the device
};
__device__ __forceinline__ bool skip_update(const DeviceArgs& d) { return d.found_inf && *d.found_inf != 0.0f; }

// Tensor t's step size and sqrt(1 - beta2^step), and the lr: from the launch table, or from
// device memory in a capturable update (the host computes the same expression for host counts).
template <class Meta>
__device__ __forceinline__ void adam_step_scalars(const Meta& m, int t, const DeviceArgs& d,
                                                  optim_math::AdamScalars<float>& s, float& step_size,
                                                  float& bc2_sqrt) {
  step_size = m.s0[t], bc2_sqrt = m.s1[t];
  if (d.lr) s.lr = static_cast<float>(*d.lr);
  if (m.step[t]) {
    double ss = 0, bc = 0;
    optim_math::adam_bias_corrections(d.lr ? *d.lr : static_cast<double>(s.lr), d.beta1, d.beta2,
                                      static_cast<double>(*m.step[t]), &ss, &bc);
    step_size = static_cast<float>(ss);
    bc2_sqrt = static_cast<float>(bc);
  }
}

// Capturable Adam: every listed step count += 1, unless the update is skipped; runs before the
// update kernels, which then read the new counts.
constexpr int kMaxCounters = 128;
struct CounterList {
  int64_t* count[kMaxCounters];
  int n;
};
__global__ void step_count_kernel(CounterList c, DeviceArgs d) {
  if (skip_update(d)) return;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < c.n) ++*c.count[i];
}

// ptr: 0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq (amsgrad only), 5 the
// parameter's low-precision copy (a D*, null when it has none): written with the new value
// rounded to nearest, as cast_list_kernel would (the next autocast region's cast), or with the
// parameter as it is when the update is skipped.
template <class D>
__global__ void adam_kernel(TensorListMeta<6> m, optim_math::AdamScalars<float> s, DeviceArgs d) {
  const auto [t, begin, end] = block_range(m);
  float* p = m.ptr[0][t];
  D* low = reinterpret_cast<D*>(m.ptr[5][t]);
  if (skip_update(d)) {
    if (low)
      for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) low[i] = from_float<D>(p[i]);
    return;
  }
  const float* g = m.ptr[1][t];
  float* ea = m.ptr[2][t];
  float* eas = m.ptr[3][t];
  float* vmax = m.ptr[4][t];
  float step_size = 0, bc2_sqrt = 0;
  adam_step_scalars(m, t, d, s, step_size, bc2_sqrt);
  // 16-byte loads and stores where every list is aligned at the chunk's start (the allocator's
  // blocks are; a view at an odd offset is not), the same per-element math, the tail one at a time.
  const uintptr_t bases = reinterpret_cast<uintptr_t>(p + begin) | reinterpret_cast<uintptr_t>(g + begin) |
                          reinterpret_cast<uintptr_t>(ea + begin) | reinterpret_cast<uintptr_t>(eas + begin) |
                          (vmax ? reinterpret_cast<uintptr_t>(vmax + begin) : 0);
  const bool low_aligned = !low || (reinterpret_cast<uintptr_t>(low + begin) & 7) == 0;
  int64_t tail = begin;
  if ((bases & 15) == 0 && low_aligned) {
    tail = begin + ((end - begin) & ~int64_t{3});
    for (int64_t i = begin + 4 * threadIdx.x; i < tail; i += 4 * blockDim.x) {
      float4 pv = *reinterpret_cast<const float4*>(p + i), gv = *reinterpret_cast<const float4*>(g + i);
      float4 mv = *reinterpret_cast<const float4*>(ea + i), vv = *reinterpret_cast<const float4*>(eas + i);
      float4 xv = vmax ? *reinterpret_cast<const float4*>(vmax + i) : float4{};
      float* const pk[4] = {&pv.x, &pv.y, &pv.z, &pv.w};
      const float gk[4] = {gv.x, gv.y, gv.z, gv.w};
      float* const mk[4] = {&mv.x, &mv.y, &mv.z, &mv.w};
      float* const vk[4] = {&vv.x, &vv.y, &vv.z, &vv.w};
      float* const xk[4] = {&xv.x, &xv.y, &xv.z, &xv.w};
#pragma unroll
      for (int k = 0; k < 4; ++k)
        optim_math::adam_element<float>(*pk[k], gk[k], *mk[k], *vk[k], vmax ? xk[k] : nullptr, s, step_size, bc2_sqrt);
      *reinterpret_cast<float4*>(p + i) = pv;
      *reinterpret_cast<float4*>(ea + i) = mv;
      *reinterpret_cast<float4*>(eas + i) = vv;
      if (vmax) *reinterpret_cast<float4*>(vmax + i) = xv;
      if (low) {
        AlignedVec<D, 4> o;
        o.v[0] = from_float<D>(pv.x), o.v[1] = from_float<D>(pv.y), o.v[2] = from_float<D>(pv.z),
        o.v[3] = from_float<D>(pv.w);
        *reinterpret_cast<AlignedVec<D, 4>*>(low + i) = o;
      }
    }
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    float pi = p[i], mi = ea[i], vi = eas[i];
    optim_math::adam_element<float>(pi, g[i], mi, vi, vmax ? vmax + i : nullptr, s, step_size, bc2_sqrt);
    p[i] = pi;
    ea[i] = mi;
    eas[i] = vi;
    if (low) low[i] = from_float<D>(pi);
  }
}

// 8-bit Adam: a block of kQuantThreads threads takes the 2048-element quantization blocks of its
// chunk one at a time, each thread holding 8 consecutive elements in registers between the update
// and the requantization (the new absmax is the block's max over all of them), which finds each
// new code by optim_math::quantize_nearest_lut. Chunks as large as the f32
// update's keep the launches as few (one 2048-element block a CUDA block took 190 launches for
// GPT-2 124M). ptr: 0 param, 1 grad, 2 exp_avg codes (u8*),
// 3 exp_avg_sq codes, 4 exp_avg absmax (one float a block), 5 exp_avg_sq absmax, 6 the low copy
// (a D*, or null).
constexpr int kQuantThreads = 256;
constexpr int kQuantPerThread = optim_math::kQuantBlock / kQuantThreads;
static_assert(kQuantPerThread == 8, "a thread's elements are two float4 and one uint2 of codes");
constexpr int kQuantTensors = 24;
static_assert(kMinChunk % optim_math::kQuantBlock == 0, "a launch's chunks must be whole quantization blocks");
using QuantMeta = TensorListMeta<7, kQuantTensors>;
static_assert(sizeof(QuantMeta) + 64 <= 4096, "kernel parameters must fit in 4 KiB");
__device__ optim_math::QuantCode g_code_signed = optim_math::kCodeSigned;
__device__ optim_math::QuantCode g_code_unsigned = optim_math::kCodeUnsigned;
__device__ optim_math::QuantLut g_lut_signed = optim_math::kLutSigned;
__device__ optim_math::QuantLut g_lut_unsigned = optim_math::kLutUnsigned;

// The code tables in shared memory, kCodeCopies copies of each: entry i of copy c sits at
// i * kCodeCopies + c and lane l reads copy l % kCodeCopies, so at most 32 / kCodeCopies lanes of
// a warp share a bank whatever indices they hold (with one copy the lookups of a warp's elements
// put up to 8 lanes on a bank). 16 copies keep the tables and the two lookup tables (QuantLut) at
// 45 KiB of dynamic shared memory a block, four blocks to an SM.
constexpr int kCodeCopies = 16;
constexpr int kCodeEntries = optim_math::kQuantCodeSize * kCodeCopies;
constexpr size_t kCodeTablesBytes = 2 * kCodeEntries * sizeof(float) + 2 * optim_math::kQuantLutSize;
// With the block reductions' scratch, under the 48 KiB a kernel gets without asking for more.
static_assert(kCodeTablesBytes + 2 * kQuantThreads / 32 * sizeof(float) <= 48 * 1024);
struct LaneCode {
  const float* table;
  int copy;
  __device__ __forceinline__ float operator[](int i) const { return table[i * kCodeCopies + copy]; }
};

// max over the block of nan_max_abs; every thread gets the result.
__device__ __forceinline__ float block_nan_max(float x, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) x = optim_math::nan_max_abs(x, __shfl_xor_sync(0xffffffffu, x, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < kQuantThreads / 32 ? scratch[lane] : 0.0f;
  for (int off = 16; off > 0; off >>= 1) x = optim_math::nan_max_abs(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// A launch's table holds kMaxBlocks chunks: one CUDA block a chunk leaves 320 blocks of 256
// threads a launch, 2.4 a multiprocessor on an H100 where 4 fit, for a kernel that waits on its
// loads and its block reductions once a quantization block. So each chunk is split among
// `split` CUDA blocks, each a run of whole quantization blocks (kQuantSplit at the largest
// chunks: 2,560 blocks a launch).
constexpr int kQuantSplit = 8;
int quant_split(int64_t chunk) {
  return static_cast<int>(std::clamp<int64_t>(chunk / optim_math::kQuantBlock, 1, kQuantSplit));
}
__device__ __forceinline__ BlockRange quant_block_range(const QuantMeta& m, int split) {
  const int entry = blockIdx.x / split, part = blockIdx.x % split;
  const int t = m.block_tensor[entry];
  const int64_t chunk_begin = static_cast<int64_t>(m.block_chunk[entry]) * m.chunk;
  const int64_t chunk_end = min(chunk_begin + m.chunk, m.numel[t]), per = m.chunk / split;
  const int64_t begin = min(chunk_begin + part * per, chunk_end);
  return {t, begin, min(begin + per, chunk_end)};
}

template <class D>
__global__ void __launch_bounds__(kQuantThreads)
    adam8bit_kernel(QuantMeta m, optim_math::AdamScalars<float> s, DeviceArgs d, int split) {
  const auto [t, begin, end] = quant_block_range(m, split);
  float* p = m.ptr[0][t];
  D* low = reinterpret_cast<D*>(m.ptr[6][t]);
  if (skip_update(d)) {
    if (low)
      for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) low[i] = from_float<D>(p[i]);
    return;
  }
  extern __shared__ float code_tables[];  // kCodeTablesBytes: m's copies, v's, then the two QuantLuts
  __shared__ float scratch_m[kQuantThreads / 32], scratch_v[kQuantThreads / 32];
  for (int i = threadIdx.x; i < kCodeEntries; i += blockDim.x) {
    code_tables[i] = g_code_signed.v[i / kCodeCopies];
    code_tables[kCodeEntries + i] = g_code_unsigned.v[i / kCodeCopies];
  }
  auto* lut_m = reinterpret_cast<unsigned char*>(code_tables + 2 * kCodeEntries);
  unsigned char* lut_v = lut_m + optim_math::kQuantLutSize;
  for (int i = threadIdx.x; i < optim_math::kQuantLutSize; i += blockDim.x)
    lut_m[i] = g_lut_signed.lo[i], lut_v[i] = g_lut_unsigned.lo[i];
  const int copy = threadIdx.x % kCodeCopies;
  const LaneCode code_m{code_tables, copy}, code_v{code_tables + kCodeEntries, copy};
  const float* g = m.ptr[1][t];
  auto* mq = reinterpret_cast<unsigned char*>(m.ptr[2][t]);
  auto* vq = reinterpret_cast<unsigned char*>(m.ptr[3][t]);
  float* am = m.ptr[4][t];
  float* av = m.ptr[5][t];
  float step_size = 0, bc2_sqrt = 0;
  adam_step_scalars(m, t, d, s, step_size, bc2_sqrt);
  __syncthreads();  // the codes
  // The launch's chunk is a multiple of the quantization block: this block's elements are whole
  // quantization blocks (the last one of a tensor partial), taken one after another. A thread
  // holds 8 consecutive elements of each: read with 16-byte loads (8-byte ones for the codes)
  // before any is updated, so all of a thread's loads are in flight at once, where reads and
  // writes interleaved through pointers that may alias would wait for each other; one element at
  // a time where the lists are not aligned at the chunk's start, and in a tensor's partial last
  // block.
  const bool vec = ((reinterpret_cast<uintptr_t>(p + begin) | reinterpret_cast<uintptr_t>(g + begin) |
                     reinterpret_cast<uintptr_t>(low ? low + begin : nullptr)) &
                    15) == 0 &&
                   ((reinterpret_cast<uintptr_t>(mq + begin) | reinterpret_cast<uintptr_t>(vq + begin)) & 7) == 0;
  for (int64_t qbegin = begin; qbegin < end; qbegin += optim_math::kQuantBlock) {
    const int64_t qend = min(qbegin + optim_math::kQuantBlock, end);
    const int64_t blk = qbegin / optim_math::kQuantBlock;
    const float old_am = am[blk], old_av = av[blk];
    const int64_t i0 = qbegin + kQuantPerThread * threadIdx.x;
    const bool whole = vec && i0 + kQuantPerThread <= qend;
    float pr[kQuantPerThread], gr[kQuantPerThread], mr[kQuantPerThread], vr[kQuantPerThread];
    unsigned char mc[kQuantPerThread], vc[kQuantPerThread];
    if (whole) {
      const auto* p4 = reinterpret_cast<const float4*>(p + i0);
      const auto* g4 = reinterpret_cast<const float4*>(g + i0);
      const float4 pa = p4[0], pb = p4[1], ga = g4[0], gb = g4[1];
      const uint2 mw = *reinterpret_cast<const uint2*>(mq + i0), vw = *reinterpret_cast<const uint2*>(vq + i0);
      const float pf[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
      const float gf[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
      for (int k = 0; k < kQuantPerThread; ++k) {
        pr[k] = pf[k], gr[k] = gf[k];
        mc[k] = static_cast<unsigned char>((k < 4 ? mw.x : mw.y) >> (8 * (k % 4)));
        vc[k] = static_cast<unsigned char>((k < 4 ? vw.x : vw.y) >> (8 * (k % 4)));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kQuantPerThread; ++k) {
        const int64_t i = i0 + k;
        const bool in = i < qend;
        pr[k] = in ? p[i] : 0.0f, gr[k] = in ? g[i] : 0.0f;
        mc[k] = in ? mq[i] : 0, vc[k] = in ? vq[i] : 0;
      }
    }
    float lm = 0.0f, lv = 0.0f;
#pragma unroll
    for (int k = 0; k < kQuantPerThread; ++k) {
      mr[k] = vr[k] = 0.0f;
      if (i0 + k >= qend) continue;
      float mi = code_m[mc[k]] * old_am, vi = code_v[vc[k]] * old_av;
      optim_math::adam_element<float>(pr[k], gr[k], mi, vi, nullptr, s, step_size, bc2_sqrt);
      mr[k] = mi, vr[k] = vi;
      lm = optim_math::nan_max_abs(lm, mi);
      lv = optim_math::nan_max_abs(lv, vi);
    }
    if (whole) {
      auto* p4 = reinterpret_cast<float4*>(p + i0);
      p4[0] = float4{pr[0], pr[1], pr[2], pr[3]};
      p4[1] = float4{pr[4], pr[5], pr[6], pr[7]};
      if (low) {
        AlignedVec<D, 8> o;
#pragma unroll
        for (int k = 0; k < kQuantPerThread; ++k) o.v[k] = from_float<D>(pr[k]);
        *reinterpret_cast<AlignedVec<D, 8>*>(low + i0) = o;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kQuantPerThread; ++k) {
        const int64_t i = i0 + k;
        if (i >= qend) continue;
        p[i] = pr[k];
        if (low) low[i] = from_float<D>(pr[k]);
      }
    }
    const float new_am = block_nan_max(lm, scratch_m);
    const float new_av = block_nan_max(lv, scratch_v);
    const float inv_m = optim_math::quant_inverse(new_am), inv_v = optim_math::quant_inverse(new_av);
#pragma unroll
    for (int k = 0; k < kQuantPerThread; ++k) {
      mc[k] = optim_math::quantize_nearest_lut(code_m, lut_m, optim_math::quant_normalize(mr[k], new_am, inv_m));
      vc[k] = optim_math::quantize_nearest_lut(code_v, lut_v, optim_math::quant_normalize(vr[k], new_av, inv_v));
    }
    if (whole) {
      uint2 mw{0, 0}, vw{0, 0};
#pragma unroll
      for (int k = 0; k < kQuantPerThread; ++k) {
        (k < 4 ? mw.x : mw.y) |= static_cast<unsigned>(mc[k]) << (8 * (k % 4));
        (k < 4 ? vw.x : vw.y) |= static_cast<unsigned>(vc[k]) << (8 * (k % 4));
      }
      *reinterpret_cast<uint2*>(mq + i0) = mw;
      *reinterpret_cast<uint2*>(vq + i0) = vw;
    } else {
#pragma unroll
      for (int k = 0; k < kQuantPerThread; ++k) {
        const int64_t i = i0 + k;
        if (i < qend) mq[i] = mc[k], vq[i] = vc[k];
      }
    }
    if (threadIdx.x == 0) am[blk] = new_am, av[blk] = new_av;
    __syncthreads();  // every thread read this block's scratch before the next one writes it
  }
}

// ptr: 0 param, 1 grad, 2 momentum buffer (null without momentum).
__global__ void sgd_kernel(TensorListMeta<3> m, optim_math::SGDScalars<float> s, DeviceArgs d) {
  if (skip_update(d)) return;
  if (d.lr) s.lr = static_cast<float>(*d.lr);
  const auto [t, begin, end] = block_range(m);
  float* p = m.ptr[0][t];
  const float* g = m.ptr[1][t];
  float* buf = m.ptr[2][t];
  const bool first = m.s0[t] != 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float pi = p[i];
    optim_math::sgd_element<float>(pi, g[i], buf ? buf + i : nullptr, first, s);
    p[i] = pi;
  }
}

__device__ __forceinline__ double nan_max(double a, double b) { return (a >= b || isnan(a)) ? a : b; }

// Each block reduces its chunk and adds (or maxes) into *out: sum |x|^p, or max |x| when
// mode == 0. mode 1: p = 1, 2: p = 2, 3: general p.
__global__ void norm_kernel(TensorListMeta<1> m, int mode, float p, double* out) {
  __shared__ double shm[32];
  const auto [t, begin, end] = block_range(m);
  const float* x = m.ptr[0][t];
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float a = fabsf(x[i]);
    if (mode == 0)
      acc = nan_max(acc, a);
    else if (mode == 1)
      acc += a;
    else if (mode == 2)
      acc += static_cast<double>(a) * a;
    else
      acc += pow(static_cast<double>(a), static_cast<double>(p));
  }
  if (mode != 0) {
    acc = block_sum(acc, shm);
    if (threadIdx.x == 0) atomicAdd(out, acc);
    return;
  }
  for (int o = 16; o > 0; o >>= 1) acc = nan_max(acc, __shfl_xor_sync(0xffffffffu, acc, o));
  // Non-negative doubles (and NaN, whose bits are larger than +inf's) order like their bits.
  if ((threadIdx.x & 31) == 0)
    atomicMax(reinterpret_cast<unsigned long long*>(out), static_cast<unsigned long long>(__double_as_longlong(acc)));
}

// ptr: 0 the f32 source, 1 the destination (a D*, stored as float*). The same conversion as
// raw::copy_'s cast kernel (core/cuda/copy.cu: from_float), four elements a thread where the
// chunk's start is aligned on both sides.
template <class D>
__global__ void cast_list_kernel(TensorListMeta<2> m) {
  const auto [t, begin, end] = block_range(m);
  const float* src = m.ptr[0][t];
  D* dst = reinterpret_cast<D*>(m.ptr[1][t]);
  int64_t tail = begin;
  if (((reinterpret_cast<uintptr_t>(src + begin) & 15) | (reinterpret_cast<uintptr_t>(dst + begin) & 7)) == 0) {
    tail = begin + ((end - begin) & ~int64_t{3});
    for (int64_t i = begin + 4 * threadIdx.x; i < tail; i += 4 * blockDim.x) {
      const float4 v = *reinterpret_cast<const float4*>(src + i);
      AlignedVec<D, 4> o;
      o.v[0] = from_float<D>(v.x), o.v[1] = from_float<D>(v.y), o.v[2] = from_float<D>(v.z),
      o.v[3] = from_float<D>(v.w);
      *reinterpret_cast<AlignedVec<D, 4>*>(dst + i) = o;
    }
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) dst[i] = from_float<D>(src[i]);
}

// scale_by: null, or a device factor that replaces `scale` (the device-side clip).
__global__ void scale_kernel(TensorListMeta<1> m, float scale, const float* scale_by) {
  const auto [t, begin, end] = block_range(m);
  float* x = m.ptr[0][t];
  if (scale_by) scale = *scale_by;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] *= scale;
}

// The device-side clip's middle step: norm and clip factor from norm_kernel's accumulator.
__global__ void clip_coefficient_kernel(const double* acc, double norm_type, double max_norm, float* total_norm,
                                        float* coef) {
  const double total = optim_math::finish_norm(*acc, norm_type);
  *total_norm = static_cast<float>(total);
  *coef = static_cast<float>(optim_math::clip_coefficient(total, max_norm));
}

std::vector<int64_t> numels(const std::vector<Tensor>& ts) {
  std::vector<int64_t> n(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) n[i] = ts[i].numel();
  return n;
}

float* fptr(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

// multi_tensor_apply over one list of f32 tensors without per-tensor scalars (norm, scale).
template <class Launch>
void apply_to_list(const std::vector<Tensor>& ts, Launch&& launch) {
  multi_tensor_apply<1>(
      ts.size(), numels(ts),
      [&](TensorListMeta<1>& m, int slot, size_t i) {
        m.ptr[0][slot] = fptr(ts[i]);
        m.s0[slot] = m.s1[slot] = 0.0f;
      },
      launch);
}

// Capturable Adam: advances every device step count (unless skipped) before the update reads them.
void count_steps(const AdamTensors& t, const DeviceArgs& d, cudaStream_t stream) {
  for (size_t i = 0; i < t.step_counts.size(); i += kMaxCounters) {
    CounterList c{};
    c.n = static_cast<int>(std::min<size_t>(kMaxCounters, t.step_counts.size() - i));
    for (int k = 0; k < c.n; ++k) c.count[k] = static_cast<int64_t*>(t.step_counts[i + k].raw_data());
    step_count_kernel<<<1, kMaxCounters, 0, stream>>>(c, d);
    MG_CUDA_CHECK_LAUNCH("adam_multi_tensor (step counts)");
  }
}

DeviceArgs device_args(const DeviceScalars& d) {
  DeviceArgs a;
  a.lr = d.lr.defined() ? static_cast<const double*>(d.lr.raw_data()) : nullptr;
  a.found_inf = d.found_inf.defined() ? static_cast<const float*>(d.found_inf.raw_data()) : nullptr;
  return a;
}

// The device arguments of an Adam launch, after advancing its device step counts if it has them.
DeviceArgs adam_device_args(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& dev, cudaStream_t stream) {
  DeviceArgs d = device_args(dev);
  d.beta1 = h.beta1;
  d.beta2 = h.beta2;
  count_steps(t, d, stream);
  return d;
}

// Parameter i's step in a launch table: its device step count, or its bias corrections computed
// in double on the host, like PyTorch's per-parameter step.
template <class Meta>
void fill_adam_step(Meta& m, int slot, const AdamTensors& t, const AdamHyper& h, size_t i) {
  const bool device_steps = !t.step_counts.empty();
  m.step[slot] = device_steps ? static_cast<int64_t*>(t.step_counts[i].raw_data()) : nullptr;
  if (device_steps) return;
  double step_size = 0, bc2_sqrt = 0;
  optim_math::adam_bias_corrections(h.lr, h.beta1, h.beta2, static_cast<double>(t.steps[i]), &step_size, &bc2_sqrt);
  m.s0[slot] = static_cast<float>(step_size);
  m.s1[slot] = static_cast<float>(bc2_sqrt);
}

}  // namespace

template <>
void CudaBackend::adam_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& dev) {
  const cudaStream_t stream = stream_of(t.params[0]);
  const DeviceArgs d = adam_device_args(t, h, dev, stream);
  const optim_math::AdamScalars<float> s{float(h.lr),           float(h.beta1),           float(h.beta2), float(h.eps),
                                         float(h.weight_decay), h.decoupled_weight_decay, h.amsgrad,      h.maximize};
  const bool lows = !t.low_copies.empty();
  bool to_bf16 = true;  // the low copies' type (one a call, checked by kernels::adam_multi_tensor_)
  for (const Tensor& c : t.low_copies)
    if (c.defined()) to_bf16 = c.dtype() == DType::bf16;
  // The parameters with an FP8 cast to write: updated and cast in one tile kernel each, and left
  // out of the lists (numel 0); the ones it does not take (or with a low copy to write too) are
  // cast after their list's update.
  std::vector<int64_t> numel = numels(t.params);
  std::vector<size_t> cast_after;
  for (size_t i = 0; i < t.fp8_casts.size(); ++i) {
    if (!t.fp8_casts[i].codes.defined()) continue;
    double step_size = 0, bc2_sqrt = 0;
    optim_math::adam_bias_corrections(h.lr, h.beta1, h.beta2, static_cast<double>(t.steps[i]), &step_size, &bc2_sqrt);
    const bool low = lows && t.low_copies[i].defined();  // written by the list's kernel
    if (!low && adam_fp8_cast(t.params[i], t.grads[i], t.exp_avg[i], t.exp_avg_sq[i], s, static_cast<float>(step_size),
                              static_cast<float>(bc2_sqrt), d.found_inf, t.fp8_casts[i]))
      numel[i] = 0;
    else
      cast_after.push_back(i);
  }
  multi_tensor_apply<6>(
      t.params.size(), numel,
      [&](TensorListMeta<6>& m, int slot, size_t i) {
        m.ptr[0][slot] = fptr(t.params[i]);
        m.ptr[1][slot] = fptr(t.grads[i]);
        m.ptr[2][slot] = fptr(t.exp_avg[i]);
        m.ptr[3][slot] = fptr(t.exp_avg_sq[i]);
        m.ptr[4][slot] = h.amsgrad ? fptr(t.max_exp_avg_sq[i]) : nullptr;
        // a D*, as the list stores it
        m.ptr[5][slot] = lows && t.low_copies[i].defined() ? static_cast<float*>(t.low_copies[i].raw_data()) : nullptr;
        fill_adam_step(m, slot, t, h, i);
      },
      [&](const TensorListMeta<6>& m, int nb) {
        if (to_bf16)
          adam_kernel<__nv_bfloat16><<<nb, kThreads, 0, stream>>>(m, s, d);
        else
          adam_kernel<__half><<<nb, kThreads, 0, stream>>>(m, s, d);
        MG_CUDA_CHECK_LAUNCH("adam_multi_tensor");
      });
  for (size_t i : cast_after) fp8_cast_reserved(t.params[i], t.fp8_casts[i]);
}

template <>
void CudaBackend::adam8bit_multi_tensor(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& dev) {
  const cudaStream_t stream = stream_of(t.params[0]);
  const DeviceArgs d = adam_device_args(t, h, dev, stream);
  const optim_math::AdamScalars<float> s{float(h.lr),           float(h.beta1),           float(h.beta2), float(h.eps),
                                         float(h.weight_decay), h.decoupled_weight_decay, false,          h.maximize};
  const bool lows = !t.low_copies.empty();
  bool to_bf16 = true;
  for (const Tensor& c : t.low_copies)
    if (c.defined()) to_bf16 = c.dtype() == DType::bf16;
  multi_tensor_apply<7, kQuantTensors>(
      t.params.size(), numels(t.params),
      [&](QuantMeta& m, int slot, size_t i) {
        m.ptr[0][slot] = fptr(t.params[i]);
        m.ptr[1][slot] = fptr(t.grads[i]);
        m.ptr[2][slot] = static_cast<float*>(t.exp_avg[i].raw_data());  // u8*, as the list stores it
        m.ptr[3][slot] = static_cast<float*>(t.exp_avg_sq[i].raw_data());
        m.ptr[4][slot] = fptr(t.exp_avg_absmax[i]);
        m.ptr[5][slot] = fptr(t.exp_avg_sq_absmax[i]);
        m.ptr[6][slot] = lows && t.low_copies[i].defined() ? static_cast<float*>(t.low_copies[i].raw_data()) : nullptr;
        fill_adam_step(m, slot, t, h, i);
      },
      [&](const QuantMeta& m, int nb) {
        const int split = quant_split(m.chunk);
        if (to_bf16)
          adam8bit_kernel<__nv_bfloat16><<<nb * split, kQuantThreads, kCodeTablesBytes, stream>>>(m, s, d, split);
        else
          adam8bit_kernel<__half><<<nb * split, kQuantThreads, kCodeTablesBytes, stream>>>(m, s, d, split);
        MG_CUDA_CHECK_LAUNCH("adam8bit_multi_tensor");
      });
}

template <>
void CudaBackend::sgd_multi_tensor(const SGDTensors& t, const SGDHyper& h, const DeviceScalars& dev) {
  const cudaStream_t stream = stream_of(t.params[0]);
  const DeviceArgs d = device_args(dev);
  const optim_math::SGDScalars<float> s{float(h.lr),           float(h.momentum), float(h.dampening),
                                        float(h.weight_decay), h.nesterov,        h.maximize};
  const bool mom = !t.momentum_buffers.empty();
  multi_tensor_apply<3>(
      t.params.size(), numels(t.params),
      [&](TensorListMeta<3>& m, int slot, size_t i) {
        m.ptr[0][slot] = fptr(t.params[i]);
        m.ptr[1][slot] = fptr(t.grads[i]);
        m.ptr[2][slot] = mom ? fptr(t.momentum_buffers[i]) : nullptr;
        m.s0[slot] = mom && t.first_step[i] ? 1.0f : 0.0f;
        m.s1[slot] = 0.0f;
      },
      [&](const TensorListMeta<3>& m, int nb) {
        sgd_kernel<<<nb, kThreads, 0, stream>>>(m, s, d);
        MG_CUDA_CHECK_LAUNCH("sgd_multi_tensor");
      });
}

template <>
double CudaBackend::multi_tensor_norm_partial(const std::vector<Tensor>& ts, double norm_type) {
  if (ts.empty()) return 0.0;
  const cudaStream_t stream = stream_of(ts[0]);
  const int mode = std::isinf(norm_type) ? 0 : (norm_type == 1.0 ? 1 : (norm_type == 2.0 ? 2 : 3));
  // The accumulator comes from the caching allocator (stream-ordered, no cudaMalloc per call).
  Tensor acc = zeros({1}, {DType::f64, ts[0].device()});
  double* out = static_cast<double*>(acc.raw_data());
  apply_to_list(ts, [&](const TensorListMeta<1>& m, int nb) {
    norm_kernel<<<nb, kThreads, 0, stream>>>(m, mode, static_cast<float>(norm_type), out);
    MG_CUDA_CHECK_LAUNCH("multi_tensor_norm");
  });
  return acc.item();  // the one device->host read
}

template <>
void CudaBackend::multi_tensor_scale(const std::vector<Tensor>& ts, double scale) {
  if (ts.empty()) return;
  const cudaStream_t stream = stream_of(ts[0]);
  apply_to_list(ts, [&](const TensorListMeta<1>& m, int nb) {
    scale_kernel<<<nb, kThreads, 0, stream>>>(m, static_cast<float>(scale), nullptr);
    MG_CUDA_CHECK_LAUNCH("multi_tensor_scale");
  });
}

template <>
void CudaBackend::multi_tensor_cast(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  const cudaStream_t stream = stream_of(dst[0]);
  const bool to_bf16 = dst[0].dtype() == DType::bf16;
  multi_tensor_apply<2>(
      src.size(), numels(src),
      [&](TensorListMeta<2>& m, int slot, size_t i) {
        m.ptr[0][slot] = fptr(src[i]);
        m.ptr[1][slot] = static_cast<float*>(dst[i].raw_data());  // a D*, as the list stores it
        m.s0[slot] = m.s1[slot] = 0.0f;
      },
      [&](const TensorListMeta<2>& m, int nb) {
        if (to_bf16)
          cast_list_kernel<__nv_bfloat16><<<nb, kThreads, 0, stream>>>(m);
        else
          cast_list_kernel<__half><<<nb, kThreads, 0, stream>>>(m);
        MG_CUDA_CHECK_LAUNCH("multi_tensor_cast");
      });
}

template <>
void CudaBackend::multi_tensor_clip(const std::vector<Tensor>& ts, double max_norm, double norm_type,
                                    const Tensor& total_norm) {
  const cudaStream_t stream = stream_of(ts[0]);
  const int mode = std::isinf(norm_type) ? 0 : (norm_type == 1.0 ? 1 : (norm_type == 2.0 ? 2 : 3));
  Tensor acc = zeros({1}, {DType::f64, ts[0].device()});
  Tensor coef = empty({1}, {DType::f32, ts[0].device()});
  double* a = static_cast<double*>(acc.raw_data());
  apply_to_list(ts, [&](const TensorListMeta<1>& m, int nb) {
    norm_kernel<<<nb, kThreads, 0, stream>>>(m, mode, static_cast<float>(norm_type), a);
    MG_CUDA_CHECK_LAUNCH("multi_tensor_clip (norm)");
  });
  clip_coefficient_kernel<<<1, 1, 0, stream>>>(a, norm_type, max_norm, static_cast<float*>(total_norm.raw_data()),
                                               static_cast<float*>(coef.raw_data()));
  MG_CUDA_CHECK_LAUNCH("multi_tensor_clip (coefficient)");
  const float* c = static_cast<const float*>(coef.raw_data());
  apply_to_list(ts, [&](const TensorListMeta<1>& m, int nb) {
    scale_kernel<<<nb, kThreads, 0, stream>>>(m, 1.0f, c);
    MG_CUDA_CHECK_LAUNCH("multi_tensor_clip (scale)");
  });
}

}  // namespace mg::kernels
