#include "autograd/grad_mode.h"

#include "core/tensor.h"
#include "kernels/ops.h"

namespace mg {

namespace {
// Thread-local like PyTorch's: a no_grad region on one thread never affects another.
thread_local bool tl_grad_enabled = true;
}  // namespace

bool is_grad_enabled() { return tl_grad_enabled; }
void set_grad_enabled(bool on) { tl_grad_enabled = on; }

void zero_grads(const std::vector<Tensor>& params, bool set_to_none) {
  for (const Tensor& p : params) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      NoGradGuard ng;
      kernels::fill_(grad, 0.0);
    }
  }
}

}  // namespace mg
