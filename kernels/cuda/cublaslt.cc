// cuBLASLt matmuls with fused epilogues for the linear layer: the bias added inside the GEMM
// (forward) and, under MG_BIAS_GRAD=epilogue, the bias gradient by the BGRADB epilogue
// (backward; by default kernels/cuda/linalg.cc takes it from the column reduction, which
// measured faster); for the transformer MLP, the tanh GELU
// applied in the c_fc GEMM (its argument stored as the epilogue's auxiliary output) and its
// derivative applied in the GEMM that computes the gradient reaching it. A plan (descriptors,
// layouts and the heuristic's algorithm) is made once per shape, dtype, epilogue and operand
// alignment and cached per thread; the workspace is the cuBLAS handle's, from memgrad's allocator.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/cuda/check.h"
#include "core/device_runtime.h"
#include "core/env.h"
#include "kernels/backend.h"
#include "kernels/cuda/cublas.h"
#include "kernels/cuda/thread_handles.h"

namespace mg::kernels::cuda {
namespace {

struct LtEntry : HandleEntry<cublasLtHandle_t> {};

cublasLtHandle_t lt_handle(int device) {
  const auto create = [](cublasLtHandle_t* h) { MG_CUBLAS_CHECK(cublasLtCreate(h)); };
  const auto setup = [](cublasLtHandle_t) {};
  const auto bind = [](LtEntry&, void*) {};  // the stream is an argument of each matmul
  return thread_handle<LtEntry>(device, create, setup, bind).handle;
}

// MG_CUBLASLT=0 sends every linear through cublasGemmEx + separate bias kernels (A/B runs).
bool lt_enabled() {
  static const bool on = env::choice("MG_CUBLASLT", {"1", "0"}) == "1";
  return on;
}

// The largest power of two (<= 256) that divides the address: what the heuristic may assume.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// One matmul's shape: column-major D (m x n) = op(A) @ op(B), A and B with leading dims.
struct Key {
  int dtype, out_dtype, compute, epilogue;  // out_dtype: C and D (and the bias), wider than A and B or the same
  int dtype_b;                              // B's type: dtype, except for FP8 (e4m3 and e5m2 may mix)
  bool fast_accum;                          // FP8: accumulate without the periodic f32 promotion
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  int align_a, align_b, align_d, align_bias;
  int64_t ld_aux;  // 0: no auxiliary matrix
  auto tie() const {
    return std::tie(dtype, out_dtype, compute, epilogue, dtype_b, fast_accum, ta, tb, m, n, k, lda, ldb, ldd, align_a,
                    align_b, align_d, align_bias, ld_aux);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // the heuristic found an algorithm
  // The heuristic's other candidates, best first, until autotuning has timed them (emptied then).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

bool lt_types(DType t, cudaDataType_t* data, cublasComputeType_t* compute) {
  switch (t) {
    case DType::f32:
      *data = CUDA_R_32F;
      *compute = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      return true;
    case DType::f16:
      *data = CUDA_R_16F;
      *compute = CUBLAS_COMPUTE_32F;
      return true;
    case DType::bf16:
      *data = CUDA_R_16BF;
      *compute = CUBLAS_COMPUTE_32F;
      return true;
    default:
      return false;
  }
}

template <class T>
void set_attr(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& v) {
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof(v)));
}

// How many of the heuristic's candidates autotuning times.
constexpr int kTuneCandidates = 8;

// The plan for `key`, made on first use (null when cuBLASLt has no algorithm for it).
Plan* plan_for(const Key& key, int device, size_t workspace) {
  thread_local std::map<Key, std::unique_ptr<Plan>> plans;
  auto it = plans.find(key);
  if (it != plans.end()) return it->second->usable ? it->second.get() : nullptr;
  auto p = std::make_unique<Plan>();
  const auto data = static_cast<cudaDataType_t>(key.dtype);
  MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, static_cast<cublasComputeType_t>(key.compute), CUDA_R_32F));
  set_attr(p->op, CUBLASLT_MATMUL_DESC_TRANSA, key.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(p->op, CUBLASLT_MATMUL_DESC_TRANSB, key.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<cublasLtEpilogue_t>(key.epilogue));
  if (key.ld_aux) set_attr(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.ld_aux);
  const bool fp8 = data == CUDA_R_8F_E4M3 || data == CUDA_R_8F_E5M2;
  if (fp8) {
    // FP8: the bias in D's type; the fast accumulation only where asked (the forward's e4m3 x
    // e4m3 GEMMs; the gradients' keep the f32 promotion).
    if (static_cast<cublasLtEpilogue_t>(key.epilogue) == CUBLASLT_EPILOGUE_BIAS)
      set_attr(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, key.out_dtype);
    set_attr(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(key.fast_accum ? 1 : 0));
  } else if (key.out_dtype != key.dtype) {
    // A wider D: the bias gradient in D's type too (cuBLASLt's default, said here).
    set_attr(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, key.out_dtype);
  }
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, data, key.ta ? key.k : key.m, key.ta ? key.m : key.k, key.lda));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, static_cast<cudaDataType_t>(key.dtype_b), key.tb ? key.n : key.k,
                                             key.tb ? key.k : key.n, key.ldb));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, static_cast<cudaDataType_t>(key.out_dtype), key.m, key.n, key.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
    MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key.align_a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key.align_b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key.align_d));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key.align_d));
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
  int found = 0;
  const bool tune = gemm_autotune();
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(device), p->op, p->a, p->b, p->d, p->d, pref,
                                                           tune ? kTuneCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p->usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p->usable) p->algo = results[0].algo;
  for (int i = 1; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(results[i].algo);
  Plan* out = p->usable ? p.get() : nullptr;
  plans.emplace(key, std::move(p));
  return out;
}

