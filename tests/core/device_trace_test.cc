// The device's side of mg::profiler's trace: with //core/cuda:kernel_profiler linked,
// profiler::start() and stop() alone put a GPU step's kernels, copies and fills on the trace,
// each on its stream's track and linked to the op that launched it, and the trace's kernel time
// is CUPTI's table's. Skips without a GPU.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
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
  for (const profiler::KernelTotal& t : profiler::trace_kernels().totals())
    if (t.name.empty() || t.name[0] != '[') table_ms += t.total_ms;
  // The same records on both sides, the trace's converted to microseconds as doubles: they agree
  // to far below a nanosecond a kernel unless a record is lost or doubled on the way, which moves
  // the sum by a whole kernel (a microsecond or more), so 1e-3 of the total separates the two.
  EXPECT_NEAR(trace_ms, table_ms, 1e-3 * table_ms);
}

}  // namespace
}  // namespace mg
