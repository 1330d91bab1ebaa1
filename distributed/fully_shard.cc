#include "distributed/fully_shard.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "distributed/zero.h"
#include "core/allocator.h"
#include "core/atomic_file.h"
#include "core/cuda_memory.h"
#include "kernels/ops.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "serialize/serialize.h"

namespace mg::dist {

ShardSource::ShardSource(std::shared_ptr<ProcessGroup> pg, int max_reductions_in_flight, bool host_shards)
    : pg_(std::move(pg)), max_in_flight_(max_reductions_in_flight), host_shards_(host_shards) {
  MG_CHECK(pg_ != nullptr, ValueError, "ShardSource: no process group");
  MG_CHECK(max_in_flight_ >= 1, ValueError, "ShardSource: max_reductions_in_flight must be >= 1, got ", max_in_flight_);
}

void ShardSource::adopt(size_t unit, size_t group, const UnitGroup& layout, const Tensor& values) {
  if (shards_.size() <= unit) shards_.resize(unit + 1);
  MG_CHECK(shards_[unit].size() == group, ValueError, "ShardSource: unit ", unit, " group ", group,
           " adopted out of order");
  const int64_t n = layout.padded / pg_->size(), r = pg_->rank();
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::Parameters);
  Tensor shard = raw::to_device(raw::clone(raw::slice(values, 0, r * n, (r + 1) * n, 1)), shard_device());
  // Pinned, so that its copies to the device for a gather run at the link's speed.
  if (host_shards_ && pg_->device().is_cuda()) shard = cuda::pin_memory(shard);
  shard.requires_grad_(true);
  shards_[unit].push_back(shard);
}

std::function<void()> ShardSource::fetch(size_t unit, size_t group, const Tensor& dst) {
  const Tensor& master = shards_.at(unit).at(group);
  Tensor src;
  {
    NoGradGuard ng;
    MemoryCategoryGuard cat(MemoryCategory::Gathered);
    // A shard in host memory goes to the device first (FSDP2's CPUOffloadPolicy: the f32 shard
    // crosses the link, the cast runs on the device).
    const Tensor here =
        master.device() == dst.device() ? master.detach() : raw::to_device(master.detach(), dst.device());
    src = dst.dtype() == here.dtype() ? here : kernels::cast(here, dst.dtype());
  }
  WorkPtr work = pg_->all_gather_async(dst, src);
  return [work, src] { work->wait(); };  // src stays alive until the gather has read it
}

void ShardSource::complete(Pending& p) {
  p.work->wait();
  NoGradGuard ng;
  const Tensor& master = shards_[p.unit][p.group];
  Tensor g = master.grad();
  Tensor add = p.out.dtype() == master.dtype() ? p.out : kernels::cast(p.out, master.dtype());
  if (add.device() != master.device()) {  // the shard's gradient goes home to host memory
    MemoryCategoryGuard cat(MemoryCategory::Gradients);
    add = raw::to_device(add, master.device());
  }
  master.set_grad(g.defined() ? kernels::add(g, add) : add);
  p = Pending{};
}

void ShardSource::reduce(size_t unit, size_t group, Tensor grad) {
  NoGradGuard ng;
  // Earlier reductions that finished, or the oldest when too many are in flight: each holds a
  // unit's full gradient until it completes.
  while (!pending_.empty() &&
         (pending_.front().work->completed() || static_cast<int>(pending_.size()) >= max_in_flight_)) {
    complete(pending_.front());
    pending_.erase(pending_.begin());
  }
  const Tensor& master = shards_.at(unit).at(group);
  MemoryCategoryGuard cat(MemoryCategory::Gradients);
  // Reduced in f32 (or the master's wider dtype): a bf16 sum over ranks would round each add.
  Tensor in = grad.dtype() == master.dtype() ? grad : kernels::cast(grad, master.dtype());
  Tensor out = empty({master.numel()}, TensorOptions(master.dtype(), pg_->device()));
  pending_.push_back(Pending{pg_->reduce_scatter_async(out, in, ReduceOp::Avg), out, in, unit, group});
  ++reductions_;
}

