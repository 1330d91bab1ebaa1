#include "nn/linear.h"

#include <cmath>
#include <sstream>

#include "autograd/functions.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
int64_t checked(int64_t n, const char* what) {
  MG_CHECK(n > 0, ValueError, "Linear: ", what, " must be positive, got ", n);
  return n;
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias, TensorOptions opts, Generator* gen)
    : Module("Linear"),
      in_features(checked(in, "in_features")),
      out_features(checked(out, "out_features")),
      weight(register_parameter("weight", init::empty_parameter({out, in}, opts))),
      bias(register_parameter("bias", with_bias ? init::empty_parameter({out}, opts) : Tensor())) {
  reset_parameters(gen);
}

void Linear::reset_parameters(Generator* gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), "fan_in", "leaky_relu", gen);
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    init::uniform_(bias, -bound, bound, gen);
  }
}

void Linear::check_input(const Shape* x) const {
  MG_CHECK(x && !x->empty() && x->back() == in_features, ShapeError, "Linear(in_features=", in_features,
           ", out_features=", out_features, "): input's last dim must be ", in_features, ", got shape ",
           x ? shape_str(*x) : std::string("(undefined)"));
}

Tensor Linear::forward(const Tensor& x) {
  check_input(x.defined() ? &x.sizes() : nullptr);
  return mg::linear(x, weight, bias);
}

Tensor Linear::operator()(const Normed& x) {
  run_forward_pre_hooks();
  check_input(&x.sizes());
  return mg::linear(x, weight, bias);
}

bool Linear::leaves_bias(bool bias_pending) const {
  return bias_pending && bias.defined() && !is_parameter_derived("bias");
}

Branch Linear::branch(const Tensor& x, bool bias_pending) {
  run_forward_pre_hooks();
  check_input(x.defined() ? &x.sizes() : nullptr);
  if (!leaves_bias(bias_pending) || fp8_takes_linear(x, weight)) return {mg::linear(x, weight, bias)};
  return {mg::linear(x, weight, Tensor()), bias};
}

std::string Linear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << in_features << ", out_features=" << out_features
     << ", bias=" << (bias.defined() ? "true" : "false");
  return os.str();
}

}  // namespace mg::nn
