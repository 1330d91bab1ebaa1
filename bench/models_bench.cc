// Training-step time and peak memory of whole models on the device, for side-by-side
// comparison with bench/pytorch/models_step.py on the same card and configs:
//   ResNet-50, B=64, 3x224x224, f32;  GPT-2 124M, B=8, T=1024, f32.
// Each step: zero_grad, forward, loss, backward, SGD(momentum 0.9) (or AdamW) step. Prints one JSON
// line per model (median step ms over --steps after --warmup, peak allocated/reserved), and from
// one more eager step the peak split by what it scales with: state_bytes_per_param (the
// parameters, their gradients and the optimizer state on the device at the peak, per parameter),
// host_state_bytes_per_param (the same categories in host memory: offloaded masters and moments)
// and activation_kib_per_token (or _per_image: the rest of the peak, per sample), so that
// peak = state_bytes_per_param x parameters + activation_kib_per_token x 1024 x tokens.
//   --dtype f16|bf16   forward and loss under mg::Autocast (f32 master weights; no loss
//                      scaling here: bench_amp has the full GradScaler step)
//   --tune-gemm        GEMM autotuning (kernels::set_gemm_autotune, or MG_GEMM_TUNE=1: each
//                      cuBLASLt shape's first call times the heuristic's top 8 algorithms and
//                      keeps the fastest; " tuned GEMMs"
//                      in the config string, as PyTorch's TunableOp row would be)
//   --tf32             f32 matmuls and convolutions on TF32 tensor cores (kernels::set_allow_tf32),
//                      the row to set beside PyTorch's allow_tf32 = True
// Models (--model resnet50|gpt2|all, or mlp, mobilenet): ResNet-50 and GPT-2 124M as above; mlp,
// only when named, is the main job's MLP 784-256-128-10 (B=64); mobilenet, only when named,
// MobileNet v1 (B=64, 224x224; --channels-last as ResNet-50: depthwise convolutions in NHWC).
//   --cuda-graph       the whole step (forward, backward, optimizer step; AdamW made capturable)
//                      captured into a CUDA graph after --warmup eager steps (mg::CapturedStep)
//                      and timed as replays
//   --profile          then runs --steps more steps under CUPTI and prints, per kernel,
//                      calls and ms per step, and how busy the device was (launch overhead);
//                      eager, also the host's time in each phase of a step started on an idle
//                      device, and how long after the host the device finished
//   --profile-top N    --profile lists the N kernels that took the most time (default 25)
//   --host-samples PATH  then runs --steps more eager steps while sampling the host's call
//                      stacks (bench/host_sampler.h) into PATH, for tools/host_samples.py
//   --channels-last    ResNet-50 runs channels-last (NHWC) end to end: set_memory_format on the
//                      model and an NHWC input (" channels_last" in the config string, as
//                      PyTorch's memory_format=torch.channels_last row)
//   --batch N          batch size (default: 64 for the MLP and ResNet-50, 8 for GPT-2)
//   --seq T            GPT-2's sequence length (default 1024)
//   --gpt NAME         the GPT's size (nn::gpt_preset: gpt2 = 124M, gpt2-medium, gpt2-large,
//                      gpt2-xl, gpt-2.7b, gpt-6.7b); the JSON's model field names it
//   --trace PATH       after the timed steps, one more eager step recorded by mg::profiler into
//                      PATH as a Chrome trace (open it in ui.perfetto.dev): op, backward-node and
//                      phase ranges, the memory counter tracks, the allocator's segment events
//   --fp8              the linear layers' GEMMs in FP8 inside the autocast region (mg::Fp8Autocast:
//                      e4m3 weights and activations, e5m2 gradients, current scaling)
//   --fp8-min-features N  with --fp8: only the linears at least N features wide (in and out);
//                      default the recipe's (mg::kFp8DefaultMinFeatures, 1280), 0: every linear
//                      (" fp8>=N" where N is not the default)
//   --fp8-delayed      with --fp8: delayed scaling (each cast's scale from the operand's recent
//                      casts' amax, mg::Fp8Scaling::Delayed) instead of current (" delayed")
//   --fp8-fast-accum   with --fp8: the gradients' GEMMs accumulate fast too, as the forward's do
//                      (mg::Fp8Accumulation::Fast; " fast-accum")
//   --host-params      GPT: the blocks' Linear weights and biases in pinned host memory with their
//                      gradients and optimizer state, the optimizer stepping them on the CPU, the
//                      device holding their bf16 casts (memory::HostParams; " host params")
//   --host-param-blocks N  GPT: as --host-params, for the last N blocks' Linear parameters only
//                      (partial offload; " host params N blocks"); N = auto: memory::
//                      plan_host_param_blocks' model gives a first N from this run's measured
//                      resident step and host update, and memory::search_host_param_blocks times
//                      steps to find the largest N within --host-param-ratio R (the longest step
//                      allowed against the resident one, default 1.3); printed as its own JSON line
//   --host-casts-on-use  with --host-params: the next forward waits for a host parameter's update
//                      at its first read, not before it starts (HostParams::set_casts_on_first_use;
//                      " casts on use"); the plan counts that overlap
//   --param-offload K  GPT: every parameter's f32 master and optimizer state in pinned host memory,
//                      stepped there during backward; a block's parameters (bf16 Linears) on the
//                      device only while it runs, K blocks fetched ahead (memory::offload_gpt_params;
//                      the model is built in host memory; " param offload prefetch K")
//   --memory-cap G     the allocator's per-process limit at G GiB for the whole run (a G GiB
//                      card out of a larger one, on expandable segments; " cap G GiB" in the config
//                      string): a step that needs more fails with the allocator's OutOfMemoryError
//   --resid-dropout P  GPT-2 with each block's two output dropouts at P (after the attention's
//                      and the MLP's c_proj: bias + dropout + residual add as one kernel;
//                      " resid-dropout P" in the config string; PyTorch's models_step.py takes the
//                      same flag)
//   --optimizer sgd|adamw|adamw8bit  the step's optimizer (default sgd; adamw: fused AdamW, lr
//                      1e-3, weight decay 0.1, "AdamW" in the config string; adamw8bit: the same
//                      with 8-bit moments, "AdamW8bit")
//   --checkpoint       GPT-2 with every block checkpointed (" checkpoint" in the config string)
//   --checkpoint-blocks N  GPT-2 with its first N blocks checkpointed (" checkpoint N blocks"),
//                      or the N after the offloaded ones with --offload-blocks
//   --offload-blocks N GPT-2 with what its first N blocks save for backward offloaded to pinned
//                      host memory (GPTRecompute::offload_blocks; " offload N blocks"); N = auto:
//                      memory::plan_gpt_offload chooses N from the measured host link and the blocks'
//                      profile, and a JSON line gives the plan and its predicted exposed copy time
//                      for every N (" offload N blocks (planned)")
//   --offload-prefetch-mib M  how far backward fetches offloaded tensors ahead (OffloadOptions::
//                      prefetch_bytes; default 512; " prefetch M MiB" when given)
//   --selective        GPT-2 under selective recomputation (RecomputePolicy::cheap_ops: GELU
//                      outputs and layer norms rebuilt in backward; " selective")
//   --memory-budget G  GPT: the fastest mode whose whole step (weights, gradients, optimizer
//                      state, casts, workspaces, activations) peaks under G GiB, found before
//                      timing by memory::fit_state_to_budget: where the state lives (resident;
//                      with --optimizer adamw 8-bit moments; optimizer offload; parameter
//                      offload), and in each memory::gpt_memory_ladder (plain; GELU-only selective
//                      + step in backward; then 1..n_layer blocks checkpointed with a 2048-row
//                      head; with --offload-blocks N the rungs after plain offload the first N
//                      blocks), one trial step each; prints each mode's tries and times the
//                      choice, or says the smallest peak and exits 3 when nothing fits
//   --max-batch-under G  instead of timing: the largest batch whose whole step (forward, backward,
//                      optimizer step) fits under a per-process limit of G GiB, by
//                      find_max_batch_size (doubling, then bisection over OutOfMemoryError); one
//                      JSON line per model with max_batch and the tries
//   --selective-ops L  selective recomputation of the op kinds in the comma-separated list L only
//                      (e.g. gelu: " selective gelu")
//   --keep-ops L       checkpointed blocks keep the outputs of the op kinds in L (attention,
//                      gelu_mlp, linear: CheckpointOptions::keep_ops) and their replay skips
//                      those ops (" keeping L")
//   --head-chunk-rows N  rows of logits linear_cross_entropy makes at a time (default: ~512 MiB)
//   --step-in-backward the optimizer steps inside backward, 32 MiB of parameters at a time
//                      (optim::StepInBackward; " step in backward")
//   --no-step-casts    AdamW does not write the next forward's weight casts in its update (bf16,
//                      and the FP8 recipe's under --fp8-delayed)
//   --no-norm-casts    under --fp8-delayed, the layer norm before a linear writes bf16 and the
//                      linear casts it (autograd::set_fp8_norm_casts(false); " no norm casts")
//   --no-weight-cast-cache  autocast casts each f32 weight at each use instead of once per step
//                      (mg::Autocast's cache_enabled = false; implies --no-step-casts)
//   --logits           GPT-2's head and loss as GPT::loss(model(idx)): the [B, T, V] logits
//                      made and kept (the A/B row; by default GPT::forward_loss, which never
//                      makes them: linear_cross_entropy)
// GPT rows under autocast on an H100/H200 add mfu: model FLOPs utilization (llm.c's count).
// The JSON line carries step_ms (median), step_ms_min / step_ms_max, n_runs, the peak of each
// phase of one more step (peak_forward_gib: zero_grad, forward and loss; peak_backward_gib;
// peak_optimizer_gib), what that step offloaded (offloaded_gib; offload_used_in_place: saved
// tensors backward took from the device before their copy out finished; offload_pending_gib:
// offloaded bytes still on the device, their copy unfinished, as the forward ended), and the throughput
// at the median (samples_per_s: images, or tokens for GPT-2) for the suite
// (bench/runner); its config string is the one bench/pytorch/models_step.py prints.
#include <algorithm>
#include <array>
#include <chrono>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/fp8_linear.h"
#include "autograd/offload.h"
#include "bench/host_sampler.h"
#include "core/cuda/kernel_profiler.h"
#include "bench/step_timer.h"
#include "core/autocast.h"
#include "core/nvml.h"
#include "core/profiler.h"
#include "memgrad.h"
#include "memory/gpt_budget.h"
#include "memory/host_params.h"
#include "memory/param_offload.h"
#include "nn/models/gpt.h"
#include "nn/models/mobilenet.h"
#include "nn/models/resnet.h"

