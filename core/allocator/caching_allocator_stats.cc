// The reporting and settings half of CachingAllocator: stats under PyTorch's names,
// fragmentation, the summary table, snapshots, the OOM message, limits and options, invariants.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "core/allocator/caching_allocator.h"
#include "core/error.h"
#include "core/profiler.h"

namespace mg::allocator {
namespace {

const char* const kPoolNames[3] = {"all", "small_pool", "large_pool"};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

void reset_peak(Stat& s) { s.peak = s.current; }
void reset_accumulated(Stat& s) { s.allocated = s.freed = 0; }

template <class F>
void for_each_stat_array(DeviceStats& s, F f) {
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
                       &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) f(st);
  }
  f(s.oversize_allocations);
  f(s.oversize_segments);
}

}  // namespace

std::size_t CachingAllocator::read_all_pools(const StatArray& stat, bool peak) const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(peak ? stat[kAllPools].peak : stat[kAllPools].current);
}
std::size_t CachingAllocator::memory_allocated() const { return read_all_pools(stats_.allocated_bytes, false); }
std::size_t CachingAllocator::max_memory_allocated() const { return read_all_pools(stats_.allocated_bytes, true); }
std::size_t CachingAllocator::memory_reserved() const { return read_all_pools(stats_.reserved_bytes, false); }
std::size_t CachingAllocator::max_memory_reserved() const { return read_all_pools(stats_.reserved_bytes, true); }

void CachingAllocator::reset_peak_memory_stats() {
  std::lock_guard lock(mutex_);
  allocated_hwm_ = std::max(allocated_hwm_, static_cast<std::size_t>(stats_.allocated_bytes[kAllPools].peak));
  for_each_stat_array(stats_, reset_peak);
}

void CachingAllocator::reset_accumulated_memory_stats() {
  std::lock_guard lock(mutex_);
  for_each_stat_array(stats_, reset_accumulated);
  stats_.num_alloc_retries = stats_.num_ooms = stats_.num_sync_all_streams = stats_.num_unmap_stream_syncs = 0;
  stats_.num_device_alloc = stats_.num_device_free = 0;
}

DeviceStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

FragmentationInfo CachingAllocator::fragmentation_locked() const {
  FragmentationInfo f;
  for (const BlockPool* pool : {&small_pool_, &large_pool_}) {
    for (const Block* b : pool->blocks) {
      f.largest_free_block = std::max(f.largest_free_block, b->size);
      f.free_cached += b->size;
    }
  }
  f.reserved_unallocated =
      static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current - stats_.allocated_bytes[kAllPools].current);
  f.ratio =
      f.free_cached == 0 ? 0.0 : 1.0 - static_cast<double>(f.largest_free_block) / static_cast<double>(f.free_cached);
  return f;
}

FragmentationInfo CachingAllocator::fragmentation() const {
  std::lock_guard lock(mutex_);
  return fragmentation_locked();
}

