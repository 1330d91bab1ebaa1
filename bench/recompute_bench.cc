// Activation recomputation, measured: peak memory and step time of a GPT-2-shaped model and
// of an MLP with no checkpointing, per-block checkpointing, selective recomputation (norms,
// GELU, dropout rebuilt), both, Chen's sqrt(n) and the planner at a budget; ratios are
// against "none" in the same run. bench/pytorch/recompute_step.py runs the same GPT configs.
//   CUDA (default there): GPT-2 small (12 layers, d=768, 12 heads, T=1024, B=8), MLP 16 x
//   (Linear 4096 -> GELU), B=8192. CPU (no device, or --cpu): small sizes, same code.
//   --dtype f32|bf16        bf16: forward and loss under mg::Autocast (f32 master weights)
//   --model gpt|mlp|all     --steps N --warmup N
//   --budget F              the planner's activation budget as a fraction of "none"'s (0.6)
//   --section inplace       only the "x1, x2, x3 vs reusing x" measurement
// Each configuration prints one JSON line; the planner also prints its table.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/recompute.h"
#include "bench/flag_value.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "nn/linear.h"
#include "nn/models/gpt.h"
#include "memory/planner.h"
#include "optim/sgd.h"

namespace {

using mg::Tensor;

struct Options {
  bool cuda = false;
  mg::DType dtype = mg::DType::f32;
  std::string dtype_name = "f32";
  int warmup = 2, steps = 5;
  double budget = 0.6;
};

struct Result {
  double step_ms = 0, min_ms = 0, max_ms = 0;
  int64_t peak = 0;
  int n_runs = 0;
};

void sync(const Options& o) {
  if (o.cuda) mg::cuda::synchronize();
}

// Median step time and peak allocated bytes of `step` (peak over the timed steps).
Result measure(const Options& o, mg::Device dev, const std::function<void()>& step) {
  for (int i = 0; i < o.warmup; ++i) step();
  sync(o);
  mg::reset_peak_memory_stats(dev);
  std::vector<double> ms;
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    sync(o);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back(), mg::max_memory_allocated(dev), static_cast<int>(ms.size())};
}

void print(const char* model, const std::string& config, const std::string& mode, const Result& r, const Result& base) {
  std::printf(
      "{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"%s\",\"mode\":\"%s\",\"step_ms\":%.2f,"
      "\"step_ms_min\":%.2f,\"step_ms_max\":%.2f,\"n_runs\":%d,\"peak_allocated_gib\":%.3f,\"time_vs_none\":%.3f,"
      "\"peak_vs_none\":%.3f}\n",
      model, config.c_str(), mode.c_str(), r.step_ms, r.min_ms, r.max_ms, r.n_runs, r.peak / 1073741824.0,
      r.step_ms / base.step_ms, static_cast<double>(r.peak) / static_cast<double>(base.peak));
  std::fflush(stdout);
}

// Autocast to --dtype for a scope; a disabled guard for f32.
struct AutocastScope {
  explicit AutocastScope(const Options& o)
      : ac(o.cuda ? mg::DeviceType::CUDA : mg::DeviceType::CPU, mg::DType::bf16, o.dtype != mg::DType::f32) {}
  mg::Autocast ac;
};

// The planner over a chain of blocks: profile at the batch, plan for budget x "none".
mg::memory::CheckpointPlan plan_blocks(const Options& o, const std::vector<mg::memory::SegmentFn>& blocks,
                                       const Tensor& h, const char* what) {
  std::vector<std::string> names;
  for (size_t i = 0; i < blocks.size(); ++i) names.push_back("block " + std::to_string(i));
  std::vector<mg::memory::SegmentProfile> prof;
  {
    AutocastScope ac(o);
    prof = mg::memory::profile_segments(blocks, h, names);
  }
  const mg::memory::CheckpointPlan none = mg::memory::plan_none(prof);
  const auto budget = static_cast<int64_t>(o.budget * static_cast<double>(none.plain_bytes));
  mg::memory::CheckpointPlan plan = mg::memory::plan_for_budget(prof, budget);
  std::printf("%s: planner at %.0f%% of the blocks' activations (%s)\n%s%s\n", what, 100 * o.budget,
              mg::format_bytes(budget).c_str(), plan.table(prof).c_str(),
              mg::memory::plan_sqrt_n(prof).table(prof).c_str());
  return plan;
}

