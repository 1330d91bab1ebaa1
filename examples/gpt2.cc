// A GPT language model end to end, as llm.c's train_gpt2 does: tokenizes a text file, trains
// with AdamW on random windows, validates on the held-out tail, samples through the key-value
// cache, and reports the peak memory by category. Flags: examples/gpt2_flags.cc; guide: docs/gpt2.md.
//
//   bazel run -c opt //examples:gpt2 -- --preset tiny
//   bazel run -c opt //examples:gpt2 -- --init-from model.safetensors --print-logits
//
// The last stdout line is one JSON object for scripts to parse.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/fp8_linear.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "serialize/serialize.h"
#include "serialize/training_checkpoint.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/profiler.h"
#include "core/random.h"
#include "data/tokenizer.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "distributed/spawn.h"
#include "distributed/fully_shard.h"
#include "distributed/zero.h"
#include "examples/gpt2_flags.h"
#include "examples/run_report.h"
#include "memory/batch_fit.h"
#include "memory/gpt_budget.h"
#include "memory/host_params.h"
#include "memory/param_offload.h"
#include "memory/planner.h"
#include "nn/models/gpt.h"
#include "nn/models/gpt_pretrained.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/step_in_backward.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace {

using namespace mg;
using examples::Clock;
using examples::GPT2Flags;
using examples::seconds_since;

