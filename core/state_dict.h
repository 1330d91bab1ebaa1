// StateDict: what modules, optimizers, LR schedulers and the GradScaler save and load: named
// tensors plus JSON metadata (step counts, hyper-parameters). serialize/serialize.h writes it as safetensors.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace mg {

// The second half of a two-phase load: stage_state_dict(sd) checks everything and makes every
// allocation (copies onto the live tensors' devices) and returns this; calling it commits the
// staged state and does not throw. TrainingCheckpoint stages all its parts before committing any.
using StagedLoad = std::function<void()>;

struct StateDict {
  // Ordered by name so files and comparisons are deterministic.
  std::map<std::string, Tensor> tensors;
  // Scalars, strings and nested objects (safetensors' "__metadata__" holds it as a string).
  nlohmann::json meta = nlohmann::json::object();

  // Copies every entry of `other` in under "prefix." (tensors and meta alike).
  void merge(const std::string& prefix, const StateDict& other) {
    for (const auto& [k, v] : other.tensors) tensors[prefix + "." + k] = v;
    if (!other.meta.empty()) meta[prefix] = other.meta;
  }
  // The entries under "prefix." with the prefix stripped (meta: meta[prefix] if present).
  StateDict sub(const std::string& prefix) const {
    StateDict out;
    const std::string p = prefix + ".";
    for (auto it = tensors.lower_bound(p); it != tensors.end() && it->first.compare(0, p.size(), p) == 0; ++it)
      out.tensors[it->first.substr(p.size())] = it->second;
    if (meta.contains(prefix)) out.meta = meta[prefix];
    return out;
  }
};

}  // namespace mg
