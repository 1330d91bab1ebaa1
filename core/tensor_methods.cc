// Tensor's autograd-facing methods. Each forwards to the installed AutogradHooks, so //core
// alone gets the raw:: behaviour and a binary with //autograd gets the recorded one.
#include "core/autograd_hooks.h"

namespace mg {

namespace {
// Constant-initialized, so the defaults hold even for tensors made during static init.
constinit const AutogradHooks kRawHooks{};
constinit const AutogradHooks* g_hooks = &kRawHooks;

AutogradMetaInterface& meta_for(TensorImpl& impl, const char* op) {
  if (!impl.autograd) impl.autograd = autograd_hooks().make_meta(op);
  return *impl.autograd;
}

// The tensor itself once it is known to be defined, so each method below stays one call.
const Tensor& self(const Tensor& t, const char* method) {
  if (!t.defined()) [[unlikely]]
    throw_undefined_tensor(method);
  return t;
}

constexpr const char* kNotLinked =
    ": autograd is not linked into this binary (depend on //autograd to track gradients)";
}  // namespace

const AutogradHooks& autograd_hooks() { return *g_hooks; }

void set_autograd_hooks(const AutogradHooks* hooks) { g_hooks = hooks ? hooks : &kRawHooks; }

// ---------------- core's defaults: untracked ----------------

std::shared_ptr<AutogradMetaInterface> AutogradHooks::make_meta(const char* op) const {
  MG_THROW(AutogradError, op, kNotLinked);
}
void AutogradHooks::backward(const Tensor&, const Tensor&, bool) const {
  MG_THROW(AutogradError, "backward", kNotLinked);
}

Tensor AutogradHooks::view(const Tensor& self, const Shape& shape) const { return raw::view(self, shape); }
Tensor AutogradHooks::reshape(const Tensor& self, const Shape& shape) const { return raw::reshape(self, shape); }
Tensor AutogradHooks::permute(const Tensor& self, const Shape& dims) const { return raw::permute(self, dims); }
Tensor AutogradHooks::transpose(const Tensor& self, int64_t d0, int64_t d1) const {
  return raw::transpose(self, d0, d1);
}
Tensor AutogradHooks::t(const Tensor& self) const { return raw::t(self); }
Tensor AutogradHooks::unsqueeze(const Tensor& self, int64_t dim) const { return raw::unsqueeze(self, dim); }
Tensor AutogradHooks::squeeze(const Tensor& self, int64_t dim) const { return raw::squeeze(self, dim); }
Tensor AutogradHooks::squeeze(const Tensor& self) const { return raw::squeeze(self); }
Tensor AutogradHooks::flatten(const Tensor& self, int64_t start_dim, int64_t end_dim) const {
  return raw::flatten(self, start_dim, end_dim);
}
Tensor AutogradHooks::slice(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step) const {
  return raw::slice(self, dim, start, end, step);
}
Tensor AutogradHooks::select(const Tensor& self, int64_t dim, int64_t index) const {
  return raw::select(self, dim, index);
}
Tensor AutogradHooks::expand(const Tensor& self, const Shape& shape) const { return raw::expand(self, shape); }
Tensor AutogradHooks::contiguous(const Tensor& self) const { return raw::contiguous(self); }
Tensor AutogradHooks::contiguous(const Tensor& self, MemoryFormat fmt) const { return raw::contiguous(self, fmt); }
Tensor AutogradHooks::clone(const Tensor& self) const { return raw::clone(self); }
Tensor AutogradHooks::to(const Tensor& self, DType dtype) const { return raw::to_dtype(self, dtype); }
Tensor AutogradHooks::to(const Tensor& self, Device device, bool non_blocking) const {
  return raw::to_device(self, device, non_blocking);
}

void AutogradHooks::copy_(const Tensor& self, const Tensor& src) const {
  raw::copy_(self, src);
  self.bump_version();
}
void AutogradHooks::fill_(const Tensor& self, double value) const {
  raw::fill_(self, value);
  self.bump_version();
}
void AutogradHooks::zero_(const Tensor& self) const { fill_(self, 0.0); }

// ---------------- Tensor's methods ----------------

Tensor& Tensor::requires_grad_(bool on) {
  checked("requires_grad_");
  MG_CHECK(!on || is_floating(dtype()), AutogradError, "requires_grad_: only floating tensors can require grad, got ",
           dtype());
  MG_CHECK(
      is_leaf(), AutogradError,
      "requires_grad_: can only change requires_grad of leaf tensors (this one is the output of an op; use detach())");
  if (!on && !impl_->autograd) return *this;  // already off: no state needed
  meta_for(*impl_, "requires_grad_").set_requires_grad(on);
  return *this;
}

Tensor Tensor::grad() const {
  if (!checked("grad").autograd || !impl_->autograd->grad()) return Tensor();
  return Tensor(impl_->autograd->grad());
}

void Tensor::set_grad(const Tensor& g) const {
  checked("set_grad");
  if (g.defined()) {
    MG_CHECK(g.sizes() == sizes(), ShapeError, "set_grad: gradient shape ", shape_str(g.sizes()),
             " does not match tensor shape ", shape_str(sizes()));
    MG_CHECK(g.device() == device(), DeviceError, "set_grad: gradient on ", g.device(), ", tensor on ", device());
  } else if (!impl_->autograd) {
    return;  // clearing a .grad that was never set
  }
  meta_for(*impl_, "set_grad").set_grad(g.impl_ptr());
}

void Tensor::retain_grad() const { meta_for(checked("retain_grad"), "retain_grad").set_retains_grad(); }

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd_hooks().backward(self(*this, "backward"), gradient, retain_graph);
}

