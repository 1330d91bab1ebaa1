// Tensor-core flash attention, FlashAttention-2 style, for f16, bf16 and f32 at head dims 64 and
// 128. attention.cu keeps the plain SIMT kernels as the reference and the fallback (other head
// dims, MG_ATTENTION_KERNEL=simt); the contract (layout, top-left causal mask, lse) is the same.
//
// Every product is mma.sync.m16n8k16 (f16 or bf16 in, f32 accumulate), operands fed from
// shared memory by ldmatrix (.trans where the matrix is stored k-major); f32 runs the same
// tiles with m16n8k8 TF32 products, one per product under allow_tf32(), otherwise three on
// TF32 pairs (mma_ptx.cuh mma_f32: f32-class accuracy). Tiles are brought in by
// cp.async (zero-filled past L and S) into double buffers, so tile t + 1 lands while tile t
// computes. A block is 4 warps; a warp owns 16 kM rows (FwdTiles, BwdTiles below say why kM).
//   forward  rows = 128 queries (32 a warp); K/V tiles of 64 keys. S = Q K^T stays in registers
//            (the mma accumulator layout of S is the A-operand layout of P, so P V needs no
//            shared memory), online softmax in base 2 (scale folded into log2 e), l kept per
//            thread and summed over the quad once at the end.
//   backward delta = rowsum(dout * out) is the caller's (attention.cu's kernel). Then, by
//            default, one pass (FlashAttention-2's):
//            dkdv: rows = 64 keys, tiles of queries; S^T = K Q^T and dP^T = V dO^T in
//                  registers, P^T = exp2(S^T - lse), dS^T = P^T (dP^T - delta), then
//                  dV += P^T dO and dK += dS^T Q straight from the accumulators; dS^T goes
//                  to shared memory (ds_own_buffer says where) and the block adds
//                  dQ_t += dS_t K into an f32 scratch by f32 atomics; a last small kernel
//                  scales and rounds it into dq.
//            Five products a tile (one_pass_pays: not TF32 pairs at D = 128). The summation
//            order of dq changes from run to run, so under set_deterministic(true) the caller
//            asks for two passes instead, as in the SIMT version: dkdv without the dQ step, then
//            dq:   rows = 64 queries, tiles of keys; S, dP, dS likewise, dQ += dS K,
//            which recomputes Q K^T and dO V^T (7 products a tile instead of 5) but writes
//            every gradient once, bit-identical run to run, with no f32 scratch.
// P and dS are rounded to the input type before their second product (FlashAttention does the
// same); everything else accumulates in f32.
//
// Speed on the H200 (docs/attention.md): forward 100-220 TFLOP/s, about 1.6-2x PyTorch's flash
// SDPA; the bound is ldmatrix traffic (one 512-byte x4 load per 2 kM mma), not the tensor cores.
// Next step, against this version: wgmma (sm_90a) with TMA.
#include "kernels/cuda/attention_tc.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/mma_ptx.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace ptx;  // NOLINT: the wrappers are this file's vocabulary

constexpr int kThreads = 128;  // 4 warps
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared tiles are rows of kD elements padded by 16 bytes. Half types: the 8 rows an ldmatrix
// phase reads then start 4 banks apart and cover all 32 banks. f32 (4 elements of padding): the
// TF32 fragments are single-word loads of (row g, column t) or (row 2t or 2t + 1, column g)
// (g = lane / 4, t = lane % 4); rows 4 banks apart put both patterns on 32 distinct banks.
template <class T, int kD>
__host__ __device__ constexpr int ld_of() {
  return kD + 16 / static_cast<int>(sizeof(T));
}

// Column c of a tile starting at key (or query) c0 is allowed in row r when c <= hi(r) and
// c >= lo(r); these give the bounds as small ints, so the per-element test is two int compares.
__device__ __forceinline__ int clamp_to(int64_t x, int lo, int hi) {
  return static_cast<int>(x < lo ? lo : (x > hi ? hi : x));
}

// Query rows ra and ra + 8 see key j0 + c of a kBc-key tile when c <= hi[r]: before S, and
// (causal) not past the row. Rows past L are computed but never stored (rows are independent).
template <int kBc>
__device__ __forceinline__ void key_bounds(int (&hi)[2], int64_t ra, int64_t j0, int64_t S, bool causal) {
  const int kv_hi = clamp_to(S - j0 - 1, -1, kBc);
  hi[0] = causal ? min(kv_hi, clamp_to(ra - j0, -1, kBc)) : kv_hi;
  hi[1] = causal ? min(kv_hi, clamp_to(ra + 8 - j0, -1, kBc)) : kv_hi;
}

// ---------------------------------------------------------------- tile helpers

// dst[r][0..kD) = src row r0 + r (rows ld elements apart) for r < kRows (zero past len),
// asynchronously.
template <int kRows, int kD, class T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t r0, int64_t len, int64_t ld) {
  constexpr int kVec = 16 / sizeof(T), kChunks = kD / kVec;  // 16-byte chunks a row
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks;
    const bool ok = r0 + r < len;
    cp_async16(dst + r * ld_of<T, kD>() + c * kVec, ok ? src + (r0 + r) * ld + c * kVec : src, ok);
  }
}

// ---- f32 products: m16n8k8 in TF32, or (kX3) three on TF32 pairs. No ldmatrix for 32-bit
// types: fragments are single-word reads (g = lane / 4, t = lane % 4), converted on the way.

// A fragment's four values (a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)) as
// TF32 operands.
template <bool kX3>
__device__ __forceinline__ void split_a(float a0, float a1, float a2, float a3, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  split_tf32<kX3>(a0, hi[0], lo[0]), split_tf32<kX3>(a1, hi[1], lo[1]);
  split_tf32<kX3>(a2, hi[2], lo[2]), split_tf32<kX3>(a3, hi[3], lo[3]);
}

