#include "optim/optimizer.h"

#include <string>
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
    MG_CHECK(is_floating(p.dtype()), DTypeError, name_, ": param group ", gi, ", parameter ", i, " has dtype ",
             p.dtype(), "; only floating tensors can be optimized");
    MG_CHECK(p.is_leaf(), ValueError, name_, ": can't optimize a non-leaf tensor (param group ", gi, ", parameter ", i,
             "): optimize the leaf it was computed from");
    MG_CHECK(!taken.count(p.impl()), ValueError, name_, ": param group ", gi, ", parameter ", i, " (shape ",
             shape_str(p.sizes()), ") already appears in another parameter group");
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

namespace mg::optim {

StateDict Optimizer::state_dict() const {
  StateDict sd;
  sd.meta["type"] = name_;
  nlohmann::json groups = nlohmann::json::array(), states = nlohmann::json::object();
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    nlohmann::json jg = nlohmann::json::object();
    for (auto& [k, v] : g.options) jg[k] = v;
    nlohmann::json ids = nlohmann::json::array();
    for (const Tensor& p : g.params) {
      ids.push_back(index);
      if (const ParamState* st = state(p)) {
        states[std::to_string(index)] = {{"step", st->step}};
        for (auto& [name, t] : st->buffers)
          if (t.defined()) sd.tensors["state." + std::to_string(index) + "." + name] = t;
      }
      ++index;
    }
    jg["params"] = ids;
    groups.push_back(jg);
  }
  sd.meta["param_groups"] = groups;
  sd.meta["state"] = states;
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  const nlohmann::json& m = sd.meta;
  MG_CHECK(m.is_object() && m.contains("type") && m.contains("param_groups") && m.contains("state"), ValueError, name_,
           "::load_state_dict: meta lacks \"type\", \"param_groups\" or \"state\"");
  const std::string type = m["type"].is_string() ? m["type"].get<std::string>() : "?";
  MG_CHECK(type == name_, ValueError, name_, "::load_state_dict: the state was saved by a ", type, " optimizer");
  const nlohmann::json& jgroups = m["param_groups"];
  MG_CHECK(jgroups.is_array() && jgroups.size() == groups_.size(), ValueError, name_,
           "::load_state_dict: saved state has ", jgroups.is_array() ? jgroups.size() : 0,
           " parameter groups, this optimizer ", groups_.size());

  // Validate everything first, building the new options and state aside.
  std::vector<std::map<std::string, double>> options(groups_.size());
  std::vector<const Tensor*> params;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const nlohmann::json& jg = jgroups[gi];
    MG_CHECK(jg.is_object() && jg.contains("params") && jg["params"].is_array(), ValueError, name_,
             "::load_state_dict: group ", gi, " has no \"params\" list");
    MG_CHECK(jg["params"].size() == groups_[gi].params.size(), ValueError, name_, "::load_state_dict: group ", gi,
             " was saved with ", jg["params"].size(), " parameters, this optimizer's has ", groups_[gi].params.size());
    for (auto& [k, v] : defaults_)
      MG_CHECK(jg.contains(k) && jg[k].is_number(), ValueError, name_, "::load_state_dict: group ", gi,
               " lacks option \"", k, "\"");
    // Every saved number is restored, including keys a scheduler added ("initial_lr").
    options[gi] = groups_[gi].options;
    for (auto& [k, v] : jg.items())
      if (k != "params" && v.is_number()) options[gi][k] = v.get<double>();
    for (const Tensor& p : groups_[gi].params) params.push_back(&p);
  }
  std::unordered_map<const TensorImpl*, ParamState> state;
  const nlohmann::json& jstate = m["state"];
  MG_CHECK(jstate.is_object(), ValueError, name_, "::load_state_dict: \"state\" is not an object");
  for (auto& [key, js] : jstate.items()) {
    size_t i = 0;
    try {
      i = std::stoul(key);
    } catch (const std::exception&) {
      MG_THROW(ValueError, name_, "::load_state_dict: bad parameter index \"", key, "\"");
    }
    MG_CHECK(i < params.size(), ValueError, name_, "::load_state_dict: state for parameter ", i,
             ", but there are only ", params.size());
    MG_CHECK(js.is_object() && js.contains("step") && js["step"].is_number_integer(), ValueError, name_,
             "::load_state_dict: state of parameter ", i, " has no integer \"step\"");
    ParamState st;
    st.step = js["step"].get<int64_t>();
    const StateDict sub = sd.sub("state." + key);
    const Tensor& p = *params[i];
    for (auto& [name, t] : sub.tensors) {
      MG_CHECK(t.defined() && t.sizes() == p.sizes(), ShapeError, name_, "::load_state_dict: state.", key, ".", name,
               " has shape ", t.defined() ? shape_str(t.sizes()) : "undefined", ", parameter ", i, " has ",
               shape_str(p.sizes()));
      st.buffers[name] = t;
    }
    state[p.impl()] = std::move(st);
  }
  // Tensors under "state.<i>." for a parameter without a step entry are a malformed file.
  for (auto& [name, t] : sd.tensors) {
    if (name.compare(0, 6, "state.") != 0) continue;
    const std::string key = name.substr(6, name.find('.', 6) - 6);
    MG_CHECK(jstate.contains(key), ValueError, name_, "::load_state_dict: tensor ", name, " has no \"state\" entry");
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup probe{{}, options[gi]};
    validate(probe);
  }

  // Commit: copies, so the loaded file's tensors are not aliased by the optimizer.
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::OptimizerState);
  for (const Tensor* p : params) {
    auto it = state.find(p->impl());
    if (it == state.end()) continue;
    for (auto& [name, t] : it->second.buffers) {
      Tensor copy = empty(t.sizes(), {t.dtype(), p->device()});
      copy.copy_(t);
      t = copy;
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = options[gi];
  state_ = std::move(state);
}

}  // namespace mg::optim
