// Flash attention (kernels/cuda/attention.cu, attention_tc.cu) against the reference.
// - Raw kernels: out, logsumexp and dq/dk/dv of kernels::flash_attention_* on CUDA vs
//   mg::sdpa_composed (and a plain logsumexp loop) on the CPU in f64, computed on the very
//   values the GPU sees (half inputs are rounded first), so only the GPU's own error counts.
//   Causal and not; T in {1, 7, 64, 257, 1024}, D in {32, 64}, a few B*H, plus odd head dims
//   (8, 80, 128: every head-dim bucket) and L != S; f32 (rtol 1e-4), f16 and bf16 (2e-2).
// - Autograd: mg::scaled_dot_product_attention on CUDA (taking the flash path, with strided
//   inputs) gives mg::sdpa_composed's output and gradients; MG_ATTENTION_KERNEL=composed switches.
// - Memory: forward + backward at B=8, H=12, T=1024, D=64 in f32 peaks at least
//   B*H*T*T*4 bytes below the reference (it never allocates a T x T buffer).
// - Both f16/bf16 kernels, the tensor-core one (D = 64, 128) and the SIMT reference
//   (MG_ATTENTION_KERNEL=simt), on the same cases against the f64 reference; f32 on the tensor
//   cores in TF32 (set_allow_tf32) within TF32's bounds, and without TF32 as TF32 pairs within
//   f32's (beside the SIMT f32 kernels); the tensor-core backward in one pass (dq by
//   atomics, the default) and in two (set_deterministic), the two-pass one bitwise
//   deterministic; the kernel choice itself (no GPU needed).
// - attention_packed_qkv (q/k/v read in place from [B, T, 3C], y and the [B, T, 3C] gradient
//   written in place) vs the unpacked path and the f64 reference, f32/f16/bf16, causal and not,
//   tc and simt, a misaligned qkv (contiguous fallback), and its peak memory (no head copies).
// - cuDNN's fused attention: against the reference, plans built once per configuration and
//   never inside a CUDA-graph capture.
// GPU tests skip without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "autograd/transformer_functions.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace mg {
namespace {
namespace k = mg::kernels;
using namespace mg::testing;  // to_cuda, host, dstr, CudaTest

// TF32 (f32 on the tensor cores under kernels::set_allow_tf32): the inputs, P and dS are rounded
// to 10 mantissa bits (unit roundoff u = 2^-11), products accumulate in f32 and results are
// stored in f32. A score q . k carries 2D input roundings, scaled by 1 / sqrt(D): about 1u
// of error (one standard deviation) for inputs uniform in [-2, 2]; an output adds P's and V's
// roundings. The worst of the 2.6e5 outputs of the D = 128, L = 1024 case is then 4-5 standard
// deviations out: 8.3u measured on the H200, so 12u for the output. The logsumexp carries the
// scores' error alone: 5u (1.8u measured). 15u for the gradients (bf16's 6e-2 in bf16's u),
// whose ds = p (dout . v - delta) can nearly cancel.
constexpr double kTf32U = 1.0 / 2048;
bool tf32_on(DType t) { return t == DType::f32 && k::allow_tf32(); }
double tol_of(DType t) { return tf32_on(t) ? 12 * kTf32U : t == DType::f32 ? 1e-4 : 2e-2; }
double lse_tol_of(DType t) { return tf32_on(t) ? 5 * kTf32U : 1e-4; }
// The logsumexp's absolute floor (expect_close). A TF32 score's error is absolute, about 1u
// (above) whatever its value, while the L = 1 cases have few scores, whose rms can fall well
// under their typical size scale sqrt(D E[q^2] E[k^2]) = 1.33 for these inputs: the floor is 1
// under TF32 (7u against |ref| + rms alone was seen at BH = 3, L = S = 1), 0.01 otherwise.
double lse_floor_of(DType t) { return tf32_on(t) ? 1.0 : 0.01; }
// Gradients in bf16 get more room: delta = rowsum(dout * out) is taken from the output as
// stored, rounded to bf16 (as FlashAttention does; it is all backward has), an error of up to
// 2^-9 |out| per element that ds = p (dout . v - delta) carries into dq and dk. It shows
// where ds nearly cancels (a query with two keys of similar dout . v): over the 4.5M
// elements of the 70000-head case the worst is 4.3% (of |ref| + rms), typical ~1%. f16's
// 3 more mantissa bits make it 8x smaller.
double grad_tol_of(DType t) { return tf32_on(t) ? 15 * kTf32U : t == DType::bf16 ? 6e-2 : tol_of(t); }
// The gradients' absolute floor (expect_close) for a head dim. A cancelling ds (L = S = 1) is
// dout . v as the kernel's products give it less delta in f32, and dq = ds k scale: about
// e |dout . v| |k| / sqrt(D) with e the products' relative error, and |dout . v| |k| / sqrt(D)
// about 1 for these inputs. TF32 (e = u): 5e-4 seen, 1u, so the floor is 1. TF32 pairs on the
// tensor cores (e about 2^-21, 8x f32's FMAs): up to 4e-6 seen at D = 128, 0.04 of the 1e-4
// bound, so 0.05. Otherwise 0.01.
double grad_floor_of(DType t, int64_t D) {
  if (tf32_on(t)) return 1.0;
  const bool pairs = t == DType::f32 && k::flash_attention_kernel(t, D) == k::AttentionKernel::FlashTensorCore;
  return pairs ? 0.05 : 0.01;
}

// Sets a kernels:: setting (TF32, deterministic kernels) for a scope, restoring it after.
template <bool (*Get)(), void (*Set)(bool)>
class ScopedFlag {
 public:
  explicit ScopedFlag(bool on) : was_(Get()) { Set(on); }
  ~ScopedFlag() { Set(was_); }

