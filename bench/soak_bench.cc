// Long-run memory soak on the device: GPT-2 small trained for --steps steps under bf16 autocast
// with fused AdamW, the batch shape drawn afresh each step (B in {1, 2, 4, 8}, T in
// {128, 256, 512, 768, 1024}), then OOM-and-continue under a per-process memory cap.
//
// What it checks, step by step:
//  - allocated memory after every step (gradients set to none) equals the baseline taken after
//    the first step, to the byte: a step leaks nothing, whatever its shape;
//  - reserved memory stops growing once every shape has been seen (the warm-up): the cache
//    serves the mix from what it already holds;
//  - under a cap (--cap-gib), a batch that does not fit raises mg::OutOfMemoryError, the loop
//    halves the batch and trains on; after every failed attempt allocated memory is back at the
//    baseline (the half-built graph, activations and gradients were all released).
// Prints one JSON line per phase and exits 1 when a check fails.
//   --steps N (2000)  --warmup N (steps that may grow the cache; 200)  --cap-gib G (12)
//   --vocab V (50304)  --seed S (0)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "memgrad.h"
#include "nn/models/gpt.h"

namespace {

constexpr double kGiB = 1073741824.0;

struct Trainer {
  mg::Device dev;
  std::shared_ptr<mg::nn::GPT> model;
  std::unique_ptr<mg::optim::AdamW> opt;
  int64_t vocab;

  Trainer(const mg::nn::GPTConfig& cfg, mg::Device d) : dev(d), vocab(cfg.vocab_size) {
    model = std::make_shared<mg::nn::GPT>(cfg, mg::TensorOptions(mg::DType::f32, dev));
    model->train();
    mg::optim::AdamWOptions o;
    o.lr = 3e-4;
    opt = std::make_unique<mg::optim::AdamW>(model->parameters(), o);
  }

