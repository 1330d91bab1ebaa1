// Pure-bf16 training: parameters stored in bf16 (no f32 master copy), optimizer state in
// f32, each update computed in f32 and added with stochastic rounding. SGD uses it; an
// Adam/AdamW computes its f32 step the same way and hands it to bf16_add_.
#pragma once

#include <cstdint>

#include "core/random.h"
#include "core/tensor.h"

namespace mg::optim {

// Why stochastic rounding (docs/mixed_precision.md): bf16 keeps 8 mantissa bits, so an
// update below half an ulp of the weight (lr * g < ~0.2% of |w|) is lost entirely by
// round-to-nearest and training stalls. Rounding up with probability equal to the dropped
// fraction makes every update count in expectation, at no memory cost: Kahan summation
// would fix it too but needs a compensation buffer per parameter (2 more bytes/param), which
// is what pure-bf16 mode exists to save.

// A fresh seed for one parameter's rounding in one step, drawn from `gen` (default: the
// process-wide generator), so runs are reproducible under manual_seed.
uint64_t next_rounding_seed(Generator* gen = nullptr);

// p += alpha * delta for a bf16 parameter p, in f32, rounded stochastically (in place,
// under no_grad). delta: any floating dtype, p's shape and device.
void bf16_add_(const Tensor& p, const Tensor& delta, double alpha, uint64_t seed);

// torch.optim.SGD's rule for one bf16 parameter with everything in f32: g = grad (negated
// when maximize) + weight_decay * p; momentum buffer b (f32, created from g on the first
// step when *momentum_buffer is undefined) = mu * b + (1 - dampening) * g; g = nesterov ?
// g + mu * b : b; p -= lr * g with stochastic rounding. momentum_buffer may be null when
// momentum == 0.
struct SGDStep {
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false, maximize = false;
};
void sgd_bf16_update_(const Tensor& p, const Tensor& grad, Tensor* momentum_buffer, const SGDStep& h, uint64_t seed);

}  // namespace mg::optim