void ShardSource::abandon_step() {
  for (Pending& p : pending_) p.work->wait();
  pending_.clear();
}

void ShardSource::end_backward() {
  for (Pending& p : pending_) complete(p);
  pending_.clear();
}

std::vector<Tensor> ShardSource::shards() const {
  std::vector<Tensor> out;
  for (const auto& unit : shards_)
    for (const Tensor& s : unit) out.push_back(s);
  return out;
}

double ShardSource::clip_grad_norm_(double max_norm) {
  end_backward();  // the reductions still in flight
  std::vector<Tensor> grads;
  for (const Tensor& s : shards())
    if (s.grad().defined()) grads.push_back(s.grad());
  return clip_sharded_grad_norm_(grads, *pg_, max_norm, "ShardSource::clip_grad_norm_");
}

namespace {
struct Place {
  size_t unit, group;
  int64_t offset;
};
std::unordered_map<const TensorImpl*, Place> places(const ParamUnits& units) {
  std::unordered_map<const TensorImpl*, Place> out;
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t g = 0; g < units.groups(u).size(); ++g) {
      const UnitGroup& grp = units.groups(u)[g];
      for (size_t k = 0; k < grp.params.size(); ++k) out[grp.params[k].impl()] = Place{u, g, grp.offsets[k]};
    }
  return out;
}
// Every rank's `slice` (equal lengths), concatenated in rank order: an all-gather on the group's
// device (a slice in host memory goes there and back).
Tensor gather_whole(ProcessGroup& pg, const Tensor& slice) {
  const Tensor src = slice.device() == pg.device() ? slice : raw::to_device(slice, pg.device());
  Tensor out = empty({slice.numel() * pg.size()}, TensorOptions(slice.dtype(), pg.device()));
  pg.all_gather(out, src);
  return out.device() == slice.device() ? out : raw::to_device(out, slice.device());
}
// Copies the part of a parameter's whole value (`value`, any shape, at flat `offset` of its group)
// that falls in this rank's slice [lo, lo + shard.numel()) of the group into `shard`.
void copy_into_slice(const Tensor& shard, int64_t lo, const Tensor& value, int64_t offset) {
  const int64_t b = std::max(lo, offset), e = std::min(lo + shard.numel(), offset + value.numel());
  if (b >= e) return;
  raw::copy_(raw::slice(shard, 0, b - lo, e - lo, 1),
             raw::slice(raw::reshape(raw::contiguous(value), {-1}), 0, b - offset, e - offset, 1));
}
}  // namespace

StateDict FullyShardedModel::full_state_dict(const nn::Module& model) const {
  NoGradGuard ng;
  const auto where = places(*units);
  ProcessGroup& pg = source->process_group();
  // One all-gather a group, in unit order (every rank walks the same units).
  std::vector<std::vector<Tensor>> full(units->size());
  for (size_t u = 0; u < units->size(); ++u)
    for (size_t g = 0; g < units->groups(u).size(); ++g) {
      full[u].push_back(gather_whole(pg, source->shard(u, g).detach()));
    }
  StateDict sd;
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = where.find(p.impl());
    if (it == where.end()) {
      sd.tensors[name] = raw::clone(p.detach());  // a parameter no unit holds
      continue;
    }
    const Place& pl = it->second;
    sd.tensors[name] = raw::reshape(
        raw::clone(raw::slice(full[pl.unit][pl.group], 0, pl.offset, pl.offset + p.numel(), 1)), p.sizes());
  }
  return sd;
}

