// Checks, batching and dispatch for kernels/linalg.h; Eigen in cpu/linalg.cc, cuBLAS in
// cuda/linalg.cc.
#include "kernels/linalg.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {
// ---------------------------------------------------------------- linear algebra

namespace {
void check_matmul_dtypes(const char* op, const Tensor& a, const Tensor& b) {
  MG_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": dtypes differ: ", a.dtype(), " and ", b.dtype());
  MG_CHECK(is_floating(a.dtype()), DTypeError, op, ": expected floating tensors, got ", a.dtype());
}
}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha, double beta) {
  const Device dev = check_device("gemm", {&a, &b, &out});
  check_matmul_dtypes("gemm", a, b);
  // A widening GEMM (f16/bf16 inputs, f32 output) keeps an f32 accumulator across calls.
  const bool widening = out.dtype() == DType::f32 && (a.dtype() == DType::f16 || a.dtype() == DType::bf16);
  MG_CHECK(out.dtype() == a.dtype() || widening, DTypeError, "gemm: output dtype ", out.dtype(),
           " differs from inputs' ", a.dtype(), " (only f16/bf16 inputs may write an f32 output)");
  MG_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, ShapeError, "gemm: expected 2-D tensors, got ",
           shape_str(a.sizes()), ", ", shape_str(b.sizes()), " and out ", shape_str(out.sizes()));
  const int64_t n = trans_a ? a.size(1) : a.size(0), ka = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0), m = trans_b ? b.size(0) : b.size(1);
  MG_CHECK(ka == kb, ShapeError, "gemm: inner dimensions differ: ", shape_str(a.sizes()), (trans_a ? "^T" : ""), " @ ",
           shape_str(b.sizes()), (trans_b ? "^T" : ""));
  MG_CHECK(out.size(0) == n && out.size(1) == m, ShapeError, "gemm: output shape ", shape_str(out.sizes()),
           " should be ", shape_str({n, m}));
  backend(dev, "gemm").gemm(a, trans_a, b, trans_b, out, alpha, beta);
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
  backend(dev, "bmm").bmm(a, b, out);
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
    backend(dev, "gemm").gemm(A, false, B, false, out, 1.0, 0.0);
  } else if (B.dim() == 2) {
    // [..., n, k] @ [k, m]: fold the batch into rows, one GEMM.
    batch.assign(A.sizes().begin(), A.sizes().end() - 2);
    Tensor A2 = raw::reshape(A, {shape_numel(batch) * n, ka});
    Tensor o2 = empty({A2.size(0), m}, {a.dtype(), dev});
    backend(dev, "gemm").gemm(A2, false, B, false, o2, 1.0, 0.0);
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
    backend(dev, "bmm").bmm(A3, B3, o3);
    Shape s = batch;
    s.insert(s.end(), {n, m});
    out = raw::view(o3, s);
  }
  if (a.dim() == 1) out = raw::squeeze(out, -2);
  if (b.dim() == 1) out = raw::squeeze(out, -1);
  return out;
}

namespace {
// The product of all but the last dim (a reshape to [-1, 0] would be ambiguous).
int64_t leading_rows(const Tensor& t) { return shape_numel(Shape(t.sizes().begin(), t.sizes().end() - 1)); }

// linear's checks (op names the caller); returns the output shape, x's leading dims + [out].
Shape check_linear(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_device(op, {&x, &w, bias.defined() ? &bias : nullptr});
  check_matmul_dtypes(op, x, w);
  MG_CHECK(w.dim() == 2, ShapeError, op, ": weight must be 2-D [out, in], got ", shape_str(w.sizes()));
  MG_CHECK(x.dim() >= 1, ShapeError, op, ": input must have at least 1 dim, got ", shape_str(x.sizes()));
  MG_CHECK(x.size(-1) == w.size(1), ShapeError, op, ": input features ", x.size(-1), " (input ", shape_str(x.sizes()),
           ") do not match weight ", shape_str(w.sizes()));
  if (bias.defined()) {
    MG_CHECK(bias.dtype() == x.dtype(), DTypeError, op, ": bias dtype ", bias.dtype(), " differs from input ",
             x.dtype());
    MG_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), ShapeError, op, ": bias shape ", shape_str(bias.sizes()),
             " should be [", w.size(0), "]");
  }
  Shape s(x.sizes().begin(), x.sizes().end() - 1);
  s.push_back(w.size(0));
  return s;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const Shape s = check_linear("linear", x, w, bias);
  const Device dev = x.device();
  Tensor x2 = raw::reshape(x, {leading_rows(x), x.size(-1)});
  Tensor out = empty({x2.size(0), w.size(0)}, {x.dtype(), dev});
  backend(dev, "linear").linear(x2, w, bias, out);
  return raw::view(out, s);
}

