// Helpers the dispatch files (kernels/<family>.cc) share: device checks before a backend call,
// and the casts and broadcasts that bring operands to the backend contract. Not a public header.
#pragma once

#include <initializer_list>
#include <string>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace mg::kernels {

// The one device of `ts`, checked to have kernels in this build (raising, naming the op, before
// anything is allocated). An undefined tensor raises, unless skip_undefined (an absent bias).
inline Device one_device(const char* op, std::initializer_list<const Tensor*> ts, bool skip_undefined) {
  Device dev;
  bool first = true;
  for (const Tensor* t : ts) {
    if (!t || (skip_undefined && !t->defined())) continue;
    MG_CHECK(t->defined(), ValueError, op, ": got an undefined tensor");
    if (first) {
      dev = t->device();
      first = false;
    } else {
      MG_CHECK(t->device() == dev, DeviceError, op, ": tensors on different devices ", dev, " and ", t->device());
    }
  }
  if (!has_backend(dev)) backend(dev, op);
  return dev;
}
// Every tensor defined and on one device that this build has kernels for; returns that device.
inline Device check_device(const char* op, std::initializer_list<const Tensor*> ts) {
  return one_device(op, ts, false);
}

inline Tensor cast_to(const Tensor& t, DType d) { return t.dtype() == d ? t : raw::to_dtype(t, d); }
inline Tensor bcast(const Tensor& t, const Shape& s) { return t.sizes() == s ? t : raw::expand(t, s); }

// ---- shared by conv, pool and batch norm

// The caller's dtype back from the compute dtype.
inline Tensor finish(const Tensor& t, DType want) { return t.dtype() == want ? t : raw::to_dtype(t, want); }

inline std::string str(Int2 v) {
  return v.h == v.w ? std::to_string(v.h) : "(" + std::to_string(v.h) + ", " + std::to_string(v.w) + ")";
}
inline std::string hw(int64_t h, int64_t w) { return std::to_string(h) + "x" + std::to_string(w); }

// One device for every defined tensor (undefined ones, like an absent bias, are skipped).
inline Device common_device(const char* op, std::initializer_list<const Tensor*> ts) {
  return one_device(op, ts, true);
}

inline void check_defined(const char* op, const Tensor& t, const char* what) {
  MG_CHECK(t.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

inline void check_floating(const char* op, const Tensor& t, const char* what) {
  MG_CHECK(is_floating(t.dtype()), DTypeError, op, ": ", what, " must be floating (f32 or f64), got ", t.dtype());
}

inline void check_same_dtype(const char* op, const Tensor& t, const char* what, const Tensor& x) {
  if (!t.defined()) return;
  MG_CHECK(t.dtype() == x.dtype(), DTypeError, op, ": ", what, " dtype ", t.dtype(), " differs from the input's ",
           x.dtype());
}

inline void check_4d(const char* op, const Shape& s, const char* what) {
  MG_CHECK(s.size() == 4, ShapeError, op, ": expected a 4-D ", what, " [N, C, H, W], got shape ", shape_str(s));
}

// The dtype the backend computes in: CPU kernels are f32/f64, half types go through f32.
inline DType compute_dtype(Device dev, DType t) {
  return dev.is_cpu() && (t == DType::f16 || t == DType::bf16) ? DType::f32 : t;
}

// Contiguous (NCHW for channels-last inputs) in the compute dtype; undefined stays undefined.
inline Tensor prep(const Tensor& t, DType ct) {
  if (!t.defined()) return t;
  Tensor c = t.dtype() == ct ? t : raw::to_dtype(t, ct);
  return c.is_contiguous() ? c : raw::contiguous(c);
}
// prep() into a given layout: contiguous as above, or channels-last (the CUDA NHWC kernels').
inline Tensor prep(const Tensor& t, DType ct, MemoryFormat fmt) {
  if (!t.defined() || fmt == MemoryFormat::Contiguous) return prep(t, ct);
  return raw::contiguous(t.dtype() == ct ? t : raw::to_dtype(t, ct), fmt);
}
// The layout a CUDA kernel with NHWC support runs in: `want` (the input's layout) on CUDA,
// NCHW on the CPU, whose kernels are NCHW only.
inline MemoryFormat device_format(MemoryFormat want, Device dev) {
  return dev.is_cuda() ? want : MemoryFormat::Contiguous;
}
// device_format of t's own layout: the layout a layer's result takes from its lead operand.
inline MemoryFormat device_format(const Tensor& t, Device dev) { return device_format(suggest_memory_format(t), dev); }

inline void check_grad_shape(const char* op, const Tensor& grad, const Shape& want) {
  MG_CHECK(grad.sizes() == want, ShapeError, op, ": grad_output shape ", shape_str(grad.sizes()), " should be ",
           shape_str(want));
}

inline void check_same_device(const char* op, const Tensor& x, const Tensor& t, const char* what) {
  if (t.defined())
    MG_CHECK(t.device() == x.device(), DeviceError, op, ": ", what, " is on ", t.device(), " but the input is on ",
             x.device());
}

// t as a contiguous [rows, n] (or [n]) tensor of dtype dt.
inline Tensor as_rows(const Tensor& t, DType dt, const Shape& shape) {
  Tensor c = t.dtype() == dt ? t : raw::to_dtype(t, dt);
  return raw::view(raw::contiguous(c), shape);
}

}  // namespace mg::kernels