void bench_gpt(const Options& o, mg::Device dev) {
  mg::nn::GPTConfig cfg;
  int64_t B = 8, T = 1024;
  if (!o.cuda) {  // small enough for a CPU run
    cfg.vocab_size = 512;
    cfg.block_size = 128;
    cfg.n_layer = 6;
    cfg.n_head = 4;
    cfg.n_embd = 128;
    B = 4;
    T = 128;
  }
  mg::manual_seed(0);
  auto model = std::make_shared<mg::nn::GPT>(cfg, mg::TensorOptions(mg::DType::f32, dev));
  model->train();
  mg::optim::SGD opt(model->parameters(), mg::optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
  Tensor idx = mg::randint(0, cfg.vocab_size, {B, T}, {mg::DType::i64, dev});
  Tensor tgt = mg::randint(0, cfg.vocab_size, {B, T}, {mg::DType::i64, dev});
  auto step = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastScope ac(o);
      loss = mg::nn::GPT::loss((*model)(idx), tgt);
    }
    loss.backward();
    opt.step();
  };
  const std::string config = "L=" + std::to_string(cfg.n_layer) + " d=" + std::to_string(cfg.n_embd) +
                             " H=" + std::to_string(cfg.n_head) + " B=" + std::to_string(B) +
                             " T=" + std::to_string(T) + " " + o.dtype_name + " SGD(momentum)";
  mg::nn::GPTRecompute none;
  model->recompute = none;
  const Result base = measure(o, dev, step);
  print("gpt2", config, "none", base, base);

  auto run = [&](const std::string& mode, mg::nn::GPTRecompute r) {
    model->recompute = std::move(r);
    if (o.cuda) mg::cuda::empty_cache();
    print("gpt2", config, mode, measure(o, dev, step), base);
  };
  mg::nn::GPTRecompute per_block;
  per_block.checkpoint_blocks = true;
  run("per-block", per_block);
  mg::nn::GPTRecompute selective;
  selective.selective = true;
  run("selective", selective);
  mg::nn::GPTRecompute both = per_block;
  both.selective = true;
  run("per-block+selective", both);

  // The planner works on the blocks over a hidden state of the real shape.
  model->recompute = none;
  std::vector<mg::memory::SegmentFn> blocks;
  for (const auto& b : model->h->children()) {
    mg::nn::Module* m = b.get();
    blocks.push_back([m](const Tensor& x) { return (*m)(x); });
  }
  Tensor h = mg::randn({B, T, cfg.n_embd}, {mg::DType::f32, dev});
  h.requires_grad_(true);
  mg::memory::CheckpointPlan plan = plan_blocks(o, blocks, h, "gpt2");
  h = Tensor();
  mg::nn::GPTRecompute planned;
  planned.block_mask = plan.segment_mask();
  run("planner@" + std::to_string(static_cast<int>(std::lround(100 * o.budget))) + "%", planned);
  mg::nn::GPTRecompute planned_sel = planned;
  planned_sel.selective = true;
  run("planner+selective", planned_sel);
}

void bench_mlp(const Options& o, mg::Device dev) {
  const int64_t layers = o.cuda ? 16 : 8, d = o.cuda ? 4096 : 512, B = o.cuda ? 8192 : 2048;
  mg::manual_seed(0);
  std::vector<std::shared_ptr<mg::nn::Linear>> lin;
  std::vector<Tensor> params;
  for (int64_t i = 0; i < layers; ++i) {
    lin.push_back(std::make_shared<mg::nn::Linear>(d, d, true, mg::TensorOptions(mg::DType::f32, dev)));
    for (const Tensor& p : lin.back()->parameters()) params.push_back(p);
  }
  std::vector<mg::memory::SegmentFn> blocks;
  for (auto& l : lin) {
    mg::nn::Linear* m = l.get();
    blocks.push_back([m](const Tensor& x) { return mg::gelu((*m)(x), true); });
  }
  mg::optim::SGDOptions so;
  so.lr = 0.01;
  so.momentum = 0.9;
  mg::optim::SGD opt(params, so);
  Tensor x = mg::randn({B, d}, {mg::DType::f32, dev});
  std::vector<int64_t> bounds;
  std::vector<bool> flags;
  bool selective = false;
  auto step = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastScope ac(o);
      std::optional<mg::SelectiveRecompute> sel;
      if (selective) sel.emplace(mg::RecomputePolicy::cheap_ops());
      loss = mg::mean(mg::square(mg::checkpoint_segments(blocks, bounds, flags, x)));
    }
    loss.backward();
    opt.step();
  };
  const std::string config = std::to_string(layers) + "x(Linear " + std::to_string(d) +
                             " + GELU) B=" + std::to_string(B) + " " + o.dtype_name + " SGD(momentum)";
  auto set_plan = [&](const mg::memory::CheckpointPlan& p, bool sel) {
    bounds = p.bounds;
    flags = p.checkpointed;
    selective = sel;
    if (o.cuda) mg::cuda::empty_cache();
  };
  std::vector<mg::memory::SegmentProfile> flat(blocks.size());  // structure only, for the fixed plans
  set_plan(mg::memory::plan_none(flat), false);
  const Result base = measure(o, dev, step);
  print("mlp", config, "none", base, base);
  set_plan(mg::memory::plan_every_segment(flat), false);
  print("mlp", config, "per-block", measure(o, dev, step), base);
  set_plan(mg::memory::plan_none(flat), true);
  print("mlp", config, "selective", measure(o, dev, step), base);
  set_plan(mg::memory::plan_sqrt_n(flat), false);
  print("mlp", config, "sqrt(n)", measure(o, dev, step), base);
  Tensor h = x.detach();
  mg::memory::CheckpointPlan plan = plan_blocks(o, blocks, h, "mlp");
  set_plan(plan, false);
  print("mlp", config, "planner@" + std::to_string(static_cast<int>(std::lround(100 * o.budget))) + "%",
        measure(o, dev, step), base);
}