namespace {

bool g_profile = false;
int g_profile_top = 25;  // --profile-top N: kernels listed by --profile
bool g_graph = false;
mg::DType g_dtype = mg::DType::f32;

struct Result {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int n_runs = 0;
  int64_t peak_alloc = 0, peak_reserved = 0;
  double nvml_peak_gib = -1;  // device-wide used memory seen by the driver (context, workspaces, all processes)
  mg::OffloadStats offload;   // of the probe step (activation offload)
};

// Where the peak sits: one more step after the timed ones with the peak counter reset at each
// phase boundary (zero_grad + forward + loss, backward, optimizer step), read by train_step.
struct PhasePeaks {
  bool probe = false;
  int64_t forward = -1, backward = -1, optimizer = -1;
  int64_t offload_pending = 0;  // device bytes of offloaded tensors whose copy out had not finished as forward ended
  // The device's live bytes by category at the step's highest total (over the phases), for the
  // per-parameter and per-token split print() reports; total_peak -1 until a phase ends.
  int64_t total_peak = -1;
  std::array<int64_t, static_cast<size_t>(mg::MemoryCategory::kCount)> at_peak{};
  // Keeps the category breakdown of the phase that just ended if its peak is the step's highest.
  void note_phase_peak(mg::Device dev) {
    const mg::CategoryStats& cs = mg::CategoryStats::get(dev);
    if (cs.total().peak <= total_peak) return;
    total_peak = cs.total().peak;
    at_peak = cs.at_peak();
  }
};
PhasePeaks g_phases;

// With --profile: the host's time in each phase of an eager step (zero_grad + forward + loss,
// backward, optimizer step) from a synchronized start, and when the device finished after the
// host did. A host that takes as long as the step is the bound (launch overhead), not the device.
struct HostPhases {
  bool probe = false;
  bool sync = false;  // synchronize at each phase's end: the device's time of each phase
  std::chrono::steady_clock::time_point t0, forward, backward, optimizer;
};
HostPhases g_host;

// Medians over `steps` steps, each started on an idle device, of the host's time in each phase
// (with `sync`, of the device's: each phase ends synchronized), and of how long the device ran
// on after the host's last phase.
struct PhaseMedians {
  double forward = 0, backward = 0, optimizer = 0, device_after = 0;
};
template <class StepFn>
PhaseMedians phase_medians(StepFn&& step, int steps, bool sync) {
  std::vector<double> f, b, o, d;
  auto ms_between = [](auto a, auto z) { return std::chrono::duration<double, std::milli>(z - a).count(); };
  g_host.probe = true;
  g_host.sync = sync;
  for (int i = 0; i < steps; ++i) {
    mg::cuda::synchronize();
    g_host.t0 = g_host.forward = g_host.backward = g_host.optimizer = std::chrono::steady_clock::now();
    step();
    mg::cuda::synchronize();
    const auto done = std::chrono::steady_clock::now();
    f.push_back(ms_between(g_host.t0, g_host.forward));
    b.push_back(ms_between(g_host.forward, g_host.backward));
    o.push_back(ms_between(g_host.backward, g_host.optimizer));
    d.push_back(ms_between(g_host.optimizer, done));
  }
  g_host.probe = g_host.sync = false;
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {med(f), med(b), med(o), med(d)};
}
std::string g_host_samples;  // --host-samples PATH: sampled host stacks of the eager steps

template <class StepFn>
Result measure(StepFn&& step, int warmup, int steps, mg::Device dev) {
  std::unique_ptr<mg::nvml::Monitor> mon;
  if (mg::nvml::available()) {
    mon = std::make_unique<mg::nvml::Monitor>(dev.index, 5);
    mon->start();
  }
  const std::vector<double> ms = mg::bench::time_steps(step, warmup, steps, dev);
  Result r;
  if (mon) {
    mon->stop();
    r.nvml_peak_gib = mon->peak_used_bytes() / 1073741824.0;
  }
  if (g_profile) {
    mg::profiler::KernelProfiler prof;
    prof.start();
    for (int i = 0; i < steps; ++i) step();
    mg::cuda::synchronize();
    prof.stop();
    std::printf("%s", prof.report(steps, ms[ms.size() / 2], g_profile_top).c_str());
    if (!g_graph) {
      const PhaseMedians h = phase_medians(step, steps, /*sync=*/false);
      std::printf(
          "host ms/step (medians, each step from an idle device): forward+loss %.3f, backward %.3f, optimizer "
          "%.3f; the device finished %.3f ms after the host\n",
          h.forward, h.backward, h.optimizer, h.device_after);
    }
  }
  if (!g_host_samples.empty() && !g_graph) {
    // Sampled host stacks over `steps` eager steps, written for tools/host_samples.py.
    mg::bench::HostSampler sampler;
    sampler.start();
    for (int i = 0; i < steps; ++i) step();
    mg::cuda::synchronize();
    sampler.stop();
    const int n = sampler.write(g_host_samples);
    std::printf("host samples: %d over %d steps written to %s\n", n, steps, g_host_samples.c_str());
  }
  r.median_ms = ms[ms.size() / 2];
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  r.n_runs = static_cast<int>(ms.size());
  r.peak_alloc = mg::max_memory_allocated(dev);
  r.peak_reserved = mg::max_memory_reserved(dev);
  g_phases = {.probe = true};  // a captured step's replay never calls train_step: its phases stay -1
  mg::reset_peak_memory_stats(dev);
  mg::reset_offload_stats();
  step();
  mg::cuda::synchronize();
  r.offload = mg::offload_stats();
  g_phases.probe = false;
  return r;
}

// measure() of the eager step, or with --cuda-graph of its replays (the capture's warm-up is
// the eager warm-up; two replays warm the graph itself).
// --trace PATH: after the timed steps, one more eager step under mg::profiler, written to PATH
// as a Chrome trace (Perfetto) and checked by its validator.
std::string g_trace_path;
template <class StepFn>
void trace_one_step(StepFn& step, mg::Device dev) {
  if (g_trace_path.empty()) return;
  mg::cuda::synchronize(dev.index);
  mg::profiler::start();  // with the device's side: CUPTI's records (core/cuda/kernel_profiler.h)
  const auto t0 = std::chrono::steady_clock::now();
  {
    mg::profiler::Range r("step", "phase");
    step();
    mg::cuda::synchronize(dev.index);
  }
  const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  mg::profiler::stop();
  double cupti_kernel_ms = 0, trace_kernel_ms = 0;
  int64_t trace_kernels = 0, linked = 0;
  if (dev.is_cuda()) {
    for (const mg::profiler::KernelTotal& t : mg::profiler::trace_kernels().totals())
      if (t.name.empty() || t.name[0] != '[') cupti_kernel_ms += t.total_ms;
  }
  const std::string text = mg::profiler::chrome_trace_json();
  mg::profiler::export_chrome_trace(g_trace_path);
  const std::string bad = mg::profiler::validate_chrome_trace(text);
  const nlohmann::json trace = nlohmann::json::parse(text);
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "kernel") {
      ++trace_kernels;
      trace_kernel_ms += e["dur"].get<double>() * 1e-3;
      if (e.contains("args") && e["args"].contains("op")) ++linked;
    }
  std::fprintf(stderr,
               "bench_models: one step's trace, %zu events, in %s (%s); the traced step %.2f ms; %lld kernels, "
               "%lld linked to their op, %.3f ms of kernels on the trace against %.3f ms in CUPTI's table\n",
               mg::profiler::event_count(), g_trace_path.c_str(), bad.empty() ? "valid" : bad.c_str(), step_ms,
               static_cast<long long>(trace_kernels), static_cast<long long>(linked), trace_kernel_ms, cupti_kernel_ms);
}

