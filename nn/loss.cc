#include "nn/loss.h"

#include <sstream>

#include "autograd/functions.h"

namespace mg::nn {

namespace {
std::string checked_reduction(std::string r, const char* op) {
  MG_CHECK(r == "mean" || r == "sum" || r == "none", ValueError, op,
           ": reduction must be \"mean\", \"sum\" or \"none\", got \"", r, "\"");
  return r;
}
}  // namespace

CrossEntropyLoss::CrossEntropyLoss(std::string reduction, int64_t ignore_index, double label_smoothing)
    : Module("CrossEntropyLoss"),
      reduction(checked_reduction(std::move(reduction), "CrossEntropyLoss")),
      ignore_index(ignore_index),
      label_smoothing(label_smoothing) {
  MG_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
           "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", label_smoothing);
}

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& target) const {
  return mg::cross_entropy(logits, target, reduction, ignore_index, label_smoothing);
}

std::string CrossEntropyLoss::extra_repr() const {
  std::ostringstream os;
  os << "reduction=" << reduction;
  if (label_smoothing != 0.0) os << ", label_smoothing=" << label_smoothing;
  return os.str();
}

MSELoss::MSELoss(std::string reduction)
    : Module("MSELoss"), reduction(checked_reduction(std::move(reduction), "MSELoss")) {}

Tensor MSELoss::operator()(const Tensor& input, const Tensor& target) const {
  return mg::mse_loss(input, target, reduction);
}

}  // namespace mg::nn
