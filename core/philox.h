// Philox4x32-10, the counter-based RNG behind every random op: one definition that the host
// (core/random.cc) and the CUDA fill kernels (core/cuda/copy.cu) share, so both draw identical streams.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MG_PHILOX_HD __host__ __device__ __forceinline__
#else
#define MG_PHILOX_HD inline
#endif

namespace mg {

// Philox4x32-10 block for (counter, subsequence, key): 32x32->64-bit products (one mul.wide on the GPU).
MG_PHILOX_HD void philox4x32(uint64_t counter, uint64_t subsequence, uint64_t key, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

}  // namespace mg
