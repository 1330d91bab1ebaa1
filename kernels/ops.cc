// Validation and device dispatch for kernels/ops.h: every op checks its inputs (naming the
// op and the offending values), decides the output dtype/shape, allocates, then calls the
// backend through MG_KERNEL, the one place that picks cpu:: or cuda::.
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/cpu/cpu_ops.h"

#ifdef MG_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#define MG_KERNEL(DEV, FN, ...)                                  \
  do {                                                           \
    if ((DEV).is_cuda()) ::mg::kernels::cuda::FN(__VA_ARGS__);   \
    else ::mg::kernels::cpu::FN(__VA_ARGS__);                    \
  } while (0)
#else
#define MG_KERNEL(DEV, FN, ...)          \
  do {                                   \
    (void)(DEV);                         \
    ::mg::kernels::cpu::FN(__VA_ARGS__); \
  } while (0)
#endif

namespace mg::kernels {
namespace {

// Checks every tensor is defined and on one device, and that the device has kernels.
Device check_device(const char* op, std::initializer_list<const Tensor*> ts) {
  Device dev;
  bool first = true;
  for (const Tensor* t : ts) {
    if (!t) continue;
    MG_CHECK(t->defined(), ValueError, op, ": got an undefined tensor");
    if (first) {
      dev = t->device();
      first = false;
    } else {
      MG_CHECK(t->device() == dev, DeviceError, op, ": tensors on different devices ", dev, " and ", t->device());
    }
  }
#ifndef MG_WITH_CUDA
  MG_CHECK(!dev.is_cuda(), DeviceError, op, ": CUDA kernels not available in this build (tensor on ", dev, ")");
#endif
  return dev;
}

const char* unary_name(Unary op) {
  static const char* names[] = {"neg",     "exp",  "log",  "sqrt",       "rsqrt",  "abs",  "relu", "gelu", "gelu_tanh",
                                "sigmoid", "tanh", "sign", "reciprocal", "square", "silu", "logical_not"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(Unary::LogicalNot) + 1,
                "a Unary op was added: name it here");
  return names[static_cast<int>(op)];
}

const char* binary_name(Binary op) {
  static const char* names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le",
                                "gt", "ge", "relu_backward", "gelu_backward", "gelu_tanh_backward",
                                "sigmoid_backward", "tanh_backward", "silu_backward"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(Binary::SiluBackward) + 1,
                "a Binary op was added: name it here");
  return names[static_cast<int>(op)];
}

bool is_comparison(Binary op) { return op >= Binary::Eq && op <= Binary::Ge; }
bool is_backward(Binary op) { return op >= Binary::ReluBackward; }
// Ops whose result is floating even for integer inputs (promote to f32 like PyTorch).
bool float_only(Unary op) {
  switch (op) {
    case Unary::Neg: case Unary::Abs: case Unary::Relu: case Unary::Sign: case Unary::Square: case Unary::LogicalNot:
      return false;
    default:
      return true;
  }
}

int category(DType t) { return t == DType::b8 ? 0 : (is_floating(t) ? 2 : 1); }

// PyTorch's result_type with its scalar rule: a 0-dim operand combined with a dimensioned
// one only matters when it is of a higher category (bool < integer < floating).
DType result_type(const Tensor& a, const Tensor& b) {
  const bool za = a.dim() == 0, zb = b.dim() == 0;
  if (za == zb) return promote_types(a.dtype(), b.dtype());
  const DType t = za ? b.dtype() : a.dtype();
  const DType s = za ? a.dtype() : b.dtype();
  if (category(s) <= category(t)) return t;
  return category(s) == 2 ? DType::f32 : DType::i64;
}

Tensor cast_to(const Tensor& t, DType d) { return t.dtype() == d ? t : raw::to_dtype(t, d); }
Tensor bcast(const Tensor& t, const Shape& s) { return t.sizes() == s ? t : raw::expand(t, s); }

// Keepdim shape for reducing `dims` (empty = all) and the dims as a mask.
Shape kept_shape(const Tensor& a, const std::vector<int64_t>& dims, const char* op, std::vector<bool>* mask) {
  const int64_t nd = a.dim();
  std::vector<bool> m(nd, dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, nd, op);
    if (nd == 0) continue;
    MG_CHECK(!m[w], ValueError, op, ": dim ", d, " appears more than once in the reduction dims");
    m[w] = true;
  }
  Shape k = a.sizes();
  for (int64_t i = 0; i < nd; ++i)
    if (m[i]) k[i] = 1;
  if (mask) *mask = m;
  return k;
}