 private:
  bool was_;
};
using ScopedTf32 = ScopedFlag<k::allow_tf32, k::set_allow_tf32>;
using ScopedDeterministic = ScopedFlag<k::deterministic, k::set_deterministic>;

// |ref - got| <= tol * (|ref| + rms(ref) + floor) elementwise (got may be on CUDA, any
// dtype). The absolute floor is for gradients that are exactly zero in f64 and rounding noise
// on the device (L = S = 1: dq = dk = 0, as ds = dout . v - delta cancels): 0.01 where both
// terms see the same rounded values (f32, f16, bf16: they cancel but for f32 summation order);
// grad_floor_of gives the gradients' own. Returns the worst relative error.
double expect_close(const Tensor& ref, const Tensor& got, double tol, const std::string& what, double floor = 0.01) {
  if (!ref.defined() || !got.defined() || ref.sizes() != got.sizes()) {
    ADD_FAILURE() << what << ": undefined or shapes differ";
    return INFINITY;
  }
  std::vector<double> a = raw::contiguous(ref).to_vector<double>();
  std::vector<double> b = raw::to_device(raw::contiguous(got), Device::cpu()).to_vector<double>();
  double rms = 0;
  for (double x : a) rms += x * x;
  rms = a.empty() ? 0 : std::sqrt(rms / static_cast<double>(a.size()));
  int bad = 0;
  double worst = 0;  // max |ref - got| / (|ref| + rms + floor), reported with a failure
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - b[i]) / (std::abs(a[i]) + rms + floor);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
    if (!(err <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " of " << shape_str(ref.sizes()) << ": reference " << a[i]
                    << " vs flash " << b[i] << " (tol " << tol << ", rms " << rms << ")";
  }
  if (bad > 0) ADD_FAILURE() << what << ": " << bad << " elements off, worst relative error " << worst;
  return worst;
}

// logsumexp over keys of scale * q k^T (masked), q [BH, L, D], k [BH, S, D] contiguous f64.
Tensor logsumexp_ref(const Tensor& q, const Tensor& k, bool causal, double scale) {
  const int64_t BH = q.size(0), L = q.size(1), S = k.size(1), D = q.size(2);
  const double* qp = q.data_ptr<double>();
  const double* kp = k.data_ptr<double>();
  std::vector<double> out(static_cast<size_t>(BH * L)), s(static_cast<size_t>(S));
  for (int64_t b = 0; b < BH; ++b)
    for (int64_t i = 0; i < L; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      const int64_t n = causal ? std::min(S, i + 1) : S;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t e = 0; e < D; ++e) d += qp[(b * L + i) * D + e] * kp[(b * S + j) * D + e];
        s[j] = d * scale;
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < n; ++j) z += std::exp(s[j] - m);
      out[b * L + i] = m + std::log(z);
    }
  return from_vector<double>(out, {BH, L});
}

struct Case {
  int64_t BH, L, S, D;
  bool causal;
};

std::string name_of(const Case& c, DType dt) {
  std::ostringstream os;
  os << dstr(dt) << " BH=" << c.BH << " L=" << c.L << " S=" << c.S << " D=" << c.D << (c.causal ? " causal" : "");
  return os.str();
}

class AttentionParity : public CudaTest {
 protected:
  Generator g{20241130};

  // The raw kernels on CUDA vs sdpa_composed on the CPU in f64 (same rounded values).
  void check_case(const Case& c, DType dt) {
    const std::string what = name_of(c, dt);
    SCOPED_TRACE(what);
    Tensor q = host({c.BH, c.L, c.D}, dt, g), kk = host({c.BH, c.S, c.D}, dt, g), v = host({c.BH, c.S, c.D}, dt, g);
    Tensor dout = host({c.BH, c.L, c.D}, dt, g);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));

    auto [out, lse] = k::flash_attention_forward(to_cuda(q), to_cuda(kk), to_cuda(v), c.causal);
    ASSERT_EQ(out.dtype(), dt);
    ASSERT_EQ(lse.dtype(), DType::f32);
    auto [gq, gk, gv] =
        k::flash_attention_backward(to_cuda(dout), to_cuda(q), to_cuda(kk), to_cuda(v), out, lse, c.causal);

    // The reference, through autograd, on the CPU in f64.
    Tensor q64 = raw::to_dtype(q, DType::f64), k64 = raw::to_dtype(kk, DType::f64), v64 = raw::to_dtype(v, DType::f64);
    q64.requires_grad_(true), k64.requires_grad_(true), v64.requires_grad_(true);
    Tensor ref = sdpa_composed(q64, k64, v64, c.causal);
    std::vector<Tensor> grads = autograd::grad({ref}, {q64, k64, v64}, {raw::to_dtype(dout, DType::f64)});

    worst_out = std::max(worst_out, expect_close(ref.detach(), out, tol_of(dt), what + " out"));
    worst_lse = std::max(worst_lse, expect_close(logsumexp_ref(q64.detach(), k64.detach(), c.causal, scale), lse,
                                                 lse_tol_of(dt), what + " logsumexp", lse_floor_of(dt)));
    const double gtol = grad_tol_of(dt);
    for (int i = 0; i < 3; ++i)
      worst_grad = std::max(worst_grad, expect_close(grads[i],
                                                     i == 0   ? gq
                                                     : i == 1 ? gk
                                                              : gv,
                                                     gtol,
                                                     what + (i == 0   ? " dq"
                                                             : i == 1 ? " dk"
                                                                      : " dv"),
                                                     grad_floor_of(dt, c.D)));
  }
  // The worst relative errors check_case has seen (for a test to report).
  double worst_out = 0, worst_lse = 0, worst_grad = 0;
};

// ---------------------------------------------------------------- raw kernels

