// 2-D convolution on CUDA through cuDNN: forward, backward-data, backward-filter.
//
// Algorithm choice, once per (direction, shapes, arguments, dtype, layout, TF32 setting):
// cuDNN's heuristics (cudnnGet*Algorithm_v7) rank the algorithms, or with cudnn_benchmark()
// every algorithm is timed on the real buffers (cudnnFind*AlgorithmEx). Both lists are kept
// whole, best first, minus those that fail or need more workspace than
// cudnn_workspace_limit(); a call then takes the first candidate whose workspace memgrad's
// caching allocator can give (an OutOfMemoryError moves on to a candidate that needs less,
// as does a candidate the execution rejects), and remembers which one ran.
//
// Precision: f32 runs with CUDNN_FMA_MATH (no TF32, so results match the CPU to ~1e-5)
// unless kernels::set_allow_tf32(true); f16/bf16 use tensor cores with f32 accumulation;
// f64 runs in f64. Groups and dilation are cuDNN's own, except depthwise convolutions over
// channels-last operands, which run memgrad's NHWC kernels (depthwise_conv.cu) where those
// measured faster (run_depthwise).
//
// Layout: a call runs NCHW, or NHWC when its data input is channels-last, so cuDNN gets one
// layout throughout (its fast NHWC tensor-core kernels want all three in NHWC). A 1x1,
// stride-1, unpadded, ungrouped convolution over channels-last operands is a GEMM over
// [N*H*W rows, channels], and runs as one (CudaBackend::gemm: cuBLASLt with per-shape cached
// plans), the NCHW weight [O, C, 1, 1] being the [O, C] matrix already: no filter transpose,
// and less host work per call than cuDNN's own route to the same GEMM kernels. Most
// of ResNet-50's 53 convolutions (33) are of that kind.
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "core/device_runtime.h"
#include "core/env.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/depthwise_conv.h"
#include "kernels/backend.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

enum class Dir { Fwd = 0, BwdData = 1, BwdFilter = 2 };
const char* dir_name(Dir d) {
  return d == Dir::Fwd ? "conv2d" : d == Dir::BwdData ? "conv2d_backward_input" : "conv2d_backward_weight";
}

// ---------------------------------------------------------------- layouts

// Operands are NCHW-contiguous, or channels-last (core's is_channels_last: NHWC strides that
// are not also NCHW ones).
MemoryFormat format(bool nhwc) { return nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous; }

// t in the requested layout: itself when it already is, else a copy.
Tensor in_layout(const Tensor& t, bool nhwc) { return raw::contiguous(t, format(nhwc)); }

// An uninitialized tensor of t's shape/dtype/device in the given layout.
Tensor empty_in_layout(const Tensor& t, bool nhwc) { return empty(t.sizes(), {t.dtype(), t.device()}, format(nhwc)); }

bool matches_layout(const Tensor& t, bool nhwc) { return t.is_contiguous(format(nhwc)); }

int to_int(int64_t v, const char* op) {
  MG_CHECK(v >= 0 && v <= INT_MAX, ShapeError, op, ": size or stride ", v,
           " exceeds cuDNN's 32-bit limit; split the batch");
  return static_cast<int>(v);
}

// ---------------------------------------------------------------- descriptors (RAII)

// Strides are the layout's canonical ones: the operands are in that layout already (see
// in_layout), and a size-1 dim's own stride, which addresses nothing, could otherwise make
// cuDNN read an NHWC tensor as NCHW.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(const Tensor& t, cudnnDataType_t dt, bool nhwc, const char* op) {
    MG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    const int n = to_int(t.size(0), op), c = to_int(t.size(1), op), h = to_int(t.size(2), op),
              w = to_int(t.size(3), op);
    to_int(t.numel(), op);
    if (nhwc)
      MG_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(d, dt, n, c, h, w, h * w * c, 1, w * c, c));
    else
      MG_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(d, dt, n, c, h, w, c * h * w, h * w, w, 1));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(const Tensor& w, cudnnDataType_t dt, bool nhwc, const char* op) {
    MG_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    MG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d, dt, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                              to_int(w.size(0), op), to_int(w.size(1), op), to_int(w.size(2), op),
                                              to_int(w.size(3), op)));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc(const Conv2dArgs& a, cudnnDataType_t compute, const char* op) {
    MG_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    MG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        d, to_int(a.padding.h, op), to_int(a.padding.w, op), to_int(a.stride.h, op), to_int(a.stride.w, op),
        to_int(a.dilation.h, op), to_int(a.dilation.w, op), CUDNN_CROSS_CORRELATION, compute));
    MG_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, to_int(a.groups, op)));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// ---------------------------------------------------------------- one call's plan