// Times the plan's algorithm and its candidates on this call's operands (each run writes only
// D, the bias gradient and the auxiliary output, which the caller's run then overwrites: beta
// is 0) and keeps the fastest: the median of 3 timed runs after one warm-up each. Not while the
// stream is being captured (the candidates stay for a later eager call).
template <class Run>
void tune(Plan& p, cudaStream_t stream, Run&& run) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) return;
  std::vector<cublasLtMatmulAlgo_t> algos{p.algo};
  algos.insert(algos.end(), p.candidates.begin(), p.candidates.end());
  p.candidates.clear();
  cudaEvent_t ev[2];  // around each timed run
  for (auto& e : ev) MG_CUDA_CHECK(cudaEventCreate(&e));
  float best = -1;
  for (const auto& algo : algos) {
    if (run(algo) != CUBLAS_STATUS_SUCCESS) continue;  // a candidate the operands' alignment refuses
    float ms[3];
    for (int r = 0; r < 3; ++r) {
      MG_CUDA_CHECK(cudaEventRecord(ev[0], stream));
      MG_CUBLAS_CHECK(run(algo));
      MG_CUDA_CHECK(cudaEventRecord(ev[1], stream));
      MG_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      MG_CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[0], ev[1]));
    }
    std::sort(ms, ms + 3);
    if (best < 0 || ms[1] < best) best = ms[1], p.algo = algo;
  }
  for (auto& e : ev) cudaEventDestroy(e);
}

