// Optimizer state keyed by parameter name: the state dicts of several optimizers that together
// step a model merged into the one a single optimizer over all of it loads, and the reverse split.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/state_dict.h"
#include "optim/optimizer.h"

// An optimizer's state dict numbers its parameters (torch.optim's layout, optim/optimizer.h), so
// it only fits an optimizer over the same parameters in the same order. Models built separately
// agree on their parameters' names (Module::named_parameters), so the name is the key that
// carries state from one split of a model's parameters to another: from an offloaded run
// (memory::HostParams' host optimizer + a device optimizer for the others) to one optimizer over
// every parameter on the device, and back.
//
// Only per-parameter state moves (Adam's moments and step, AdamW8bit's codes and scales, SGD's
// momentum: opaque tensors under "state.<i>.", the step under meta["state"]); the buffers are
// aliased, the target's load_state_dict copies them where its parameters live. The groups, the
// "params" lists included, are the target's; each group's option values are the ones the
// parts saved for its parameters (a scheduler's lr resumes as torch.optim's load would restore
// it; set another after loading), which must therefore agree within a target group.
namespace mg::optim {

// An optimizer's state dict (Optimizer::state_dict()) with the names of its parameters in its
// numbering order (across groups): names[i] is parameter i.
struct NamedState {
  StateDict state;
  std::vector<std::string> names;
};

// The names of `opt`'s parameters in its numbering order, looked up by identity in `named`
// (e.g. Module::named_parameters()). A parameter missing from `named` is a ValueError naming its
// index (across the groups) and shape.
std::vector<std::string> param_names(const Optimizer& opt, const std::vector<std::pair<std::string, Tensor>>& named);
// The same for a list of parameters in an optimizer's order (a saved part's, without building its
// optimizer: memory::HostParams' params() or gpt_linear_params(model), and the others).
std::vector<std::string> param_names(const std::vector<Tensor>& params,
                                     const std::vector<std::pair<std::string, Tensor>>& named);
// {opt.state_dict(), param_names(opt, named)}.
NamedState named_state(const Optimizer& opt, const std::vector<std::pair<std::string, Tensor>>& named);

// The state dict an optimizer with `target`'s layout loads: its type (the parts' common type),
// its groups and their "params" lists, and for each of its parameters the state the part naming
// that parameter holds. Only target.state's meta "type" and "param_groups" are read (pass
// named_state(target_optimizer, model.named_parameters())). ValueError, naming the parameter
// and the values, when: a part is malformed (its names do not match its parameter count); the
// parts' types differ (the target's may differ from theirs when its load converts, AdamW <->
// AdamW8bit); a name appears twice (in one part or two); a target name is in no part; a part's
// name is not in the target (its state would be dropped); the parts saved different values of an
// option for parameters of one target group.
StateDict merge_state_dicts(const std::vector<NamedState>& parts, const NamedState& target);

// The reverse: `whole`'s state distributed over `targets` (e.g. a device optimizer's and a host
// optimizer's layouts), one state dict each, in their order. Every name of `whole` must be in
// exactly one target and every target name in `whole`; the same errors as the merge otherwise.
std::vector<StateDict> split_state_dict(const NamedState& whole, const std::vector<NamedState>& targets);

}  // namespace mg::optim
