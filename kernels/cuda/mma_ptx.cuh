// Inline-PTX building blocks for the tensor-core kernels (attention_tc.cu): cp.async copies,
// ldmatrix loads, mma.sync m16n8k16 in f16/bf16 and m16n8k8 in TF32 with f32 accumulation (and
// f32 as TF32 pairs), and f32 -> T2 / tf32 conversion.
//
// Plain CUDA (no memgrad headers), so standalone nvcc harnesses can include the kernels too.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace mg::kernels::cuda::ptx {

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
// n 16-byte vectors src[0, n) into shared dst[0, n), spread over the block's threads (thread t
// copies t, t + blockDim.x, ...), as one committed group: every thread's whole share in flight at
// once, no registers held. Wait with cp_async_wait, then __syncthreads.
template <class V>
__device__ __forceinline__ void cp_async_block(V* dst, const V* src, int n) {
  static_assert(sizeof(V) == 16, "cp_async_block copies 16-byte vectors");
  for (int i = threadIdx.x; i < n; i += blockDim.x) cp_async16(&dst[i], &src[i], true);
  cp_async_commit();
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

// f32 -> tf32 (10-bit mantissa, round to nearest, ties away), as the 32-bit register mma takes.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// c += a b for one m16n8k8 tile in TF32 (f32 accumulate). Fragments (g = lane / 4, t = lane % 4):
// a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); b0 (k t, n g), b1 (k t + 4, n g).
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x as a TF32 operand: hi = x rounded to TF32; with kX3 also lo = (x - hi) rounded to TF32, so
// x = hi + lo within 2^-22 |x| (lo is left unset otherwise, and unused).
template <bool kX3>
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  if constexpr (kX3) lo = to_tf32(x - __uint_as_float(hi));
}

// c += a b in TF32, or with kX3 as three TF32 products of the pairs, a_lo b_hi + a_hi b_lo +
// a_hi b_hi (small terms first): f32 operands multiplied to about 2^-21 relative (what is lost
// is a_lo b_lo and the pairs' last rounding), CUTLASS's "fast f32" and PyTorch's memory-efficient
// attention for f32. Three times TF32's tensor-core work, still far faster than SIMT f32.
template <bool kX3>
__device__ __forceinline__ void mma_f32(float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                        const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  if constexpr (kX3) {
    mma_tf32(c, al, bh[0], bh[1]);
    mma_tf32(c, ah, bl[0], bl[1]);
  }
  mma_tf32(c, ah, bh[0], bh[1]);
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

// 2^x by the SFU alone (exp2f adds denormal handling around it); 2^-inf = 0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace mg::kernels::cuda::ptx