Tensor Tensor::view(const Shape& shape) const { return autograd_hooks().view(self(*this, "view"), shape); }
Tensor Tensor::reshape(const Shape& shape) const { return autograd_hooks().reshape(self(*this, "reshape"), shape); }
Tensor Tensor::permute(const Shape& dims) const { return autograd_hooks().permute(self(*this, "permute"), dims); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  return autograd_hooks().transpose(self(*this, "transpose"), d0, d1);
}
Tensor Tensor::t() const { return autograd_hooks().t(self(*this, "t")); }
Tensor Tensor::unsqueeze(int64_t d) const { return autograd_hooks().unsqueeze(self(*this, "unsqueeze"), d); }
Tensor Tensor::squeeze(int64_t d) const { return autograd_hooks().squeeze(self(*this, "squeeze"), d); }
Tensor Tensor::squeeze() const { return autograd_hooks().squeeze(self(*this, "squeeze")); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  return autograd_hooks().flatten(self(*this, "flatten"), start_dim, end_dim);
}
Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  return autograd_hooks().slice(self(*this, "slice"), d, start, end, step);
}
Tensor Tensor::select(int64_t d, int64_t index) const {
  return autograd_hooks().select(self(*this, "select"), d, index);
}
Tensor Tensor::expand(const Shape& shape) const { return autograd_hooks().expand(self(*this, "expand"), shape); }
Tensor Tensor::contiguous() const { return autograd_hooks().contiguous(self(*this, "contiguous")); }
Tensor Tensor::contiguous(MemoryFormat fmt) const {
  return autograd_hooks().contiguous(self(*this, "contiguous"), fmt);
}
Tensor Tensor::clone() const { return autograd_hooks().clone(self(*this, "clone")); }
Tensor Tensor::to(DType dt) const { return autograd_hooks().to(self(*this, "to"), dt); }
Tensor Tensor::to(Device dev, bool non_blocking) const {
  return autograd_hooks().to(self(*this, "to"), dev, non_blocking);
}

// narrow is slice with stricter bounds: checked here, recorded (if at all) as the slice.
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  checked("narrow");
  MG_CHECK(dim() > 0, ShapeError, "narrow: cannot narrow a 0-dim tensor");
  d = wrap_dim(d, dim(), "narrow");
  const int64_t n = sizes()[d];
  MG_CHECK(start >= -n && start <= n, IndexError, "narrow: start ", start, " out of range for dim ", d, " of size ", n);
  if (start < 0) start += n;
  MG_CHECK(length >= 0, ValueError, "narrow: length must be non-negative, got ", length);
  MG_CHECK(length <= n - start, IndexError, "narrow: start (", start, ") + length (", length, ") exceeds dim ", d,
           " of size ", n);
  return slice(d, start, start + length, 1);
}

Tensor& Tensor::copy_(const Tensor& src) {
  checked("copy_");
  MG_CHECK(src.defined(), ValueError, "copy_: the source is an undefined tensor");
  autograd_hooks().copy_(*this, src);
  return *this;
}
Tensor& Tensor::fill_(double value) {
  checked("fill_");
  autograd_hooks().fill_(*this, value);
  return *this;
}
Tensor& Tensor::zero_() {
  checked("zero_");
  autograd_hooks().zero_(*this);
  return *this;
}

}  // namespace mg