std::map<std::string, std::int64_t> CachingAllocator::memory_stats_locked() const {
  std::map<std::string, std::int64_t> m;
  auto put = [&m](const std::string& prefix, const Stat& s) {
    m[prefix + ".current"] = s.current;
    m[prefix + ".peak"] = s.peak;
    m[prefix + ".allocated"] = s.allocated;
    m[prefix + ".freed"] = s.freed;
  };
  const std::pair<const char*, const StatArray*> arrays[] = {
      {"allocation", &stats_.allocation},
      {"segment", &stats_.segment},
      {"active", &stats_.active},
      {"inactive_split", &stats_.inactive_split},
      {"allocated_bytes", &stats_.allocated_bytes},
      {"reserved_bytes", &stats_.reserved_bytes},
      {"active_bytes", &stats_.active_bytes},
      {"inactive_split_bytes", &stats_.inactive_split_bytes},
      {"requested_bytes", &stats_.requested_bytes},
  };
  for (const auto& [name, arr] : arrays) {
    for (int i = 0; i < 3; ++i) put(std::string(name) + "." + kPoolNames[i], (*arr)[i]);
  }
  put("oversize_allocations", stats_.oversize_allocations);
  put("oversize_segments", stats_.oversize_segments);
  m["num_alloc_retries"] = stats_.num_alloc_retries;
  m["num_ooms"] = stats_.num_ooms;
  m["num_device_alloc"] = stats_.num_device_alloc;
  m["num_device_free"] = stats_.num_device_free;
  m["num_sync_all_streams"] = stats_.num_sync_all_streams;
  m["num_unmap_stream_syncs"] = stats_.num_unmap_stream_syncs;
  // Captured graphs' private pools: how many live, and the segments held by any pool (released
  // pools' segments included until their last block is freed).
  std::int64_t pool_reserved = 0;
  for (const auto& [addr, seg] : segments_)
    if (is_pool_key(seg->stream)) pool_reserved += static_cast<std::int64_t>(seg->size);
  m["graph_pools"] = static_cast<std::int64_t>(pool_holds_.size());
  m["graph_pool_reserved_bytes"] = pool_reserved;
  m["max_split_size"] = max_split_size_ == SIZE_MAX ? -1 : static_cast<std::int64_t>(max_split_size_);
  m["memory_limit"] = static_cast<std::int64_t>(limit_);
  const FragmentationInfo f = fragmentation_locked();
  m["fragmentation.largest_free_block"] = static_cast<std::int64_t>(f.largest_free_block);
  m["fragmentation.free_cached"] = static_cast<std::int64_t>(f.free_cached);
  m["fragmentation.reserved_unallocated"] = static_cast<std::int64_t>(f.reserved_unallocated);
  m["fragmentation.ratio_ppm"] = std::llround(f.ratio * 1e6);
  return m;
}

std::map<std::string, std::int64_t> CachingAllocator::memory_stats() const {
  std::lock_guard lock(mutex_);
  return memory_stats_locked();
}

std::string CachingAllocator::memory_summary() const {
  std::lock_guard lock(mutex_);
  constexpr int kWidth = 75;
  const std::string rule = "|" + std::string(kWidth, '-') + "|\n";
  const std::string thick = "|" + std::string(kWidth, '=') + "|\n";
  auto centered = [&](const std::string& s) {
    const int pad = std::max(0, kWidth - static_cast<int>(s.size()));
    return "|" + std::string(pad / 2, ' ') + s + std::string(pad - pad / 2, ' ') + "|\n";
  };
  auto cell = [](const std::string& s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), " %10s ", s.c_str());
    return std::string(buf);
  };
  auto row = [&](const std::string& label, const Stat& s, bool bytes) {
    auto fmt = [bytes](std::int64_t v) {
      return bytes ? format_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0))) : std::to_string(v);
    };
    char buf[32];
    std::snprintf(buf, sizeof(buf), " %-21s ", label.c_str());
    return "|" + std::string(buf) + "|" + cell(fmt(s.current)) + "|" + cell(fmt(s.peak)) + "|" +
           cell(fmt(s.allocated)) + "|" + cell(fmt(s.freed)) + "|\n";
  };
  auto section = [&](const std::string& label, const StatArray& a, bool bytes) {
    return row(label, a[kAllPools], bytes) + row("      from large pool", a[kLargePool], bytes) +
           row("      from small pool", a[kSmallPool], bytes) + rule;
  };
  std::size_t free_bytes = 0, total = 0;
  device_.mem_get_info(&free_bytes, &total);
  const FragmentationInfo f = fragmentation_locked();

  std::string out = thick;
  out += centered("memgrad CUDA memory summary, device ID " + std::to_string(device_index_));
  out += rule;
  out += centered("CUDA OOMs: " + std::to_string(stats_.num_ooms) +
                  "    |    device alloc retries: " + std::to_string(stats_.num_alloc_retries));
  out += thick;
  out += "|        Metric         |" + cell("Cur Usage") + "|" + cell("Peak Usage") + "|" + cell("Tot Alloc") + "|" +
         cell("Tot Freed") + "|\n";
  out += rule;
  out += section("Allocated memory", stats_.allocated_bytes, true);
  out += section("Active memory", stats_.active_bytes, true);
  out += section("Requested memory", stats_.requested_bytes, true);
  out += section("GPU reserved memory", stats_.reserved_bytes, true);
  out += section("Non-releasable memory", stats_.inactive_split_bytes, true);
  out += section("Allocations", stats_.allocation, false);
  out += section("Active allocs", stats_.active, false);
  out += section("GPU reserved segments", stats_.segment, false);
  out += section("Non-releasable allocs", stats_.inactive_split, false);
  out += row("Oversize allocations", stats_.oversize_allocations, false);
  out += row("Oversize GPU segments", stats_.oversize_segments, false);
  out += thick;
  out += centered("Fragmentation: largest free block " + format_bytes(f.largest_free_block) + ", free cached " +
                  format_bytes(f.free_cached) + ", ratio " + fixed(f.ratio, 3));
  out += centered("Reserved but unallocated: " + format_bytes(f.reserved_unallocated) +
                  "    Device: " + format_bytes(free_bytes) + " free of " + format_bytes(total));
  out += centered("Limit: " + (limit_ ? format_bytes(limit_) : std::string("none")) +
                  "    Expandable segments: " + (expandable_ ? "on" : "off") + "    max_split_size: " +
                  (max_split_size_ == SIZE_MAX ? std::string("unlimited") : format_bytes(max_split_size_)));
  out += centered(
      "reserved_slack: " + (reserved_slack_ < 0 ? std::string("off") : fixed(reserved_slack_, 3)) +
      "    segment_reuse_ratio: " + (segment_reuse_ratio_ == 0 ? std::string("off") : fixed(segment_reuse_ratio_, 1)));
  out += thick;
  return out;
}