// The three operands under cuDNN's names: x (image input, or grad_input for BwdData),
// w (filter, or grad_weight for BwdFilter), y (output, or grad_output for the backwards).
struct Plan {
  Dir dir;
  const char* op;
  cudnnHandle_t h;
  DType dt;
  bool f32_exact;  // f32 without TF32: CUDNN_FMA_MATH only
  TensorDesc& x;
  FilterDesc& w;
  TensorDesc& y;
  ConvDesc& conv;
  void *px, *pw, *py;
};

cudnnMathType_t default_math(const Plan& p) {
  if (p.dt == DType::f16 || p.dt == DType::bf16) return CUDNN_TENSOR_OP_MATH;
  if (p.dt == DType::f32) return p.f32_exact ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  return CUDNN_DEFAULT_MATH;
}

struct Candidate {
  int algo;
  cudnnMathType_t math;
  size_t ws;
};

struct Choice {
  std::vector<Candidate> cands;
  size_t preferred = 0;
};

// Per-direction calls, so the search and the run are written once.
int max_algos(const Plan& p) {
  int n = 0;
  switch (p.dir) {
    case Dir::Fwd:
      MG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(p.h, &n));
      break;
    case Dir::BwdData:
      MG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(p.h, &n));
      break;
    case Dir::BwdFilter:
      MG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(p.h, &n));
      break;
  }
  return n;
}

cudnnStatus_t workspace_size(const Plan& p, int algo, size_t* bytes) {
  switch (p.dir) {
    case Dir::Fwd:
      return cudnnGetConvolutionForwardWorkspaceSize(p.h, p.x.d, p.w.d, p.conv.d, p.y.d,
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    case Dir::BwdData:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(p.h, p.w.d, p.y.d, p.conv.d, p.x.d,
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
    case Dir::BwdFilter:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(p.h, p.x.d, p.y.d, p.conv.d, p.w.d,
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t execute(const Plan& p, int algo, void* ws, size_t ws_bytes) {
  const float f1 = 1.f, f0 = 0.f;
  const double d1 = 1.0, d0 = 0.0;
  const void* one = p.dt == DType::f64 ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1);
  const void* zero = p.dt == DType::f64 ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0);
  switch (p.dir) {
    case Dir::Fwd:
      return cudnnConvolutionForward(p.h, one, p.x.d, p.px, p.w.d, p.pw, p.conv.d,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, ws_bytes, zero, p.y.d, p.py);
    case Dir::BwdData:
      return cudnnConvolutionBackwardData(p.h, one, p.w.d, p.pw, p.y.d, p.py, p.conv.d,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, ws_bytes, zero, p.x.d,
                                          p.px);
    case Dir::BwdFilter:
      return cudnnConvolutionBackwardFilter(p.h, one, p.x.d, p.px, p.y.d, p.py, p.conv.d,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, ws_bytes, zero,
                                            p.w.d, p.pw);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// A perf entry of any direction, reduced to what the choice needs.
struct Perf {
  int algo;
  cudnnStatus_t status;
  cudnnMathType_t math;
};

template <class P>
std::vector<Perf> reduce_perfs(const std::vector<P>& v, int n) {
  std::vector<Perf> out;
  for (int i = 0; i < n; ++i) out.push_back({static_cast<int>(v[i].algo), v[i].status, v[i].mathType});
  return out;
}

// cuDNN's heuristic ranking (no device work).
std::vector<Perf> heuristic(const Plan& p) {
  const int n = max_algos(p);
  int got = 0;
  switch (p.dir) {
    case Dir::Fwd: {
      std::vector<cudnnConvolutionFwdAlgoPerf_t> v(n);
      MG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(p.h, p.x.d, p.w.d, p.conv.d, p.y.d, n, &got, v.data()));
      return reduce_perfs(v, got);
    }
    case Dir::BwdData: {
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> v(n);
      MG_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(p.h, p.w.d, p.y.d, p.conv.d, p.x.d, n, &got, v.data()));
      return reduce_perfs(v, got);
    }
    case Dir::BwdFilter: {
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> v(n);
      MG_CUDNN_CHECK(
          cudnnGetConvolutionBackwardFilterAlgorithm_v7(p.h, p.x.d, p.y.d, p.conv.d, p.w.d, n, &got, v.data()));
      return reduce_perfs(v, got);
    }
  }
  return {};
}

// Times every algorithm on the real buffers (it writes the output operand, which the call
// overwrites afterwards anyway), with a workspace of up to `limit` bytes from our allocator.
std::vector<Perf> benchmark(const Plan& p, Device dev, size_t limit) {
  Tensor ws;
  for (size_t b = limit; b >= (size_t{1} << 20) && !ws.defined(); b /= 2) {
    try {
      MemoryCategoryGuard cat(MemoryCategory::Other);
      ws = empty({static_cast<int64_t>(b)}, {DType::u8, dev});
    } catch (const OutOfMemoryError&) {
    }
  }
  void* pws = ws.defined() ? ws.raw_data() : nullptr;
  const size_t nws = ws.defined() ? ws.nbytes() : 0;
  const int n = max_algos(p);
  int got = 0;
  switch (p.dir) {
    case Dir::Fwd: {
      std::vector<cudnnConvolutionFwdAlgoPerf_t> v(n);
      MG_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(p.h, p.x.d, p.px, p.w.d, p.pw, p.conv.d, p.y.d, p.py, n,
                                                            &got, v.data(), pws, nws));
      return reduce_perfs(v, got);
    }
    case Dir::BwdData: {
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> v(n);
      MG_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(p.h, p.w.d, p.pw, p.y.d, p.py, p.conv.d, p.x.d, p.px,
                                                                 n, &got, v.data(), pws, nws));
      return reduce_perfs(v, got);
    }
    case Dir::BwdFilter: {
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> v(n);
      MG_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(p.h, p.x.d, p.px, p.y.d, p.py, p.conv.d, p.w.d, p.pw,
                                                                   n, &got, v.data(), pws, nws));
      return reduce_perfs(v, got);
    }
  }
  return {};
}

