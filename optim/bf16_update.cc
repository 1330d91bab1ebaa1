#include "optim/bf16_update.h"

#include "autograd/grad_mode.h"
#include "kernels/amp_math.h"
#include "kernels/amp.h"
#include "kernels/ops.h"

namespace mg::optim {

uint64_t next_rounding_seed(Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  return kernels::amp_math::mix(g.seed(), g.reserve(1));
}

void bf16_add_(const Tensor& p, const Tensor& delta, double alpha, uint64_t seed) {
  NoGradGuard ng;
  kernels::add_stochastic_bf16_(p, delta, alpha, seed);
}

void sgd_bf16_update_(const Tensor& p, const Tensor& grad, Tensor* momentum_buffer, const SGDStep& h, uint64_t seed) {
  MG_CHECK(p.dtype() == DType::bf16, DTypeError, "sgd_bf16_update_: parameter must be bf16, got ", p.dtype());
  MG_CHECK(h.momentum == 0.0 || momentum_buffer, ValueError, "sgd_bf16_update_: momentum ", h.momentum,
           " needs a momentum buffer slot");
  NoGradGuard ng;
  Tensor g = kernels::cast(grad, DType::f32);
  if (h.weight_decay != 0.0 || h.maximize)
    g = kernels::axpby(g, h.maximize ? -1.0 : 1.0, kernels::cast(p, DType::f32), h.weight_decay);
  if (h.momentum != 0.0) {
    Tensor& b = *momentum_buffer;
    if (!b.defined()) {
      b = g.is_same(grad) ? raw::clone(g) : g;
    } else {
      kernels::axpby_(b, h.momentum, g, 1.0 - h.dampening);
    }
    g = h.nesterov ? kernels::axpby(g, 1.0, b, h.momentum) : b;
  }
  kernels::add_stochastic_bf16_(p, g, -h.lr, seed);
}

}  // namespace mg::optim
