// A trace of what ran, in the Chrome trace-event format that Perfetto (ui.perfetto.dev) and
// chrome://tracing open, laid out as torch.profiler's export is: host ranges per op and per
// phase of a step ("X" events on the thread that ran them), the allocator's live bytes by
// category as a counter track per device ("C" events at every allocation and free), and instant
// events ("i") for the caching allocator's segment allocations, frees, maps and unmaps and for an
// out-of-memory error.
//
//   profiler::start();
//   ... one training step ...
//   profiler::stop();
//   profiler::export_chrome_trace("step.json");
//
// Off (the default), each hook is one relaxed atomic load. The events are kept in host memory
// until the next start().
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace mg::profiler {

namespace detail {
extern std::atomic<bool> enabled;
}
inline bool enabled() { return detail::enabled.load(std::memory_order_relaxed); }

// Clears the events and starts recording (the trace's time zero), and the device tracer with it
// when one is registered.
void start();
// Stops recording; the events stay for export. A registered device tracer waits for the device,
// stops, and puts what it recorded on the trace.
void stop();

// The device's side of a trace. The CUDA build's CUPTI tracer (//core/cuda:kernel_profiler)
// registers itself when it is linked (the examples and the benches link it), so that start() and
// stop() put every kernel, copy and fill on the trace without the caller asking; a binary
// without it traces the host alone. `start` and `stop` run outside the profiler's lock; `stop`
// adds its records through add_device_records.
struct DeviceTracer {
  void (*start)() = nullptr;
  void (*stop)() = nullptr;
};
void set_device_tracer(DeviceTracer tracer);
// Writes the recorded events as one trace-event JSON object ({"traceEvents": [...]}). The write is
// atomic (a temporary file renamed over `path`). An IOError names the path when it cannot be written.
void export_chrome_trace(const std::string& path);
// The recorded events as that JSON text.
std::string chrome_trace_json();
size_t event_count();

// A host range on the calling thread, from construction to destruction: one "X" event named
// `name` in category `cat` ("op", "backward", "phase", ...). `name` must outlive the trace (a
// string literal or an op's static name).
class Range {
 public:
  explicit Range(const char* name, const char* cat = "op") : name_(enabled() ? name : nullptr), cat_(cat) {
    if (name_) begin_ = now_us();
  }
  ~Range() {
    if (name_) end();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  void end();
  static double now_us();
  const char* name_;
  const char* cat_;
  double begin_ = 0;
};

// A name that lives until the process ends, for a Range named by a string made at run time (a
// backward node's op name). One copy per distinct name.
const char* intern(const std::string& name);

// An instant event on the calling thread, with integer arguments (e.g. {"bytes", n}).
void instant(const char* name, const char* cat, std::initializer_list<std::pair<const char*, int64_t>> args = {});
// A counter track sample: `track` (e.g. "memory cuda:0") with one series per argument.
void counter(const std::string& track, std::initializer_list<std::pair<const char*, int64_t>> series);
void counter(const std::string& track, const std::pair<const char*, int64_t>* series, size_t n);

// The trace's clock: microseconds since start(), what every event's ts is.
double now_us();

// Device work another tool recorded (CUPTI's activity records, core/cuda/kernel_profiler.h), put on
// the trace after stop(): one "X" event a record on the process "cuda:<device>", one thread a
// stream ("stream <id>"), in category `cat` ("kernel", "memcpy", "memset"). A record whose
// `correlation` names a launch gets that id in its args, the host range that was innermost open
// when the launch was made (the op that asked for it) as its "op", and a flow from that range to
// the record ("s" at the launch, "f" at the record: the arrow Perfetto draws, as torch.profiler
// links a kernel to its op).
struct DeviceRecord {
  std::string name;
  const char* cat = "kernel";
  int device = 0;
  uint32_t stream = 0;
  double ts = 0, dur = 0;    // on the trace's clock (us)
  uint64_t correlation = 0;  // the launching call's id; 0: none
};
// A launch on the host: a CUDA runtime call's start on the trace's clock and its id.
struct LaunchRecord {
  uint64_t correlation = 0;
  double ts = 0;
};
void add_device_records(const std::vector<DeviceRecord>& records, const std::vector<LaunchRecord>& launches);

// Checks `json` (a trace's text) against what the viewers need: a "traceEvents" array whose
// events have name, ph, ts, pid and tid; "X" events with dur >= 0, properly nested on each
// thread; "B"/"E" pairs matched; flows ("s"/"f") with an id, every end after a start of the same id;
// counter ("C") samples with numeric series and timestamps that
// never go back on a track. Returns "" when it holds, else what is wrong, naming the event.
std::string validate_chrome_trace(const std::string& json);

}  // namespace mg::profiler