MemorySnapshot CachingAllocator::snapshot_locked() const {
  MemorySnapshot snap;
  snap.device = device_index_;
  snap.device_name = device_.name();
  // Like PyTorch, an expandable segment shows up as one segment per run of mapped blocks, so
  // every listed segment is backed memory that its blocks tile exactly.
  for (const auto& [addr, seg] : segments_) {
    for (const Block* b = seg->head; b;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      SegmentInfo si;
      si.address = b->addr;
      si.stream = seg->stream;
      si.is_small = seg->small;
      si.expandable = seg->expandable;
      for (; b && b->mapped; b = b->next) {
        BlockInfo bi;
        bi.address = b->addr;
        bi.size = b->size;
        bi.requested_size = b->requested;
        bi.context = AllocationContext::name(b->context);
        bi.state = b->allocated         ? BlockState::kActiveAllocated
                   : b->event_count > 0 ? BlockState::kActivePendingFree
                                        : BlockState::kInactive;
        if (b->allocated) si.allocated_size += b->size;
        if (bi.state != BlockState::kInactive) si.active_size += b->size;
        si.requested_size += b->requested;
        si.total_size += b->size;
        si.blocks.push_back(std::move(bi));
      }
      snap.segments.push_back(std::move(si));
    }
  }
  snap.history.assign(history_.begin(), history_.end());
  snap.history_dropped = history_dropped_;
  snap.stats = memory_stats_locked();
  return snap;
}

MemorySnapshot CachingAllocator::snapshot() const {
  std::lock_guard lock(mutex_);
  return snapshot_locked();
}

void CachingAllocator::write_snapshot_json(const std::string& path) const {
  allocator::write_snapshot_json(snapshot(), path);
}

void CachingAllocator::write_timeline_html(const std::string& path) const {
  allocator::write_timeline_html(snapshot(), path);
}

