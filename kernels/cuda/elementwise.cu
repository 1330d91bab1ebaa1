// Elementwise CUDA kernels: one kernel per element type (and output type), the op chosen
// by a switch on an op code inside it, so compile time grows with dtypes, not dtypes x ops.
// Contiguous same-shape operands take a 16-byte vectorized path; everything else goes
// through an N-operand offset calculator (broadcast operands have stride 0).
#include <algorithm>
#include <cstdint>
#include <iterator>

#include "core/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gelu.cuh"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

// Op codes beyond the public enums: fused forms that reuse the same kernels.
constexpr int kClamp = 100;          // unary; p0 = lo, p1 = hi
constexpr int kAxpby = 200;          // binary; p0 = alpha, p1 = beta
constexpr int kClampBackward = 201;  // binary (grad, x); p0 = lo, p1 = hi
constexpr int kLogicalNot = 202;     // binary (a, a) -> a == 0

struct Params {
  double p0 = 0, p1 = 0;
};

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

template <class T>
__device__ __forceinline__ T unary_op(int op, T xv, const Params& p) {
  using M = math_t<T>;
  const M x = load_m(xv);
  if constexpr (std::is_floating_point_v<M>) {
    switch (op) {
      case static_cast<int>(Unary::Neg):
        return store_m<T>(-x);
      case static_cast<int>(Unary::Exp):
        return store_m<T>(m_exp(x));
      case static_cast<int>(Unary::Log):
        return store_m<T>(m_log(x));
      case static_cast<int>(Unary::Sqrt):
        return store_m<T>(m_sqrt(x));
      case static_cast<int>(Unary::Rsqrt):
        return store_m<T>(M(1) / m_sqrt(x));
      case static_cast<int>(Unary::Abs):
        return store_m<T>(m_abs(x));
      case static_cast<int>(Unary::Relu):
        return store_m<T>(x < M(0) ? M(0) : x);  // NaN stays NaN
      case static_cast<int>(Unary::Gelu):
        return store_m<T>(M(0.5) * x * (M(1) + m_erf(x * M(kSqrt1_2))));
      case static_cast<int>(Unary::GeluTanh):
        return store_m<T>(gelu_tanh<T>(x));
      case static_cast<int>(Unary::Sigmoid):
        return store_m<T>(M(1) / (M(1) + m_exp(-x)));
      case static_cast<int>(Unary::Tanh):
        return store_m<T>(m_tanh(x));
      case static_cast<int>(Unary::Sign):
        return store_m<T>(M((M(0) < x) - (x < M(0))));
      case static_cast<int>(Unary::Reciprocal):
        return store_m<T>(M(1) / x);
      case static_cast<int>(Unary::Square):
        return store_m<T>(x * x);
      case static_cast<int>(Unary::Silu):
        return store_m<T>(x / (M(1) + m_exp(-x)));
      case static_cast<int>(Unary::Softplus):
        return store_m<T>(x > M(20) ? x : log1p(m_exp(x)));
      case static_cast<int>(Unary::LogicalNot):
        return store_m<T>(M(x == M(0)));
      case kClamp: {
        M v = x < M(p.p0) ? M(p.p0) : x;
        return store_m<T>(v > M(p.p1) ? M(p.p1) : v);
      }
      default:
        return xv;
    }
  } else {
    switch (op) {
      case static_cast<int>(Unary::Neg):
        return store_m<T>(-x);
      case static_cast<int>(Unary::Abs):
        return store_m<T>(x < M(0) ? M(-x) : x);
      case static_cast<int>(Unary::Relu):
        return store_m<T>(x < M(0) ? M(0) : x);
      case static_cast<int>(Unary::Sign):
        return store_m<T>(M((M(0) < x) - (x < M(0))));
      case static_cast<int>(Unary::Square):
        return store_m<T>(x * x);
      case static_cast<int>(Unary::LogicalNot):
        return store_m<T>(M(x == M(0)));
      case kClamp: {
        // In double so infinite bounds never become integers.
        double v = static_cast<double>(x);
        v = v < p.p0 ? p.p0 : v;
        v = v > p.p1 ? p.p1 : v;
        return store_m<T>(static_cast<M>(v));
      }
      default:
        return xv;
    }
  }
}

