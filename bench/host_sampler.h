// HostSampler: where the host's time goes in an eager training step, by sampling the call stacks
// of the process every 1/hz seconds of its CPU time (SIGPROF). The stacks are written raw, with
// the process's memory map, so they are resolved off the machine against the unstripped binary
// (tools/host_samples.py): the device machine has no perf.
#pragma once

#include <string>

namespace mg::bench {

class HostSampler {
 public:
  // Starts sampling (one sampler a process). Throws mg::ValueError when one is running.
  void start(int hz = 4000);
  // Stops sampling; the samples are kept for write().
  void stop();
  // Writes "maps" lines (/proc/self/maps), then one line per sample: its return addresses, in
  // hex, innermost first. Returns the number of samples.
  int write(const std::string& path) const;
};

}  // namespace mg::bench