// acc[m][n] += A_m B for every m-tile, the A fragments already split and B's (b0 (k t, n g),
// b1 (k t + 4, n g)) split here, once for the kM products.
template <bool kX3, int kM, int kN>
__device__ __forceinline__ void mma_f32_column(float (&acc)[kM][kN][4], int n, const uint32_t (&ah)[kM][4],
                                               const uint32_t (&al)[kM][4], float b0, float b1) {
  uint32_t bh[2], bl[2];
  split_tf32<kX3>(b0, bh[0], bl[0]), split_tf32<kX3>(b1, bh[1], bl[1]);
#pragma unroll
  for (int m = 0; m < kM; ++m) mma_f32<kX3>(acc[m][n], ah[m], al[m], bh, bl);
}

// mma_abt for f32: 2 kK16 slices of 8.
template <int kM, int kK16, int kN8, int kD, bool kX3>
__device__ __forceinline__ void mma_abt_f32(float (&acc)[kM][kN8][4], const float* a, const float* b) {
  constexpr int kLd = ld_of<float, kD>();
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int kk = 0; kk < 2 * kK16; ++kk) {
    uint32_t ah[kM][4], al[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const float* ar = a + (m * 16 + g) * kLd + kk * 8 + t;
      split_a<kX3>(ar[0], ar[8 * kLd], ar[4], ar[8 * kLd + 4], ah[m], al[m]);
    }
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
      const float* br = b + (n * 8 + g) * kLd + kk * 8 + t;
      mma_f32_column<kX3>(acc, n, ah, al, br[0], br[4]);
    }
  }
}

// mma_pb for f32: one m16n8k8 per n8 tile of p. Its accumulators hold columns 2t and 2t + 1, the
// A operand wants t and t + 4: the product's k order is free, so k index t stands for column 2t
// and t + 4 for 2t + 1, and B's rows are read in the same order. No shuffles.
template <int kM, int kK16, int kD, bool kX3>
__device__ __forceinline__ void mma_pb_f32(float (&acc)[kM][kD / 8][4], const float (&p)[kM][2 * kK16][4],
                                           const float* b) {
  constexpr int kLd = ld_of<float, kD>();
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 2 * kK16; ++j) {
    uint32_t ah[kM][4], al[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) split_a<kX3>(p[m][j][0], p[m][j][2], p[m][j][1], p[m][j][3], ah[m], al[m]);
    const float* br = b + (j * 8 + 2 * t) * kLd + g;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) mma_f32_column<kX3>(acc, n, ah, al, br[n * 8], br[kLd + n * 8]);
  }
}

// acc[m][n8][4] (16 kM rows x 8 kN8 columns) += A (16 kM x 16 kK16, row-major in shared memory
// at a) times B^T, B stored n-major: b[n][k] (k contiguous). Each B fragment is loaded once for
// the kM m-tiles: ldmatrix traffic, more than the tensor cores, is what bounds these kernels.
template <class T, int kM, int kK16, int kN8, int kD, bool kX3 = false>
__device__ __forceinline__ void mma_abt(float (&acc)[kM][kN8][4], const T* a, const T* b) {
  if constexpr (std::is_same_v<T, float>) {
    mma_abt_f32<kM, kK16, kN8, kD, kX3>(acc, a, b);
  } else {
    constexpr int kLd = ld_of<T, kD>();
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < kK16; ++kk) {
      uint32_t af[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) ldsm_x4(af[m], a + (m * 16 + lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int n2 = 0; n2 < kN8 / 2; ++n2) {
        uint32_t bf[4];
        ldsm_x4(bf, b + (n2 * 16 + (lane % 8) + (lane / 16) * 8) * kLd + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          mma<T>(acc[m][2 * n2], af[m], bf[0], bf[1]);
          mma<T>(acc[m][2 * n2 + 1], af[m], bf[2], bf[3]);
        }
      }
    }
  }
}

// mma_abt for half types with A's fragments already in registers (the forward's Q at D = 64,
// loaded once for all key tiles: a fifth of the ldmatrix traffic per tile).
template <class T, int kM, int kK16, int kN8, int kD>
__device__ __forceinline__ void mma_abt_a_regs(float (&acc)[kM][kN8][4], const uint32_t (&af)[kM][kK16][4],
                                               const T* b) {
  constexpr int kLd = ld_of<T, kD>();
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < kK16; ++kk) {
#pragma unroll
    for (int n2 = 0; n2 < kN8 / 2; ++n2) {
      uint32_t bf[4];
      ldsm_x4(bf, b + (n2 * 16 + (lane % 8) + (lane / 16) * 8) * kLd + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma<T>(acc[m][2 * n2], af[m][kk], bf[0], bf[1]);
        mma<T>(acc[m][2 * n2 + 1], af[m][kk], bf[2], bf[3]);
      }
    }
  }
}

// acc[m][n8][4] (16 kM rows x kD) += P (16 kM x 16 kK16: the accumulator tiles p, rounded to T)
// times B stored k-major: b[k][n] (n contiguous), read with ldmatrix.trans.
template <class T, int kM, int kK16, int kD, bool kX3 = false>
__device__ __forceinline__ void mma_pb(float (&acc)[kM][kD / 8][4], const float (&p)[kM][2 * kK16][4], const T* b) {
  if constexpr (std::is_same_v<T, float>) {
    mma_pb_f32<kM, kK16, kD, kX3>(acc, p, b);
  } else {
    constexpr int kLd = ld_of<T, kD>();
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < kK16; ++kk) {
      // The accumulator layout of two n8 tiles is the A-operand layout of one k16 slice.
      uint32_t af[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        af[m][0] = pack2<T>(p[m][2 * kk][0], p[m][2 * kk][1]);
        af[m][1] = pack2<T>(p[m][2 * kk][2], p[m][2 * kk][3]);
        af[m][2] = pack2<T>(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
        af[m][3] = pack2<T>(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int n2 = 0; n2 < kD / 16; ++n2) {
        uint32_t bf[4];
        ldsm_x4_t(bf, b + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kLd + n2 * 16 + (lane / 16) * 8);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          mma<T>(acc[m][2 * n2], af[m], bf[0], bf[1]);
          mma<T>(acc[m][2 * n2 + 1], af[m], bf[2], bf[3]);
        }
      }
    }
  }
}

