// ZeRO-1: the flat index space cut into chunks, each chunk split N ways; this rank's pieces
// are views of the parameters, so its optimizer updates them in place; the step then
// all-gathers every rank's updated slice, one chunk at a time.
#include "distributed/zero.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "kernels/ops.h"
#include "nn/module.h"
#include "serialize/serialize.h"

namespace mg::dist {

namespace {
Tensor flat_slice(const Tensor& t, int64_t begin, int64_t len) {
  return raw::slice(raw::view(t, {t.numel()}), 0, begin, begin + len, 1);
}

// Calls fn(i, offset in tensor i, offset in [begin, end), length) for every run of tensor i
// inside the flat range [begin, min(end, total)), where tensor i starts at offsets[i] and holds
// numel(i) elements.
template <class Numel, class F>
void for_each_overlap(const std::vector<int64_t>& offsets, int64_t total, int64_t begin, int64_t end, Numel numel,
                      F&& fn) {
  end = std::min(end, total);
  auto it = std::upper_bound(offsets.begin(), offsets.end(), begin);
  size_t i = it == offsets.begin() ? 0 : static_cast<size_t>(it - offsets.begin() - 1);
  for (; i < offsets.size() && offsets[i] < end; ++i) {
    const int64_t p_begin = offsets[i], p_end = p_begin + numel(i);
    const int64_t a = std::max(begin, p_begin), b = std::min(end, p_end);
    if (a < b) fn(i, a - p_begin, a - begin, b - a);
  }
}
}  // namespace

template <class F>
void ZeroRedundancyOptimizer::for_each_piece(int64_t begin, int64_t end, F&& fn) const {
  for_each_overlap(
      offsets_, total_, begin, end, [&](size_t i) { return params_[i].numel(); }, std::forward<F>(fn));
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> pg,
                                                 const Factory& make_local, ZeroOptions opts)
    : params_(std::move(params)), pg_(std::move(pg)), opts_(opts) {
  MG_CHECK(pg_ != nullptr, ValueError, "ZeroRedundancyOptimizer: process group is null");
  MG_CHECK(!params_.empty(), ValueError, "ZeroRedundancyOptimizer: got no parameters");
  MG_CHECK(opts.chunk_mb > 0, ValueError, "ZeroRedundancyOptimizer: chunk_mb must be positive, got ", opts.chunk_mb);
  dtype_ = params_[0].dtype();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined() && p.is_contiguous(), ValueError, "ZeroRedundancyOptimizer: parameter ", i,
             " must be a defined, contiguous tensor");
    MG_CHECK(p.dtype() == dtype_, DTypeError, "ZeroRedundancyOptimizer: parameter ", i, " is ", p.dtype(),
             ", parameter 0 is ", dtype_, " (one flat space needs one dtype)");
    MG_CHECK(p.device() == pg_->device(), DeviceError, "ZeroRedundancyOptimizer: parameter ", i, " is on ", p.device(),
             " but the process group works on ", pg_->device());
    offsets_.push_back(total_);
    total_ += p.numel();
  }
  const int64_t N = pg_->size();
  const int64_t elems = std::max<int64_t>(1, static_cast<int64_t>(opts.chunk_mb * 1048576.0) / dtype_size(dtype_));
  const int64_t per_rank_cap = std::max<int64_t>(1, elems / N);
  for (int64_t g = 0; g < total_;) {
    const int64_t per_rank = std::min(per_rank_cap, (total_ - g + N - 1) / N);
    chunks_.push_back({g, per_rank});
    shard_numel_ += per_rank;
    g += per_rank * N;
  }
  std::vector<Tensor> views;
  for (size_t k = 0; k < chunks_.size(); ++k) {
    const Chunk& c = chunks_[k];
    const int64_t begin = c.global_begin + pg_->rank() * c.per_rank;
    for_each_piece(begin, begin + c.per_rank, [&](size_t i, int64_t p_off, int64_t s_off, int64_t len) {
      // A leaf that aliases the parameter's storage: updating it updates the parameter.
      Tensor v = nn::parameter(flat_slice(params_[i].detach(), p_off, len));
      pieces_.push_back({i, p_off, s_off, len, k, v});
      views.push_back(v);
    });
  }
  if (views.empty()) {
    // A rank whose slice is all padding still needs an optimizer (with nothing to update).
    views.push_back(nn::parameter(zeros({1}, {dtype_, pg_->device()})));
  }
  local_ = make_local(views);
  MG_CHECK(local_ != nullptr, ValueError, "ZeroRedundancyOptimizer: the factory returned no optimizer");
  MG_CHECK(opts.stage == 1 || opts.stage == 2, ValueError, "ZeroRedundancyOptimizer: stage must be 1 or 2, got ",
           opts.stage);
  if (opts.stage == 2) {
    chunk_params_.resize(chunks_.size());
    param_chunks_.resize(params_.size());
    for (size_t k = 0; k < chunks_.size(); ++k) {
      const Chunk& c = chunks_[k];
      for_each_piece(c.global_begin, c.global_begin + c.per_rank * N, [&](size_t i, int64_t, int64_t, int64_t) {
        chunk_params_[k].push_back(i);
        param_chunks_[i].push_back(k);
      });
    }
    shard_grads_.resize(chunks_.size());
    start_round();
    for (size_t i = 0; i < params_.size(); ++i) {
      MG_CHECK(params_[i].is_leaf() && params_[i].requires_grad(), ValueError, "ZeroRedundancyOptimizer: stage 2 ",
               "reduces gradients as backward makes them; parameter ", i, " is not a leaf that requires grad");
      hooks_.push_back(
          autograd::register_post_accumulate_grad_hook(params_[i], [this, i](const Tensor&) { on_gradient(i); }));
    }
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  for (uint64_t h : hooks_) autograd::remove_post_accumulate_grad_hook(h);
}

