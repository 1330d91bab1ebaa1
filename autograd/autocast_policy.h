// Autocast's op policy, applied at the entry of the differentiable ops: which inputs an op
// casts to the region's low precision (matmul family) or to f32 (softmax, norms, losses, ...).
#pragma once

#include <initializer_list>
#include <vector>

#include "core/autocast.h"
#include "core/tensor.h"

namespace mg::autocast {

// Each differentiable op starts with one of these, e.g. for matmul:
//   if (autocast::lower_needed({&a, &b})) return matmul(autocast::lower(a), autocast::lower(b));
// The recursive call sees inputs already in the target dtype, so it runs the op itself. The
// casts are differentiable (Tensor::to), so the gradient reaches an f32 weight as f32 while
// the op's own backward runs in the dtype its forward used.

// True when autocast is on for the inputs' device and some floating input is not yet in the
// region's low-precision dtype (f64 is never cast, as in PyTorch).
bool lower_needed(std::initializer_list<const Tensor*> ts);
bool lower_needed(const std::vector<Tensor>& ts);
// `t` in the region's low-precision dtype (unchanged when undefined, non-floating or f64).
// f32 leaves that require grad (weights) are cast once per region and cached.
Tensor lower(const Tensor& t);

// True when autocast is on for the inputs' device and some input is f16/bf16: the op runs
// in f32.
bool widen_needed(std::initializer_list<const Tensor*> ts);
// `t` as f32 when it is f16/bf16; otherwise unchanged.
Tensor widen(const Tensor& t);

// Casts a leaf weight to `dtype` through the region's cache (the batch-norm hook uses it to
// bring f32 affine parameters to the activation's dtype). Outside a region: a plain cast.
Tensor cached_cast(const Tensor& t, DType dtype);

// Number of entries in the calling thread's weight-cast cache (tests, docs).
size_t cache_size();
// Whether `t` shares storage with a cast in the calling thread's weight-cast cache (activation
// offload leaves those on the device: they live for the whole region anyway).
bool is_cached_cast(const Tensor& t);

}  // namespace mg::autocast