template <class T, class O>
__device__ __forceinline__ O binary_op(int op, T av, T bv, const Params& p) {
  using M = math_t<T>;
  const M x = load_m(av), y = load_m(bv);
  if constexpr (std::is_same_v<O, bool> && !std::is_same_v<T, bool>) {
    switch (op) {
      case static_cast<int>(Binary::Eq):
        return x == y;
      case static_cast<int>(Binary::Ne):
        return x != y;
      case static_cast<int>(Binary::Lt):
        return x < y;
      case static_cast<int>(Binary::Le):
        return x <= y;
      case static_cast<int>(Binary::Gt):
        return x > y;
      case static_cast<int>(Binary::Ge):
        return x >= y;
      case kLogicalNot:
        return x == M(0);
      default:
        return false;
    }
  } else {
    switch (op) {
      case static_cast<int>(Binary::Add):
        return store_m<O>(x + y);
      case static_cast<int>(Binary::Sub):
        return store_m<O>(x - y);
      case static_cast<int>(Binary::Mul):
        return store_m<O>(x * y);
      case static_cast<int>(Binary::Maximum):
        return store_m<O>(m_isnan(x) ? x : (m_isnan(y) ? y : (x > y ? x : y)));
      case static_cast<int>(Binary::Minimum):
        return store_m<O>(m_isnan(x) ? x : (m_isnan(y) ? y : (x < y ? x : y)));
      case static_cast<int>(Binary::Eq):
        return store_m<O>(M(x == y));
      case static_cast<int>(Binary::Ne):
        return store_m<O>(M(x != y));
      case static_cast<int>(Binary::Lt):
        return store_m<O>(M(x < y));
      case static_cast<int>(Binary::Le):
        return store_m<O>(M(x <= y));
      case static_cast<int>(Binary::Gt):
        return store_m<O>(M(x > y));
      case static_cast<int>(Binary::Ge):
        return store_m<O>(M(x >= y));
      case kLogicalNot:
        return store_m<O>(M(x == M(0)));
      case kClampBackward: {  // a = grad, b = x
        const double v = static_cast<double>(y);
        return (v >= p.p0 && v <= p.p1) ? av : store_m<O>(M(0));
      }
      default:
        break;
    }
    if constexpr (std::is_floating_point_v<M>) {
      switch (op) {
        case static_cast<int>(Binary::Div):
          return store_m<O>(x / y);
        case static_cast<int>(Binary::Pow):
          return store_m<O>(m_pow(x, y));
        case kAxpby:
          return store_m<O>(x * M(p.p0) + y * M(p.p1));
        case static_cast<int>(Binary::ReluBackward):
          return y > M(0) ? av : store_m<O>(M(0));
        case static_cast<int>(Binary::GeluBackward): {
          const M cdf = M(0.5) * (M(1) + m_erf(y * M(kSqrt1_2)));
          const M pdf = M(kInvSqrt2Pi) * m_exp(M(-0.5) * y * y);
          return store_m<O>(x * (cdf + y * pdf));
        }
        case static_cast<int>(Binary::GeluTanhBackward):
          return store_m<O>(gelu_tanh_backward<T>(x, y));
        case static_cast<int>(Binary::SigmoidBackward):
          return store_m<O>(x * y * (M(1) - y));
        case static_cast<int>(Binary::TanhBackward):
          return store_m<O>(x * (M(1) - y * y));
        case static_cast<int>(Binary::SiluBackward): {
          const M s = M(1) / (M(1) + m_exp(-y));
          return store_m<O>(x * s * (M(1) + y * (M(1) - s)));
        }
        case static_cast<int>(Binary::SoftplusBackward):
          return store_m<O>(y > M(20) ? x : x / (M(1) + m_exp(-y)));
        default:
          return store_m<O>(M(0));
      }
    } else {
      switch (op) {
        case static_cast<int>(Binary::Pow):
          return store_m<O>(static_cast<M>(static_cast<int64_t>(pow(static_cast<double>(x), static_cast<double>(y)))));
        case kAxpby: {
          const double r = static_cast<double>(x) * p.p0 + static_cast<double>(y) * p.p1;
          if constexpr (std::is_same_v<O, bool>)
            return r != 0.0;
          else
            return static_cast<O>(static_cast<int64_t>(r));
        }
        default:
          return store_m<O>(M(0));
      }
    }
  }
}