template <class StepFn>
Result run(StepFn& step, int warmup, int steps, mg::Device dev) {
  if (!g_graph) {
    Result r = measure(step, warmup, steps, dev);
    trace_one_step(step, dev);
    return r;
  }
  mg::CapturedStep captured(step, warmup);
  return measure([&] { captured.replay(); }, 2, steps, dev);
}

// The optimizer every model step uses (--optimizer): SGD with momentum 0.9 (the suite's rows)
// or fused AdamW (lr 1e-3, weight decay 0.1, GPT-2's usual), PyTorch's fused=True on its side.
std::string g_optimizer = "sgd";
bool g_fp8 = false;  // --fp8: the linear layers' GEMMs in FP8 (mg::Fp8Autocast) inside the autocast region
int64_t g_fp8_min_features = mg::kFp8DefaultMinFeatures;  // --fp8-min-features N
bool g_fp8_delayed = false;                               // --fp8-delayed: mg::Fp8Scaling::Delayed
bool g_fp8_fast_accum = false;                            // --fp8-fast-accum: mg::Fp8Accumulation::Fast
// --no-step-casts: AdamW does not write the next forward's bf16 casts (or FP8 codes) in its update
// (the forward casts each weight as it reads it): 2 bytes a parameter fewer between the step and
// the forward.
bool g_step_casts = true;
// --no-norm-casts: the FP8 recipe's norms write bf16 for the linear after them to cast (the A/B of
// the norm writing the linear's FP8 codes, autograd::fp8_norm_linear).
bool g_norm_casts = true;
// --no-weight-cast-cache: no cast of a weight outlives its use (and its backward's): the forward's
// end holds none of them where every block is checkpointed.
bool g_cast_cache = true;
// --memory-budget: the chosen rung's setting (memory::gpt_memory_ladder sets it: off where blocks
// are checkpointed).
bool g_rung_cast_cache = true;
std::unique_ptr<mg::optim::Optimizer> make_optimizer(const std::vector<mg::Tensor>& params) {
  if (g_optimizer == "adamw" || g_optimizer == "adamw8bit") {
    mg::optim::AdamW8bitOptions o;
    o.weight_decay = 0.1;
    // A captured step replays the update: its step counts (bias corrections) and lr must live
    // on the device, as PyTorch's fused AdamW keeps its step count there.
    o.capturable = g_graph;
    o.write_autocast_casts = g_step_casts;
    if (g_optimizer == "adamw8bit") return std::make_unique<mg::optim::AdamW8bit>(params, o);
    o.state_bits = 32;
    return std::make_unique<mg::optim::AdamW>(params, o);
  }
  return std::make_unique<mg::optim::SGD>(params, mg::optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
}

// --host-params: GPT-2's Linear weights and biases in host memory (memory/host_params.h).
std::unique_ptr<mg::memory::HostParams> g_host_params;
// --param-offload: every parameter in host memory, a block's on the device while it runs
// (memory/param_offload.h).
mg::memory::ParamOffload g_param_offload;

// The HostParams of --host-params or --param-offload, if either is on.
mg::memory::HostParams* host_side() {
  return g_host_params ? g_host_params.get() : g_param_offload.source ? &g_param_offload.source->host() : nullptr;
}

// --host-params' second line: per step, the host update's time (the optimizer, then the casts it
// writes where the optimizer did not), the time the next forward waited for it (what backward did
// not hide), the bytes over the host link each way; and the update's memory traffic against the
// host's copy bandwidth measured here: the gradient as it came home (4 or 2 bytes an element),
// the state the optimizer reads and writes (AdamW in f32: the master and two moments, 24 bytes;
// 8-bit moments 12; SGD with momentum 16), and the bf16 cast's 2.
void print_host_params(const mg::memory::HostParams& hp) {
  const mg::memory::HostParams::Stats s = hp.stats();
  const int64_t n = hp.host_bytes() / 4;
  const double steps = n > 0 ? static_cast<double>(s.updates) / static_cast<double>(hp.params().size()) : 0;
  if (steps <= 0) return;
  const double grad_bytes = static_cast<double>(s.to_host_bytes) / steps / static_cast<double>(n);
  const double bytes_per_elem = (g_optimizer == "adamw" ? 24 : g_optimizer == "adamw8bit" ? 12 : 16) + grad_bytes + 2;
  const double copy = mg::memory::measure_host_copy_bandwidth();
  const double update_per_ms = bytes_per_elem * n * steps / (s.update_ms + s.cast_ms);
  std::printf(
      "{\"host_params\":%lld,\"host_gib\":%.3f,\"updates_per_param\":%.0f,\"update_ms\":%.1f,\"cast_ms\":%.1f,"
      "\"wait_ms\":%.1f,\"to_host_gib\":%.3f,\"to_device_gib\":%.3f,\"host_copy_gbps\":%.1f,"
      "\"update_gbps\":%.1f,\"update_fraction_of_copy\":%.3f}\n",
      static_cast<long long>(n), hp.host_bytes() / 1073741824.0, steps, s.update_ms / steps, s.cast_ms / steps,
      s.wait_ms / steps, s.to_host_bytes / steps / 1073741824.0, s.to_device_bytes / steps / 1073741824.0, copy / 1e6,
      update_per_ms / 1e6, update_per_ms / copy);
  // The host-resident state by category (pinned masters and casts, moments, gradients on their
  // way), as the allocator's categories count the device's.
  const mg::CategoryStats& host = mg::CategoryStats::get(mg::Device::cpu());
  std::printf("{\"host_memory_gib\":{");
  for (int c = 0; c < static_cast<int>(mg::MemoryCategory::kCount); ++c) {
    const auto cat = static_cast<mg::MemoryCategory>(c);
    std::printf("%s\"%s\":{\"current\":%.3f,\"peak\":%.3f}", c ? "," : "", mg::memory_category_name(cat),
                host.counter(cat).current / 1073741824.0, host.counter(cat).peak / 1073741824.0);
  }
  std::printf("}}\n");
}

// One optimizer step on a loss computed under the bench's autocast (--dtype): zero_grad, the
// forward and loss (`loss_of`), backward, step.
// With `in_backward` (--step-in-backward) the update runs inside backward, a bucket at a time,
// and finish() steps what is left.
template <class LossFn>
auto train_step(mg::optim::Optimizer& opt, LossFn loss_of, mg::optim::StepInBackward* in_backward = nullptr) {
  return [&opt, loss_of, in_backward] {
    const mg::Device dev = mg::Device::cuda(0);
    auto phase_end = [&](int64_t& peak) {
      if (g_host.probe) {
        if (g_host.sync) mg::cuda::synchronize();  // the device's phase, not the host's launches
        const auto now = std::chrono::steady_clock::now();
        (&peak == &g_phases.forward    ? g_host.forward
         : &peak == &g_phases.backward ? g_host.backward
                                       : g_host.optimizer) = now;
      }
      if (!g_phases.probe) return;
      peak = mg::max_memory_allocated(dev);
      g_phases.note_phase_peak(dev);
      mg::reset_peak_memory_stats(dev);
    };
    opt.zero_grad();
    mg::Tensor loss;
    {
      mg::profiler::Range r("forward", "phase");
      mg::Autocast ac(mg::DeviceType::CUDA, g_dtype == mg::DType::f32 ? mg::DType::f16 : g_dtype,
                      g_dtype != mg::DType::f32, g_cast_cache && g_rung_cast_cache);
      mg::Fp8Autocast fp8(g_fp8, g_fp8_min_features, g_fp8_delayed ? mg::Fp8Scaling::Delayed : mg::Fp8Scaling::Current,
                          g_fp8_fast_accum ? mg::Fp8Accumulation::Fast : mg::Fp8Accumulation::Promoted);
      loss = loss_of();
    }
    phase_end(g_phases.forward);
    if (g_phases.probe) g_phases.offload_pending = mg::offload_stats().device_bytes;
    {
      mg::profiler::Range r("backward", "phase");
      loss.backward();
      loss = mg::Tensor();
    }
    phase_end(g_phases.backward);
    {
      mg::profiler::Range r("optimizer", "phase");
      if (in_backward && in_backward->enabled())
        in_backward->finish();
      else
        opt.step();
      if (g_host_params) g_host_params->provide_casts();  // the next forward's casts of the host parameters
    }
    phase_end(g_phases.optimizer);
  };
}

// `samples`: what one step consumes (images, or tokens for GPT-2), `unit` names it.
// The GPT rows' model FLOPs utilization (llm.c's 6 N + 6 L C T a token against the card's dense
// bf16/f16 tensor-core peak: 989 TFLOP/s on the H100 and H200 SXM): set for GPT rows under
// autocast on those cards, 0 elsewhere (no "mfu" field).
double g_flops_per_sample = 0, g_peak_flops = 0;

// The probe step's peak split by what it scales with (from the allocator's categories at that
// moment): the model state (parameters, their gradients, the optimizer's state) per parameter,
// on the device and in host memory, and the rest of the peak (saved activations, autocast's and
// FP8's copies, gathered parameters, workspaces) per sample. Empty where no eager probe ran
// (a captured step's replay allocates nothing) or the model has no parameters.
std::string memory_split(int64_t n_params, int64_t samples, const char* unit) {
  if (g_phases.total_peak <= 0 || n_params <= 0 || samples <= 0) return "";
  using C = mg::MemoryCategory;
  auto at = [](C c) { return g_phases.at_peak[static_cast<size_t>(c)]; };
  const int64_t state = at(C::Parameters) + at(C::Gradients) + at(C::OptimizerState);
  const mg::CategoryStats& host = mg::CategoryStats::get(mg::Device::cpu());
  const int64_t host_state = host.counter(C::Parameters).current + host.counter(C::Gradients).current +
                             host.counter(C::OptimizerState).current;
  std::string per(unit);  // "tokens" -> "token"
  if (!per.empty() && per.back() == 's') per.pop_back();
  char out[256];
  std::snprintf(out, sizeof(out),
                ",\"state_bytes_per_param\":%.3f,\"host_state_bytes_per_param\":%.3f,\"activation_kib_per_%s\":%.3f",
                static_cast<double>(state) / n_params, static_cast<double>(host_state) / n_params, per.c_str(),
                static_cast<double>(g_phases.total_peak - state) / samples / 1024.0);
  return out;
}

void print(const char* model, const std::string& config, const Result& r, int64_t samples, const char* unit,
           int64_t n_params) {
  const double per_s = samples / (r.median_ms / 1000.0);
  char mfu[32] = "";
  if (g_flops_per_sample > 0 && g_peak_flops > 0)
    std::snprintf(mfu, sizeof(mfu), ",\"mfu\":%.4f", per_s * g_flops_per_sample / g_peak_flops);
  const std::string split = memory_split(n_params, samples, unit);
  std::printf(
      "{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"%s\",\"step_ms\":%.2f,\"step_ms_min\":%.2f,"
      "\"step_ms_max\":%.2f,\"n_runs\":%d,\"peak_allocated_gib\":%.3f,\"peak_reserved_gib\":%.3f,"
      "\"nvml_peak_used_gib\":%.3f,\"samples_per_s\":%.0f,\"sample_unit\":\"%s\",\"peak_forward_gib\":%.3f,"
      "\"peak_backward_gib\":%.3f,\"peak_optimizer_gib\":%.3f,\"offloaded_gib\":%.3f,\"offload_used_in_place\":%lld,"
      "\"offload_pending_gib\":%.3f%s%s}"
      "\n",
      model, config.c_str(), r.median_ms, r.min_ms, r.max_ms, r.n_runs, r.peak_alloc / 1073741824.0,
      r.peak_reserved / 1073741824.0, r.nvml_peak_gib, per_s, unit, g_phases.forward / 1073741824.0,
      g_phases.backward / 1073741824.0, g_phases.optimizer / 1073741824.0, r.offload.offloaded_bytes / 1073741824.0,
      static_cast<long long>(r.offload.used_in_place), g_phases.offload_pending / 1073741824.0, mfu, split.c_str());
  std::fflush(stdout);
}

// The largest batch whose step fits under `gib` GiB (the allocator's per-process limit), after
// one step at batch 1 has made the optimizer state; the limit is lifted afterwards.
void print_max_batch(const char* model, const std::string& config, double gib, mg::Device dev,
                     const std::function<void(int64_t)>& step_at) {
  mg::cuda::empty_cache();
  mg::cuda::set_per_process_memory_limit(static_cast<int64_t>(gib * 1073741824.0), dev.index);
  const mg::memory::BatchSearchResult r = mg::memory::find_max_batch_size([&](int64_t b) {
    try {
      step_at(b);
    } catch (const mg::OutOfMemoryError&) {
      mg::cuda::synchronize();
      mg::cuda::empty_cache();
      throw;
    }
  });
  mg::cuda::set_per_process_memory_limit(0, dev.index);
  std::string tries;
  for (auto [b, ok] : r.tries)
    tries += (tries.empty() ? "" : ",") + std::string("[") + std::to_string(b) + "," + (ok ? "true" : "false") + "]";
  std::printf(
      "{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"%s max batch under %g GiB\","
      "\"max_batch\":%lld,\"tries\":[%s]}\n",
      model, config.c_str(), gib, static_cast<long long>(r.max_batch), tries.c_str());
  std::fflush(stdout);
}

}  // namespace

