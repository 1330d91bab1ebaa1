// What the engine does around a differentiable op before its math runs, in one place.
//
// An op in autograd/*_ops.cc is written as its math: a function that runs the forward kernel and
// records the gradient (record, SavedTensor). Its public entry is one call,
//
//   Tensor layer_norm(x, shape, w, b, eps) { return around(policy::layer_norm, layer_norm_math, x, shape, w, b, eps); }
//
// and the op's row in the table below says what around() applies first, in this order:
//   1. rebuild: while a selective-recompute policy is active (RecomputePolicy, autograd/recompute.h)
//      and names the op, the op runs as a small checkpoint region rebuilt from its first argument in
//      backward instead of keeping its output (autograd::recompute_hook).
//   2. cast: autocast's rule for the op's floating tensor arguments when a region is active
//      (core/autocast.h): lower them to the region's f16/bf16 (GEMMs, convolutions, attention),
//      widen f16/bf16 to f32 (reductions, norms, softmax, losses, exp/log/pow), widen on the CPU only
//      (the CUDA kernel reads half inputs and computes in f32 itself), or leave them as they are.
//      The casts are differentiable (Tensor::to): an f32 weight gets its gradient in f32.
// Arguments that are not tensors pass through; a tensor wrapped in as_is() is not cast. A
// parameter held in host memory (memory/host_params.h) that an op on a CUDA device reads comes to
// that device here, cast (lowering ops) or copied (the others), with the gradient's way back.
//
// The other replay hook, a checkpoint region's kept outputs (autograd::kept_or_run, node.h), wraps
// the kernel call inside the math: the op still records its node when a replay takes its output.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <type_traits>

#include "autograd/autocast_policy.h"
#include "autograd/node.h"
#include "core/profiler.h"

