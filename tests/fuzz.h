// Bounded, seeded fuzzing of file loaders: byte-level mutators, a seed (MG_TEST_SEED overrides),
// an iteration count and time budget, a per-input deadline, and a bound on how much memory a
// loader may make resident (peak RSS, reset before each input where the kernel allows it).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "core/error.h"

namespace mg::testing {

// The fuzz seed: MG_TEST_SEED when set, else `fallback` (each test's fixed seed).
inline uint64_t fuzz_seed(uint64_t fallback) {
  const char* env = std::getenv("MG_TEST_SEED");
  return env ? std::strtoull(env, nullptr, 10) : fallback;
}

// Peak resident set size (VmHWM). reset_peak_rss() makes the peak the current RSS (writing 5 to
// /proc/self/clear_refs); it returns false where that is not allowed.
inline int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmHWM:") {
      int64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
    f.ignore(1 << 12, '\n');
  }
  return 0;
}
inline int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * 4096;
}
inline bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return f.good();
}

// Byte-level damage on a copy of a valid file.
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  std::mt19937_64& rng() { return rng_; }
  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }
  // Flips 1..8 single bits anywhere in [lo, hi) (clamped to the buffer).
  void flip_bits(std::string& b, size_t lo = 0, size_t hi = SIZE_MAX);
  // Cuts the buffer to a random length below its size.
  void truncate(std::string& b) { b.resize(below(b.size())); }
  // Deletes a range or inserts 1..16 random bytes at a random place.
  void splice(std::string& b);
  // Overwrites 1..4 bytes in [lo, hi) with random values or 0x00 / 0xFF / 0x7F / 0x80.
  void overwrite(std::string& b, size_t lo = 0, size_t hi = SIZE_MAX);
  // The damage every format's fuzzer starts from, kind 0..kByteDamages-1: bits flipped anywhere
  // or in the header [header_lo, header_hi), header bytes overwritten, a truncation, a splice.
  static constexpr uint64_t kByteDamages = 5;
  void damage_bytes(std::string& b, uint64_t kind, size_t header_lo, size_t header_hi);

 private:
  std::mt19937_64 rng_;
};

inline void Mutator::flip_bits(std::string& b, size_t lo, size_t hi) {
  hi = std::min(hi, b.size());
  if (lo >= hi) return;
  const int n = 1 + static_cast<int>(below(8));
  for (int i = 0; i < n; ++i) b[lo + below(hi - lo)] ^= static_cast<char>(1u << below(8));
}

inline void Mutator::splice(std::string& b) {
  if (rng_() % 2 && !b.empty()) {
    b.erase(below(b.size()), 1 + below(16));
  } else {
    std::string ins(1 + below(16), '\0');
    for (char& c : ins) c = static_cast<char>(rng_());
    b.insert(below(b.size() + 1), ins);
  }
}

inline void Mutator::damage_bytes(std::string& b, uint64_t kind, size_t header_lo, size_t header_hi) {
  switch (kind) {
    case 0:
      flip_bits(b);
      break;
    case 1:
      flip_bits(b, header_lo, header_hi);
      break;
    case 2:
      overwrite(b, header_lo, header_hi);
      break;
    case 3:
      truncate(b);
      break;
    default:
      splice(b);
  }
}

inline void Mutator::overwrite(std::string& b, size_t lo, size_t hi) {
  hi = std::min(hi, b.size());
  if (lo >= hi) return;
  static constexpr unsigned char kSpecial[] = {0x00, 0xFF, 0x7F, 0x80};
  const int n = 1 + static_cast<int>(below(4));
  for (int i = 0; i < n; ++i)
    b[lo + below(hi - lo)] = static_cast<char>(rng_() % 2 ? kSpecial[below(4)] : static_cast<unsigned char>(rng_()));
}

// Runs `one_case(iteration)` up to `iterations` times or until `budget_s` seconds have passed.
// Each case must finish (load or raise mg::Error) within `case_deadline_s` and raise the peak RSS
// by at most `rss_bound` bytes over the RSS it started at; anything but mg::Error fails the test.
// `describe(iteration)` names the input in failure messages. Returns {loaded, rejected}.
struct FuzzLimits {
  int iterations = 2000;
  double budget_s = 4.0;
  double case_deadline_s = 1.0;
  int64_t rss_bound = int64_t{256} << 20;
};
struct FuzzCounts {
  int loaded = 0, rejected = 0;
};

inline FuzzCounts run_fuzz(const FuzzLimits& lim, const std::function<void(int)>& one_case,
                           const std::function<std::string(int)>& describe) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const bool can_reset = reset_peak_rss();
  FuzzCounts c;
  for (int it = 0; it < lim.iterations; ++it) {
    if (std::chrono::duration<double>(clock::now() - start).count() > lim.budget_s) break;
    if (can_reset) reset_peak_rss();
    const int64_t rss0 = rss_bytes();
    const auto t0 = clock::now();
    try {
      one_case(it);
      ++c.loaded;
    } catch (const Error&) {
      ++c.rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << describe(it) << ": non-mg exception: " << e.what();
      return c;
    }
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    EXPECT_LT(dt, lim.case_deadline_s) << describe(it) << ": took " << dt << " s";
    if (can_reset) {
      const int64_t grew = peak_rss_bytes() - rss0;
      EXPECT_LT(grew, lim.rss_bound) << describe(it) << ": peak RSS grew by " << grew << " bytes";
      if (grew >= lim.rss_bound) return c;
    }
    if (dt >= lim.case_deadline_s) return c;
  }
  return c;
}

}  // namespace mg::testing
