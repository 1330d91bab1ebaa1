#include "optim/state_by_name.h"

#include <map>
#include <unordered_map>

#include "core/error.h"

namespace mg::optim {
namespace {

// One state dict read for re-keying: its type, its groups, each parameter's group, and each
// parameter's state (meta and tensors by buffer name).
struct Parsed {
  std::string label;  // "part 1", "target", ... for messages
  std::string type;
  const nlohmann::json* groups = nullptr;
  std::vector<size_t> group_of;
  std::map<size_t, const nlohmann::json*> state;
  std::map<size_t, std::map<std::string, Tensor>> tensors;
};

Parsed parse(const std::string& op, const std::string& label, const NamedState& ns, bool with_state) {
  const nlohmann::json& m = ns.state.meta;
  Parsed p;
  p.label = label;
  MG_CHECK(m.is_object() && m.contains("type") && m["type"].is_string() && m.contains("param_groups") &&
               m["param_groups"].is_array(),
           ValueError, op, ": ", label, " is not an optimizer state dict (meta needs a string \"type\" and a ",
           "\"param_groups\" list)");
  p.type = m["type"].get<std::string>();
  p.groups = &m["param_groups"];
  for (size_t g = 0; g < p.groups->size(); ++g) {
    const nlohmann::json& jg = (*p.groups)[g];
    MG_CHECK(jg.is_object() && jg.contains("params") && jg["params"].is_array(), ValueError, op, ": ", label,
             ", group ", g, " has no \"params\" list");
    p.group_of.insert(p.group_of.end(), jg["params"].size(), g);
  }
  MG_CHECK(ns.names.size() == p.group_of.size(), ValueError, op, ": ", label, " has ", p.group_of.size(),
           " parameters but ", ns.names.size(), " names");
  if (!with_state) return p;
  MG_CHECK(m.contains("state") && m["state"].is_object(), ValueError, op, ": ", label,
           " has no \"state\" object in its meta");
  for (auto& [key, js] : m["state"].items()) {
    size_t i = 0;
    MG_CHECK(parse_state_index(key, &i) && i < p.group_of.size(), ValueError, op, ": ", label, " holds state for \"",
             key, "\", not the index of one of its ", p.group_of.size(), " parameters");
    p.state[i] = &js;
  }
  for (auto& [name, t] : ns.state.tensors) {
    const size_t dot = name.find('.', 6);
    size_t i = 0;
    MG_CHECK(name.compare(0, 6, "state.") == 0 && dot != std::string::npos &&
                 parse_state_index(name.substr(6, dot - 6), &i) && i < p.group_of.size() && dot + 1 < name.size(),
             ValueError, op, ": ", label, " holds tensor \"", name, "\", not \"state.<i>.<buffer>\" of one of its ",
             p.group_of.size(), " parameters");
    p.tensors[i][name.substr(dot + 1)] = t;
  }
  return p;
}

// The group options a state dict saved (every number but the "params" list).
std::map<std::string, nlohmann::json> numeric_options(const nlohmann::json& group) {
  std::map<std::string, nlohmann::json> out;
  for (auto& [k, v] : group.items())
    if (k != "params" && v.is_number()) out[k] = v;
  return out;
}

// The core of the merge and the split: target's layout filled from `parts` by name.
// `drop_ok`: a part's name may be absent from the target (the split's caller checks coverage).
StateDict restate(const std::string& op, const std::vector<Parsed>& parts, const std::vector<NamedState>& named,
                  const Parsed& target, const NamedState& target_named, bool drop_ok) {
  for (size_t k = 1; k < parts.size(); ++k)
    MG_CHECK(parts[k].type == parts[0].type, ValueError, op, ": ", parts[k].label, " was saved by a ", parts[k].type,
             " optimizer, ", parts[0].label, " by a ", parts[0].type, "; the parts must be of one type");
  struct Where {
    size_t part, index;
  };
  std::unordered_map<std::string, Where> where;
  for (size_t k = 0; k < parts.size(); ++k)
    for (size_t i = 0; i < named[k].names.size(); ++i) {
      const std::string& n = named[k].names[i];
      auto [it, fresh] = where.try_emplace(n, Where{k, i});
      MG_CHECK(fresh, ValueError, op, ": parameter \"", n, "\" is in ", parts[it->second.part].label, " (index ",
               it->second.index, ") and in ", parts[k].label, " (index ", i, ")");
    }

  StateDict out;
  out.meta["type"] = parts.empty() ? target.type : parts[0].type;
  nlohmann::json groups = nlohmann::json::array(), states = nlohmann::json::object();
  std::unordered_map<std::string, size_t> seen;  // target name -> its index
  size_t j = 0;
  for (size_t g = 0; g < target.groups->size(); ++g) {
    const nlohmann::json& tg = (*target.groups)[g];
    nlohmann::json jg = tg;
    // The options the parts saved for this group's parameters, from its first parameter.
    std::map<std::string, nlohmann::json> agreed;
    std::string first;  // the group's first parameter (its options are `agreed`)
    bool have_first = false;
    for (size_t n = 0; n < tg["params"].size(); ++n, ++j) {
      const std::string& name = target_named.names[j];
      auto [st, fresh] = seen.try_emplace(name, j);
      MG_CHECK(fresh, ValueError, op, ": parameter \"", name, "\" appears twice in the ", target.label, " (index ",
               st->second, " and ", j, ")");
      auto it = where.find(name);
      MG_CHECK(it != where.end(), ValueError, op, ": parameter \"", name, "\" (", target.label, " index ", j,
               ", group ", g, ") is in no part: no saved state names it");
      const auto [k, i] = it->second;
      const Parsed& src = parts[k];
      const std::map<std::string, nlohmann::json> opts = numeric_options((*src.groups)[src.group_of[i]]);
      if (!have_first) {
        have_first = true;
        first = name;
        agreed = opts;
      } else {
        for (auto& [key, v] : opts) {
          auto a = agreed.find(key);
          MG_CHECK(a != agreed.end() && a->second == v, ValueError, op, ": parameter \"", name, "\" (", src.label,
                   ") was saved with ", key, " = ", v.dump(), ", parameter \"", first, "\" of the same ", target.label,
                   " group ", g, " with ", a == agreed.end() ? std::string("none") : a->second.dump());
        }
        for (auto& [key, v] : agreed)
          MG_CHECK(opts.count(key), ValueError, op, ": parameter \"", name, "\" (", src.label, ") was saved without ",
                   key, ", parameter \"", first, "\" of the same ", target.label, " group ", g, " with ", key, " = ",
                   v.dump());
      }
      const std::string to = std::to_string(j);
      if (auto s = src.state.find(i); s != src.state.end()) states[to] = *s->second;
      if (auto t = src.tensors.find(i); t != src.tensors.end())
        for (auto& [buf, tensor] : t->second) out.tensors["state." + to + "." + buf] = tensor;
    }
    for (auto& [key, v] : agreed) jg[key] = v;
    groups.push_back(jg);
  }
  if (!drop_ok)  // the first such name in the parts' order
    for (size_t k = 0; k < parts.size(); ++k)
      for (size_t i = 0; i < named[k].names.size(); ++i)
        MG_CHECK(seen.count(named[k].names[i]), ValueError, op, ": parameter \"", named[k].names[i], "\" (",
                 parts[k].label, " index ", i, ") is not in the ", target.label, "; its state would be dropped");
  out.meta["param_groups"] = groups;
  out.meta["state"] = states;
  return out;
}

}  // namespace

std::vector<std::string> param_names(const std::vector<Tensor>& params,
                                     const std::vector<std::pair<std::string, Tensor>>& named) {
  std::unordered_map<const TensorImpl*, const std::string*> by_tensor;
  for (auto& [n, t] : named)
    if (t.defined()) by_tensor.emplace(t.impl(), &n);
  std::vector<std::string> out;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = params[i].defined() ? by_tensor.find(params[i].impl()) : by_tensor.end();
    MG_CHECK(it != by_tensor.end(), ValueError, "param_names: parameter ", i, " (shape ",
             params[i].defined() ? shape_str(params[i].sizes()) : std::string("undefined"), ") is not among the ",
             named.size(), " named tensors");
    out.push_back(*it->second);
  }
  return out;
}

