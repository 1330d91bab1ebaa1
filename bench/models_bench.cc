// Training-step time and peak memory of whole models on the device, for side-by-side
// comparison with bench/pytorch/models_step.py on the same card and configs:
//   ResNet-50, B=64, 3x224x224, f32;  GPT-2 124M, B=8, T=1024, f32.
// Each step: zero_grad, forward, loss, backward, SGD(momentum 0.9) step. Prints one JSON
// line per model (median step ms over --steps after --warmup, peak allocated/reserved).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "memgrad.h"
#include "nn/models/gpt.h"
#include "nn/models/resnet.h"

namespace {

struct Result {
  double median_ms = 0;
  int64_t peak_alloc = 0, peak_reserved = 0;
};

template <class StepFn>
Result measure(StepFn&& step, int warmup, int steps, mg::Device dev) {
  for (int i = 0; i < warmup; ++i) step();
  mg::cuda::synchronize();
  mg::reset_peak_memory_stats(dev);
  std::vector<double> ms;
  mg::cuda::Stream s = mg::cuda::Stream::current(0);
  for (int i = 0; i < steps; ++i) {
    mg::cuda::Event a(true), b(true);
    a.record(s);
    step();
    b.record(s);
    b.synchronize();
    ms.push_back(a.elapsed_ms(b));
  }
  std::sort(ms.begin(), ms.end());
  Result r;
  r.median_ms = ms[ms.size() / 2];
  r.peak_alloc = mg::max_memory_allocated(dev);
  r.peak_reserved = mg::max_memory_reserved(dev);
  return r;
}

void print(const char* model, const char* config, const Result& r) {
  std::printf("{\"framework\":\"memgrad\",\"model\":\"%s\",\"config\":\"%s\",\"step_ms\":%.2f,"
              "\"peak_allocated_gib\":%.3f,\"peak_reserved_gib\":%.3f}\n",
              model, config, r.median_ms, r.peak_alloc / 1073741824.0, r.peak_reserved / 1073741824.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  int warmup = 3, steps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) which = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
  }
  if (!mg::cuda::is_available()) {
    std::fprintf(stderr, "bench_models: no CUDA device; nothing to measure\n");
    return 0;
  }
  const mg::Device dev = mg::Device::cuda(0);
  mg::manual_seed(0);
  if (which == "all" || which == "resnet50") {
    auto model = mg::nn::resnet50(1000, mg::TensorOptions(mg::DType::f32, dev));
    model->train();
    mg::optim::SGDOptions o;
    o.lr = 0.01;
    o.momentum = 0.9;
    mg::optim::SGD opt(model->parameters(), o);
    mg::Tensor x = mg::randn({64, 3, 224, 224}, {mg::DType::f32, dev});
    mg::Tensor y = mg::randint(0, 1000, {64}, {mg::DType::i64, dev});
    auto step = [&] {
      opt.zero_grad();
      mg::Tensor loss = mg::cross_entropy((*model)(x), y);
      loss.backward();
      opt.step();
    };
    print("resnet50", "B=64 224x224 f32", measure(step, warmup, steps, dev));
  }
  if (which == "all" || which == "gpt2") {
    mg::cuda::empty_cache();
    mg::nn::GPTConfig cfg;  // 124M, vocab 50304, T=1024
    auto model = std::make_shared<mg::nn::GPT>(cfg, mg::TensorOptions(mg::DType::f32, dev));
    model->train();
    mg::optim::SGDOptions o;
    o.lr = 0.01;
    o.momentum = 0.9;
    mg::optim::SGD opt(model->parameters(), o);
    mg::Tensor idx = mg::randint(0, cfg.vocab_size, {8, 1024}, {mg::DType::i64, dev});
    mg::Tensor tgt = mg::randint(0, cfg.vocab_size, {8, 1024}, {mg::DType::i64, dev});
    auto step = [&] {
      opt.zero_grad();
      mg::Tensor loss = mg::nn::GPT::loss((*model)(idx), tgt);
      loss.backward();
      opt.step();
    };
    print("gpt2-124M", "B=8 T=1024 f32", measure(step, warmup, steps, dev));
  }
  return 0;
}
