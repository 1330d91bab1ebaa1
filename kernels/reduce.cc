// Checks, output shapes and dispatch for the reductions of kernels/reduce.h; the loops are
// in cpu/reduce.cc and cuda/reduce.cu.
#include "kernels/reduce.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {
namespace {

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

// ---------------------------------------------------------------- reductions

namespace {
// sum over dims with the result written in `dtype` (a and dtype checked by the callers).
Tensor sum_as(const Tensor& a, Device dev, const std::vector<int64_t>& dims, bool keepdim, DType dtype) {
  std::vector<bool> mask;
  const Shape k = kept_shape(a, dims, "sum", &mask);
  Tensor out = empty(k, {dtype, dev});
  backend(dev, "sum").sum(a, out);
  return squeeze_reduced(out, a, mask, keepdim);
}
}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  const Device dev = check_device("sum", {&a});
  return sum_as(a, dev, dims, keepdim, is_floating(a.dtype()) ? a.dtype() : DType::i64);
}

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim, DType dtype) {
  const Device dev = check_device("sum", {&a});
  MG_CHECK(is_floating(a.dtype()), DTypeError, "sum with a result dtype: expected floating data, got ", a.dtype());
  const bool widen = (a.dtype() == DType::f16 || a.dtype() == DType::bf16) && dtype == DType::f32;
  MG_CHECK(dtype == a.dtype() || widen, DTypeError,
           "sum: the result's dtype must be the data's or f32 for f16/bf16 data, got ", dtype, " for ", a.dtype(),
           " data");
  return sum_as(a, dev, dims, keepdim, dtype);
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  const Device dev = check_device("mean", {&a});
  MG_CHECK(is_floating(a.dtype()), DTypeError, "mean: expected a floating tensor, got ", a.dtype(), " (cast it first)");
  std::vector<bool> mask;
  const Shape k = kept_shape(a, dims, "mean", &mask);
  Tensor out = empty(k, {a.dtype(), dev});
  backend(dev, "mean").mean(a, out);
  return squeeze_reduced(out, a, mask, keepdim);
}

Tensor var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const Device dev = check_device("var", {&a});
  MG_CHECK(is_floating(a.dtype()), DTypeError, "var: expected a floating tensor, got ", a.dtype());
  MG_CHECK(correction >= 0, ValueError, "var: correction must be non-negative, got ", correction);
  std::vector<bool> mask;
  const Shape k = kept_shape(a, dims, "var", &mask);
  Tensor out = empty(k, {a.dtype(), dev});
  backend(dev, "var").var(a, correction, out);
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
  backend(dev, "max_min").max_min(a, d, is_max, values, indices);
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
    MG_CHECK(shape[j] == g.size(i) || shape[j] == 1, ShapeError, "sum_to: cannot reduce shape ", shape_str(g.sizes()),
             " to ", shape_str(shape), " (dim ", i, ": ", g.size(i), " vs ", shape[j], ")");
    if (shape[j] == 1 && g.size(i) != 1) dims.push_back(i);
  }
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  r = cast_to(r, g.dtype());
  return raw::reshape(r, shape);
}

Tensor sum_squares(const Tensor& a) {
  const Device dev = check_device("sum_squares", {&a});
  Tensor out = empty({}, {a.dtype() == DType::f64 ? DType::f64 : DType::f32, dev});
  backend(dev, "sum_squares").sum_squares(a, out);
  return out;
}

bool has_nonfinite(const Tensor& a) {
  const Device dev = check_device("has_nonfinite", {&a});
  return backend(dev, "has_nonfinite").has_nonfinite(a);
}

}  // namespace mg::kernels
