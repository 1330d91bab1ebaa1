// Checks, type promotion, broadcasting and dispatch for the elementwise ops of
// kernels/elementwise.h; the loops are in cpu/elementwise.cc and cuda/elementwise.cu.
#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "core/random.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {
namespace {

bool is_comparison(Binary op) { return op >= Binary::Eq && op <= Binary::Ge; }
bool is_backward(Binary op) { return op >= Binary::ReluBackward; }

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
  const char* name = op_name(op);
  const Device dev = check_device(name, {&a});
  if (op == Unary::LogicalNot) return binary(Binary::Eq, a, zeros({}, {a.dtype(), dev}));
  MG_CHECK(!(op == Unary::Neg && a.dtype() == DType::b8), DTypeError, name,
           ": negation of a bool tensor is not supported (use logical_not)");
  Tensor x = a;
  if (unary_float_only(op) && !is_floating(a.dtype())) x = raw::to_dtype(a, DType::f32);
  Tensor out = empty(x.sizes(), {x.dtype(), dev}, result_memory_format(x.sizes(), {&x}));
  backend(dev, "unary").unary(op, x, out);
  return out;
}

void unary_(Unary op, const Tensor& a) {
  const char* name = op_name(op);
  check_device(name, {&a});
  MG_CHECK(!unary_float_only(op) || is_floating(a.dtype()), DTypeError, name,
           "_: in-place op needs a floating tensor (its result is floating), got ", a.dtype());
  MG_CHECK(!(op == Unary::Neg && a.dtype() == DType::b8), DTypeError, name,
           ": negation of a bool tensor is not supported (use logical_not)");
  if (op == Unary::LogicalNot) {
    binary_(Binary::Eq, a, zeros({}, {a.dtype(), a.device()}));
    return;
  }
  backend(a.device(), "unary").unary(op, a, a);
  a.bump_version();
}

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  const Device dev = check_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  DType ct = result_type(a, b);
  if (is_backward(op)) {
    MG_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), DTypeError, name, ": expected floating tensors, got ",
             a.dtype(), " and ", b.dtype());
    ct = promote_types(a.dtype(), b.dtype());
  }
  if (op == Binary::Div && !is_floating(ct)) ct = DType::f32;  // true division
  Tensor out = empty(shape, {is_comparison(op) ? DType::b8 : ct, dev}, result_memory_format(shape, {&a, &b}));
  backend(dev, "binary").binary(op, bcast(cast_to(a, ct), shape), bcast(cast_to(b, ct), shape), out);
  return out;
}

void binary_(Binary op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
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
    backend(a.device(), "binary").binary(op, a, bcast(cast_to(b, a.dtype()), shape), a);
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
  Tensor out = empty(a.sizes(), {a.dtype(), dev}, result_memory_format(a.sizes(), {&a}));
  backend(dev, "clamp").clamp(a, lo, hi, out);
  return out;
}

Tensor clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi) {
  const Device dev = check_device("clamp_backward", {&grad, &x});
  MG_CHECK(grad.sizes() == x.sizes(), ShapeError, "clamp_backward: grad shape ", shape_str(grad.sizes()),
           " does not match input shape ", shape_str(x.sizes()));
  Tensor out = empty(grad.sizes(), {grad.dtype(), dev}, result_memory_format(grad.sizes(), {&grad, &x}));
  backend(dev, "clamp_backward").clamp_backward(grad, cast_to(x, grad.dtype()), lo, hi, out);
  return out;
}

Tensor axpby(const Tensor& a, double alpha, const Tensor& b, double beta) {
  const Device dev = check_device("axpby", {&a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "axpby");
  const DType ct = result_type(a, b);
  Tensor out = empty(shape, {ct, dev}, result_memory_format(shape, {&a, &b}));
  backend(dev, "axpby").axpby(bcast(cast_to(a, ct), shape), alpha, bcast(cast_to(b, ct), shape), beta, out);
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
    backend(a.device(), "axpby").axpby(a, alpha, bcast(cast_to(b, a.dtype()), shape), beta, a);
  }
  a.bump_version();
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Device dev = check_device("where", {&cond, &a, &b});
  MG_CHECK(cond.dtype() == DType::b8, DTypeError, "where: condition must be a bool (b8) tensor, got ", cond.dtype());
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  const DType ct = result_type(a, b);
  Tensor out = empty(shape, {ct, dev}, result_memory_format(shape, {&a, &b, &cond}));
  backend(dev, "where").where(bcast(cond, shape), bcast(cast_to(a, ct), shape), bcast(cast_to(b, ct), shape), out);
  return out;
}

// ---------------------------------------------------------------- bias + dropout + residual