Choice choose(const Plan& p, Device dev) {
  const size_t limit = cudnn_workspace_limit(dev.index);
  const std::vector<Perf> perfs = cudnn_benchmark() ? benchmark(p, dev, limit) : heuristic(p);
  Choice c;
  for (const Perf& pf : perfs) {
    if (pf.status != CUDNN_STATUS_SUCCESS) continue;
    // f32 stays exact: whatever math the ranking reports, this call runs FMA-only math.
    const cudnnMathType_t math = p.f32_exact ? CUDNN_FMA_MATH : pf.math;
    if (cudnnSetConvolutionMathType(p.conv.d, math) != CUDNN_STATUS_SUCCESS) continue;
    size_t ws = 0;
    if (workspace_size(p, pf.algo, &ws) != CUDNN_STATUS_SUCCESS || ws > limit) continue;
    bool dup = false;
    for (const Candidate& k : c.cands) dup |= k.algo == pf.algo && k.math == math;
    if (!dup) c.cands.push_back({pf.algo, math, ws});
  }
  return c;
}

std::mutex g_cache_mu;
std::map<std::vector<int64_t>, Choice>& cache() {
  static auto* m = new std::map<std::vector<int64_t>, Choice>();  // outlives static destructors
  return *m;
}

std::vector<int64_t> cache_key(const Plan& p, Device dev, bool nhwc, const Tensor& x, const Tensor& w, const Tensor& y,
                               const Conv2dArgs& a) {
  std::vector<int64_t> k = {static_cast<int64_t>(p.dir),
                            dev.index,
                            static_cast<int64_t>(p.dt),
                            nhwc,
                            p.f32_exact,
                            cudnn_benchmark(),
                            a.stride.h,
                            a.stride.w,
                            a.padding.h,
                            a.padding.w,
                            a.dilation.h,
                            a.dilation.w,
                            a.groups};
  for (const Tensor* t : {&x, &w, &y}) k.insert(k.end(), t->sizes().begin(), t->sizes().end());
  return k;
}