void FullyShardedModel::load_full_state_dict(const nn::Module& model, const StateDict& sd) {
  NoGradGuard ng;
  const auto where = places(*units);
  ProcessGroup& pg = source->process_group();
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = where.find(p.impl());
    if (it == where.end()) continue;
    auto t = sd.tensors.find(name);
    MG_CHECK(t != sd.tensors.end(), ValueError, "fully_shard load_full_state_dict: the state dict has no \"", name,
             "\"");
    MG_CHECK(t->second.sizes() == p.sizes(), ValueError, "fully_shard load_full_state_dict: \"", name, "\" is ",
             shape_str(t->second.sizes()), " in the state dict, ", shape_str(p.sizes()), " in the model");
    const Place& pl = it->second;
    const Tensor& s = source->shard(pl.unit, pl.group);
    copy_into_slice(s, pg.rank() * s.numel(), t->second, pl.offset);
  }
}

// ---- Sharded checkpoints -------------------------------------------------------------------
//
// A group j (the j-th of source->shards(): units in order, each unit's groups in order) is a flat
// [padded] space; rank r holds [r n, (r + 1) n), n = padded / world. A parameter is the run
// [offset, offset + numel) of one group. The optimizer over the shards keeps, for group j, the
// state "state.<j>.<buffer>" of n elements. Everything below moves between these two views.

namespace {

struct ParamAt {
  std::string name;
  Shape shape;
  size_t group;  // j
  int64_t offset, numel;
};

// Each parameter of `model` (named_parameters order) at its group and offset; the groups'
// padded lengths.
struct Layout {
  std::vector<ParamAt> params;
  std::vector<int64_t> padded;
};

Layout layout_of(const nn::Module& model, const ParamUnits& units, const char* op) {
  Layout L;
  std::vector<size_t> first_group;  // j of each unit's group 0
  for (size_t u = 0; u < units.size(); ++u) {
    first_group.push_back(L.padded.size());
    for (const UnitGroup& g : units.groups(u)) L.padded.push_back(g.padded);
  }
  const auto where = places(units);
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = where.find(p.impl());
    MG_CHECK(it != where.end(), ValueError, op, ": parameter \"", name,
             "\" is in no unit; a sharded checkpoint holds sharded parameters only");
    L.params.push_back(
        {name, p.sizes(), first_group[it->second.unit] + it->second.group, it->second.offset, p.numel()});
  }
  return L;
}

// `opt`'s state dict, checked to be one group over exactly source.shards() with elementwise state.
StateDict shard_optimizer_state(const optim::Optimizer& opt, const ShardSource& source, const char* op) {
  const std::vector<Tensor> shards = source.shards();
  MG_CHECK(opt.param_groups().size() == 1, ValueError, op,
           ": the optimizer over the shards must have one group, it has ", opt.param_groups().size());
  const std::vector<Tensor>& ps = opt.param_groups()[0].params;
  MG_CHECK(ps.size() == shards.size(), ValueError, op, ": the optimizer steps ", ps.size(), " tensors, the model has ",
           shards.size(), " shards (build it over source->shards())");
  for (size_t j = 0; j < ps.size(); ++j)
    MG_CHECK(ps[j].impl() == shards[j].impl(), ValueError, op, ": the optimizer's tensor ", j, " is not shard ", j,
             " (build it over source->shards())");
  StateDict sd = opt.state_dict();
  for (const auto& [key, t] : sd.tensors) {
    const size_t j = std::stoul(key.substr(6));  // "state.<j>.<buffer>"
    MG_CHECK(t.numel() == shards[j].numel(), ValueError, op, ": optimizer state ", key, " has ", t.numel(),
             " elements, its shard ", shards[j].numel(), ": only elementwise state (",
             sd.meta["type"].get<std::string>(), " keeps another) can be sharded");
  }
  return sd;
}

