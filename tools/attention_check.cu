// Standalone check of the tensor-core attention kernels on a device without Bazel: builds
// kernels/cuda/attention_tc.cu into a small .so that tools/attention_check.py drives from PyTorch.
//   nvcc -std=c++20 -O3 -arch=sm_90 -shared -Xcompiler -fPIC -I. tools/attention_check.cu -o /tmp/attn_tc.so
#include "kernels/cuda/attention_tc.cu"

using mg::kernels::cuda::TcBackwardArgs;
using mg::kernels::cuda::TcElem;
using mg::kernels::cuda::TcForwardArgs;

extern "C" int tc_forward(int bf16, const void* q, const void* k, const void* v, void* out, float* lse, int64_t BH,
                          int64_t L, int64_t S, int D, float scale, int causal, void* stream) {
  const TcForwardArgs a{bf16 ? TcElem::bf16 : TcElem::f16, q, k, v, out, lse, BH, L, S, D, scale, causal != 0};
  return static_cast<int>(mg::kernels::cuda::attention_tc_forward(a, static_cast<cudaStream_t>(stream)));
}

extern "C" int tc_backward(int bf16, const void* q, const void* k, const void* v, const void* dout, const float* lse,
                           const float* delta, void* dq, void* dk, void* dv, int64_t BH, int64_t L, int64_t S, int D,
                           float scale, int causal, void* stream) {
  const TcBackwardArgs a{
      bf16 ? TcElem::bf16 : TcElem::f16, q, k, v, dout, lse, delta, dq, dk, dv, BH, L, S, D, scale, causal != 0};
  return static_cast<int>(mg::kernels::cuda::attention_tc_backward(a, static_cast<cudaStream_t>(stream)));
}

// Strided views: lay holds {H, sb, sh, sp} (elements) per tensor, in argument order
// (forward: q, k, v, out; backward: q, k, v, dout, dq, dk, dv). See TcLayout.
namespace {
mg::kernels::cuda::TcLayout lay_at(const int64_t* lay, int i) {
  return {lay[4 * i], lay[4 * i + 1], lay[4 * i + 2], lay[4 * i + 3]};
}
}  // namespace

extern "C" int tc_forward_strided(int bf16, const void* q, const void* k, const void* v, void* out, float* lse,
                                  int64_t BH, int64_t L, int64_t S, int D, float scale, int causal, const int64_t* lay,
                                  void* stream) {
  TcForwardArgs a{bf16 ? TcElem::bf16 : TcElem::f16, q, k, v, out, lse, BH, L, S, D, scale, causal != 0};
  a.lq = lay_at(lay, 0), a.lk = lay_at(lay, 1), a.lv = lay_at(lay, 2), a.lo = lay_at(lay, 3);
  return static_cast<int>(mg::kernels::cuda::attention_tc_forward(a, static_cast<cudaStream_t>(stream)));
}

extern "C" int tc_backward_strided(int bf16, const void* q, const void* k, const void* v, const void* dout,
                                   const float* lse, const float* delta, void* dq, void* dk, void* dv, int64_t BH,
                                   int64_t L, int64_t S, int D, float scale, int causal, const int64_t* lay,
                                   void* stream) {
  TcBackwardArgs a{
      bf16 ? TcElem::bf16 : TcElem::f16, q, k, v, dout, lse, delta, dq, dk, dv, BH, L, S, D, scale, causal != 0};
  a.lq = lay_at(lay, 0), a.lk = lay_at(lay, 1), a.lv = lay_at(lay, 2), a.ldout = lay_at(lay, 3);
  a.ldq = lay_at(lay, 4), a.ldk = lay_at(lay, 5), a.ldv = lay_at(lay, 6);
  return static_cast<int>(mg::kernels::cuda::attention_tc_backward(a, static_cast<cudaStream_t>(stream)));
}

#ifdef ATTENTION_CHECK_MAIN
// A small run for compute-sanitizer (memcheck / racecheck), no PyTorch in the process:
//   nvcc ... -DATTENTION_CHECK_MAIN tools/attention_check.cu -o /tmp/attn_check
//   compute-sanitizer --tool racecheck /tmp/attn_check
#include <cstdio>
#include <vector>

int main() {
  struct Shape {
    int64_t BH, L, S;
    int D;
    int causal;
  };
  const Shape shapes[] = {{2, 100, 100, 64, 1}, {2, 70, 130, 128, 0}, {1, 130, 70, 128, 1}, {1, 9, 200, 64, 0}};
  int rc = 0;
  for (const Shape& s : shapes)
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      const size_t nq = s.BH * s.L * s.D, nk = s.BH * s.S * s.D;
      std::vector<uint16_t> hq(nq), hk(nk);
      for (size_t i = 0; i < nq; ++i) hq[i] = 0x3c00 ^ static_cast<uint16_t>((i * 2654435761u) & 0x03ff);
      for (size_t i = 0; i < nk; ++i) hk[i] = 0x3800 ^ static_cast<uint16_t>((i * 40503u) & 0x03ff);
      void *q, *k, *v, *o, *dq, *dk, *dv;
      float *lse, *delta;
      cudaMalloc(&q, nq * 2), cudaMalloc(&o, nq * 2), cudaMalloc(&dq, nq * 2);
      cudaMalloc(&k, nk * 2), cudaMalloc(&v, nk * 2), cudaMalloc(&dk, nk * 2), cudaMalloc(&dv, nk * 2);
      cudaMalloc(&lse, s.BH * s.L * 4), cudaMalloc(&delta, s.BH * s.L * 4);
      cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(v, hk.data(), nk * 2, cudaMemcpyHostToDevice);
      cudaMemset(delta, 0, s.BH * s.L * 4);
      const float scale = 1.f / sqrtf(static_cast<float>(s.D));
      int e = tc_forward(bf16, q, k, v, o, lse, s.BH, s.L, s.S, s.D, scale, s.causal, nullptr);
      if (!e) e = tc_backward(bf16, q, k, v, o, lse, delta, dq, dk, dv, s.BH, s.L, s.S, s.D, scale, s.causal, nullptr);
      if (!e) e = static_cast<int>(cudaDeviceSynchronize());
      std::printf("BH=%lld L=%lld S=%lld D=%d causal=%d %s: %s\n", (long long)s.BH, (long long)s.L, (long long)s.S, s.D,
                  s.causal, bf16 ? "bf16" : "f16", cudaGetErrorString(static_cast<cudaError_t>(e)));
      rc |= e;
      for (void* p : {q, k, v, o, dq, dk, dv}) cudaFree(p);
      cudaFree(lse), cudaFree(delta);
    }
  return rc ? 1 : 0;
}
#endif