// acc[0][n8][4] (16 rows x 8 kN8 columns) += A B for one m-tile, A (16 x 16 kK16) stored transposed
// at a (a[k][m], rows lda elements apart: the dS^T tile the dkdv warps wrote) and B (16 kK16 x
// 8 kN8) stored k-major at b (b[k][n], rows ld_of<T, kD> apart: a K tile). The one-pass
// backward's dQ += dS K. Half types read A with ldmatrix.trans; f32 takes key k8 + 2t as k index t
// and k8 + 2t + 1 as t + 4 on both sides (as mma_pb_f32), which keeps the A and B reads on 32
// distinct banks.
template <class T, int kK16, int kN8, int kD, bool kX3 = false>
__device__ __forceinline__ void mma_tb(float (&acc)[1][kN8][4], const T* a, int lda, const T* b) {
  constexpr int kLd = ld_of<T, kD>();
  const int lane = threadIdx.x & 31;
  if constexpr (std::is_same_v<T, float>) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 2 * kK16; ++j) {
      const float* ar = a + (j * 8 + 2 * t) * lda + g;
      uint32_t ah[1][4], al[1][4];
      split_a<kX3>(ar[0], ar[8], ar[lda], ar[lda + 8], ah[0], al[0]);
      const float* br = b + (j * 8 + 2 * t) * kLd + g;
#pragma unroll
      for (int n = 0; n < kN8; ++n) mma_f32_column<kX3>(acc, n, ah, al, br[n * 8], br[kLd + n * 8]);
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < kK16; ++kk) {
      uint32_t af[4];
      ldsm_x4_t(af, a + (kk * 16 + (lane % 8) + (lane / 16) * 8) * lda + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int n2 = 0; n2 < kN8 / 2; ++n2) {
        uint32_t bf[4];
        ldsm_x4_t(bf, b + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kLd + n2 * 16 + (lane / 16) * 8);
        mma<T>(acc[0][2 * n2], af, bf[0], bf[1]);
        mma<T>(acc[0][2 * n2 + 1], af, bf[2], bf[3]);
      }
    }
  }
}

template <int kM, int kN8>
__device__ __forceinline__ void zero(float (&acc)[kM][kN8][4]) {
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int n = 0; n < kN8; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;
}

// Writes rows r0 + g and r0 + g + 8 (g = lane / 4) of one m-tile's accumulators (times mul) to
// dst [len, kD] (rows ld elements apart), skipping rows past len.
template <class T, int kD>
__device__ __forceinline__ void store_rows(T* dst, const float (&acc)[kD / 8][4], int64_t r0, int64_t len, int64_t ld,
                                           float mul0, float mul1) {
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  const int64_t ra = r0 + g, rb = ra + 8;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    const int col = n * 8 + 2 * t;
    if constexpr (std::is_same_v<T, float>) {
      if (ra < len) *reinterpret_cast<float2*>(dst + ra * ld + col) = make_float2(acc[n][0] * mul0, acc[n][1] * mul0);
      if (rb < len) *reinterpret_cast<float2*>(dst + rb * ld + col) = make_float2(acc[n][2] * mul1, acc[n][3] * mul1);
      continue;
    }
    if (ra < len) *reinterpret_cast<uint32_t*>(dst + ra * ld + col) = pack2<T>(acc[n][0] * mul0, acc[n][1] * mul0);
    if (rb < len) *reinterpret_cast<uint32_t*>(dst + rb * ld + col) = pack2<T>(acc[n][2] * mul1, acc[n][3] * mul1);
  }
}

// ---------------------------------------------------------------- tile shapes

// kM m-tiles (16 rows) per warp, so a block owns kRows = 64 kM rows; the other side comes in
// tiles of kN. Measured on the H200 (tools/attention_check.py, both variants verified):
// - forward, kM = 2 (128 queries a block, then 215/255 registers at D = 64/128; 245 at D = 64
//   since Q stays in registers): 1.0-1.35x faster
//   than kM = 1, most without the causal mask (B8 H12 T1024 D64 bf16 full 0.172 -> 0.146 ms);
// - backward, kM = 1 (64 rows a block): kM = 2 at D = 64 was as fast without the mask and
//   1.2-1.3x slower causal (half as many blocks, so a longer tail of the long diagonal ones);
//   at D = 128 two 16 x 128 f32 gradients already take 128 registers a thread.
template <class T, int kD>
struct FwdTiles {
  static constexpr int kM = 2, kRows = 64 * kM, kN = 64;
};
template <class T, int kD>
struct BwdTiles {
  static constexpr int kM = 1, kRows = 64 * kM, kN = kD == 64 ? 64 : 32;
  // Half types at D = 64: 168 registers, no spills: 3 blocks an SM. f32 tiles take twice the
  // shared memory (105 KiB a block at D = 64), so 2 fit.
  static constexpr int kMinBlocks = kD == 64 ? (sizeof(T) == 4 ? 2 : 3) : 1;
};

// ---------------------------------------------------------------- forward

template <class T, int kD>
constexpr size_t fwd_smem() {  // Q, and K and V twice
  return sizeof(T) * (FwdTiles<T, kD>::kRows + 4 * FwdTiles<T, kD>::kN) * ld_of<T, kD>();
}