// The buffer names of group j's state in a shard-level optimizer dict.
std::vector<std::string> buffer_names(const StateDict& sd, size_t j) {
  std::vector<std::string> out;
  const std::string prefix = "state." + std::to_string(j) + ".";
  for (auto it = sd.tensors.lower_bound(prefix); it != sd.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out.push_back(it->first.substr(prefix.size()));
  return out;
}

// The parameter-level optimizer dict from the groups' whole [padded] buffers.
StateDict assemble_optimizer(const Layout& L, const nlohmann::json& type, const nlohmann::json& options,
                             const std::vector<std::optional<int64_t>>& steps,
                             const std::vector<std::map<std::string, Tensor>>& whole) {
  StateDict sd;
  sd.meta["type"] = type;
  nlohmann::json group = options, ids = nlohmann::json::array(), states = nlohmann::json::object(),
                 names = nlohmann::json::array();
  for (size_t i = 0; i < L.params.size(); ++i) {
    const ParamAt& p = L.params[i];
    ids.push_back(static_cast<int64_t>(i));
    names.push_back(p.name);
    if (!steps[p.group]) continue;
    states[std::to_string(i)] = {{"step", *steps[p.group]}};
    for (const auto& [buf, flat] : whole[p.group])
      sd.tensors["state." + std::to_string(i) + "." + buf] =
          raw::reshape(raw::clone(raw::slice(flat, 0, p.offset, p.offset + p.numel, 1)), p.shape);
  }
  group["params"] = ids;
  sd.meta["param_groups"] = nlohmann::json::array({group});
  sd.meta["state"] = states;
  sd.meta["param_names"] = names;
  return sd;
}

std::string shard_file(int64_t rank, int64_t world) {
  return "fsdp-shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}
constexpr const char* kIndexFile = "fsdp-index.json";

}  // namespace

StateDict FullyShardedModel::full_optimizer_state_dict(const nn::Module& model, const optim::Optimizer& opt) const {
  const char* op = "fully_shard full_optimizer_state_dict";
  NoGradGuard ng;
  const Layout L = layout_of(model, *units, op);
  const StateDict local = shard_optimizer_state(opt, *source, op);
  ProcessGroup& pg = source->process_group();
  const size_t J = L.padded.size();
  std::vector<std::optional<int64_t>> steps(J);
  std::vector<std::map<std::string, Tensor>> whole(J);
  for (size_t j = 0; j < J; ++j) {
    const std::string key = std::to_string(j);
    if (!local.meta["state"].contains(key)) continue;
    steps[j] = local.meta["state"][key]["step"].get<int64_t>();
    for (const std::string& buf : buffer_names(local, j)) {
      whole[j][buf] = gather_whole(pg, raw::contiguous(local.tensors.at("state." + key + "." + buf)));
    }
  }
  nlohmann::json options = local.meta["param_groups"][0];
  options.erase("params");
  return assemble_optimizer(L, local.meta["type"], options, steps, whole);
}

void FullyShardedModel::load_full_optimizer_state_dict(const nn::Module& model, optim::Optimizer& opt,
                                                       const StateDict& sd) {
  const char* op = "fully_shard load_full_optimizer_state_dict";
  NoGradGuard ng;
  const Layout L = layout_of(model, *units, op);
  (void)shard_optimizer_state(opt, *source, op);
  MG_CHECK(sd.meta.contains("param_groups") && sd.meta["param_groups"].is_array() &&
               sd.meta["param_groups"].size() == 1 && sd.meta.contains("state") && sd.meta["state"].is_object(),
           ValueError, op, ": expected one parameter group and a state (what full_optimizer_state_dict returns)");
  // The dict's index of each of the model's parameters: by name where the dict names them.
  std::vector<std::string> index(L.params.size());
  if (sd.meta.contains("param_names")) {
    std::map<std::string, size_t> by_name;
    for (size_t i = 0; i < sd.meta["param_names"].size(); ++i)
      by_name[sd.meta["param_names"][i].get<std::string>()] = i;
    for (size_t i = 0; i < L.params.size(); ++i) {
      auto it = by_name.find(L.params[i].name);
      MG_CHECK(it != by_name.end(), ValueError, op, ": the optimizer state has no parameter \"", L.params[i].name,
               "\"");
      index[i] = std::to_string(it->second);
    }
  } else {
    MG_CHECK(
        sd.meta["param_groups"][0].contains("params") && sd.meta["param_groups"][0]["params"].size() == L.params.size(),
        ValueError, op, ": the dict holds ", sd.meta["param_groups"][0].value("params", nlohmann::json::array()).size(),
        " parameters, the model ", L.params.size());
    for (size_t i = 0; i < L.params.size(); ++i) index[i] = std::to_string(i);
  }
  ProcessGroup& pg = source->process_group();
  const std::vector<Tensor> shards = source->shards();
  const int64_t rank = pg.rank();
  StateDict local;
  local.meta["type"] = sd.meta.value("type", nlohmann::json(""));
  nlohmann::json group = sd.meta["param_groups"][0], ids = nlohmann::json::array(), states = nlohmann::json::object();
  for (size_t j = 0; j < shards.size(); ++j) ids.push_back(static_cast<int64_t>(j));
  group["params"] = ids;
  local.meta["param_groups"] = nlohmann::json::array({group});
  // Every parameter of a group has state or none does (one step count a shard): the first one
  // seen decides, by name.
  std::map<size_t, size_t> first_of_group;  // group -> index into L.params
  for (size_t i = 0; i < L.params.size(); ++i) {
    const ParamAt& p = L.params[i];
    const std::string j = std::to_string(p.group);
    const bool has = sd.meta["state"].contains(index[i]);
    const size_t first = first_of_group.try_emplace(p.group, i).first->second;
    MG_CHECK(sd.meta["state"].contains(index[first]) == has, ValueError, op, ": \"", p.name, "\" and \"",
             L.params[first].name, "\" share a shard, and only one of them has optimizer state");
    if (!has) continue;
    const nlohmann::json& st = sd.meta["state"][index[i]];
    MG_CHECK(st.contains("step") && st["step"].is_number_integer(), ValueError, op, ": the state of \"", p.name,
             "\" has no integer step");
    if (!states.contains(j)) states[j] = {{"step", st["step"]}};
    MG_CHECK(states[j]["step"] == st["step"], ValueError, op, ": \"", p.name, "\" is at step ", st["step"].dump(),
             ", the other parameters of its shard at ", states[j]["step"].dump());
    const int64_t n = shards[p.group].numel();
    const std::string prefix = "state." + index[i] + ".";
    for (auto it = sd.tensors.lower_bound(prefix); it != sd.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const Tensor& t = it->second;
      MG_CHECK(t.numel() == p.numel, ValueError, op, ": ", it->first, " (\"", p.name, "\") has ", t.numel(),
               " elements, the parameter ", p.numel);
      const std::string key = "state." + j + "." + it->first.substr(prefix.size());
      if (!local.tensors.count(key)) local.tensors[key] = zeros({n}, TensorOptions(t.dtype(), Device::cpu()));
      copy_into_slice(local.tensors[key], rank * n, t.cpu(), p.offset);
    }
  }
  local.meta["state"] = states;
  opt.load_state_dict(local);
}

void FullyShardedModel::save_sharded(const nn::Module& model, const optim::Optimizer& opt,
                                     const std::string& dir) const {
  const char* op = "fully_shard save_sharded";
  NoGradGuard ng;
  const Layout L = layout_of(model, *units, op);
  const StateDict local = shard_optimizer_state(opt, *source, op);
  MG_CHECK(std::filesystem::is_directory(dir), IOError, op, ": ", dir, " is not a directory");
  ProcessGroup& pg = source->process_group();
  const int64_t N = pg.size(), rank = pg.rank();
  // The save's id, drawn on rank 0: shards of another save in the same directory are told apart.
  Tensor id_t = full({1}, 0.0, TensorOptions(DType::i64, Device::cpu()));
  if (rank == 0) {
    std::random_device rd;
    id_t.data_ptr<int64_t>()[0] = static_cast<int64_t>((static_cast<uint64_t>(rd()) << 31) ^ rd()) & INT64_MAX;
  }
  id_t = raw::to_device(id_t, pg.device());
  pg.broadcast(id_t, 0);
  const std::string id = std::to_string(raw::to_device(id_t, Device::cpu()).item<int64_t>());

  StateDict shard;
  const std::vector<Tensor> shards = source->shards();
  nlohmann::json steps = nlohmann::json::object();
  for (size_t j = 0; j < shards.size(); ++j) {
    const std::string key = std::to_string(j);
    shard.tensors["param." + key] = raw::to_device(shards[j].detach(), Device::cpu());
    if (!local.meta["state"].contains(key)) continue;
    steps[key] = local.meta["state"][key]["step"];
    for (const std::string& buf : buffer_names(local, j))
      shard.tensors["state." + key + "." + buf] =
          raw::to_device(local.tensors.at("state." + key + "." + buf), Device::cpu());
  }
  shard.meta["fsdp"] = {{"id", id}, {"rank", rank}, {"world", N}, {"steps", steps}};
  serialize::save(shard, dir + "/" + shard_file(rank, N));
  pg.barrier();
  if (rank == 0) {
    nlohmann::json groups = nlohmann::json::array(), params = nlohmann::json::array(), files = nlohmann::json::array();
    for (int64_t p : L.padded) groups.push_back({{"padded", p}});
    for (const ParamAt& p : L.params)
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"group", p.group}, {"offset", p.offset}});
    for (int64_t r = 0; r < N; ++r) files.push_back(shard_file(r, N));
    nlohmann::json options = local.meta["param_groups"][0];
    options.erase("params");
    const nlohmann::json index = {{"format", "memgrad-fsdp"},
                                  {"version", 1},
                                  {"id", id},
                                  {"world", N},
                                  {"files", files},
                                  {"groups", groups},
                                  {"params", params},
                                  {"optimizer", {{"type", local.meta["type"]}, {"options", options}}}};
    const std::string text = index.dump(1);
    write_file_atomically(dir + "/" + kIndexFile, [&](const ByteSink& sink) { sink(text.data(), text.size()); });
  }
  pg.barrier();
}

