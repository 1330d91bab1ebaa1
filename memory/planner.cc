// Checkpoint planner. Cost model: a plain run keeps every segment's kept_bytes; a
// checkpointed run keeps only its output, and backward rebuilds its activations once (the
// largest such replay adds to the peak); each checkpointed segment costs one more forward.
#include "memory/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "autograd/recompute.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/random.h"

namespace mg::memory {

namespace {

void sync(const Tensor& t) {
  if (t.defined() && t.is_cuda()) cuda::synchronize(t.device().index);
}

struct Prefix {
  std::vector<int64_t> kept;
  std::vector<double> ms;
  explicit Prefix(const std::vector<SegmentProfile>& p) : kept(p.size() + 1, 0), ms(p.size() + 1, 0.0) {
    for (size_t i = 0; i < p.size(); ++i) {
      kept[i + 1] = kept[i] + p[i].kept_bytes;
      ms[i + 1] = ms[i] + p[i].forward_ms;
    }
  }
};

}  // namespace

std::vector<SegmentProfile> profile_segments(const std::vector<SegmentFn>& segments, const Tensor& sample,
                                             const std::vector<std::string>& names, int repeats) {
  MG_CHECK(!segments.empty(), ValueError, "profile_segments: no segments");
  MG_CHECK(sample.defined(), ValueError, "profile_segments: the sample is undefined");
  MG_CHECK(names.empty() || names.size() == segments.size(), ValueError, "profile_segments: ", names.size(),
           " names for ", segments.size(), " segments");
  MG_CHECK(repeats >= 1, ValueError, "profile_segments: repeats must be >= 1, got ", repeats);
  const Device dev = sample.device();
  GeneratorStateGuard rng;  // the segments' dropout draws; the caller's stream goes on unchanged
  std::vector<SegmentProfile> prof(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) prof[i].name = names.empty() ? "segment " + std::to_string(i) : names[i];
  {
    // Recorded pass: what each segment leaves alive for backward.
    EnableGradGuard grad(true);
    Tensor x = sample;
    sync(x);
    int64_t prev = memory_allocated(dev);
    for (size_t i = 0; i < segments.size(); ++i) {
      // Measured once the previous output is released: if this segment does not save its
      // input, that memory was never the previous segment's to keep.
      x = segments[i](x);
      sync(x);
      const int64_t now = memory_allocated(dev);
      prof[i].kept_bytes = now - prev;
      prev = now;
      prof[i].output_bytes = x.defined() ? x.nbytes() : 0;
    }
  }
  // Timed passes without recording (a replay's cost), median of `repeats` after a warm-up.
  NoGradGuard no_grad;
  std::vector<std::vector<double>> ms(segments.size());
  for (int r = 0; r <= repeats; ++r) {
    Tensor x = sample;
    for (size_t i = 0; i < segments.size(); ++i) {
      sync(x);
      const auto t0 = std::chrono::steady_clock::now();
      Tensor y = segments[i](x);
      sync(y);
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) ms[i].push_back(dt);
      x = y;
    }
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    prof[i].forward_ms = ms[i][ms[i].size() / 2];
  }
  return prof;
}

std::vector<bool> CheckpointPlan::segment_mask() const {
  std::vector<bool> m(bounds.empty() ? 0 : bounds.back(), false);
  for (size_t g = 0; g + 1 < bounds.size(); ++g)
    for (int64_t i = bounds[g]; i < bounds[g + 1]; ++i) m[i] = checkpointed[g];
  return m;
}

CheckpointPlan evaluate_plan(const std::vector<SegmentProfile>& profile, std::vector<int64_t> bounds,
                             std::vector<bool> checkpointed, std::string strategy) {
  const int64_t n = static_cast<int64_t>(profile.size());
  MG_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == n && checkpointed.size() + 1 == bounds.size(),
           ValueError, "evaluate_plan: bounds must run from 0 to ", n, " with one flag per run");
  const Prefix pre(profile);
  CheckpointPlan p;
  p.strategy = std::move(strategy);
  p.plain_bytes = pre.kept[n];
  p.plain_forward_ms = pre.ms[n];
  for (size_t g = 0; g + 1 < bounds.size(); ++g) {
    const int64_t a = bounds[g], b = bounds[g + 1];
    MG_CHECK(b > a, ValueError, "evaluate_plan: bounds must increase, got ", a, " then ", b);
    const int64_t run = pre.kept[b] - pre.kept[a];
    if (checkpointed[g]) {
      const int64_t out = profile[b - 1].output_bytes;
      p.stored_bytes += out;
      p.replay_bytes = std::max(p.replay_bytes, run - out);
      p.extra_forward_ms += pre.ms[b] - pre.ms[a];
    } else {
      p.stored_bytes += run;
    }
  }
  p.bounds = std::move(bounds);
  p.checkpointed = std::move(checkpointed);
  return p;
}