template <class T, int kD, bool kX3 = false>
__global__ void __launch_bounds__(kThreads)
    tc_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                  float* __restrict__ lse, TcLayout lq, TcLayout lk, TcLayout lv, TcLayout lo, int64_t b0, int64_t L,
                  int64_t S, float scale_log2, bool causal) {
  using C = FwdTiles<T, kD>;
  constexpr int kM = C::kM, kRows = C::kRows, kBc = C::kN, kN8 = kBc / 8, kLd = ld_of<T, kD>();
  extern __shared__ uint4 smem_fwd[];
  T* Qs = reinterpret_cast<T*>(smem_fwd);
  // Double buffers, picked by arithmetic (an indexed pointer array would live on the stack).
  T* const Kb = Qs + kRows * kLd;    // [2][kBc][kLd]
  T* const Vb = Kb + 2 * kBc * kLd;  // [2][kBc][kLd]
  auto buf = [&](T* b, int64_t i) { return b + (i & 1) * kBc * kLd; };
  const int64_t bh = b0 + blockIdx.y;
  q += lq.head(bh), out += lo.head(bh), lse += bh * L;
  k += lk.head(bh), v += lv.head(bh);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
  // Causal blocks late in the sequence have the most key tiles: start them first.
  const unsigned bx = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t i0 = static_cast<int64_t>(bx) * kRows, iw = i0 + warp * 16 * kM;
  // Copy groups, in order: (Q, K_0), V_0, then K_{t+1} and V_{t+1} issued at the top of tile t
  // into the other buffers, so they land while tile t computes.
  load_tile<kRows, kD>(Qs, q, i0, L, lq.sp);
  load_tile<kBc, kD>(Kb, k, 0, S, lk.sp);
  cp_async_commit();
  load_tile<kBc, kD>(Vb, v, 0, S, lv.sp);
  cp_async_commit();

  float o[kM][kD / 8][4];
  zero(o);
  float m[kM][2], l[kM][2];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.f;
  const int64_t s_end = causal ? (S < i0 + kRows ? S : i0 + kRows) : S;
  const bool fold_scale = scale_log2 > 0.f;
  // Half types at D = 64 keep the warp's Q fragments in registers (32 a thread) across the key
  // tiles; at D = 128 they would take 64 more registers than the 255 the kernel may use.
  constexpr bool kQInRegs = !std::is_same_v<T, float> && kD == 64;
  uint32_t qf[kM][kD / 16][4];
  for (int64_t j0 = 0, tile = 0; j0 < s_end; j0 += kBc, ++tile) {
    T* const Ks = buf(Kb, tile);
    T* const Vs = buf(Vb, tile);
    cp_async_wait<1>();  // K_t is in (V_t may still be coming)
    __syncthreads();     // ... for every thread; and tile t - 1, whose buffers refill now, is consumed
    const bool more = j0 + kBc < s_end;
    if (more) load_tile<kBc, kD>(buf(Kb, tile + 1), k, j0 + kBc, S, lk.sp);
    cp_async_commit();  // empty groups past the last tile keep the counting uniform
    if (more) load_tile<kBc, kD>(buf(Vb, tile + 1), v, j0 + kBc, S, lv.sp);
    cp_async_commit();
    float s[kM][kN8][4];
    zero(s);
    if constexpr (kQInRegs) {
      if (tile == 0) {  // Q arrived with K_0
#pragma unroll
        for (int mi = 0; mi < kM; ++mi)
#pragma unroll
          for (int kk = 0; kk < kD / 16; ++kk)
            ldsm_x4(qf[mi][kk], Qs + (warp * 16 * kM + mi * 16 + lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
      }
      mma_abt_a_regs<T, kM, kD / 16, kN8, kD>(s, qf, Ks);
    } else {
      mma_abt<T, kM, kD / 16, kN8, kD, kX3>(s, Qs + warp * 16 * kM * kLd, Ks);
    }
    // Every key of the tile before S and, causal, at or before the warp's first row: no mask
    // (warp-uniform; under the causal mask only the tiles on the diagonal need one). With a
    // positive scale such a tile's row max is taken over the raw scores (max commutes with the
    // scaling) and the scale goes into the exponent's one FMA, ex2(s * scale - m).
    const bool open_tile = fold_scale && j0 + kBc <= S && (!causal || j0 + kBc - 1 <= iw);
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
      float mx[2] = {m[mi][0], m[mi][1]};
      if (open_tile) {
        float raw[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kN8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) raw[e / 2] = fmaxf(raw[e / 2], s[mi][n][e]);
        mx[0] = fmaxf(mx[0], raw[0] * scale_log2), mx[1] = fmaxf(mx[1], raw[1] * scale_log2);
      } else {
        int hi[2];
        key_bounds<kBc>(hi, iw + 16 * mi + g, j0, S, causal);
#pragma unroll
        for (int n = 0; n < kN8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const bool ok = n * 8 + 2 * t + (e & 1) <= hi[e / 2];
            s[mi][n][e] = ok ? s[mi][n][e] * scale_log2 : -INFINITY;
            mx[e / 2] = fmaxf(mx[e / 2], s[mi][n][e]);
          }
      }
      float corr[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        // Key 0 is in the first tile and every row sees it, so mx is finite from the first tile
        // on; m = -inf then gives corr = 0.
        corr[r] = ex2(m[mi][r] - mx[r]);
        m[mi][r] = mx[r];
        l[mi][r] *= corr[r];
      }
      // The scaled score less the row max (per thread l; the quad's partial sums are added at the end).
      const float mul = open_tile ? scale_log2 : 1.f;
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mi][n][e] = ex2(fmaf(s[mi][n][e], mul, -m[mi][e / 2]));
          l[mi][e / 2] += s[mi][n][e];
        }
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        o[mi][n][0] *= corr[0], o[mi][n][1] *= corr[0];
        o[mi][n][2] *= corr[1], o[mi][n][3] *= corr[1];
      }
    }
    cp_async_wait<2>();  // V_t is in
    __syncthreads();
    mma_pb<T, kM, kBc / 16, kD, kX3>(o, s, Vs);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[mi][r] += __shfl_xor_sync(0xffffffffu, l[mi][r], 1);
      l[mi][r] += __shfl_xor_sync(0xffffffffu, l[mi][r], 2);
    }
    const int64_t ra = iw + 16 * mi + g, rb = ra + 8;
    store_rows<T, kD>(out, o[mi], iw + 16 * mi, L, lo.sp, 1.f / l[mi][0], 1.f / l[mi][1]);
    if (t == 0) {
      if (ra < L) lse[ra] = (m[mi][0] + log2f(l[mi][0])) * kLn2;
      if (rb < L) lse[rb] = (m[mi][1] + log2f(l[mi][1])) * kLn2;
    }
  }
}