TEST_F(AttentionParity, KernelsMatchReference) {
  std::vector<Case> cases;
  for (bool causal : {false, true})
    for (int64_t T : {1, 7, 64, 257, 1024})
      for (int64_t D : {32, 64}) cases.push_back({T >= 1024 ? 2 : 6, T, T, D, causal});
  for (const Case& c : cases)
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) check_case(c, dt);
}

TEST_F(AttentionParity, OddHeadDimsAndLengths) {
  // D = 8 and 80 are padded within their buckets (32, 128); D = 128 fills the largest bucket,
  // whose backward needs more than 48 KiB of shared memory. L != S: causal is top-left.
  const std::vector<Case> cases = {
      {3, 33, 33, 8, false},    {3, 33, 33, 8, true},  {2, 65, 65, 80, true},   {2, 100, 100, 128, false},
      {2, 100, 100, 128, true}, {2, 5, 37, 64, false}, {2, 5, 37, 64, true},    {2, 40, 9, 32, true},
      {2, 40, 9, 32, false},    {1, 0, 5, 32, false},  {70000, 2, 3, 32, true},  // > 65535 heads: chunked grid
  };
  for (const Case& c : cases)
    for (DType dt : {DType::f32, DType::bf16}) check_case(c, dt);
}

TEST_F(AttentionParity, StridedInputsAndScale) {
  // [B, T, H, D] tensors seen as [B, H, T, D] (not contiguous), a custom scale.
  const int64_t B = 2, T = 50, H = 3, D = 64;
  Tensor q = host({B, T, H, D}, DType::f32, g), kk = host({B, T, H, D}, DType::f32, g);
  Tensor v = host({B, T, H, D}, DType::f32, g), dout = host({B, H, T, D}, DType::f32, g);
  auto bhtd = [](const Tensor& t) { return raw::transpose(t, 1, 2); };
  auto [out, lse] = k::flash_attention_forward(bhtd(to_cuda(q)), bhtd(to_cuda(kk)), bhtd(to_cuda(v)), true, 0.3);
  EXPECT_EQ(out.sizes(), (Shape{B, H, T, D}));
  EXPECT_EQ(lse.sizes(), (Shape{B, H, T}));
  auto [gq, gk, gv] = k::flash_attention_backward(to_cuda(dout), bhtd(to_cuda(q)), bhtd(to_cuda(kk)), bhtd(to_cuda(v)),
                                                  out, lse, true, 0.3);
  Tensor q64 = raw::contiguous(bhtd(raw::to_dtype(q, DType::f64)));
  Tensor k64 = raw::contiguous(bhtd(raw::to_dtype(kk, DType::f64)));
  Tensor v64 = raw::contiguous(bhtd(raw::to_dtype(v, DType::f64)));
  q64.requires_grad_(true), k64.requires_grad_(true), v64.requires_grad_(true);
  Tensor ref = sdpa_composed(q64, k64, v64, true, 0.0, 0.3);
  std::vector<Tensor> grads = autograd::grad({ref}, {q64, k64, v64}, {raw::to_dtype(dout, DType::f64)});
  expect_close(ref.detach(), out, 1e-4, "strided out");
  expect_close(grads[0], gq, 1e-4, "strided dq");
  expect_close(grads[1], gk, 1e-4, "strided dk");
  expect_close(grads[2], gv, 1e-4, "strided dv");
}

// ---------------------------------------------------------------- tensor cores vs SIMT

// Sets MG_ATTENTION_KERNEL for a scope (read by the kernels at each call).
class ScopedKernel {
 public:
  explicit ScopedKernel(const char* kernel) { ::setenv("MG_ATTENTION_KERNEL", kernel, 1); }
  ~ScopedKernel() { ::unsetenv("MG_ATTENTION_KERNEL"); }
};

// Every shape the tensor-core kernels take: lengths that are not multiples of any tile (1, 7,
// 100, 257), L != S both ways (keys past the queries' end, queries past the keys'), both head
// dims, causal and not.
std::vector<Case> tensor_core_cases() {
  std::vector<Case> cases;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      for (int64_t T : {1, 7, 64, 100, 257, 1024}) cases.push_back({T >= 1024 ? 2 : 3, T, T, D, causal});
      for (auto [L, S] : {std::pair<int64_t, int64_t>{5, 37}, {40, 9}, {130, 70}, {70, 130}})
        cases.push_back({2, L, S, D, causal});
    }
  return cases;
}

TEST_F(AttentionParity, TensorCoreAndSimtMatchReference) {
  // The tensor-core shapes in f16/bf16 through both kernels.
  // Under "cudnn" the lengths that are multiples of 64 run in cuDNN, the others fall back to the
  // tensor-core kernels.
  const std::vector<Case> cases = tensor_core_cases();
  for (const char* kernel : {"cudnn", "tc", "simt"}) {
    ScopedKernel use(kernel);
    SCOPED_TRACE(kernel);
    for (DType dt : {DType::f16, DType::bf16}) {
      // The cases exercise the kernel they are named after.
      EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(dt, 64)), kernel);
      EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(dt, 128)), kernel);
      for (const Case& c : cases) check_case(c, dt);
    }
    check_case({70000, 2, 3, 64, true}, DType::f16);  // > 65535 heads: chunked grid
  }
}

