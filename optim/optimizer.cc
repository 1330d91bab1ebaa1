#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "core/device_runtime.h"
#include "kernels/ops.h"
#include "kernels/optim.h"

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
  for (auto& g : groups_) zero_grads(g.params, set_to_none);
}

const ParamState* Optimizer::state(const Tensor& p) const {
  auto it = state_.find(p.impl());
  return it == state_.end() ? nullptr : &it->second;
}

ParamState& Optimizer::state_for(const Tensor& p) {
  auto it = state_.find(p.impl());
  if (it != state_.end()) return it->second;
  MG_CHECK(!p.is_cuda() || !cuda::is_capturing(p.device().index), ValueError, name_, ": a parameter of shape ",
           shape_str(p.sizes()),
           " has no optimizer state yet inside a CUDA graph capture; the graph would recreate it on every replay. "
           "Run one eager step before capturing (CapturedStep's warmup >= 1)");
  return state_[p.impl()];
}

int64_t ParamState::step_value() const {
  return step_count.defined() ? static_cast<int64_t>(raw::to_device(step_count, Device::cpu()).item()) : step;
}

void Optimizer::sync_device_lr() {
  for (auto& [key, d] : device_lr_) {
    const double lr = groups_[key.first].lr();
    if (lr == d.written || (d.lr.is_cuda() && cuda::is_capturing(d.lr.device().index))) continue;
    raw::fill_(d.lr, lr);  // a kernel with the value as its argument: stream-ordered, no host buffer
    d.written = lr;
  }
}

kernels::DeviceScalars Optimizer::device_scalars(size_t gi, const Device& dev) {
  auto [it, fresh] = device_lr_.try_emplace({gi, dev.str()});
  if (fresh) {
    MG_CHECK(!dev.is_cuda() || !cuda::is_capturing(dev.index), ValueError, name_, ": param group ", gi,
             " has no device lr yet inside a CUDA graph capture; run one eager step before capturing");
    MemoryCategoryGuard cat(MemoryCategory::OptimizerState);
    it->second.lr = empty({1}, {DType::f64, dev});
    it->second.written = groups_[gi].lr();
    raw::fill_(it->second.lr, it->second.written);
  }
  sync_device_lr();
  return {it->second.lr, found_inf_};
}

void Optimizer::check_capturable(const Tensor& p, const Tensor& grad, size_t gi, size_t index) const {
  MG_CHECK(kernels::multi_tensor_supported(p) && kernels::multi_tensor_supported(grad) && grad.dtype() == p.dtype(),
           ValueError, name_, "(capturable): param group ", gi, ", parameter ", index, " (", p.dtype(), " ",
           shape_str(p.sizes()), " on ", p.device(), ", gradient ", grad.dtype(),
           grad.is_contiguous() ? "" : " non-contiguous",
           ") cannot take the fused update a capturable step needs (f32 contiguous parameter and gradient, "
           "or f64 on the CPU)");
}

Tensor& Optimizer::step_count_for(const Tensor& p, ParamState& st) {
  if (!st.step_count.defined()) {
    MG_CHECK(!p.is_cuda() || !cuda::is_capturing(p.device().index), ValueError, name_,
             ": a step count created inside a CUDA graph capture; run one eager step before capturing");
    st.step_count = full({1}, static_cast<double>(st.step), {DType::i64, p.device()});
  }
  return st.step_count;
}

void Optimizer::step_unless(const Tensor& found_inf) {
  MG_CHECK(capturable_, ValueError, name_,
           ": step_unless(found_inf) skips the step on the device, which needs a capturable optimizer "
           "(options .capturable = true)");
  MG_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == DType::f32, ValueError, name_,
           ": step_unless: found_inf must be a one-element f32 tensor");
  found_inf_ = found_inf;
  try {
    step();
  } catch (...) {
    found_inf_ = Tensor();
    throw;
  }
  found_inf_ = Tensor();
}

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
        states[std::to_string(index)] = {{"step", st->step_value()}};
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

