#include "core/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/atomic_file.h"

namespace mg::profiler {

namespace detail {
std::atomic<bool> enabled{false};
}

namespace {

struct Event {
  char ph;  // 'X' range, 'i' instant, 'C' counter, 's'/'f' flow
  const char* name = nullptr;
  std::string track;  // counters: the track's name; device records: their name
  const char* cat = "";
  double ts = 0, dur = 0;
  int tid = 0;
  int pid = -1;  // -1: the process; else a device's track group (kDevicePid + device)
  std::vector<std::pair<const char*, int64_t>> args;
  std::string op;  // device records: the launching op
};
// Device tracks as processes of their own, after the host's.
constexpr int kDevicePid = 1000000;
// Tracks a stream may take (see add_device_records).
constexpr int kLanes = 4;

struct State {
  std::mutex mu;
  std::vector<Event> events;
  std::map<std::thread::id, int> tids;  // small thread numbers, in order of first event
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
};
State& state() {
  static State* s = new State;  // never destroyed: events may come from static destructors
  return *s;
}

// Under s.mu.
int tid_of(State& s) {
  auto [it, fresh] = s.tids.try_emplace(std::this_thread::get_id(), static_cast<int>(s.tids.size()));
  return it->second;
}

double since_start_us(const State& s) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s.t0).count();
}

}  // namespace

const char* intern(const std::string& name) {
  static std::mutex mu;
  static auto* names = new std::set<std::string>;  // never destroyed: the pointers outlive traces
  std::lock_guard<std::mutex> g(mu);
  return names->insert(name).first->c_str();
}

namespace {
DeviceTracer& device_tracer() {
  static DeviceTracer t;
  return t;
}
}  // namespace

void set_device_tracer(DeviceTracer tracer) { device_tracer() = tracer; }

void start() {
  State& s = state();
  {
    std::lock_guard<std::mutex> g(s.mu);
    s.events.clear();
    s.tids.clear();
    s.t0 = std::chrono::steady_clock::now();
    detail::enabled.store(true);
  }
  if (device_tracer().start) device_tracer().start();
}

void stop() {
  const bool was = detail::enabled.exchange(false);
  if (was && device_tracer().stop) device_tracer().stop();
}

size_t event_count() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return s.events.size();
}

double Range::now_us() { return since_start_us(state()); }
double now_us() { return since_start_us(state()); }

void add_device_records(const std::vector<DeviceRecord>& records, const std::vector<LaunchRecord>& launches) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  // The host ranges, for finding the innermost one open at each launch: sorted by start.
  std::vector<const Event*> ranges;
  for (const Event& e : s.events)
    if (e.ph == 'X' && e.pid < 0) ranges.push_back(&e);
  std::sort(ranges.begin(), ranges.end(), [](const Event* a, const Event* b) { return a->ts < b->ts; });
  auto innermost = [&](double t) -> const Event* {
    const Event* best = nullptr;
    for (const Event* e : ranges) {
      if (e->ts > t) break;
      if (t <= e->ts + e->dur && (!best || e->dur < best->dur)) best = e;
    }
    return best;
  };
  std::map<uint64_t, double> launch_at;
  for (const LaunchRecord& l : launches) launch_at[l.correlation] = l.ts;
  // One track a stream, and a second (third...) where a kernel began before the one before it on
  // its stream ended (a programmatic dependent launch overlaps its predecessor's tail): ranges on
  // one track must nest, and kernels of one stream do not. Lane L of stream S is thread
  // S * kLanes + L.
  std::vector<size_t> order(records.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return records[a].ts < records[b].ts; });
  std::map<std::pair<int, uint32_t>, std::vector<double>> lane_end;  // (device, stream) -> each lane's last end
  std::vector<int> lane(records.size(), 0);
  for (size_t i : order) {
    const DeviceRecord& r = records[i];
    std::vector<double>& ends = lane_end[{r.device, r.stream}];
    size_t l = 0;
    while (l < ends.size() && ends[l] > r.ts) ++l;
    if (l == ends.size()) ends.push_back(0);
    ends[std::min<size_t>(l, kLanes - 1)] = r.ts + std::max(0.0, r.dur);
    lane[i] = static_cast<int>(std::min<size_t>(l, kLanes - 1));
  }
  std::vector<Event> flows;
  for (size_t ri = 0; ri < records.size(); ++ri) {
    const DeviceRecord& r = records[ri];
    Event e{'X'};
    e.track = r.name;
    e.cat = r.cat;
    e.ts = r.ts;
    e.dur = std::max(0.0, r.dur);
    e.pid = kDevicePid + r.device;
    e.tid = static_cast<int>(r.stream) * kLanes + lane[ri];
    auto l = r.correlation ? launch_at.find(r.correlation) : launch_at.end();
    if (l != launch_at.end()) {
      e.args.push_back({"correlation", static_cast<int64_t>(r.correlation)});
      if (const Event* op = innermost(l->second)) {
        e.op = op->name;
        Event start{'s', "launch"};
        start.cat = "ac2g";
        start.ts = l->second;
        start.tid = op->tid;
        start.args.push_back({"id", static_cast<int64_t>(r.correlation)});
        Event end = start;
        end.ph = 'f';
        end.ts = e.ts;
        end.pid = e.pid;
        end.tid = e.tid;
        flows.push_back(std::move(start));
        flows.push_back(std::move(end));
      }
    }
    s.events.push_back(std::move(e));
  }
  for (Event& f : flows) s.events.push_back(std::move(f));
}

