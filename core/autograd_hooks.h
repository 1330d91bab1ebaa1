// The seam between core/ and autograd/: Tensor's differentiable methods call these hooks.
// Core's defaults do the raw, untracked thing; //autograd installs its recording version.
#pragma once

#include <memory>

#include "core/tensor.h"

namespace mg {

// One virtual per Tensor method whose meaning autograd changes (PyTorch's
// VariableHooksInterface). Checks live in core (the raw:: functions both sides call, and
// Tensor::narrow), so bad input names the op the same way with or without //autograd.
struct AutogradHooks {
  virtual ~AutogradHooks() = default;

  // A fresh autograd state for a tensor; `op` names the caller for the error raised by the
  // default, which has none to give.
  virtual std::shared_ptr<AutogradMetaInterface> make_meta(const char* op) const;
  virtual void backward(const Tensor& self, const Tensor& gradient, bool retain_graph) const;

  virtual Tensor view(const Tensor& self, const Shape& shape) const;
  virtual Tensor reshape(const Tensor& self, const Shape& shape) const;
  virtual Tensor permute(const Tensor& self, const Shape& dims) const;
  virtual Tensor transpose(const Tensor& self, int64_t d0, int64_t d1) const;
  virtual Tensor t(const Tensor& self) const;
  virtual Tensor unsqueeze(const Tensor& self, int64_t dim) const;
  virtual Tensor squeeze(const Tensor& self, int64_t dim) const;
  virtual Tensor squeeze(const Tensor& self) const;
  virtual Tensor flatten(const Tensor& self, int64_t start_dim, int64_t end_dim) const;
  virtual Tensor slice(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step) const;
  virtual Tensor select(const Tensor& self, int64_t dim, int64_t index) const;
  virtual Tensor expand(const Tensor& self, const Shape& shape) const;
  virtual Tensor contiguous(const Tensor& self) const;
  virtual Tensor contiguous(const Tensor& self, MemoryFormat fmt) const;
  virtual Tensor clone(const Tensor& self) const;
  virtual Tensor to(const Tensor& self, DType dtype) const;
  virtual Tensor to(const Tensor& self, Device device, bool non_blocking) const;

  // In place: each bumps self's version exactly once.
  virtual void copy_(const Tensor& self, const Tensor& src) const;
  virtual void fill_(const Tensor& self, double value) const;
  virtual void zero_(const Tensor& self) const;
};

// The installed hooks: core's defaults until set_autograd_hooks is called.
const AutogradHooks& autograd_hooks();
// Called once, during static initialization, by //autograd (an alwayslink library, so the
// call is linked into every binary that depends on it). `hooks` must outlive the program.
void set_autograd_hooks(const AutogradHooks* hooks);

}  // namespace mg