bool parse_state_index(const std::string& key, size_t* out) {
  if (key.empty() || key.size() > 18 || (key.size() > 1 && key[0] == '0')) return false;
  size_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<size_t>(c - '0');
  }
  *out = v;
  return true;
}

namespace {

// The first value of a buffer that breaks its invariant (non-finite, or negative where a square
// is kept), or "" when all hold. Loading is rare: one host pass over each buffer is affordable.
std::string first_bad_value(const Tensor& t, bool nonnegative) {
  const std::vector<double> v = t.to_vector<double>();
  for (size_t k = 0; k < v.size(); ++k)
    if (!std::isfinite(v[k]) || (nonnegative && v[k] < 0))
      return detail::format("element ", k, " is ", v[k],
                            nonnegative ? " (must be finite and >= 0)" : " (must be finite)");
  return "";
}

}  // namespace

StagedLoad Optimizer::stage_state_dict(const StateDict& sd) {
  const std::string op = name_ + "::load_state_dict";
  const nlohmann::json& m = sd.meta;
  MG_CHECK(m.is_object() && m.contains("type") && m.contains("param_groups") && m.contains("state"), ValueError, op,
           ": meta lacks \"type\", \"param_groups\" or \"state\"");
  const std::string type = m["type"].is_string() ? m["type"].get<std::string>() : m["type"].dump();
  if (type != name_)
    if (std::optional<StateDict> converted = converted_state_dict(sd, type)) return stage_state_dict(*converted);
  MG_CHECK(type == name_, ValueError, op, ": the state was saved by a ", type, " optimizer");
  const nlohmann::json& jgroups = m["param_groups"];
  MG_CHECK(jgroups.is_array() && jgroups.size() == groups_.size(), ValueError, op, ": saved state has ",
           jgroups.is_array() ? jgroups.size() : 0, " parameter groups, this optimizer ", groups_.size());

  // Validate everything first, building the new options and state aside.
  std::vector<std::map<std::string, double>> options(groups_.size());
  std::vector<std::pair<const Tensor*, size_t>> params;  // (parameter, its group)
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const nlohmann::json& jg = jgroups[gi];
    MG_CHECK(jg.is_object() && jg.contains("params") && jg["params"].is_array(), ValueError, op, ": group ", gi,
             " has no \"params\" list");
    MG_CHECK(jg["params"].size() == groups_[gi].params.size(), ValueError, op, ": group ", gi, " was saved with ",
             jg["params"].size(), " parameters, this optimizer's has ", groups_[gi].params.size());
    for (auto& [k, v] : defaults_)
      MG_CHECK(jg.contains(k) && jg[k].is_number(), ValueError, op, ": group ", gi, " lacks option \"", k, "\"");
    // Every saved number is restored, including keys a scheduler added ("initial_lr").
    options[gi] = groups_[gi].options;
    for (auto& [k, v] : jg.items())
      if (k != "params" && v.is_number()) options[gi][k] = v.get<double>();
    for (auto& [k, v] : options[gi])
      MG_CHECK(std::isfinite(v), ValueError, op, ": group ", gi, " option \"", k, "\" is ", v, " (must be finite)");
    try {
      validate(ParamGroup{{}, options[gi]});
    } catch (const ValueError& e) {
      MG_THROW(ValueError, op, ": group ", gi, ": ", e.what());
    }
    for (const Tensor& p : groups_[gi].params) params.emplace_back(&p, gi);
  }
  std::unordered_map<const TensorImpl*, ParamState> state;
  const nlohmann::json& jstate = m["state"];
  MG_CHECK(jstate.is_object(), ValueError, op, ": \"state\" is not an object");
  for (auto& [key, js] : jstate.items()) {
    size_t i = 0;
    MG_CHECK(parse_state_index(key, &i), ValueError, op, ": bad parameter index \"", key, "\"");
    MG_CHECK(i < params.size(), ValueError, op, ": state for parameter ", i, ", but there are only ", params.size());
    MG_CHECK(js.is_object() && js.contains("step") && js["step"].is_number_integer(), ValueError, op,
             ": state of parameter ", i, " has no integer \"step\"");
    ParamState st;
    // A negative step makes the bias corrections 1 - beta^step negative or zero: infinite or
    // sign-flipped updates.
    st.step = js["step"].get<int64_t>();
    MG_CHECK(st.step >= 0, ValueError, op, ": state of parameter ", i, " (group ", params[i].second, ") has step ",
             st.step, " (must be >= 0)");
    const auto& [pp, gi] = params[i];
    const Tensor& p = *pp;
    const StateSpec spec = state_spec(options[gi], p);
    const StateDict sub = sd.sub("state." + key);
    for (const BufferSpec& b : spec.buffers)
      MG_CHECK(!b.required || sub.tensors.count(b.name), ValueError, op, ": state of parameter ", i, " (group ", gi,
               ") lacks buffer \"", b.name, "\"");
    for (auto& [name, t] : sub.tensors) {
      const std::string where = detail::format(op, ": state.", key, ".", name, " (parameter ", i, ", group ", gi, ")");
      auto known = std::find_if(spec.buffers.begin(), spec.buffers.end(), [&](auto& b) { return b.name == name; });
      MG_CHECK(known != spec.buffers.end(), ValueError, where, ": not a buffer ", name_, " keeps");
      const Shape want = known->shape.value_or(p.sizes());
      MG_CHECK(t.defined() && t.sizes() == want, ShapeError, where, " has shape ",
               t.defined() ? shape_str(t.sizes()) : "undefined", known->shape ? ", expected " : ", the parameter has ",
               shape_str(want));
      if (known->dtype && !is_floating(*known->dtype)) {  // codes: any value of the dtype is one
        MG_CHECK(t.dtype() == *known->dtype, ValueError, where, " has dtype ", t.dtype(), " (expected ", *known->dtype,
                 ")");
      } else {
        MG_CHECK(is_floating(t.dtype()), ValueError, where, " has dtype ", t.dtype(), " (expected a floating dtype)");
        const std::string bad = first_bad_value(t, known->nonnegative);
        MG_CHECK(bad.empty(), ValueError, where, ": ", bad);
      }
      st.buffers[name] = t;
    }
    state[p.impl()] = std::move(st);
  }
  // Tensors under "state.<i>." for a parameter without a step entry are a malformed file.
  for (auto& [name, t] : sd.tensors) {
    if (name.compare(0, 6, "state.") != 0) continue;
    const std::string key = name.substr(6, name.find('.', 6) - 6);
    MG_CHECK(jstate.contains(key), ValueError, op, ": tensor ", name, " has no \"state\" entry");
  }

  // Copies in the dtype the optimizer keeps, on the parameter's device: the loaded file's
  // tensors are not aliased, and every allocation happens before the commit.
  {
    NoGradGuard ng;
    MemoryCategoryGuard cat(MemoryCategory::OptimizerState);
    for (auto& [p, gi] : params) {
      auto it = state.find(p->impl());
      if (it == state.end()) continue;
      const StateSpec spec = state_spec(options[gi], *p);
      for (auto& [name, t] : it->second.buffers) {
        auto known = std::find_if(spec.buffers.begin(), spec.buffers.end(), [&](auto& b) { return b.name == name; });
        Tensor copy = empty(t.sizes(), {known->dtype.value_or(spec.dtype), p->device()});
        raw::copy_(copy, t);
        t = copy;
      }
    }
  }
  return [this, options = std::move(options), state = std::move(state)]() mutable {
    for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = std::move(options[gi]);
    state_ = std::move(state);
  };
}

}  // namespace mg::optim