namespace {
// The dtype pairs the fused dropout takes: one dtype, or an f32 residual / gradient with an
// f16/bf16 branch.
bool dropout_dtypes_ok(DType wide, DType branch) {
  return wide == branch || (wide == DType::f32 && (branch == DType::f16 || branch == DType::bf16));
}
void check_dropout_p(const char* op, double p) {
  MG_CHECK(p >= 0.0 && p < 1.0, ValueError, op, ": dropout probability p must be in [0, 1), got ", p);
}
}  // namespace

std::pair<Tensor, Tensor> bias_dropout_add(const Tensor& x, const Tensor& branch, const Tensor& bias, double p,
                                           Generator* gen) {
  const char* op = "bias_dropout_add";
  check_dropout_p(op, p);
  MG_CHECK(branch.defined(), ValueError, op, ": branch is an undefined tensor");
  const Device dev = one_device(op, {&x, &branch, &bias}, true);
  MG_CHECK(is_floating(branch.dtype()), DTypeError, op, ": branch must be floating, got ", branch.dtype());
  MG_CHECK(branch.dim() >= 1, ShapeError, op, ": branch must have at least one dim, got shape ",
           shape_str(branch.sizes()));
  const int64_t n = branch.size(-1);
  if (bias.defined()) {
    MG_CHECK(bias.dim() == 1 && bias.size(0) == n, ShapeError, op, ": bias must be [", n,
             "] (branch's last dim), got shape ", shape_str(bias.sizes()));
    MG_CHECK(bias.dtype() == branch.dtype(), DTypeError, op, ": bias dtype ", bias.dtype(), " differs from branch's ",
             branch.dtype());
  }
  DType out_dtype = branch.dtype();
  if (x.defined()) {
    MG_CHECK(x.sizes() == branch.sizes(), ShapeError, op, ": residual shape ", shape_str(x.sizes()),
             " differs from branch shape ", shape_str(branch.sizes()));
    MG_CHECK(dropout_dtypes_ok(x.dtype(), branch.dtype()), DTypeError, op, ": residual dtype ", x.dtype(),
             " with branch dtype ", branch.dtype(), " (expected one dtype, or an f32 residual with f16/bf16)");
    out_dtype = x.dtype();
  }
  Tensor out = empty(branch.sizes(), {out_dtype, dev});
  Tensor keep = empty(branch.sizes(), {DType::b8, dev});
  DropoutDraw d;
  const uint64_t count = static_cast<uint64_t>(branch.numel());
  const PhiloxDraw pd = reserve_philox(gen, (count + 3) / 4, dev);  // bernoulli_'s blocks for as many elements
  d.seed = pd.seed;
  d.base = pd.base;
  d.device_offset = pd.device_offset;
  // (r >> 8) / 2^24 < q  <=>  (r >> 8) < ceil(q * 2^24) for the integer r >> 8 (q * 2^24 exact).
  const double q = 1.0 - p;
  d.keep_below = static_cast<uint32_t>(std::ceil(q * 16777216.0));
  d.scale = 1.0 / q;
  if (branch.numel() == 0) return {out, keep};
  backend(dev, op).bias_dropout_add(x.defined() ? x.contiguous() : x, branch.contiguous(),
                                    bias.defined() ? bias.contiguous() : bias, d, out, keep);
  return {out, keep};
}

Tensor dropout_backward(const Tensor& grad, const Tensor& keep, double p, std::optional<DType> out_dtype) {
  const char* op = "dropout_backward";
  check_dropout_p(op, p);
  const Device dev = check_device(op, {&grad, &keep});
  MG_CHECK(is_floating(grad.dtype()), DTypeError, op, ": grad must be floating, got ", grad.dtype());
  MG_CHECK(keep.dtype() == DType::b8, DTypeError, op, ": mask must be b8, got ", keep.dtype());
  MG_CHECK(grad.sizes() == keep.sizes(), ShapeError, op, ": grad shape ", shape_str(grad.sizes()),
           " differs from mask shape ", shape_str(keep.sizes()));
  const DType od = out_dtype.value_or(grad.dtype());
  MG_CHECK(dropout_dtypes_ok(grad.dtype(), od), DTypeError, op, ": output dtype ", od, " from grad dtype ",
           grad.dtype(), " (expected grad's, or f16/bf16 from f32)");
  Tensor out = empty(grad.sizes(), {od, dev});
  if (grad.numel() == 0) return out;
  backend(dev, op).dropout_backward(grad.contiguous(), keep.contiguous(), 1.0 / (1.0 - p), out);
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
  // Cross-device copies go through core's CUDA hooks: a build without CUDA kernels says so here.
  for (const Tensor* t : {&dst, &src})
    if (!has_backend(t->device())) backend(t->device(), "copy_");
  raw::copy_(dst, src);
  dst.bump_version();
}

}  // namespace mg::kernels
