#include "serialize/training_checkpoint.h"

#include <algorithm>

namespace mg::serialize {

namespace {
constexpr const char* kSection = "checkpoint";
constexpr const char* kFormat = "memgrad.training_checkpoint";
constexpr int kVersion = 1;

// Runs f; an error is re-raised with the component's name in front, the same type where it
// matters most.
template <class F>
void in_component(const std::string& op, const std::string& name, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = op + ": component \"" + name + "\": " + e.what();
    if (dynamic_cast<const ShapeError*>(&e)) throw ShapeError(msg);
    if (dynamic_cast<const IOError*>(&e)) throw IOError(msg);
    throw ValueError(msg);
  } catch (const nlohmann::json::exception& e) {
    MG_THROW(ValueError, op, ": component \"", name, "\": malformed meta: ", e.what());
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + ("\"" + x + "\"");
  return s.empty() ? std::string("none") : s;
}
}  // namespace

TrainingCheckpoint& TrainingCheckpoint::add_component(Component c) {
  const std::string& name = c.name;
  MG_CHECK(!name.empty() && name.find('.') == std::string::npos && name != kSection, ValueError,
           "TrainingCheckpoint::add: component name \"", name, "\" must be non-empty, without '.', and not \"",
           kSection, "\"");
  MG_CHECK(c.save && (c.stage || c.load), ValueError, "TrainingCheckpoint::add(\"", name,
           "\"): empty save or load function");
  for (auto& other : components_)
    MG_CHECK(other.name != name, ValueError, "TrainingCheckpoint::add: component \"", name, "\" is already registered");
  components_.push_back(std::move(c));
  return *this;
}

TrainingCheckpoint& TrainingCheckpoint::add(const std::string& name, SaveFn save, LoadFn load) {
  return add_component({name, std::move(save), nullptr, std::move(load)});
}

TrainingCheckpoint& TrainingCheckpoint::add_staged(const std::string& name, SaveFn save, StageFn stage) {
  return add_component({name, std::move(save), std::move(stage), nullptr});
}

TrainingCheckpoint& TrainingCheckpoint::add_generator(const std::string& name, Generator& gen) {
  return add_staged(
      name,
      [&gen, name] {
        StateDict sd;
        const PhiloxState s = gen.get_state();
        sd.meta = {{"seed", s.seed}, {"offset", s.offset}};
        return sd;
      },
      [&gen, name](const StateDict& sd) -> StagedLoad {
        const auto& m = sd.meta;
        MG_CHECK(m.is_object() && m.contains("seed") && m.contains("offset") && m["seed"].is_number_unsigned() &&
                     m["offset"].is_number_unsigned(),
                 ValueError, "TrainingCheckpoint: generator \"", name, "\" needs unsigned seed and offset, got ",
                 m.dump());
        const PhiloxState s{m["seed"].get<uint64_t>(), m["offset"].get<uint64_t>()};
        return [&gen, s] { gen.set_state(s); };
      });
}

std::vector<std::string> TrainingCheckpoint::component_names() const {
  std::vector<std::string> out;
  for (auto& c : components_) out.push_back(c.name);
  return out;
}

StateDict TrainingCheckpoint::state_dict() const {
  StateDict out;
  for (auto& c : components_) {
    StateDict part = c.save();
    out.merge(c.name, part);
    // merge() leaves empty meta out; keep a marker so load can tell the component was saved.
    if (part.meta.empty()) out.meta[c.name] = nlohmann::json::object();
  }
  out.meta[kSection] = {
      {"format", kFormat}, {"version", kVersion}, {"step", step}, {"epoch", epoch}, {"components", component_names()},
      {"extra", extra}};
  return out;
}

void TrainingCheckpoint::load_state_dict(const StateDict& sd) {
  const std::string op = "TrainingCheckpoint::load";
  MG_CHECK(sd.meta.is_object() && sd.meta.contains(kSection), ValueError, op,
           ": not a training checkpoint (no meta[\"checkpoint\"]; a plain state dict?)");
  const nlohmann::json& head = sd.meta[kSection];
  MG_CHECK(head.is_object() && head.contains("format") && head["format"] == kFormat, ValueError, op,
           ": meta[\"checkpoint\"] is not a ", kFormat, " header");
  MG_CHECK(head.contains("version") && head["version"] == kVersion, ValueError, op, ": version ",
           head.contains("version") ? head["version"].dump() : "(none)", ", this build reads version ", kVersion);
  MG_CHECK(head.contains("step") && head["step"].is_number_integer() && head.contains("epoch") &&
               head["epoch"].is_number_integer() && head.contains("components") && head["components"].is_array(),
           ValueError, op, ": meta[\"checkpoint\"] lacks integer step/epoch or the component list");
  std::vector<std::string> saved;
  for (auto& n : head["components"]) {
    MG_CHECK(n.is_string(), ValueError, op, ": component list holds a non-string ", n.dump());
    saved.push_back(n.get<std::string>());
  }
  const std::vector<std::string> mine = component_names();
  std::vector<std::string> missing, unexpected;
  for (auto& n : mine)
    if (std::find(saved.begin(), saved.end(), n) == saved.end()) missing.push_back(n);
  for (auto& n : saved)
    if (std::find(mine.begin(), mine.end(), n) == mine.end()) unexpected.push_back(n);
  MG_CHECK(missing.empty() && unexpected.empty(), ValueError, op, ": the checkpoint holds components ", join(saved),
           "; missing: ", join(missing), "; unexpected: ", join(unexpected));
  MG_CHECK(!head.contains("extra") || head["extra"].is_object(), ValueError, op,
           ": meta[\"checkpoint\"][\"extra\"] is ", head["extra"].dump(), ", not an object");
  const int64_t new_step = head["step"].get<int64_t>(), new_epoch = head["epoch"].get<int64_t>();
  MG_CHECK(new_step >= 0 && new_epoch >= 0, ValueError, op, ": step ", head["step"].dump(), " and epoch ",
           head["epoch"].dump(), " must be >= 0");
  nlohmann::json new_extra = head.contains("extra") ? head["extra"] : nlohmann::json::object();

  // Stage every part (checks and copies), then commit: nothing changes unless all of it fits.
  std::vector<StagedLoad> commits;
  for (auto& c : components_)
    if (c.stage) in_component(op, c.name, [&] { commits.push_back(c.stage(sd.sub(c.name))); });
  for (auto& c : components_)
    if (c.load) in_component(op, c.name, [&] { c.load(sd.sub(c.name)); });
  for (auto& commit : commits) commit();
  step = new_step;
  epoch = new_epoch;
  extra = std::move(new_extra);
}

void TrainingCheckpoint::save(const std::string& path) const { serialize::save(state_dict(), path); }

void TrainingCheckpoint::load(const std::string& path, Device device) {
  try {
    load_state_dict(serialize::load(path, device));
  } catch (const IOError&) {
    throw;  // already names the file
  } catch (const ShapeError& e) {
    throw ShapeError(std::string(e.what()) + " (file " + path + ")");
  } catch (const Error& e) {
    throw ValueError(std::string(e.what()) + " (file " + path + ")");
  }
}

}  // namespace mg::serialize