// The corpus //examples:gpt2_corpus gathers from docs/*.md and a few sources at build time.
std::string default_corpus(const char* argv0) {
  using bazel::tools::cpp::runfiles::Runfiles;
  std::string error;
  std::unique_ptr<Runfiles> rf(Runfiles::Create(argv0, &error));
  const std::string path = rf ? rf->Rlocation("memgrad/examples/gpt2_corpus.txt") : "";
  MG_CHECK(!path.empty() && std::ifstream(path).good(), IOError,
           "gpt2: the built-in corpus is not beside this binary (", error.empty() ? path : error,
           "); run it with bazel run, or pass --data FILE");
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MG_CHECK(in, IOError, "gpt2: cannot open --data ", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Windows of T + 1 tokens: inputs are the first T, targets the last T.
struct Split {
  std::vector<int64_t> tokens;
  std::pair<Tensor, Tensor> batch(const std::vector<int64_t>& offsets, int64_t T, Device dev) const {
    const auto B = static_cast<int64_t>(offsets.size());
    std::vector<int64_t> x(B * T), y(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        x[b * T + t] = tokens[offsets[b] + t];
        y[b * T + t] = tokens[offsets[b] + t + 1];
      }
    MemoryCategoryGuard data(MemoryCategory::Data);
    return {from_vector(x, {B, T}).to(dev), from_vector(y, {B, T}).to(dev)};
  }
  std::pair<Tensor, Tensor> random_batch(int64_t B, int64_t T, Device dev, Generator& gen) const {
    const auto hi = static_cast<int64_t>(tokens.size()) - T;
    return batch(randint(0, hi, {B}, {DType::i64}, &gen).to_vector<int64_t>(), T, dev);
  }
};

struct Run {
  GPT2Flags f;
  Device device;
  std::shared_ptr<dist::ProcessGroup> pg;
  int rank = 0, world = 1;
  std::unique_ptr<data::Tokenizer> tok;
  Split train, val;
  std::shared_ptr<nn::GPT> model;
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  bool amp = false;
  DType amp_dtype = DType::bf16;
  // Autocast's weight-cast cache (cache_enabled): off where --memory-budget chose a rung that
  // checkpoints blocks (memory::gpt_memory_ladder sets it).
  bool cast_cache = true;
  int64_t micro = 0;  // sequences per micro-batch on this rank
  // Under optimizer offload: the device optimizer's step inside backward (what --memory-budget's
  // chosen rung set; on for --offload).
  bool offload_in_backward = true;
  bool lead() const { return rank == 0; }
  nn::Module& forward_module() { return ddp ? static_cast<nn::Module&>(*ddp) : *model; }
};

std::unique_ptr<data::Tokenizer> make_tokenizer(const GPT2Flags& f) {
  if (f.bpe_encoder.empty()) return std::make_unique<data::ByteTokenizer>();
  return data::GPT2Tokenizer::from_files(f.bpe_encoder, f.bpe_vocab);
}

void load_data(Run& r, const char* argv0) {
  const std::string path = r.f.data.empty() ? default_corpus(argv0) : r.f.data;
  const std::vector<int64_t> ids = r.tok->encode(read_file(path));
  const auto n = static_cast<int64_t>(ids.size());
  const auto n_val = static_cast<int64_t>(std::llround(r.f.val_fraction * static_cast<double>(n)));
  const int64_t T = r.model->config.block_size;
  MG_CHECK(n_val > T && n - n_val > T, ValueError, "gpt2: ", path, " holds ", n, " tokens; both splits need more than ",
           "--block-size ", T, " (validation gets ", n_val, ")");
  r.train.tokens.assign(ids.begin(), ids.end() - n_val);
  r.val.tokens.assign(ids.end() - n_val, ids.end());
  if (r.lead())
    std::cout << "data: " << path << ", " << n << " tokens (" << r.tok->name() << ", vocab " << r.tok->vocab_size()
              << "): " << r.train.tokens.size() << " train, " << r.val.tokens.size() << " validation\n";
}

void build_model(Run& r) {
  const GPT2Flags& f = r.f;
  // Under parameter offload the model is built in host memory: its f32 weights need never fit the device.
  const TensorOptions opts(DType::f32, f.offload == "params" ? Device::cpu() : r.device);
  if (!f.init_from.empty()) {
    r.model = nn::gpt2_from_hf_safetensors(f.init_from, opts, f.n_head_given ? f.model.n_head : 0);
  } else {
    nn::GPTConfig c = f.model;
    c.vocab_size = std::max(f.vocab_size, r.tok->vocab_size());
    Generator init(f.seed);  // the same weights on every rank (DDP checks nothing, it broadcasts)
    r.model = std::make_shared<nn::GPT>(c, opts, &init);
  }
  MG_CHECK(r.tok->vocab_size() <= r.model->config.vocab_size, ValueError, "gpt2: the tokenizer's vocabulary (",
           r.tok->vocab_size(), ") is larger than the model's (", r.model->config.vocab_size, ")");
}

// The FP8 recipe the flags ask for (off without --fp8).
Fp8Autocast fp8_recipe(const GPT2Flags& f) {
  return Fp8Autocast(f.fp8, f.fp8_min_features, f.fp8_delayed ? Fp8Scaling::Delayed : Fp8Scaling::Current,
                     f.fp8_fast_accum ? Fp8Accumulation::Fast : Fp8Accumulation::Promoted);
}

double eval_loss(Run& r) {
  const int64_t T = r.model->config.block_size;
  const auto span = static_cast<int64_t>(r.val.tokens.size()) - T - 1;
  r.model->eval();
  NoGradGuard ng;
  Autocast ac(r.device.type, r.amp_dtype, r.amp, r.cast_cache);
  Fp8Autocast fp8 = fp8_recipe(r.f);
  double total = 0;
  for (int64_t i = 0; i < r.f.eval_iters; ++i) {  // fixed windows: the same every time
    std::vector<int64_t> offsets(r.micro);
    for (int64_t b = 0; b < r.micro; ++b) offsets[b] = span * (i * r.micro + b) / (r.f.eval_iters * r.micro);
    auto [x, y] = r.val.batch(offsets, T, r.device);
    MemoryCategoryGuard act(MemoryCategory::Activations);
    total += r.model->forward_loss(x, y).item();
  }
  r.model->train();
  return total / static_cast<double>(r.f.eval_iters);
}

std::string sample(Run& r, Generator& gen) {
  nn::GenerateOptions o;
  o.max_new_tokens = r.f.max_new_tokens;
  o.temperature = r.f.temperature;
  o.top_k = r.f.top_k;
  std::vector<int64_t> prompt = r.tok->encode(r.f.prompt);
  if (prompt.empty()) prompt = {0};
  Autocast ac(r.device.type, r.amp_dtype, r.amp, r.cast_cache);
  MemoryCategoryGuard act(MemoryCategory::Activations);
  return r.f.prompt + r.tok->decode(nn::generate(*r.model, prompt, o, &gen));
}

// --offload-blocks auto: memory::plan_gpt_offload at the micro-batch, under the run's autocast.
void plan_offload_blocks(Run& r) {
  memory::GPTOffloadPlan plan;
  {
    Autocast ac(r.device.type, r.amp_dtype, r.amp, r.cast_cache);
    plan = memory::plan_gpt_offload(*r.model, r.micro, r.device);
  }
  r.f.offload_blocks = plan.plan.segments;
  if (r.lead()) std::cout << "--offload-blocks auto: " << plan.summary() << "\n";
}

// --recompute: the model's GPTRecompute; planner:BUDGET profiles the blocks at the micro-batch.
void set_recompute(Run& r) {
  const std::string& m = r.f.recompute;
  r.model->recompute.checkpoint_blocks = m == "per-block" || m == "per-block-keep" || m == "per-block+selective";
  r.model->recompute.selective = m == "selective" || m == "per-block+selective";
  if (m == "per-block-keep") r.model->recompute.keep_ops = nn::GPTRecompute::block_outputs();
  if (r.f.offload_auto) plan_offload_blocks(r);
  r.model->recompute.offload_blocks = r.f.offload_blocks;
  if (r.f.planner_budget.empty()) return;
  std::vector<memory::SegmentProfile> prof;
  {
    Autocast ac(r.device.type, r.amp_dtype, r.amp, r.cast_cache);
    prof = memory::profile_gpt_blocks(*r.model, r.micro, r.device);
  }
  const std::string& b = r.f.planner_budget;
  const int64_t budget =
      b.back() == '%' ? static_cast<int64_t>(examples::parse_number("--recompute planner:", b.substr(0, b.size() - 1)) /
                                             100.0 * static_cast<double>(memory::plan_none(prof).plain_bytes))
                      : examples::parse_bytes("--recompute planner:", b);
  const memory::CheckpointPlan plan = memory::plan_for_budget(prof, budget);
  r.model->recompute.block_mask = plan.segment_mask();
  if (r.lead())
    std::cout << "recompute planner, budget " << format_bytes(budget) << (plan.fits ? "" : " (does not fit)") << ":\n"
              << plan.table(prof);
}

// One forward and backward of a random micro-batch of b sequences in the training step's form
// (forward_loss: no logits): the trial step of --memory-budget and --auto-batch.
void trial_forward_backward(Run& r, int64_t b, Generator& gen) {
  auto [x, y] = r.train.random_batch(b, r.model->config.block_size, r.device, gen);
  MemoryCategoryGuard act(MemoryCategory::Activations);
  Autocast ac(r.device.type, r.amp_dtype, r.amp, r.cast_cache);
  r.model->forward_loss(x, y).backward();
}

// Where the model state lives under --offload (or what --memory-budget chose): the host side of
// optimizer offload (memory/host_params.h) or of parameter offload (memory/param_offload.h).
struct StatePlacement {
  std::unique_ptr<memory::HostParams> host_params;  // optimizer offload
  memory::ParamOffload param_offload;               // parameter offload
  // The HostParams whose worker steps the masters in host memory (either mode's), or null.
  memory::HostParams* host() {
    if (host_params) return host_params.get();
    return param_offload.source ? &param_offload.source->host() : nullptr;
  }
  // Before a forward under optimizer offload: the last backward's updates done, the casts of the
  // host parameters given to the next autocast region. (Parameter offload fetches a block's
  // weights as its forward starts.)
  void before_forward() {
    if (host_params) host_params->provide_casts();
  }
};

// Moves r.model's state to where `where` keeps it ("optimizer", "params"; "none" leaves it),
// the host's optimizer built by `make`. Returns the parameters a device optimizer steps.
std::vector<Tensor> place_state(Run& r, const std::string& where, StatePlacement& s,
                                const memory::HostOptimizerFactory& make) {
  if (where == "optimizer") {
    // --offload-optimizer-blocks N: the last N blocks only (gpt_linear_params names a bad N).
    const int64_t n = r.f.offload_optimizer_blocks, layers = r.model->config.n_layer;
    MG_CHECK(n <= layers, ValueError, "--offload-optimizer-blocks ", n, ": the model has ", layers, " blocks");
    s.host_params = std::make_unique<memory::HostParams>(memory::gpt_linear_params(*r.model, n < 0 ? 0 : layers - n),
                                                         r.device, make);
    return s.host_params->others(r.model->parameters());
  }
  if (where == "params") {
    r.model->to(Device::cpu());  // a no-op for a model built there
    s.param_offload = memory::offload_gpt_params(*r.model, r.device, make, r.f.offload_prefetch);
    return {};
  }
  return r.model->parameters();
}

// Undoes place_state: every parameter on `to` again with the values the host holds.
void unplace_state(Run& r, StatePlacement& s, Device to) {
  if (s.host_params) s.host_params.reset();  // waits for the updates; the parameters stay in host memory
  if (s.param_offload.source) {
    const StateDict sd = memory::model_state_dict(s.param_offload, *r.model);
    r.model->recompute.units = nullptr;
    s.param_offload = {};
    for (const auto& [name, p] : r.model->named_parameters()) retarget(p, sd.tensors.at(name));
  }
  r.model->to(to);
}

// --memory-budget: memory::fit_state_to_budget over where the model state lives and, in each mode,
// the rungs of memory::gpt_memory_ladder: the first mode and rung whose whole training step at the
// micro-batch fits. The modes, fastest first: the f32 moments; with Adam or AdamW 8-bit moments
// (optim::AdamW8bit: 12 bytes of model state a parameter instead of 18; the run then trains with
// adamw8bit and says so); then, where the run's flags allow --offload (no clipping, bf16, one
// micro-batch: the update runs inside backward), optimizer and then parameter offload, whose
// ladders also move the device's optimizer step inside backward. The state is moved in place
// for each mode and back after it. The trial steps use optimizers at lr 0 (their state is
// counted, the weights stay bit for bit) and leave the default generator as it was, so training
// starts as it would have.
void fit_memory_budget(Run& r) {
  if (r.f.memory_budget.empty()) return;
  MG_CHECK(r.world == 1, ValueError, "gpt2 --memory-budget: one rank only (got ", r.world, ")");
  using memory::StateMode;
  const int64_t budget = examples::parse_bytes("--memory-budget", r.f.memory_budget);
  const std::string requested = r.f.train.optimizer;
  std::vector<StateMode> modes = {StateMode::Resident};
  if (requested == "adamw" || requested == "adam") modes.push_back(StateMode::EightBit);
  std::string no_offload = examples::offload_conflict(r.f);
  if (no_offload.empty() && !r.device.is_cuda()) no_offload = "needs a CUDA device";
  if (no_offload.empty())
    modes.insert(modes.end(), {StateMode::OptimizerOffload, StateMode::ParameterOffload});
  else if (r.lead())
    std::cout << "memory budget: optimizer and parameter offload not tried (" << no_offload << ")\n";
  auto where_of = [](StateMode m) {
    return m == StateMode::OptimizerOffload ? "optimizer" : m == StateMode::ParameterOffload ? "params" : "none";
  };
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::StepInBackward> sib;
  StatePlacement place;
  auto teardown = [&](Device to) {
    sib.reset();
    if (opt) opt->zero_grad();
    opt.reset();
    unplace_state(r, place, to);
    if (r.device.is_cuda()) cuda::empty_cache();
  };
  Generator gen(r.f.seed + 11);
  auto setup = [&](StateMode mode) {
    teardown(r.device);
    examples::TrainingFlags trial = r.f.train;
    trial.lr = 0.0;
    trial.optimizer = mode == StateMode::EightBit ? "adamw8bit" : requested;
    const std::vector<Tensor> on_device = place_state(
        r, where_of(mode), place, [trial](std::vector<Tensor> ps) { return examples::make_optimizer(trial, ps); });
    opt = examples::make_optimizer(trial, on_device);
    if (place.host_params) sib = std::make_unique<optim::StepInBackward>(*opt);
    auto step = [&] {
      opt->zero_grad();
      place.before_forward();
      try {
        trial_forward_backward(r, r.micro, gen);
      } catch (const OutOfMemoryError&) {  // the offload modes' host side starts clean
        if (sib) sib->abandon();
        opt->zero_grad();
        if (place.param_offload.units) place.param_offload.units->abandon_step();
        place.before_forward();
        throw;
      }
      if (sib && sib->enabled())
        sib->finish();
      else
        opt->step();
      if (place.host()) place.host()->wait();
    };
    return memory::StateTrial{memory::gpt_memory_ladder(*r.model, sib.get(), r.f.offload_blocks, &r.cast_cache), step};
  };
  const memory::StateFitResult fit = memory::fit_state_to_budget(modes, setup, budget, r.device);
  const StateMode chosen = fit.fits() ? fit.modes[fit.chosen] : StateMode::Resident;
  r.offload_in_backward = sib && sib->enabled();
  // Parameter offload's model goes back to host memory: its f32 weights may not fit the device.
  teardown(chosen == StateMode::ParameterOffload ? Device::cpu() : r.device);
  if (r.lead())
    for (size_t m = 0; m < fit.modes.size(); ++m) {
      const StateMode mode = fit.modes[m];
      std::cout << "memory budget " << format_bytes(budget) << " with "
                << (mode == StateMode::EightBit ? std::string("adamw8bit") : requested)
                << (mode == StateMode::OptimizerOffload   ? ", optimizer offload"
                    : mode == StateMode::ParameterOffload ? ", parameter offload"
                                                          : "")
                << ":\n";
      for (const auto& [rung, peak] : fit.ladders[m].peaks)
        std::cout << "  " << rung << ": " << (peak < 0 ? std::string("out of memory") : format_bytes(peak)) << "\n";
      std::cout << fit.ladders[m].summary(budget) << "\n";
    }
  MG_CHECK(fit.fits(), OutOfMemoryError, "gpt2 --memory-budget: ", fit.summary(budget));
  const memory::BudgetFitResult& rungs = fit.ladders[fit.chosen];
  r.f.recompute = rungs.peaks[rungs.chosen].first;
  if (chosen == StateMode::EightBit) {
    if (r.lead())
      std::cout << "memory budget: " << requested << "'s f32 moments fit no rung; training with adamw8bit (8-bit "
                << "moments), recompute " << r.f.recompute << "\n";
    r.f.train.optimizer = "adamw8bit";
  }
  if (chosen == StateMode::OptimizerOffload || chosen == StateMode::ParameterOffload) {
    r.f.offload = where_of(chosen);
    if (r.lead())
      std::cout << "memory budget: training with " << memory::state_mode_name(chosen) << ", recompute " << r.f.recompute
                << "\n";
  }
}

// --offload-optimizer-blocks auto: times training steps of random micro-batches at learning rate 0
// (the weights stay bit for bit; each trial's optimizer state is dropped after it) with every
// block on the device, then with the last N blocks' Linear parameters on the host, and keeps the
// most blocks whose step stays within --offload-optimizer-ratio of the resident one
// (memory::search_host_param_blocks, from a quarter of the blocks). The device optimizer steps
// inside backward in every trial, as it does under optimizer offload. None within the ratio:
// the run trains with the state on the device. The default generator is left as it was.
void plan_offload_optimizer_blocks(Run& r) {
  if (!r.f.offload_optimizer_auto || r.f.offload != "optimizer") return;
  const int64_t layers = r.model->config.n_layer;
  GeneratorStateGuard keep;  // dropout in the trials draws from it: training starts as it would have
  Generator gen(r.f.seed + 13);
  auto trial = [&](int64_t n) {
    examples::TrainingFlags zero_lr = r.f.train;
    zero_lr.lr = 0.0;
    const auto make = [zero_lr](std::vector<Tensor> ps) { return examples::make_optimizer(zero_lr, ps); };
    StatePlacement place;
    r.f.offload_optimizer_blocks = n;
    std::vector<double> ms;
    {
      std::unique_ptr<optim::Optimizer> opt =
          examples::make_optimizer(zero_lr, place_state(r, n > 0 ? "optimizer" : "none", place, make));
      optim::StepInBackward sib(*opt);
      for (int s = 0; s < 7; ++s) {  // 2 to make the state and warm up, 5 timed
        const auto t0 = std::chrono::steady_clock::now();
        place.before_forward();
        trial_forward_backward(r, r.micro, gen);
        sib.finish();
        cuda::synchronize();
        if (s >= 2)
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      opt->zero_grad();
    }
    unplace_state(r, place, r.device);
    cuda::empty_cache();
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  double resident_ms = 0;
  try {
    resident_ms = trial(0);
  } catch (const OutOfMemoryError& e) {
    MG_THROW(OutOfMemoryError,
             "gpt2 --offload-optimizer-blocks auto: the step with every block on the device, "
             "against which the ratio is taken, ran out of memory; give a count instead (",
             e.what(), ")");
  }
  const memory::HostBlocksSearch found = memory::search_host_param_blocks(
      layers, std::max<int64_t>(1, layers / 4), resident_ms, r.f.offload_optimizer_ratio, trial);
  if (r.lead()) {
    std::printf("offload optimizer blocks: resident step %.2f ms; trials", resident_ms);
    for (const auto& [n, ms] : found.trials)
      std::printf(" %lld: %.2f ms (%.2fx)", static_cast<long long>(n), ms, ms / resident_ms);
    std::printf("; %lld of %lld blocks within %.2fx%s\n", static_cast<long long>(found.blocks),
                static_cast<long long>(layers), r.f.offload_optimizer_ratio,
                found.blocks > 0 ? "" : ": training with the state on the device");
  }
  r.f.offload_optimizer_blocks = found.blocks;
  if (found.blocks == 0) r.f.offload = "none";
}

// --auto-batch: the largest micro-batch whose training step fits (out-of-memory errors bound it).
void find_micro_batch(Run& r) {
  std::vector<Tensor> params = r.model->parameters();
  Generator gen(r.f.seed + 7);
  auto try_step = [&](int64_t b) {
    trial_forward_backward(r, b, gen);
    for (Tensor& p : params) p.set_grad(Tensor());
  };
  const memory::BatchSearchResult res = memory::find_max_batch_size(try_step, {1, r.f.max_batch});
  if (r.device.is_cuda()) cuda::empty_cache();
  MG_CHECK(res.max_batch > 0, OutOfMemoryError, "gpt2 --auto-batch: not even one sequence of ",
           r.model->config.block_size, " tokens fits");
  r.micro = res.max_batch;
  r.f.batch = r.micro * r.f.grad_accum;
  if (r.lead())
    std::cout << "auto-batch: micro-batch " << r.micro << " (" << res.tries.size() << " tries"
              << (r.micro == r.f.max_batch ? ", capped by --max-batch" : "") << "), batch " << r.f.batch << "\n";
}

void print_logits(Run& r) {
  const auto& ids = r.f.logit_tokens;
  for (int64_t id : ids)
    MG_CHECK(id >= 0 && id < r.model->config.vocab_size, IndexError, "gpt2 --tokens: id ", id, " outside [0, ",
             r.model->config.vocab_size, ")");
  r.model->eval();
  NoGradGuard ng;
  const auto T = static_cast<int64_t>(ids.size());
  Tensor logits = (*r.model)(from_vector(ids, {1, T}).to(r.device)).reshape({T, -1}).cpu();
  if (!r.f.logits_out.empty()) {
    StateDict sd;
    sd.tensors["logits"] = logits;
    serialize::save(sd, r.f.logits_out);
  }
  const std::vector<float> v = logits.to_vector<float>();
  const int64_t V = logits.size(1);
  nlohmann::json first = nlohmann::json::array(), top = nlohmann::json::array();
  double sum = 0;
  for (int64_t t = 0; t < T; ++t) {
    first.push_back(std::vector<float>(v.begin() + t * V, v.begin() + t * V + std::min<int64_t>(V, 5)));
    top.push_back(std::max_element(v.begin() + t * V, v.begin() + (t + 1) * V) - (v.begin() + t * V));
  }
  for (float x : v) sum += x;
  std::cout
      << nlohmann::json{{"tokens", ids}, {"shape", {T, V}}, {"first5", first}, {"argmax", top}, {"sum", sum}}.dump()
      << std::endl;
}

int train(Run& r) {
  const GPT2Flags& f = r.f;
  const int64_t T = r.model->config.block_size;
  std::vector<Tensor> params = r.model->parameters();
  const bool zero2 = f.zero && f.zero_stage == 2 && r.world > 1;
  const bool zero3 = f.zero && f.zero_stage == 3 && r.world > 1;
  // ZeRO-2 and ZeRO-3 reduce the gradients themselves; rank 0's initial parameters are
  // everyone's, as DDP's are.
  if (r.world > 1 && !zero2 && !zero3) r.ddp = std::make_shared<dist::DistributedDataParallel>(r.model, r.pg);
  if (zero2 || zero3) {
    NoGradGuard ng;
    for (const Tensor& p : params) r.pg->broadcast(p, 0);
    for (const Tensor& b : r.model->buffers()) r.pg->broadcast(b, 0);
  }
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
  StatePlacement place;
  std::unique_ptr<optim::StepInBackward> in_backward;
  // ZeRO-3: each rank keeps a shard of every block (a unit a block, the embeddings and head the
  // root); under bf16 autocast the Linears are gathered in bf16. The optimizer steps the shards.
  dist::FullyShardedModel fsdp;
  if (zero3) {
    dist::FullyShardOptions fo;
    if (r.amp && r.device.is_cuda()) fo.dtype = nn::gpt_unit_dtype(*r.model, r.amp_dtype);
    fo.offload_to_host = f.zero_offload;
    fsdp = dist::fully_shard(nn::gpt_param_units(*r.model), r.pg, fo);
    r.model->recompute.units = fsdp.units.get();
    opt = examples::make_optimizer(f.train, fsdp.source->shards());
  } else if (f.zero && r.world > 1) {
    dist::ZeroOptions zo;
    zo.stage = f.zero_stage;
    zero = std::make_unique<dist::ZeroRedundancyOptimizer>(
        params, r.pg, [&](std::vector<Tensor> p) { return examples::make_optimizer(f.train, std::move(p)); }, zo);
  } else {
    // --offload: the host's masters get an optimizer of their own; the device's steps the rest
    // (none under parameter offload), inside backward under optimizer offload.
    const std::vector<Tensor> on_device = place_state(
        r, f.offload, place, [&f](std::vector<Tensor> ps) { return examples::make_optimizer(f.train, ps); });
    opt = examples::make_optimizer(f.train, on_device);
    if (place.host_params) {
      in_backward = std::make_unique<optim::StepInBackward>(*opt);
      in_backward->set_enabled(r.offload_in_backward);
    }
  }
  optim::Optimizer& optimizer = zero ? zero->local_optimizer() : *opt;
  examples::Schedule schedule(f.train, optimizer, f.steps, 1);
  std::optional<examples::Schedule> host_schedule;  // the host optimizer's learning rate
  if (place.host()) host_schedule.emplace(f.train, place.host()->optimizer(), f.steps, 1);
  optim::GradScalerOptions gso;
  gso.enabled = f.amp == "f16";
  optim::GradScaler scaler(gso);
  Generator data_gen(f.seed * 1000003 + static_cast<uint64_t>(r.rank)), sample_gen(f.seed + 1);
  serialize::TrainingCheckpoint ckpt;
  // Under ZeRO-3 the checkpoint holds the whole model and optimizer state, gathered from the
  // shards (every rank takes part; the lead writes): it resumes at any world size, or without
  // ZeRO. dist::FullyShardedModel::save_sharded writes per-rank files instead.
  if (zero3)
    ckpt.add(
        "model", [&] { return fsdp.full_state_dict(*r.model); },
        [&](const StateDict& sd) { fsdp.load_full_state_dict(*r.model, sd); });
  else if (place.param_offload.source)  // the masters in host memory, under the model's names
    ckpt.add(
        "model", [&] { return memory::model_state_dict(place.param_offload, *r.model); },
        [&](const StateDict& sd) { memory::load_model_state_dict(place.param_offload, *r.model, sd); });
  else
    ckpt.add("model", *r.model);
  ckpt.add("schedule", schedule).add("scaler", scaler);
  if (place.host()) ckpt.add("host_optimizer", *place.host()).add("host_schedule", *host_schedule);
  if (zero3)
    ckpt.add(
        "optimizer", [&] { return fsdp.full_optimizer_state_dict(*r.model, *opt); },
        [&](const StateDict& sd) { fsdp.load_full_optimizer_state_dict(*r.model, *opt, sd); });
  else if (!zero)
    ckpt.add("optimizer", optimizer);
  ckpt.add_generator("rng", default_generator());
  // FP8 delayed scaling's histories (each layer's recent amaxes), so that a resumed run casts with
  // the scales an uninterrupted one would. Kept by the model's own weights: not under ZeRO-3 or
  // parameter offload, whose layers run on gathered copies; and on one rank only (each rank's
  // input and gradient histories are its own, and the lead writes the file).
  std::optional<autograd::Fp8HistoryState> fp8_state;
  if (f.fp8 && f.fp8_delayed && r.world == 1 && !zero3 && !place.param_offload.source) {
    fp8_state.emplace(r.model->named_parameters());
    ckpt.add("fp8", *fp8_state);
  }
  // The data stream: every rank's generator has its own seed and advances alike, so the lead's
  // offset is every rank's; each keeps its seed on resume.
  ckpt.add(
      "data",
      [&] {
        StateDict sd;
        sd.meta = {{"seed", data_gen.get_state().seed}, {"offset", data_gen.get_state().offset}};
        return sd;
      },
      [&](const StateDict& sd) {
        MG_CHECK(sd.meta.is_object() && sd.meta.contains("offset") && sd.meta["offset"].is_number_unsigned(),
                 ValueError, "gpt2 --resume: the data generator's state needs an unsigned offset, got ",
                 sd.meta.dump());
        data_gen.set_state({data_gen.get_state().seed, sd.meta["offset"].get<uint64_t>()});
      });
  MG_CHECK(!zero || (f.save.empty() && f.resume.empty()), ValueError,
           "gpt2: --save/--resume with --zero-stage 1 or 2: each rank holds another shard of the optimizer state "
           "(--zero-stage 3 saves the gathered state)");
  if (!f.resume.empty()) {
    ckpt.load(f.resume, r.device);
    if (r.lead()) std::cout << "resumed from " << f.resume << " at step " << ckpt.step << "\n";
  }
  if (r.lead())
    std::cout << "model: " << r.model->num_parameters() << " parameters, " << r.model->config.n_layer << " layers, "
              << r.model->config.n_embd << " wide, " << r.model->config.n_head << " heads, T=" << T << ", vocab "
              << r.model->config.vocab_size << "\ntraining: " << f.steps << " steps of " << f.batch * r.world
              << " sequences (" << r.world << " rank(s) x " << f.grad_accum << " micro-batch(es) of " << r.micro
              << "), " << f.train.optimizer << " lr " << f.train.lr << ", " << schedule.describe() << ", amp " << f.amp
              << ", recompute " << f.recompute << (f.offload == "none" ? "" : ", offload " + f.offload)
              << (zero3  ? ", ZeRO-3"
                  : zero ? (zero2 ? ", ZeRO-2" : ", ZeRO-1")
                         : "")
              << ", device " << r.device << "\n";
  // The lead rank samples; under ZeRO-3 every rank first gathers the whole model with it.
  auto print_sample = [&](const std::string& heading) {
    place.before_forward();
    auto go = [&] {
      if (r.lead()) std::cout << heading << "\n" << sample(r, sample_gen) << "\n---" << std::endl;
    };
    if (zero3)
      fsdp.units->with_all_gathered(go);
    else
      go();
  };
  CategoryStats::get(r.device).reset_peak();
  examples::ProgressBar bar(f.progress && r.lead());
  place.before_forward();
  const double initial_val = eval_loss(r);
  double val = initial_val, last_loss = 0, train_seconds = 0;
  int64_t tokens = 0, skipped = 0;
  nlohmann::json history = nlohmann::json::array();
  history.push_back({{"step", ckpt.step}, {"val_loss", initial_val}});
  if (r.lead()) std::cout << "step " << ckpt.step << ": validation loss " << initial_val << std::endl;
  const int64_t traced_step = ckpt.step + 2;  // --trace: after two warm-up steps
  while (ckpt.step < f.steps) {
    const bool tracing = !f.trace.empty() && ckpt.step == traced_step;
    if (tracing) {
      if (r.device.is_cuda()) cuda::synchronize();
      profiler::start();
    }
    std::optional<profiler::Range> step_range;
    if (tracing) step_range.emplace("step", "phase");
    const auto t0 = Clock::now();
    zero ? zero->zero_grad() : opt->zero_grad();
    place.before_forward();
    auto [x, y] = r.train.random_batch(f.batch, T, r.device, data_gen);
    int64_t m = 0;
    double loss = memory::accumulate_gradients(x, y, f.grad_accum, [&](const Tensor& xb, const Tensor& yb) {
      std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
      if (r.ddp && ++m < f.grad_accum) no_sync.emplace(*r.ddp);  // reduce once, after the last
      MemoryCategoryGuard act(MemoryCategory::Activations);
      Autocast ac(r.device.type, r.amp_dtype, r.amp, r.cast_cache);
      Fp8Autocast fp8 = fp8_recipe(r.f);
      // The head and loss as one node (no logits); DDP's forward is the wrapper's, so it
      // keeps the logits form.
      return scaler.scale(r.ddp ? nn::GPT::loss(r.forward_module()(xb), yb) : r.model->forward_loss(xb, yb));
    });
    loss /= scaler.get_scale();
    if (f.train.clip_grad_norm > 0) {
      if (!zero) scaler.unscale_(optimizer);
      if (zero3)
        fsdp.source->clip_grad_norm_(f.train.clip_grad_norm);  // from the shards: one all-reduce
      else if (zero2)
        zero->clip_grad_norm_(f.train.clip_grad_norm);  // from the gradient slices: one all-reduce
      else
        optim::clip_grad_norm_(params, f.train.clip_grad_norm);
    }
    if (zero)
      zero->step();
    else if (in_backward && in_backward->enabled())
      in_backward->finish();  // the device part's last bucket
    else
      skipped += !scaler.step(optimizer);
    scaler.update();
    if (place.host()) place.host()->wait();  // the host's updates done before its learning rate moves
    schedule.after_batch();
    if (host_schedule) host_schedule->after_batch();
    ++ckpt.step;
    last_loss = loss;
    if (r.device.is_cuda()) cuda::synchronize();
    if (tracing) {
      step_range.reset();
      profiler::stop();
      profiler::export_chrome_trace(f.trace);
      const std::string bad = profiler::validate_chrome_trace(profiler::chrome_trace_json());
      if (r.lead())
        std::cout << "trace of step " << ckpt.step << ": " << profiler::event_count() << " events in " << f.trace
                  << (bad.empty() ? " (valid)" : " (" + bad + ")") << std::endl;
    }
    train_seconds += seconds_since(t0);
    tokens += f.batch * T * r.world;
    char stats[96];
    std::snprintf(stats, sizeof stats, "loss %.4f  val %.4f  %.0f tok/s", loss, val, tokens / train_seconds);
    bar.update("step", ckpt.step, f.steps, stats, ckpt.step == f.steps);
    const bool last = ckpt.step == f.steps || ckpt.step == f.stop_after;
    if ((f.eval_every > 0 && ckpt.step % f.eval_every == 0) || last) {
      place.before_forward();
      val = eval_loss(r);
      history.push_back({{"step", ckpt.step}, {"train_loss", loss}, {"val_loss", val}});
      if (r.lead()) {
        bar.finish();
        std::printf("step %lld: train loss %.4f, validation loss %.4f, %.0f tokens/s\n",
                    static_cast<long long>(ckpt.step), loss, val, tokens / train_seconds);
      }
      if (!f.save.empty() && r.lead())
        ckpt.save(f.save);
      else if (!f.save.empty() && zero3)
        (void)ckpt.state_dict();  // the gathers the lead's save runs
    }
    if (f.max_new_tokens > 0 && f.sample_every > 0 && ckpt.step % f.sample_every == 0 && !last)
      print_sample("--- sample at step " + std::to_string(ckpt.step) + " ---");
    if (ckpt.step == f.stop_after) break;
  }
  if (f.max_new_tokens > 0) print_sample("--- sample ---");
  if (!r.lead()) return 0;
  nlohmann::json out = {
      {"preset", f.preset},
      {"val_loss", val},
      {"initial_val_loss", initial_val},
      {"final_train_loss", last_loss},
      {"tokens_per_second", tokens / std::max(train_seconds, 1e-9)},
      {"train_seconds", train_seconds},
      {"steps", ckpt.step},
      {"batch", f.batch * r.world},
      {"micro_batch", r.micro},
      {"grad_accum", f.grad_accum},
      {"world_size", r.world},
      {"block_size", T},
      {"num_parameters", r.model->num_parameters()},
      {"vocab_size", r.model->config.vocab_size},
      {"tokenizer", r.tok->name()},
      {"amp", f.amp},
      {"fp8", f.fp8},
      {"fp8_min_features", f.fp8_min_features},
      {"fp8_delayed", f.fp8_delayed},
      {"fp8_fast_accum", f.fp8_fast_accum},
      {"recompute", f.recompute},
      {"zero", zero != nullptr || zero3},
      {"zero_stage", zero || zero3 ? f.zero_stage : 0},
      {"zero_offload", zero3 && f.zero_offload},
      {"offload", f.offload},
      {"skipped_steps", skipped},
      {"device", r.device.str()},
      {"seed", f.seed},
      {"history", history},
      {"peak_bytes", examples::peak_bytes(r.device)},
      {"at_peak_bytes", examples::at_peak_bytes(r.device)},
  };
  // Model FLOPs utilization against the dense f16/bf16 tensor-core peak of an H100 or H200 SXM
  // (989 TFLOP/s), for a run under autocast on one: llm.c's 6 N + 6 L C T FLOPs a token.
  if (r.device.is_cuda() && r.amp)
    if (const double peak = nn::dense_half_peak_flops(cuda::get_device_properties(r.device.index).name); peak > 0)
      out["mfu"] = nn::gpt_mfu(r.model->config, T, out["tokens_per_second"].get<double>() / r.world, peak);
  std::cout << "peak memory: " << examples::memory_line(out["peak_bytes"]) << "\n" << out.dump() << std::endl;
  return 0;
}

int run(GPT2Flags f, const char* argv0) {
  if (f.nproc > 1 && !std::getenv("RANK")) {  // start the ranks, as tools/launch would
    dist::SpawnOptions o;
    o.nproc = f.nproc;
    o.args = f.passthrough;
    // The ranks start as /proc/self/exe, where runfiles are not found: hand them the corpus.
    if (f.data.empty() && !f.print_logits) o.args.insert(o.args.end(), {"--data", default_corpus(argv0)});
    dist::SpawnResult res = dist::spawn_ranks(o);
    if (res.exit_code != 0) std::cerr << "gpt2: " << res.message << "\n";
    return res.exit_code;
  }
  Run r{std::move(f)};
  if (std::getenv("WORLD_SIZE") && std::string(std::getenv("WORLD_SIZE")) != "1") {
    r.pg = dist::init_process_group();
    r.rank = r.pg->rank();
    r.world = r.pg->size();
    r.device = r.pg->device();
  } else {
    r.device = examples::pick_device(r.f.device);
  }
  manual_seed(r.f.seed + static_cast<uint64_t>(r.rank));  // dropout masks differ per rank
  r.amp = r.f.amp != "off";
  r.amp_dtype = r.f.amp == "f16" ? DType::f16 : DType::bf16;
  MG_CHECK(r.f.amp != "f16" || r.device.is_cuda(), ValueError, "--amp f16 needs a CUDA device (CPU autocast is bf16)");
  MG_CHECK(r.f.offload == "none" || (r.device.is_cuda() && r.world == 1), ValueError, "--offload ", r.f.offload,
           " keeps the state in this process's host memory for one CUDA device; got ", r.device, " and ", r.world,
           " rank(s)");
  r.tok = make_tokenizer(r.f);
  build_model(r);
  if (r.f.print_logits) {
    print_logits(r);
    return 0;
  }
  load_data(r, argv0);
  r.micro = r.f.batch / r.f.grad_accum;
  if (r.f.auto_batch) find_micro_batch(r);
  set_recompute(r);
  fit_memory_budget(r);
  plan_offload_optimizer_blocks(r);
  return train(r);
}

}  // namespace

int main(int argc, char** argv) {
  mg::examples::GPT2Flags flags;
  try {
    flags = mg::examples::parse_gpt2_flags(argc, argv);
  } catch (const mg::Error& e) {
    std::cerr << "gpt2: " << e.what() << "\n(run with --help for the list of flags)\n";
    return 2;
  }
  try {
    return run(std::move(flags), argv[0]);
  } catch (const mg::Error& e) {
    std::cerr << "\ngpt2: error: " << e.what() << "\n";
    return 1;
  }
}
