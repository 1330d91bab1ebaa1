#include "memory/param_offload.h"

#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "core/cuda_memory.h"
#include "kernels/ops.h"

namespace mg::memory {

HostSource::HostSource(Device device, HostOptimizerFactory make_optimizer)
    : device_(device), make_optimizer_(std::move(make_optimizer)) {
  MG_CHECK(device.is_cuda(), DeviceError, "HostSource: parameters are fetched to a CUDA device, got ", device);
  MG_CHECK(static_cast<bool>(make_optimizer_), ValueError, "HostSource: no optimizer factory");
  stream_ = cuda::Stream::create(device.index);
}

void HostSource::adopt(size_t unit, size_t group, const UnitGroup& layout, const Tensor& values) {
  MG_CHECK(host_ == nullptr, ValueError, "HostSource: a group adopted after the first fetch");
  MG_CHECK(layout.master_dtype == DType::f32, DTypeError, "HostSource: the masters are f32, unit ", unit, " group ",
           group, " is ", layout.master_dtype);
  if (index_.size() <= unit) index_.resize(unit + 1);
  index_[unit].push_back(masters_.size());
  NoGradGuard ng;
  Tensor m = raw::to_device(values, Device::cpu());
  m.requires_grad_(true);
  masters_.push_back(m);
  dtypes_.push_back(layout.dtype);
}

HostParams& HostSource::host() {
  if (!host_) host_ = std::make_unique<HostParams>(masters_, device_, make_optimizer_, dtypes_);
  return *host_;
}

std::function<void()> HostSource::fetch(size_t unit, size_t group, const Tensor& dst) {
  HostParams& h = host();
  const size_t i = index_.at(unit).at(group);
  const cuda::Stream compute = cuda::Stream::current(device_.index);
  cuda::Event ready;  // dst's memory was the compute stream's until now
  ready.record(compute);
  ready.wait(stream_);
  {
    cuda::StreamGuard sg(stream_);
    h.copy_to_device(i, dst);
  }
  cuda::Event done;
  done.record(stream_);
  return [done, device = device_] { done.wait(cuda::Stream::current(device.index)); };
}

void HostSource::reduce(size_t unit, size_t group, Tensor grad) {
  host().add_gradient(index_.at(unit).at(group), std::move(grad));
}

void HostSource::end_backward() { host().start_round(); }

void HostSource::abandon_step() {
  host().wait();
  host().start_round();
}

ParamOffload offload_gpt_params(nn::GPT& model, Device device, HostOptimizerFactory make_optimizer, int prefetch,
                                DType compute) {
  ParamOffload out;
  out.source = std::make_shared<HostSource>(device, std::move(make_optimizer));
  ParamUnitsOptions po;
  po.device = device;
  po.prefetch = prefetch;
  po.keep = {0};
  po.dtype = nn::gpt_unit_dtype(model, compute);
  out.units = std::make_unique<ParamUnits>(nn::gpt_param_units(model), out.source, po);
  model.recompute.units = out.units.get();
  out.source->host();  // the masters pinned and the optimizer built now, not at the first step
  return out;
}

namespace {

// One parameter's place in the masters: its master's index (in host().params()), where its
// values start there, the parameter (for its shape) and its name.
struct Slot {
  size_t master = 0;
  int64_t offset = 0;
  Tensor param;
  std::string name;
};

// Each master's parameters in unit-group order, named by `model`; every named parameter must be
// in a unit.
std::vector<std::vector<Slot>> slots_by_master(ParamOffload& po, const nn::Module& model, const char* op) {
  MG_CHECK(po.source && po.units, ValueError, op, ": the ParamOffload is empty");
  std::map<const TensorImpl*, std::string> name_of;
  for (const auto& [n, p] : model.named_parameters()) name_of[p.impl()] = n;
  std::vector<std::vector<Slot>> by_master(po.source->host().params().size());
  size_t found = 0;
  for (size_t u = 0; u < po.units->size(); ++u)
    for (size_t g = 0; g < po.units->groups(u).size(); ++g) {
      const UnitGroup& grp = po.units->groups(u)[g];
      const size_t m = po.source->master_index(u, g);
      for (size_t k = 0; k < grp.params.size(); ++k) {
        const auto it = name_of.find(grp.params[k].impl());
        MG_CHECK(it != name_of.end(), ValueError, op, ": unit ", u, " holds a parameter of shape ",
                 shape_str(grp.params[k].sizes()), " that the model does not name (another model's ParamOffload?)");
        by_master.at(m).push_back({m, grp.offsets[k], grp.params[k], it->second});
        ++found;
      }
    }
  MG_CHECK(found == name_of.size(), ValueError, op, ": the model names ", name_of.size(),
           " parameters, its units hold ", found, " (a parameter outside the offload)");
  return by_master;
}

// The host optimizer's numbering (parameters across its groups, in order) as master indices.
std::vector<size_t> masters_in_optimizer_order(HostParams& h) {
  std::map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < h.params().size(); ++i) index[h.params()[i].impl()] = i;
  std::vector<size_t> out;
  for (const optim::ParamGroup& g : h.optimizer().param_groups())
    for (const Tensor& p : g.params) out.push_back(index.at(p.impl()));
  return out;
}

Tensor slice_of(const Tensor& flat, const Slot& s) {
  return flat.reshape({-1}).slice(0, s.offset, s.offset + s.param.numel()).reshape(s.param.sizes());
}

// Tensors under "state.<n>." of an optimizer state dict, by buffer name.
std::map<std::string, Tensor> buffers_of(const StateDict& sd, const std::string& n) {
  std::map<std::string, Tensor> out;
  const std::string p = "state." + n + ".";
  for (auto it = sd.tensors.lower_bound(p); it != sd.tensors.end() && it->first.compare(0, p.size(), p) == 0; ++it)
    out[it->first.substr(p.size())] = it->second;
  return out;
}

}  // namespace

