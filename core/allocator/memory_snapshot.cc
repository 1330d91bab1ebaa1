#include "core/allocator/memory_snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/enum_name.h"
#include "core/error.h"

namespace mg::allocator {
namespace {

thread_local std::string tls_context;
thread_local std::uint32_t tls_context_id = 0;

// Interned context strings, shared by all threads. A deque never moves its elements, so
// name() can hand out references; each thread keeps a cache so that opening a scope it has
// seen before takes no lock.
struct ContextTable {
  std::mutex mutex;
  std::deque<std::string> names{std::string()};  // id 0 = no context
  std::unordered_map<std::string, std::uint32_t> ids;
};

ContextTable& context_table() {
  static ContextTable* table = new ContextTable;  // never destroyed: ids outlive statics
  return *table;
}

std::uint32_t intern_context(const std::string& s) {
  if (s.empty()) return 0;
  thread_local std::unordered_map<std::string, std::uint32_t> cache;
  if (auto it = cache.find(s); it != cache.end()) return it->second;
  ContextTable& t = context_table();
  std::uint32_t id;
  {
    std::lock_guard lock(t.mutex);
    auto [it, inserted] = t.ids.try_emplace(s, static_cast<std::uint32_t>(t.names.size()));
    if (inserted) t.names.push_back(s);
    id = it->second;
  }
  cache.emplace(s, id);
  return id;
}

std::string hex(std::uintptr_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// Same op, same hue, so one layer's tensors read as one band; lightness varies per allocation
// so neighbours stay distinguishable.
std::string color_for(const std::string& context, std::size_t index) {
  const std::size_t h = std::hash<std::string>{}(context) % 360;
  const int light = 45 + static_cast<int>((index * 7) % 25);
  return "hsl(" + std::to_string(h) + ",65%," + std::to_string(light) + "%)";
}

// Ticks at 1/2/5 x 10^k of a binary unit, so labels read "40.00 MiB", not "123.20 MiB".
double nice_step(double raw) {
  double unit = 1;
  for (double u : {1024.0, 1048576.0, 1073741824.0, 1099511627776.0}) {
    if (raw >= u) unit = u;
  }
  const double r = std::max(raw / unit, 1e-9);
  const double p = std::pow(10.0, std::floor(std::log10(r)));
  const double m = r / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p * unit;
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary);
  MG_CHECK(out.good(), IOError, what, ": cannot open '", path, "' for writing");
  out << text;
  out.close();
  MG_CHECK(out.good(), IOError, what, ": failed writing '", path, "'");
}

// One allocation's band in the stacked timeline: its bottom offset changes as blocks below it
// are freed, which is what makes the picture a stack rather than an address map.
struct Shape {
  std::uintptr_t addr;
  std::size_t size;
  std::string context;
  StreamId stream;
  std::size_t start;
  std::size_t end = SIZE_MAX;                                // still live at the end of the history
  std::vector<std::pair<std::size_t, std::size_t>> offsets;  // (step, bottom) from step on
};

}  // namespace

const char* to_string(BlockState state) {
  return enum_name(state, {"active_allocated", "active_pending_free", "inactive"});
}

const char* to_string(TraceAction action) {
  return enum_name(action, {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                            "segment_unmap", "oom"});
}

AllocationContext::AllocationContext(const std::string& name)
    : previous_length_(tls_context.size()), previous_id_(tls_context_id) {
  if (!tls_context.empty()) tls_context += '/';
  tls_context += name;
  tls_context_id = intern_context(tls_context);
}

AllocationContext::~AllocationContext() {
  tls_context.resize(previous_length_);
  tls_context_id = previous_id_;
}

const std::string& AllocationContext::current() { return tls_context; }

std::uint32_t AllocationContext::current_id() { return tls_context_id; }

const std::string& AllocationContext::name(std::uint32_t id) {
  ContextTable& t = context_table();
  std::lock_guard lock(t.mutex);
  return id < t.names.size() ? t.names[id] : t.names[0];
}

std::string snapshot_to_json(const MemorySnapshot& snap, int indent) {
  using nlohmann::json;
  json segments = json::array();
  for (const SegmentInfo& s : snap.segments) {
    json blocks = json::array();
    for (const BlockInfo& b : s.blocks) {
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested_size", b.requested_size},
                        {"state", to_string(b.state)},
                        {"context", b.context}});
    }
    segments.push_back({{"device", snap.device},
                        {"address", s.address},
                        {"address_hex", hex(s.address)},
                        {"total_size", s.total_size},
                        {"allocated_size", s.allocated_size},
                        {"active_size", s.active_size},
                        {"requested_size", s.requested_size},
                        {"stream", s.stream},
                        {"segment_type", s.is_small ? "small" : "large"},
                        {"expandable", s.expandable},
                        {"blocks", std::move(blocks)}});
  }
  json traces = json::array();
  for (const TraceEntry& e : snap.history) {
    traces.push_back({{"action", to_string(e.action)},
                      {"addr", e.address},
                      {"size", e.size},
                      {"stream", e.stream},
                      {"seq", e.seq},
                      {"time_ns", e.time_ns},
                      {"context", e.context}});
  }
  json stats = json::object();
  for (const auto& [k, v] : snap.stats) stats[k] = v;
  json root = {{"device", snap.device},
               {"device_name", snap.device_name},
               {"segments", std::move(segments)},
               {"device_traces", std::move(traces)},
               {"history_dropped", snap.history_dropped},
               {"stats", std::move(stats)}};
  return root.dump(indent);
}

