#include "checkpoint/training_checkpoint.h"

#include <algorithm>

namespace mg::nn {

namespace {
constexpr const char* kSection = "checkpoint";
constexpr const char* kFormat = "memgrad.training_checkpoint";
constexpr int kVersion = 1;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + ("\"" + x + "\"");
  return s.empty() ? std::string("none") : s;
}
}  // namespace

TrainingCheckpoint& TrainingCheckpoint::add(const std::string& name, SaveFn save, LoadFn load) {
  MG_CHECK(!name.empty() && name.find('.') == std::string::npos && name != kSection, ValueError,
           "TrainingCheckpoint::add: component name \"", name, "\" must be non-empty, without '.', and not \"",
           kSection, "\"");
  MG_CHECK(save && load, ValueError, "TrainingCheckpoint::add(\"", name, "\"): empty save or load function");
  for (auto& c : components_)
    MG_CHECK(c.name != name, ValueError, "TrainingCheckpoint::add: component \"", name, "\" is already registered");
  components_.push_back({name, std::move(save), std::move(load)});
  return *this;
}

TrainingCheckpoint& TrainingCheckpoint::add_generator(const std::string& name, Generator& gen) {
  return add(
      name,
      [&gen, name] {
        StateDict sd;
        const PhiloxState s = gen.get_state();
        sd.meta = {{"seed", s.seed}, {"offset", s.offset}};
        return sd;
      },
      [&gen, name](const StateDict& sd) {
        const auto& m = sd.meta;
        MG_CHECK(m.is_object() && m.contains("seed") && m.contains("offset") && m["seed"].is_number_unsigned() &&
                     m["offset"].is_number_unsigned(),
                 ValueError, "TrainingCheckpoint: generator \"", name, "\" needs unsigned seed and offset, got ",
                 m.dump());
        gen.set_state({m["seed"].get<uint64_t>(), m["offset"].get<uint64_t>()});
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
  for (auto& c : components_) {
    try {
      c.load(sd.sub(c.name));
    } catch (const Error& e) {
      // Re-raised with the component's name in front; same type where it matters most.
      const std::string msg = op + ": component \"" + c.name + "\": " + e.what();
      if (dynamic_cast<const ShapeError*>(&e)) throw ShapeError(msg);
      if (dynamic_cast<const IOError*>(&e)) throw IOError(msg);
      throw ValueError(msg);
    } catch (const nlohmann::json::exception& e) {
      MG_THROW(ValueError, op, ": component \"", c.name, "\": malformed meta: ", e.what());
    }
  }
  step = head["step"].get<int64_t>();
  epoch = head["epoch"].get<int64_t>();
  extra = head.contains("extra") ? head["extra"] : nlohmann::json::object();
}

void TrainingCheckpoint::save(const std::string& path) const { nn::save(state_dict(), path); }

void TrainingCheckpoint::load(const std::string& path, Device device) {
  try {
    load_state_dict(nn::load(path, device));
  } catch (const IOError&) {
    throw;  // already names the file
  } catch (const ShapeError& e) {
    throw ShapeError(std::string(e.what()) + " (file " + path + ")");
  } catch (const Error& e) {
    throw ValueError(std::string(e.what()) + " (file " + path + ")");
  }
}

}  // namespace mg::nn