CheckpointPlan plan_none(const std::vector<SegmentProfile>& profile) {
  return evaluate_plan(profile, {0, static_cast<int64_t>(profile.size())}, {false}, "none");
}

CheckpointPlan plan_every_segment(const std::vector<SegmentProfile>& profile) {
  std::vector<int64_t> bounds;
  for (size_t i = 0; i <= profile.size(); ++i) bounds.push_back(static_cast<int64_t>(i));
  return evaluate_plan(profile, bounds, std::vector<bool>(profile.size(), true), "every segment");
}

CheckpointPlan plan_sqrt_n(const std::vector<SegmentProfile>& profile) {
  const int64_t n = static_cast<int64_t>(profile.size());
  MG_CHECK(n > 0, ValueError, "plan_sqrt_n: no segments");
  const int64_t len = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  std::vector<int64_t> bounds{0};
  while (bounds.back() < n) bounds.push_back(std::min(n, bounds.back() + len));
  std::vector<bool> flags(bounds.size() - 1, true);
  flags.back() = false;  // backward needs the last run's activations right away
  return evaluate_plan(profile, bounds, flags, "sqrt(n)");
}

CheckpointPlan plan_for_budget(const std::vector<SegmentProfile>& profile, int64_t budget_bytes) {
  const int64_t n = static_cast<int64_t>(profile.size());
  MG_CHECK(n > 0, ValueError, "plan_for_budget: no segments");
  MG_CHECK(budget_bytes >= 0, ValueError, "plan_for_budget: budget must be >= 0 bytes, got ", budget_bytes);
  const Prefix pre(profile);
  auto saving = [&](int64_t a, int64_t b) { return pre.kept[b] - pre.kept[a] - profile[b - 1].output_bytes; };
  if (pre.kept[n] <= budget_bytes) {
    CheckpointPlan p = plan_none(profile);
    p.strategy = "budget (nothing to checkpoint)";
    return p;
  }
  // Bytes are counted in quanta so the table stays small; savings round down and the
  // result is re-evaluated exactly, so a plan said to fit does fit the model.
  constexpr int64_t kUnits = 2048;
  const int64_t quantum = std::max<int64_t>(1, (pre.kept[n] + kUnits - 1) / kUnits);
  // Candidate caps on the replay term: every run's own replay size (subsampled when many).
  std::vector<int64_t> caps{0};
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = a + 1; b <= n; ++b) caps.push_back(std::max<int64_t>(0, saving(a, b)));
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  if (caps.size() > 64) {
    std::vector<int64_t> sub;
    for (size_t k = 0; k < 64; ++k) sub.push_back(caps[k * (caps.size() - 1) / 63]);
    caps = std::move(sub);
  }
  const double inf = std::numeric_limits<double>::infinity();
  CheckpointPlan best;
  bool have = false, best_fits = false;
  struct Parent {
    int32_t a = -1;
    int32_t u = -1;
    bool ck = false;
  };
  std::vector<double> dp((n + 1) * (kUnits + 1));
  std::vector<Parent> par((n + 1) * (kUnits + 1));
  for (int64_t cap : caps) {
    const int64_t need_bytes = pre.kept[n] - (budget_bytes - cap);  // savings the plan must reach
    if (budget_bytes < cap) continue;
    const int64_t need = std::clamp<int64_t>((need_bytes + quantum - 1) / quantum, 0, kUnits);
    std::fill(dp.begin(), dp.end(), inf);
    dp[0] = 0.0;
    auto at = [&](int64_t i, int64_t u) { return i * (kUnits + 1) + u; };
    for (int64_t a = 0; a < n; ++a)
      for (int64_t u = 0; u <= kUnits; ++u) {
        const double cur = dp[at(a, u)];
        if (cur == inf) continue;
        // A single plain segment.
        if (cur < dp[at(a + 1, u)]) {
          dp[at(a + 1, u)] = cur;
          par[at(a + 1, u)] = {static_cast<int32_t>(a), static_cast<int32_t>(u), false};
        }
        // A checkpointed run [a, b) whose replay fits under the cap.
        for (int64_t b = a + 1; b <= n; ++b) {
          const int64_t s = saving(a, b);
          if (s > cap) continue;
          const int64_t v = std::min(kUnits, u + std::max<int64_t>(0, s) / quantum);
          const double t = cur + pre.ms[b] - pre.ms[a];
          if (t < dp[at(b, v)]) {
            dp[at(b, v)] = t;
            par[at(b, v)] = {static_cast<int32_t>(a), static_cast<int32_t>(u), true};
          }
        }
      }
    int64_t u_best = -1;
    for (int64_t u = need; u <= kUnits; ++u)
      if (dp[at(n, u)] < inf && (u_best < 0 || dp[at(n, u)] < dp[at(n, u_best)])) u_best = u;
    if (u_best < 0) {
      // Nothing reaches the savings under this cap: remember the most-saving plan in case
      // no cap fits at all.
      for (int64_t u = kUnits; u >= 0 && u_best < 0; --u)
        if (dp[at(n, u)] < inf) u_best = u;
    }
    std::vector<int64_t> bounds{n};
    std::vector<bool> flags;
    for (int64_t i = n, u = u_best; i > 0;) {
      const Parent& p = par[at(i, u)];
      flags.push_back(p.ck);
      bounds.push_back(p.a);
      i = p.a;
      u = p.u;
    }
    std::reverse(bounds.begin(), bounds.end());
    std::reverse(flags.begin(), flags.end());
    CheckpointPlan plan = evaluate_plan(profile, bounds, flags, "budget (dynamic program)");
    plan.fits = plan.estimated_peak_bytes() <= budget_bytes;
    const bool better =
        !have || (plan.fits && !best_fits) ||
        (plan.fits == best_fits && (plan.fits ? plan.extra_forward_ms < best.extra_forward_ms
                                              : plan.estimated_peak_bytes() < best.estimated_peak_bytes()));
    if (better) {
      best = plan;
      best_fits = plan.fits;
      have = true;
    }
  }
  return best;
}