  // One training step at [B, T]; gradients are set to none afterwards, so what stays
  // allocated is parameters and optimizer state.
  double step(int64_t B, int64_t T) {
    mg::Tensor idx = mg::randint(0, vocab, {B, T}, {mg::DType::i64, dev});
    mg::Tensor tgt = mg::randint(0, vocab, {B, T}, {mg::DType::i64, dev});
    mg::Tensor loss;
    {
      mg::Autocast ac(mg::DeviceType::CUDA, mg::DType::bf16);
      loss = mg::nn::GPT::loss((*model)(idx), tgt);
    }
    loss.backward();
    opt->step();
    opt->zero_grad(/*set_to_none=*/true);
    return loss.item<float>();
  }
};

int64_t arg(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name)) return std::atoll(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  if (!mg::cuda::is_available()) {
    std::fprintf(stderr, "bench_soak: no CUDA device; nothing to measure\n");
    return 0;
  }
  const int64_t steps = arg(argc, argv, "--steps", 2000), warmup = arg(argc, argv, "--warmup", 200);
  const int64_t cap_gib = arg(argc, argv, "--cap-gib", 12);
  mg::nn::GPTConfig cfg;  // 124M
  cfg.vocab_size = arg(argc, argv, "--vocab", 50304);
  const mg::Device dev = mg::Device::cuda(0);
  mg::manual_seed(static_cast<uint64_t>(arg(argc, argv, "--seed", 0)));
  bool ok = true;

  // ---- soak: varying shapes, allocated back to the baseline after every step ----
  Trainer tr(cfg, dev);
  std::mt19937_64 rng(1234);
  const int64_t Bs[] = {1, 2, 4, 8}, Ts[] = {128, 256, 512, 768, 1024};
  tr.step(1, 128);  // creates the optimizer state: the baseline includes it
  mg::cuda::synchronize();
  const int64_t baseline = mg::memory_allocated(dev);
  int64_t off_baseline = 0, worst_delta = 0, reserved_at_warmup = 0, reserved_growth_after = 0;
  std::vector<double> ms;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t B = Bs[rng() % 4], T = Ts[rng() % 5];
    const auto a = std::chrono::steady_clock::now();
    tr.step(B, T);
    mg::cuda::synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    const int64_t alloc = mg::memory_allocated(dev), reserved = mg::memory_reserved(dev);
    if (alloc != baseline) {
      ++off_baseline;
      worst_delta = std::max<int64_t>(worst_delta, std::llabs(alloc - baseline));
    }
    if (s + 1 == warmup) reserved_at_warmup = reserved;
    if (s + 1 > warmup) reserved_growth_after = std::max(reserved_growth_after, reserved - reserved_at_warmup);
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(ms.begin(), ms.end());
  const bool soak_ok = off_baseline == 0 && reserved_growth_after <= 0;
  ok &= soak_ok;
  std::printf(
      "{\"phase\":\"soak\",\"model\":\"gpt2-124M bf16 autocast, fused AdamW\",\"steps\":%lld,\"warmup\":%lld,"
      "\"wall_s\":%.1f,\"step_ms_median\":%.2f,\"step_ms_p99\":%.2f,\"baseline_allocated_gib\":%.4f,"
      "\"steps_off_baseline\":%lld,\"worst_delta_bytes\":%lld,\"reserved_at_warmup_gib\":%.3f,"
      "\"reserved_final_gib\":%.3f,\"reserved_growth_after_warmup_bytes\":%lld,\"peak_allocated_gib\":%.3f,"
      "\"ok\":%s}\n",
      static_cast<long long>(steps), static_cast<long long>(warmup), wall_s, ms[ms.size() / 2],
      ms[std::min(ms.size() - 1, ms.size() * 99 / 100)], baseline / kGiB, static_cast<long long>(off_baseline),
      static_cast<long long>(worst_delta), reserved_at_warmup / kGiB, mg::memory_reserved(dev) / kGiB,
      static_cast<long long>(reserved_growth_after), mg::max_memory_allocated(dev) / kGiB, soak_ok ? "true" : "false");
  std::fflush(stdout);

  // ---- OOM and continue: start too big under a cap, halve on OutOfMemoryError ----
  mg::cuda::set_per_process_memory_limit(cap_gib * (1LL << 30), 0);
  int64_t B = 64, leaked_after_oom = 0, trained = 0;
  std::vector<long long> tried;
  while (B >= 1 && trained < 20) {
    try {
      tr.step(B, 1024);
      ++trained;
    } catch (const mg::OutOfMemoryError&) {
      tried.push_back(B);
      tr.opt->zero_grad(true);
      mg::cuda::synchronize();
      if (mg::memory_allocated(dev) != baseline) ++leaked_after_oom;
      B /= 2;
    }
  }
  mg::cuda::synchronize();
  const int64_t alloc_end = mg::memory_allocated(dev);
  const bool oom_ok = !tried.empty() && trained == 20 && leaked_after_oom == 0 && alloc_end == baseline &&
                      mg::memory_reserved(dev) <= cap_gib * (1LL << 30);
  ok &= oom_ok;
  std::string t;
  for (long long b : tried) t += (t.empty() ? "" : ",") + std::to_string(b);
  std::printf(
      "{\"phase\":\"oom_and_continue\",\"cap_gib\":%lld,\"oom_at_batches\":[%s],\"trained_batch\":%lld,"
      "\"steps_trained\":%lld,\"attempts_that_leaked\":%lld,\"allocated_end_minus_baseline\":%lld,"
      "\"reserved_gib\":%.3f,\"ok\":%s}\n",
      static_cast<long long>(cap_gib), t.c_str(), static_cast<long long>(B), static_cast<long long>(trained),
      static_cast<long long>(leaked_after_oom), static_cast<long long>(alloc_end - baseline),
      mg::memory_reserved(dev) / kGiB, oom_ok ? "true" : "false");
  return ok ? 0 : 1;
}