void write_snapshot_json(const MemorySnapshot& snapshot, const std::string& path) {
  write_file(path, snapshot_to_json(snapshot), "write_snapshot_json");
}

std::string timeline_html(const MemorySnapshot& snap) {
  const auto& hist = snap.history;
  // Pass 1: frees of blocks allocated before the history began, and blocks still live that the
  // history never saw, become bands that start at step 0 so the stack heights are true.
  std::vector<Shape> shapes;
  {
    std::set<std::uintptr_t> live;
    for (const TraceEntry& e : hist) {
      if (e.action == TraceAction::kAlloc) live.insert(e.address);
      if (e.action == TraceAction::kFreeCompleted && live.erase(e.address) == 0) {
        shapes.push_back(Shape{e.address, e.size, e.context + " (before history)", e.stream, 0});
      }
    }
    for (const SegmentInfo& s : snap.segments) {
      for (const BlockInfo& b : s.blocks) {
        if (b.state != BlockState::kInactive && !live.count(b.address)) {
          shapes.push_back(Shape{b.address, b.size, b.context + " (before history)", s.stream, 0});
        }
      }
    }
  }
  // Pass 2: replay, keeping the live stack in allocation order.
  std::vector<std::size_t> stack;  // indices into shapes, bottom first
  std::size_t top = 0, max_total = 0, step = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    shapes[i].offsets.push_back({0, top});
    top += shapes[i].size;
    stack.push_back(i);
  }
  max_total = top;
  std::int64_t reserved_delta = 0;
  std::vector<std::pair<std::size_t, std::int64_t>> reserved_points;  // (step, delta so far)
  std::vector<std::pair<std::size_t, const TraceEntry*>> ooms;
  for (const TraceEntry& e : hist) {
    switch (e.action) {
      case TraceAction::kAlloc: {
        ++step;
        shapes.push_back(Shape{e.address, e.size, e.context, e.stream, step});
        shapes.back().offsets.push_back({step, top});
        stack.push_back(shapes.size() - 1);
        top += e.size;
        max_total = std::max(max_total, top);
        break;
      }
      case TraceAction::kFreeCompleted: {
        ++step;
        auto it =
            std::find_if(stack.rbegin(), stack.rend(), [&](std::size_t i) { return shapes[i].addr == e.address; });
        if (it == stack.rend()) break;
        auto pos = std::next(it).base();
        Shape& gone = shapes[*pos];
        gone.end = step;
        for (auto above = std::next(pos); above != stack.end(); ++above) {
          Shape& s = shapes[*above];
          s.offsets.push_back({step, s.offsets.back().second - gone.size});
        }
        top -= gone.size;
        stack.erase(pos);
        break;
      }
      case TraceAction::kSegmentAlloc:
      case TraceAction::kSegmentMap:
        reserved_delta += static_cast<std::int64_t>(e.size);
        reserved_points.push_back({step, reserved_delta});
        break;
      case TraceAction::kSegmentFree:
      case TraceAction::kSegmentUnmap:
        reserved_delta -= static_cast<std::int64_t>(e.size);
        reserved_points.push_back({step, reserved_delta});
        break;
      case TraceAction::kOom:
        ooms.push_back({step, &e});
        break;
      case TraceAction::kFreeRequested:
        break;
    }
  }
  const std::size_t steps = std::max<std::size_t>(step, 1);
  auto stat = [&](const std::string& k) {
    auto it = snap.stats.find(k);
    return it == snap.stats.end() ? std::int64_t{0} : it->second;
  };
  // Reserved before the history began = reserved now minus what the history added.
  const std::int64_t reserved_now = stat("reserved_bytes.all.current");
  const std::int64_t reserved_base = std::max<std::int64_t>(0, reserved_now - reserved_delta);
  std::int64_t reserved_max = reserved_base;
  for (auto& [s, d] : reserved_points) reserved_max = std::max(reserved_max, reserved_base + d);
  const double ymax =
      static_cast<double>(std::max<std::int64_t>({static_cast<std::int64_t>(max_total), reserved_max, 1}));

  const double W = 1100, H = 420, L = 90, T = 20;
  auto X = [&](std::size_t s) { return L + W * static_cast<double>(s) / static_cast<double>(steps); };
  auto Y = [&](double v) { return T + H - H * v / ymax; };

  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << num(L + W + 20) << "' height='" << num(T + H + 50)
      << "' font-family='sans-serif' font-size='11'>\n";
  svg << "<rect x='" << num(L) << "' y='" << num(T) << "' width='" << num(W) << "' height='" << num(H)
      << "' fill='#fafafa' stroke='#ccc'/>\n";
  const double ystep = nice_step(ymax / 5.0);
  for (double v = 0; v <= ymax * 1.0001; v += ystep) {
    svg << "<line x1='" << num(L) << "' x2='" << num(L + W) << "' y1='" << num(Y(v)) << "' y2='" << num(Y(v))
        << "' stroke='#e4e4e4'/><text x='" << num(L - 6) << "' y='" << num(Y(v) + 4) << "' text-anchor='end'>"
        << format_bytes(static_cast<std::uint64_t>(v)) << "</text>\n";
  }
  for (int i = 0; i <= 10; ++i) {
    const std::size_t s = steps * i / 10;
    svg << "<text x='" << num(X(s)) << "' y='" << num(T + H + 16) << "' text-anchor='middle'>" << s << "</text>\n";
  }
  svg << "<text x='" << num(L + W / 2) << "' y='" << num(T + H + 38)
      << "' text-anchor='middle'>allocation / free events</text>\n";
  std::size_t hidden = 0;
  std::map<std::string, std::pair<std::size_t, std::string>> legend;  // context -> (bytes, color)
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const std::size_t end = s.end == SIZE_MAX ? steps : s.end;
    if (H * static_cast<double>(s.size) / ymax < 0.3) {
      ++hidden;  // thinner than a pixel: still stacked, just not drawn
      continue;
    }
    const std::string color = color_for(s.context, i);
    auto& lg = legend[s.context];
    lg.first += s.size;
    if (lg.second.empty()) lg.second = color_for(s.context, 0);
    std::ostringstream bottom, upper;
    std::vector<std::pair<double, double>> pts;  // (x, bottom) along the band
    for (std::size_t k = 0; k < s.offsets.size(); ++k) {
      const std::size_t next = k + 1 < s.offsets.size() ? s.offsets[k + 1].first : end;
      pts.push_back({X(s.offsets[k].first), static_cast<double>(s.offsets[k].second)});
      pts.push_back({X(next), static_cast<double>(s.offsets[k].second)});
    }
    svg << "<polygon fill='" << color << "' points='";
    for (auto& [x, b] : pts) svg << num(x) << "," << num(Y(b)) << " ";
    for (auto it = pts.rbegin(); it != pts.rend(); ++it) {
      svg << num(it->first) << "," << num(Y(it->second + static_cast<double>(s.size))) << " ";
    }
    svg << "'><title>" << escape_html(s.context.empty() ? "(no context)" : s.context) << ": " << format_bytes(s.size)
        << " at " << hex(s.addr) << ", stream " << s.stream << ", events " << s.start << "-"
        << (s.end == SIZE_MAX ? std::string("live") : std::to_string(s.end)) << "</title></polygon>\n";
  }
  // Reserved bytes as a step line: the gap between it and the stack is cached memory.
  svg << "<polyline fill='none' stroke='#c00' stroke-width='1.5' stroke-dasharray='5,3' points='" << num(X(0)) << ","
      << num(Y(static_cast<double>(reserved_base))) << " ";
  std::int64_t last = reserved_base;
  for (auto& [s, d] : reserved_points) {
    svg << num(X(s)) << "," << num(Y(static_cast<double>(last))) << " " << num(X(s)) << ","
        << num(Y(static_cast<double>(reserved_base + d))) << " ";
    last = reserved_base + d;
  }
  svg << num(X(steps)) << "," << num(Y(static_cast<double>(last))) << "'><title>reserved bytes</title></polyline>\n";
  for (auto& [s, e] : ooms) {
    svg << "<line x1='" << num(X(s)) << "' x2='" << num(X(s)) << "' y1='" << num(T) << "' y2='" << num(T + H)
        << "' stroke='#f00' stroke-width='2'><title>OOM: asked " << format_bytes(e->size)
        << (e->context.empty() ? "" : " for " + escape_html(e->context)) << "</title></line>\n";
  }
  svg << "</svg>\n";

  // Segment map: one bar per segment, blocks coloured by state.
  std::size_t max_seg = 1;
  for (const SegmentInfo& s : snap.segments) max_seg = std::max(max_seg, s.total_size);
  const std::size_t rows = std::min<std::size_t>(snap.segments.size(), 400);
  std::ostringstream seg;
  const double SW = 900, SL = 260, RH = 16;
  seg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << num(SL + SW + 20) << "' height='"
      << num(RH * static_cast<double>(rows) + 10) << "' font-family='monospace' font-size='11'>\n";
  for (std::size_t r = 0; r < rows; ++r) {
    const SegmentInfo& s = snap.segments[r];
    const double y = RH * static_cast<double>(r) + 4;
    seg << "<text x='0' y='" << num(y + 11) << "'>" << hex(s.address) << " " << format_bytes(s.total_size)
        << (s.is_small ? " small" : " large") << (s.expandable ? " exp" : "") << " s" << s.stream << "</text>\n";
    for (const BlockInfo& b : s.blocks) {
      const double x = SL + SW * static_cast<double>(b.address - s.address) / static_cast<double>(max_seg);
      const double w = std::max(0.5, SW * static_cast<double>(b.size) / static_cast<double>(max_seg));
      const std::string fill = b.state == BlockState::kInactive            ? "#dddddd"
                               : b.state == BlockState::kActivePendingFree ? "#f0a030"
                                                                           : color_for(b.context, 0);
      seg << "<rect x='" << num(x) << "' y='" << num(y) << "' width='" << num(w) << "' height='" << num(RH - 3)
          << "' fill='" << fill << "' stroke='#fff' stroke-width='0.5'><title>" << to_string(b.state) << " "
          << format_bytes(b.size) << " at " << hex(b.address)
          << (b.context.empty() ? "" : " (" + escape_html(b.context) + ")") << "</title></rect>\n";
    }
  }
  seg << "</svg>\n";

  std::vector<std::pair<std::size_t, std::string>> order;
  for (auto& [ctx, v] : legend) order.push_back({v.first, ctx});
  std::sort(order.rbegin(), order.rend());
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>memgrad memory timeline, device " << snap.device
       << "</title>\n<style>body{font-family:sans-serif;margin:20px;color:#222}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;"
          "text-align:right}.sw{display:inline-block;width:12px;height:12px;margin-right:4px}"
          "</style></head><body>\n";
  html << "<h2>memgrad memory timeline: device " << snap.device << " (" << escape_html(snap.device_name) << ")</h2>\n";
  html << "<table><tr><th></th><th>current</th><th>peak</th></tr>\n";
  for (const char* k : {"allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes"}) {
    html << "<tr><td style='text-align:left'>" << k << "</td><td>"
         << format_bytes(static_cast<std::uint64_t>(stat(std::string(k) + ".all.current"))) << "</td><td>"
         << format_bytes(static_cast<std::uint64_t>(stat(std::string(k) + ".all.peak"))) << "</td></tr>\n";
  }
  html << "</table>\n<p>OOMs: " << stat("num_ooms") << " &middot; alloc retries: " << stat("num_alloc_retries")
       << " &middot; largest free block: "
       << format_bytes(static_cast<std::uint64_t>(stat("fragmentation.largest_free_block")))
       << " &middot; fragmentation ratio: " << num(stat("fragmentation.ratio_ppm") / 1e4) << "%</p>\n";
  html << "<h3>Live allocations over time</h3>\n<p>Each band is one allocation, stacked in "
          "allocation order; the dashed red line is reserved memory; red verticals are OOMs. "
          "Hover for details. "
       << hist.size() << " history entries";
  if (snap.history_dropped) html << " (" << snap.history_dropped << " older ones dropped)";
  if (hidden) html << "; " << hidden << " allocations too thin to draw";
  html << ".</p>\n" << svg.str() << "<p>";
  for (std::size_t i = 0; i < std::min<std::size_t>(order.size(), 16); ++i) {
    html << "<span class='sw' style='background:" << legend[order[i].second].second << "'></span>"
         << escape_html(order[i].second.empty() ? "(no context)" : order[i].second) << " ("
         << format_bytes(order[i].first) << ") &nbsp; ";
  }
  html << "</p>\n<h3>Segments now</h3>\n<p>" << snap.segments.size()
       << " segments; grey = free cached, orange = freed but waiting for another stream.";
  if (rows < snap.segments.size()) html << " First " << rows << " shown.";
  html << "</p>\n" << seg.str() << "</body></html>\n";
  return html.str();
}

void write_timeline_html(const MemorySnapshot& snapshot, const std::string& path) {
  write_file(path, timeline_html(snapshot), "write_timeline_html");
}

}  // namespace mg::allocator
