// What the example programs share: the --device choice, a \r-updated progress line on stderr, and
// the peak memory by category (parameters, gradients, optimizer state, activations, ...) as JSON.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/device.h"

namespace mg::examples {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "cpu", "cuda" or "cuda:N"; empty: cuda:0 when a GPU is visible, else cpu. A malformed name or a
// CUDA device this build or machine lacks is an mg::ValueError saying what to use instead.
Device pick_device(const std::string& spec);

// One line on stderr, redrawn at most every 0.1 s on a terminal (2 s into a file), so it never
// costs measurable time: "<prefix> [=====>    ] done/total  <suffix>".
class ProgressBar {
 public:
  explicit ProgressBar(bool on);
  void update(const std::string& prefix, int64_t done, int64_t total, const std::string& suffix, bool force);
  void finish();  // ends the line

 private:
  bool on_, tty_;
  Clock::time_point last_{};
};

// Each category's own peak bytes on `d` since the last reset, plus the total's peak.
nlohmann::json peak_bytes(Device d);
// The categories at the moment the total peaked (what was live together).
nlohmann::json at_peak_bytes(Device d);
// "parameters 1.2 MiB, gradients ..., total ..." from peak_bytes().
std::string memory_line(const nlohmann::json& peaks);

}  // namespace mg::examples
