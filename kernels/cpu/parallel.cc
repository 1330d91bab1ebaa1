// The CPU backend's threads: how many, and a parallel loop over slices of a range.
#include <algorithm>
#include <thread>
#include <vector>

#include "core/env.h"
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels::cpu {

int num_threads() {
  static const int n = [] {
    if (const long v = env::integer("MG_NUM_THREADS", 0); v >= 1) return static_cast<int>(v);
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

namespace {
thread_local int tl_cap = 0;  // 0: no cap
}  // namespace

ThreadCap::ThreadCap(int threads) : prev_(tl_cap) { tl_cap = std::max(1, threads); }
ThreadCap::~ThreadCap() { tl_cap = prev_; }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  if (n <= 0) return;
  const int64_t most = tl_cap > 0 ? std::min(tl_cap, num_threads()) : num_threads();
  const int64_t t = std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, most);
  if (t == 1) return f(0, n);
  std::vector<std::thread> ts;
  const int64_t per = (n + t - 1) / t;
  for (int64_t k = 1; k < t; ++k)
    if (k * per < n) ts.emplace_back(f, k * per, std::min(n, (k + 1) * per));
  f(0, std::min(n, per));
  for (auto& th : ts) th.join();
}

}  // namespace mg::kernels::cpu