Tensor squeeze_reduced(const Tensor& out, const Tensor& a, const std::vector<bool>& mask, bool keepdim) {
  if (keepdim) return out;
  Shape s;
  for (int64_t i = 0; i < a.dim(); ++i)
    if (!mask[i]) s.push_back(a.size(i));
  return raw::view(out, s);
}

}  // namespace

// ---------------------------------------------------------------- elementwise

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MG_CHECK(da == db || da == 1 || db == 1, ShapeError, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor unary(Unary op, const Tensor& a) {
  const char* name = unary_name(op);
  const Device dev = check_device(name, {&a});
  if (op == Unary::LogicalNot) return binary(Binary::Eq, a, zeros({}, {a.dtype(), dev}));
  MG_CHECK(!(op == Unary::Neg && a.dtype() == DType::b8), DTypeError, name,
           ": negation of a bool tensor is not supported (use logical_not)");
  Tensor x = a;
  if (float_only(op) && !is_floating(a.dtype())) x = raw::to_dtype(a, DType::f32);
  Tensor out = empty(x.sizes(), {x.dtype(), dev});
  MG_KERNEL(dev, unary, op, x, out);
  return out;
}

void unary_(Unary op, const Tensor& a) {
  const char* name = unary_name(op);
  check_device(name, {&a});
  MG_CHECK(!float_only(op) || is_floating(a.dtype()), DTypeError, name,
           "_: in-place op needs a floating tensor (its result is floating), got ", a.dtype());
  MG_CHECK(!(op == Unary::Neg && a.dtype() == DType::b8), DTypeError, name,
           ": negation of a bool tensor is not supported (use logical_not)");
  if (op == Unary::LogicalNot) {
    binary_(Binary::Eq, a, zeros({}, {a.dtype(), a.device()}));
    return;
  }
  MG_KERNEL(a.device(), unary, op, a, a);
  a.bump_version();
}

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  const Device dev = check_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  DType ct = result_type(a, b);
  if (is_backward(op)) {
    MG_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), DTypeError, name,
             ": expected floating tensors, got ", a.dtype(), " and ", b.dtype());
    ct = promote_types(a.dtype(), b.dtype());
  }
  if (op == Binary::Div && !is_floating(ct)) ct = DType::f32;  // true division
  Tensor out = empty(shape, {is_comparison(op) ? DType::b8 : ct, dev});
  MG_KERNEL(dev, binary, op, bcast(cast_to(a, ct), shape), bcast(cast_to(b, ct), shape), out);
  return out;
}

void binary_(Binary op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  MG_CHECK(shape == a.sizes(), ShapeError, name, "_: cannot broadcast ", shape_str(b.sizes()),
           " to the in-place operand's shape ", shape_str(a.sizes()));
  if (is_comparison(op) || (op == Binary::Div && !is_floating(a.dtype())) || is_backward(op) ||
      result_type(a, b) != a.dtype()) {
    // The result has another dtype (b8, floating, or b's wider type): compute out of place
    // in that type, then cast back, so b is never rounded to a's dtype first.
    Tensor r = binary(op, a, b);
    raw::copy_(a, r);
  } else {
    MG_KERNEL(a.device(), binary, op, a, bcast(cast_to(b, a.dtype()), shape), a);
  }
  a.bump_version();
}

Tensor add_scalar(const Tensor& a, double s) {
  check_device("add_scalar", {&a});
  return binary(Binary::Add, a, full({}, s, {a.dtype(), a.device()}));
}

