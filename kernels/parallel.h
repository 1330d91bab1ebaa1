// The CPU's threads for work over a range: the CPU kernels split their loops with it, and so do
// host-side loops outside kernels/ (memory/host_params.cc's cast writes).
#pragma once

#include <cstdint>
#include <functional>

namespace mg::kernels::cpu {

// Threads the CPU kernels use: $MG_NUM_THREADS if set, else the hardware's (cpu/parallel.cc).
int num_threads();
// Runs f(begin, end) over contiguous slices of [0, n) on up to num_threads() threads,
// giving each at least `grain` items (one slice on the calling thread when n < 2 * grain).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

// Caps the threads parallel_for uses when called from this thread, for a scope: a background
// thread's loops (memory/host_params.cc's updates) leave a core to the thread launching the
// device's work.
class ThreadCap {
 public:
  explicit ThreadCap(int threads);
  ~ThreadCap();
  ThreadCap(const ThreadCap&) = delete;
  ThreadCap& operator=(const ThreadCap&) = delete;

 private:
  int prev_;
};

}  // namespace mg::kernels::cpu