// --host-param-blocks auto: memory::plan_host_param_blocks' model gives a first count from this
// run's resident phases (a device optimizer over every parameter, torn down after), the host
// update of one block as a HostParams runs it, and the host link. The model leaves out what the
// host's ordering adds (the launching thread waits for the updates, and the device then waits for
// its launches), so the count is then checked by timing: full steps with N blocks on the host,
// the largest N within the ratio found by memory::search_host_param_blocks from the model's
// count (each trial's parameters come back to the device after it). Prints the model's inputs,
// its count and each trial, and returns the count the trials chose.
int64_t plan_host_blocks(mg::nn::GPT& model, const mg::nn::GPTConfig& cfg, int64_t B, int64_t T, bool in_backward,
                         double ratio, bool casts_on_use, const std::string& label) {
  const mg::Device dev = mg::Device::cuda(0);
  mg::Tensor idx = mg::randint(0, cfg.vocab_size, {B, T}, {mg::DType::i64, dev});
  mg::Tensor tgt = mg::randint(0, cfg.vocab_size, {B, T}, {mg::DType::i64, dev});
  const mg::memory::HostOptimizerFactory factory = [](std::vector<mg::Tensor> ps) { return make_optimizer(ps); };
  // Median step (ms) with the last n blocks' Linear parameters on the host (n = 0: resident);
  // `phases` also takes the resident step's forward and backward.
  auto trial = [&](int64_t n, PhaseMedians* phases) {
    std::vector<mg::Tensor> host;
    if (n > 0) {
      host = mg::memory::gpt_linear_params(model, cfg.n_layer - n);
      g_host_params = std::make_unique<mg::memory::HostParams>(host, dev, factory);
      g_host_params->set_casts_on_first_use(casts_on_use);
      g_host_params->provide_casts();
    }
    double ms = 0;
    {
      auto opt = make_optimizer(g_host_params ? g_host_params->others(model.parameters()) : model.parameters());
      std::unique_ptr<mg::optim::StepInBackward> sib;
      if (in_backward) sib = std::make_unique<mg::optim::StepInBackward>(*opt);
      auto step = train_step(
          *opt, [&] { return model.forward_loss(idx, tgt); }, sib.get());
      std::vector<double> t = mg::bench::time_steps(step, 3, 8, dev);  // the first step makes the state
      std::sort(t.begin(), t.end());
      ms = t[t.size() / 2];
      if (phases) *phases = phase_medians(step, 5, /*sync=*/true);
      opt->zero_grad();
    }
    g_host_params.reset();
    model.to(dev);  // the host parameters back on the device, still counted as parameters
    mg::cuda::synchronize();
    mg::cuda::empty_cache();
    return ms;
  };
  PhaseMedians ph;
  const double resident_ms = trial(0, &ph);
  const std::vector<mg::Tensor> block = mg::memory::gpt_linear_params(model, cfg.n_layer - 1);
  int64_t elements = 0;
  for (const mg::Tensor& p : block) elements += p.numel();
  mg::memory::HostBlocksInput in;
  in.n_layer = cfg.n_layer;
  in.forward_ms = ph.forward;
  in.backward_ms = ph.backward + ph.optimizer;  // backward and the rest of the update
  // The model takes the update as a HostParams runs it (pinned memory, the gradients' copies).
  in.block_update_ms = mg::memory::measure_host_params_update_ms(block, dev, factory);
  mg::cuda::empty_cache();
  const mg::HostLink link = mg::measure_host_link(dev);
  in.block_copy_ms = link.to_device_bytes_per_ms > 0 ? 2.0 * elements / link.to_device_bytes_per_ms : 0.0;
  in.max_step_ratio = ratio;
  in.casts_on_first_use = casts_on_use;
  const mg::memory::HostBlocksPlan plan = mg::memory::plan_host_param_blocks(in);
  const mg::memory::HostBlocksSearch found = mg::memory::search_host_param_blocks(
      cfg.n_layer, plan.blocks, resident_ms, ratio, [&](int64_t n) { return trial(n, nullptr); });
  std::string trials;
  for (const auto& [n, ms] : found.trials)
    trials += std::string(trials.empty() ? "" : ",") + "[" + std::to_string(n) + "," + std::to_string(ms) + "]";
  std::string steps;
  for (double ms : plan.step_ms) steps += (steps.empty() ? "" : ",") + std::to_string(ms);
  std::printf(
      "{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"B=%lld T=%lld host param plan\","
      "\"forward_ms\":%.2f,\"backward_ms\":%.2f,\"block_params\":%lld,\"block_update_ms\":%.2f,"
      "\"block_copy_ms\":%.2f,\"max_step_ratio\":%.2f,\"model_blocks\":%lld,"
      "\"predicted_ms\":%.2f,\"predicted_step_ms\":[%s],\"resident_step_ms\":%.2f,\"trials\":[%s],"
      "\"blocks\":%lld}\n",
      label.c_str(), static_cast<long long>(B), static_cast<long long>(T), in.forward_ms, in.backward_ms,
      static_cast<long long>(elements), in.block_update_ms, in.block_copy_ms, ratio,
      static_cast<long long>(plan.blocks), plan.predicted_ms, steps.c_str(), resident_ms, trials.c_str(),
      static_cast<long long>(found.blocks));
  std::fflush(stdout);
  return found.blocks;
}