Tensor mul_scalar(const Tensor& a, double s) {
  check_device("mul_scalar", {&a});
  return binary(Binary::Mul, a, full({}, s, {a.dtype(), a.device()}));
}

Tensor pow_scalar(const Tensor& a, double exponent) {
  check_device("pow_scalar", {&a});
  // A fractional exponent of an integer tensor gives a floating result (like PyTorch).
  const DType dt = (!is_floating(a.dtype()) && exponent != std::floor(exponent)) ? DType::f32 : a.dtype();
  if (exponent == 2.0) return unary(Unary::Square, a);
  if (exponent == 0.5 && is_floating(dt)) return unary(Unary::Sqrt, a);
  return binary(Binary::Pow, cast_to(a, dt), full({}, exponent, {dt, a.device()}));
}

Tensor clamp(const Tensor& a, double lo, double hi) {
  const Device dev = check_device("clamp", {&a});
  MG_CHECK(!std::isnan(lo) && !std::isnan(hi), ValueError, "clamp: bounds must not be NaN (got ", lo, ", ", hi, ")");
  Tensor out = empty(a.sizes(), {a.dtype(), dev});
  MG_KERNEL(dev, clamp, a, lo, hi, out);
  return out;
}

Tensor clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi) {
  const Device dev = check_device("clamp_backward", {&grad, &x});
  MG_CHECK(grad.sizes() == x.sizes(), ShapeError, "clamp_backward: grad shape ", shape_str(grad.sizes()),
           " does not match input shape ", shape_str(x.sizes()));
  Tensor out = empty(grad.sizes(), {grad.dtype(), dev});
  MG_KERNEL(dev, clamp_backward, grad, cast_to(x, grad.dtype()), lo, hi, out);
  return out;
}

Tensor axpby(const Tensor& a, double alpha, const Tensor& b, double beta) {
  const Device dev = check_device("axpby", {&a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "axpby");
  const DType ct = result_type(a, b);
  Tensor out = empty(shape, {ct, dev});
  MG_KERNEL(dev, axpby, bcast(cast_to(a, ct), shape), alpha, bcast(cast_to(b, ct), shape), beta, out);
  return out;
}

void axpby_(const Tensor& a, double alpha, const Tensor& b, double beta) {
  check_device("axpby_", {&a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "axpby_");
  MG_CHECK(shape == a.sizes(), ShapeError, "axpby_: cannot broadcast ", shape_str(b.sizes()),
           " to the in-place operand's shape ", shape_str(a.sizes()));
  if (result_type(a, b) != a.dtype()) {
    raw::copy_(a, axpby(a, alpha, b, beta));  // compute in b's wider type, round once
  } else {
    MG_KERNEL(a.device(), axpby, a, alpha, bcast(cast_to(b, a.dtype()), shape), beta, a);
  }
  a.bump_version();
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Device dev = check_device("where", {&cond, &a, &b});
  MG_CHECK(cond.dtype() == DType::b8, DTypeError, "where: condition must be a bool (b8) tensor, got ", cond.dtype());
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  const DType ct = result_type(a, b);
  Tensor out = empty(shape, {ct, dev});
  MG_KERNEL(dev, where, bcast(cond, shape), bcast(cast_to(a, ct), shape), bcast(cast_to(b, ct), shape), out);
  return out;
}

// ---------------------------------------------------------------- casts, fills, copies

Tensor cast(const Tensor& a, DType dtype) {
  check_device("cast", {&a});
  return raw::to_dtype(a, dtype);
}

void fill_(const Tensor& a, double v) {
  check_device("fill_", {&a});
  raw::fill_(a, v);
  a.bump_version();
}

void copy_(const Tensor& dst, const Tensor& src) {
  MG_CHECK(dst.defined() && src.defined(), ValueError, "copy_: got an undefined tensor");
  const Shape shape = broadcast_shapes(dst.sizes(), src.sizes(), "copy_");
  MG_CHECK(shape == dst.sizes(), ShapeError, "copy_: source shape ", shape_str(src.sizes()),
           " cannot be broadcast to destination shape ", shape_str(dst.sizes()));
#ifndef MG_WITH_CUDA
  MG_CHECK(!dst.is_cuda() && !src.is_cuda(), DeviceError, "copy_: CUDA kernels not available in this build (",
           src.device(), " -> ", dst.device(), ")");
#endif
  raw::copy_(dst, src);  // cross-device copies go through core's CUDA hooks
  dst.bump_version();
}

// ---------------------------------------------------------------- reductions

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  const Device dev = check_device("sum", {&a});
  std::vector<bool> mask;
  const Shape k = kept_shape(a, dims, "sum", &mask);
  Tensor out = empty(k, {is_floating(a.dtype()) ? a.dtype() : DType::i64, dev});
  MG_KERNEL(dev, sum, a, out);
  return squeeze_reduced(out, a, mask, keepdim);
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  const Device dev = check_device("mean", {&a});
  MG_CHECK(is_floating(a.dtype()), DTypeError, "mean: expected a floating tensor, got ", a.dtype(),
           " (cast it first)");
  std::vector<bool> mask;
  const Shape k = kept_shape(a, dims, "mean", &mask);
  Tensor out = empty(k, {a.dtype(), dev});
  MG_KERNEL(dev, mean, a, out);
  return squeeze_reduced(out, a, mask, keepdim);
}

Tensor var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const Device dev = check_device("var", {&a});
  MG_CHECK(is_floating(a.dtype()), DTypeError, "var: expected a floating tensor, got ", a.dtype());
  MG_CHECK(correction >= 0, ValueError, "var: correction must be non-negative, got ", correction);
  std::vector<bool> mask;
  const Shape k = kept_shape(a, dims, "var", &mask);
  Tensor out = empty(k, {a.dtype(), dev});
  MG_KERNEL(dev, var, a, correction, out);
  return squeeze_reduced(out, a, mask, keepdim);
}