// Runs one convolution direction. x, w, y are in the call's layout already; the output
// operand (chosen by dir) is written. In NHWC, returns false when no algorithm ran (the
// caller then runs NCHW); in NCHW that is an error.
bool run(Dir dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dArgs& a, bool nhwc) {
  const char* op = dir_name(dir);
  const Device dev = x.device();
  const DType dt = x.dtype();
  const cudnnDataType_t cdt = cudnn_data_type(dt, op);
  TensorDesc xd(x, cdt, nhwc, op), yd(y, cdt, nhwc, op);
  FilterDesc wd(w, cdt, nhwc, op);
  ConvDesc cd(a, dt == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT, op);
  Plan p{dir,
         op,
         cudnn_handle(dev.index),
         dt,
         dt == DType::f32 && !allow_tf32(),
         xd,
         wd,
         yd,
         cd,
         x.raw_data(),
         w.raw_data(),
         y.raw_data()};
  MG_CUDNN_CHECK(cudnnSetConvolutionMathType(cd.d, default_math(p)));

  const std::vector<int64_t> key = cache_key(p, dev, nhwc, x, w, y, a);
  Choice choice;
  bool cached = false;
  {
    std::lock_guard<std::mutex> g(g_cache_mu);
    auto it = cache().find(key);
    if (it != cache().end()) choice = it->second, cached = true;
  }
  if (!cached) {
    choice = choose(p, dev);
    std::lock_guard<std::mutex> g(g_cache_mu);
    cache()[key] = choice;
  }
  std::string tried;
  const size_t n = choice.cands.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (choice.preferred + i) % n;
    const Candidate& c = choice.cands[idx];
    Tensor ws;
    if (c.ws > 0) {
      try {
        MemoryCategoryGuard cat(MemoryCategory::Other);  // scratch, not the caller's activations
        ws = empty({static_cast<int64_t>(c.ws)}, {DType::u8, dev});
      } catch (const OutOfMemoryError&) {
        tried += " algo " + std::to_string(c.algo) + " (workspace " + std::to_string(c.ws) + " B: out of memory);";
        continue;
      }
    }
    MG_CUDNN_CHECK(cudnnSetConvolutionMathType(cd.d, c.math));
    const cudnnStatus_t st = execute(p, c.algo, ws.defined() ? ws.raw_data() : nullptr, c.ws);
    if (st == CUDNN_STATUS_SUCCESS) {
      if (idx != choice.preferred) {
        std::lock_guard<std::mutex> g(g_cache_mu);
        cache()[key].preferred = idx;
      }
      return true;
    }
    if (st != CUDNN_STATUS_NOT_SUPPORTED)
      MG_THROW(CudaError, op, ": cuDNN algorithm ", c.algo, " failed: ", cudnnGetErrorString(st), " (",
               cudnn_last_error(), ")");
    tried += " algo " + std::to_string(c.algo) + " (not supported);";
  }
  if (nhwc) return false;
  MG_THROW(CudaError, op, ": no cuDNN algorithm ran for input ", shape_str(x.sizes()), ", weight ",
           shape_str(w.sizes()), ", output ", shape_str(y.sizes()), " (", dt, nhwc ? ", NHWC" : ", NCHW", ", ", n,
           " candidates within the workspace limit of ", cudnn_workspace_limit(dev.index), " B;", tried, ")");
}

// The output operand in the call's layout: `out` itself, or a scratch tensor that is
// copied into `out` afterwards.
Tensor out_operand(const Tensor& out, bool nhwc) {
  return matches_layout(out, nhwc) ? out : empty_in_layout(out, nhwc);
}

// Runs `dir` in NHWC when `lead` (the data input) is channels-last, else (or when cuDNN
// has no NHWC algorithm for it) in NCHW. `out` is the operand written (x, w or y).
void run_layout(Dir dir, const Tensor& lead, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& out,
                const Conv2dArgs& a) {
  for (bool nhwc : {true, false}) {
    if (nhwc && !is_channels_last(lead)) continue;
    Tensor o = out_operand(out, nhwc);
    auto pick = [&](const Tensor& t) { return t.is_same(out) ? o : in_layout(t, nhwc); };
    if (!run(dir, pick(x), pick(w), pick(y), a, nhwc)) continue;
    if (!o.is_same(out)) raw::copy_(out, o);
    return;
  }
}

// The pointwise convolution as a GEMM (see the header); false when `dir`'s operands are not of
// that kind (then cuDNN runs it). x, w, y: the image input, weight and output, one of them the
// operand written.
bool run_pointwise(CudaBackend& be, Dir dir, const Tensor& lead, const Tensor& x, const Tensor& w, const Tensor& y,
                   const Conv2dArgs& a) {
  const MemoryFormat cl = MemoryFormat::ChannelsLast;
  if (!is_channels_last(lead) || w.size(2) != 1 || w.size(3) != 1 || !(a.stride == Int2(1)) ||
      !(a.padding == Int2(0)) || a.groups != 1 || !w.is_contiguous() || !x.is_contiguous(cl) || !y.is_contiguous(cl) ||
      x.dtype() != w.dtype() || y.dtype() != w.dtype() || x.numel() == 0 || y.numel() == 0)
    return false;
  // [N, C, H, W] channels-last as its [N*H*W, C] rows; the weight as [O, C].
  auto rows = [](const Tensor& t) {
    return raw::as_strided(t, {t.size(0) * t.size(2) * t.size(3), t.size(1)}, {t.size(1), 1}, t.offset());
  };
  const Tensor w2 = raw::as_strided(w, {w.size(0), w.size(1)}, {w.size(1), 1}, w.offset());
  switch (dir) {
    case Dir::Fwd:  // y = x W^T
      be.gemm(rows(x), false, w2, true, rows(y), 1.0, 0.0);
      break;
    case Dir::BwdData:  // grad_x = grad_y W
      be.gemm(rows(y), false, w2, false, rows(x), 1.0, 0.0);
      break;
    case Dir::BwdFilter:  // grad_W = grad_y^T x
      be.gemm(rows(y), true, rows(x), false, w2, 1.0, 0.0);
      break;
  }
  return true;
}

