// CUDA kernel efficiency on the device, each against a baseline measured in the same run:
//  - elementwise / softmax bandwidth as a fraction of a device-to-device copy (and, for the
//    reductions, beside a library's read-only kernel: cuBLAS's cublasSasum over the same bytes);
//  - GEMM TFLOP/s in f16/bf16 (and f32, f32+TF32) through kernels::matmul vs cuBLAS called
//    directly at 8192^3, both with the same cuBLAS workspace (kWorkspaceMiB: main() sets
//    memgrad's MG_CUBLAS_WORKSPACE_MB to it, and the direct handle gets a buffer of that size);
//  - FP8: the cast's bandwidth against the copy, and GPT-2 XL's linears in bf16 beside the FP8
//    GEMM with and without its casts.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "bench/event_time.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/deferred_checks.h"
#include "kernels/fp8.h"
#include "kernels/ops.h"

namespace mg::bench {
namespace {

const Device kGpu = Device::cuda(0);
constexpr int kWorkspaceMiB = 32;  // cuBLAS's own choice on Hopper, and memgrad's default
double g_copy_gbps = 0;            // measured by BM_DeviceCopy, which runs first

const int64_t kN = int64_t{1} << 28;  // 256 Mi elements: 1 GiB in f32

void BM_DeviceCopy(benchmark::State& state) {
  if (!require_gpu(state)) return;
  Tensor a = uniform({kN}, -1, 1, {DType::f32, kGpu}), b = empty({kN}, {DType::f32, kGpu});
  const double bytes = 2.0 * kN * 4;
  const auto stream = static_cast<cudaStream_t>(cuda::Stream::current(0).handle());
  const double ms = event_time_ms(
      state, 0, [&] { cudaMemcpyAsync(b.raw_data(), a.raw_data(), kN * 4, cudaMemcpyDeviceToDevice, stream); });
  g_copy_gbps = bytes / (ms / 1e3) / 1e9;
  state.counters["GB/s"] = g_copy_gbps;
  state.SetLabel("cudaMemcpy device-to-device, read + write bytes");
}
BENCHMARK(BM_DeviceCopy)->UseManualTime()->Unit(benchmark::kMillisecond);

// Runs fn under events and reports GB/s (fn reads and writes `elements` elements of dt), its
// fraction of the copy bandwidth, and the label "<what>, <dtype>".
template <class F>
void bandwidth(benchmark::State& state, DType dt, double elements, const std::string& what, F&& fn) {
  const double gbps = elements * dtype_size(dt) / (event_time_ms(state, 2, fn) / 1e3) / 1e9;
  state.counters["GB/s"] = gbps;
  if (g_copy_gbps > 0) state.counters["of_copy"] = gbps / g_copy_gbps;
  state.SetLabel(what + ", " + dtype_name(dt));
}

// A library's read-only kernel beside the copy: cuBLAS's sum of absolute values (cublasSasum)
// over the same 1 GiB reads every byte once and writes one float. On the H200 it reads at 0.61 of
// the copy's rate (2.5 TB/s), below memgrad's row sums (0.86-0.87, 3.6 TB/s), so it bounds
// nothing: it is there to show that read-mostly kernels do not reach a copy's figure for free.
void BM_ReadOnlyCublas(benchmark::State& state) {
  if (!require_gpu(state)) return;
  Tensor a = uniform({kN}, -1, 1, {DType::f32, kGpu}), r = empty({1}, {DType::f32, kGpu});
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetStream(h, static_cast<cudaStream_t>(cuda::Stream::current(0).handle()));
  cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE);  // the result stays on the device: no sync
  bandwidth(state, DType::f32, 1.0 * kN, "cublasSasum, read-only",
            [&] { cublasSasum(h, static_cast<int>(kN), a.data_ptr<float>(), 1, r.data_ptr<float>()); });
  cublasDestroy(h);
}
BENCHMARK(BM_ReadOnlyCublas)->UseManualTime()->Unit(benchmark::kMillisecond);

// The first argument picks the dtype: 0 f32, 1 f16, 2 bf16.
DType dtype_arg(int64_t i) { return i == 0 ? DType::f32 : i == 1 ? DType::f16 : DType::bf16; }

// Registers a bandwidth benchmark once per dtype, timed by CUDA events.
void over_dtypes(benchmark::internal::Benchmark* b) {
  b->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond);
}