static std::pair<Tensor, Tensor> max_min(const Tensor& a, int64_t dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "max" : "min";
  const Device dev = check_device(op, {&a});
  const int64_t d = wrap_dim(dim, a.dim(), op);
  if (a.dim() > 0)
    MG_CHECK(a.size(d) > 0, IndexError, op, ": cannot reduce over dim ", dim, " of size 0 (shape ",
             shape_str(a.sizes()), ")");
  std::vector<bool> mask;
  const Shape k = kept_shape(a, {d}, op, &mask);
  Tensor values = empty(k, {a.dtype(), dev});
  Tensor indices = empty(k, {DType::i64, dev});
  MG_KERNEL(dev, max_min, a, d, is_max, values, indices);
  return {squeeze_reduced(values, a, mask, keepdim), squeeze_reduced(indices, a, mask, keepdim)};
}

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) { return max_min(a, dim, keepdim, true); }
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) { return max_min(a, dim, keepdim, false); }

Tensor max_all(const Tensor& a) {
  check_device("max_all", {&a});
  MG_CHECK(a.numel() > 0, ValueError, "max_all: empty tensor of shape ", shape_str(a.sizes()), " has no maximum");
  return max_min(raw::reshape(a, {a.numel()}), 0, false, true).first;
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  check_device("argmax", {&a});
  return max_min(a, dim, keepdim, true).second;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  check_device("sum_to", {&g});
  if (g.sizes() == shape) return g;
  const int64_t nd = g.dim(), ns = static_cast<int64_t>(shape.size());
  MG_CHECK(ns <= nd, ShapeError, "sum_to: cannot reduce shape ", shape_str(g.sizes()), " to ", shape_str(shape),
           " (target has more dims)");
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t j = i - (nd - ns);
    if (j < 0) {
      dims.push_back(i);
      continue;
    }
    MG_CHECK(shape[j] == g.size(i) || shape[j] == 1, ShapeError, "sum_to: cannot reduce shape ",
             shape_str(g.sizes()), " to ", shape_str(shape), " (dim ", i, ": ", g.size(i), " vs ", shape[j], ")");
    if (shape[j] == 1 && g.size(i) != 1) dims.push_back(i);
  }
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  r = cast_to(r, g.dtype());
  return raw::reshape(r, shape);
}

