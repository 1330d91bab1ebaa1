// Tensor's differentiable views and conversions, its in-place copy_/fill_/zero_, and
// backward(): the AutogradHooks that core's Tensor methods dispatch to once //autograd is
// linked. Each view is a raw:: view plus a node whose backward undoes the shape change.
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/autograd_hooks.h"
#include "kernels/ops.h"

namespace mg {

using autograd::record;
using Grads = std::vector<Tensor>;

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

struct DifferentiableHooks final : AutogradHooks {
  std::shared_ptr<AutogradMetaInterface> make_meta(const char*) const override {
    return std::make_shared<autograd::AutogradMeta>();
  }

  void backward(const Tensor& self, const Tensor& gradient, bool retain_graph) const override {
    autograd::backward({self}, {gradient}, retain_graph);
  }

  Tensor view(const Tensor& self, const Shape& shape) const override {
    return reshaping_view("view", self, raw::view(self, shape));
  }
  Tensor reshape(const Tensor& self, const Shape& shape) const override {
    return reshaping_view("reshape", self, raw::reshape(self, shape));
  }
  Tensor unsqueeze(const Tensor& self, int64_t d) const override {
    return reshaping_view("unsqueeze", self, raw::unsqueeze(self, d));
  }
  Tensor squeeze(const Tensor& self, int64_t d) const override {
    return reshaping_view("squeeze", self, raw::squeeze(self, d));
  }
  Tensor squeeze(const Tensor& self) const override { return reshaping_view("squeeze", self, raw::squeeze(self)); }
  Tensor flatten(const Tensor& self, int64_t start_dim, int64_t end_dim) const override {
    return reshaping_view("flatten", self, raw::flatten(self, start_dim, end_dim));
  }

  Tensor permute(const Tensor& self, const Shape& dims) const override {
    Tensor out = raw::permute(self, dims);  // validates dims
    Shape inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
      inverse[wrap_dim(dims[i], self.dim(), "permute")] = static_cast<int64_t>(i);
    record("permute", {self}, out, [inverse](const Grads& g) { return Grads{raw::permute(g[0], inverse)}; });
    return out;
  }

  Tensor transpose(const Tensor& self, int64_t d0, int64_t d1) const override {
    Tensor out = raw::transpose(self, d0, d1);
    record("transpose", {self}, out, [d0, d1](const Grads& g) { return Grads{raw::transpose(g[0], d0, d1)}; });
    return out;
  }

  Tensor t(const Tensor& self) const override {
    Tensor out = raw::t(self);  // validates the rank
    if (self.dim() < 2) return reshaping_view("t", self, out);
    record("transpose", {self}, out, [](const Grads& g) { return Grads{raw::transpose(g[0], 0, 1)}; });
    return out;
  }

  Tensor slice(const Tensor& self, int64_t d, int64_t start, int64_t end, int64_t step) const override {
    Tensor out = raw::slice(self, d, start, end, step);
    return strided_view("slice", self, out,
                        [d, start, end, step](const Tensor& z) { return raw::slice(z, d, start, end, step); });
  }

  Tensor select(const Tensor& self, int64_t d, int64_t index) const override {
    Tensor out = raw::select(self, d, index);
    return strided_view("select", self, out, [d, index](const Tensor& z) { return raw::select(z, d, index); });
  }

  Tensor expand(const Tensor& self, const Shape& shape) const override {
    Tensor out = raw::expand(self, shape);
    record("expand", {self}, out,
           [in_shape = self.sizes()](const Grads& g) { return Grads{kernels::sum_to(g[0], in_shape)}; });
    return out;
  }

  Tensor contiguous(const Tensor& self) const override {
    if (self.is_contiguous()) return self;  // like PyTorch: the same tensor, no node
    Tensor out = raw::clone(self);
    record("contiguous", {self}, out, [](const Grads& g) { return Grads{g[0]}; });
    return out;
  }

  Tensor contiguous(const Tensor& self, MemoryFormat fmt) const override {
    Tensor out = raw::contiguous(self, fmt);
    if (out.is_same(self)) return self;
    record("contiguous", {self}, out, [](const Grads& g) { return Grads{g[0]}; });
    return out;
  }

  Tensor clone(const Tensor& self) const override {
    Tensor out = raw::clone(self);
    record("clone", {self}, out, [](const Grads& g) { return Grads{g[0]}; });
    return out;
  }

  Tensor to(const Tensor& self, DType dt) const override {
    if (dt == self.dtype()) return self;
    Tensor out = raw::to_dtype(self, dt);
    record("to", {self}, out, [from = self.dtype()](const Grads& g) { return Grads{kernels::cast(g[0], from)}; });
    autograd::accept_source_dtype_grads(out, self.dtype());
    return out;
  }

  Tensor to(const Tensor& self, Device dev, bool non_blocking) const override {
    if (dev == self.device()) return self;
    Tensor out = raw::to_device(self, dev, non_blocking);
    record("to", {self}, out, [from = self.device()](const Grads& g) { return Grads{raw::to_device(g[0], from)}; });
    return out;
  }

  void copy_(const Tensor& self, const Tensor& src) const override {
    autograd::inplace_update(self, "copy_", [&] { raw::copy_(self, src); });
    // The old values are gone: no gradient flows to self's previous history.
    autograd::record_inplace("copy_", self, {src},
                             // src's gradient: g, brought to src's shape, dtype and device by the engine.
                             [](const Grads& g) {
                               return Grads{Tensor(), g[0]};
                             });
  }

  void fill_(const Tensor& self, double value) const override { overwrite("fill_", self, value); }
  void zero_(const Tensor& self) const override { overwrite("zero_", self, 0.0); }

 private:
  // fill_/zero_: every element replaced by a constant, so self's old history gets no gradient.
  static void overwrite(const char* op, const Tensor& self, double value) {
    autograd::inplace_update(self, op, [&] { raw::fill_(self, value); });
    autograd::record_inplace(op, self, {}, [](const Grads&) { return Grads{Tensor()}; });
  }
};

// Installed during static initialization; //autograd is alwayslink, so this object file is
// in every binary that depends on it even when nothing references this symbol.
[[maybe_unused]] const bool kHooksInstalled = [] {
  static const DifferentiableHooks hooks;
  set_autograd_hooks(&hooks);
  return true;
}();

}  // namespace

// ---- free-function forms ----

Tensor reshape(const Tensor& a, const Shape& shape) { return a.reshape(shape); }
Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) { return a.flatten(start_dim, end_dim); }
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) { return a.transpose(d0, d1); }
Tensor permute(const Tensor& a, const Shape& dims) { return a.permute(dims); }
Tensor& fill_(Tensor& a, double v) { return a.fill_(v); }
Tensor& zero_(Tensor& a) { return a.zero_(); }

}  // namespace mg