FullCheckpoint read_fsdp_checkpoint(const std::string& dir) {
  const char* op = "read_fsdp_checkpoint";
  const std::string index_path = dir + "/" + kIndexFile;
  std::ifstream in(index_path);
  MG_CHECK(in.good(), IOError, op, ": ", index_path,
           " is missing: not a sharded checkpoint, or its save did not finish");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json index = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  MG_CHECK(!index.is_discarded() && index.is_object() && index.value("format", "") == "memgrad-fsdp" &&
               index.contains("world") && index["world"].is_number_integer() && index["world"].get<int64_t>() >= 1 &&
               index.contains("groups") && index.contains("params") && index.contains("id") &&
               index.contains("optimizer"),
           IOError, op, ": ", index_path, " is not a memgrad-fsdp index");
  const int64_t world = index["world"].get<int64_t>();
  const std::string id = index["id"].get<std::string>();
  Layout L;
  try {
    for (const auto& g : index["groups"]) {
      L.padded.push_back(g.at("padded").get<int64_t>());
      MG_CHECK(L.padded.back() >= 0 && L.padded.back() % world == 0, IOError, op, ": ", index_path, ": group ",
               L.padded.size() - 1, " of ", L.padded.back(), " elements does not split ", world, " ways");
    }
    for (const auto& p : index["params"]) {
      ParamAt a{p.at("name").get<std::string>(), p.at("shape").get<Shape>(), p.at("group").get<size_t>(),
                p.at("offset").get<int64_t>(), 0};
      a.numel = 1;
      for (int64_t d : a.shape) a.numel *= d;
      MG_CHECK(a.group < L.padded.size() && a.offset >= 0 && a.offset + a.numel <= L.padded[a.group], IOError, op, ": ",
               index_path, ": \"", a.name, "\" lies outside its group");
      L.params.push_back(std::move(a));
    }
  } catch (const nlohmann::json::exception& e) {
    throw IOError(detail::format(op, ": ", index_path, ": ", e.what()));
  }
  const size_t J = L.padded.size();
  std::vector<Tensor> values(J);
  std::vector<std::map<std::string, Tensor>> whole(J);
  std::vector<std::optional<int64_t>> steps(J);
  for (int64_t r = 0; r < world; ++r) {
    const std::string path = dir + "/" + shard_file(r, world);
    MG_CHECK(std::filesystem::exists(path), IOError, op, ": ", path, " is missing (rank ", r, " of ", world, ")");
    const StateDict shard = serialize::load(path);
    MG_CHECK(shard.meta.contains("fsdp") && shard.meta["fsdp"].value("id", "") == id &&
                 shard.meta["fsdp"].value("rank", int64_t{-1}) == r &&
                 shard.meta["fsdp"].value("world", int64_t{-1}) == world,
             IOError, op, ": ", path, " (rank ", r, ") belongs to another save than ", index_path, " (its id ",
             shard.meta.contains("fsdp") ? shard.meta["fsdp"].value("id", "?") : "none", ", the index's ", id, ")");
    const nlohmann::json& shard_steps = shard.meta["fsdp"].value("steps", nlohmann::json::object());
    for (size_t j = 0; j < J; ++j) {
      const int64_t n = L.padded[j] / world;
      const std::string key = std::to_string(j);
      auto place = [&](Tensor& dst, const std::string& name) {
        auto it = shard.tensors.find(name);
        MG_CHECK(it != shard.tensors.end() && it->second.numel() == n, IOError, op, ": ", path, " (rank ", r,
                 ") lacks ", name, " of ", n, " elements");
        if (!dst.defined()) dst = zeros({L.padded[j]}, TensorOptions(it->second.dtype(), Device::cpu()));
        raw::copy_(raw::slice(dst, 0, r * n, (r + 1) * n, 1), it->second);
      };
      place(values[j], "param." + key);
      if (r == 0) {
        if (shard_steps.contains(key)) steps[j] = shard_steps[key].get<int64_t>();
        for (const std::string& buf : buffer_names(shard, j)) whole[j][buf] = Tensor();
      }
      for (auto& [buf, t] : whole[j]) place(t, "state." + key + "." + buf);
    }
  }
  FullCheckpoint out;
  for (const ParamAt& p : L.params)
    out.model.tensors[p.name] =
        raw::reshape(raw::clone(raw::slice(values[p.group], 0, p.offset, p.offset + p.numel, 1)), p.shape);
  out.optimizer = assemble_optimizer(L, index["optimizer"].value("type", nlohmann::json("")),
                                     index["optimizer"].value("options", nlohmann::json::object()), steps, whole);
  return out;
}

void FullyShardedModel::load_sharded(const nn::Module& model, optim::Optimizer& opt, const std::string& dir) {
  const FullCheckpoint ck = read_fsdp_checkpoint(dir);
  load_full_state_dict(model, ck.model);
  load_full_optimizer_state_dict(model, opt, ck.optimizer);
}

FullyShardedModel fully_shard(std::vector<std::vector<Tensor>> units, std::shared_ptr<ProcessGroup> pg,
                              FullyShardOptions opts) {
  FullyShardedModel m;
  m.source = std::make_shared<ShardSource>(pg, /*max_reductions_in_flight=*/2, opts.offload_to_host);
  ParamUnitsOptions po;
  po.device = pg->device();
  po.prefetch = opts.prefetch;
  for (size_t k : opts.keep)
    if (k < units.size()) po.keep.push_back(k);
  po.dtype = std::move(opts.dtype);
  m.units = std::make_unique<ParamUnits>(std::move(units), m.source, po);
  return m;
}

}  // namespace mg::dist