StateDict model_state_dict(ParamOffload& po, const nn::Module& model) {
  NoGradGuard ng;
  const auto by_master = slots_by_master(po, model, "model_state_dict");
  HostParams& h = po.source->host();
  h.wait();
  StateDict sd;
  for (const auto& slots : by_master)
    for (const Slot& s : slots) sd.tensors[s.name] = slice_of(h.params()[s.master], s).clone();
  return sd;
}

void load_model_state_dict(ParamOffload& po, const nn::Module& model, const StateDict& sd) {
  const char* op = "load_model_state_dict";
  NoGradGuard ng;
  const auto by_master = slots_by_master(po, model, op);
  HostParams& h = po.source->host();
  h.wait();
  std::set<std::string> names;
  for (const auto& slots : by_master)
    for (const Slot& s : slots) {
      names.insert(s.name);
      const auto it = sd.tensors.find(s.name);
      MG_CHECK(it != sd.tensors.end(), ValueError, op, ": the state dict has no \"", s.name, "\"");
      MG_CHECK(it->second.sizes() == s.param.sizes(), ShapeError, op, ": \"", s.name, "\" is ",
               shape_str(it->second.sizes()), ", the parameter ", shape_str(s.param.sizes()));
      MG_CHECK(is_floating(it->second.dtype()), DTypeError, op, ": \"", s.name, "\" is ", it->second.dtype(),
               ", not a floating dtype");
    }
  for (const auto& [k, v] : sd.tensors)
    MG_CHECK(names.count(k), ValueError, op, ": unexpected \"", k, "\" (the model has no such parameter)");
  for (const auto& slots : by_master) {
    if (slots.empty()) continue;
    const Tensor& master = h.params()[slots.front().master];
    for (const Slot& s : slots)
      raw::copy_(slice_of(master, s), raw::to_dtype(raw::to_device(sd.tensors.at(s.name), Device::cpu()), DType::f32));
    master.bump_version();  // its cast is written again before the next fetch reads it
  }
}

namespace {

// The host optimizer's state dict `flat` re-keyed per parameter: its groups over the parameters'
// numbering, their names, each parameter's step meta and, with `buffers`, each master's buffers
// sliced into its parameters (copies). Without them, the layout alone (what a load lays saved
// state out on).
optim::NamedState per_parameter(HostParams& h, const std::vector<std::vector<Slot>>& by_master, const StateDict& flat,
                                bool buffers, const char* op) {
  const std::vector<size_t> order = masters_in_optimizer_order(h);
  optim::NamedState out;
  out.state.meta = flat.meta;
  out.state.meta["state"] = nlohmann::json::object();
  nlohmann::json groups = nlohmann::json::array();
  int64_t j = 0;  // the per-parameter numbering
  size_t n = 0;   // the masters' numbering
  for (const nlohmann::json& g : flat.meta.at("param_groups")) {
    nlohmann::json ng = g;
    ng["params"] = nlohmann::json::array();
    for (size_t k = 0; k < g.at("params").size(); ++k, ++n) {
      const size_t mi = order.at(n);
      const Tensor& master = h.params()[mi];
      const std::string key = std::to_string(n);
      const std::map<std::string, Tensor> bufs = buffers ? buffers_of(flat, key) : std::map<std::string, Tensor>{};
      for (const auto& [b, t] : bufs)
        MG_CHECK(t.numel() == master.numel(), ValueError, op, ": the ", flat.meta.value("type", std::string("?")),
                 " buffer \"", b, "\" of master ", mi, " holds ", t.numel(), " values for its ", master.numel(),
                 " elements: not one a parameter element (8-bit moments are quantized in blocks across a unit's "
                 "parameters); resume in this mode with the host optimizer's own state_dict()");
      for (const Slot& s : by_master.at(mi)) {
        const std::string jk = std::to_string(j);
        ng["params"].push_back(j);
        out.names.push_back(s.name);
        if (buffers && flat.meta.contains("state") && flat.meta.at("state").contains(key))
          out.state.meta["state"][jk] = flat.meta.at("state").at(key);
        for (const auto& [b, t] : bufs) out.state.tensors["state." + jk + "." + b] = slice_of(t, s).clone();
        ++j;
      }
    }
    groups.push_back(ng);
  }
  out.state.meta["param_groups"] = groups;
  return out;
}

}  // namespace