std::vector<std::string> param_names(const Optimizer& opt, const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> params;  // numbered across the groups, as state_dict() numbers them
  for (const ParamGroup& g : opt.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
  return param_names(params, named);
}

NamedState named_state(const Optimizer& opt, const std::vector<std::pair<std::string, Tensor>>& named) {
  return {opt.state_dict(), param_names(opt, named)};
}

StateDict merge_state_dicts(const std::vector<NamedState>& parts, const NamedState& target) {
  const std::string op = "merge_state_dicts";
  std::vector<Parsed> parsed;
  for (size_t k = 0; k < parts.size(); ++k) parsed.push_back(parse(op, "part " + std::to_string(k), parts[k], true));
  return restate(op, parsed, parts, parse(op, "target", target, false), target, /*drop_ok=*/false);
}

std::vector<StateDict> split_state_dict(const NamedState& whole, const std::vector<NamedState>& targets) {
  const std::string op = "split_state_dict";
  const std::vector<Parsed> parsed{parse(op, "whole", whole, true)};
  std::vector<Parsed> layouts;
  for (size_t k = 0; k < targets.size(); ++k)
    layouts.push_back(parse(op, "target " + std::to_string(k), targets[k], false));
  // Every saved parameter goes to exactly one target.
  std::unordered_map<std::string, size_t> owner;
  for (size_t k = 0; k < targets.size(); ++k)
    for (const std::string& n : targets[k].names) {
      auto [it, fresh] = owner.try_emplace(n, k);
      MG_CHECK(fresh || it->second == k, ValueError, op, ": parameter \"", n, "\" is in target ", it->second,
               " and in target ", k);
    }
  for (size_t i = 0; i < whole.names.size(); ++i)
    MG_CHECK(owner.count(whole.names[i]), ValueError, op, ": parameter \"", whole.names[i], "\" (whole index ", i,
             ") is in no target; its state would be dropped");
  std::vector<StateDict> out;
  for (size_t k = 0; k < targets.size(); ++k)
    out.push_back(restate(op, parsed, {whole}, layouts[k], targets[k], /*drop_ok=*/true));
  return out;
}

}  // namespace mg::optim
