// Optimizer step time: Adam/AdamW/SGD fused multi-tensor updates vs the per-parameter path
// (one kernel per op per parameter, PyTorch's foreach=False), timed in the same run and
// reported as a ratio; on CUDA when there is a device, and on the CPU at small sizes.
//
//   bench_optim [--steps N] [--cpu-only] [--benchmark_out=FILE]   last stdout line: JSON
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device_runtime.h"
#include "core/random.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace {

using Clock = std::chrono::steady_clock;

// A transformer-like parameter list: `layers` blocks of 4 matrices (d x d, 4d x d, d x 4d,
// 3d x d) and 5 vectors, so most tensors are small and a few are large, like GPT-2's.
std::vector<mg::Tensor> make_params(int layers, int64_t d, mg::Device dev) {
  std::vector<mg::Tensor> ps;
  mg::manual_seed(0);
  for (int l = 0; l < layers; ++l)
    for (mg::Shape s :
         std::vector<mg::Shape>{{d, d}, {4 * d, d}, {d, 4 * d}, {3 * d, d}, {d}, {d}, {4 * d}, {d}, {3 * d}}) {
      mg::Tensor p = mg::nn::parameter(mg::randn(s, {mg::DType::f32, dev}));
      p.set_grad(mg::randn(s, {mg::DType::f32, dev}));
      ps.push_back(p);
    }
  return ps;
}

void sync(mg::Device dev) {
  if (dev.is_cuda()) mg::cuda::synchronize(dev.index);
}

using MakeOpt = std::function<std::unique_ptr<mg::optim::Optimizer>(std::vector<mg::Tensor>, bool fused)>;

// Median-free simple mean over `steps` step() calls after 3 warm-up steps (state created).
double ms_per_step(const MakeOpt& make, int layers, int64_t d, mg::Device dev, bool fused, int steps) {
  auto ps = make_params(layers, d, dev);
  auto opt = make(ps, fused);
  for (int i = 0; i < 3; ++i) opt->step();
  sync(dev);
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) opt->step();
  sync(dev);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  bool cpu_only = false;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--cpu-only"))
      cpu_only = true;
    // The staging runner passes Google Benchmark's output flags to every bench binary: the
    // JSON line goes to that file too; other --benchmark_* flags mean nothing here.
    else if (!std::strncmp(argv[i], "--benchmark_out=", 16))
      json_out = argv[i] + 16;
    else if (!std::strncmp(argv[i], "--benchmark_", 12))
      continue;
    else {
      std::cerr << "usage: bench_optim [--steps N] [--cpu-only]\n";
      return 2;
    }
  }
  const std::vector<std::pair<std::string, MakeOpt>> opts = {
      {"adam",
       [](std::vector<mg::Tensor> p, bool fused) {
         mg::optim::AdamOptions o;
         o.fused = fused;
         return std::unique_ptr<mg::optim::Optimizer>(new mg::optim::Adam(p, o));
       }},
      {"adamw",
       [](std::vector<mg::Tensor> p, bool fused) {
         mg::optim::AdamWOptions o;
         o.fused = fused;
         return std::unique_ptr<mg::optim::Optimizer>(new mg::optim::AdamW(p, o));
       }},
      {"sgd_momentum",
       [](std::vector<mg::Tensor> p, bool fused) {
         mg::optim::SGDOptions o;
         o.momentum = 0.9;
         o.fused = fused;
         return std::unique_ptr<mg::optim::Optimizer>(new mg::optim::SGD(p, o));
       }},
  };
  struct Size {
    const char* name;
    int layers;
    int64_t d;
  };
  // GPT-2 124M-like blocks (12 x d768: 85M parameters in 108 tensors) and a model of many
  // tiny tensors (launch-bound: where fusing matters most).
  const std::vector<Size> cuda_sizes = {{"gpt2_blocks_12x768", 12, 768}, {"tiny_48x64", 48, 64}};
  const std::vector<Size> cpu_sizes = {{"small_4x64", 4, 64}, {"small_2x256", 2, 256}};
  nlohmann::json rows = nlohmann::json::array();
  auto bench = [&](mg::Device dev, const std::vector<Size>& sizes) {
    for (auto& [oname, make] : opts)
      for (const Size& s : sizes) {
        const double per_param = ms_per_step(make, s.layers, s.d, dev, false, steps);
        const double fused = ms_per_step(make, s.layers, s.d, dev, true, steps);
        std::printf("%-5s %-13s %-20s per-parameter %9.3f ms  fused %9.3f ms  speedup %6.2fx\n", dev.str().c_str(),
                    oname.c_str(), s.name, per_param, fused, per_param / fused);
        rows.push_back({{"device", dev.str()},
                        {"optimizer", oname},
                        {"size", s.name},
                        {"tensors", 9 * s.layers},
                        {"per_param_ms", per_param},
                        {"fused_ms", fused},
                        {"speedup", per_param / fused}});
      }
  };
  if (!cpu_only && mg::cuda::is_available())
    bench(mg::Device::cuda(0), cuda_sizes);
  else
    std::printf("(no CUDA device or --cpu-only: CPU rows only)\n");
  bench(mg::Device::cpu(), cpu_sizes);
  const std::string line = nlohmann::json{{"bench", "optim"}, {"steps", steps}, {"rows", rows}}.dump();
  std::cout << line << std::endl;
  if (!json_out.empty()) std::ofstream(json_out) << line << "\n";
  return 0;
}
