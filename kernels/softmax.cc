// Checks and dispatch for kernels/softmax.h; the row loops are in cpu/softmax.cc and
// cuda/softmax.cu.
#include "kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {
// ---------------------------------------------------------------- softmax family

static Tensor softmax_impl(const Tensor& a, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const Device dev = check_device(op, {&a});
  MG_CHECK(is_floating(a.dtype()), DTypeError, op, ": expected a floating tensor, got ", a.dtype());
  const int64_t d = wrap_dim(dim, a.dim(), op);
  Tensor out = empty(a.sizes(), {a.dtype(), dev});
  backend(dev, "softmax").softmax(a, d, log, out);
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
  backend(dev, "softmax_backward").softmax_backward(cast_to(grad, y.dtype()), y, d, log, out);
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

}  // namespace mg::kernels