Tensor sum_squares(const Tensor& a) {
  const Device dev = check_device("sum_squares", {&a});
  Tensor out = empty({}, {a.dtype() == DType::f64 ? DType::f64 : DType::f32, dev});
  MG_KERNEL(dev, sum_squares, a, out);
  return out;
}

bool has_nonfinite(const Tensor& a) {
  const Device dev = check_device("has_nonfinite", {&a});
#ifdef MG_WITH_CUDA
  if (dev.is_cuda()) return cuda::has_nonfinite(a);
#endif
  (void)dev;
  return cpu::has_nonfinite(a);
}

// ---------------------------------------------------------------- linear algebra

namespace {
void check_matmul_dtypes(const char* op, const Tensor& a, const Tensor& b) {
  MG_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": dtypes differ: ", a.dtype(), " and ", b.dtype());
  MG_CHECK(is_floating(a.dtype()), DTypeError, op, ": expected floating tensors, got ", a.dtype());
}
}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha,
          double beta) {
  const Device dev = check_device("gemm", {&a, &b, &out});
  check_matmul_dtypes("gemm", a, b);
  MG_CHECK(out.dtype() == a.dtype(), DTypeError, "gemm: output dtype ", out.dtype(), " differs from inputs' ",
           a.dtype());
  MG_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, ShapeError, "gemm: expected 2-D tensors, got ",
           shape_str(a.sizes()), ", ", shape_str(b.sizes()), " and out ", shape_str(out.sizes()));
  const int64_t n = trans_a ? a.size(1) : a.size(0), ka = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0), m = trans_b ? b.size(0) : b.size(1);
  MG_CHECK(ka == kb, ShapeError, "gemm: inner dimensions differ: ", shape_str(a.sizes()), (trans_a ? "^T" : ""),
           " @ ", shape_str(b.sizes()), (trans_b ? "^T" : ""));
  MG_CHECK(out.size(0) == n && out.size(1) == m, ShapeError, "gemm: output shape ", shape_str(out.sizes()),
           " should be ", shape_str({n, m}));
  MG_KERNEL(dev, gemm, a, trans_a, b, trans_b, out, alpha, beta);
  out.bump_version();
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  const Device dev = check_device("bmm", {&a, &b});
  check_matmul_dtypes("bmm", a, b);
  MG_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError, "bmm: expected 3-D tensors, got ", shape_str(a.sizes()), " @ ",
           shape_str(b.sizes()));
  MG_CHECK(a.size(0) == b.size(0), ShapeError, "bmm: batch sizes differ: ", shape_str(a.sizes()), " @ ",
           shape_str(b.sizes()));
  MG_CHECK(a.size(2) == b.size(1), ShapeError, "bmm: inner dimensions differ: ", shape_str(a.sizes()), " @ ",
           shape_str(b.sizes()));
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, {a.dtype(), dev});
  MG_KERNEL(dev, bmm, a, b, out);
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  const Device dev = check_device("matmul", {&a, &b});
  MG_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeError, "matmul: both arguments need at least 1 dim, got ",
           shape_str(a.sizes()), " @ ", shape_str(b.sizes()));
  check_matmul_dtypes("matmul", a, b);
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  MG_CHECK(ka == kb, ShapeError, "matmul: inner dimensions differ: ", shape_str(a.sizes()), " @ ",
           shape_str(b.sizes()));
  // Lift 1-D operands to matrices; the added dims are dropped from the result.
  const Tensor A = a.dim() == 1 ? raw::unsqueeze(a, 0) : a;
  const Tensor B = b.dim() == 1 ? raw::unsqueeze(b, 1) : b;
  const int64_t n = A.size(-2), m = B.size(-1);
  Tensor out;
  Shape batch;
  if (A.dim() == 2 && B.dim() == 2) {
    out = empty({n, m}, {a.dtype(), dev});
    MG_KERNEL(dev, gemm, A, false, B, false, out, 1.0, 0.0);
  } else if (B.dim() == 2) {
    // [..., n, k] @ [k, m]: fold the batch into rows, one GEMM.
    batch.assign(A.sizes().begin(), A.sizes().end() - 2);
    Tensor A2 = raw::reshape(A, {shape_numel(batch) * n, ka});
    Tensor o2 = empty({A2.size(0), m}, {a.dtype(), dev});
    MG_KERNEL(dev, gemm, A2, false, B, false, o2, 1.0, 0.0);
    Shape s = batch;
    s.push_back(n);
    s.push_back(m);
    out = raw::view(o2, s);
  } else {
    Shape ba(A.sizes().begin(), A.sizes().end() - 2), bb(B.sizes().begin(), B.sizes().end() - 2);
    batch = broadcast_shapes(ba, bb, "matmul");
    Shape sa = batch, sb = batch;
    sa.insert(sa.end(), {n, ka});
    sb.insert(sb.end(), {ka, m});
    const int64_t nb = shape_numel(batch);
    Tensor A3 = raw::reshape(raw::expand(A, sa), {nb, n, ka});
    Tensor B3 = raw::reshape(raw::expand(B, sb), {nb, ka, m});
    Tensor o3 = empty({nb, n, m}, {a.dtype(), dev});
    MG_KERNEL(dev, bmm, A3, B3, o3);
    Shape s = batch;
    s.insert(s.end(), {n, m});
    out = raw::view(o3, s);
  }
  if (a.dim() == 1) out = raw::squeeze(out, -2);
  if (b.dim() == 1) out = raw::squeeze(out, -1);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const Device dev = check_device("linear", {&x, &w, bias.defined() ? &bias : nullptr});
  check_matmul_dtypes("linear", x, w);
  MG_CHECK(w.dim() == 2, ShapeError, "linear: weight must be 2-D [out, in], got ", shape_str(w.sizes()));
  MG_CHECK(x.dim() >= 1, ShapeError, "linear: input must have at least 1 dim, got ", shape_str(x.sizes()));
  MG_CHECK(x.size(-1) == w.size(1), ShapeError, "linear: input features ", x.size(-1), " (input ",
           shape_str(x.sizes()), ") do not match weight ", shape_str(w.sizes()));
  if (bias.defined()) {
    MG_CHECK(bias.dtype() == x.dtype(), DTypeError, "linear: bias dtype ", bias.dtype(), " differs from input ",
             x.dtype());
    MG_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), ShapeError, "linear: bias shape ", shape_str(bias.sizes()),
             " should be [", w.size(0), "]");
  }
  const int64_t rows = shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));
  Tensor x2 = raw::reshape(x, {rows, x.size(-1)});
  Tensor out = empty({x2.size(0), w.size(0)}, {x.dtype(), dev});
  MG_KERNEL(dev, linear, x2, w, bias, out);
  Shape s(x.sizes().begin(), x.sizes().end() - 1);
  s.push_back(w.size(0));
  return raw::view(out, s);
}