// cuDNN's fused attention (kernels/cuda/cudnn_attention.cc), the default for f16/bf16: lengths that
// are multiples of 64 (L = S, L < S and L > S under the top-left causal mask), head dims 32, 64,
// 128, against the f64 reference with the tolerances of the other half-precision kernels (the
// same rounding: inputs and P, dS in the io type, f32 sums). The GPT shapes (L = S, D = 64 or
// 128) must really run in cuDNN: its run counter rises by two (forward and backward) per case.
TEST_F(AttentionParity, CudnnMatchesReference) {
  ::unsetenv("MG_ATTENTION_KERNEL");
  for (DType dt : {DType::f16, DType::bf16}) {
    ASSERT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(dt, 64)), "cudnn");
    for (bool causal : {false, true}) {
      for (auto [BH, T, D] : {std::tuple<int64_t, int64_t, int64_t>{3, 64, 64}, {2, 1024, 64}, {2, 256, 128}}) {
        const int64_t before = k::cuda::cudnn_attention_runs();
        check_case({BH, T, T, D, causal}, dt);
        EXPECT_EQ(k::cuda::cudnn_attention_runs() - before, 2)
            << dstr(dt) << " T=" << T << " D=" << D << ": " << k::cuda::cudnn_attention_last_decline();
      }
      for (const Case& c : {Case{2, 128, 256, 64, causal}, Case{2, 256, 128, 64, causal}, Case{2, 128, 128, 32, causal},
                            Case{2, 128, 128, 80, causal}}) {
        const int64_t before = k::cuda::cudnn_attention_runs();
        check_case(c, dt);
        const int64_t ran = k::cuda::cudnn_attention_runs() - before;
        std::cout << name_of(c, dt) << ": " << ran << " of 2 calls in cuDNN"
                  << (ran < 2 ? " (declined: " + k::cuda::cudnn_attention_last_decline() + ")" : std::string()) << "\n";
      }
    }
  }
}

TEST_F(AttentionParity, CudnnPlansAreBuiltOncePerConfiguration) {
  // A configuration's plan is built on its first call and reused: the second call of the same
  // shapes builds nothing. Prints what building costs (cuDNN compiles its kernels at run time).
  ::unsetenv("MG_ATTENTION_KERNEL");
  const Case c{4, 512, 512, 64, true};
  const auto before = k::cuda::cudnn_attention_plan_stats();
  check_case(c, DType::bf16);
  const auto first = k::cuda::cudnn_attention_plan_stats();
  check_case(c, DType::bf16);
  const auto second = k::cuda::cudnn_attention_plan_stats();
  EXPECT_EQ(first.built - before.built, 2);  // forward and backward
  EXPECT_EQ(second.built, first.built);
  EXPECT_EQ(second.declined, first.declined);
  std::cout << "cuDNN attention plans for bf16 B*H=4 T=512 D=64 causal: forward + backward built in "
            << (first.build_seconds - before.build_seconds) << " s\n";
}

// A configuration first met inside a CUDA-graph capture builds no plan there (building compiles
// kernels and may synchronize, which a capture cannot hold) and remembers no decline: the
// captured forward runs on our kernels, the first eager call builds the plan and runs in cuDNN,
// and both outputs match the f64 reference.
TEST_F(AttentionParity, CudnnBuildsNoPlanDuringCapture) {
  ::unsetenv("MG_ATTENTION_KERNEL");
  const Case c{2, 320, 320, 64, true};  // a configuration no other test builds
  Tensor q = host({c.BH, c.L, c.D}, DType::bf16, g), kk = host({c.BH, c.S, c.D}, DType::bf16, g),
         v = host({c.BH, c.S, c.D}, DType::bf16, g);
  const Tensor dq = to_cuda(q), dk = to_cuda(kk), dv = to_cuda(v);
  const auto stats0 = k::cuda::cudnn_attention_plan_stats();
  const int64_t runs0 = k::cuda::cudnn_attention_runs();
  Tensor captured_out;
  cuda::Graph graph;
  {
    const cuda::Stream side = cuda::Stream::create();
    cuda::StreamGuard guard(side);
    graph.capture_begin();
    captured_out = std::get<0>(k::flash_attention_forward(dq, dk, dv, c.causal));
    graph.capture_end();
    graph.replay();
    side.synchronize();
  }
  const auto stats1 = k::cuda::cudnn_attention_plan_stats();
  EXPECT_EQ(stats1.built, stats0.built);
  EXPECT_EQ(stats1.declined, stats0.declined);
  EXPECT_EQ(k::cuda::cudnn_attention_runs(), runs0);
  const Tensor eager_out = std::get<0>(k::flash_attention_forward(dq, dk, dv, c.causal));
  EXPECT_EQ(k::cuda::cudnn_attention_plan_stats().built - stats0.built, 1);
  EXPECT_EQ(k::cuda::cudnn_attention_runs() - runs0, 1) << k::cuda::cudnn_attention_last_decline();
  const Tensor ref = sdpa_composed(raw::to_dtype(q, DType::f64), raw::to_dtype(kk, DType::f64),
                                   raw::to_dtype(v, DType::f64), c.causal);
  expect_close(ref, captured_out, tol_of(DType::bf16), "captured out (our kernels)");
  expect_close(ref, eager_out, tol_of(DType::bf16), "eager out (cuDNN)");
}

TEST_F(AttentionParity, Tf32TensorCoreMatchesReference) {
  // f32 under set_allow_tf32(true) takes the tensor-core kernels in TF32: every tensor-core
  // shape, against the f64 reference within TF32's bounds (tol_of).
  ScopedTf32 tf32(true);
  ASSERT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 64)), "tc");
  ASSERT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 128)), "tc");
  for (const Case& c : tensor_core_cases()) check_case(c, DType::f32);
  check_case({70000, 2, 3, 64, true}, DType::f32);  // > 65535 heads: chunked grid
  // Other head dims stay on the SIMT kernels, exact to f32 rounding.
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 32)), "simt");
  std::cout << "TF32 flash attention, worst error relative to |ref| + rms (u = 2^-11): out " << worst_out / kTf32U
            << "u, logsumexp " << worst_lse / kTf32U << "u, gradients " << worst_grad / kTf32U << "u\n";
}