void ZeroRedundancyOptimizer::start_round() {
  waiting_.assign(chunks_.size(), 0);
  for (size_t k = 0; k < chunks_.size(); ++k) waiting_[k] = static_cast<int64_t>(chunk_params_[k].size());
  unreduced_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) unreduced_[i] = static_cast<int64_t>(param_chunks_[i].size());
  reported_.assign(params_.size(), 0);
  reduced_.assign(chunks_.size(), 0);
  reduced_count_ = 0;
}

// A parameter's gradient is final for this backward: the chunks it completes are reduced now.
void ZeroRedundancyOptimizer::on_gradient(size_t i) {
  MG_CHECK(!reported_[i], AutogradError, "ZeroRedundancyOptimizer (stage 2): parameter ", i, " of shape ",
           shape_str(params_[i].sizes()),
           " received a second gradient before every parameter reported in this backward (used by two "
           "separately accumulated paths); its chunks are already reduced");
  reported_[i] = 1;
  for (size_t k : param_chunks_[i])
    if (--waiting_[k] == 0) {
      reduce_chunk(k);
      ++reduced_in_backward_;
    }
  if (reduced_count_ == chunks_.size()) start_round();
}

// Chunk k's gradients (zeros where a parameter has none), averaged over the ranks: this rank's
// slice of them.
Tensor ZeroRedundancyOptimizer::reduced_slice(size_t k) const {
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::Gradients);
  const Chunk& c = chunks_[k];
  const int64_t N = pg_->size();
  Tensor full = zeros({c.per_rank * N}, {dtype_, pg_->device()});
  for_each_piece(c.global_begin, c.global_begin + c.per_rank * N,
                 [&](size_t i, int64_t p_off, int64_t r_off, int64_t len) {
                   Tensor g = params_[i].grad();
                   if (g.defined())
                     kernels::copy_(flat_slice(full, r_off, len), flat_slice(raw::contiguous(g), p_off, len));
                 });
  Tensor mine = empty({c.per_rank}, {dtype_, pg_->device()});
  pg_->reduce_scatter(mine, full, ReduceOp::Avg);
  return mine;
}

// Stage 2: chunk k reduced into this rank's slices (added to what earlier backwards left); a
// parameter whose chunks are all reduced gives its full gradient up.
void ZeroRedundancyOptimizer::reduce_chunk(size_t k) {
  MemoryCategoryGuard cat(MemoryCategory::Gradients);  // the sum below
  Tensor mine = reduced_slice(k);
  shard_grads_[k] = shard_grads_[k].defined() ? kernels::add(shard_grads_[k], mine) : mine;
  reduced_[k] = 1;
  ++reduced_count_;
  for (size_t i : chunk_params_[k])
    if (--unreduced_[i] == 0) params_[i].set_grad(Tensor());
}