// ---------------------------------------------------------------- backward

template <class T, int kD>
constexpr size_t bwd_smem() {  // two row blocks + two double-buffered tiles (+ lse, delta for dkdv)
  using C = BwdTiles<T, kD>;
  return sizeof(T) * 2 * (C::kRows + 2 * C::kN) * ld_of<T, kD>() + sizeof(float) * 4 * C::kN;
}

template <class T, int kD>
constexpr size_t ds_bytes() {  // the one pass's dS^T tile: kRows keys x kN queries
  return sizeof(T) * BwdTiles<T, kD>::kRows * ld_of<T, BwdTiles<T, kD>::kN>();
}

// The one pass stages dS^T in a buffer of its own where kMinBlocks blocks still fit an SM
// (227 KiB of shared memory on sm_90): one barrier a tile fewer than writing it over the
// consumed Q tile, which f32 at D = 64 does (2 x 122 KiB would not fit). On the H200, B8 H12
// T1024 D64 bf16 causal forward + backward: 0.364 ms against 0.374 over Q.
template <class T, int kD>
constexpr bool ds_own_buffer() {
  return (bwd_smem<T, kD>() + ds_bytes<T, kD>()) * BwdTiles<T, kD>::kMinBlocks <= 227 * 1024;
}

template <class T, int kD>
constexpr size_t one_pass_smem() {
  return bwd_smem<T, kD>() + (ds_own_buffer<T, kD>() ? ds_bytes<T, kD>() : 0);
}

// Where the one pass beats two on the H200 (attention_tc_one_pass_pays): everywhere but TF32
// pairs at D = 128, whose one-pass kernel needs more than 255 registers and spills.
constexpr bool one_pass_pays(bool x3, int D) { return !(x3 && D == 128); }

