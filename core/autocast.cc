#include "core/autocast.h"

#include <string>

#include "core/error.h"

namespace mg {

namespace {
thread_local AutocastState tl_state;
thread_local uint64_t tl_regions = 0;
}  // namespace

uint64_t autocast_region_count() { return tl_regions; }

namespace detail {
void (*autocast_cache_clear_hook)() = nullptr;
}  // namespace detail

AutocastState autocast_state() { return tl_state; }
// Leaving every enabled region this way (a checkpoint replay restoring the backward pass's
// state) drops the region's weight casts, exactly as the outermost guard's exit does.
void set_autocast_state(const AutocastState& s) {
  const bool leaving = tl_state.nesting > 0 && s.nesting == 0;
  tl_state = s;
  if (leaving) clear_autocast_cache();
}
bool is_autocast_enabled(DeviceType t) { return tl_state.enabled(t); }
DType autocast_dtype(DeviceType t) { return tl_state.dtype(t); }

void clear_autocast_cache() {
  if (detail::autocast_cache_clear_hook) detail::autocast_cache_clear_hook();
}

Autocast::Autocast(DeviceType device, DType dtype, bool enabled, bool cache_enabled) : prev_(tl_state) {
  if (enabled) {
    const bool ok = device == DeviceType::CUDA ? (dtype == DType::f16 || dtype == DType::bf16) : dtype == DType::bf16;
    if (!ok)
      MG_THROW(ValueError, "autocast: dtype ", dtype, " is not supported on ",
               device == DeviceType::CUDA ? "cuda" : "cpu", " (cuda: f16 or bf16; cpu: bf16)");
  }
  AutocastState s = tl_state;
  if (device == DeviceType::CUDA) {
    s.cuda_enabled = enabled;
    if (enabled) s.cuda_dtype = dtype;
  } else {
    s.cpu_enabled = enabled;
    if (enabled) s.cpu_dtype = dtype;
  }
  if (enabled) ++s.nesting;
  if (enabled && prev_.nesting == 0) {
    ++tl_regions;
    s.cache_weight_casts = cache_enabled;
  }
  tl_state = s;
}

Autocast::~Autocast() {
  const bool was_outermost = tl_state.nesting > 0 && prev_.nesting == 0;
  tl_state = prev_;
  if (was_outermost) clear_autocast_cache();
}

Fp8Autocast::Fp8Autocast(bool enabled, int64_t min_features, Fp8Scaling scaling, Fp8Accumulation gradients)
    : prev_(tl_state.fp8),
      prev_min_(tl_state.fp8_min_features),
      prev_delayed_(tl_state.fp8_delayed),
      prev_fast_grads_(tl_state.fp8_fast_grads) {
  MG_CHECK(min_features >= 0, ValueError, "Fp8Autocast: min_features must be >= 0, got ", min_features);
  tl_state.fp8 = enabled;
  tl_state.fp8_min_features = min_features;
  tl_state.fp8_delayed = scaling == Fp8Scaling::Delayed;
  tl_state.fp8_fast_grads = gradients == Fp8Accumulation::Fast;
}
Fp8Autocast::~Fp8Autocast() {
  tl_state.fp8 = prev_;
  tl_state.fp8_min_features = prev_min_;
  tl_state.fp8_delayed = prev_delayed_;
  tl_state.fp8_fast_grads = prev_fast_grads_;
}

}  // namespace mg