// Chunks whose parameters did not all report (some had no gradient) are reduced now, in chunk
// order on every rank; a chunk no backward reached counts as zeros.
void ZeroRedundancyOptimizer::finish_reduction() {
  for (size_t k = 0; k < chunks_.size(); ++k)
    if (!reduced_[k] && waiting_[k] < static_cast<int64_t>(chunk_params_[k].size())) reduce_chunk(k);
}

double clip_sharded_grad_norm_(const std::vector<Tensor>& local_grads, ProcessGroup& pg, double max_norm,
                               const char* op) {
  MG_CHECK(std::isfinite(max_norm) && max_norm >= 0.0, ValueError, op, ": max_norm must be finite and >= 0, got ",
           max_norm);
  NoGradGuard ng;
  const double mine = local_grads.empty() ? 0.0 : kernels::multi_tensor_norm(local_grads, 2.0);
  Tensor sq = full({1}, mine * mine, {DType::f64, pg.device()});
  pg.all_reduce(sq, ReduceOp::Sum);  // every element is in exactly one rank's part
  const double total = std::sqrt(raw::to_device(sq, Device::cpu()).item<double>());
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  if (coef != 1.0 && !local_grads.empty()) kernels::multi_tensor_scale_(local_grads, coef);
  return total;
}

double ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm) {
  MG_CHECK(opts_.stage == 2, ValueError, "ZeroRedundancyOptimizer::clip_grad_norm_: stage 1 keeps the full ",
           "gradients; clip them with optim::clip_grad_norm_ on the parameters");
  NoGradGuard ng;
  finish_reduction();
  std::vector<Tensor> slices;
  for (const Tensor& g : shard_grads_)
    if (g.defined()) slices.push_back(g);
  return clip_sharded_grad_norm_(slices, *pg_, max_norm, "ZeroRedundancyOptimizer::clip_grad_norm_");
}

std::pair<std::string, int64_t> ZeroRedundancyOptimizer::state_layout() const {
  const char* op = "ZeroRedundancyOptimizer: the state";
  const int64_t N = pg_->size();
  // The buffer names, from the first rank whose slice has state (a rank may own only padding).
  std::string names;
  int64_t step = 0;
  for (const Piece& pc : pieces_)
    if (const optim::ParamState* st = local_->state(pc.view)) {
      step = std::max(step, st->step_value());
      if (names.empty())
        for (const auto& [name, t] : st->buffers) {
          MG_CHECK(t.defined() && t.dtype() == dtype_ && t.numel() == pc.len, ValueError, op,
                   ": the local optimizer's ", "buffer '", name, "' is not elementwise (",
                   t.defined() ? shape_str(t.sizes()) : "undefined", " for a piece of ", pc.len, " elements)");
          names += name + ",";
        }
    }
  constexpr int64_t kNames = 256;
  MG_CHECK(static_cast<int64_t>(names.size()) < kNames, ValueError, op, ": buffer names too long: ", names);
  Tensor mine = zeros({kNames}, {DType::i64, Device::cpu()});  // one character an element
  std::copy(names.begin(), names.end(), mine.data_ptr<int64_t>());
  Tensor all = raw::to_device(pg_->all_gather(raw::to_device(mine, pg_->device())), Device::cpu());
  names.clear();
  for (int64_t r = 0; r < N && names.empty(); ++r)
    for (int64_t j = 0; j < kNames && all.data_ptr<int64_t>()[r * kNames + j] != 0; ++j)
      names += static_cast<char>(all.data_ptr<int64_t>()[r * kNames + j]);
  Tensor steps = full({1}, static_cast<double>(step), {DType::i64, pg_->device()});
  pg_->all_reduce(steps, ReduceOp::Max);
  return {names, raw::to_device(steps, Device::cpu()).item<int64_t>()};
}