// A depthwise convolution over channels-last operands by memgrad's kernels
// (kernels/cuda/depthwise_conv.cu) or cuDNN's, whichever measured faster for the dtype and
// direction (H200, MobileNet v1 at B=64, bench/results/h200_run_2026-12-04.log):
//   - f16: cuDNN's NHWC depthwise kernels (sm90_xmma_depthwise_*) are faster than ours, except
//     for the input gradient of a strided convolution, where cuDNN runs a direct kernel
//     (dgrad2d_grouped_direct_kernel: 1.8 ms a step for MobileNet's four strided layers);
//   - bf16: cuDNN has no fast NHWC depthwise kernel (23.4 ms a MobileNet step against 7.6);
//   - f32: ours (the same kernels as bf16's).
// MG_DEPTHWISE_NHWC=0 always takes cuDNN, =1 always ours (A/B runs).
int depthwise_mode() {
  static const int mode = [] {
    const std::string_view m = env::choice("MG_DEPTHWISE_NHWC", {"auto", "0", "1"});
    return m == "auto" ? -1 : m == "0" ? 0 : 1;
  }();
  return mode;
}

bool run_depthwise(Dir dir, const Tensor& lead, const Tensor& x, const Tensor& w, const Tensor& y,
                   const Conv2dArgs& a) {
  if (!is_channels_last(lead) || depthwise_mode() == 0) return false;
  const bool strided = !(a.stride == Int2(1));
  if (depthwise_mode() < 0 && x.dtype() == DType::f16 && !(dir == Dir::BwdData && strided)) return false;
  const DepthwiseDir d = dir == Dir::Fwd       ? DepthwiseDir::Fwd
                         : dir == Dir::BwdData ? DepthwiseDir::BwdData
                                               : DepthwiseDir::BwdFilter;
  return depthwise_conv_nhwc(d, x, w, y, a);
}

// The entry points: nothing to do for an empty `out`, zeros when an input is empty (a sum
// over nothing), else run_pointwise (a 1x1 channels-last GEMM), run_depthwise or run_layout.
// `out` is one of x, w, y.
void run_or_zero(CudaBackend& be, Dir dir, const Tensor& lead, const Tensor& x, const Tensor& w, const Tensor& y,
                 const Tensor& out, const Conv2dArgs& a) {
  if (out.numel() == 0) return;
  if (x.numel() == 0 || w.numel() == 0 || y.numel() == 0) return raw::fill_(out, 0.0);
  if (run_pointwise(be, dir, lead, x, w, y, a)) return;
  if (run_depthwise(dir, lead, x, w, y, a)) return;
  run_layout(dir, lead, x, w, y, out, a);
}

}  // namespace

template <>
void CudaBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args,
                                 const Tensor& out) {
  mg::cuda::DeviceGuard guard(out.device());
  run_or_zero(*this, Dir::Fwd, x, x, w, out, out, args);
  if (bias.defined() && out.numel() != 0) {
    // out += bias[c], in place (cuda::binary allows out to alias its first operand).
    Tensor b = raw::expand(raw::view(bias, {1, bias.size(0), 1, 1}), out.sizes());
    binary(Binary::Add, out, b, out);
  }
}

template <>
void CudaBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Conv2dArgs& args,
                                        const Tensor& grad_x) {
  mg::cuda::DeviceGuard guard(grad_x.device());
  run_or_zero(*this, Dir::BwdData, grad_out, grad_x, w, grad_out, grad_x, args);
}

template <>
void CudaBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Conv2dArgs& args,
                                         const Tensor& grad_w) {
  mg::cuda::DeviceGuard guard(grad_w.device());
  run_or_zero(*this, Dir::BwdFilter, x, x, grad_w, grad_out, grad_w, args);
}

}  // namespace mg::kernels