std::string OffloadPlan::summary() const {
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << "offload " << segments << " of " << total_segments << " segments ("
    << format_bytes(offloaded_bytes) << "), exposed " << exposed_ms() << " ms (forward " << forward_exposed_ms
    << ", backward " << backward_exposed_ms << ")";
  if (window_capped) o << ", stopped at a segment larger than the prefetch window";
  return o.str();
}

OffloadPlan evaluate_offload(const std::vector<SegmentProfile>& profile, int64_t segments, const HostLink& link,
                             double tail_ms, double backward_ratio) {
  const int64_t n = static_cast<int64_t>(profile.size());
  MG_CHECK(segments >= 0 && segments <= n, ValueError, "evaluate_offload: segments must be in [0, ", n, "], got ",
           segments);
  MG_CHECK(tail_ms >= 0.0 && backward_ratio >= 0.0, ValueError,
           "evaluate_offload: tail_ms and backward_ratio must be >= 0, got ", tail_ms, " and ", backward_ratio);
  MG_CHECK(segments == 0 || (link.to_host_bytes_per_ms > 0.0 && link.to_device_bytes_per_ms > 0.0), ValueError,
           "evaluate_offload: offloading ", segments, " segments needs a link of positive bandwidth, got ",
           link.to_host_bytes_per_ms, " and ", link.to_device_bytes_per_ms, " bytes/ms");
  OffloadPlan p;
  p.segments = segments;
  p.total_segments = n;
  // Forward: the copies out queue on one stream; a segment's copy starts as its first tensor is
  // saved, and none ends before the segment does (its last tensor is saved at the end).
  double t = 0.0, copy_end = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double start = t;
    t += profile[i].forward_ms;
    if (i < segments) {
      p.offloaded_bytes += profile[i].kept_bytes;
      copy_end = std::max(
          t, std::max(copy_end, start) + static_cast<double>(profile[i].kept_bytes) / link.to_host_bytes_per_ms);
    }
  }
  p.forward_exposed_ms = std::max(0.0, copy_end - (t + tail_ms));
  // Backward: the copies back run from its start, latest segment first.
  std::vector<double> back_end(segments, 0.0);
  double fetch = 0.0;
  for (int64_t i = segments - 1; i >= 0; --i) {
    fetch += static_cast<double>(profile[i].kept_bytes) / link.to_device_bytes_per_ms;
    back_end[i] = fetch;
  }
  double b = backward_ratio * tail_ms, busy = b;
  for (int64_t i = n - 1; i >= 0; --i) {
    if (i < segments) b = std::max(b, back_end[i]);
    b += backward_ratio * profile[i].forward_ms;
    busy += backward_ratio * profile[i].forward_ms;
  }
  p.backward_exposed_ms = b - busy;
  return p;
}