// This rank's slice of chunk k of the state buffer `name` (zeros where it owns padding or a piece
// has no state yet).
Tensor ZeroRedundancyOptimizer::state_slice(size_t k, const std::string& name) const {
  Tensor slice = zeros({chunks_[k].per_rank}, {dtype_, pg_->device()});
  for (const Piece& pc : pieces_)
    if (pc.chunk == k)
      if (const optim::ParamState* st = local_->state(pc.view); st && st->buffers.count(name))
        kernels::copy_(flat_slice(slice, pc.slice_offset, pc.len), st->buffers.at(name));
  return slice;
}

namespace {
std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  for (size_t start = 0, end; (end = names.find(',', start)) != std::string::npos; start = end + 1)
    out.push_back(names.substr(start, end - start));
  return out;
}
}  // namespace

StateDict ZeroRedundancyOptimizer::full_state_dict() const {
  NoGradGuard ng;
  const int64_t N = pg_->size();
  const auto [names, step] = state_layout();
  StateDict sd;
  const StateDict local = local_->state_dict();
  sd.meta["type"] = local.meta["type"];
  nlohmann::json group = local.meta["param_groups"][0];
  nlohmann::json ids = nlohmann::json::array(), states = nlohmann::json::object();
  for (size_t i = 0; i < params_.size(); ++i) {
    ids.push_back(static_cast<int64_t>(i));
    if (!names.empty()) states[std::to_string(i)] = {{"step", step}};
  }
  group["params"] = ids;
  sd.meta["param_groups"] = nlohmann::json::array({group});
  sd.meta["state"] = states;
  for (const std::string& name : split_names(names)) {
    std::vector<Tensor> whole;
    for (const Tensor& p : params_) whole.push_back(zeros(p.sizes(), {dtype_, pg_->device()}));
    for (size_t k = 0; k < chunks_.size(); ++k) {
      const Chunk& c = chunks_[k];
      Tensor slice = state_slice(k, name);
      Tensor gathered = empty({c.per_rank * N}, {dtype_, pg_->device()});
      pg_->all_gather(gathered, slice);
      for_each_piece(c.global_begin, c.global_begin + c.per_rank * N,
                     [&](size_t i, int64_t p_off, int64_t r_off, int64_t len) {
                       kernels::copy_(flat_slice(whole[i], p_off, len), flat_slice(gathered, r_off, len));
                     });
    }
    for (size_t i = 0; i < params_.size(); ++i) sd.tensors["state." + std::to_string(i) + "." + name] = whole[i];
  }
  return sd;
}

void ZeroRedundancyOptimizer::load_full_state_dict(const StateDict& sd) {
  const char* op = "ZeroRedundancyOptimizer::load_full_state_dict";
  MG_CHECK(sd.meta.contains("param_groups") && sd.meta["param_groups"].is_array() &&
               sd.meta["param_groups"].size() == 1 && sd.meta.contains("state"),
           ValueError, op, ": expected one parameter group and a state (a full_state_dict)");
  const nlohmann::json& g = sd.meta["param_groups"][0];
  MG_CHECK(g.contains("params") && g["params"].size() == params_.size(), ValueError, op, ": the dict holds ",
           g.contains("params") ? g["params"].size() : 0, " parameters, this optimizer ", params_.size());
  StateDict local;
  const StateDict mine = local_->state_dict();
  local.meta["type"] = sd.meta.value("type", mine.meta["type"]);
  nlohmann::json lg = g;
  lg["params"] = mine.meta["param_groups"][0]["params"];
  local.meta["param_groups"] = nlohmann::json::array({lg});
  nlohmann::json states = nlohmann::json::object();
  for (size_t j = 0; j < pieces_.size(); ++j) {
    const Piece& pc = pieces_[j];
    const std::string key = std::to_string(pc.param);
    if (!sd.meta["state"].contains(key)) continue;
    states[std::to_string(j)] = sd.meta["state"][key];
    const std::string prefix = "state." + key + ".";
    for (auto it = sd.tensors.lower_bound(prefix); it != sd.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const Tensor& t = it->second;
      MG_CHECK(t.numel() == params_[pc.param].numel(), ValueError, op, ": ", it->first, " has ", t.numel(),
               " elements, parameter ", pc.param, " has ", params_[pc.param].numel());
      local.tensors["state." + std::to_string(j) + "." + it->first.substr(prefix.size())] =
          raw::clone(flat_slice(raw::contiguous(t), pc.param_offset, pc.len));
    }
  }
  local.meta["state"] = states;
  local_->load_state_dict(local);
}