void BM_Add(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  Tensor a = uniform({kN}, -1, 1, {dt, kGpu}), b = uniform({kN}, -1, 1, {dt, kGpu});
  bandwidth(state, dt, 3.0 * kN, "a + b", [&] { Tensor c = kernels::add(a, b); });
}
BENCHMARK(BM_Add)->Apply(over_dtypes);

void BM_Gelu(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  Tensor a = uniform({kN}, -3, 3, {dt, kGpu});
  bandwidth(state, dt, 2.0 * kN, "gelu(tanh)", [&] { Tensor c = kernels::unary(kernels::Unary::GeluTanh, a); });
}
BENCHMARK(BM_Gelu)->Apply(over_dtypes);

void BM_BroadcastAdd(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const int64_t rows = kN / 4096;
  Tensor a = uniform({rows, 4096}, -1, 1, {dt, kGpu}), bias = uniform({4096}, -1, 1, {dt, kGpu});
  bandwidth(state, dt, 2.0 * kN, "[R,4096] + [4096] bias", [&] { Tensor c = kernels::add(a, bias); });
}
BENCHMARK(BM_BroadcastAdd)->Apply(over_dtypes);

void BM_Softmax(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const int64_t cols = state.range(1), rows = kN / cols;
  Tensor a = uniform({rows, cols}, -5, 5, {dt, kGpu});
  bandwidth(state, dt, 2.0 * kN, std::string("softmax over ") + std::to_string(cols),
            [&] { Tensor c = kernels::softmax(a, -1); });
}
BENCHMARK(BM_Softmax)->ArgsProduct({{0, 1, 2}, {1024, 50304}})->UseManualTime()->Unit(benchmark::kMillisecond);

// The loss head's cross-entropy over GPT-2's 50304 classes, [8192, 50304] logits (a B=8 step's):
// the loss and, over the logits, their gradient. Arg 1 = 0: the two kernels
// (cross_entropy_forward, then cross_entropy_backward in place: two reads and a write of the
// logits); 1: kernels::cross_entropy_forward_backward (one read and a write where the row fits in
// shared memory). Bandwidth counts one read and one write, so the two kernels' figure is what
// they reach for the work the fused kernel does.
void BM_CrossEntropy(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const bool fused = state.range(1) == 1;
  const int64_t rows = 8192, cols = 50304;
  Tensor logits = uniform({rows, cols}, -5, 5, {dt, kGpu});
  Tensor target = randint(0, cols, {rows}, {DType::i64, kGpu});
  const Tensor coef = full({1}, 1.0 / rows, {DType::f32, kGpu});
  // The label checks are read 32 calls at a time (as GPT::forward_loss reads its chunks' at once),
  // not each with a wait that would idle the device between calls.
  kernels::DeferredIndexChecks checks;
  int calls = 0;
  bandwidth(state, dt, 2.0 * rows * cols,
            std::string("cross-entropy loss and gradient over 50304, ") + (fused ? "one pass" : "two kernels"), [&] {
              if (++calls % 32 == 0) checks.finish();
              if (fused) {
                kernels::cross_entropy_forward_backward(logits, target, -100, 0.0, coef, logits);
              } else {
                auto [loss, lse] = kernels::cross_entropy_forward(logits, target, -100, 0.0);
                kernels::cross_entropy_backward(coef, logits, target, lse, -100, 0.0, logits);
              }
            });
}
BENCHMARK(BM_CrossEntropy)->ArgsProduct({{0, 1, 2}, {0, 1}})->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_Sum(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  Tensor a = uniform({kN / 4096, 4096}, -1, 1, {dt, kGpu});
  bandwidth(state, dt, 1.0 * kN, "row sums over 4096", [&] { Tensor c = kernels::sum(a, {-1}); });
}
BENCHMARK(BM_Sum)->Apply(over_dtypes);

