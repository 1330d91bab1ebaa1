#include "optim/optimizer.h"

#include <unordered_set>

#include "autograd/grad_mode.h"
#include "kernels/ops.h"

namespace mg::optim {

double ParamGroup::get(const std::string& key) const {
  auto it = options.find(key);
  MG_CHECK(it != options.end(), ValueError, "ParamGroup: no option \"", key, "\"");
  return it->second;
}

Optimizer::Optimizer(std::string name, std::map<std::string, double> defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {}

void Optimizer::add_param_group(ParamGroup group) {
  const size_t gi = groups_.size();
  for (auto& [k, v] : group.options) {
    if (defaults_.count(k)) continue;
    std::string known;
    for (auto& d : defaults_) known += (known.empty() ? "" : ", ") + d.first;
    MG_THROW(ValueError, name_, ": param group ", gi, " has unknown option \"", k, "\" (valid: ", known, ")");
  }
  for (auto& [k, v] : defaults_) group.options.emplace(k, v);
  validate(group);

  std::unordered_set<const TensorImpl*> taken;
  for (auto& g : groups_)
    for (auto& p : g.params) taken.insert(p.impl());
  std::unordered_set<const TensorImpl*> mine;
  std::vector<Tensor> params;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    MG_CHECK(p.defined(), ValueError, name_, ": param group ", gi, ", parameter ", i, " is undefined");
    MG_CHECK(is_floating(p.dtype()), DTypeError, name_, ": param group ", gi, ", parameter ", i,
             " has dtype ", p.dtype(), "; only floating tensors can be optimized");
    MG_CHECK(p.is_leaf(), ValueError, name_, ": can't optimize a non-leaf tensor (param group ", gi, ", parameter ", i,
             "): optimize the leaf it was computed from");
    MG_CHECK(!taken.count(p.impl()), ValueError, name_, ": param group ", gi, ", parameter ", i,
             " (shape ", shape_str(p.sizes()), ") already appears in another parameter group");
    if (mine.insert(p.impl()).second) params.push_back(p);  // a repeat within a group is harmless
  }
  group.params = std::move(params);
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_)
    for (auto& p : g.params) {
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

const ParamState* Optimizer::state(const Tensor& p) const {
  auto it = state_.find(p.impl());
  return it == state_.end() ? nullptr : &it->second;
}

ParamState& Optimizer::state_for(const Tensor& p) { return state_[p.impl()]; }

int64_t Optimizer::state_nbytes() const {
  int64_t n = 0;
  for (auto& [impl, s] : state_)
    for (auto& [k, t] : s.buffers)
      if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace mg::optim
