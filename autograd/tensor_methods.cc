// Tensor's differentiable views and conversions, its in-place copy_/fill_/zero_, and
// backward(). Each view is a raw:: view plus a node whose backward undoes the shape change.
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "kernels/ops.h"

namespace mg {

using autograd::record;
using autograd::SavedTensor;
using Grads = std::vector<Tensor>;

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

namespace {
// The backward of every pure reshaping view: put the gradient back in the input's shape.
Tensor reshaping_view(const char* op, const Tensor& self, const Tensor& out) {
  record(op, {self}, out, [in_shape = self.sizes()](const Grads& g) { return Grads{raw::reshape(g[0], in_shape)}; });
  return out;
}

// The backward of slice/select/narrow: zeros of the input's shape with the gradient written
// into the same view of it.
template <class MakeView>
Tensor strided_view(const char* op, const Tensor& self, const Tensor& out, MakeView make_view) {
  record(op, {self}, out, [in_shape = self.sizes(), make_view](const Grads& g) {
    Tensor z = zeros(in_shape, {g[0].dtype(), g[0].device()});
    raw::copy_(make_view(z), g[0]);
    return Grads{z};
  });
  return out;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const { return reshaping_view("view", *this, raw::view(*this, shape)); }

Tensor Tensor::reshape(const Shape& shape) const {
  return reshaping_view("reshape", *this, raw::reshape(*this, shape));
}

Tensor Tensor::permute(const Shape& dims) const {
  Tensor out = raw::permute(*this, dims);  // validates dims
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[wrap_dim(dims[i], dim(), "permute")] = static_cast<int64_t>(i);
  record("permute", {*this}, out, [inverse](const Grads& g) { return Grads{raw::permute(g[0], inverse)}; });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Tensor out = raw::transpose(*this, d0, d1);
  record("transpose", {*this}, out, [d0, d1](const Grads& g) { return Grads{raw::transpose(g[0], d0, d1)}; });
  return out;
}

Tensor Tensor::t() const {
  MG_CHECK(dim() <= 2, ShapeError, "t: expects a tensor with <= 2 dims, got ", dim(), " dims of shape ",
           shape_str(sizes()), " (use transpose(d0, d1) or permute)");
  if (dim() < 2) return reshaping_view("t", *this, raw::as_strided(*this, sizes(), strides(), offset()));
  return transpose(0, 1);
}

Tensor Tensor::unsqueeze(int64_t d) const { return reshaping_view("unsqueeze", *this, raw::unsqueeze(*this, d)); }
Tensor Tensor::squeeze(int64_t d) const { return reshaping_view("squeeze", *this, raw::squeeze(*this, d)); }

Tensor Tensor::squeeze() const {
  Shape sizes_out, strides_out;
  for (int64_t i = 0; i < dim(); ++i)
    if (sizes()[i] != 1) {
      sizes_out.push_back(sizes()[i]);
      strides_out.push_back(strides()[i]);
    }
  return reshaping_view("squeeze", *this, raw::as_strided(*this, sizes_out, strides_out, offset()));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshaping_view("flatten", *this, raw::reshape(*this, {1}));
  const int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  MG_CHECK(s <= e, ValueError, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for shape ",
           shape_str(sizes()));
  Shape shape(sizes().begin(), sizes().begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= sizes()[i];
  shape.push_back(n);
  shape.insert(shape.end(), sizes().begin() + e + 1, sizes().end());
  return reshaping_view("flatten", *this, raw::reshape(*this, shape));
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  MG_CHECK(dim() > 0, ShapeError, "narrow: cannot narrow a 0-dim tensor");
  d = wrap_dim(d, dim(), "narrow");
  const int64_t n = sizes()[d];
  MG_CHECK(start >= -n && start <= n, IndexError, "narrow: start ", start, " out of range for dim ", d, " of size ", n);
  if (start < 0) start += n;
  MG_CHECK(length >= 0, ValueError, "narrow: length must be non-negative, got ", length);
  MG_CHECK(start + length <= n, IndexError, "narrow: start (", start, ") + length (", length,
           ") exceeds dim ", d, " of size ", n);
  return slice(d, start, start + length, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  Tensor out = raw::slice(*this, d, start, end, step);
  return strided_view("slice", *this, out, [d, start, end, step](const Tensor& z) { return raw::slice(z, d, start, end, step); });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  Tensor out = raw::select(*this, d, index);
  return strided_view("select", *this, out, [d, index](const Tensor& z) { return raw::select(z, d, index); });
}

Tensor Tensor::expand(const Shape& shape) const {
  Tensor out = raw::expand(*this, shape);
  record("expand", {*this}, out, [in_shape = sizes()](const Grads& g) { return Grads{kernels::sum_to(g[0], in_shape)}; });
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;  // like PyTorch: the same tensor, no node
  Tensor out = raw::clone(*this);
  record("contiguous", {*this}, out, [](const Grads& g) { return Grads{g[0]}; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = raw::clone(*this);
  record("clone", {*this}, out, [](const Grads& g) { return Grads{g[0]}; });
  return out;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = raw::to_dtype(*this, dt);
  record("to", {*this}, out, [from = dtype()](const Grads& g) { return Grads{kernels::cast(g[0], from)}; });
  return out;
}

Tensor Tensor::to(Device dev, bool non_blocking) const {
  if (dev == device()) return *this;
  Tensor out = raw::to_device(*this, dev, non_blocking);
  record("to", {*this}, out, [from = device()](const Grads& g) { return Grads{raw::to_device(g[0], from)}; });
  return out;
}

// ---- in-place ----

Tensor& Tensor::copy_(const Tensor& src) {
  MG_CHECK(defined() && src.defined(), ValueError, "copy_: undefined tensor");
  autograd::inplace_update(*this, "copy_", [&] { raw::copy_(*this, src); });
  // The old values are gone: no gradient flows to self's previous history.
  autograd::record_inplace("copy_", *this, {src},
                           [ss = src.sizes(), sd = src.dtype(), sdev = src.device()](const Grads& g) {
                             Tensor gs = autograd::reduce_grad(g[0], ss, sd);
                             if (gs.device() != sdev) gs = raw::to_device(gs, sdev);
                             return Grads{Tensor(), gs};
                           });
  return *this;
}

Tensor& Tensor::fill_(double value) {
  autograd::inplace_update(*this, "fill_", [&] { raw::fill_(*this, value); });
  autograd::record_inplace("fill_", *this, {}, [](const Grads&) { return Grads{Tensor()}; });
  return *this;
}

Tensor& Tensor::zero_() {
  autograd::inplace_update(*this, "zero_", [&] { raw::fill_(*this, 0.0); });
  autograd::record_inplace("zero_", *this, {}, [](const Grads&) { return Grads{Tensor()}; });
  return *this;
}

// ---- free-function forms ----

Tensor reshape(const Tensor& a, const Shape& shape) { return a.reshape(shape); }
Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) { return a.flatten(start_dim, end_dim); }
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) { return a.transpose(d0, d1); }
Tensor permute(const Tensor& a, const Shape& dims) { return a.permute(dims); }
Tensor& fill_(Tensor& a, double v) { return a.fill_(v); }
Tensor& zero_(Tensor& a) { return a.zero_(); }

}  // namespace mg
