// Tensor-core flash attention, FlashAttention-2 style, for f16 and bf16 at head dims 64 and 128.
// attention.cu keeps the plain SIMT kernels as the reference and the fallback (f32, other head
// dims, MG_ATTENTION_KERNEL=simt); the contract (layout, top-left causal mask, lse) is the same.
//
// Every product is mma.sync.m16n8k16 (f16 or bf16 in, f32 accumulate), operands fed from
// shared memory by ldmatrix (.trans where the matrix is stored k-major), tiles brought in by
// cp.async (zero-filled past L and S). A block is 4 warps; each warp owns 16 rows.
//   forward  rows = 64 queries; K/V tiles of 64 keys. S = Q K^T stays in registers (the mma
//            accumulator layout of S is the A-operand layout of P, so P V needs no shared
//            memory), online softmax in base 2 (scale folded into log2 e), l kept per thread
//            and summed over the quad once at the end.
//   backward delta = rowsum(dout * out) is the caller's (attention.cu's kernel). Then two
//            kernels, as in the SIMT version:
//            dkdv: rows = 64 keys, tiles of queries; S^T = K Q^T and dP^T = V dO^T in
//                  registers, P^T = exp2(S^T - lse), dS^T = P^T (dP^T - delta), then
//                  dV += P^T dO and dK += dS^T Q straight from the accumulators;
//            dq:   rows = 64 queries, tiles of keys; S, dP, dS likewise, dQ += dS K.
//            Why not FA2's single pass with dq accumulated by f32 atomics: two passes recompute
//            Q K^T and dO V^T (7 products instead of 5), but every gradient is written once
//            (deterministic, bit-identical run to run), there is no [BH, L, D] f32 scratch to
//            zero and convert (25 MiB at GPT-2's B8 H12 T1024 D64), no atomics contention, and
//            dS never leaves registers. The backward is within ~1.4x of the atomic version's
//            FLOPs and keeps the same structure as the reference it is tested against.
// P and dS are rounded to the input type before their second product (FlashAttention does the
// same); everything else accumulates in f32.
#include "kernels/cuda/attention_tc.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

namespace mg::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kRowsPerBlock = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared tiles are rows of kD elements padded by 8 (16 bytes): the 8 rows an ldmatrix phase
// reads then start 4 banks apart and cover all 32 banks.
template <int kD>
__host__ __device__ constexpr int ld_of() {
  return kD + 8;
}

// ---------------------------------------------------------------- PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  // src-size 0 zero-fills the 16 bytes (rows past L or S) without reading src.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a b for one m16n8k16 tile.
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one 32-bit register of two T (low half = x).
template <class T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// ---------------------------------------------------------------- tile helpers

// dst[r][0..kD) = src row r0 + r for r < kRows (zero past len), asynchronously.
template <int kRows, int kD, class T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t r0, int64_t len) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks a row
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks;
    const bool ok = r0 + r < len;
    cp_async16(dst + r * ld_of<kD>() + c * 8, ok ? src + (r0 + r) * kD + c * 8 : src, ok);
  }
}

