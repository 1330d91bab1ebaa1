#include "bench/host_sampler.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>

#include "core/error.h"

namespace mg::bench {
namespace {

constexpr int kDepth = 24;
constexpr int kMaxSamples = 1 << 16;
struct Sample {
  int depth;
  void* pc[kDepth];
};
Sample g_samples[kMaxSamples] = {};
std::atomic<int> g_count{0};
std::atomic<bool> g_running{false};
struct sigaction g_previous;

void on_sigprof(int) {
  const int i = g_count.fetch_add(1, std::memory_order_relaxed);  // lock-free: safe in a handler
  if (i >= kMaxSamples) return;
  g_samples[i].depth = backtrace(g_samples[i].pc, kDepth);
}

}  // namespace

void HostSampler::start(int hz) {
  MG_CHECK(!g_running.exchange(true), ValueError, "HostSampler: already sampling");
  void* warm[2];
  backtrace(warm, 2);  // loads libgcc's unwinder now, not inside the signal handler
  g_count = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_sigprof;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGPROF, &sa, &g_previous);
  const long us = 1000000L / (hz > 0 ? hz : 1000);
  itimerval t = {{0, us}, {0, us}};
  setitimer(ITIMER_PROF, &t, nullptr);
}

void HostSampler::stop() {
  itimerval t = {};
  setitimer(ITIMER_PROF, &t, nullptr);
  sigaction(SIGPROF, &g_previous, nullptr);
  g_running = false;
}

int HostSampler::write(const std::string& path) const {
  std::ofstream out(path);
  MG_CHECK(out.good(), ValueError, "HostSampler: cannot write ", path);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) out << "maps " << line << "\n";
  const int n = std::min(g_count.load(), kMaxSamples);  // a slot taken as the timer stopped may be unfilled
  char buf[32];
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < g_samples[i].depth; ++d) {
      std::snprintf(buf, sizeof buf, d ? " %p" : "%p", g_samples[i].pc[d]);
      out << buf;
    }
    out << "\n";
  }
  return n;
}

}  // namespace mg::bench
