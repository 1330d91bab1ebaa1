// Checks and dispatch for kernels/index.h (one_hot, gather, scatter, index_select,
// index_add, cat, stack); the loops are in cpu/index.cc and cuda/index.cu.
#include "kernels/index.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {
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
  backend(dev, "one_hot").one_hot(indices, num_classes, out);
  return out;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  const Device dev = check_device("gather", {&a, &index});
  check_index_dtype("gather", index);
  const int64_t d = wrap_dim(dim, a.dim(), "gather");
  check_scatter_shapes("gather", a, d, index, nullptr);
  Tensor out = empty(index.sizes(), {a.dtype(), dev});
  backend(dev, "gather").gather(a, d, index, out);
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
  backend(dev, "scatter").scatter(self, d, index, src, add);
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
  backend(dev, "index_select").index_select(a, d, index, out);
  return out;
}

void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, IndexBounds bounds) {
  const Device dev = check_device("index_add_", {&self, &index, &src});
  check_index_dtype("index_add_", index);
  MG_CHECK(index.dim() <= 1, ShapeError, "index_add_: index must be 0-D or 1-D, got ", shape_str(index.sizes()));
  MG_CHECK(src.dtype() == self.dtype(), DTypeError, "index_add_: src dtype ", src.dtype(), " differs from self dtype ",
           self.dtype());
  const int64_t d = wrap_dim(dim, self.dim(), "index_add_");
  Shape want = self.sizes();
  if (!want.empty()) want[d] = index.numel();
  MG_CHECK(src.sizes() == want, ShapeError, "index_add_: src shape ", shape_str(src.sizes()), " should be ",
           shape_str(want), " (self ", shape_str(self.sizes()), " with dim ", d, " of size ", index.numel(), ")");
  backend(dev, "index_add").index_add(self, d, index, src, bounds == IndexBounds::Checked);
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

}  // namespace mg::kernels
