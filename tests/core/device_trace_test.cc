// The device's side of mg::profiler's trace: with //core/cuda:kernel_profiler linked,
// profiler::start() and stop() alone put a GPU step's kernels, copies and fills on the trace,
// each on its stream's track and linked to the op that launched it, and the trace's kernel time
// is CUPTI's table's. Skips without a GPU.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <iostream>
#include <set>
#include <string>

#include "autograd/functions.h"
#include "core/cuda/kernel_profiler.h"
#include "core/device_runtime.h"
#include "core/profiler.h"
#include "core/random.h"
#include "nn/nn.h"

namespace mg {
namespace {

TEST(DeviceTrace, StartAndStopPutTheGpuKernelsOnTheTraceLinkedToTheirOps) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
  const TensorOptions gpu{DType::f32, Device::cuda(0)};
  Generator gen(7);
  Tensor x = randn({64, 128}, gpu, &gen);
  Tensor w = nn::parameter(randn({256, 128}, gpu, &gen)), b = nn::parameter(zeros({256}, gpu));
  cuda::synchronize();
  profiler::start();
  {
    profiler::Range step("step", "phase");
    Tensor loss = sum(relu(linear(x, w, b)));
    loss.backward();
  }
  profiler::stop();  // waits for the device, then adds CUPTI's records

  const std::string text = profiler::chrome_trace_json();
  EXPECT_EQ(profiler::validate_chrome_trace(text), "");
  const nlohmann::json j = nlohmann::json::parse(text);
  int64_t kernels = 0, linked = 0;
  double trace_ms = 0;
  std::set<std::string> ops;
  std::set<std::string> processes;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] != "X" || e["cat"] != "kernel") continue;
    ++kernels;
    trace_ms += e["dur"].get<double>() * 1e-3;
    if (e.contains("args") && e["args"].contains("op")) {
      ++linked;
      ops.insert(e["args"]["op"].get<std::string>());
    }
  }
  // linear's GEMM (cuBLAS, launched through the driver), relu, sum and their backward kernels.
  EXPECT_GE(kernels, 4);
  EXPECT_EQ(linked, kernels) << "every kernel launched inside the step range finds its op";
  EXPECT_TRUE(processes.count("cuda:0"));
  EXPECT_GE(ops.size(), 2u) << "kernels name more than one launching op";
  double table_ms = 0;
  int64_t table_kernels = 0;
  for (const profiler::KernelTotal& t : profiler::trace_kernels().totals())
    if (t.name.empty() || t.name[0] != '[') {
      table_ms += t.total_ms;
      table_kernels += t.calls;
    }
  std::cout << "[device trace] " << kernels << " kernels on the trace, " << trace_ms << " ms; CUPTI's table "
            << table_kernels << " kernels, " << table_ms << " ms" << std::endl;
  // The trace's kernels are the table's records, but the table is read after stop() and may
  // hold a record CUPTI delivered after the trace took its copy (on an H100: 0.16 us of a 20.9 us
  // step here, 1 us of 17.15 ms on a GPT-2 step): the "within a few percent" as the bound.
  EXPECT_LE(kernels, table_kernels);
  EXPECT_NEAR(trace_ms, table_ms, 0.02 * table_ms);
}

}  // namespace
}  // namespace mg
