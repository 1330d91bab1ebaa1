// Autocast: a thread-local, scoped mixed-precision policy consulted by the differentiable
// ops. Inside `Autocast guard(DeviceType::CUDA, DType::f16)` matmul/linear/conv/bmm/attention
// run in f16 (their f32 inputs cast, weight casts cached for the region), while precision-
// sensitive ops (softmax, log_softmax, norms' statistics, losses, reductions, exp/log/pow)
// run in f32. The state is plain data so the checkpoint replay can capture and restore it.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"

namespace mg {

// One autocast setting per device type (CPU and CUDA are independent, like PyTorch's).
struct AutocastState {
  bool cuda_enabled = false;
  DType cuda_dtype = DType::f16;
  bool cpu_enabled = false;
  DType cpu_dtype = DType::bf16;
  // Depth of nested enabled regions; the weight-cast cache is cleared when it drops to 0.
  int32_t nesting = 0;
  // Whether the region casts each f32 weight once and keeps the cast until the outermost region
  // exits (PyTorch's autocast cache_enabled), or casts it at each use: no cast outlives its op
  // unless the op's backward keeps it.
  bool cache_weight_casts = true;
  // The FP8 recipe (Fp8Autocast): inside an enabled f16/bf16 region, linear layers' GEMMs run
  // on FP8 codes (autograd/fp8_linear.h says which and how).
  bool fp8 = false;
  // ... for linears whose in and out features are both at least this many.
  int64_t fp8_min_features = 0;
  // ... with each cast's scale from its own amax (false) or from the operand's recent casts'.
  bool fp8_delayed = false;
  // ... with the gradients' GEMMs accumulating as the forward's do (Fp8Accumulation::Fast).
  bool fp8_fast_grads = false;

  bool enabled(DeviceType t) const { return t == DeviceType::CUDA ? cuda_enabled : cpu_enabled; }
  DType dtype(DeviceType t) const { return t == DeviceType::CUDA ? cuda_dtype : cpu_dtype; }
  bool operator==(const AutocastState&) const = default;
};

// The calling thread's state. Setting a state with nesting 0 over one inside a region clears
// the weight-cast cache (as leaving the outermost region does).
AutocastState autocast_state();
void set_autocast_state(const AutocastState& s);
bool is_autocast_enabled(DeviceType t);
DType autocast_dtype(DeviceType t);

// Drops the cached low-precision copies of f32 weights (done automatically when the
// outermost enabled region exits).
void clear_autocast_cache();

// How many outermost enabled regions the calling thread's Autocast guards have entered (a
// checkpoint replay restoring a region's state does not count): the weight-cast cache casts the
// previous region's weights in one go at the first cast of a new one.
uint64_t autocast_region_count();

namespace detail {
// Set by the layer that owns the weight-cast cache; clear_autocast_cache() calls it.
extern void (*autocast_cache_clear_hook)();
}  // namespace detail

// Scoped guard: enables (or, with enabled == false, disables) autocast for one device type
// and restores the previous state on exit. Nestable. Raises mg::ValueError for a dtype the
// device type does not support (CUDA: f16/bf16; CPU: bf16).
// cache_enabled == false (set by the outermost enabled guard; the regions inside it keep its
// choice, as the cache is its) casts each f32 weight at each use instead of once per region: a
// forward of every block checkpointed then holds no weight casts (2 bytes a parameter at GPT-2
// XL's forward's end: docs/bigger_than_gpu.md), at one cast kernel a use.
class Autocast {
 public:
  explicit Autocast(DeviceType device, DType dtype = DType::f16, bool enabled = true, bool cache_enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  AutocastState prev_;
};

// Scoped guard for the FP8 recipe: inside it, and inside an enabled f16/bf16 Autocast region,
// the linear layers (mg::linear, mg::gelu_mlp) run their GEMMs on FP8 codes with per-tensor
// current scaling, e4m3 for weights and activations and e5m2 for gradients; everything else (and
// a linear whose shape the FP8 GEMMs do not take) keeps the region's dtype:
//   Autocast amp(DeviceType::CUDA, DType::bf16);
//   Fp8Autocast fp8;
//   Tensor loss = model(x) ...;
// Nestable; enabled == false turns the recipe off inside. `min_features` leaves the linears
// narrower than it (in or out features) in the region's dtype: each FP8 GEMM costs a pass over
// its operands to scale and cast them, which the faster GEMM repays only from some width on.
// The default is where it did on an H100 (docs/mixed_precision.md): GPT-2 with every linear in
// FP8 was slower than bf16 at 768 and 1024 features and faster at 1280 and 1600, so GPT-2 124M
// and medium keep bf16 under the default recipe; min_features = 0 puts every linear in FP8.
// Fp8Scaling::Delayed takes each cast's scale from the largest amax of the same operand's
// previous casts (kernels/fp8.h, Fp8History) instead of a pass over the tensor for its own amax
// first: one pass over each operand instead of two, with values beyond what the history expected
// saturating (autograd/fp8_linear.h says how operands are told apart).
// The forward GEMMs (e4m3 x e4m3) accumulate fast: the tensor cores' narrower accumulator over
// all of K (kernels/types.h, Fp8Accum). The gradients' GEMMs (an e5m2 operand) promote their
// partial sums to f32 every few steps of K, unless Fp8Accumulation::Fast: a faster step, at the
// cost of the gradients' precision over long reductions (the weight gradient's K is the batch's
// B * T tokens); docs/mixed_precision.md has its measured speed, error and loss curves.
inline constexpr int64_t kFp8DefaultMinFeatures = 1280;
enum class Fp8Scaling { Current, Delayed };
enum class Fp8Accumulation { Promoted, Fast };
class Fp8Autocast {
 public:
  explicit Fp8Autocast(bool enabled = true, int64_t min_features = kFp8DefaultMinFeatures,
                       Fp8Scaling scaling = Fp8Scaling::Current, Fp8Accumulation gradients = Fp8Accumulation::Promoted);
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  bool prev_;
  int64_t prev_min_;
  bool prev_delayed_;
  bool prev_fast_grads_;
};

}  // namespace mg