// Accumulator tiles acc[n8][4] (16 rows x 8*kN8 columns) += A (16 x 16*kK16, row-major in shared
// memory at a, rows = this warp's) times B^T where B is stored n-major: b[n][k] (k contiguous).
template <class T, int kK16, int kN8, int kD>
__device__ __forceinline__ void mma_abt(float (&acc)[kN8][4], const T* a, const T* b) {
  constexpr int kLd = ld_of<kD>();
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < kK16; ++kk) {
    uint32_t af[4];
    ldsm_x4(af, a + (lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int n2 = 0; n2 < kN8 / 2; ++n2) {
      uint32_t bf[4];
      ldsm_x4(bf, b + (n2 * 16 + (lane % 8) + (lane / 16) * 8) * kLd + kk * 16 + ((lane / 8) % 2) * 8);
      mma<T>(acc[2 * n2], af, bf[0], bf[1]);
      mma<T>(acc[2 * n2 + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[n8][4] (16 rows x kD) += P (16 x 16*kK16, the accumulator tiles p[2*kK16][4], rounded to T)
// times B stored k-major: b[k][n] (n contiguous), read with ldmatrix.trans.
template <class T, int kK16, int kD>
__device__ __forceinline__ void mma_pb(float (&acc)[kD / 8][4], const float (&p)[2 * kK16][4], const T* b) {
  constexpr int kLd = ld_of<kD>();
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < kK16; ++kk) {
    // The accumulator layout of two n8 tiles is the A-operand layout of one k16 slice.
    const uint32_t af[4] = {pack2<T>(p[2 * kk][0], p[2 * kk][1]), pack2<T>(p[2 * kk][2], p[2 * kk][3]),
                            pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n2 = 0; n2 < kD / 16; ++n2) {
      uint32_t bf[4];
      ldsm_x4_t(bf, b + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kLd + n2 * 16 + (lane / 16) * 8);
      mma<T>(acc[2 * n2], af, bf[0], bf[1]);
      mma<T>(acc[2 * n2 + 1], af, bf[2], bf[3]);
    }
  }
}

template <int kN8>
__device__ __forceinline__ void zero(float (&acc)[kN8][4]) {
#pragma unroll
  for (int n = 0; n < kN8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// Writes rows r0 + g and r0 + g + 8 (g = lane / 4) of the accumulator tiles (times mul) to
// dst [len, kD], skipping rows past len.
template <class T, int kD>
__device__ __forceinline__ void store_rows(T* dst, const float (&acc)[kD / 8][4], int64_t r0, int64_t len, float mul0,
                                           float mul1) {
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  const int64_t ra = r0 + g, rb = ra + 8;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    const int col = n * 8 + 2 * t;
    if (ra < len) *reinterpret_cast<uint32_t*>(dst + ra * kD + col) = pack2<T>(acc[n][0] * mul0, acc[n][1] * mul0);
    if (rb < len) *reinterpret_cast<uint32_t*>(dst + rb * kD + col) = pack2<T>(acc[n][2] * mul1, acc[n][3] * mul1);
  }
}

// ---------------------------------------------------------------- forward

template <int kD>
constexpr size_t fwd_smem() {
  return sizeof(__half) * 3 * kRowsPerBlock * ld_of<kD>();
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    tc_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                  float* __restrict__ lse, int64_t L, int64_t S, float scale_log2, bool causal) {
  constexpr int kBc = 64, kN8 = kBc / 8, kLd = ld_of<kD>();
  extern __shared__ uint4 smem_fwd[];
  T* Qs = reinterpret_cast<T*>(smem_fwd);
  T* Ks = Qs + kRowsPerBlock * kLd;
  T* Vs = Ks + kBc * kLd;
  const int64_t bh = blockIdx.y;
  q += bh * L * kD, out += bh * L * kD, lse += bh * L;
  k += bh * S * kD, v += bh * S * kD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
  // Causal blocks late in the sequence have the most key tiles: start them first.
  const unsigned bx = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t i0 = static_cast<int64_t>(bx) * kRowsPerBlock, iw = i0 + warp * 16;
  const int64_t ra = iw + g, rb = ra + 8;  // this thread's two rows
  load_tile<kRowsPerBlock, kD>(Qs, q, i0, L);
  cp_async_commit();

  float o[kD / 8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int64_t s_end = causal ? (S < i0 + kRowsPerBlock ? S : i0 + kRowsPerBlock) : S;
  for (int64_t j0 = 0; j0 < s_end; j0 += kBc) {
    __syncthreads();  // the previous K/V tiles are consumed
    load_tile<kBc, kD>(Ks, k, j0, S);
    cp_async_commit();
    load_tile<kBc, kD>(Vs, v, j0, S);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K are in; V may still be coming
    __syncthreads();
    float s[kN8][4];
    zero(s);
    mma_abt<T, kD / 16, kN8, kD>(s, Qs + warp * 16 * kLd, Ks);
    const bool diag = causal && j0 + kBc > iw;  // some key of the tile is past some row of the warp
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + n * 8 + 2 * t + (e & 1), i = e < 2 ? ra : rb;
        const bool ok = j < S && (!diag || j <= i);
        s[n][e] = ok ? s[n][e] * scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // Key 0 is in the first tile and every row sees it, so mx is finite from the first tile
      // on; m = -inf then gives corr = 0.
      corr[r] = exp2f(m[r] - mx[r]);
      m[r] = mx[r];
      l[r] *= corr[r];
    }
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - m[e / 2]);
        l[e / 2] += s[n][e];
      }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) o[n][0] *= corr[0], o[n][1] *= corr[0], o[n][2] *= corr[1], o[n][3] *= corr[1];
    cp_async_wait<0>();
    __syncthreads();
    mma_pb<T, kBc / 16, kD>(o, s, Vs);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  store_rows<T, kD>(out, o, iw, L, 1.f / l[0], 1.f / l[1]);
  if (t == 0) {
    if (ra < L) lse[ra] = (m[0] + log2f(l[0])) * kLn2;
    if (rb < L) lse[rb] = (m[1] + log2f(l[1])) * kLn2;
  }
}

// ---------------------------------------------------------------- backward

// Query tile of dkdv and key tile of dq: 64 at D = 64, 32 at D = 128 (the accumulators of two
// 16 x 128 gradients already take 128 registers a thread).
template <int kD>
__host__ __device__ constexpr int bwd_tile() {
  return kD <= 64 ? 64 : 32;
}

template <int kD>
constexpr size_t bwd_smem() {
  return sizeof(__half) * 2 * (kRowsPerBlock + bwd_tile<kD>()) * ld_of<kD>() + sizeof(float) * 2 * bwd_tile<kD>();
}

// Rows = keys [j0, j0 + 64), tiles of queries; writes dk and dv of the block's keys.
template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    tc_bwd_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                       T* __restrict__ dk, T* __restrict__ dv, int64_t L, int64_t S, float scale, float scale_log2,
                       bool causal) {
  constexpr int kBr = bwd_tile<kD>(), kN8 = kBr / 8, kLd = ld_of<kD>();
  extern __shared__ uint4 smem_dkdv[];
  T* Ks = reinterpret_cast<T*>(smem_dkdv);
  T* Vs = Ks + kRowsPerBlock * kLd;
  T* Qs = Vs + kRowsPerBlock * kLd;
  T* Os = Qs + kBr * kLd;  // dout
  float* lse_s = reinterpret_cast<float*>(Os + kBr * kLd);  // lse * log2 e
  float* delta_s = lse_s + kBr;
  const int64_t bh = blockIdx.y;
  q += bh * L * kD, dout += bh * L * kD, lse += bh * L, delta += bh * L;
  k += bh * S * kD, v += bh * S * kD, dk += bh * S * kD, dv += bh * S * kD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock, jw = j0 + warp * 16;
  load_tile<kRowsPerBlock, kD>(Ks, k, j0, S);
  load_tile<kRowsPerBlock, kD>(Vs, v, j0, S);
  cp_async_commit();

  float gk[kD / 8][4], gv[kD / 8][4];
  zero(gk);
  zero(gv);
  // Causal: queries before j0 see none of the block's keys.
  const int64_t i_begin = causal ? j0 / kBr * kBr : 0;
  for (int64_t i0 = i_begin; i0 < L; i0 += kBr) {
    __syncthreads();
    load_tile<kBr, kD>(Qs, q, i0, L);
    load_tile<kBr, kD>(Os, dout, i0, L);
    cp_async_commit();
    for (int e = threadIdx.x; e < kBr; e += kThreads) {
      const bool ok = i0 + e < L;
      lse_s[e] = ok ? lse[i0 + e] * kLog2e : 0.f;
      delta_s[e] = ok ? delta[i0 + e] : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();
    float st[kN8][4], dpt[kN8][4];  // S^T and dP^T: 16 keys x kBr queries
    zero(st);
    zero(dpt);
    mma_abt<T, kD / 16, kN8, kD>(st, Ks + warp * 16 * kLd, Qs);
    mma_abt<T, kD / 16, kN8, kD>(dpt, Vs + warp * 16 * kLd, Os);
    const bool diag = causal && i0 < jw + 16;  // some query of the tile is before some key of the warp
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * t + (e & 1);
        const int64_t i = i0 + c, j = jw + g + (e < 2 ? 0 : 8);
        const bool ok = i < L && j < S && (!diag || j <= i);
        const float p = ok ? exp2f(st[n][e] * scale_log2 - lse_s[c]) : 0.f;
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - delta_s[c]);
      }
    mma_pb<T, kBr / 16, kD>(gv, st, Os);
    mma_pb<T, kBr / 16, kD>(gk, dpt, Qs);
  }
  cp_async_wait<0>();  // no query tile (L = 0, or causal keys past L): K/V copies still in flight
  store_rows<T, kD>(dk, gk, jw, S, scale, scale);
  store_rows<T, kD>(dv, gv, jw, S, 1.f, 1.f);
}

// Rows = queries [i0, i0 + 64), tiles of keys; writes dq of the block's queries.
template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    tc_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                     T* __restrict__ dq, int64_t L, int64_t S, float scale, float scale_log2, bool causal) {
  constexpr int kBc = bwd_tile<kD>(), kN8 = kBc / 8, kLd = ld_of<kD>();
  extern __shared__ uint4 smem_dq[];
  T* Qs = reinterpret_cast<T*>(smem_dq);
  T* Os = Qs + kRowsPerBlock * kLd;  // dout
  T* Ks = Os + kRowsPerBlock * kLd;
  T* Vs = Ks + kBc * kLd;
  const int64_t bh = blockIdx.y;
  q += bh * L * kD, dout += bh * L * kD, dq += bh * L * kD, lse += bh * L, delta += bh * L;
  k += bh * S * kD, v += bh * S * kD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
  const unsigned bx = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t i0 = static_cast<int64_t>(bx) * kRowsPerBlock, iw = i0 + warp * 16;
  const int64_t ra = iw + g, rb = ra + 8;
  load_tile<kRowsPerBlock, kD>(Qs, q, i0, L);
  load_tile<kRowsPerBlock, kD>(Os, dout, i0, L);
  cp_async_commit();
  const float lse2[2] = {ra < L ? lse[ra] * kLog2e : 0.f, rb < L ? lse[rb] * kLog2e : 0.f};
  const float dl[2] = {ra < L ? delta[ra] : 0.f, rb < L ? delta[rb] : 0.f};

  float acc[kD / 8][4];
  zero(acc);
  const int64_t s_end = causal ? (S < i0 + kRowsPerBlock ? S : i0 + kRowsPerBlock) : S;
  for (int64_t j0 = 0; j0 < s_end; j0 += kBc) {
    __syncthreads();
    load_tile<kBc, kD>(Ks, k, j0, S);
    load_tile<kBc, kD>(Vs, v, j0, S);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[kN8][4], dp[kN8][4];
    zero(s);
    zero(dp);
    mma_abt<T, kD / 16, kN8, kD>(s, Qs + warp * 16 * kLd, Ks);
    mma_abt<T, kD / 16, kN8, kD>(dp, Os + warp * 16 * kLd, Vs);
    const bool diag = causal && j0 + kBc > iw;
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + n * 8 + 2 * t + (e & 1), i = e < 2 ? ra : rb;
        const bool ok = i < L && j < S && (!diag || j <= i);
        const float p = ok ? exp2f(s[n][e] * scale_log2 - lse2[e / 2]) : 0.f;
        dp[n][e] = p * (dp[n][e] - dl[e / 2]);
      }
    mma_pb<T, kBc / 16, kD>(acc, dp, Ks);
  }
  store_rows<T, kD>(dq, acc, iw, L, scale, scale);
}