TEST_F(AttentionParity, F32TensorCoreAsTf32PairsMatchesReference) {
  // f32 without TF32 takes the tensor-core kernels with every operand split into a TF32 pair
  // (three products a_lo b_hi + a_hi b_lo + a_hi b_hi): every shape of the TF32 test, against the
  // f64 reference within the SIMT kernels' f32 bound (tol_of: 1e-4), and beside the SIMT kernels
  // on the same inputs. Each product carries about 2^-21 relative error (the dropped a_lo b_lo
  // and the pairs' rounding), near f32's 2^-24; the worst error is printed in units of 2^-21.
  ScopedTf32 exact(false);
  ASSERT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 64)), "tc");
  ASSERT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 128)), "tc");
  std::vector<Case> cases = tensor_core_cases();
  cases.push_back({70000, 2, 3, 64, true});  // > 65535 heads: chunked grid
  for (const Case& c : cases) check_case(c, DType::f32);
  const double pairs_out = worst_out, pairs_lse = worst_lse, pairs_grad = worst_grad;
  worst_out = worst_lse = worst_grad = 0;
  {
    ScopedKernel simt("simt");
    for (const Case& c : cases)
      if (c.BH < 1000) check_case(c, DType::f32);
  }
  constexpr double kPairU = 1.0 / (1 << 21);
  std::cout << "f32 flash attention as TF32 pairs, worst error relative to |ref| + rms (u = 2^-21): out "
            << pairs_out / kPairU << "u, logsumexp " << pairs_lse / kPairU << "u, gradients " << pairs_grad / kPairU
            << "u; SIMT f32 on the same cases: out " << worst_out / kPairU << "u, logsumexp " << worst_lse / kPairU
            << "u, gradients " << worst_grad / kPairU << "u\n";
}

TEST_F(AttentionParity, TensorCoreTwoPassBackwardMatchesReference) {
  // The other tests run the default one-pass backward (dq by atomics); set_deterministic(true)
  // takes the two-pass one (dq by its own pass): the same shapes and bounds, every element type.
  ScopedDeterministic det(true);
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    ASSERT_FALSE(k::flash_backward_one_pass());
    for (const Case& c : tensor_core_cases()) check_case(c, dt);
  }
  ScopedTf32 tf32(true);
  for (const Case& c : tensor_core_cases()) check_case(c, DType::f32);
}

TEST_F(AttentionParity, TensorCoreBackwardIsDeterministicWhenAsked) {
  // Under set_deterministic(true) dq is computed by its own pass (no atomics), so repeated runs
  // agree to the bit.
  ScopedDeterministic det(true);
  ScopedTf32 tf32(true);  // f32 takes the tensor cores too
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Tensor q = to_cuda(host({4, 300, 64}, dt, g)), kk = to_cuda(host({4, 300, 64}, dt, g));
    Tensor v = to_cuda(host({4, 300, 64}, dt, g)), dout = to_cuda(host({4, 300, 64}, dt, g));
    ASSERT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(dt, 64)), "tc");
    auto [out, lse] = k::flash_attention_forward(q, kk, v, true);
    auto first = k::flash_attention_backward(dout, q, kk, v, out, lse, true);
    for (int rep = 0; rep < 3; ++rep) {
      auto again = k::flash_attention_backward(dout, q, kk, v, out, lse, true);
      auto bytes = [](const Tensor& t) {
        return raw::to_dtype(raw::to_device(t, Device::cpu()), DType::f32).to_vector<float>();
      };
      EXPECT_EQ(bytes(std::get<0>(first)), bytes(std::get<0>(again))) << dstr(dt) << " dq";
      EXPECT_EQ(bytes(std::get<1>(first)), bytes(std::get<1>(again))) << dstr(dt) << " dk";
      EXPECT_EQ(bytes(std::get<2>(first)), bytes(std::get<2>(again))) << dstr(dt) << " dv";
    }
  }
}

// ---------------------------------------------------------------- autograd

// scaled_dot_product_attention (flash, dtype dt) vs sdpa_composed on CUDA in f32 on the same
// (rounded) values: [B, T, H, D] leaves transposed to [B, H, T, D] by the differentiable
// transpose. The reference runs in f32 because in f16/bf16 it rounds its scores and
// probabilities, and would be the less accurate of the two.
void expect_sdpa_matches_reference(DType dt, bool causal, Generator& g) {
  const int64_t B = 2, T = 77, H = 3, D = 64;
  const std::string what = dstr(dt) + (causal ? " causal" : "");
  SCOPED_TRACE(what);
  std::vector<Tensor> host_in = {host({B, T, H, D}, dt, g), host({B, T, H, D}, dt, g), host({B, T, H, D}, dt, g)};
  Tensor dout = host({B, H, T, D}, dt, g);
  auto run = [&](bool flash, std::vector<Tensor>* leaves) {
    const DType run_dt = flash ? dt : DType::f32;
    for (const Tensor& t : host_in) leaves->push_back(to_cuda(raw::to_dtype(t, run_dt)).requires_grad_(true));
    std::vector<Tensor> x;
    for (const Tensor& t : *leaves) x.push_back(transpose(t, 1, 2));
    Tensor out =
        flash ? scaled_dot_product_attention(x[0], x[1], x[2], causal) : sdpa_composed(x[0], x[1], x[2], causal);
    out.backward(to_cuda(raw::to_dtype(dout, run_dt)));
    return out;
  };
  std::vector<Tensor> a, b;
  Tensor out_flash = run(true, &a), out_ref = run(false, &b);
  ASSERT_TRUE(autograd::grad_fn(out_flash) != nullptr);
  EXPECT_EQ(autograd::grad_fn(out_flash)->name(), "scaled_dot_product_attention")
      << "the CUDA call took the reference path";
  Tensor ref_out = raw::to_dtype(raw::to_device(out_ref.detach(), Device::cpu()), DType::f64);
  expect_close(ref_out, out_flash.detach(), tol_of(dt), what + " out");
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a[i].grad().defined() && b[i].grad().defined());
    EXPECT_EQ(a[i].grad().dtype(), dt);
    expect_close(raw::to_dtype(raw::to_device(b[i].grad(), Device::cpu()), DType::f64), a[i].grad(), grad_tol_of(dt),
                 what + " grad " + std::to_string(i));
  }
}

