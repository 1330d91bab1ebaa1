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
class Autocast {
 public:
  explicit Autocast(DeviceType device, DType dtype = DType::f16, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  AutocastState prev_;
};

}  // namespace mg
