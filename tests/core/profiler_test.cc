// core/profiler.h: a trace of a small training step on the CPU holds the ops' ranges, the
// backward nodes', the phases' and the memory counter track; it passes the validator; the
// counter track equals the allocator's category stats at the same instants; and the validator
// rejects what the viewers would misread.
#include "core/profiler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/random.h"
#include "nn/nn.h"
#include "tests/error_of.h"

namespace mg {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One step of a linear layer and a layer norm: forward and backward under phase ranges.
void step() {
  Tensor x = randn({8, 16});
  Tensor w = nn::parameter(randn({32, 16})), b = nn::parameter(randn({32}));
  Tensor g = nn::parameter(ones({32})), beta = nn::parameter(zeros({32}));
  Tensor loss;
  {
    profiler::Range r("forward", "phase");
    MemoryCategoryGuard act(MemoryCategory::Activations);
    loss = sum(layer_norm(linear(x, w, b), {32}, g, beta, 1e-5));
  }
  profiler::Range r("backward", "phase");
  loss.backward();
}

TEST(Profiler, OffRecordsNothing) {
  profiler::start();
  profiler::stop();
  step();
  EXPECT_EQ(profiler::event_count(), 0u);
}

TEST(Profiler, StepTraceHoldsOpsPhasesAndMemory) {
  profiler::start();
  step();
  // A probe: the allocator's stats read at this instant must be the counter track's last sample.
  Tensor held;
  {
    MemoryCategoryGuard p(MemoryCategory::Parameters);
    held = zeros({1000});
  }
  profiler::instant("probe", "test");
  const CategoryStats& stats = CategoryStats::get(Device::cpu());
  std::map<std::string, int64_t> at_probe;
  for (int c = 0; c < static_cast<int>(MemoryCategory::kCount); ++c)
    at_probe[memory_category_name(static_cast<MemoryCategory>(c))] =
        stats.counter(static_cast<MemoryCategory>(c)).current;
  at_probe["total"] = stats.total().current;
  profiler::stop();

  const std::string path = ::testing::TempDir() + "/profiler_test_trace.json";
  profiler::export_chrome_trace(path);
  const std::string text = read_file(path);
  EXPECT_EQ(profiler::validate_chrome_trace(text), "");
  const nlohmann::json j = nlohmann::json::parse(text);
  std::map<std::string, int> ranges;  // "cat/name" -> count
  const nlohmann::json* last_memory = nullptr;
  bool probed = false;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"], name = e["name"];
    if (ph == "X") ++ranges[e["cat"].get<std::string>() + "/" + name];
    if (ph == "C" && name == "memory cpu" && !probed) last_memory = &e;
    if (ph == "i" && name == "probe") probed = true;
  }
  EXPECT_EQ(ranges["phase/forward"], 1);
  EXPECT_EQ(ranges["phase/backward"], 1);
  EXPECT_EQ(ranges["op/linear"], 1);
  EXPECT_EQ(ranges["op/layer_norm"], 1);
  EXPECT_GE(ranges["backward/linear"], 1);
  EXPECT_GE(ranges["backward/layer_norm"], 1);
  ASSERT_TRUE(probed);
  ASSERT_NE(last_memory, nullptr);
  for (const auto& [series, bytes] : at_probe) EXPECT_EQ((*last_memory)["args"][series], bytes) << series;
  EXPECT_GE(at_probe["parameters"], 4000);  // the probe's own tensor is in it
}

TEST(Profiler, ValidatorRejectsWhatViewersMisread) {
  auto trace = [](const std::string& events) { return "{\"traceEvents\": [" + events + "]}"; };
  const std::string ok = R"({"name":"a","ph":"X","ts":0,"dur":10,"pid":1,"tid":0},)"
                         R"({"name":"b","ph":"X","ts":2,"dur":3,"pid":1,"tid":0})";
  EXPECT_EQ(profiler::validate_chrome_trace(trace(ok)), "");
  EXPECT_NE(profiler::validate_chrome_trace("{"), "");
  EXPECT_NE(profiler::validate_chrome_trace(trace(R"({"name":"a","ph":"X","ts":0,"pid":1,"tid":0})")).find("dur"),
            std::string::npos);
  const std::string overlap = R"({"name":"a","ph":"X","ts":0,"dur":10,"pid":1,"tid":0},)"
                              R"({"name":"b","ph":"X","ts":5,"dur":10,"pid":1,"tid":0})";
  EXPECT_NE(profiler::validate_chrome_trace(trace(overlap)).find("without nesting"), std::string::npos);
  const std::string back = R"({"name":"m","ph":"C","ts":5,"pid":1,"tid":0,"args":{"x":1}},)"
                           R"({"name":"m","ph":"C","ts":4,"pid":1,"tid":0,"args":{"x":2}})";
  EXPECT_NE(profiler::validate_chrome_trace(trace(back)).find("back in time"), std::string::npos);
  EXPECT_NE(
      profiler::validate_chrome_trace(trace(R"({"name":"e","ph":"E","ts":1,"pid":1,"tid":0})")).find("never began"),
      std::string::npos);
  EXPECT_NE(profiler::validate_chrome_trace(trace(R"({"ph":"X","ts":1,"dur":1,"pid":1,"tid":0})")).find("name"),
            std::string::npos);
}

