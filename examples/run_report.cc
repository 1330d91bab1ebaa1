#include "examples/run_report.h"

#include <unistd.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/error.h"

namespace mg::examples {

Device pick_device(const std::string& spec) {
  if (spec.empty()) return cuda::is_available() ? Device::cuda(0) : Device::cpu();
  Device d;
  try {
    d = Device(spec);
  } catch (const Error&) {
    throw ValueError("unknown --device \"" + spec + "\" (valid: cpu, cuda, cuda:N)");
  }
  if (d.is_cuda()) {
    const int n = cuda::device_count();
    MG_CHECK(n > 0, ValueError, "--device ", spec,
             ": no CUDA device is available (this build has no CUDA backend, or no GPU is visible); use --device cpu");
    MG_CHECK(d.index < n, ValueError, "--device ", spec, ": only ", n, " CUDA device(s) visible");
  }
  return d;
}

ProgressBar::ProgressBar(bool on) : on_(on), tty_(isatty(STDERR_FILENO)) {}

void ProgressBar::update(const std::string& prefix, int64_t done, int64_t total, const std::string& suffix,
                         bool force) {
  if (!on_) return;
  const auto now = Clock::now();
  const double min_interval = tty_ ? 0.1 : 2.0;
  if (!force && std::chrono::duration<double>(now - last_).count() < min_interval) return;
  last_ = now;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
  std::string bar(filled, '=');
  if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
  std::fprintf(stderr, "\r%s [%s] %lld/%lld  %s ", prefix.c_str(), bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total), suffix.c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (on_) std::fprintf(stderr, "\n");
}

namespace {
const std::vector<std::pair<const char*, MemoryCategory>> kCategories = {
    {"parameters", MemoryCategory::Parameters},
    {"gradients", MemoryCategory::Gradients},
    {"optimizer_state", MemoryCategory::OptimizerState},
    {"activations", MemoryCategory::Activations},
    {"data", MemoryCategory::Data},
    {"other", MemoryCategory::Other},
};
}  // namespace

nlohmann::json peak_bytes(Device d) {
  auto& stats = CategoryStats::get(d);
  nlohmann::json j;
  for (auto& [name, c] : kCategories) j[name] = stats.counter(c).peak;
  j["total"] = stats.total().peak;
  return j;
}

nlohmann::json at_peak_bytes(Device d) {
  auto& stats = CategoryStats::get(d);
  auto at = stats.at_peak();
  nlohmann::json j;
  for (auto& [name, c] : kCategories) j[name] = at[static_cast<size_t>(c)];
  j["total"] = stats.total().peak;
  return j;
}

std::string memory_line(const nlohmann::json& peaks) {
  std::string s;
  for (const char* k : {"parameters", "gradients", "optimizer_state", "activations", "data", "total"}) {
    if (!s.empty()) s += ", ";
    s += std::string(k) + " " + format_bytes(peaks[k].get<int64_t>());
  }
  return s;
}

}  // namespace mg::examples