// Rows = keys [j0, j0 + kRows), tiles of queries; writes dk and dv of the block's keys. With kDq
// (the one-pass backward) it also adds each query tile's dQ_t += dS_t K (unscaled) into dq_acc, f32
// [BH, L, kD] zeroed by the caller, by f32 atomics.
template <class T, int kD, bool kX3 = false, bool kDq = false>
__global__ void __launch_bounds__(kThreads, BwdTiles<T, kD>::kMinBlocks)
    tc_bwd_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                       T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dq_acc, TcLayout lq, TcLayout lk,
                       TcLayout lv, TcLayout ldo, TcLayout ldk, TcLayout ldv, int64_t b0, int64_t L, int64_t S,
                       float scale, float scale_log2, bool causal) {
  using C = BwdTiles<T, kD>;
  constexpr int kM = C::kM, kRows = C::kRows, kBr = C::kN, kN8 = kBr / 8, kLd = ld_of<T, kD>();
  extern __shared__ uint4 smem_dkdv[];
  T* Ks = reinterpret_cast<T*>(smem_dkdv);
  T* Vs = Ks + kRows * kLd;
  T* const Qb = Vs + kRows * kLd;                                     // [2][kBr][kLd], double buffers
  T* const Ob = Qb + 2 * kBr * kLd;                                   // [2][kBr][kLd], dout
  float* const lse_b = reinterpret_cast<float*>(Ob + 2 * kBr * kLd);  // [2][kBr] lse * log2 e
  float* const delta_b = lse_b + 2 * kBr;                             // [2][kBr]
  const int64_t bh = b0 + blockIdx.y;
  q += lq.head(bh), dout += ldo.head(bh), lse += bh * L, delta += bh * L;
  k += lk.head(bh), v += lv.head(bh), dk += ldk.head(bh), dv += ldv.head(bh);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows, jw = j0 + warp * 16 * kM;
  // Causal: queries before j0 see none of the block's keys.
  const int64_t i_begin = causal ? j0 / kBr * kBr : 0;
  // Query tile t + 1 (Q, dout, lse, delta) is fetched into the other buffers while t computes.
  auto fetch = [&](int64_t i0, int buf) {
    load_tile<kBr, kD>(Qb + buf * kBr * kLd, q, i0, L, lq.sp);
    load_tile<kBr, kD>(Ob + buf * kBr * kLd, dout, i0, L, ldo.sp);
    for (int e = threadIdx.x; e < kBr; e += kThreads) {
      const bool ok = i0 + e < L;
      lse_b[buf * kBr + e] = ok ? lse[i0 + e] * kLog2e : 0.f;
      delta_b[buf * kBr + e] = ok ? delta[i0 + e] : 0.f;
    }
  };
  load_tile<kRows, kD>(Ks, k, j0, S, lk.sp);
  load_tile<kRows, kD>(Vs, v, j0, S, lv.sp);
  if (i_begin < L) fetch(i_begin, 0);
  cp_async_commit();

  float gk[kM][kD / 8][4], gv[kM][kD / 8][4];
  zero(gk);
  zero(gv);
  for (int64_t i0 = i_begin, tile = 0; i0 < L; i0 += kBr, ++tile) {
    const int buf = tile & 1;
    const T* Qs = Qb + buf * kBr * kLd;
    const T* Os = Ob + buf * kBr * kLd;
    const float* lse_s = lse_b + buf * kBr;
    const float* delta_s = delta_b + buf * kBr;
    cp_async_wait<0>();
    __syncthreads();  // tile t is in for every thread; tile t - 1, whose buffers refill now, is consumed
    if (i0 + kBr < L) fetch(i0 + kBr, buf ^ 1);
    cp_async_commit();
    float st[kM][kN8][4], dpt[kM][kN8][4];  // S^T and dP^T: 16 kM keys x kBr queries
    zero(st);
    zero(dpt);
    mma_abt<T, kM, kD / 16, kN8, kD, kX3>(st, Ks + warp * 16 * kM * kLd, Qs);
    mma_abt<T, kM, kD / 16, kN8, kD, kX3>(dpt, Vs + warp * 16 * kM * kLd, Os);
    // Query i0 + c counts for a key row when lo <= c <= q_hi: before L, and (causal) not before
    // the key. Key rows past S are computed but never stored (rows are independent).
    const int q_hi = clamp_to(L - i0 - 1, -1, kBr);
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
      const int64_t ja = jw + 16 * mi + g;
      const int lo[2] = {causal ? clamp_to(ja - i0, 0, kBr) : 0, causal ? clamp_to(ja + 8 - i0, 0, kBr) : 0};
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * t + (e & 1);
          const bool ok = c <= q_hi && c >= lo[e / 2];
          const float p = ok ? ex2(st[mi][n][e] * scale_log2 - lse_s[c]) : 0.f;
          st[mi][n][e] = p;
          dpt[mi][n][e] = p * (dpt[mi][n][e] - delta_s[c]);
        }
    }
    mma_pb<T, kM, kBr / 16, kD, kX3>(gv, st, Os);
    mma_pb<T, kM, kBr / 16, kD, kX3>(gk, dpt, Qs);
    if constexpr (kDq) {
      // dQ_t needs all kRows keys of dS_t, which four warps hold: dS^T goes through shared
      // memory, in a buffer of its own (ds_own_buffer) or else over Q_t, whose last reader is
      // the dK product above. Either way the loop's top barrier keeps the next tile's writes
      // (dS^T, or the fetch into Q's buffer) behind every warp's product below. Rounded to T
      // as for dK. Keys past S have K = 0 but a nonzero dS: they are zeroed to keep the sum clean.
      constexpr int kLdS = ld_of<T, kBr>();
      static_assert(kRows * kLdS <= kBr * kLd, "dS^T fits in a query tile");
      constexpr bool kOwn = ds_own_buffer<T, kD>();
      T* const dst = kOwn ? reinterpret_cast<T*>(delta_b + 2 * kBr) : Qb + buf * kBr * kLd;
      if constexpr (!kOwn) __syncthreads();  // every warp is done reading Q_t
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
        const int r = warp * 16 * kM + 16 * mi + g;
        const bool ka = j0 + r < S, kb = j0 + r + 8 < S;
#pragma unroll
        for (int n = 0; n < kN8; ++n) {
          const float* d = dpt[mi][n];
          T* pa = dst + r * kLdS + n * 8 + 2 * t;
          if constexpr (std::is_same_v<T, float>) {
            *reinterpret_cast<float2*>(pa) = ka ? make_float2(d[0], d[1]) : make_float2(0.f, 0.f);
            *reinterpret_cast<float2*>(pa + 8 * kLdS) = kb ? make_float2(d[2], d[3]) : make_float2(0.f, 0.f);
          } else {
            *reinterpret_cast<uint32_t*>(pa) = ka ? pack2<T>(d[0], d[1]) : 0u;
            *reinterpret_cast<uint32_t*>(pa + 8 * kLdS) = kb ? pack2<T>(d[2], d[3]) : 0u;
          }
        }
      }
      __syncthreads();
      // The kBr x kD tile split over the warps: kBr / 16 m-tiles, each over 4 / (kBr / 16)
      // warps side by side in the head dim.
      constexpr int kMt = kBr / 16, kWpm = 4 / kMt, kCols = kD / kWpm;
      static_assert(kMt * kWpm == 4 && kCols % 16 == 0, "four warps cover the dQ tile");
      const int mt = warp / kWpm, c0 = (warp % kWpm) * kCols;
      float dqt[1][kCols / 8][4];
      zero(dqt);
      mma_tb<T, kRows / 16, kCols / 8, kD, kX3>(dqt, dst + mt * 16, kLdS, Ks + c0);
      const int64_t ra = i0 + mt * 16 + g, rb = ra + 8;
      float* const acc_rows = dq_acc + bh * L * kD + c0 + 2 * t;
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n) {
        if (ra < L)
          atomicAdd(reinterpret_cast<float2*>(acc_rows + ra * kD + n * 8), make_float2(dqt[0][n][0], dqt[0][n][1]));
        if (rb < L)
          atomicAdd(reinterpret_cast<float2*>(acc_rows + rb * kD + n * 8), make_float2(dqt[0][n][2], dqt[0][n][3]));
      }
    }
  }
  cp_async_wait<0>();  // no query tile (L = 0, or causal keys past L): K/V copies still in flight
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
    store_rows<T, kD>(dk, gk[mi], jw + 16 * mi, S, ldk.sp, scale, scale);
    store_rows<T, kD>(dv, gv[mi], jw + 16 * mi, S, ldv.sp, 1.f, 1.f);
  }
}