// ---------------------------------------------------------------- softmax family

static Tensor softmax_impl(const Tensor& a, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const Device dev = check_device(op, {&a});
  MG_CHECK(is_floating(a.dtype()), DTypeError, op, ": expected a floating tensor, got ", a.dtype());
  const int64_t d = wrap_dim(dim, a.dim(), op);
  Tensor out = empty(a.sizes(), {a.dtype(), dev});
  MG_KERNEL(dev, softmax, a, d, log, out);
  return out;
}

static Tensor softmax_backward_impl(const Tensor& grad, const Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  const Device dev = check_device(op, {&grad, &y});
  MG_CHECK(is_floating(y.dtype()), DTypeError, op, ": expected a floating tensor, got ", y.dtype());
  MG_CHECK(grad.sizes() == y.sizes(), ShapeError, op, ": grad shape ", shape_str(grad.sizes()),
           " does not match output shape ", shape_str(y.sizes()));
  const int64_t d = wrap_dim(dim, y.dim(), op);
  Tensor out = empty(y.sizes(), {y.dtype(), dev});
  MG_KERNEL(dev, softmax_backward, cast_to(grad, y.dtype()), y, d, log, out);
  return out;
}

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, true); }
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_backward_impl(grad, y, dim, false);
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_backward_impl(grad, y, dim, true);
}