// ---- kernels ----

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---- bias + dropout + residual (kernels::bias_dropout_add) ----
// Item g is elements 4g..4g+3: Philox block base + g holds their four numbers, as in a
// Bernoulli fill (core/cuda/copy.cu), so each block is computed once. kVec: the item's four
// elements share one row of the bias (cols % 4 == 0) and every pointer is aligned to four
// elements, so each operand moves as one vector (the mask as one 32-bit word).
// a * b rounded as its own step: never contracted with the residual add into an FMA, so the
// kernel computes add(x, mul(...)) with the composed ops' roundings (and the CPU kernel's bits).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <class B, class O>
__device__ __forceinline__ math_t<B> dropout_term(const B* branch, const B* bias, int64_t i, int64_t col, bool k,
                                                  math_t<B> scale) {
  using M = math_t<B>;
  M v = load_m(branch[i]);
  if (bias) v += load_m(bias[col]);
  return mul_rn(v, k ? scale : M(0));  // a product, as dropout's mul: a dropped NaN stays NaN
}

template <class B, class O, bool kVec>
__global__ void bias_dropout_add_kernel(const O* x, const B* branch, const B* bias, O* out, bool* keep, DropoutDraw d,
                                        int64_t n, int64_t cols) {
  using M = math_t<B>;
  const uint64_t base = d.base + (d.device_offset ? static_cast<uint64_t>(*d.device_offset) : 0);
  const M scale = static_cast<M>(d.scale);
  const int64_t items = (n + 3) / 4;
  MG_GRID_STRIDE(g, items) {
    uint32_t r[4];
    philox4x32(base + static_cast<uint64_t>(g), 0, d.seed, r);
    bool k[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) k[j] = (r[j] >> 8) < d.keep_below;
    const int64_t i0 = g * 4;
    if (kVec && i0 + 4 <= n) {
      const AlignedVec<B, 4> bv = reinterpret_cast<const AlignedVec<B, 4>*>(branch)[g];
      AlignedVec<B, 4> biv;
      if (bias) biv = *reinterpret_cast<const AlignedVec<B, 4>*>(bias + i0 % cols);
      AlignedVec<O, 4> xv;
      if (x) xv = reinterpret_cast<const AlignedVec<O, 4>*>(x)[g];
      AlignedVec<O, 4> ov;
      uint32_t kw = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        M v = load_m(bv.v[j]);
        if (bias) v += load_m(biv.v[j]);
        v = mul_rn(v, k[j] ? scale : M(0));
        if (x) v = static_cast<M>(load_m(xv.v[j])) + v;
        ov.v[j] = store_m<O>(v);
        kw |= static_cast<uint32_t>(k[j]) << (8 * j);
      }
      reinterpret_cast<AlignedVec<O, 4>*>(out)[g] = ov;
      reinterpret_cast<uint32_t*>(keep)[g] = kw;
    } else {
      for (int j = 0; j < 4 && i0 + j < n; ++j) {
        const int64_t i = i0 + j;
        M v = dropout_term<B, O>(branch, bias, i, i % cols, k[j], scale);
        if (x) v = static_cast<M>(load_m(x[i])) + v;
        out[i] = store_m<O>(v);
        keep[i] = k[j];
      }
    }
  }
}

// out = grad * keep * scale; four elements an item (the mask as one 32-bit word) when kVec.
template <class G, class O, bool kVec>
__global__ void dropout_backward_kernel(const G* grad, const bool* keep, O* out, double scale_d, int64_t n) {
  using M = math_t<O>;
  const M scale = static_cast<M>(scale_d);
  const int64_t items = (n + 3) / 4;
  MG_GRID_STRIDE(g, items) {
    const int64_t i0 = g * 4;
    if (kVec && i0 + 4 <= n) {
      const AlignedVec<G, 4> gv = reinterpret_cast<const AlignedVec<G, 4>*>(grad)[g];
      const uint32_t kw = reinterpret_cast<const uint32_t*>(keep)[g];
      AlignedVec<O, 4> ov;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        ov.v[j] = store_m<O>(static_cast<M>(load_m(gv.v[j])) * (((kw >> (8 * j)) & 0xff) ? scale : M(0)));
      reinterpret_cast<AlignedVec<O, 4>*>(out)[g] = ov;
    } else {
      for (int64_t i = i0; i < i0 + 4 && i < n; ++i)
        out[i] = store_m<O>(static_cast<M>(load_m(grad[i])) * (keep[i] ? scale : M(0)));
    }
  }
}