void Range::end() {
  State& s = state();
  const double t = since_start_us(s);
  std::lock_guard<std::mutex> g(s.mu);
  Event e{'X', name_};
  e.cat = cat_;
  e.ts = begin_;
  e.dur = t - begin_;
  e.tid = tid_of(s);
  s.events.push_back(std::move(e));
}

void instant(const char* name, const char* cat, std::initializer_list<std::pair<const char*, int64_t>> args) {
  if (!enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  Event e{'i', name};
  e.cat = cat;
  e.ts = since_start_us(s);
  e.tid = tid_of(s);
  e.args.assign(args.begin(), args.end());
  s.events.push_back(std::move(e));
}

void counter(const std::string& track, const std::pair<const char*, int64_t>* series, size_t n) {
  if (!enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  Event e{'C'};
  e.track = track;
  e.cat = "memory";
  e.ts = since_start_us(s);
  e.tid = tid_of(s);
  e.args.assign(series, series + n);
  s.events.push_back(std::move(e));
}

void counter(const std::string& track, std::initializer_list<std::pair<const char*, int64_t>> series) {
  counter(track, series.begin(), series.size());
}

std::string chrome_trace_json() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  const int pid = static_cast<int>(getpid());
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [id, tid] : s.tids)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", {{"name", tid == 0 ? "main" : "thread " + std::to_string(tid)}}}});
  std::set<std::pair<int, int>> device_tracks;
  for (const Event& e : s.events)
    if (e.pid >= 0 && e.ph == 'X') device_tracks.insert({e.pid, e.tid});
  for (const auto& [dpid, track] : device_tracks) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", dpid},
                      {"tid", track},
                      {"args", {{"name", "cuda:" + std::to_string(dpid - kDevicePid)}}}});
    const int stream = track / kLanes, lane = track % kLanes;
    events.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", dpid},
         {"tid", track},
         {"args",
          {{"name", "stream " + std::to_string(stream) + (lane ? ", overlapping " + std::to_string(lane) : "")}}}});
  }
  for (const Event& e : s.events) {
    nlohmann::json j = {
        {"ph", std::string(1, e.ph)}, {"cat", e.cat}, {"ts", e.ts}, {"pid", e.pid >= 0 ? e.pid : pid}, {"tid", e.tid}};
    j["name"] = e.ph == 'C' || (e.ph == 'X' && e.pid >= 0) ? e.track : std::string(e.name);
    if (e.ph == 'X') j["dur"] = e.dur;
    if (e.ph == 'i') j["s"] = "t";
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [k, v] : e.args) args[k] = v;
    if (e.ph == 's' || e.ph == 'f') {
      j["id"] = args["id"];
      args.erase("id");
      if (e.ph == 'f') j["bp"] = "e";
    }
    if (!e.op.empty()) args["op"] = e.op;
    if (!args.empty()) j["args"] = std::move(args);
    events.push_back(std::move(j));
  }
  return nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