// Column-major D = op(A) @ op(B) with `epilogue` reading or writing `bias`; false when
// cuBLASLt cannot take it (the caller falls back).
// `aux` (leading dim ld_aux, D's shape and dtype) is the GELU epilogues' auxiliary matrix.
// A and B are `dt`; D (and the bias) is `out`: `dt`, or f32 from f16/bf16 operands (the f32
// accumulator written without rounding it to the operands' type).
// FP8 operands: `fp8` gives A's and B's formats and their scales (device f32 [1], multiplied
// into the f32 result), and D is `out` (bf16, f16 or f32); `dt` is then unused.
struct LtFp8 {
  cudaDataType_t a_type, b_type;
  const void *a_scale, *b_scale;
  bool fast_accum;
};
bool lt_matmul(int device, DType dt, DType out, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A,
               int64_t lda, const void* B, int64_t ldb, void* D, int64_t ldd, cublasLtEpilogue_t epilogue, void* bias,
               void* aux = nullptr, int64_t ld_aux = 0, const LtFp8* fp8 = nullptr) {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t out_data;
  if (!lt_enabled()) return false;
  if (fp8) {
    if (!lt_types(out, &out_data, &compute)) return false;
    compute = CUBLAS_COMPUTE_32F;  // FP8 accumulates in f32 (no TF32 question)
    data = fp8->a_type;
  } else {
    if (!lt_types(dt, &data, &compute)) return false;
    out_data = data;
    if (out != dt) {
      if (out != DType::f32 || (dt != DType::f16 && dt != DType::bf16)) return false;
      out_data = CUDA_R_32F;
    }
  }
  // cuBLASLt wants the auxiliary matrix 16-byte aligned with a leading dim a multiple of 8.
  if (aux && (alignment(aux) < 16 || ld_aux % 8 != 0)) return false;
  size_t ws_bytes = 0;
  void* ws = cublas_workspace(device, &ws_bytes);
  const Key key{data,
                out_data,
                compute,
                epilogue,
                fp8 ? fp8->b_type : data,
                fp8 && fp8->fast_accum,
                ta,
                tb,
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                alignment(A),
                alignment(B),
                alignment(D),
                alignment(bias),
                aux ? ld_aux : 0};
  Plan* p = plan_for(key, device, ws_bytes);
  if (!p) return false;
  set_attr(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux) set_attr(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  if (fp8) {
    set_attr(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, fp8->a_scale);
    set_attr(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, fp8->b_scale);
  }
  const float one = 1.0f, zero = 0.0f;
  const auto stream = static_cast<cudaStream_t>(mg::cuda::Stream::current(device).handle());
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt_handle(device), p->op, &one, A, p->a, B, p->b, &zero, D, p->d, D, p->d, &algo, ws,
                          ws_bytes, stream);
  };
  if (!p->candidates.empty()) tune(*p, stream, run);
  MG_CUBLAS_CHECK(run(p->algo));
  return true;
}

bool plain_rows(const Tensor& t) { return t.dim() == 2 && t.is_contiguous(); }

}  // namespace

// Row-major out[rows, n] = x[rows, k] @ w[n, k]^T + bias[n] is column-major
// out^T (n x rows) = w (op T of its column-major k x n storage) @ x^T (k x rows): m = n, the
// bias runs along D's rows, which is the BIAS epilogue's broadcast.
bool lt_linear_bias(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  if (!plain_rows(x) || !plain_rows(w) || !plain_rows(out) || !bias.is_contiguous()) return false;
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  if (rows == 0 || n == 0 || k == 0) return false;
  return lt_matmul(out.device().index, out.dtype(), out.dtype(), true, false, n, rows, k, w.raw_data(), k, x.raw_data(),
                   k, out.raw_data(), n, CUBLASLT_EPILOGUE_BIAS, bias.raw_data());
}

// Row-major gw[n, k] = g[rows, n]^T @ x[rows, k] is column-major gw^T (k x n) = x^T (k x rows)
// @ g (op T of its column-major n x rows storage); gb[n], the sum of g over rows, is the sum
// of op(B) over the GEMM's k dimension: the BGRADB epilogue. Without gb, the plain GEMM (for an
// f32 gw from f16/bf16 operands, which cublasGemmEx's one-dtype path here does not take).
bool lt_weight_grads(const Tensor& g, const Tensor& x, const Tensor& gw, const Tensor& gb) {
  if (!plain_rows(g) || !plain_rows(x) || !plain_rows(gw)) return false;
  if (gb.defined() && (!gb.is_contiguous() || gb.dtype() != gw.dtype())) return false;
  const int64_t rows = g.size(0), n = g.size(1), k = x.size(1);
  if (rows == 0 || n == 0 || k == 0) return false;
  return lt_matmul(gw.device().index, x.dtype(), gw.dtype(), false, true, k, n, rows, x.raw_data(), k, g.raw_data(), n,
                   gw.raw_data(), k, gb.defined() ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT,
                   gb.defined() ? gb.raw_data() : nullptr);
}