TEST_F(AttentionParity, AutogradMatchesReference) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (bool causal : {false, true}) expect_sdpa_matches_reference(dt, causal, g);
}

TEST_F(AttentionParity, ReferenceWhenAskedOrUnsupported) {
  Tensor q = to_cuda(host({2, 9, 16}, DType::f32, g)).requires_grad_(true);
  auto node_name = [](const Tensor& t) {
    const auto& fn = autograd::grad_fn(t);
    return fn ? fn->name() : std::string("none");
  };
  EXPECT_EQ(node_name(scaled_dot_product_attention(q, q, q)), "scaled_dot_product_attention");
  ::setenv("MG_ATTENTION_KERNEL", "composed", 1);
  const std::string forced = node_name(scaled_dot_product_attention(q, q, q));
  ::unsetenv("MG_ATTENTION_KERNEL");
  EXPECT_NE(forced, "scaled_dot_product_attention");
  // Dropout, f64 and a head dim above 128 take the reference.
  EXPECT_NE(node_name(scaled_dot_product_attention(q, q, q, false, 0.1)), "scaled_dot_product_attention");
  Tensor q64 = to_cuda(host({2, 9, 16}, DType::f64, g)).requires_grad_(true);
  EXPECT_FALSE(k::flash_attention_supported(q64, q64, q64));
  EXPECT_NE(node_name(scaled_dot_product_attention(q64, q64, q64)), "scaled_dot_product_attention");
  Tensor wide = to_cuda(host({1, 4, 136}, DType::f32, g));
  EXPECT_FALSE(k::flash_attention_supported(wide, wide, wide));
  EXPECT_EQ(scaled_dot_product_attention(wide, wide, wide).sizes(), (Shape{1, 4, 136}));
}

// ---------------------------------------------------------------- packed qkv

// The unpacked path attention_packed_qkv replaces: narrow + split heads (views), SDPA (flash),
// merge heads (a copy).
Tensor unpacked_attention(const Tensor& qkv, int64_t H, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  auto split = [&](int64_t i) { return qkv.narrow(2, i * C, C).reshape({B, T, H, C / H}).transpose(1, 2); };
  return scaled_dot_product_attention(split(0), split(1), split(2), causal).transpose(1, 2).reshape({B, T, C});
}

// attention_packed_qkv vs the unpacked flash path (same kernels, so only the layouts differ)
// and vs the f64 composed reference on the CPU, output and qkv gradient. base_pad > 0 puts qkv
// at an element offset inside a wider tensor, so the tensor-core kernels can't read it in place
// (rows not 16-byte aligned) and must take the contiguous-copy fallback.
void expect_packed_matches(DType dt, bool causal, int64_t B, int64_t T, int64_t H, int64_t D, int64_t base_pad,
                           Generator& g) {
  const int64_t C = H * D;
  std::ostringstream name;
  name << dstr(dt) << " B=" << B << " T=" << T << " H=" << H << " D=" << D << (causal ? " causal" : "")
       << (base_pad ? " misaligned" : "");
  const std::string what = name.str();
  SCOPED_TRACE(what);
  Tensor wide = host({B, T, 3 * C + base_pad}, dt, g), dy = host({B, T, C}, dt, g);
  auto leaf = [&] { return to_cuda(wide).requires_grad_(true); };
  auto packed_of = [&](const Tensor& w) { return base_pad ? w.narrow(2, base_pad, 3 * C) : w; };
  Tensor wa = leaf(), wb = leaf();
  Tensor ya = attention_packed_qkv(packed_of(wa), H, causal);
  ASSERT_TRUE(autograd::grad_fn(ya) != nullptr);
  EXPECT_EQ(autograd::grad_fn(ya)->name(), "attention_packed_qkv") << "the CUDA call took the composed path";
  ASSERT_EQ(ya.sizes(), (Shape{B, T, C}));
  EXPECT_EQ(ya.dtype(), dt);
  Tensor yb = unpacked_attention(packed_of(wb), H, causal);
  ya.backward(to_cuda(dy));
  yb.backward(to_cuda(dy));
  // Same kernels on the same values: the two paths agree far inside the f64 tolerance.
  const double same = dt == DType::f32 ? 1e-5 : 1e-2;
  expect_close(raw::to_dtype(raw::to_device(yb.detach(), Device::cpu()), DType::f64), ya.detach(), same,
               what + " out vs unpacked");
  expect_close(raw::to_dtype(raw::to_device(wb.grad(), Device::cpu()), DType::f64), wa.grad(), same,
               what + " grad vs unpacked");

  Tensor w64 = raw::to_dtype(wide, DType::f64).requires_grad_(true);
  Tensor qkv64 = base_pad ? w64.narrow(2, base_pad, 3 * C) : w64;
  auto split = [&](int64_t i) { return qkv64.narrow(2, i * C, C).reshape({B, T, H, D}).transpose(1, 2); };
  Tensor ref = sdpa_composed(split(0), split(1), split(2), causal).transpose(1, 2).reshape({B, T, C});
  ref.backward(raw::to_dtype(dy, DType::f64));
  expect_close(ref.detach(), ya.detach(), tol_of(dt), what + " out vs f64");
  expect_close(w64.grad(), wa.grad(), grad_tol_of(dt), what + " grad vs f64");
}