// ---------------------------------------------------------------- indexing

namespace {
void check_index_dtype(const char* op, const Tensor& index) {
  MG_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32, DTypeError, op,
           ": index must be an integer (i64 or i32) tensor, got ", index.dtype());
}

// gather/scatter: index has self's rank, and index.size(d) <= self.size(d) for d != dim
// (and <= src.size(d) for every d when src is given).
void check_scatter_shapes(const char* op, const Tensor& self, int64_t dim, const Tensor& index, const Tensor* src) {
  MG_CHECK(index.dim() == self.dim(), ShapeError, op, ": index ", shape_str(index.sizes()),
           " must have as many dims as the input ", shape_str(self.sizes()));
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (d != dim)
      MG_CHECK(index.size(d) <= self.size(d), ShapeError, op, ": index ", shape_str(index.sizes()),
               " is larger than the input ", shape_str(self.sizes()), " in dim ", d);
    if (src)
      MG_CHECK(index.size(d) <= src->size(d), ShapeError, op, ": index ", shape_str(index.sizes()),
               " is larger than src ", shape_str(src->sizes()), " in dim ", d);
  }
}
}  // namespace

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  const Device dev = check_device("one_hot", {&indices});
  check_index_dtype("one_hot", indices);
  MG_CHECK(num_classes >= 0, ValueError, "one_hot: num_classes must be non-negative, got ", num_classes);
  Shape s = indices.sizes();
  s.push_back(num_classes);
  Tensor out = empty(s, {DType::i64, dev});
  MG_KERNEL(dev, one_hot, indices, num_classes, out);
  return out;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  const Device dev = check_device("gather", {&a, &index});
  check_index_dtype("gather", index);
  const int64_t d = wrap_dim(dim, a.dim(), "gather");
  check_scatter_shapes("gather", a, d, index, nullptr);
  Tensor out = empty(index.sizes(), {a.dtype(), dev});
  MG_KERNEL(dev, gather, a, d, index, out);
  return out;
}

static void scatter_impl(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add) {
  const char* op = add ? "scatter_add_" : "scatter_";
  const Device dev = check_device(op, {&self, &index, &src});
  check_index_dtype(op, index);
  MG_CHECK(src.dtype() == self.dtype(), DTypeError, op, ": src dtype ", src.dtype(), " differs from self dtype ",
           self.dtype());
  const int64_t d = wrap_dim(dim, self.dim(), op);
  MG_CHECK(src.dim() == self.dim(), ShapeError, op, ": src ", shape_str(src.sizes()),
           " must have as many dims as self ", shape_str(self.sizes()));
  check_scatter_shapes(op, self, d, index, &src);
  MG_KERNEL(dev, scatter, self, d, index, src, add);
  self.bump_version();
}

void scatter_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  scatter_impl(self, dim, index, src, false);
}
void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  scatter_impl(self, dim, index, src, true);
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  const Device dev = check_device("index_select", {&a, &index});
  check_index_dtype("index_select", index);
  MG_CHECK(index.dim() <= 1, ShapeError, "index_select: index must be 0-D or 1-D, got ", shape_str(index.sizes()));
  const int64_t d = wrap_dim(dim, a.dim(), "index_select");
  Shape s = a.sizes();
  if (!s.empty()) s[d] = index.numel();
  Tensor out = empty(s, {a.dtype(), dev});
  MG_KERNEL(dev, index_select, a, d, index, out);
  return out;
}