optim::NamedState optimizer_named_state(ParamOffload& po, const nn::Module& model) {
  const char* op = "optimizer_named_state";
  NoGradGuard ng;
  const auto by_master = slots_by_master(po, model, op);
  HostParams& h = po.source->host();
  h.wait();
  return per_parameter(h, by_master, h.optimizer().state_dict(), true, op);
}

void load_optimizer_named_state(ParamOffload& po, const nn::Module& model, const optim::NamedState& saved) {
  const char* op = "load_optimizer_named_state";
  NoGradGuard ng;
  const auto by_master = slots_by_master(po, model, op);
  HostParams& h = po.source->host();
  h.wait();
  // The host optimizer's per-parameter layout, and the saved state laid out on it by name.
  const StateDict now = h.optimizer().state_dict();
  const optim::NamedState target = per_parameter(h, by_master, now, false, op);
  const StateDict per_param = optim::merge_state_dicts({saved}, target);
  const std::vector<size_t> order = masters_in_optimizer_order(h);
  StateDict flat;
  flat.meta = per_param.meta;
  flat.meta["state"] = nlohmann::json::object();
  nlohmann::json groups = nlohmann::json::array();
  const nlohmann::json& pg = per_param.meta.at("param_groups");
  int64_t j = 0;
  size_t n = 0;
  for (size_t gi = 0; gi < now.meta.at("param_groups").size(); ++gi) {
    nlohmann::json g = pg.at(gi);  // the options the saved state brings
    g["params"] = now.meta.at("param_groups").at(gi).at("params");
    for (size_t k = 0; k < g["params"].size(); ++k, ++n) {
      const size_t mi = order.at(n);
      const std::vector<Slot>& slots = by_master.at(mi);
      if (slots.empty()) continue;
      const Tensor& master = h.params()[mi];
      const int64_t j0 = j;
      const bool has = per_param.meta.contains("state") && per_param.meta.at("state").contains(std::to_string(j0));
      std::map<std::string, Tensor> full;
      for (const Slot& s : slots) {
        const std::string jk = std::to_string(j++);
        const bool mine = per_param.meta.contains("state") && per_param.meta.at("state").contains(jk);
        MG_CHECK(mine == has, ValueError, op, ": \"", s.name, "\" has ", mine ? "" : "no ", "optimizer state and \"",
                 slots.front().name, "\" ", has ? "has" : "has none",
                 ": they share one master (unit), whose state is one");
        if (!has) continue;
        const nlohmann::json& st = per_param.meta.at("state");
        MG_CHECK(st.at(jk) == st.at(std::to_string(j0)), ValueError, op, ": \"", s.name, "\" was saved at ",
                 st.at(jk).dump(), " and \"", slots.front().name, "\" at ", st.at(std::to_string(j0)).dump(),
                 ": one master (unit) takes one step count");
        for (const auto& [b, t] : buffers_of(per_param, jk)) {
          MG_CHECK(t.numel() == s.param.numel(), ValueError, op, ": the ",
                   per_param.meta.value("type", std::string("?")), " buffer \"", b, "\" of \"", s.name, "\" holds ",
                   t.numel(), " values for the parameter's ", s.param.numel(),
                   ": not one an element (convert 8-bit moments to AdamW's first)");
          auto it = full.find(b);
          if (it == full.end())
            it = full.emplace(b, zeros({master.numel()}, TensorOptions(t.dtype(), Device::cpu()))).first;
          raw::copy_(slice_of(it->second, s), raw::to_device(t, Device::cpu()));
        }
      }
      if (!has) continue;
      const std::string key = std::to_string(n);
      flat.meta["state"][key] = per_param.meta.at("state").at(std::to_string(j0));
      for (auto& [b, t] : full) flat.tensors["state." + key + "." + b] = t;
    }
    groups.push_back(g);
  }
  flat.meta["param_groups"] = groups;
  h.optimizer().load_state_dict(flat);
}

}  // namespace mg::memory
