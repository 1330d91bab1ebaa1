// Per-element pieces of the mixed-precision kernels (stochastic rounding to bf16 and its
// counter-based random bits), written once for the CPU loop and the CUDA kernel.
#pragma once

#ifdef __CUDACC__
#define MG_AMP_HD __host__ __device__ __forceinline__
#else
#define MG_AMP_HD inline
#endif

#include <cstdint>
#include <cstring>

namespace mg::kernels::amp_math {

// splitmix64's finalizer over (seed, element index): independent bits per element and per
// call without any generator state, so the CPU and the GPU round identically.
MG_AMP_HD uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

MG_AMP_HD uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// f32 -> bf16 bits, rounding up with probability equal to the discarded fraction (so the
// expected value is exact): add 16 random bits below the kept 16, then truncate. inf and
// NaN keep their class; a finite value may round to inf only past bf16's largest finite.
MG_AMP_HD uint16_t bf16_stochastic_bits(float v, uint32_t random16) {
  const uint32_t u = float_bits(v);
  if ((u & 0x7f800000u) == 0x7f800000u) return static_cast<uint16_t>((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
  return static_cast<uint16_t>((u + (random16 & 0xffffu)) >> 16);
}

// The loss scale's inverse, in the precision the unscale kernels multiply by.
MG_AMP_HD float inverse_scale(double scale) { return static_cast<float>(1.0 / scale); }

// GradScaler.update's rule (torch._amp_update_scale_), one step: on overflow the scale backs
// off and the clean-step count restarts (and the skipped count grows); after growth_interval
// clean steps in a row it grows, unless that would make it infinite.
MG_AMP_HD void update_scale(float& scale, int64_t& growth_tracker, int64_t& skipped, bool found_inf,
                            double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (found_inf) {
    scale = static_cast<float>(scale * backoff_factor);
    growth_tracker = 0;
    ++skipped;
    return;
  }
  if (++growth_tracker == growth_interval) {
    const float grown = static_cast<float>(scale * growth_factor);
    if (grown - grown == 0.0f) scale = grown;  // finite
    growth_tracker = 0;
  }
}

}  // namespace mg::kernels::amp_math