bool aligned_to(const void* p, size_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class T>
__device__ __forceinline__ void unary_contig_loop(int op, const Params& p, const T* a, T* out, int64_t n) {
  constexpr int V = kVec16<T>;
  using Vec = AlignedVec<T, V>;
  const int64_t nv = n / V;
  MG_GRID_STRIDE(i, nv) {
    Vec x = reinterpret_cast<const Vec*>(a)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) x.v[j] = unary_op<T>(op, x.v[j], p);
    reinterpret_cast<Vec*>(out)[i] = x;
  }
  const int64_t tail = nv * V + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tail < n) out[tail] = unary_op<T>(op, a[tail], p);
}

template <class T>
__global__ void unary_contig_kernel(int op, Params p, const T* a, T* out, int64_t n) {
  // The GELU the GPT MLP runs gets a copy of the loop with the op a constant, so unary_op's
  // switch folds away instead of being taken per element (the 16-bit GELU has the most math
  // per byte moved of any op here).
  constexpr int kGelu = static_cast<int>(Unary::GeluTanh);
  if (op == kGelu)
    unary_contig_loop<T>(kGelu, p, a, out, n);
  else
    unary_contig_loop<T>(op, p, a, out, n);
}

template <class T>
__global__ void unary_strided_kernel(int op, Params p, const T* a, T* out, OffsetCalc<2> oc, int64_t n) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[2];
    oc.get(i, off);
    out[off[0]] = unary_op<T>(op, a[off[1]], p);
  }
}

template <class T, class O>
__global__ void binary_contig_kernel(int op, Params p, const T* a, const T* b, O* out, int64_t n) {
  constexpr int V = kVec16<T> < kVec16<O> ? kVec16<T> : kVec16<O>;
  using VecI = AlignedVec<T, V>;
  using VecO = AlignedVec<O, V>;
  const int64_t nv = n / V;
  MG_GRID_STRIDE(i, nv) {
    const VecI x = reinterpret_cast<const VecI*>(a)[i];
    const VecI y = reinterpret_cast<const VecI*>(b)[i];
    VecO r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = binary_op<T, O>(op, x.v[j], y.v[j], p);
    reinterpret_cast<VecO*>(out)[i] = r;
  }
  const int64_t tail = nv * V + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tail < n) out[tail] = binary_op<T, O>(op, a[tail], b[tail], p);
}

// One operand full and contiguous, the other a row of `inner` elements repeated over the
// rows (a bias [N] against [R, N]): 16-byte loads of both, the row's from L1/L2. kRowIsA
// keeps the operand order for non-commutative ops. inner % V == 0, n < 2^31 * V.
template <class T, class O, bool kRowIsA>
__device__ __forceinline__ void binary_row_loop(int op, Params p, const T* full, const T* row, O* out, int64_t n,
                                                mg::cuda::FastDiv inner_v) {
  constexpr int V = kVec16<T> < kVec16<O> ? kVec16<T> : kVec16<O>;
  using VecI = AlignedVec<T, V>;
  using VecO = AlignedVec<O, V>;
  const int64_t nv = n / V;
  MG_GRID_STRIDE(i, nv) {
    const uint32_t iv = static_cast<uint32_t>(i);
    const uint32_t j = iv - inner_v.div(iv) * inner_v.d;  // vector index within the row
    const VecI x = reinterpret_cast<const VecI*>(full)[i];
    const VecI y = reinterpret_cast<const VecI*>(row)[j];
    VecO r;
#pragma unroll
    for (int k = 0; k < V; ++k)
      r.v[k] = kRowIsA ? binary_op<T, O>(op, y.v[k], x.v[k], p) : binary_op<T, O>(op, x.v[k], y.v[k], p);
    reinterpret_cast<VecO*>(out)[i] = r;
  }
}

