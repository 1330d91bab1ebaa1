// Autocast's casts, applied at the entry of the differentiable ops (autograd/op_policy.h says
// which op gets which): an op's inputs to the region's low precision (matmul family) or to f32
// (softmax, norms, losses, ...).
#pragma once

#include <functional>

#include <initializer_list>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "core/tensor.h"

namespace mg::autocast {

// autograd::around (op_policy.h) applies these at an op's entry, by the op's row in its table:
// the math then sees inputs already in the target dtype. The casts are differentiable
// (Tensor::to), so the gradient reaches an f32 weight as f32 while the op's own backward runs in
// the dtype its forward used.

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

// lower() for a host-resident parameter (an f32 leaf in host memory, memory/host_params.h) that
// an op on `device` reads: the cast provide_cast() gave for this region on `device` when there
// is one, else t copied to `device` and cast there, once per region (outside a region: t copied
// to `device`). Either way the recorded edge takes the gradient back to t on the host.
Tensor lower_to(const Tensor& t, const Device& device);

// Sources of casts for host-resident parameters: a source returns `weight`'s cast to `dtype` on
// `device` when it keeps one (memory/host_params.h keeps each parameter's cast in pinned memory
// and copies it over), else an undefined tensor. lower_to asks them when its region has no cast
// (a checkpoint's recomputation runs in a new region) before copying the f32 values over.
using HostCastSource = std::function<Tensor(const Tensor& weight, const Device& device, DType dtype)>;
// Returns a handle for remove_host_cast_source.
uint64_t add_host_cast_source(HostCastSource source);
void remove_host_cast_source(uint64_t handle);

// Casts a leaf weight to `dtype` through the region's cache (the batch-norm hook uses it to
// bring f32 affine parameters to the activation's dtype). Outside a region: a plain cast.
Tensor cached_cast(const Tensor& t, DType dtype);

// The weights the calling thread's next autocast region will cast at its start (the ones the
// regions since the last such start cast), each with the dtype it was cast to. An optimizer
// updating them can write those casts in its own kernel (AdamOptions::write_autocast_casts) and
// hand them over with provide_cast(): the next region then casts none of them.
std::vector<std::pair<Tensor, DType>> weights_cast_next_region();
// Gives the calling thread's weight-cast cache `cast`, the cast of `weight` as it now is (its
// version) to cast.dtype(), for the next region to use as if it had made it at its start (on the
// weight's device, or on a CUDA device for a weight in host memory: lower_to()): the
// edge t.to(dtype) records is recorded at its first use under grad. Dropped, like any entry,
// when a region exits or `weight` changes; not used inside a CUDA-graph capture (the graph
// would read a tensor its replays never write).
void provide_cast(const Tensor& weight, const Tensor& cast);
// The cast provide_cast() gave for `weight`, while the cache still holds it and `weight` is
// unchanged since; undefined otherwise (a region's own casts are not reported).
Tensor provided_cast(const Tensor& weight);

// Number of entries in the calling thread's weight-cast cache (tests, docs).
size_t cache_size();
// Whether `t` shares storage with a cast in the calling thread's weight-cast cache (activation
// offload leaves those on the device: they live for the whole region anyway).
bool is_cached_cast(const Tensor& t);
// The weight whose cached cast `t` is (the same tensor), while it lives; undefined otherwise.
// What stays the same across steps where the casts do not (a region casts anew): the FP8
// recipe's delayed scaling keeps a layer's histories by it.
Tensor cast_source(const Tensor& t);

}  // namespace mg::autocast