void export_chrome_trace(const std::string& path) {
  const std::string text = chrome_trace_json();
  write_file_atomically(path, [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

std::string validate_chrome_trace(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return "not JSON";
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) return "no traceEvents array";
  struct Open {
    double end;
    std::string name;
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<double, const nlohmann::json*>>> ranges;
  std::map<std::pair<int64_t, int64_t>, std::vector<std::string>> begun;  // B/E stacks per thread
  std::map<std::string, double> last_counter;
  std::map<std::string, double> flow_start;  // flow id -> its start's ts
  const auto& evs = j["traceEvents"];
  for (size_t i = 0; i < evs.size(); ++i) {
    const auto& e = evs[i];
    const std::string where = "event " + std::to_string(i);
    for (const char* k : {"name", "ph", "pid", "tid"})
      if (!e.contains(k)) return where + " has no \"" + k + "\"";
    const std::string ph = e["ph"].get<std::string>();
    if (ph == "M") continue;
    if (!e.contains("ts") || !e["ts"].is_number()) return where + " (" + e["name"].dump() + ") has no numeric ts";
    const double ts = e["ts"].get<double>();
    const auto thread = std::make_pair(e["pid"].get<int64_t>(), e["tid"].get<int64_t>());
    if (ph == "X") {
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0)
        return where + " (" + e["name"].dump() + ") is a range without dur >= 0";
      ranges[thread].emplace_back(ts, &e);
    } else if (ph == "B") {
      begun[thread].push_back(e["name"].get<std::string>());
    } else if (ph == "E") {
      auto& st = begun[thread];
      if (st.empty()) return where + " ends " + e["name"].dump() + " that never began";
      st.pop_back();
    } else if (ph == "C") {
      if (!e.contains("args") || !e["args"].is_object() || e["args"].empty())
        return where + " (" + e["name"].dump() + ") is a counter without series";
      for (const auto& [k, v] : e["args"].items())
        if (!v.is_number()) return where + " counter series \"" + k + "\" is not a number";
      const std::string track = e["name"].get<std::string>() + "@" + std::to_string(thread.first);
      auto it = last_counter.find(track);
      if (it != last_counter.end() && ts < it->second)
        return where + " (" + e["name"].dump() + ") goes back in time on its track";
      last_counter[track] = ts;
    } else if (ph == "s" || ph == "f") {
      if (!e.contains("id")) return where + " (" + e["name"].dump() + ") is a flow without an id";
      const std::string id = e["id"].dump();
      if (ph == "s")
        flow_start[id] = ts;
      else if (!flow_start.count(id) || ts < flow_start[id] - 1e-3)
        return where + " ends flow " + id + " that did not start before it";
    } else if (ph != "i" && ph != "I") {
      return where + " has an unknown ph \"" + ph + "\"";
    }
  }
  for (const auto& [thread, st] : begun)
    if (!st.empty()) return "range \"" + st.back() + "\" began and never ended";
  // Ranges on one thread nest: sorted by start (the longer first on a tie), each starts after the
  // enclosing one ends or ends within it. A slack of 1e-3 us absorbs the JSON's rounding.
  for (auto& [thread, rs] : ranges) {
    std::stable_sort(rs.begin(), rs.end(), [](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first < b.first;
      return (*a.second)["dur"].template get<double>() > (*b.second)["dur"].template get<double>();
    });
    std::vector<Open> stack;
    for (const auto& [ts, e] : rs) {
      const double end = ts + (*e)["dur"].get<double>();
      while (!stack.empty() && ts >= stack.back().end - 1e-3) stack.pop_back();
      if (!stack.empty() && end > stack.back().end + 1e-3)
        return "range " + (*e)["name"].dump() + " overlaps \"" + stack.back().name + "\" without nesting in it";
      stack.push_back({end, (*e)["name"].get<std::string>()});
    }
  }
  return "";
}

}  // namespace mg::profiler
