// TrainingCheckpoint: all a training run needs to resume where it stopped (model, optimizer, LR
// scheduler, GradScaler, RNG generators, step and epoch) in one safetensors file, written atomically.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/state_dict.h"
#include "checkpoint/serialize.h"

// Components register a save and a load function, so anything with state_dict() /
// load_state_dict(const StateDict&) plugs in (Module, the optimizers, LR schedulers, GradScaler)
// without this file depending on optim/. Component "model" saves its tensors as "model.<key>" and
// its meta under meta["model"]; meta["checkpoint"] holds step, epoch, the component list and the
// caller's extra fields. (Not autograd/checkpoint: that is activation recomputation.)
namespace mg::nn {

template <class T>
concept HasStateDict = requires(T& t, const StateDict& sd) {
  { t.state_dict() } -> std::convertible_to<StateDict>;
  t.load_state_dict(sd);
};

class TrainingCheckpoint {
 public:
  using SaveFn = std::function<StateDict()>;
  using LoadFn = std::function<void(const StateDict&)>;

  // `name`: non-empty, no '.', not "checkpoint", unique. Components are saved and loaded in
  // registration order.
  TrainingCheckpoint& add(const std::string& name, SaveFn save, LoadFn load);
  template <HasStateDict T>
  TrainingCheckpoint& add(const std::string& name, T& component) {
    return add(
        name, [&component] { return StateDict(component.state_dict()); },
        [&component](const StateDict& sd) { component.load_state_dict(sd); });
  }
  // A Philox generator's seed and offset. One generator (default_generator()) drives both CPU
  // and CUDA sampling (dropout masks, init), so add_generator("rng", default_generator())
  // restores the random stream on every device; add other generators (a data shuffler's) too.
  TrainingCheckpoint& add_generator(const std::string& name, Generator& gen);

  int64_t step = 0;
  int64_t epoch = 0;
  // Caller's own fields (best validation loss, run id): saved and restored as they are.
  nlohmann::json extra = nlohmann::json::object();

  // Gathers every component's state and writes `path` atomically (nn::save): a crash or error
  // while saving leaves the previous checkpoint at `path` intact.
  void save(const std::string& path) const;
  // Reads and validates the whole file, checks it holds exactly the registered components
  // (mg::ValueError naming those missing or unexpected), then loads each in order and restores
  // step, epoch and extra. Tensors are read onto `device`; components copy them where they live.
  // Components check their own state before changing anything, so a mismatch raises at the first
  // component that does not fit; earlier ones are already restored by then.
  void load(const std::string& path, Device device = Device::cpu());

  // The same without a file.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

  std::vector<std::string> component_names() const;

 private:
  struct Component {
    std::string name;
    SaveFn save;
    LoadFn load;
  };
  std::vector<Component> components_;
};

}  // namespace mg::nn