template <class T, class O, bool kRowIsA>
__global__ void binary_row_kernel(int op, Params p, const T* full, const T* row, O* out, int64_t n,
                                  mg::cuda::FastDiv inner_v) {
  // A bias add gets a copy of the loop with the op a constant, as unary_contig_kernel's GELU:
  // binary_op's switch taken per element held f16/bf16 at 0.83-0.85 of a copy's bandwidth.
  constexpr int kAdd = static_cast<int>(Binary::Add);
  if (op == kAdd)
    binary_row_loop<T, O, kRowIsA>(kAdd, p, full, row, out, n, inner_v);
  else
    binary_row_loop<T, O, kRowIsA>(op, p, full, row, out, n, inner_v);
}

template <class T, class O>
__global__ void binary_strided_kernel(int op, Params p, const T* a, const T* b, O* out, OffsetCalc<3> oc, int64_t n) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[3];
    oc.get(i, off);
    out[off[0]] = binary_op<T, O>(op, a[off[1]], b[off[2]], p);
  }
}

template <class T>
__global__ void where_kernel(const bool* c, const T* a, const T* b, T* out, OffsetCalc<4> oc, int64_t n) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[4];
    oc.get(i, off);
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

// True when t covers exactly out's elements in the same memory order, out being dense:
// both contiguous, or both channels-last (any same dense layout), so both walk as flat arrays.
bool flat_like(const Tensor& t, const Tensor& out) {
  return t.sizes() == out.sizes() && (out.is_contiguous() ? t.is_contiguous() : same_dense_layout(out, t));
}

// When t (expanded to out's shape) is one contiguous block of out's trailing dims repeated over
// its leading ones (stride 0 there: a bias [N] against [R, N], a position table [T, C] against
// [B, T, C]), the block's element count; 0 otherwise.
int64_t repeated_block(const Tensor& t, const Tensor& out) {
  if (t.dim() != out.dim() || t.dim() < 2 || t.sizes() != out.sizes()) return 0;
  int64_t d = t.dim() - 1, inner = 1;
  for (; d >= 0 && (t.size(d) == 1 || t.stride(d) == inner); --d) inner *= t.size(d);  // the contiguous tail
  if (inner == out.numel()) return 0;  // the whole tensor: flat, not repeated
  for (int64_t e = d; e >= 0; --e)
    if (t.stride(e) != 0 && t.size(e) != 1) return 0;
  return inner;
}

constexpr int code(Binary op) { return static_cast<int>(op); }

template <size_t N>
bool one_of(int op, const int (&ops)[N]) {
  return std::find(std::begin(ops), std::end(ops), op) != std::end(ops);
}

bool is_comparison(int op) {
  static constexpr int kComparisons[] = {code(Binary::Eq), code(Binary::Ne), code(Binary::Lt), code(Binary::Le),
                                         code(Binary::Gt), code(Binary::Ge), kLogicalNot};
  return one_of(op, kComparisons);
}

// Comparisons, these and axpby / clamp_backward take every dtype; the other binary ops need
// floating operands.
bool float_only_binary(int op) {
  static constexpr int kArithmetic[] = {code(Binary::Add), code(Binary::Sub),     code(Binary::Mul),
                                        code(Binary::Pow), code(Binary::Maximum), code(Binary::Minimum)};
  return !is_comparison(op) && !one_of(op, kArithmetic) && op != kAxpby && op != kClampBackward;
}

