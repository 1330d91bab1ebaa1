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
#include "serialize/serialize.h"

// Components register a save and a load function, so anything with state_dict() /
// load_state_dict(const StateDict&) plugs in (Module, the optimizers, LR schedulers, GradScaler)
// without this file depending on optim/. Component "model" saves its tensors as "model.<key>" and
// its meta under meta["model"]; meta["checkpoint"] holds step, epoch, the component list and the
// caller's extra fields. (Not mg::checkpoint, autograd/recompute.h: that is activation recomputation.)
namespace mg::serialize {

template <class T>
concept HasStateDict = requires(T& t, const StateDict& sd) {
  { t.state_dict() } -> std::convertible_to<StateDict>;
  t.load_state_dict(sd);
};
// One whose load splits into checking and committing (Module, the optimizers, LR schedulers,
// GradScaler): stage_state_dict(sd) raises or returns the commit.
template <class T>
concept HasStagedLoad = HasStateDict<T> && requires(T& t, const StateDict& sd) {
  { t.stage_state_dict(sd) } -> std::convertible_to<StagedLoad>;
};

class TrainingCheckpoint {
 public:
  using SaveFn = std::function<StateDict()>;
  using LoadFn = std::function<void(const StateDict&)>;
  using StageFn = std::function<StagedLoad(const StateDict&)>;

  // `name`: non-empty, no '.', not "checkpoint", unique. Components are saved in registration
  // order. A staged component (add_staged, or a HasStagedLoad object) is checked with the
  // others before any is changed; a plain `load` function can only run at commit time.
  TrainingCheckpoint& add(const std::string& name, SaveFn save, LoadFn load);
  TrainingCheckpoint& add_staged(const std::string& name, SaveFn save, StageFn stage);
  template <HasStateDict T>
  TrainingCheckpoint& add(const std::string& name, T& component) {
    SaveFn save = [&component] { return StateDict(component.state_dict()); };
    if constexpr (HasStagedLoad<T>)
      return add_staged(name, std::move(save),
                        [&component](const StateDict& sd) { return StagedLoad(component.stage_state_dict(sd)); });
    else
      return add(name, std::move(save), [&component](const StateDict& sd) { component.load_state_dict(sd); });
  }
  // A Philox generator's seed and offset. One generator (default_generator()) drives both CPU
  // and CUDA sampling (dropout masks, init), so add_generator("rng", default_generator())
  // restores the random stream on every device; add other generators (a data shuffler's) too.
  TrainingCheckpoint& add_generator(const std::string& name, Generator& gen);

  int64_t step = 0;
  int64_t epoch = 0;
  // Caller's own fields (best validation loss, run id): saved and restored as they are.
  nlohmann::json extra = nlohmann::json::object();

  // Gathers every component's state and writes `path` atomically (serialize::save): a crash or error
  // while saving leaves the previous checkpoint at `path` intact.
  void save(const std::string& path) const;
  // All parts or none. Reads and validates the whole file, checks it holds exactly the
  // registered components (mg::ValueError naming those missing or unexpected) and the header's
  // step, epoch and extra, then stages every staged component (each checks its part and makes
  // its copies; an error names the component), and only then commits: the plain-load
  // components first, in registration order (an error there leaves every staged component
  // unchanged), then the staged ones, which do not fail. Tensors are read onto `device`;
  // components copy them where they live.
  void load(const std::string& path, Device device = Device::cpu());

  // The same without a file.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

  std::vector<std::string> component_names() const;

 private:
  struct Component {
    std::string name;
    SaveFn save;
    StageFn stage;  // set for staged components
    LoadFn load;    // set for plain ones
  };
  TrainingCheckpoint& add_component(Component c);
  std::vector<Component> components_;
};

}  // namespace mg::serialize