TEST_F(AttentionParity, PackedQkvMatchesUnpackedAndReference) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (bool causal : {false, true}) {
      expect_packed_matches(dt, causal, 2, 77, 3, 64, 0, g);    // GPT-like: head dim 64
      expect_packed_matches(dt, causal, 1, 130, 2, 128, 0, g);  // head dim 128, several tiles
      expect_packed_matches(dt, causal, 2, 33, 4, 16, 0, g);    // SIMT-only head dim
      expect_packed_matches(dt, causal, 2, 50, 3, 64, 1, g);    // misaligned: contiguous fallback
    }
}

TEST_F(AttentionParity, PackedQkvBothKernels) {
  for (const char* kernel : {"cudnn", "tc", "simt"}) {
    ScopedKernel use(kernel);
    SCOPED_TRACE(kernel);
    for (DType dt : {DType::f16, DType::bf16})
      for (bool causal : {false, true}) {
        expect_packed_matches(dt, causal, 2, 100, 2, 64, 0, g);
        // T = 128: cuDNN reads q, k, v straight out of the packed [B, T, 3C] tensor.
        const int64_t before = k::cuda::cudnn_attention_runs();
        expect_packed_matches(dt, causal, 2, 128, 2, 64, 0, g);
        if (std::string(kernel) == "cudnn")
          EXPECT_GE(k::cuda::cudnn_attention_runs() - before, 4) << k::cuda::cudnn_attention_last_decline();
      }
  }
  ScopedTf32 tf32(true);  // f32 on the tensor cores, packed and misaligned
  for (bool causal : {false, true})
    for (int64_t pad : {0, 1}) expect_packed_matches(DType::f32, causal, 2, 100, 2, 64, pad, g);
}

TEST_F(AttentionParity, PackedQkvAllocatesNoHeadCopies) {
  // GPT-2 124M attention shape in bf16. Forward + backward above the live qkv and dy may hold
  // only y, the logsumexp, the [B, T, 3C] gradient and the backward's delta (plus allocator
  // rounding): a single head-split or merge copy would add a whole [B, T, C] (12 MiB) more.
  const int64_t B = 8, T = 1024, H = 12, D = 64, C = H * D;
  const Device dev = Device::cuda(0);
  Tensor qkv = randn({B, T, 3 * C}, {DType::bf16, dev}, &g).requires_grad_(true);
  Tensor dy = randn({B, T, C}, {DType::bf16, dev}, &g);
  auto peak_of = [&](bool packed) {
    qkv.set_grad(Tensor());
    mg::cuda::synchronize(0);
    const int64_t base = memory_allocated(dev);
    reset_peak_memory_stats(dev);
    {
      Tensor y = packed ? attention_packed_qkv(qkv, H, true) : unpacked_attention(qkv, H, true);
      y.backward(dy);
    }
    mg::cuda::synchronize(0);
    return max_memory_allocated(dev) - base;
  };
  const int64_t packed = peak_of(true), unpacked = peak_of(false);
  // The one-pass backward also holds dq's f32 sums ([B, H, T, D] f32) while it runs.
  const int64_t y = B * T * C * 2, grad = 3 * y, lse = B * H * T * 4, one_copy = y;
  const int64_t dq_acc = k::flash_backward_one_pass() ? B * T * C * 4 : 0;
  std::cout << "attention forward+backward peak above inputs, B=8 T=1024 H=12 D=64 bf16 causal: packed "
            << format_bytes(packed) << ", unpacked " << format_bytes(unpacked)
            << " (needed: y + grad + 2 lse + dq sums = " << format_bytes(y + grad + 2 * lse + dq_acc) << ")\n";
  EXPECT_LT(packed, y + grad + 2 * lse + dq_acc + one_copy);
  EXPECT_LT(packed, unpacked);
}

// ---------------------------------------------------------------- memory

TEST_F(AttentionParity, FlashNeverAllocatesTxT) {
  const int64_t B = 8, H = 12, T = 1024, D = 64;
  const Device dev = Device::cuda(0);
  Tensor q = randn({B, H, T, D}, {DType::f32, dev}, &g).requires_grad_(true);
  Tensor kk = randn({B, H, T, D}, {DType::f32, dev}, &g).requires_grad_(true);
  Tensor v = randn({B, H, T, D}, {DType::f32, dev}, &g).requires_grad_(true);
  Tensor dout = randn({B, H, T, D}, {DType::f32, dev}, &g);
  // Peak bytes above what is live before forward + backward (the inputs), grads included.
  auto peak_of = [&](bool flash) {
    for (const Tensor& t : {q, kk, v}) t.set_grad(Tensor());
    mg::cuda::synchronize(0);
    const int64_t base = memory_allocated(dev);
    reset_peak_memory_stats(dev);
    {
      Tensor out = flash ? scaled_dot_product_attention(q, kk, v, true) : sdpa_composed(q, kk, v, true);
      out.backward(dout);
    }
    mg::cuda::synchronize(0);
    return max_memory_allocated(dev) - base;
  };
  const int64_t flash = peak_of(true), reference = peak_of(false), txt = B * H * T * T * 4;
  std::cout << "sdpa forward+backward peak above inputs, B=8 H=12 T=1024 D=64 f32, causal: flash "
            << format_bytes(flash) << ", reference " << format_bytes(reference)
            << " (one T x T f32 buffer: " << format_bytes(txt) << ")\n";
  EXPECT_LE(flash + txt, reference);
}

// ---------------------------------------------------------------- kernel choice (no GPU needed)