void CachingAllocator::throw_oom(std::size_t bytes, std::size_t size, StreamId stream, bool limit_hit) {
  ++stats_.num_ooms;
  std::size_t free_bytes = 0, total = 0;
  device_.mem_get_info(&free_bytes, &total);
  const std::string& context = AllocationContext::current();
  if (history_enabled_) trace(TraceAction::kOom, free_bytes, bytes, stream, AllocationContext::current_id());
  const FragmentationInfo f = fragmentation_locked();
  const auto allocated = static_cast<std::size_t>(stats_.allocated_bytes[kAllPools].current);
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  std::ostringstream m;
  m << "CUDA out of memory. Tried to allocate " << format_bytes(bytes) << " (" << bytes << " bytes";
  if (size != bytes) m << ", rounded to " << size;
  m << ")";
  if (!context.empty()) m << " for '" << context << "'";
  m << " on device " << device_index_ << " (" << device_.name() << "), stream " << stream
    << ". Device: " << format_bytes(total) << " total, " << format_bytes(free_bytes)
    << " free. memgrad: " << format_bytes(allocated) << " allocated, " << format_bytes(reserved) << " reserved, "
    << format_bytes(f.reserved_unallocated) << " reserved but unallocated (largest free cached block "
    << format_bytes(f.largest_free_block) << ", fragmentation " << fixed(f.ratio, 2) << ").";
  const std::size_t used = total - std::min(total, free_bytes);
  if (used > reserved) {
    m << " " << format_bytes(used - reserved)
      << " of device memory is used outside this allocator (other processes, CUDA context).";
  }
  if (limit_ != 0) {
    m << " Memory limit: " << format_bytes(limit_);
    if (fraction_ > 0) m << " (set_memory_fraction(" << fixed(fraction_, 3) << "))";
    m << (limit_hit ? ", which this allocation would exceed." : ".");
  }
  if (size > total) {
    m << " The request alone is larger than the device's total memory.";
  } else if (limit_ != 0 && size > limit_) {
    m << " The request alone is larger than the memory limit.";
  } else if (f.reserved_unallocated >= size) {
    m << " Reserved but unallocated memory is at least the request: the cache is fragmented;"
         " try set_expandable_segments(true) (configure(\"expandable_segments:True\")).";
  }
  profiler::instant("out of memory", "allocator", {{"bytes", static_cast<int64_t>(bytes)}});
  throw OutOfMemoryError(m.str());
}

void CachingAllocator::set_memory_fraction(double fraction) {
  MG_CHECK(fraction > 0.0 && fraction <= 1.0, ValueError, "set_memory_fraction: fraction must be in (0, 1], got ",
           fraction);
  std::lock_guard lock(mutex_);
  std::size_t free_bytes = 0, total = 0;
  device_.mem_get_info(&free_bytes, &total);
  limit_ = std::max<std::size_t>(1, static_cast<std::size_t>(fraction * static_cast<double>(total)));
  fraction_ = fraction;
}

void CachingAllocator::set_memory_limit(std::size_t bytes) {
  MG_CHECK(bytes > 0, ValueError,
           "set_memory_limit: the limit must be > 0 bytes (use clear_memory_limit() to remove it)");
  std::lock_guard lock(mutex_);
  limit_ = bytes;
  fraction_ = 0.0;
}

void CachingAllocator::clear_memory_limit() {
  std::lock_guard lock(mutex_);
  limit_ = 0;
  fraction_ = 0.0;
}

std::size_t CachingAllocator::memory_limit() const {
  std::lock_guard lock(mutex_);
  return limit_;
}

void CachingAllocator::set_expandable_segments(bool enabled) {
  std::lock_guard lock(mutex_);
  expandable_ = enabled;
}

void CachingAllocator::set_reserved_slack(double slack) {
  MG_CHECK(!std::isnan(slack), ValueError, "set_reserved_slack: slack must be a number");
  std::lock_guard lock(mutex_);
  reserved_slack_ = slack;
}

void CachingAllocator::set_segment_reuse_ratio(double ratio) {
  MG_CHECK(ratio == 0.0 || ratio >= 1.0, ValueError, "set_segment_reuse_ratio: ratio must be 0 (off) or >= 1, got ",
           ratio);
  std::lock_guard lock(mutex_);
  segment_reuse_ratio_ = ratio;
}

void CachingAllocator::set_max_split_size(std::size_t bytes) {
  MG_CHECK(bytes > kLargeBuffer, ValueError, "set_max_split_size: must be > ", format_bytes(kLargeBuffer),
           " (the 1-10 MiB segment size), got ", format_bytes(bytes));
  std::lock_guard lock(mutex_);
  max_split_size_ = bytes;
}

void CachingAllocator::record_history(bool enabled, std::size_t max_entries) {
  MG_CHECK(!enabled || max_entries > 0, ValueError, "record_history: max_entries must be > 0");
  std::lock_guard lock(mutex_);
  history_enabled_ = enabled;
  history_max_ = max_entries;
  if (!enabled) {
    history_.clear();
    history_dropped_ = 0;
  }
  while (history_.size() > history_max_) {
    history_.pop_front();
    ++history_dropped_;
  }
}