OffloadPlan plan_offload(const std::vector<SegmentProfile>& profile, const HostLink& link, double max_exposed_ms,
                         double tail_ms, double backward_ratio, int64_t window_bytes) {
  MG_CHECK(max_exposed_ms >= 0.0, ValueError, "plan_offload: max_exposed_ms must be >= 0, got ", max_exposed_ms);
  OffloadPlan best = evaluate_offload(profile, 0, link, tail_ms, backward_ratio);
  if (link.to_host_bytes_per_ms <= 0.0 || link.to_device_bytes_per_ms <= 0.0) return best;
  // Each segment more only adds copies, so the exposed time grows with the count.
  for (int64_t m = 1; m <= static_cast<int64_t>(profile.size()); ++m) {
    if (window_bytes >= 0 && profile[m - 1].kept_bytes > window_bytes) {
      best.window_capped = true;
      break;
    }
    OffloadPlan p = evaluate_offload(profile, m, link, tail_ms, backward_ratio);
    if (p.exposed_ms() > max_exposed_ms) break;
    best = p;
  }
  return best;
}

std::vector<SegmentFn> segments_of(const nn::Sequential& seq) {
  std::vector<SegmentFn> fns;
  for (size_t i = 0; i < seq.size(); ++i) {
    std::shared_ptr<nn::Module> m = seq[i];  // owned by the function: replays run after this returns
    fns.push_back([m](const Tensor& x) { return (*m)(x); });
  }
  return fns;
}

Tensor checkpoint_sequential(const nn::Sequential& seq, int64_t segments, const Tensor& input) {
  return mg::checkpoint_sequential(segments_of(seq), segments, input);
}

std::string CheckpointPlan::table(const std::vector<SegmentProfile>& profile) const {
  std::ostringstream os;
  os << "checkpoint plan: " << strategy << "\n";
  os << std::left << std::setw(28) << "segments" << std::right << std::setw(14) << "kept" << std::setw(14) << "output"
     << std::setw(12) << "fwd ms"
     << "  checkpointed\n";
  for (size_t g = 0; g + 1 < bounds.size(); ++g) {
    const int64_t a = bounds[g], b = bounds[g + 1];
    int64_t kept = 0;
    double ms = 0;
    for (int64_t i = a; i < b; ++i) {
      kept += profile[i].kept_bytes;
      ms += profile[i].forward_ms;
    }
    std::string label = profile[a].name;
    if (b - a > 1) label += " .. " + profile[b - 1].name;
    os << std::left << std::setw(28) << label << std::right << std::setw(14) << format_bytes(kept) << std::setw(14)
       << format_bytes(profile[b - 1].output_bytes) << std::setw(12) << std::fixed << std::setprecision(3) << ms << "  "
       << (checkpointed[g] ? "yes" : "no") << "\n";
  }
  os << "activations kept: " << format_bytes(stored_bytes) << " + largest replay " << format_bytes(replay_bytes)
     << " = " << format_bytes(estimated_peak_bytes()) << " (no checkpointing: " << format_bytes(plain_bytes) << ")";
  if (!fits) os << "  DOES NOT FIT the budget";
  os << "\nrecomputation: +" << std::setprecision(3) << extra_forward_ms << " ms per step (forward " << plain_forward_ms
     << " ms, +" << std::setprecision(1) << (plain_forward_ms > 0 ? 100.0 * extra_forward_ms / plain_forward_ms : 0.0)
     << "% of it)\n";
  return os.str();
}

}  // namespace mg::memory
