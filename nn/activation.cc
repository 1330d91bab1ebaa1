#include "nn/activation.h"

#include <sstream>
#include <utility>

#include "autograd/functions.h"

namespace mg::nn {

Tensor ReLU::forward(const Tensor& x) {
  // relu_ on a leaf that requires grad is an autograd error; there the copy is unavoidable.
  const bool can_inplace = inplace && !(is_grad_enabled() && x.requires_grad() && x.is_leaf());
  if (!can_inplace) return mg::relu(x);
  Tensor y = x;
  mg::relu_(y);
  return y;
}

GELU::GELU(std::string approximate) : Module("GELU"), approximate(std::move(approximate)) {
  MG_CHECK(this->approximate == "none" || this->approximate == "tanh", ValueError,
           "GELU: approximate must be \"none\" or \"tanh\", got \"", this->approximate, "\"");
}

Tensor GELU::forward(const Tensor& x) { return mg::gelu(x, approximate == "tanh"); }

Tensor SiLU::forward(const Tensor& x) { return mg::silu(x); }

Dropout::Dropout(double p) : Module("Dropout"), p(p) {
  MG_CHECK(p >= 0.0 && p < 1.0, ValueError, "Dropout: p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return mg::dropout(x, p, is_training()); }

Branch Dropout::branch(Branch b) {
  run_forward_pre_hooks();
  if (p > 0.0 && is_training()) b.p = p;
  return b;
}

std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << p;
  return os.str();
}

Tensor Flatten::forward(const Tensor& x) { return mg::flatten(x, start_dim, end_dim); }

std::string Flatten::extra_repr() const {
  std::ostringstream os;
  os << "start_dim=" << start_dim << ", end_dim=" << end_dim;
  return os.str();
}

}  // namespace mg::nn