void CachingAllocator::configure(const std::string& config) {
  std::size_t pos = 0;
  while (pos < config.size()) {
    std::size_t end = config.find(',', pos);
    if (end == std::string::npos) end = config.size();
    std::string item = config.substr(pos, end - pos);
    pos = end + 1;
    item.erase(std::remove_if(item.begin(), item.end(), [](unsigned char c) { return std::isspace(c) != 0; }),
               item.end());
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    MG_CHECK(colon != std::string::npos, ValueError, "CachingAllocator::configure: expected key:value, got '", item,
             "'");
    const std::string key = item.substr(0, colon), value = item.substr(colon + 1);
    char* rest = nullptr;
    if (key == "expandable_segments") {
      MG_CHECK(value == "True" || value == "False" || value == "true" || value == "false", ValueError,
               "CachingAllocator::configure: expandable_segments must be True or False, got '", value, "'");
      set_expandable_segments(value == "True" || value == "true");
    } else if (key == "reserved_slack" || key == "segment_reuse_ratio") {
      const double v = std::strtod(value.c_str(), &rest);
      MG_CHECK(*rest == '\0' && !value.empty(), ValueError, "CachingAllocator::configure: ", key,
               " must be a number, got '", value, "'");
      if (key == "reserved_slack") {
        set_reserved_slack(v);
      } else {
        set_segment_reuse_ratio(v);
      }
    } else if (key == "max_split_size_mb") {
      const double mb = std::strtod(value.c_str(), &rest);
      MG_CHECK(*rest == '\0' && !value.empty() && mb > 0, ValueError,
               "CachingAllocator::configure: max_split_size_mb must be a positive number, got '", value, "'");
      set_max_split_size(static_cast<std::size_t>(mb * 1024 * 1024));
    } else if (key == "per_process_memory_fraction") {
      const double fr = std::strtod(value.c_str(), &rest);
      MG_CHECK(*rest == '\0' && !value.empty(), ValueError,
               "CachingAllocator::configure: per_process_memory_fraction must be a number, got '", value, "'");
      set_memory_fraction(fr);
    } else {
      MG_THROW(ValueError, "CachingAllocator::configure: unknown option '", key,
               "' (known: expandable_segments, max_split_size_mb, per_process_memory_fraction, "
               "reserved_slack, segment_reuse_ratio)");
    }
  }
}

