// Optimizer step time: Adam/AdamW/SGD fused multi-tensor updates vs the per-parameter path
// (one kernel per op per parameter, PyTorch's foreach=False), timed in the same run and
// reported as a ratio; on CUDA when there is a device, and on the CPU at small sizes.
// On CUDA also the fused AdamW at GPT-2 XL's size against a device copy's rate (how near the
// memory's ceiling the bandwidth-bound update runs). Then the host update of optimizer offload
// (memory/host_params.h) on one large parameter:
// AdamW from a bf16 gradient writing the bf16 cast in the same pass, against the gradient cast
// to f32 first and the cast written after, and both against the host's copy bandwidth.
//
//   bench_optim [--steps N] [--cpu-only] [--host-only] [--host-elems N] [--benchmark_out=FILE]
//   last stdout line: JSON
#include <algorithm>
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
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "kernels/parallel.h"
#include "memory/host_params.h"
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

// One host update of `n` f32 parameters, `steps` times after 2 warm-ups, from a gradient of
// `grad_dtype` as it comes home: f32 (optimizer offload: the f32 master's gradient) or bf16
// (parameter offload: the device weights' gradient). Fused: the gradient widened inside AdamW and
// the bf16 cast a cast target written in its pass. Two-pass, the host update as it was before
// the cast target: a 16-bit gradient cast to a fresh f32 tensor first, the cast written after
// the step by kernels::write_low_copy (every core, vectorized). Returns ms a step, the median.
double host_update_ms(int64_t n, mg::DType grad_dtype, bool fused, int steps, bool eight_bit = false) {
  mg::manual_seed(0);
  mg::Tensor p = mg::nn::parameter(mg::randn({n}));
  const mg::Tensor g = mg::randn({n}).to(grad_dtype);
  mg::Tensor cast = mg::empty({n}, {mg::DType::bf16});
  std::unique_ptr<mg::optim::Adam> owned;
  if (eight_bit)
    owned = std::make_unique<mg::optim::AdamW8bit>(std::vector<mg::Tensor>{p});
  else
    owned = std::make_unique<mg::optim::AdamW>(std::vector<mg::Tensor>{p});
  mg::optim::Adam& opt = *owned;
  if (fused) opt.set_cast_target(p, cast);
  std::vector<double> ms;
  for (int i = 0; i < steps + 2; ++i) {
    const auto t0 = Clock::now();
    p.set_grad(fused || grad_dtype == mg::DType::f32 ? g : mg::kernels::cast(g, mg::DType::f32));
    opt.step();
    if (!fused) mg::kernels::write_low_copy(p, cast);
    if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A device-to-device copy of 1 GiB's rate in GB/s (bytes read plus written), the median of `steps`.
double device_copy_gbps(int steps) {
  const mg::Device dev = mg::Device::cuda(0);
  const mg::Tensor a = mg::zeros({int64_t{1} << 28}, {mg::DType::f32, dev});
  mg::Tensor b = mg::empty({int64_t{1} << 28}, {mg::DType::f32, dev});
  std::vector<double> ms;
  for (int i = 0; i < steps + 2; ++i) {
    sync(dev);
    const auto t0 = Clock::now();
    mg::raw::copy_(b, a);
    sync(dev);
    if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(a.nbytes()) / ms[ms.size() / 2] / 1e6;
}

// The fused AdamW over GPT-2 XL's block parameters (48 blocks of d = 1600: 1.47B parameters in
// 432 tensors) on the device, ms a step (median of `steps`): the update moves 28 bytes a
// parameter (the master, gradient and two moments read, three written), so its rate over the
// copy's (device_copy_gbps, in the same run) is how close it runs to the memory's ceiling.
// With eight_bit, AdamW8bit instead: 16 bytes a parameter (the master read and written, the
// gradient read, the two moments' codes read and written; the blocks' absmax adds 1/2048 of that).
double device_adam_xl_ms(int steps, int64_t* n_params, bool eight_bit) {
  const mg::Device dev = mg::Device::cuda(0);
  auto ps = make_params(48, 1600, dev);
  *n_params = 0;
  for (const mg::Tensor& p : ps) *n_params += p.numel();
  std::unique_ptr<mg::optim::Adam> owned;
  if (eight_bit)
    owned = std::make_unique<mg::optim::AdamW8bit>(ps);
  else
    owned = std::make_unique<mg::optim::AdamW>(ps);
  mg::optim::Adam& opt = *owned;
  std::vector<double> ms;
  for (int i = 0; i < steps + 2; ++i) {  // the first step creates the moments
    sync(dev);
    const auto t0 = Clock::now();
    opt.step();
    sync(dev);
    if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  bool cpu_only = false, host_only = false;
  int64_t host_elems = int64_t{1} << 26;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--cpu-only"))
      cpu_only = true;
    else if (!std::strcmp(argv[i], "--host-only"))
      host_only = true;
    else if (!std::strcmp(argv[i], "--host-elems") && i + 1 < argc)
      host_elems = std::atoll(argv[++i]);
    // The staging runner passes Google Benchmark's output flags to every bench binary: the
    // JSON line goes to that file too; other --benchmark_* flags mean nothing here.
    else if (!std::strncmp(argv[i], "--benchmark_out=", 16))
      json_out = argv[i] + 16;
    else if (!std::strncmp(argv[i], "--benchmark_", 12))
      continue;
    else {
      std::cerr << "usage: bench_optim [--steps N] [--cpu-only] [--host-only] [--host-elems N]\n";
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
  nlohmann::json xl;
  if (!host_only) {
    if (!cpu_only && mg::cuda::is_available()) {
      bench(mg::Device::cuda(0), cuda_sizes);
      int64_t n = 0;
      const double copy_gbps = device_copy_gbps(steps);
      const double adam_ms = device_adam_xl_ms(steps, &n, false);
      const double gbps = 28.0 * static_cast<double>(n) / adam_ms / 1e6;
      std::printf(
          "cuda  adamw gpt2_xl_blocks_48x1600 (%lld params): fused %.2f ms  %.1f GB/s, %.2f of the %.1f GB/s "
          "copy\n",
          static_cast<long long>(n), adam_ms, gbps, gbps / copy_gbps, copy_gbps);
      xl = {{"params", n}, {"fused_ms", adam_ms}, {"gbps", gbps}, {"copy_gbps", copy_gbps}};
      const double q_ms = device_adam_xl_ms(steps, &n, true);
      const double q_gbps = 16.0 * static_cast<double>(n) / q_ms / 1e6;
      std::printf("cuda  adamw8bit gpt2_xl_blocks_48x1600 (%lld params): fused %.2f ms  %.1f GB/s, %.2f of the copy\n",
                  static_cast<long long>(n), q_ms, q_gbps, q_gbps / copy_gbps);
      xl["adamw8bit_ms"] = q_ms;
      xl["adamw8bit_gbps"] = q_gbps;
    } else
      std::printf("(no CUDA device or --cpu-only: CPU rows only)\n");
    bench(mg::Device::cpu(), cpu_sizes);
  }
  // The host update: the bytes a fused step must move (the f32 master and both moments read and
  // written, the gradient read, the bf16 cast written: 30 a parameter from an f32 gradient, 28
  // from a bf16 one) over its time, beside a parallel copy's rate measured in the same run. The
  // copy's rate counts the bytes it reads and writes; its writes also read their lines first,
  // which the update's writes of what it has just read do not, so the update can pass it.
  const double copy_gbps = mg::memory::measure_host_copy_bandwidth() / 1e6;  // bytes a ms to GB/s
  nlohmann::json host = nlohmann::json::array();
  for (mg::DType gdt : {mg::DType::f32, mg::DType::bf16}) {
    const double two_pass = host_update_ms(host_elems, gdt, false, steps);
    const double fused = host_update_ms(host_elems, gdt, true, steps);
    const double gbps = (gdt == mg::DType::f32 ? 30.0 : 28.0) * static_cast<double>(host_elems) / fused / 1e6;
    std::printf(
        "host  adamw %lld params, %s gradient: two passes %8.2f ms  fused %8.2f ms  speedup %5.2fx  fused %.1f "
        "GB/s, %.2f x the %.1f GB/s copy\n",
        static_cast<long long>(host_elems), mg::dtype_name(gdt), two_pass, fused, two_pass / fused, gbps,
        gbps / copy_gbps, copy_gbps);
    host.push_back({{"params", host_elems},
                    {"grad_dtype", mg::dtype_name(gdt)},
                    {"threads", mg::kernels::cpu::num_threads()},
                    {"two_pass_ms", two_pass},
                    {"fused_ms", fused},
                    {"speedup", two_pass / fused},
                    {"fused_gbps", gbps},
                    {"copy_gbps", copy_gbps}});
  }
  {  // AdamW8bit's host update (the moments' codes read and written: 18 bytes a parameter from an
     // f32 gradient, the cast written in its pass)
    const double ms8 = host_update_ms(host_elems, mg::DType::f32, true, steps, true);
    const double gbps = 18.0 * static_cast<double>(host_elems) / ms8 / 1e6;
    std::printf("host  adamw8bit %lld params, f32 gradient: %8.2f ms  %.1f GB/s, %.2f x the %.1f GB/s copy\n",
                static_cast<long long>(host_elems), ms8, gbps, gbps / copy_gbps, copy_gbps);
    host.push_back({{"params", host_elems},
                    {"optimizer", "adamw8bit"},
                    {"grad_dtype", "f32"},
                    {"fused_ms", ms8},
                    {"fused_gbps", gbps},
                    {"copy_gbps", copy_gbps}});
  }
  const std::string line =
      nlohmann::json{{"bench", "optim"}, {"steps", steps}, {"rows", rows}, {"adamw_xl", xl}, {"host_update", host}}
          .dump();
  std::cout << line << std::endl;
  if (!json_out.empty()) std::ofstream(json_out) << line << "\n";
  return 0;
}