void launch_unary(int op, Params p, const Tensor& a, const Tensor& out, const char* name) {
  const int64_t n = out.numel();
  if (n == 0) return;
  mg::cuda::DeviceGuard g(out.device());
  cudaStream_t st = stream_of(out);
  MG_CUDA_DISPATCH_ALL(a.dtype(), name, [&] {
    using T = scalar_t;
    const T* pa = static_cast<const T*>(a.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    if (out.is_dense() && flat_like(a, out) && aligned16(pa) && aligned16(po)) {
      unary_contig_kernel<T><<<blocks_for(n / kVec16<T> + 1), kBlock, 0, st>>>(op, p, pa, po, n);
    } else {
      auto oc = make_offset_calc<2>(out.sizes(), {&out.strides(), &a.strides()});
      unary_strided_kernel<T><<<blocks_for(n), kBlock, 0, st>>>(op, p, pa, po, oc, n);
    }
  });
  MG_CUDA_CHECK_LAUNCH(name);
}

template <class T, class O>
void launch_binary_t(int op, Params p, const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t st) {
  const int64_t n = out.numel();
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  O* po = static_cast<O*>(out.raw_data());
  if (out.is_dense() && flat_like(a, out) && flat_like(b, out) && aligned16(pa) && aligned16(pb) && aligned16(po)) {
    binary_contig_kernel<T, O><<<blocks_for(n / kVec16<T> + 1), kBlock, 0, st>>>(op, p, pa, pb, po, n);
    return;
  }
  constexpr int V = kVec16<T> < kVec16<O> ? kVec16<T> : kVec16<O>;
  const int64_t block_b = flat_like(a, out) ? repeated_block(b, out) : 0;
  const int64_t block_a = flat_like(b, out) ? repeated_block(a, out) : 0;
  const bool row_b = block_b > 0, row_a = !row_b && block_a > 0;
  const int64_t inner = row_b ? block_b : block_a;
  if (out.is_contiguous() && (row_a || row_b) && inner % V == 0 && n / V < (int64_t{1} << 31) && aligned16(pa) &&
      aligned16(pb) && aligned16(po)) {
    const mg::cuda::FastDiv inner_v(static_cast<uint32_t>(inner / V));
    if (row_b)
      binary_row_kernel<T, O, false><<<blocks_for(n / V), kBlock, 0, st>>>(op, p, pa, pb, po, n, inner_v);
    else
      binary_row_kernel<T, O, true><<<blocks_for(n / V), kBlock, 0, st>>>(op, p, pb, pa, po, n, inner_v);
  } else {
    auto oc = make_offset_calc<3>(out.sizes(), {&out.strides(), &a.strides(), &b.strides()});
    binary_strided_kernel<T, O><<<blocks_for(n), kBlock, 0, st>>>(op, p, pa, pb, po, oc, n);
  }
}

void launch_binary(int op, Params p, const Tensor& a, const Tensor& b, const Tensor& out, const char* name) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MG_CHECK(!float_only_binary(op) || is_floating(a.dtype()), DTypeError, name, ": op not supported for dtype ",
           a.dtype());
  mg::cuda::DeviceGuard g(out.device());
  cudaStream_t st = stream_of(out);
  if (out.dtype() == DType::b8 && a.dtype() != DType::b8) {
    MG_CHECK(is_comparison(op), DTypeError, name, ": b8 output only for comparisons");
    MG_CUDA_DISPATCH_ALL(a.dtype(), name, [&] { launch_binary_t<scalar_t, bool>(op, p, a, b, out, st); });
  } else {
    MG_CHECK(out.dtype() == a.dtype(), DTypeError, name, ": output dtype ", out.dtype(), " differs from input ",
             a.dtype());
    MG_CUDA_DISPATCH_ALL(a.dtype(), name, [&] { launch_binary_t<scalar_t, scalar_t>(op, p, a, b, out, st); });
  }
  MG_CUDA_CHECK_LAUNCH(name);
}

}  // namespace

template <>
void CudaBackend::unary(Unary op, const Tensor& a, const Tensor& out) {
  if (op == Unary::LogicalNot && out.dtype() != a.dtype())
    return launch_binary(kLogicalNot, {}, a, a, out, "logical_not");
  MG_CHECK(!unary_float_only(op) || is_floating(a.dtype()), DTypeError, "unary: op not supported for dtype ",
           a.dtype());
  launch_unary(static_cast<int>(op), {}, a, out, "unary");
}

template <>
void CudaBackend::binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& out) {
  launch_binary(static_cast<int>(op), {}, a, b, out, "binary");
}

template <>
void CudaBackend::clamp(const Tensor& a, double lo, double hi, const Tensor& out) {
  launch_unary(kClamp, {lo, hi}, a, out, "clamp");
}

template <>
void CudaBackend::clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi, const Tensor& out) {
  launch_binary(kClampBackward, {lo, hi}, grad, x, out, "clamp_backward");
}

template <>
void CudaBackend::axpby(const Tensor& a, double alpha, const Tensor& b, double beta, const Tensor& out) {
  launch_binary(kAxpby, {alpha, beta}, a, b, out, "axpby");
}