// %g of v: 0.1 as "0.1".
std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// --memory-budget: memory::fit_state_to_budget over where the GPT's state lives and, in each mode,
// its activation ladder; each mode is built from scratch (the one before torn down first), so a
// model whose f32 state does not fit the device reaches the offload modes; the first mode and
// rung that fit are timed.
int gpt_budget_run(const mg::nn::GPTConfig& cfg, const std::string& label, const std::string& tag, int64_t B, int64_t T,
                   double budget_gib, int64_t offload_blocks, int warmup, int steps, mg::Device dev) {
  using mg::memory::StateMode;
  struct Setup {
    std::shared_ptr<mg::nn::GPT> model;
    std::unique_ptr<mg::optim::Optimizer> opt;
    std::unique_ptr<mg::optim::StepInBackward> sib;
  } s;
  auto teardown = [&] {
    s.sib.reset();
    s.opt.reset();
    g_param_offload = {};
    g_host_params.reset();
    s.model.reset();
    mg::cuda::synchronize();
    mg::cuda::empty_cache();
  };
  const std::string requested = g_optimizer;
  std::vector<StateMode> modes = {StateMode::Resident};
  if (requested == "adamw") modes.push_back(StateMode::EightBit);
  modes.insert(modes.end(), {StateMode::OptimizerOffload, StateMode::ParameterOffload});
  std::function<void()> step;
  auto setup = [&](StateMode mode) {
    teardown();
    g_optimizer = mode == StateMode::EightBit ? "adamw8bit" : requested;
    const bool params_on_host = mode == StateMode::ParameterOffload;
    s.model =
        std::make_shared<mg::nn::GPT>(cfg, mg::TensorOptions(mg::DType::f32, params_on_host ? mg::Device::cpu() : dev));
    s.model->train();
    auto host_optimizer = [](std::vector<mg::Tensor> ps) { return make_optimizer(ps); };
    if (mode == StateMode::OptimizerOffload) {
      g_host_params =
          std::make_unique<mg::memory::HostParams>(mg::memory::gpt_linear_params(*s.model), dev, host_optimizer);
      g_host_params->provide_casts();
    }
    if (params_on_host) g_param_offload = mg::memory::offload_gpt_params(*s.model, dev, host_optimizer);
    s.opt = make_optimizer(g_host_params    ? g_host_params->others(s.model->parameters())
                           : params_on_host ? std::vector<mg::Tensor>{}
                                            : s.model->parameters());
    if (!params_on_host) s.sib = std::make_unique<mg::optim::StepInBackward>(*s.opt);
    mg::Tensor idx = mg::randint(0, cfg.vocab_size, {B, T}, {mg::DType::i64, dev});
    mg::Tensor tgt = mg::randint(0, cfg.vocab_size, {B, T}, {mg::DType::i64, dev});
    auto model = s.model;
    auto plain = train_step(
        *s.opt, [model, idx, tgt] { return model->forward_loss(idx, tgt); }, s.sib.get());
    // A step that ran out of memory leaves nothing behind: the step inside backward drops its
    // round, the gradients go.
    step = [plain, sib = s.sib.get(), opt = s.opt.get()] {
      try {
        plain();
      } catch (const mg::OutOfMemoryError&) {
        if (sib) sib->abandon();
        opt->zero_grad();
        // The offload modes' host side: the failed step's queued updates run, a new round starts.
        if (g_param_offload.units) g_param_offload.units->abandon_step();
        if (g_host_params) g_host_params->provide_casts();
        throw;
      }
    };
    return mg::memory::StateTrial{
        mg::memory::gpt_memory_ladder(*s.model, s.sib.get(), offload_blocks, &g_rung_cast_cache), step};
  };
  const int64_t budget = static_cast<int64_t>(budget_gib * 1073741824.0);
  const mg::memory::StateFitResult fit = mg::memory::fit_state_to_budget(modes, setup, budget, dev);
  std::string tries;
  for (size_t m = 0; m < fit.modes.size(); ++m) {
    std::string rungs;
    for (const auto& [name, peak] : fit.ladders[m].peaks)
      rungs += (rungs.empty() ? "" : ",") + std::string("[\"") + name + "\"," + std::to_string(peak) + "]";
    tries += (tries.empty() ? "" : ",") + std::string("{\"mode\":\"") + mg::memory::state_mode_name(fit.modes[m]) +
             "\",\"tries\":[" + rungs + "]}";
  }
  std::printf(
      "{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"B=%lld T=%lld%s memory budget %g GiB\","
      "\"fits\":%s,\"summary\":\"%s\",\"modes\":[%s]}\n",
      label.c_str(), static_cast<long long>(B), static_cast<long long>(T), tag.c_str(), budget_gib,
      fit.fits() ? "true" : "false", fit.summary(budget).c_str(), tries.c_str());
  std::fflush(stdout);
  if (!fit.fits()) {
    teardown();
    return 3;
  }
  const mg::memory::BudgetFitResult& rungs = fit.ladders[fit.chosen];
  if (mg::memory::HostParams* host = host_side()) host->reset_stats();  // the trials' steps made the state
  print(label.c_str(),
        "B=" + std::to_string(B) + " T=" + std::to_string(T) + tag + " " +
            mg::memory::state_mode_name(fit.modes[fit.chosen]) + ", " + rungs.peaks[rungs.chosen].first,
        run(step, warmup, steps, dev), B * T, "tokens", s.model->num_parameters());
  if (g_host_params) print_host_params(*g_host_params);
  if (g_param_offload.source) print_host_params(g_param_offload.source->host());
  teardown();
  return 0;
}