void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const Device dev = check_device("index_add_", {&self, &index, &src});
  check_index_dtype("index_add_", index);
  MG_CHECK(index.dim() <= 1, ShapeError, "index_add_: index must be 0-D or 1-D, got ", shape_str(index.sizes()));
  MG_CHECK(src.dtype() == self.dtype(), DTypeError, "index_add_: src dtype ", src.dtype(),
           " differs from self dtype ", self.dtype());
  const int64_t d = wrap_dim(dim, self.dim(), "index_add_");
  Shape want = self.sizes();
  if (!want.empty()) want[d] = index.numel();
  MG_CHECK(src.sizes() == want, ShapeError, "index_add_: src shape ", shape_str(src.sizes()), " should be ",
           shape_str(want), " (self ", shape_str(self.sizes()), " with dim ", d, " of size ", index.numel(), ")");
  MG_KERNEL(dev, index_add, self, d, index, src);
  self.bump_version();
}

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  MG_CHECK(!ts.empty(), ValueError, "cat: expected a non-empty list of tensors");
  Device dev;
  DType dt = ts[0].dtype();
  const Tensor* ref = nullptr;  // first tensor that is not a legacy empty 1-D [0]
  for (size_t i = 0; i < ts.size(); ++i) {
    dev = check_device("cat", {&ts[0], &ts[i]});
    dt = promote_types(dt, ts[i].dtype());
    if (!ref && !(ts[i].dim() == 1 && ts[i].size(0) == 0)) ref = &ts[i];
  }
  if (!ref) return empty({0}, {dt, dev});
  MG_CHECK(ref->dim() > 0, ShapeError, "cat: zero-dimensional tensor cannot be concatenated");
  const int64_t d = wrap_dim(dim, ref->dim(), "cat");
  Shape s = ref->sizes();
  int64_t total = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    if (t.dim() == 1 && t.size(0) == 0) continue;
    MG_CHECK(t.dim() == ref->dim(), ShapeError, "cat: tensor ", i, " has ", t.dim(), " dims ", shape_str(t.sizes()),
             ", expected ", ref->dim(), " like ", shape_str(s));
    for (int64_t k = 0; k < t.dim(); ++k)
      MG_CHECK(k == d || t.size(k) == s[k], ShapeError, "cat: sizes must match except in dim ", d, ": tensor ", i,
               " has shape ", shape_str(t.sizes()), ", expected ", shape_str(s), " (dim ", k, ")");
    total += t.size(d);
  }
  s[d] = total;
  Tensor out = empty(s, {dt, dev});
  int64_t at = 0;
  for (const Tensor& t : ts) {
    if (t.dim() == 1 && t.size(0) == 0) continue;
    raw::copy_(raw::slice(out, d, at, at + t.size(d), 1), t);
    at += t.size(d);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  MG_CHECK(!ts.empty(), ValueError, "stack: expected a non-empty list of tensors");
  const int64_t d = wrap_dim(dim, ts[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    check_device("stack", {&ts[0], &ts[i]});
    MG_CHECK(ts[i].sizes() == ts[0].sizes(), ShapeError, "stack: all tensors must have the same shape: tensor 0 is ",
             shape_str(ts[0].sizes()), ", tensor ", i, " is ", shape_str(ts[i].sizes()));
    us.push_back(raw::unsqueeze(ts[i], d));
  }
  return cat(us, d);
}

// ---------------------------------------------------------------- losses

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index) {
  const Device dev = check_device("nll_loss_forward", {&log_probs, &target});
  MG_CHECK(is_floating(log_probs.dtype()), DTypeError, "nll_loss_forward: log_probs must be floating, got ",
           log_probs.dtype());
  MG_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, DTypeError,
           "nll_loss_forward: target must hold class indices (i64), got ", target.dtype(),
           " (one-hot or probability targets are not class indices)");
  MG_CHECK(log_probs.dim() >= 1, ShapeError, "nll_loss_forward: log_probs must be [C], [N, C] or [N, C, d1, ...], got ",
           shape_str(log_probs.sizes()));
  Shape want = log_probs.sizes();
  want.erase(want.begin() + (log_probs.dim() == 1 ? 0 : 1));
  MG_CHECK(target.sizes() == want, ShapeError, "nll_loss_forward: target shape ", shape_str(target.sizes()),
           " should be ", shape_str(want), " for log_probs ", shape_str(log_probs.sizes()));
  Tensor out = empty(want, {log_probs.dtype(), dev});
  MG_KERNEL(dev, nll_loss_forward, log_probs, target, ignore_index, out);
  return out;
}

}  // namespace mg::kernels