template <>
void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MG_CHECK(cond.dtype() == DType::b8, DTypeError, "where: condition must be b8, got ", cond.dtype());
  mg::cuda::DeviceGuard g(out.device());
  cudaStream_t st = stream_of(out);
  auto oc = make_offset_calc<4>(out.sizes(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()});
  // Only the bytes move: dispatch on the element size.
  by_size(out.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    where_kernel<T><<<blocks_for(n), kBlock, 0, st>>>(
        static_cast<const bool*>(cond.raw_data()), static_cast<const T*>(a.raw_data()),
        static_cast<const T*>(b.raw_data()), static_cast<T*>(out.raw_data()), oc, n);
  });
  MG_CUDA_CHECK_LAUNCH("where");
}

template <>
void CudaBackend::bias_dropout_add(const Tensor& x, const Tensor& branch, const Tensor& bias, const DropoutDraw& d,
                                   const Tensor& out, const Tensor& keep) {
  const int64_t n = branch.numel(), cols = branch.size(-1);
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(out.device());
  cudaStream_t st = stream_of(out);
  MG_CUDA_DISPATCH_FLOAT(branch.dtype(), "bias_dropout_add", [&] {
    using B = scalar_t;
    auto run = [&](auto tag) {
      using O = decltype(tag);
      const O* px = static_cast<const O*>(x.defined() ? x.raw_data() : nullptr);
      const B* pb = static_cast<const B*>(branch.raw_data());
      const B* pbias = static_cast<const B*>(bias.defined() ? bias.raw_data() : nullptr);
      O* po = static_cast<O*>(out.raw_data());
      bool* pk = static_cast<bool*>(keep.raw_data());
      const bool vec = cols % 4 == 0 && aligned_to(px, 4 * sizeof(O)) && aligned_to(pb, 4 * sizeof(B)) &&
                       aligned_to(pbias, 4 * sizeof(B)) && aligned_to(po, 4 * sizeof(O)) && aligned_to(pk, 4);
      const unsigned blocks = blocks_for((n + 3) / 4);
      if (vec)
        bias_dropout_add_kernel<B, O, true><<<blocks, kBlock, 0, st>>>(px, pb, pbias, po, pk, d, n, cols);
      else
        bias_dropout_add_kernel<B, O, false><<<blocks, kBlock, 0, st>>>(px, pb, pbias, po, pk, d, n, cols);
    };
    if (out.dtype() == branch.dtype()) {
      run(B{});
    } else {
      if constexpr (mg::cuda::is_half_v<B>)
        run(float{});
      else
        MG_THROW(DTypeError, "bias_dropout_add: residual dtype ", out.dtype(), " with branch dtype ", branch.dtype());
    }
  });
  MG_CUDA_CHECK_LAUNCH("bias_dropout_add");
}

template <>
void CudaBackend::dropout_backward(const Tensor& grad, const Tensor& keep, double scale, const Tensor& out) {
  const int64_t n = grad.numel();
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(out.device());
  cudaStream_t st = stream_of(out);
  MG_CUDA_DISPATCH_FLOAT(out.dtype(), "dropout_backward", [&] {
    using O = scalar_t;
    auto run = [&](auto tag) {
      using G = decltype(tag);
      const G* pg = static_cast<const G*>(grad.raw_data());
      const bool* pk = static_cast<const bool*>(keep.raw_data());
      O* po = static_cast<O*>(out.raw_data());
      const bool vec = aligned_to(pg, 4 * sizeof(G)) && aligned_to(po, 4 * sizeof(O)) && aligned_to(pk, 4);
      const unsigned blocks = blocks_for((n + 3) / 4);
      if (vec)
        dropout_backward_kernel<G, O, true><<<blocks, kBlock, 0, st>>>(pg, pk, po, scale, n);
      else
        dropout_backward_kernel<G, O, false><<<blocks, kBlock, 0, st>>>(pg, pk, po, scale, n);
    };
    if (grad.dtype() == out.dtype()) {
      run(O{});
    } else {
      if constexpr (mg::cuda::is_half_v<O>)
        run(float{});
      else
        MG_THROW(DTypeError, "dropout_backward: grad dtype ", grad.dtype(), " with output dtype ", out.dtype());
    }
  });
  MG_CUDA_CHECK_LAUNCH("dropout_backward");
}

}  // namespace mg::kernels