namespace {
std::string shard_path(const std::string& dir, int64_t rank, int64_t world) {
  return dir + "/zero-shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}
}  // namespace

void ZeroRedundancyOptimizer::save_sharded(const std::string& dir) const {
  NoGradGuard ng;
  const auto [names, step] = state_layout();
  const int64_t N = pg_->size(), rank = pg_->rank();
  StateDict sd;
  nlohmann::json chunks = nlohmann::json::array(), params = nlohmann::json::array();
  for (const Chunk& c : chunks_) chunks.push_back({c.global_begin, c.per_rank});
  for (size_t i = 0; i < params_.size(); ++i)
    params.push_back({{"shape", params_[i].sizes()}, {"offset", offsets_[i]}});
  const StateDict local = local_->state_dict();
  nlohmann::json group = local.meta["param_groups"][0];
  group.erase("params");
  sd.meta["zero"] = {{"rank", rank},     {"world", N},
                     {"total", total_},  {"chunks", chunks},
                     {"params", params}, {"type", local.meta["type"]},
                     {"group", group},   {"step", step},
                     {"names", names},   {"dtype", dtype_name(dtype_)}};
  for (const std::string& name : split_names(names))
    for (size_t k = 0; k < chunks_.size(); ++k) {
      sd.tensors["chunk." + std::to_string(k) + "." + name] = raw::to_device(state_slice(k, name), Device::cpu());
    }
  serialize::save(sd, shard_path(dir, rank, N));
  pg_->barrier();
}

StateDict ZeroRedundancyOptimizer::read_sharded(const std::string& dir) {
  const char* op = "ZeroRedundancyOptimizer::read_sharded";
  // The layout from rank 0's shard; every other shard must carry the same.
  StateDict first = serialize::load([&] {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("zero-shard-0-of-", 0) == 0) return e.path().string();
    }
    throw IOError(detail::format(op, ": no zero-shard-0-of-N.safetensors in ", dir));
  }());
  MG_CHECK(first.meta.contains("zero"), IOError, op, ": rank 0's shard in ", dir, " holds no ZeRO layout");
  const nlohmann::json layout = first.meta["zero"];
  const int64_t world = layout["world"].get<int64_t>();
  const std::vector<std::string> names = split_names(layout["names"].get<std::string>());
  const DType dtype = first.tensors.empty() ? DType::f32 : first.tensors.begin()->second.dtype();
  std::vector<Tensor> whole_of;  // per parameter, then per name: index p * names + n
  std::vector<int64_t> offsets;
  for (const auto& p : layout["params"]) offsets.push_back(p["offset"].get<int64_t>());
  const int64_t total = layout["total"].get<int64_t>();
  for (const auto& p : layout["params"])
    for (size_t n = 0; n < names.size(); ++n) whole_of.push_back(zeros(p["shape"].get<Shape>(), {dtype}));
  for (int64_t r = 0; r < world; ++r) {
    const std::string path = shard_path(dir, r, world);
    MG_CHECK(std::filesystem::exists(path), IOError, op, ": ", path, " is missing (rank ", r, " of ", world, ")");
    const StateDict shard = r == 0 ? first : serialize::load(path);
    MG_CHECK(shard.meta.contains("zero") && shard.meta["zero"]["chunks"] == layout["chunks"] &&
                 shard.meta["zero"]["params"] == layout["params"] && shard.meta["zero"]["rank"] == r,
             IOError, op, ": ", path, " was written with another layout than rank 0's shard");
    for (size_t k = 0; k < layout["chunks"].size(); ++k) {
      const int64_t begin = layout["chunks"][k][0].get<int64_t>(), per_rank = layout["chunks"][k][1].get<int64_t>();
      const int64_t lo = begin + r * per_rank;
      for (size_t n = 0; n < names.size(); ++n) {
        const std::string key = "chunk." + std::to_string(k) + "." + names[n];
        MG_CHECK(shard.tensors.count(key) && shard.tensors.at(key).numel() == per_rank, IOError, op, ": ", path,
                 " lacks ", key, " of ", per_rank, " elements");
        const Tensor& slice = shard.tensors.at(key);
        for_each_overlap(
            offsets, total, lo, lo + per_rank, [&](size_t i) { return whole_of[i * names.size() + n].numel(); },
            [&](size_t i, int64_t p_off, int64_t s_off, int64_t len) {
              kernels::copy_(flat_slice(whole_of[i * names.size() + n], p_off, len), flat_slice(slice, s_off, len));
            });
      }
    }
  }
  StateDict sd;
  sd.meta["type"] = layout["type"];
  nlohmann::json group = layout["group"], ids = nlohmann::json::array(), states = nlohmann::json::object();
  for (size_t i = 0; i < offsets.size(); ++i) {
    ids.push_back(static_cast<int64_t>(i));
    if (!names.empty()) states[std::to_string(i)] = {{"step", layout["step"]}};
    for (size_t n = 0; n < names.size(); ++n)
      sd.tensors["state." + std::to_string(i) + "." + names[n]] = whole_of[i * names.size() + n];
  }
  group["params"] = ids;
  sd.meta["param_groups"] = nlohmann::json::array({group});
  sd.meta["state"] = states;
  return sd;
}