int run_main(int argc, char** argv) {
  std::string which = "all";
  int warmup = 3, steps = 10;
  std::string dtype = "f32";
  bool tune_gemm = false;
  bool tf32 = false, logits = false, checkpoint = false, selective = false, in_backward = false;
  bool channels_last = false;
  int64_t head_chunk_rows = 0;
  std::string selective_ops;  // comma-separated RecomputePolicy op kinds
  std::string keep_ops;       // comma-separated CheckpointOptions::keep_ops of checkpointed blocks
  int checkpoint_blocks = 0, offload_blocks = 0;
  bool offload_auto = false;          // --offload-blocks auto: memory::plan_gpt_offload chooses
  int64_t offload_prefetch_mib = -1;  // -1: OffloadOptions' default
  double max_batch_gib = 0;           // > 0: the largest-batch search instead of timing
  double budget_gib = 0;              // > 0: the fastest GPT-2 mode whose whole step fits, then timed
  int64_t batch = 0, seq = 1024;      // batch 0: each model's default
  std::string gpt_size = "gpt2";      // --gpt: the GPT preset (nn::gpt_preset)
  double memory_cap_gib = 0;          // --memory-cap: the allocator's per-process limit for the whole run
  bool host_params = false;           // --host-params: GPT's Linear parameters in host memory
  int host_param_blocks = -1;         // --host-param-blocks N: the last N blocks' only; -2: auto
  double host_param_ratio = 1.3;      // --host-param-ratio R: auto's longest step against the resident one
  bool host_casts_on_use = false;     // --host-casts-on-use: HostParams::set_casts_on_first_use
  int param_offload = -1;             // --param-offload PREFETCH: every parameter in host memory
  double resid_dropout = 0;           // GPT-2's output dropouts (--resid-dropout)
  // Each argument a flag below matched; a "--" argument none matched is refused at the end.
  std::vector<bool> known(static_cast<size_t>(argc), false);
  auto flag = [&](int i, const char* name) {
    if (std::strcmp(argv[i], name)) return false;
    known[static_cast<size_t>(i)] = true;
    return true;
  };
  for (int i = 1; i < argc; ++i) {
    if (flag(i, "--profile")) g_profile = true;
    if (flag(i, "--tf32")) tf32 = true;
    if (flag(i, "--tune-gemm")) tune_gemm = true;
    if (flag(i, "--cuda-graph")) g_graph = true;
    if (flag(i, "--logits")) logits = true;
    if (flag(i, "--checkpoint")) checkpoint = true;
    if (flag(i, "--selective")) selective = true;
    if (flag(i, "--step-in-backward")) in_backward = true;
    if (flag(i, "--no-step-casts")) g_step_casts = false;
    if (flag(i, "--no-norm-casts")) g_norm_casts = false;
    if (flag(i, "--no-weight-cast-cache")) g_cast_cache = g_step_casts = false;
    if (flag(i, "--channels-last")) channels_last = true;
    if (flag(i, "--host-params")) host_params = true;  // a switch: read here, last or not
    if (flag(i, "--host-param-blocks") && i + 1 < argc) {
      host_params = true;
      host_param_blocks = !std::strcmp(argv[i + 1], "auto") ? -2 : std::max(0, std::atoi(argv[i + 1]));
    }
    if (flag(i, "--host-param-ratio") && i + 1 < argc) host_param_ratio = std::atof(argv[i + 1]);
    if (flag(i, "--host-casts-on-use")) host_casts_on_use = true;
    if (flag(i, "--fp8")) g_fp8 = true;
    if (flag(i, "--fp8-delayed")) g_fp8_delayed = true;
    if (flag(i, "--fp8-fast-accum")) g_fp8_fast_accum = true;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (flag(i, "--dtype"))
      dtype = argv[++i];
    else if (flag(i, "--model"))
      which = argv[++i];
    else if (flag(i, "--steps"))
      steps = std::atoi(argv[++i]);
    else if (flag(i, "--profile-top"))
      g_profile_top = std::max(1, std::atoi(argv[++i]));
    else if (flag(i, "--warmup"))
      warmup = std::atoi(argv[++i]);
    else if (flag(i, "--batch"))
      batch = std::atoll(argv[++i]);
    else if (flag(i, "--seq"))
      seq = std::atoll(argv[++i]);
    else if (flag(i, "--gpt"))
      gpt_size = argv[++i];
    else if (flag(i, "--memory-cap"))
      memory_cap_gib = std::atof(argv[++i]);
    else if (flag(i, "--param-offload"))
      param_offload = std::max(0, std::atoi(argv[++i]));
    else if (flag(i, "--trace"))
      g_trace_path = argv[++i];
    else if (flag(i, "--fp8-min-features"))
      g_fp8_min_features = std::max<int64_t>(0, std::atoll(argv[++i]));
    else if (flag(i, "--resid-dropout"))
      resid_dropout = std::atof(argv[++i]);
    else if (flag(i, "--optimizer"))
      g_optimizer = argv[++i];
    else if (flag(i, "--checkpoint-blocks"))
      checkpoint_blocks = std::atoi(argv[++i]);
    else if (flag(i, "--offload-blocks")) {
      offload_auto = !std::strcmp(argv[++i], "auto");
      offload_blocks = offload_auto ? 0 : std::atoi(argv[i]);
    } else if (flag(i, "--offload-prefetch-mib"))
      offload_prefetch_mib = std::atoll(argv[++i]);
    else if (flag(i, "--selective-ops"))
      selective_ops = argv[++i];
    else if (flag(i, "--keep-ops"))
      keep_ops = argv[++i];
    else if (flag(i, "--head-chunk-rows"))
      head_chunk_rows = std::atoll(argv[++i]);
    else if (flag(i, "--memory-budget"))
      budget_gib = std::atof(argv[++i]);
    else if (flag(i, "--max-batch-under"))
      max_batch_gib = std::atof(argv[++i]);
    else if (flag(i, "--host-samples"))
      g_host_samples = argv[++i];
  }
  for (int i = 1; i < argc; ++i)
    if (!known[static_cast<size_t>(i)] && !std::strncmp(argv[i], "--", 2)) {
      std::fprintf(stderr, "bench_models: unknown flag %s (the flags are listed at the top of bench/models_bench.cc)\n",
                   argv[i]);
      return 2;
    }
  if (g_optimizer != "sgd" && g_optimizer != "adamw" && g_optimizer != "adamw8bit") {
    std::fprintf(stderr, "bench_models: --optimizer must be sgd, adamw or adamw8bit, got %s\n", g_optimizer.c_str());
    return 2;
  }
  if (batch < 0 || seq < 1) {
    std::fprintf(stderr, "bench_models: --batch must be >= 1 and --seq >= 1\n");
    return 2;
  }
  auto batch_or = [&](int64_t d) { return batch > 0 ? batch : d; };
  if (dtype == "f16")
    g_dtype = mg::DType::f16;
  else if (dtype == "bf16")
    g_dtype = mg::DType::bf16;
  else if (dtype != "f32") {
    std::fprintf(stderr, "bench_models: --dtype must be f32, f16 or bf16, got %s\n", dtype.c_str());
    return 2;
  }
  // --tune-gemm turns autotuning on; MG_GEMM_TUNE=1 already has (kernels::gemm_autotune). The
  // label says which ran.
  if (tune_gemm) mg::kernels::set_gemm_autotune(true);
  tune_gemm = mg::kernels::gemm_autotune();
  if (g_fp8 && dtype == "f32") {
    std::fprintf(stderr, "bench_models: --fp8 runs inside the autocast region: it needs --dtype bf16 or f16\n");
    return 2;
  }
  const std::string tag =
      " " + dtype + (dtype == "f32" ? "" : " autocast") +
      (g_fp8 ? " fp8" +
                   (g_fp8_min_features != mg::kFp8DefaultMinFeatures ? ">=" + std::to_string(g_fp8_min_features)
                                                                     : std::string()) +
                   (g_fp8_delayed ? " delayed" : "") + (g_fp8_fast_accum ? " fast-accum" : "")
             : "") +
      (tf32 ? " TF32" : "") + (channels_last ? " channels_last" : "") +
      (g_optimizer == "adamw"       ? " AdamW"
       : g_optimizer == "adamw8bit" ? " AdamW8bit"
                                    : "") +
      (g_step_casts ? "" : " no step casts") + (g_norm_casts ? "" : " no norm casts") +
      (g_cast_cache ? "" : " no weight-cast cache") + (g_graph ? " CUDA graph" : "") +
      (tune_gemm ? " tuned GEMMs" : "") + (resid_dropout > 0 ? " resid-dropout " + fmt_g(resid_dropout) : "") +
      (memory_cap_gib > 0 ? " cap " + fmt_g(memory_cap_gib) + " GiB" : "");
  mg::autograd::set_fp8_norm_casts(g_norm_casts);
  if (!mg::cuda::is_available()) {
    std::fprintf(stderr, "bench_models: no CUDA device; nothing to measure\n");
    return 0;
  }
  const mg::Device dev = mg::Device::cuda(0);
  // A smaller card out of this one: every allocation of the run (model, state, steps) under it,
  // from expandable segments (what a full card runs on: the cap counts reserved bytes, and
  // fixed-size segments would lose the difference to fragmentation).
  if (memory_cap_gib > 0) {
    mg::cuda::set_expandable_segments(true, dev.index);
    mg::cuda::set_per_process_memory_limit(static_cast<int64_t>(memory_cap_gib * 1073741824.0), dev.index);
  }
  mg::kernels::set_allow_tf32(tf32);
  mg::manual_seed(0);
  if (which == "mlp") {  // not in "all": the suite's model rows are ResNet-50 and GPT-2
    // The main job's MLP (examples/fashion_mnist): launch-bound, where capture matters most.
    auto model = std::make_shared<mg::nn::Sequential>();
    const std::vector<int64_t> widths{784, 256, 128, 10};
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      model->push_back(
          std::make_shared<mg::nn::Linear>(widths[i], widths[i + 1], true, mg::TensorOptions(mg::DType::f32, dev)));
      if (i + 2 < widths.size()) model->push_back(std::make_shared<mg::nn::ReLU>());
    }
    auto opt = make_optimizer(model->parameters());
    const int64_t B = batch_or(64);
    mg::Tensor x = mg::randn({B, 784}, {mg::DType::f32, dev});
    mg::Tensor y = mg::randint(0, 10, {B}, {mg::DType::i64, dev});
    auto step = train_step(*opt, [&] { return mg::cross_entropy(model->forward(x), y); });
    print("mlp", "784-256-128-10 B=" + std::to_string(B) + tag, run(step, warmup, steps, dev), B, "images",
          model->num_parameters());
  }
  // The CNNs: ResNet-50, and MobileNet (v1, 224x224) only when named (not in "all").
  auto cnn = [&](const std::string& name, std::shared_ptr<mg::nn::Module> model) {
    model->train();
    if (channels_last) model->set_memory_format(mg::MemoryFormat::ChannelsLast);
    auto opt = make_optimizer(model->parameters());
    const int64_t B = batch_or(64);
    auto step_at = [&](int64_t b) {
      mg::Tensor x = mg::randn({b, 3, 224, 224}, {mg::DType::f32, dev});
      if (channels_last) x = x.contiguous(mg::MemoryFormat::ChannelsLast);
      mg::Tensor y = mg::randint(0, 1000, {b}, {mg::DType::i64, dev});
      return train_step(*opt, [model, x, y] { return mg::cross_entropy((*model)(x), y); });
    };
    if (max_batch_gib > 0) {
      print_max_batch(name.c_str(), "224x224" + tag, max_batch_gib, dev, [&](int64_t b) {
        step_at(b)();
        opt->zero_grad();
      });
    } else {
      auto step = step_at(B);
      print(name.c_str(), "B=" + std::to_string(B) + " 224x224" + tag, run(step, warmup, steps, dev), B, "images",
            model->num_parameters());
    }
  };
  if (which == "all" || which == "resnet50")
    cnn("resnet50", mg::nn::resnet50(1000, mg::TensorOptions(mg::DType::f32, dev)));
  if (which == "mobilenet")
    cnn("mobilenet", std::make_shared<mg::nn::MobileNet>(1000, 1.0, mg::TensorOptions(mg::DType::f32, dev)));
  if (which == "all" || which == "gpt2") {
    mg::cuda::empty_cache();
    const mg::nn::GPTConfig cfg = mg::nn::gpt_preset(gpt_size);  // --gpt; gpt2: 124M, vocab 50304, T=1024
    const std::string label = gpt_size == "gpt2" ? "gpt2-124M" : gpt_size;
    g_flops_per_sample = mg::nn::gpt_flops_per_token(cfg, seq);
    if (g_dtype != mg::DType::f32)
      g_peak_flops = mg::nn::dense_half_peak_flops(mg::cuda::get_device_properties(dev.index).name);
    const int64_t B = batch_or(8), T = seq;
    if (T > cfg.block_size) {
      std::fprintf(stderr, "bench_models: --seq %lld exceeds GPT-2's context of %lld\n", static_cast<long long>(T),
                   static_cast<long long>(cfg.block_size));
      return 2;
    }
    if (budget_gib > 0) return gpt_budget_run(cfg, label, tag, B, T, budget_gib, offload_blocks, warmup, steps, dev);
    // With --param-offload the model is built in host memory: its f32 form need never fit the device.
    auto model = std::make_shared<mg::nn::GPT>(
        cfg, mg::TensorOptions(mg::DType::f32, param_offload >= 0 ? mg::Device::cpu() : dev));
    model->train();
    if (resid_dropout > 0) {
      for (const auto& child : model->h->children()) {
        auto* block = static_cast<mg::nn::TransformerBlock*>(child.get());
        block->attn->resid_dropout->p = resid_dropout;
        block->mlp->dropout->p = resid_dropout;
      }
    }
    model->recompute.checkpoint_blocks = checkpoint;
    model->recompute.head_chunk_rows = head_chunk_rows;
    model->recompute.selective = selective || !selective_ops.empty();
    auto split = [](const std::string& list) {
      std::vector<std::string> out;
      for (size_t p = 0; p < list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        out.push_back(list.substr(p, q - p));
        p = q + 1;
      }
      return out;
    };
    model->recompute.selective_ops = split(selective_ops);
    model->recompute.keep_ops = split(keep_ops);
    if (offload_auto) {
      // The plan, and the model's prediction for every count, next to the measured rows.
      mg::memory::GPTOffloadPlan plan;
      {
        mg::Autocast ac(mg::DeviceType::CUDA, g_dtype == mg::DType::f32 ? mg::DType::f16 : g_dtype,
                        g_dtype != mg::DType::f32, g_cast_cache && g_rung_cast_cache);
        plan = mg::memory::plan_gpt_offload(*model, B, dev);
        std::string predicted;
        for (int64_t m = 0; m <= cfg.n_layer; ++m)
          predicted +=
              (m ? "," : "") + std::to_string(mg::memory::evaluate_offload(plan.profile, m, plan.link).exposed_ms());
        std::printf(
            "{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"B=%lld T=%lld%s offload plan\","
            "\"offload_blocks\":%lld,\"summary\":\"%s\",\"predicted_exposed_ms\":[%s]}\n",
            label.c_str(), static_cast<long long>(B), static_cast<long long>(T), tag.c_str(),
            static_cast<long long>(plan.plan.segments), plan.summary().c_str(), predicted.c_str());
        std::fflush(stdout);
      }
      offload_blocks = static_cast<int>(plan.plan.segments);
    }
    std::string variant = checkpoint ? " checkpoint" : "";
    if (!checkpoint && checkpoint_blocks > 0) {
      model->recompute.block_mask.assign(cfg.n_layer, false);
      // After the offloaded blocks (--offload-blocks): those keep their tensors, on the host.
      for (int i = offload_blocks; i < offload_blocks + checkpoint_blocks && i < cfg.n_layer; ++i)
        model->recompute.block_mask[i] = true;
      variant += " checkpoint " + std::to_string(checkpoint_blocks) + " blocks";
    }
    if (!keep_ops.empty()) variant += " keeping " + keep_ops;
    model->recompute.offload_blocks = offload_blocks;
    if (offload_blocks > 0 || offload_auto)
      variant += " offload " + std::to_string(offload_blocks) + " blocks" + (offload_auto ? " (planned)" : "");
    if (offload_prefetch_mib >= 0) {
      model->recompute.offload.prefetch_bytes = offload_prefetch_mib << 20;
      variant += " prefetch " + std::to_string(offload_prefetch_mib) + " MiB";
    }
    variant += std::string(selective && selective_ops.empty() ? " selective" : "") +
               (selective_ops.empty() ? "" : " selective " + selective_ops) + (logits ? " logits" : "");
    if (head_chunk_rows > 0) variant += " head chunk " + std::to_string(head_chunk_rows);
    if (in_backward) variant += " step in backward";
    if (host_params && host_param_blocks == -2) {
      host_param_blocks = static_cast<int>(
          plan_host_blocks(*model, cfg, B, T, in_backward, host_param_ratio, host_casts_on_use, label));
      variant += " host params " + std::to_string(host_param_blocks) + " blocks (planned)";
    } else if (host_params && host_param_blocks >= 0) {
      variant += " host params " + std::to_string(host_param_blocks) + " blocks";
    } else if (host_params) {
      variant += " host params";
    }
    if (host_params && host_param_blocks != 0) {
      // The same optimizer, built a second time over the host parameters: the host's loop steps
      // those, the device's kernel the rest.
      const int64_t first = host_param_blocks < 0 ? 0 : std::max<int64_t>(0, cfg.n_layer - host_param_blocks);
      g_host_params =
          std::make_unique<mg::memory::HostParams>(mg::memory::gpt_linear_params(*model, first), dev,
                                                   [](std::vector<mg::Tensor> ps) { return make_optimizer(ps); });
      g_host_params->set_casts_on_first_use(host_casts_on_use);
      g_host_params->provide_casts();
      if (host_casts_on_use) variant += " casts on use";
    }
    if (param_offload >= 0) {
      g_param_offload = mg::memory::offload_gpt_params(
          *model, dev, [](std::vector<mg::Tensor> ps) { return make_optimizer(ps); }, param_offload);
      g_host_params.reset();
      variant += " param offload prefetch " + std::to_string(param_offload);
    }
    auto opt = make_optimizer(g_host_params        ? g_host_params->others(model->parameters())
                              : param_offload >= 0 ? std::vector<mg::Tensor>{}
                                                   : model->parameters());
    std::unique_ptr<mg::optim::StepInBackward> sib;
    if (in_backward) {
      sib = std::make_unique<mg::optim::StepInBackward>(*opt);
      sib->set_enabled(in_backward);
    }
    auto step_at = [&](int64_t b) {
      mg::Tensor idx = mg::randint(0, cfg.vocab_size, {b, T}, {mg::DType::i64, dev});
      mg::Tensor tgt = mg::randint(0, cfg.vocab_size, {b, T}, {mg::DType::i64, dev});
      return train_step(
          *opt,
          [model, idx, tgt, logits] {
            return logits ? mg::nn::GPT::loss((*model)(idx), tgt) : model->forward_loss(idx, tgt);
          },
          sib.get());
    };
    if (max_batch_gib > 0) {
      print_max_batch(label.c_str(), "T=" + std::to_string(T) + tag + variant, max_batch_gib, dev, [&](int64_t b) {
        try {
          step_at(b)();
        } catch (const mg::OutOfMemoryError&) {
          if (sib) sib->abandon();
          throw;
        }
        opt->zero_grad();
      });
      return 0;
    }
    auto step = step_at(B);
    // The host optimizer's first step creates its state (the moments' first touch): the host
    // stats count the steps after it.
    if (mg::memory::HostParams* host = host_side()) {
      step();
      host->reset_stats();
    }
    print(label.c_str(), "B=" + std::to_string(B) + " T=" + std::to_string(T) + tag + variant,
          run(step, warmup, steps, dev), B * T, "tokens", model->num_parameters());
    if (g_host_params) print_host_params(*g_host_params);
    if (g_param_offload.source) {
      print_host_params(g_param_offload.source->host());
      const mg::ParamUnits::Stats us = g_param_offload.units->stats();
      std::printf(
          "{\"param_units\":%zu,\"gathers\":%lld,\"peak_gathered_units\":%lld,\"peak_gathered_gib\":%.3f,"
          "\"fetch_wait_ms_total\":%.1f}\n",
          g_param_offload.units->size(), static_cast<long long>(us.gathers),
          static_cast<long long>(us.peak_gathered_units), us.peak_gathered_bytes / 1073741824.0, us.wait_ms);
    }
  }
  // Before main() returns: the host parameters' last casts go back while CUDA is still up.
  g_host_params.reset();
  g_param_offload = {};
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const mg::OutOfMemoryError& e) {  // e.g. under --memory-cap: say so as the result line
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '"' || c == '\\' || c == '\n') c = ' ';
    std::printf("{\"framework\":\"memgrad\",\"oom\":true,\"error\":\"%s\"}\n", msg.c_str());
    return 4;
  }
}
