// Attention speed on the device: memgrad's default flash path (cuDNN's fused attention for
// f16/bf16, cudnn_attention.cc; the tensor-core kernels for f32), our tensor-core kernels
// (attention_tc.cu) and the SIMT flash kernels against the materializing sdpa_composed,
// measured in the same run, as ratios.
//
// Shapes match bench/pytorch/attention_sdpa.py (run it on the same card for PyTorch's SDPA):
// GPT-2 124M's attention (B8 H12 T1024 D64), a longer sequence (B4 H12 T2048 D64) and D = 128.
// Each benchmark reports ms (CUDA events), TFLOP/s (FlashAttention's count: 4 B H T^2 D forward,
// 2.5x that backward, halved when causal) and, for tc and the reference, the time relative to
// SIMT on the same configuration ("vs_simt" < 1: faster). SIMT runs first for that reason.
// Labels are "<config>[; impl=NAME]" (bench/runner/records.py reads the impl as a parameter).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "bench/event_time.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/transformer_functions.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

namespace mg::bench {
namespace {

const Device kGpu = Device::cuda(0);

struct Shape {
  int64_t B, H, T, D;
};
const Shape kShapes[] = {{8, 12, 1024, 64}, {4, 12, 2048, 64}, {8, 8, 1024, 128}};

// kDefault is what flash_attention_forward picks (MG_ATTENTION_KERNEL=auto); tc forces our
// tensor-core kernels, whose backward is the one pass (dq by atomics); tc-twopass is the same
// kernels under kernels::set_deterministic(true), dq by a pass of its own.
enum Impl { kSimt = 0, kDefault = 1, kReference = 2, kTcTwoPass = 3, kTc = 4 };
const char* const kImplNames[] = {"simt", "default", "reference", "tc-twopass", "tc"};

// SIMT times by configuration, for the other implementations' ratios.
std::map<std::tuple<int64_t, int64_t, bool, bool>, double> g_simt_ms;

double flops(const Shape& s, bool causal, bool backward) {
  const double f = 4.0 * s.B * s.H * s.T * s.T * s.D * (backward ? 3.5 : 1.0);
  return causal ? f / 2 : f;
}

// Args: shape index, dtype (0 bf16, 1 f16, 2 f32 with TF32 allowed: the tensor-core kernels in
// TF32, the reference's matmuls too; 3 f32 without TF32: the tensor-core kernels on TF32 pairs),
// causal, backward, implementation.
void BM_Attention(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const Shape sh = kShapes[state.range(0)];
  const DType dt = state.range(1) == 0 ? DType::bf16 : state.range(1) == 1 ? DType::f16 : DType::f32;
  const bool tf32_was = kernels::allow_tf32(), tf32 = state.range(1) == 2;
  kernels::set_allow_tf32(tf32);
  const bool causal = state.range(2) != 0, backward = state.range(3) != 0;
  const Impl impl = static_cast<Impl>(state.range(4));
  ::setenv("MG_ATTENTION_KERNEL", impl == kSimt ? "simt" : impl == kTc ? "tc" : "auto", 1);
  const bool det_was = kernels::deterministic();
  kernels::set_deterministic(impl == kTcTwoPass);
  Generator gen(7);
  Tensor q = randn({sh.B, sh.H, sh.T, sh.D}, {dt, kGpu}, &gen), k = randn({sh.B, sh.H, sh.T, sh.D}, {dt, kGpu}, &gen);
  Tensor v = randn({sh.B, sh.H, sh.T, sh.D}, {dt, kGpu}, &gen),
         dout = randn({sh.B, sh.H, sh.T, sh.D}, {dt, kGpu}, &gen);
  auto step = [&] {
    if (impl == kReference) {
      if (!backward) {
        NoGradGuard no_grad;
        Tensor out = sdpa_composed(q, k, v, causal);
        return;
      }
      Tensor ql = q.detach().requires_grad_(true), kl = k.detach().requires_grad_(true);
      Tensor vl = v.detach().requires_grad_(true);
      Tensor out = sdpa_composed(ql, kl, vl, causal);
      autograd::grad({out}, {ql, kl, vl}, {dout});
      return;
    }
    auto [out, lse] = kernels::flash_attention_forward(q, k, v, causal);
    if (backward) kernels::flash_attention_backward(dout, q, k, v, out, lse, causal);
  };
  const double ms = event_time_ms(state, 3, step);
  ::unsetenv("MG_ATTENTION_KERNEL");
  kernels::set_allow_tf32(tf32_was);
  kernels::set_deterministic(det_was);
  state.counters["ms"] = ms;
  state.counters["TFLOP/s"] = flops(sh, causal, backward) / (ms / 1e3) / 1e12;
  const auto key = std::make_tuple(state.range(0), state.range(1), causal, backward);
  if (impl == kSimt)
    g_simt_ms[key] = ms;
  else if (g_simt_ms.count(key))
    state.counters["vs_simt"] = ms / g_simt_ms[key];
  // The configuration as bench/pytorch/attention_sdpa.py prints it; the default path is
  // memgrad's row beside PyTorch's, the others say which implementation they are.
  state.SetLabel("B" + std::to_string(sh.B) + " H" + std::to_string(sh.H) + " T" + std::to_string(sh.T) + " D" +
                 std::to_string(sh.D) + " " + (tf32 ? std::string("f32-tf32") : dtype_name(dt)) +
                 (causal ? " causal" : " full") + (backward ? " fwd+bwd" : " fwd") +
                 (impl == kDefault ? "" : std::string("; impl=") + kImplNames[impl]));
}
// Implementation is the innermost argument, so simt, the default, tc and reference of one
// configuration run side by side (simt first).
BENCHMARK(BM_Attention)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2, 3}, {1, 0}, {0, 1}, {kSimt, kDefault, kTc, kReference}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// The two-pass backward beside it (after the table above, so vs_simt has its SIMT row).
BENCHMARK(BM_Attention)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2, 3}, {1, 0}, {1}, {kTcTwoPass}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// GPT-2's attention from its packed c_attn output, forward + backward through autograd (bf16,
// B8 T1024 H12 D64): attention_packed_qkv (strided reads, y and the [B, T, 3C] gradient written
// in place) against the unpacked path (narrow / transpose views, scaled_dot_product_attention,
// then the head-merge copy and the q/k/v gradient narrow backward). Arg: causal, impl (0
// unpacked, 1 packed); "vs_unpacked" < 1: the packed op is faster.
std::map<bool, double> g_unpacked_ms;