// Rows = queries [i0, i0 + kRows), tiles of keys; writes dq of the block's queries.
template <class T, int kD, bool kX3 = false>
__global__ void __launch_bounds__(kThreads, BwdTiles<T, kD>::kMinBlocks)
    tc_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                     T* __restrict__ dq, TcLayout lq, TcLayout lk, TcLayout lv, TcLayout ldo, TcLayout ldq, int64_t b0,
                     int64_t L, int64_t S, float scale, float scale_log2, bool causal) {
  using C = BwdTiles<T, kD>;
  constexpr int kM = C::kM, kRows = C::kRows, kBc = C::kN, kN8 = kBc / 8, kLd = ld_of<T, kD>();
  extern __shared__ uint4 smem_dq[];
  T* Qs = reinterpret_cast<T*>(smem_dq);
  T* Os = Qs + kRows * kLd;          // dout
  T* const Kb = Os + kRows * kLd;    // [2][kBc][kLd], double buffers
  T* const Vb = Kb + 2 * kBc * kLd;  // [2][kBc][kLd]
  auto buf = [&](T* b, int64_t i) { return b + (i & 1) * kBc * kLd; };
  const int64_t bh = b0 + blockIdx.y;
  q += lq.head(bh), dout += ldo.head(bh), dq += ldq.head(bh), lse += bh * L, delta += bh * L;
  k += lk.head(bh), v += lv.head(bh);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
  const unsigned bx = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t i0 = static_cast<int64_t>(bx) * kRows, iw = i0 + warp * 16 * kM;
  load_tile<kRows, kD>(Qs, q, i0, L, lq.sp);
  load_tile<kRows, kD>(Os, dout, i0, L, ldo.sp);
  load_tile<kBc, kD>(Kb, k, 0, S, lk.sp);
  load_tile<kBc, kD>(Vb, v, 0, S, lv.sp);
  cp_async_commit();
  float lse2[kM][2], dl[kM][2];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = iw + 16 * mi + g + 8 * r;
      lse2[mi][r] = i < L ? lse[i] * kLog2e : 0.f;
      dl[mi][r] = i < L ? delta[i] : 0.f;
    }

  float acc[kM][kD / 8][4];
  zero(acc);
  const int64_t s_end = causal ? (S < i0 + kRows ? S : i0 + kRows) : S;
  for (int64_t j0 = 0, tile = 0; j0 < s_end; j0 += kBc, ++tile) {
    const T* Ks = buf(Kb, tile);
    const T* Vs = buf(Vb, tile);
    cp_async_wait<0>();
    __syncthreads();  // tile t is in for every thread; tile t - 1, whose buffers refill now, is consumed
    if (j0 + kBc < s_end) {
      load_tile<kBc, kD>(buf(Kb, tile + 1), k, j0 + kBc, S, lk.sp);
      load_tile<kBc, kD>(buf(Vb, tile + 1), v, j0 + kBc, S, lv.sp);
    }
    cp_async_commit();
    float s[kM][kN8][4], dp[kM][kN8][4];
    zero(s);
    zero(dp);
    mma_abt<T, kM, kD / 16, kN8, kD, kX3>(s, Qs + warp * 16 * kM * kLd, Ks);
    mma_abt<T, kM, kD / 16, kN8, kD, kX3>(dp, Os + warp * 16 * kM * kLd, Vs);
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
      int hi[2];
      key_bounds<kBc>(hi, iw + 16 * mi + g, j0, S, causal);
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool ok = n * 8 + 2 * t + (e & 1) <= hi[e / 2];
          const float p = ok ? ex2(s[mi][n][e] * scale_log2 - lse2[mi][e / 2]) : 0.f;
          dp[mi][n][e] = p * (dp[mi][n][e] - dl[mi][e / 2]);
        }
    }
    mma_pb<T, kM, kBc / 16, kD, kX3>(acc, dp, Ks);
  }
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) store_rows<T, kD>(dq, acc[mi], iw + 16 * mi, L, ldq.sp, scale, scale);
}

// The one-pass backward's last step: dq = scale * dq_acc, rounded to T, into dq's layout; four
// head-dim elements a thread (kD is a multiple of 4, rows of dq 16-byte aligned).
template <class T, int kD>
__global__ void tc_bwd_dq_finish_kernel(const float* __restrict__ acc, T* __restrict__ dq, TcLayout ldq, int64_t L,
                                        int64_t n4, float scale) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n4;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / (kD / 4), d = (e % (kD / 4)) * 4;
    const float4 x = reinterpret_cast<const float4*>(acc)[e];
    T* out = dq + ldq.head(row / L) + (row % L) * ldq.sp + d;
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float4*>(out) = make_float4(x.x * scale, x.y * scale, x.z * scale, x.w * scale);
    } else {
      *reinterpret_cast<uint2*>(out) =
          make_uint2(pack2<T>(x.x * scale, x.y * scale), pack2<T>(x.z * scale, x.w * scale));
    }
  }
}

// ---------------------------------------------------------------- host side

template <class Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// Calls f(T{}, integral_constant<kD>, bool_constant<kX3>) for the element type and head dim.
template <class F>
cudaError_t dispatch(TcElem elem, int D, F&& f) {
  auto by_dim = [&](auto tag, auto x3) -> cudaError_t {
    if (D == 64) return f(tag, std::integral_constant<int, 64>{}, x3);
    if (D == 128) return f(tag, std::integral_constant<int, 128>{}, x3);
    return cudaErrorInvalidValue;
  };
  if (elem == TcElem::tf32) return by_dim(float{}, std::false_type{});
  if (elem == TcElem::f32x3) return by_dim(float{}, std::true_type{});
  return elem == TcElem::f16 ? by_dim(__half{}, std::false_type{}) : by_dim(__nv_bfloat16{}, std::false_type{});
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

unsigned blocks_of(int64_t rows, int per_block) { return static_cast<unsigned>((rows + per_block - 1) / per_block); }

}  // namespace