TEST(AttentionKernelChoice, TensorCoresForHalfTypesAtHeadDims64And128) {
  ::unsetenv("MG_ATTENTION_KERNEL");
  // Half types: cuDNN's fused attention at head dims that are multiples of 8.
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f16, 64)), "cudnn");
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::bf16, 128)), "cudnn");
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f16, 32)), "cudnn");
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::bf16, 80)), "cudnn");
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::bf16, 36)), "simt");  // not a multiple of 8
  // Which lengths cuDNN is asked for (the rest fall back): multiples of 64, half types, D <= 128.
  EXPECT_TRUE(k::cuda::cudnn_attention_eligible(DType::bf16, 1024, 1024, 64));
  EXPECT_TRUE(k::cuda::cudnn_attention_eligible(DType::f16, 128, 256, 128));
  EXPECT_FALSE(k::cuda::cudnn_attention_eligible(DType::bf16, 1000, 1024, 64));  // a sampling step's length
  EXPECT_FALSE(k::cuda::cudnn_attention_eligible(DType::bf16, 1024, 1, 64));
  EXPECT_FALSE(k::cuda::cudnn_attention_eligible(DType::f32, 1024, 1024, 64));
  EXPECT_FALSE(k::cuda::cudnn_attention_eligible(DType::bf16, 1024, 1024, 136));
  {
    ScopedDeterministic det(true);  // cuDNN's backward sums dq by atomics: our two-pass kernels instead
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::bf16, 64)), "tc");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f16, 32)), "simt");
  }
  ScopedTf32 exact(false);
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 64)), "tc");  // as TF32 pairs
  EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 32)), "simt");
  {
    ScopedKernel simt("simt");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f16, 64)), "simt");
  }
  {
    ScopedKernel cudnn("cudnn");  // half types only: f32 keeps the tensor-core kernels
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::bf16, 64)), "cudnn");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 64)), "tc");
  }
  {
    ScopedKernel tc("tc");  // asks for tensor cores: at head dims 64 and 128 only
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::bf16, 64)), "tc");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::bf16, 32)), "simt");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 64)), "tc");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 80)), "simt");
  }
  {
    ScopedTf32 tf32(true);  // f32 at head dims 64 and 128 in TF32; other dims stay SIMT
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 64)), "tc");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 128)), "tc");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 80)), "simt");
    ScopedKernel simt("simt");
    EXPECT_STREQ(k::attention_kernel_name(k::flash_attention_kernel(DType::f32, 64)), "simt");
  }
  // The backward: one pass unless deterministic kernels are asked for, or MG_ATTENTION_BWD says.
  EXPECT_TRUE(k::flash_backward_one_pass());
  {
    ScopedDeterministic det(true);
    EXPECT_FALSE(k::flash_backward_one_pass());
    ::setenv("MG_ATTENTION_BWD", "onepass", 1);  // determinism wins over the A/B switch
    EXPECT_FALSE(k::flash_backward_one_pass());
  }
  EXPECT_TRUE(k::flash_backward_one_pass());
  ::setenv("MG_ATTENTION_BWD", "twopass", 1);
  EXPECT_FALSE(k::flash_backward_one_pass());
  ::setenv("MG_ATTENTION_BWD", "1", 1);
  try {
    k::flash_backward_one_pass();
    ADD_FAILURE() << "MG_ATTENTION_BWD=1 was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("MG_ATTENTION_BWD must be auto, onepass or twopass, got '1'"),
              std::string::npos)
        << e.what();
  }
  ::unsetenv("MG_ATTENTION_BWD");
  ScopedKernel bad("fast");
  try {
    k::attention_kernel_name(k::flash_attention_kernel(DType::f16, 64));
    ADD_FAILURE() << "MG_ATTENTION_KERNEL=fast was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("MG_ATTENTION_KERNEL must be auto, composed, simt, tc or cudnn, got 'fast'"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------- errors (no GPU needed)

TEST(AttentionErrors, CpuAndBadShapesRaise) {
  Tensor q = randn({2, 5, 8});
  EXPECT_FALSE(k::flash_attention_supported(q, q, q));
  EXPECT_THROW(k::flash_attention_forward(q, q, q, false), DeviceError);
  try {
    k::flash_attention_forward(q, q, q, false);
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("flash_attention_forward: runs on CUDA only"), std::string::npos) << e.what();
  }
  // The CPU path of the differentiable op is the reference, unchanged.
  EXPECT_EQ(scaled_dot_product_attention(q, q, q).sizes(), (Shape{2, 5, 8}));
}

// The CUDA half of the errors: shown as SKIPPED (not PASSED) where no GPU is visible.
TEST(AttentionErrors, CudaBadShapesDtypesAndDevicesRaise) {
  if (!mg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor q = randn({2, 5, 8});
  Tensor c = to_cuda(q);
  EXPECT_THROW(k::flash_attention_forward(c, to_cuda(randn({2, 5, 4})), c, false), ShapeError);
  EXPECT_THROW(k::flash_attention_forward(c, c, q, false), DeviceError);
  EXPECT_THROW(k::flash_attention_forward(c, c, c, false, std::numeric_limits<double>::infinity()), ValueError);
  auto [out, lse] = k::flash_attention_forward(c, c, c, false);
  EXPECT_THROW(k::flash_attention_backward(out, c, c, c, out, raw::to_dtype(lse, DType::f16), false), DTypeError);
  EXPECT_THROW(k::flash_attention_backward(to_cuda(randn({2, 4, 8})), c, c, c, out, lse, false), ShapeError);
  // Caller-provided outputs: wrong shape, dtype or device, each named.
  try {
    k::flash_attention_forward_out(c, c, c, to_cuda(randn({2, 5, 4})), false);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("flash_attention_forward: out must have shape [2, 5, 8]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(k::flash_attention_forward_out(c, c, c, to_cuda(raw::to_dtype(randn({2, 5, 8}), DType::f16)), false),
               DTypeError);
  EXPECT_THROW(k::flash_attention_forward_out(c, c, c, randn({2, 5, 8}), false), DeviceError);
  Tensor g = to_cuda(randn({2, 5, 8}));
  Tensor short_kv = to_cuda(randn({2, 4, 8}));
  EXPECT_THROW(k::flash_attention_backward_out(g, c, c, c, out, lse, false, std::nullopt, g, g, short_kv), ShapeError);
}

}  // namespace
}  // namespace mg