void CachingAllocator::check_invariants() const {
  std::lock_guard lock(mutex_);
  auto fail = [](const auto&... parts) { MG_THROW(Error, "check_invariants: ", parts...); };
  StatArray alloc_n{}, alloc_b{}, active_n{}, active_b{}, split_n{}, split_b{}, seg_n{}, seg_b{}, req_b{};
  auto add = [](StatArray& a, bool small, std::int64_t v) {
    a[kAllPools].current += v;
    a[small ? kSmallPool : kLargePool].current += v;
  };
  std::size_t pooled = 0, pending_events = 0, allocated_count = 0;
  std::uintptr_t prev_end = 0;
  for (const auto& [addr, seg] : segments_) {
    if (addr != seg->addr) fail("segment key mismatch");
    if (seg->addr < prev_end) fail("segments overlap at ", seg->addr);
    prev_end = seg->addr + (seg->expandable ? seg->va_size : seg->size);
    if (seg->size == 0) fail("empty segment at ", seg->addr);
    add(seg_n, seg->small, 1);
    add(seg_b, seg->small, static_cast<std::int64_t>(seg->size));
    std::uintptr_t cursor = seg->addr;
    std::size_t mapped = 0;
    const Block* prev = nullptr;
    for (const Block* b = seg->head; b; prev = b, b = b->next) {
      if (b->segment != seg.get() || b->prev != prev) fail("bad links at block ", b->addr);
      if (b->addr != cursor || b->size == 0) fail("blocks not contiguous at ", b->addr);
      if (b->size % kMinBlockSize != 0) fail("unaligned block size ", b->size);
      if (b->stream != seg->stream) fail("block stream differs from its segment's");
      cursor += b->size;
      if (b->mapped) {
        mapped += b->size;
      } else {
        if (!seg->expandable) fail("unmapped block in a fixed segment at ", b->addr);
        if (!b->is_free()) fail("unmapped block in use at ", b->addr);
        if ((b->addr - seg->addr) % seg->gran != 0 || b->size % seg->gran != 0) {
          fail("unmapped block not page-aligned at ", b->addr);
        }
        if (prev && !prev->mapped) fail("adjacent unmapped blocks at ", b->addr);
      }
      if (b->pooled() && prev && prev->pooled()) fail("adjacent free blocks at ", b->addr);
      auto found = pool_for(seg->small).blocks.find(const_cast<Block*>(b));
      const bool in_pool = found != pool_for(seg->small).blocks.end() && *found == b;
      if (in_pool != b->pooled()) fail("pool membership wrong for block ", b->addr);
      if (in_pool && b->pool_it != found) fail("stale pool iterator for block ", b->addr);
      if (b->allocated) {
        ++allocated_count;
        if (allocated_blocks_.find(b->addr) != b) fail("allocated block not indexed");
        add(alloc_n, seg->small, 1);
        add(alloc_b, seg->small, static_cast<std::int64_t>(b->size));
        add(req_b, seg->small, static_cast<std::int64_t>(b->requested));
      }
      if (!b->is_free()) {
        add(active_n, seg->small, 1);
        add(active_b, seg->small, static_cast<std::int64_t>(b->size));
      }
      if (!b->allocated && b->event_count > 0) pending_events += b->event_count;
      if (b->pooled()) {
        ++pooled;
        if (b->counted_split != (b->prev || b->next)) fail("inactive_split flag stale");
        if (b->prev || b->next) {
          add(split_n, seg->small, 1);
          add(split_b, seg->small, static_cast<std::int64_t>(b->size));
        }
      }
    }
    if (cursor != seg->addr + (seg->expandable ? seg->va_size : seg->size)) {
      fail("blocks don't cover segment ", seg->addr);
    }
    if (mapped != seg->size) fail("segment ", seg->addr, " says ", seg->size, " bytes mapped, blocks ", mapped);
  }
  for (const auto& [key, seg] : expandable_segments_) {
    auto it = segments_.find(seg->addr);
    if (it == segments_.end() || it->second.get() != seg || !seg->expandable || seg->small != key.first ||
        seg->stream != key.second) {
      fail("expandable segment index is stale");
    }
  }
  if (pooled != small_pool_.blocks.size() + large_pool_.blocks.size()) fail("stray pool entries");

  if (allocated_count != allocated_blocks_.size()) fail("stray allocated_blocks_ entries");
  std::size_t queued = 0;
  for (const auto& [s, q] : events_) queued += q.size();
  if (queued != pending_events) fail("event queue has ", queued, " entries, blocks expect ", pending_events);
  const std::pair<const char*, std::pair<const StatArray*, const StatArray*>> checks[] = {
      {"allocation", {&alloc_n, &stats_.allocation}},
      {"allocated_bytes", {&alloc_b, &stats_.allocated_bytes}},
      {"requested_bytes", {&req_b, &stats_.requested_bytes}},
      {"active", {&active_n, &stats_.active}},
      {"active_bytes", {&active_b, &stats_.active_bytes}},
      {"inactive_split", {&split_n, &stats_.inactive_split}},
      {"inactive_split_bytes", {&split_b, &stats_.inactive_split_bytes}},
      {"segment", {&seg_n, &stats_.segment}},
      {"reserved_bytes", {&seg_b, &stats_.reserved_bytes}},
  };
  for (const auto& [name, pair] : checks) {
    for (int i = 0; i < 3; ++i) {
      const Stat& s = (*pair.second)[i];
      if ((*pair.first)[i].current != s.current) {
        fail(name, ".", kPoolNames[i], ".current is ", s.current, ", blocks say ", (*pair.first)[i].current);
      }
      if (s.peak < s.current) fail(name, ".", kPoolNames[i], ".peak < current");
    }
  }
}

}  // namespace mg::allocator