void BM_PackedQkvAttention(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const int64_t B = 8, T = 1024, H = 12, C = 768;
  const bool causal = state.range(0) != 0, packed = state.range(1) != 0;
  Generator gen(11);
  Tensor qkv = randn({B, T, 3 * C}, {DType::bf16, kGpu}, &gen).requires_grad_(true);
  Tensor dy = randn({B, T, C}, {DType::bf16, kGpu}, &gen);
  auto step = [&] {
    Tensor y;
    if (packed) {
      y = attention_packed_qkv(qkv, H, causal);
    } else {
      auto split = [&](int64_t i) { return qkv.narrow(2, i * C, C).reshape({B, T, H, C / H}).transpose(1, 2); };
      y = scaled_dot_product_attention(split(0), split(1), split(2), causal).transpose(1, 2).reshape({B, T, C});
    }
    autograd::grad({y}, {qkv}, {dy});
  };
  const double ms = event_time_ms(state, 3, step);
  state.counters["ms"] = ms;
  if (!packed)
    g_unpacked_ms[causal] = ms;
  else if (g_unpacked_ms.count(causal))
    state.counters["vs_unpacked"] = ms / g_unpacked_ms[causal];
  state.SetLabel(std::string("B8 H12 T1024 D64 bf16") + (causal ? " causal" : " full") + " fwd+bwd" +
                 (packed ? "" : "; impl=unpacked"));
}
BENCHMARK(BM_PackedQkvAttention)->ArgsProduct({{1, 0}, {0, 1}})->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mg::bench

BENCHMARK_MAIN();