std::pair<Tensor, Tensor> linear_weight_grads(const Tensor& g, const Tensor& x, bool want_bias) {
  return linear_weight_grads(g, x, want_bias, x.dtype());
}

std::pair<Tensor, Tensor> linear_weight_grads(const Tensor& g, const Tensor& x, bool want_bias, DType grad_dtype) {
  const Device dev = check_device("linear_weight_grads", {&g, &x});
  check_matmul_dtypes("linear_weight_grads", g, x);
  MG_CHECK(g.dim() == 2 && x.dim() == 2 && g.size(0) == x.size(0), ShapeError,
           "linear_weight_grads: expected g [rows, out] and x [rows, in], got ", shape_str(g.sizes()), " and ",
           shape_str(x.sizes()));
  const bool wider = grad_dtype != x.dtype();
  MG_CHECK(!wider || (grad_dtype == DType::f32 && (x.dtype() == DType::f16 || x.dtype() == DType::bf16)), DTypeError,
           "linear_weight_grads: gradients in ", dtype_name(grad_dtype), " from ", dtype_name(x.dtype()),
           " operands (only f32 from f16 or bf16, or the operands' own dtype)");
  const Tensor gc = raw::contiguous(g), xc = raw::contiguous(x);
  Backend& be = backend(dev, "linear_weight_grads");
  Tensor gw = empty({g.size(1), x.size(1)}, {grad_dtype, dev});
  Tensor gb = want_bias ? empty({g.size(1)}, {grad_dtype, dev}) : Tensor();
  if ((want_bias || wider) && be.fused_linear_weight_grads(gc, xc, gw, gb)) return {gw, gb};
  be.gemm(gc, true, xc, false, gw, 1.0, 0.0);  // a widening GEMM when gw is f32
  if (want_bias) gb = raw::to_dtype(sum(gc, {0}), grad_dtype);
  return {gw, gb};
}

std::pair<Tensor, Tensor> linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const Shape s = check_linear("linear_gelu", x, w, bias);
  const Device dev = x.device();
  const Tensor x2 = raw::contiguous(raw::reshape(x, {leading_rows(x), x.size(-1)})), wc = raw::contiguous(w);
  Tensor pre = empty({x2.size(0), w.size(0)}, {x.dtype(), dev});
  Tensor out = empty({x2.size(0), w.size(0)}, {x.dtype(), dev});
  const Tensor b = bias.defined() ? raw::contiguous(bias) : bias;
  Backend& be = backend(dev, "linear_gelu");
  if (!be.fused_linear_gelu(x2, wc, b, out, pre)) {  // the same buffers, linear then the GELU kernel
    be.linear(x2, wc, b, pre);
    be.unary(Unary::GeluTanh, pre, out);
  }
  return {raw::view(out, s), raw::view(pre, s)};
}

Tensor matmul_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre) {
  const char* op = "matmul_gelu_backward";
  const Device dev = check_device(op, {&g, &w, &pre});
  check_matmul_dtypes(op, g, w);
  check_matmul_dtypes(op, g, pre);
  MG_CHECK(w.dim() == 2 && g.dim() >= 1 && g.size(-1) == w.size(0) && pre.dim() >= 1 && pre.size(-1) == w.size(1) &&
               leading_rows(g) == leading_rows(pre),
           ShapeError, op, ": expected g [rows, k], w [k, n] and pre [rows, n], got ", shape_str(g.sizes()), ", ",
           shape_str(w.sizes()), " and ", shape_str(pre.sizes()));
  const int64_t rows = leading_rows(g), n = w.size(1);
  const Tensor g2 = raw::contiguous(raw::reshape(g, {rows, g.size(-1)})), wc = raw::contiguous(w);
  const Tensor p2 = raw::contiguous(raw::reshape(pre, {rows, n}));
  Tensor g_pre = empty({rows, n}, {pre.dtype(), dev});
  Backend& be = backend(dev, op);
  if (!be.fused_matmul_gelu_backward(g2, wc, p2, g_pre)) {  // the GEMM into g_pre, then gelu' in place
    be.gemm(g2, false, wc, false, g_pre, 1.0, 0.0);
    be.binary(Binary::GeluTanhBackward, g_pre, p2, g_pre);
  }
  return raw::view(g_pre, pre.sizes());
}

}  // namespace mg::kernels