bool attention_tc_head_dim_ok(int64_t D) { return D == 64 || D == 128; }

bool attention_tc_one_pass_pays(TcElem elem, int D) { return one_pass_pays(elem == TcElem::f32x3, D); }

cudaError_t attention_tc_forward(const TcForwardArgs& a, cudaStream_t stream) {
  return dispatch(a.elem, a.D, [&](auto tag, auto dim, auto x3) -> cudaError_t {
    using T = decltype(tag);
    constexpr int kD = decltype(dim)::value;
    constexpr bool kX3 = decltype(x3)::value;
    constexpr size_t smem = fwd_smem<T, kD>();
    if (cudaError_t e = allow_smem(tc_fwd_kernel<T, kD, kX3>, smem); e != cudaSuccess) return e;
    const float sl2 = a.scale * kLog2e;
    const TcLayout lq = tc_resolve(a.lq, a.L, kD), lk = tc_resolve(a.lk, a.S, kD), lv = tc_resolve(a.lv, a.S, kD),
                   lo = tc_resolve(a.lo, a.L, kD);
    return for_head_chunks(a.BH, [&](int64_t b0, unsigned nb) {
      tc_fwd_kernel<T, kD, kX3><<<dim3(blocks_of(a.L, FwdTiles<T, kD>::kRows), nb), kThreads, smem, stream>>>(
          static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.out),
          a.lse, lq, lk, lv, lo, b0, a.L, a.S, sl2, a.causal);
    });
  });
}

cudaError_t attention_tc_backward(const TcBackwardArgs& a, cudaStream_t stream) {
  return dispatch(a.elem, a.D, [&](auto tag, auto dim, auto x3) -> cudaError_t {
    using T = decltype(tag);
    constexpr int kD = decltype(dim)::value;
    constexpr bool kX3 = decltype(x3)::value;
    constexpr size_t smem = bwd_smem<T, kD>();
    const float sl2 = a.scale * kLog2e;
    const TcLayout lq = tc_resolve(a.lq, a.L, kD), lk = tc_resolve(a.lk, a.S, kD), lv = tc_resolve(a.lv, a.S, kD),
                   ldo = tc_resolve(a.ldout, a.L, kD), ldq = tc_resolve(a.ldq, a.L, kD),
                   ldk = tc_resolve(a.ldk, a.S, kD), ldv = tc_resolve(a.ldv, a.S, kD);
    const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k);
    const T *v = static_cast<const T*>(a.v), *dout = static_cast<const T*>(a.dout);
    const unsigned key_blocks = blocks_of(a.S, BwdTiles<T, kD>::kRows);
    // One pass: dk, dv and dq_acc by atomics, then dq from dq_acc; where it does not pay
    // dq_acc is ignored and the kernel not even compiled.
    if constexpr (one_pass_pays(kX3, kD)) {
      if (a.dq_acc != nullptr) {
        const int64_t n = a.BH * a.L * kD;
        if (cudaError_t e = cudaMemsetAsync(a.dq_acc, 0, sizeof(float) * n, stream); e != cudaSuccess) return e;
        auto run = [&](auto kernel, size_t bytes) -> cudaError_t {
          if (cudaError_t e = allow_smem(kernel, bytes); e != cudaSuccess) return e;
          return for_head_chunks(a.BH, [&](int64_t b0, unsigned nb) {
            kernel<<<dim3(key_blocks, nb), kThreads, bytes, stream>>>(
                q, k, v, dout, a.lse, a.delta, static_cast<T*>(a.dk), static_cast<T*>(a.dv), a.dq_acc, lq, lk, lv, ldo,
                ldk, ldv, b0, a.L, a.S, a.scale, sl2, a.causal);
          });
        };
        if (cudaError_t e = run(tc_bwd_dkdv_kernel<T, kD, kX3, true>, one_pass_smem<T, kD>());
            e != cudaSuccess || a.L == 0)
          return e;
        const int64_t n4 = n / 4, threads = 256;
        const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n4 + threads - 1) / threads, 4096));
        tc_bwd_dq_finish_kernel<T, kD>
            <<<grid, threads, 0, stream>>>(a.dq_acc, static_cast<T*>(a.dq), ldq, a.L, n4, a.scale);
        return cudaGetLastError();
      }
    }
    if (cudaError_t e = allow_smem(tc_bwd_dkdv_kernel<T, kD, kX3>, smem); e != cudaSuccess) return e;
    if (cudaError_t e = allow_smem(tc_bwd_dq_kernel<T, kD, kX3>, smem); e != cudaSuccess) return e;
    return for_head_chunks(a.BH, [&](int64_t b0, unsigned nb) {
      tc_bwd_dkdv_kernel<T, kD, kX3><<<dim3(key_blocks, nb), kThreads, smem, stream>>>(
          q, k, v, dout, a.lse, a.delta, static_cast<T*>(a.dk), static_cast<T*>(a.dv), nullptr, lq, lk, lv, ldo, ldk,
          ldv, b0, a.L, a.S, a.scale, sl2, a.causal);
      if (a.L == 0) return;
      tc_bwd_dq_kernel<T, kD, kX3><<<dim3(blocks_of(a.L, BwdTiles<T, kD>::kRows), nb), kThreads, smem, stream>>>(
          q, k, v, dout, a.lse, a.delta, static_cast<T*>(a.dq), lq, lk, lv, ldo, ldq, b0, a.L, a.S, a.scale, sl2,
          a.causal);
    });
  });
}

}  // namespace mg::kernels::cuda