// Column sums of GPT-2's [B*T, C] gradients at B=8, T=1024 (a linear's bias gradient, read once):
// the vectorized column kernel with split rows and its finalize. These reads are short (12.6 and
// 50 MB in bf16, a few microseconds at the copy's rate), so beside the 1 GiB copy each also gets a
// copy moving as many bytes (half of them read, half written) timed the same way: a kernel this
// short cannot reach the big copy's rate, and `of_same_size_copy` is how near it comes to a copy
// that cannot either.
std::map<std::pair<int64_t, int64_t>, double> g_small_copy_ms;  // by (dtype arg, cols)

void BM_CopyOfColumnSumBytes(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const int64_t bytes = 8192 * state.range(1) * dtype_size(dt);
  Tensor a = empty({bytes / 2}, {DType::u8, kGpu}), b = empty({bytes / 2}, {DType::u8, kGpu});
  const auto stream = static_cast<cudaStream_t>(cuda::Stream::current(0).handle());
  const double ms = event_time_ms(
      state, 2, [&] { cudaMemcpyAsync(b.raw_data(), a.raw_data(), bytes / 2, cudaMemcpyDeviceToDevice, stream); });
  g_small_copy_ms[{state.range(0), state.range(1)}] = ms;
  const double gbps = bytes / (ms / 1e3) / 1e9;
  state.counters["GB/s"] = gbps;
  if (g_copy_gbps > 0) state.counters["of_copy"] = gbps / g_copy_gbps;
  state.SetLabel("cudaMemcpy moving the bytes the column sum of [8192, " + std::to_string(state.range(1)) +
                 "] reads, " + dtype_name(dt));
}
BENCHMARK(BM_CopyOfColumnSumBytes)
    ->ArgsProduct({{0, 1, 2}, {768, 3072}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_ColumnSum(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const int64_t cols = state.range(1), rows = 8192;
  Tensor a = uniform({rows, cols}, -1, 1, {dt, kGpu});
  bandwidth(state, dt, 1.0 * rows * cols, "column sums of [8192, " + std::to_string(cols) + "]",
            [&] { Tensor c = kernels::sum(a, {0}); });
  const auto copy = g_small_copy_ms.find({state.range(0), cols});
  if (copy != g_small_copy_ms.end() && state.counters["GB/s"] > 0)
    state.counters["of_same_size_copy"] =
        state.counters["GB/s"] / (static_cast<double>(rows * cols * dtype_size(dt)) / (copy->second / 1e3) / 1e9);
}
BENCHMARK(BM_ColumnSum)->ArgsProduct({{0, 1, 2}, {768, 3072}})->UseManualTime()->Unit(benchmark::kMillisecond);

// Layer norm over GPT-2's 768 in the input's dtype (reads x, writes y; the statistics are
// 8 bytes a row), and the GPT block's fused residual step: an f32 residual stream plus a
// branch in dt, h written in f32 and y in dt (add_layer_norm, 8 + 2 * size(dt) bytes moved
// per element: counted as that many dt elements).
void BM_LayerNorm(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const int64_t rows = kN / 4 / 768;
  Tensor x = uniform({rows, 768}, -1, 1, {dt, kGpu}), w = uniform({768}, 0.5, 1.5, {dt, kGpu});
  Tensor b = uniform({768}, -1, 1, {dt, kGpu});
  bandwidth(state, dt, 2.0 * rows * 768, "layer norm over 768",
            [&] { auto r = kernels::layer_norm_forward(x, {768}, w, b, 1e-5); });
}
BENCHMARK(BM_LayerNorm)->Apply(over_dtypes);

void BM_AddLayerNorm(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const int64_t rows = kN / 4 / 768;
  Tensor x = uniform({rows, 768}, -1, 1, {DType::f32, kGpu}), res = uniform({rows, 768}, -1, 1, {dt, kGpu});
  Tensor w = uniform({768}, 0.5, 1.5, {DType::f32, kGpu}), b = uniform({768}, -1, 1, {DType::f32, kGpu});
  const double per_element = (8.0 + 2.0 * dtype_size(dt)) / dtype_size(dt);
  bandwidth(state, dt, per_element * rows * 768, "f32 stream + branch, layer norm over 768",
            [&] { auto r = kernels::add_layer_norm_forward(x, res, {768}, w, b, 1e-5, dt); });
}
BENCHMARK(BM_AddLayerNorm)->Apply(over_dtypes);

// A transformer branch's bias, dropout (p = 0.1) and residual add: an f32 stream [R, 768] (f64
// for f64) plus dropout(branch + bias) with the branch in the dtype. range(1) = 1: the fused
// kernel (reads x and the branch, writes the sum and a b8 mask); 0: the ops it replaces, a
// Bernoulli mask in the dtype, its scaling, the product and the add (the bias inside the GEMM
// before them, not counted). of_copy counts the fused kernel's bytes for both, so the composed
// row's figure is its time measured against the same work.
void BM_BiasDropoutAdd(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const DType dt = dtype_arg(state.range(0));
  const bool fused = state.range(1) == 1;
  const DType stream = dt == DType::f64 ? DType::f64 : DType::f32;
  const int64_t rows = kN / 4 / 768;
  Tensor x = uniform({rows, 768}, -1, 1, {stream, kGpu}), br = uniform({rows, 768}, -1, 1, {dt, kGpu});
  Tensor bias = uniform({768}, -1, 1, {dt, kGpu});
  const double per_element = (2.0 * dtype_size(stream) + dtype_size(dt) + 1.0) / dtype_size(dt);
  const double p = 0.1;
  bandwidth(state, dt, per_element * rows * 768,
            fused ? "stream + dropout(branch + bias) over 768, one kernel"
                  : "stream + dropout(branch), bernoulli_ + mul_scalar + mul + add",
            [&] {
              if (fused) {
                auto r = kernels::bias_dropout_add(x, br, bias, p);
              } else {
                Tensor keep = empty({rows, 768}, {dt, kGpu});
                bernoulli_(keep, 1.0 - p);
                Tensor r = kernels::add(x, kernels::mul(br, kernels::mul_scalar(keep, 1.0 / (1.0 - p))));
              }
            });
}
BENCHMARK(BM_BiasDropoutAdd)->ArgsProduct({{0, 1, 2}, {0, 1}})->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- GEMM ----
const int64_t kM = 8192;

void gemm_flops(benchmark::State& state, double ms) {
  state.counters["TFLOP/s"] = 2.0 * kM * kM * kM / (ms / 1e3) / 1e12;
}

void BM_Matmul(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const int mode = static_cast<int>(state.range(0));  // 0 f32, 1 f32+tf32, 2 f16, 3 bf16
  DType dt = mode <= 1 ? DType::f32 : mode == 2 ? DType::f16 : DType::bf16;
  kernels::set_allow_tf32(mode == 1);
  Tensor a = uniform({kM, kM}, -1, 1, {dt, kGpu}), b = uniform({kM, kM}, -1, 1, {dt, kGpu});
  Tensor c = empty({kM, kM}, {dt, kGpu});
  const double ms = event_time_ms(state, 3, [&] { kernels::gemm(a, false, b, false, c); });
  kernels::set_allow_tf32(false);
  gemm_flops(state, ms);
  state.SetLabel(std::string("memgrad kernels::gemm 8192^3 ") + dtype_name(dt) + (mode == 1 ? " (TF32)" : ""));
}
BENCHMARK(BM_Matmul)->DenseRange(0, 3)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_CublasDirect(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const int mode = static_cast<int>(state.range(0));
  DType dt = mode <= 1 ? DType::f32 : mode == 2 ? DType::f16 : DType::bf16;
  cudaDataType_t ct = dt == DType::f32 ? CUDA_R_32F : dt == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  cublasComputeType_t comp = mode == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Tensor a = uniform({kM, kM}, -1, 1, {dt, kGpu}), b = uniform({kM, kM}, -1, 1, {dt, kGpu}),
         c = empty({kM, kM}, {dt, kGpu});
  cublasHandle_t h;
  cublasCreate(&h);
  Tensor workspace = empty({int64_t{kWorkspaceMiB} << 20}, {DType::u8, kGpu});
  cublasSetWorkspace(h, workspace.raw_data(), size_t{kWorkspaceMiB} << 20);
  float alpha = 1, beta = 0;
  auto run = [&] {
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, kM, kM, kM, &alpha, b.raw_data(), ct, kM, a.raw_data(), ct, kM, &beta,
                 c.raw_data(), ct, kM, comp, CUBLAS_GEMM_DEFAULT);
  };
  // The handle has no stream set: it runs on the legacy default stream, which is also
  // memgrad's current stream here (no StreamGuard), so the events bracket the GEMM.
  const double ms = event_time_ms(state, 3, run);
  cublasDestroy(h);
  gemm_flops(state, ms);
  state.SetLabel(std::string("cuBLAS cublasGemmEx directly 8192^3 ") + dtype_name(dt) + (mode == 1 ? " (TF32)" : ""));
}
BENCHMARK(BM_CublasDirect)->DenseRange(0, 3)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- FP8 (the recipe's pieces, docs/mixed_precision.md) ----
// fp8_cast of a bf16 [8192, 6400] tensor (GPT-2 XL's MLP activation at B=8) into its e4m3 codes
// and their transpose: the amax pass reads it, the cast reads it again and writes two codes an
// element, 6 bytes an element in all (counted as 3 bf16 elements).
void BM_Fp8Cast(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const int64_t rows = 8192, cols = 6400;
  Tensor x = uniform({rows, cols}, -1, 1, {DType::bf16, kGpu});
  bandwidth(state, DType::bf16, 3.0 * rows * cols, "fp8_cast [8192, 6400] to e4m3 codes and transpose",
            [&] { (void)kernels::fp8_cast(x, kernels::Fp8Format::E4M3, true, true); });
}
BENCHMARK(BM_Fp8Cast)->UseManualTime()->Unit(benchmark::kMillisecond);

// The FP8 recipe's casts of one GPT-2 XL block at B=8, T=1024 under delayed scaling (a history
// already started, so each is one pass: read x, write the codes and their transpose): the
// layer norms' outputs, the MLP's activation cast from c_fc's output (GELU in the pass), the f32
// weights, and the output gradients in e5m2 with their column sums (the bias gradients; the MLP's
// through GELU's derivative from c_fc's output). GB/s counts the bytes read and the two codes
// written; of_copy against the device-to-device copy, the cast's ceiling.
struct XlCast {
  int64_t rows, cols;
  DType dt;
  bool gelu, gelu_backward, column_sums;
  const char* name;
};
constexpr XlCast kXlCasts[] = {
    {8192, 1600, DType::bf16, false, false, false, "layer-norm output [8192, 1600]"},
    {8192, 6400, DType::bf16, true, false, false, "gelu of c_fc's output [8192, 6400]"},
    {6400, 1600, DType::f32, false, false, false, "c_fc weight [6400, 1600]"},
    {4800, 1600, DType::f32, false, false, false, "c_attn weight [4800, 1600]"},
    {8192, 1600, DType::bf16, false, false, true, "output gradient [8192, 1600], column sums"},
    {8192, 4800, DType::bf16, false, false, true, "output gradient [8192, 4800], column sums"},
    {8192, 6400, DType::bf16, false, true, true, "gelu-backward gradient [8192, 6400], column sums"},
};

void BM_Fp8CastDelayedXl(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const XlCast c = kXlCasts[state.range(0)];
  Tensor x = uniform({c.rows, c.cols}, -1, 1, {c.dt, kGpu});
  Tensor pre = c.gelu_backward ? uniform({c.rows, c.cols}, -3, 3, {c.dt, kGpu}) : Tensor();
  const kernels::Fp8Format f = c.column_sums ? kernels::Fp8Format::E5M2 : kernels::Fp8Format::E4M3;
  const kernels::Fp8CastOutputs out{true, true, c.column_sums};
  kernels::Fp8History h;
  auto run = [&] {
    if (c.gelu_backward)
      (void)kernels::fp8_cast_gelu_backward_delayed(x, pre, f, out, h);
    else
      (void)kernels::fp8_cast_delayed(x, f, out, h, 0, c.gelu ? kernels::Fp8Of::GeluOfX : kernels::Fp8Of::X);
  };
  run();  // the history's first cast is a current-scaling one
  const double elements = static_cast<double>(c.rows) * c.cols;
  const double bytes = elements * (dtype_size(c.dt) * (c.gelu_backward ? 2 : 1) + 2);
  const double ms = event_time_ms(state, 2, run);
  state.counters["GB/s"] = bytes / (ms / 1e3) / 1e9;
  if (g_copy_gbps > 0) state.counters["of_copy"] = state.counters["GB/s"] / g_copy_gbps;
  state.SetLabel(std::string("delayed FP8 cast, GPT-2 XL ") + c.name + ", " + dtype_name(c.dt));
}
BENCHMARK(BM_Fp8CastDelayedXl)->DenseRange(0, 6)->UseManualTime()->Unit(benchmark::kMillisecond);

// GPT-2 XL's linear layers at B=8, T=1024 (M = 8192 rows): out [M, N] = x [M, K] @ w [N, K]^T,
// as bf16 kernels::linear, as the FP8 GEMM of already-cast codes (kernels::fp8_gemm, e4m3, fast
// accumulation), and as the recipe's forward: both casts, then the GEMM. TFLOP/s of the GEMM's
// 2 M N K in each, so their ratio is the speedup.
struct XlShape {
  int64_t k, n;
  const char* name;
};
constexpr XlShape kXlShapes[] = {{1600, 4800, "qkv"}, {1600, 6400, "c_fc"}, {6400, 1600, "c_proj"}};

void BM_XlLinear(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const XlShape sh = kXlShapes[state.range(0)];
  const int mode = static_cast<int>(state.range(1));  // 0 bf16, 1 FP8 codes, 2 FP8 with its casts
  const int64_t m = 8192;
  Tensor x = uniform({m, sh.k}, -1, 1, {DType::bf16, kGpu}),
         w = uniform({sh.n, sh.k}, -0.05, 0.05, {DType::bf16, kGpu});
  const auto e4m3 = kernels::Fp8Format::E4M3;
  const kernels::Fp8Matrix xq = kernels::fp8_cast(x, e4m3, true, false), wq = kernels::fp8_cast(w, e4m3, true, false);
  std::function<void()> run;
  if (mode == 0) run = [&] { (void)kernels::linear(x, w); };
  if (mode == 1) run = [&] { (void)kernels::fp8_gemm(xq, wq, Tensor(), DType::bf16); };
  if (mode == 2)
    run = [&] {
      (void)kernels::fp8_gemm(kernels::fp8_cast(x, e4m3, true, false), kernels::fp8_cast(w, e4m3, true, false),
                              Tensor(), DType::bf16);
    };
  const double ms = event_time_ms(state, 3, run);
  state.counters["TFLOP/s"] = 2.0 * m * sh.n * sh.k / (ms / 1e3) / 1e12;
  static const char* kMode[] = {"bf16 linear", "FP8 GEMM of the codes", "FP8 casts + GEMM"};
  state.SetLabel(std::string("GPT-2 XL ") + sh.name + " [8192, " + std::to_string(sh.k) + "] x [" +
                 std::to_string(sh.n) + ", " + std::to_string(sh.k) + "]^T, " + kMode[mode]);
}
BENCHMARK(BM_XlLinear)->ArgsProduct({{0, 1, 2}, {0, 1, 2}})->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mg::bench

int main(int argc, char** argv) {
  // Before memgrad's first cuBLAS call: its handles read the workspace size once.
  ::setenv("MG_CUBLAS_WORKSPACE_MB", std::to_string(mg::bench::kWorkspaceMiB).c_str(), 1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
