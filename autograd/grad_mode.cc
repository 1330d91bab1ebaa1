#include "autograd/grad_mode.h"

namespace mg {

namespace {
// Thread-local like PyTorch's: a no_grad region on one thread never affects another.
thread_local bool tl_grad_enabled = true;
}  // namespace

bool is_grad_enabled() { return tl_grad_enabled; }
void set_grad_enabled(bool on) { tl_grad_enabled = on; }

}  // namespace mg
