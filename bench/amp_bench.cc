// Mixed-precision training steps, f32 vs f16 autocast + GradScaler vs bf16 autocast, on the
// device: step time and peak memory of each, as ratios to f32 measured in the same run.
// Compare with bench/pytorch/amp_step.py (torch.autocast + GradScaler, eager) on the same card.
//   bench_amp [--model mlp|mlp-wide|resnet50|gpt2|all] [--steps N] [--warmup N] [--cuda-graph]
// --cuda-graph: the whole step captured (mg::CapturedStep) after --warmup eager steps and timed
// as replays, with a capturable SGD and GradScaler (scale, overflow skip and lr on the device).
// Pure bf16 has no fused update to capture and is left out there.
// Models: the main job's MLP (784-256-128-10, B=64), a wide MLP (784-4096-4096-4096-10,
// B=1024: GEMM-bound, where tensor cores show), ResNet-50 (B=64, 3x224x224, 1000 classes)
// and GPT-2 124M (B=8, T=1024). Each step: zero_grad, forward + loss under autocast,
// scaler.scale(loss).backward(), scaler.step(SGD momentum 0.9), scaler.update().
// A fourth run, "pure bf16", stores the model in bf16 (Module::to) and trains it under bf16
// autocast with f32 momentum and stochastic rounding (optim/bf16_update.h): no f32 master
// weights, the smallest footprint.
// One JSON line per (model, precision); step_ms is the median over --steps (n_runs), with
// step_ms_min / step_ms_max.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/step_timer.h"
#include "core/autocast.h"
#include "memgrad.h"
#include "nn/models/gpt.h"
#include "nn/models/resnet.h"
#include "optim/grad_scaler.h"

namespace {

using mg::DType;

// A model's forward + loss on fixed inputs, built fresh (same seed) for each precision.
struct Workload {
  std::shared_ptr<mg::nn::Module> model;
  std::function<mg::Tensor()> loss;
};
using Factory = std::function<Workload(mg::Device)>;

struct Timing {
  double ms = 0, min_ms = 0, max_ms = 0;
  int n_runs = 0;
  double peak_gib = 0, reserved_gib = 0;
};

Timing run(const Factory& make, DType precision, bool pure_bf16, int warmup, int steps, mg::Device dev, bool graph) {
  mg::manual_seed(0);
  Workload w = make(dev);
  if (pure_bf16) w.model->to(DType::bf16);
  w.model->train();
  mg::optim::SGD opt(w.model->parameters(), mg::optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .capturable = graph});
  const bool amp = precision != DType::f32;
  mg::optim::GradScaler scaler({.enabled = precision == DType::f16, .capturable = graph});
  auto step = [&] {
    opt.zero_grad();
    mg::Tensor loss;
    {
      mg::Autocast ac(mg::DeviceType::CUDA, amp ? precision : DType::f16, amp);
      loss = w.loss();
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  std::vector<double> ms;
  if (graph) {
    mg::CapturedStep captured(step, std::max(1, warmup));
    ms = mg::bench::time_steps([&] { captured.replay(); }, 2, steps, dev);
  } else {
    ms = mg::bench::time_steps(step, warmup, steps, dev);
  }
  return Timing{ms[ms.size() / 2],
                ms.front(),
                ms.back(),
                static_cast<int>(ms.size()),
                mg::max_memory_allocated(dev) / 1073741824.0,
                mg::max_memory_reserved(dev) / 1073741824.0};
}

Factory mlp(std::vector<int64_t> widths, int64_t batch) {
  return [=](mg::Device d) {
    const mg::TensorOptions o(DType::f32, d);
    auto m = std::make_shared<mg::nn::Sequential>();
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      m->push_back(std::make_shared<mg::nn::Linear>(widths[i], widths[i + 1], true, o));
      if (i + 2 < widths.size()) m->push_back(std::make_shared<mg::nn::ReLU>(true));
    }
    mg::Tensor x = mg::randn({batch, widths.front()}, o);
    mg::Tensor y = mg::randint(0, widths.back(), {batch}, {DType::i64, d});
    return Workload{m, [m, x, y] { return mg::cross_entropy((*m)(x), y); }};
  };
}

Workload resnet50(mg::Device d) {
  auto m = mg::nn::resnet50(1000, mg::TensorOptions(DType::f32, d));
  mg::Tensor x = mg::randn({64, 3, 224, 224}, {DType::f32, d});
  mg::Tensor y = mg::randint(0, 1000, {64}, {DType::i64, d});
  return Workload{m, [m, x, y] { return mg::cross_entropy((*m)(x), y); }};
}

Workload gpt2(mg::Device d) {
  mg::nn::GPTConfig cfg;  // 124M, vocab 50304, T = 1024
  auto m = std::make_shared<mg::nn::GPT>(cfg, mg::TensorOptions(DType::f32, d));
  mg::Tensor idx = mg::randint(0, cfg.vocab_size, {8, 1024}, {DType::i64, d});
  mg::Tensor tgt = mg::randint(0, cfg.vocab_size, {8, 1024}, {DType::i64, d});
  return Workload{m, [m, idx, tgt] { return mg::nn::GPT::loss((*m)(idx), tgt); }};
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  int warmup = 3, steps = 10;
  bool graph = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cuda-graph")) {
      graph = true;
      continue;
    }
    if (i + 1 >= argc) break;
    if (!std::strcmp(argv[i], "--model"))
      which = argv[++i];
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--warmup"))
      warmup = std::atoi(argv[++i]);
  }
  if (!mg::cuda::is_available()) {
    std::fprintf(stderr, "bench_amp: no CUDA device; nothing to measure\n");
    return 0;
  }
  const mg::Device dev = mg::Device::cuda(0);
  const std::vector<std::pair<std::string, std::pair<std::string, Factory>>> models = {
      {"mlp", {"784-256-128-10 B=64", mlp({784, 256, 128, 10}, 64)}},
      {"mlp-wide", {"784-4096x3-10 B=1024", mlp({784, 4096, 4096, 4096, 10}, 1024)}},
      {"resnet50", {"B=64 224x224", resnet50}},
      {"gpt2", {"B=8 T=1024", gpt2}},
  };
  for (const auto& [name, cfg] : models) {
    if (which != "all" && which != name) continue;
    Timing base;
    for (int mode = 0; mode < 4; ++mode) {
      const DType p = mode == 0 ? DType::f32 : mode == 1 ? DType::f16 : DType::bf16;
      const bool pure = mode == 3;
      if (pure && graph) continue;
      mg::cuda::empty_cache();
      const Timing t = run(cfg.second, p, pure, warmup, steps, dev, graph);
      if (mode == 0) base = t;
      std::printf(
          "{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"%s\",\"precision\":\"%s\",\"cuda_graph\":%s,"
          "\"step_ms\":%.2f,\"step_ms_min\":%.2f,\"step_ms_max\":%.2f,\"n_runs\":%d,\"peak_allocated_gib\":%.3f,"
          "\"peak_reserved_gib\":%.3f,\"speedup_vs_f32\":%.2f,\"memory_vs_f32\":%.2f}\n",
          name.c_str(), cfg.first.c_str(),
          pure              ? "pure bf16 (f32 momentum, stochastic rounding)"
          : p == DType::f32 ? "f32"
          : p == DType::f16 ? "f16 autocast+GradScaler"
                            : "bf16 autocast",
          graph ? "true" : "false", t.ms, t.min_ms, t.max_ms, t.n_runs, t.peak_gib, t.reserved_gib, base.ms / t.ms,
          t.peak_gib / base.peak_gib);
      std::fflush(stdout);
    }
  }
  return 0;
}