namespace mg::autograd {

enum class Cast : uint8_t { none, lower, widen, widen_cpu };

struct OpPolicy {
  const char* name;
  Cast cast = Cast::none;
  bool rebuildable = false;  // selective recomputation may rebuild the output from the first argument
};

// The table: every op with a policy. An op not listed has none (its math is its entry).
namespace policy {
// GEMMs, convolutions, attention: run in the region's low precision.
inline constexpr OpPolicy matmul{"matmul", Cast::lower};
inline constexpr OpPolicy bmm{"bmm", Cast::lower};
inline constexpr OpPolicy linear{"linear", Cast::lower};
inline constexpr OpPolicy gelu_mlp{"gelu_mlp", Cast::lower};
inline constexpr OpPolicy linear_cross_entropy{"linear_cross_entropy", Cast::lower};
inline constexpr OpPolicy conv2d{"conv2d", Cast::lower};
inline constexpr OpPolicy attention{"scaled_dot_product_attention", Cast::lower};
inline constexpr OpPolicy attention_packed_qkv{"attention_packed_qkv", Cast::lower};
// Range-sensitive math: f32.
inline constexpr OpPolicy pow{"pow", Cast::widen};
inline constexpr OpPolicy exp{"exp", Cast::widen};
inline constexpr OpPolicy log{"log", Cast::widen};
inline constexpr OpPolicy sum{"sum", Cast::widen};
inline constexpr OpPolicy mean{"mean", Cast::widen};
inline constexpr OpPolicy var{"var", Cast::widen};
inline constexpr OpPolicy log_softmax{"log_softmax", Cast::widen};
inline constexpr OpPolicy add_layer_norm{"add_layer_norm", Cast::widen};
inline constexpr OpPolicy nll_loss{"nll_loss", Cast::widen};
inline constexpr OpPolicy mse_loss{"mse_loss", Cast::widen};
inline constexpr OpPolicy cross_entropy_probs{"cross_entropy", Cast::widen};
// The CUDA kernels read f16/bf16 and compute in f32: only the CPU widens.
inline constexpr OpPolicy cross_entropy{"cross_entropy", Cast::widen_cpu};
inline constexpr OpPolicy batch_norm{"batch_norm", Cast::widen_cpu};
// Cheap to rebuild: what a selective-recompute policy may name.
inline constexpr OpPolicy layer_norm{"layer_norm", Cast::widen, true};
inline constexpr OpPolicy softmax{"softmax", Cast::widen, true};
inline constexpr OpPolicy relu{"relu", Cast::none, true};
inline constexpr OpPolicy gelu{"gelu", Cast::none, true};
inline constexpr OpPolicy silu{"silu", Cast::none, true};
inline constexpr OpPolicy dropout{"dropout", Cast::none, true};
}  // namespace policy

// A tensor argument autocast leaves as it is (add_layer_norm's residual stream keeps its dtype).
struct AsIs {
  const Tensor& t;
  operator const Tensor&() const { return t; }  // NOLINT: passes to the math as the tensor
};
inline AsIs as_is(const Tensor& t) { return AsIs{t}; }

// Whether the active selective-recompute policy would rebuild `op` here. A fused op that holds
// such an output asks it: add_layer_norm then runs as the plain ops whose layer_norm it rebuilds,
// gelu_mlp drops its GELU output from what it saves.
inline bool rebuilds(const char* op) { return recompute_hook && recompute_query && recompute_query(op); }

namespace detail {
template <class T>
const Tensor* tensor_of(const T&) {
  return nullptr;
}
inline const Tensor* tensor_of(const Tensor& t) { return &t; }

template <class T>
const T& cast_arg(Cast, const Device*, const T& v) {
  return v;
}
// A host-resident parameter (an f32 leaf that requires grad, in host memory: memory/host_params.h)
// read by an op on a CUDA device.
inline bool host_param_on(const Device* device, const Tensor& t) {
  return device && device->is_cuda() && t.defined() && !t.is_cuda() && t.is_leaf() && t.requires_grad();
}
template <class T>
bool host_param_on(const Device*, const T&) {
  return false;
}

// `device`: the op's (its first defined tensor's). A host parameter comes to that device: cast
// there by a lowering op (autocast::lower_to), copied by the others.
inline Tensor cast_arg(Cast c, const Device* device, const Tensor& t) {
  const bool host = host_param_on(device, t);
  if (c == Cast::lower) return host ? autocast::lower_to(t, *device) : autocast::lower(t);
  return host ? autocast::widen(t).to(*device) : autocast::widen(t);
}

inline bool cast_needed(Cast c, std::initializer_list<const Tensor*> ts) {
  switch (c) {
    case Cast::none:
      return false;
    case Cast::lower:
      return autocast::lower_needed(ts);
    case Cast::widen:
      return autocast::widen_needed(ts);
    case Cast::widen_cpu:
      for (const Tensor* t : ts)
        if (t && t->defined()) return !t->is_cuda() && autocast::widen_needed(ts);
      return false;
  }
  return false;
}

template <class Math, class... Args>
auto cast_and_run(const OpPolicy& p, const Math& math, const Args&... args) {
  if (p.cast == Cast::none) return math(args...);
  std::optional<Device> device;
  for (const Tensor* t : {tensor_of(args)...})
    if (!device && t && t->defined()) device = t->device();
  const Device* dev = device ? &*device : nullptr;
  if (cast_needed(p.cast, {tensor_of(args)...}) || (host_param_on(dev, args) || ...))
    return math(cast_arg(p.cast, dev, args)...);
  return math(args...);
}
}  // namespace detail

// Runs `math(args...)` with `p`'s policies applied around it (see the top of this file).
template <class Math, class... Rest>
auto around(const OpPolicy& p, const Math& math, const Tensor& x, const Rest&... rest)
    -> std::invoke_result_t<const Math&, const Tensor&, const Rest&...> {
  profiler::Range range(p.name, "op");  // a trace's host range (core/profiler.h); nothing when off
  if constexpr (std::is_same_v<std::invoke_result_t<const Math&, const Tensor&, const Rest&...>, Tensor>) {
    if (p.rebuildable && recompute_hook) {
      // The rebuild replays the op through around() again: autocast applies in the replay as it did.
      Tensor r = recompute_hook(
          p.name, x, [&p, &math, rest...](const Tensor& in) -> Tensor { return around(p, math, in, rest...); });
      if (r.defined()) return r;
    }
  }
  return detail::cast_and_run(p, math, x, rest...);
}

}  // namespace mg::autograd