// Device records (what core/cuda/kernel_profiler.h gives from CUPTI) on the trace: each on its
// device's stream track, linked to the op range open at its launch by a flow, the op named in
// its args; a record launched outside every range, or with no launch, gets no flow.
TEST(Profiler, DeviceRecordsLandOnStreamTracksLinkedToTheirOp) {
  profiler::start();
  double launch_in_op = 0, launch_in_phase = 0;
  {
    profiler::Range phase("forward", "phase");
    launch_in_phase = profiler::now_us();
    profiler::Range op("matmul", "op");
    launch_in_op = profiler::now_us();
  }
  profiler::stop();
  const double after = profiler::now_us() + 10;
  std::vector<profiler::DeviceRecord> recs = {
      {"gemm_kernel", "kernel", 0, 7, launch_in_op + 5, 20, 11},
      {"[memcpy]", "memcpy", 0, 9, launch_in_phase + 1, 3, 12},
      {"orphan_kernel", "kernel", 1, 7, after, 2, 13},  // launched after every range ended
      {"unlaunched", "kernel", 0, 7, after + 30, 1, 0},
      // Launched dependent on "unlaunched": it starts before that one ends (a second track).
      {"dependent", "kernel", 0, 7, after + 30.5, 2, 0},
  };
  std::vector<profiler::LaunchRecord> launches = {{11, launch_in_op}, {12, launch_in_phase}, {13, after - 1}};
  profiler::add_device_records(recs, launches);
  const std::string text = profiler::chrome_trace_json();
  EXPECT_EQ(profiler::validate_chrome_trace(text), "");
  const nlohmann::json j = nlohmann::json::parse(text);
  std::map<std::string, nlohmann::json> by_name;
  int flow_starts = 0, flow_ends = 0;
  std::set<std::string> process_names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") by_name[e["name"].get<std::string>()] = e;
    if (e["ph"] == "s") ++flow_starts;
    if (e["ph"] == "f") ++flow_ends;
    if (e["ph"] == "M" && e["name"] == "process_name") process_names.insert(e["args"]["name"].get<std::string>());
  }
  ASSERT_TRUE(by_name.count("gemm_kernel") && by_name.count("[memcpy]") && by_name.count("orphan_kernel") &&
              by_name.count("unlaunched") && by_name.count("dependent"));
  EXPECT_EQ(by_name["gemm_kernel"]["args"]["op"], "matmul");  // the innermost range at its launch
  EXPECT_EQ(by_name["gemm_kernel"]["args"]["correlation"], 11);
  EXPECT_EQ(by_name["gemm_kernel"]["tid"], by_name["unlaunched"]["tid"]);  // stream 7's first track
  EXPECT_NE(by_name["dependent"]["tid"], by_name["unlaunched"]["tid"]);    // the overlap on another
  EXPECT_EQ(by_name["gemm_kernel"]["cat"], "kernel");
  EXPECT_EQ(by_name["[memcpy]"]["args"]["op"], "forward");
  EXPECT_EQ(by_name["gemm_kernel"]["pid"], by_name["[memcpy]"]["pid"]);
  EXPECT_NE(by_name["gemm_kernel"]["pid"], by_name["orphan_kernel"]["pid"]);  // another device
  EXPECT_NE(by_name["gemm_kernel"]["pid"], by_name["matmul"]["pid"]);         // not the host's track
  EXPECT_FALSE(by_name["orphan_kernel"]["args"].contains("op"));
  EXPECT_EQ(flow_starts, 2);
  EXPECT_EQ(flow_ends, 2);
  EXPECT_TRUE(process_names.count("cuda:0") && process_names.count("cuda:1"));
}

TEST(Profiler, ValidatorRejectsAFlowThatEndsBeforeItStarts) {
  auto trace = [](const std::string& events) { return "{\"traceEvents\": [" + events + "]}"; };
  EXPECT_EQ(profiler::validate_chrome_trace(trace(R"({"name":"l","ph":"s","id":1,"ts":1,"pid":1,"tid":0},)"
                                                  R"({"name":"l","ph":"f","id":1,"ts":2,"pid":2,"tid":3})")),
            "");
  EXPECT_NE(profiler::validate_chrome_trace(trace(R"({"name":"l","ph":"f","id":4,"ts":2,"pid":2,"tid":3})"))
                .find("did not start"),
            std::string::npos);
  EXPECT_NE(profiler::validate_chrome_trace(trace(R"({"name":"l","ph":"s","ts":1,"pid":1,"tid":0})")).find("id"),
            std::string::npos);
}

TEST(Profiler, ExportToAnUnwritablePathSaysWhere) {
  profiler::start();
  profiler::stop();
  EXPECT_NE(testing::error_of([] {
              profiler::export_chrome_trace("/nonexistent-dir/trace.json");
            }).find("/nonexistent-dir/trace.json"),
            std::string::npos);
}

}  // namespace
}  // namespace mg