// ---------------------------------------------------------------- host side

template <class Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// Calls f(T{}, integral_constant<kD>) for the element type and head dim.
template <class F>
cudaError_t dispatch(TcElem elem, int D, F&& f) {
  auto by_dim = [&](auto tag) -> cudaError_t {
    if (D == 64) return f(tag, std::integral_constant<int, 64>{});
    if (D == 128) return f(tag, std::integral_constant<int, 128>{});
    return cudaErrorInvalidValue;
  };
  return elem == TcElem::f16 ? by_dim(__half{}) : by_dim(__nv_bfloat16{});
}

// Runs launch(first_bh, count) over chunks of at most 65535 heads (the grid's y limit).
template <class F>
cudaError_t for_head_chunks(int64_t BH, F&& launch) {
  constexpr int64_t kMaxY = 65535;
  for (int64_t b0 = 0; b0 < BH; b0 += kMaxY) {
    launch(b0, static_cast<unsigned>(BH - b0 < kMaxY ? BH - b0 : kMaxY));
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

unsigned blocks_of(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

bool attention_tc_head_dim_ok(int64_t D) { return D == 64 || D == 128; }

cudaError_t attention_tc_forward(const TcForwardArgs& a, cudaStream_t stream) {
  return dispatch(a.elem, a.D, [&](auto tag, auto dim) -> cudaError_t {
    using T = decltype(tag);
    constexpr int kD = decltype(dim)::value;
    constexpr size_t smem = fwd_smem<kD>();
    if (cudaError_t e = allow_smem(tc_fwd_kernel<T, kD>, smem); e != cudaSuccess) return e;
    const float sl2 = a.scale * kLog2e;
    return for_head_chunks(a.BH, [&](int64_t b0, unsigned nb) {
      const int64_t qo = b0 * a.L * kD, ko = b0 * a.S * kD;
      tc_fwd_kernel<T, kD><<<dim3(blocks_of(a.L), nb), kThreads, smem, stream>>>(
          static_cast<const T*>(a.q) + qo, static_cast<const T*>(a.k) + ko, static_cast<const T*>(a.v) + ko,
          static_cast<T*>(a.out) + qo, a.lse + b0 * a.L, a.L, a.S, sl2, a.causal);
    });
  });
}

cudaError_t attention_tc_backward(const TcBackwardArgs& a, cudaStream_t stream) {
  return dispatch(a.elem, a.D, [&](auto tag, auto dim) -> cudaError_t {
    using T = decltype(tag);
    constexpr int kD = decltype(dim)::value;
    constexpr size_t smem = bwd_smem<kD>();
    if (cudaError_t e = allow_smem(tc_bwd_dkdv_kernel<T, kD>, smem); e != cudaSuccess) return e;
    if (cudaError_t e = allow_smem(tc_bwd_dq_kernel<T, kD>, smem); e != cudaSuccess) return e;
    const float sl2 = a.scale * kLog2e;
    return for_head_chunks(a.BH, [&](int64_t b0, unsigned nb) {
      const int64_t qo = b0 * a.L * kD, ko = b0 * a.S * kD, ro = b0 * a.L;
      const T *q = static_cast<const T*>(a.q) + qo, *k = static_cast<const T*>(a.k) + ko;
      const T *v = static_cast<const T*>(a.v) + ko, *dout = static_cast<const T*>(a.dout) + qo;
      tc_bwd_dkdv_kernel<T, kD><<<dim3(blocks_of(a.S), nb), kThreads, smem, stream>>>(
          q, k, v, dout, a.lse + ro, a.delta + ro, static_cast<T*>(a.dk) + ko, static_cast<T*>(a.dv) + ko, a.L, a.S,
          a.scale, sl2, a.causal);
      if (a.L == 0) return;
      tc_bwd_dq_kernel<T, kD><<<dim3(blocks_of(a.L), nb), kThreads, smem, stream>>>(
          q, k, v, dout, a.lse + ro, a.delta + ro, static_cast<T*>(a.dq) + qo, a.L, a.S, a.scale, sl2, a.causal);
    });
  });
}

}  // namespace mg::kernels::cuda