// lt_linear_bias's layout; the auxiliary output pre^T has D's layout (ld n).
bool lt_linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, const Tensor& pre) {
  if (!plain_rows(x) || !plain_rows(w) || !plain_rows(out) || !plain_rows(pre)) return false;
  if (bias.defined() && !bias.is_contiguous()) return false;
  // The epilogue's tanh is good to about 1e-4 relative (an f32 op-table row saw 1e-4): below
  // f32's precision, within f16/bf16's rounding of the result.
  if (out.dtype() != DType::f16 && out.dtype() != DType::bf16) return false;
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  if (rows == 0 || n == 0 || k == 0) return false;
  return lt_matmul(out.device().index, out.dtype(), out.dtype(), true, false, n, rows, k, w.raw_data(), k, x.raw_data(),
                   k, out.raw_data(), n, bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
                   bias.defined() ? bias.raw_data() : nullptr, pre.raw_data(), n);
}

// Row-major g_pre[rows, n] = g[rows, k] @ w[k, n] is column-major g_pre^T (n x rows) = w^T
// (w's row-major storage read column-major, no transpose) @ g^T, with the DGELU epilogue reading
// pre^T (D's layout). The bias gradient is the caller's, inside its weight-gradient GEMM: on the
// H200 (cuBLASLt 13, bf16, GPT-2's MLP) DGELU_BGRAD ran as a generic kernel at 166 us a call, and
// DGELU alone took GPT-2's step from 21.43 to 20.65 ms against the plain GEMM + GELU backward
// kernel (bench/results/h200_run_2026-12-02.log).
bool lt_matmul_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre, const Tensor& g_pre) {
  if (!plain_rows(g) || !plain_rows(w) || !plain_rows(pre) || !plain_rows(g_pre)) return false;
  if (g_pre.dtype() != DType::f16 && g_pre.dtype() != DType::bf16) return false;  // see lt_linear_gelu
  const int64_t rows = g.size(0), k = g.size(1), n = w.size(1);
  if (rows == 0 || n == 0 || k == 0) return false;
  return lt_matmul(g_pre.device().index, g_pre.dtype(), g_pre.dtype(), false, false, n, rows, k, w.raw_data(), n,
                   g.raw_data(), k, g_pre.raw_data(), n, CUBLASLT_EPILOGUE_DGELU, nullptr, pre.raw_data(), n);
}

// Row-major out[M, N] = a[M, K] @ b[N, K]^T, both read along K: lt_linear_bias's layout with
// b as cuBLAS's A (transposed) and a as its B, the "TN" form Hopper's FP8 kernels require. The
// caller chooses the accumulation (kernels::fp8_gemm resolves Fp8Accum).
bool lt_fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb, const Tensor& b_inv,
                 const Tensor& bias, const Tensor& out, bool fast_accum) {
  if (!plain_rows(a) || !plain_rows(b) || !plain_rows(out)) return false;
  if (bias.defined() && (!bias.is_contiguous() || bias.dtype() != out.dtype())) return false;
  const int64_t rows = a.size(0), k = a.size(1), n = b.size(0);
  if (rows == 0 || n == 0 || k == 0) return false;
  const int device = out.device().index;
  int major = 0, minor = 0;  // FP8 tensor cores: sm_89 (Ada) and sm_90 (Hopper) on
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor < 89) return false;
  const cublasLtEpilogue_t ep = bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  const auto type = [](Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; };
  const LtFp8 f{type(fb), type(fa), b_inv.raw_data(), a_inv.raw_data(), fast_accum};
  return lt_matmul(device, DType::u8, out.dtype(), true, false, n, rows, k, b.raw_data(), k, a.raw_data(), k,
                   out.raw_data(), n, ep, bias.defined() ? bias.raw_data() : nullptr, nullptr, 0, &f);
}

}  // namespace mg::kernels::cuda