// The seeds' example: naming every intermediate (x1, x2, x3) vs reusing one name, under
// no_grad and with a graph. Reports the peak and what is still live at the end.
void bench_inplace(const Options& o, mg::Device dev) {
  const int64_t n = o.cuda ? (int64_t{256} << 20) : (int64_t{16} << 20);  // elements (f32)
  Tensor w = mg::randn({n}, {mg::DType::f32, dev});
  w.requires_grad_(true);
  const double mb = static_cast<double>(n) * 4 / (1 << 20);
  for (bool grad : {false, true}) {
    for (bool reuse : {false, true}) {
      mg::EnableGradGuard g(grad);
      sync(o);
      const int64_t base = mg::memory_allocated(dev);
      mg::reset_peak_memory_stats(dev);
      int64_t live = 0;
      {
        Tensor keep;
        if (reuse) {
          Tensor x = mg::mul(w, 2.0);
          x = mg::relu(x);
          x = mg::exp(x);
          x = mg::add(x, 1.0);
          keep = x;
        } else {
          Tensor x1 = mg::mul(w, 2.0);
          Tensor x2 = mg::relu(x1);
          Tensor x3 = mg::exp(x2);
          Tensor x4 = mg::add(x3, 1.0);
          keep = x4;
          sync(o);
          live = mg::memory_allocated(dev) - base;  // measured while the names are in scope
        }
        sync(o);
        if (reuse) live = mg::memory_allocated(dev) - base;
      }
      const int64_t peak = mg::max_memory_allocated(dev) - base;
      std::printf(
          "{\"framework\":\"memgrad\",\"section\":\"inplace\",\"grad\":%s,\"style\":\"%s\",\"tensor_mib\":%.0f,"
          "\"live_mib\":%.0f,\"peak_mib\":%.0f}\n",
          grad ? "true" : "false", reuse ? "x = f(x)" : "x1, x2, x3", mb, live / 1048576.0, peak / 1048576.0);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string model = "all", section = "recompute";
  bool force_cpu = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return mg::bench::flag_value("bench_recompute", argc, argv, i); };
    if (a == "--cpu")
      force_cpu = true;
    else if (a == "--dtype")
      o.dtype_name = next();
    else if (a == "--model")
      model = next();
    else if (a == "--steps")
      o.steps = std::atoi(next().c_str());
    else if (a == "--warmup")
      o.warmup = std::atoi(next().c_str());
    else if (a == "--budget")
      o.budget = std::atof(next().c_str());
    else if (a == "--section")
      section = next();
    else {
      std::fprintf(stderr, "bench_recompute: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.dtype_name == "bf16")
    o.dtype = mg::DType::bf16;
  else if (o.dtype_name != "f32") {
    std::fprintf(stderr, "bench_recompute: --dtype must be f32 or bf16, got %s\n", o.dtype_name.c_str());
    return 2;
  }
  if (o.steps < 1 || o.budget <= 0) {
    std::fprintf(stderr, "bench_recompute: --steps must be >= 1 and --budget > 0\n");
    return 2;
  }
  o.cuda = !force_cpu && mg::cuda::is_available();
  const mg::Device dev = o.cuda ? mg::Device::cuda(0) : mg::Device::cpu();
  std::printf("# bench_recompute on %s\n", o.cuda ? mg::cuda::get_device_properties(0).name.c_str() : "CPU");
  if (section == "inplace") {
    bench_inplace(o, dev);
    return 0;
  }
  if (model == "all" || model == "gpt") bench_gpt(o, dev);
  if (model == "all" || model == "mlp") bench_mlp(o, dev);
  if (model == "all") bench_inplace(o, dev);
  return 0;
}