int64_t ZeroRedundancyOptimizer::shard_grad_nbytes() const {
  int64_t n = 0;
  for (const Tensor& g : shard_grads_)
    if (g.defined()) n += g.nbytes();
  return n;
}

void ZeroRedundancyOptimizer::step() {
  NoGradGuard ng;
  const int64_t N = pg_->size();
  // 1. Gradients for this rank's pieces: views of .grad (already averaged by DDP), or slices of
  //    a reduce-scattered chunk.
  std::vector<Tensor> reduced(chunks_.size());
  if (opts_.stage == 2) {
    finish_reduction();
    for (size_t k = 0; k < chunks_.size(); ++k)
      reduced[k] = shard_grads_[k].defined() ? shard_grads_[k] : zeros({chunks_[k].per_rank}, {dtype_, pg_->device()});
  } else if (opts_.reduce_gradients) {
    for (size_t k = 0; k < chunks_.size(); ++k) reduced[k] = reduced_slice(k);
  }
  for (Piece& pc : pieces_) {
    if (opts_.reduce_gradients || opts_.stage == 2) {
      pc.view.set_grad(raw::slice(reduced[pc.chunk], 0, pc.slice_offset, pc.slice_offset + pc.len, 1));
      continue;
    }
    Tensor g = params_[pc.param].grad();
    pc.view.set_grad(g.defined() ? flat_slice(raw::contiguous(g), pc.param_offset, pc.len)
                                 : zeros({pc.len}, {dtype_, pg_->device()}));
  }
  // 2. The local update, in place on the parameters (optimizer state for this slice only).
  local_->step();
  for (Piece& pc : pieces_) pc.view.set_grad(Tensor());
  // 3. Every rank's updated slice into every parameter, one chunk at a time.
  for (size_t k = 0; k < chunks_.size(); ++k) {
    const Chunk& c = chunks_[k];
    Tensor mine = zeros({c.per_rank}, {dtype_, pg_->device()});
    for (const Piece& pc : pieces_)
      if (pc.chunk == k)
        kernels::copy_(flat_slice(mine, pc.slice_offset, pc.len),
                       flat_slice(params_[pc.param], pc.param_offset, pc.len));
    Tensor gathered = empty({c.per_rank * N}, {dtype_, pg_->device()});
    pg_->all_gather(gathered, mine);
    for_each_piece(c.global_begin, c.global_begin + c.per_rank * N,
                   [&](size_t i, int64_t p_off, int64_t r_off, int64_t len) {
                     kernels::copy_(flat_slice(params_[i], p_off, len), flat_slice(gathered, r_off, len));
                   });
  }
  for (const Tensor& p : params_) p.bump_version();
  if (opts_.stage == 2) {
    for (Tensor& g : shard_grads_) g = Tensor();
    start_round();
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  if (opts_.stage == 2) {  // the reduced slices are this optimizer's gradients
    for (Tensor& g : shard_grads_) g = Tensor();
    start_round();
  }
  for (const Tensor& p : params_) {
    if (set_to_none) {
      p.set_grad(Tensor());
    } else if (p.grad().defined()) {
      kernels::fill_(p.grad(), 0.0);
    }
  }
}

}  // namespace mg::dist
