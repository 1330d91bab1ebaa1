// Batches that fit. The OOM search relies on the allocator staying consistent after an
// OutOfMemoryError (nothing half-allocated), so a failed try only costs its time.
#include "memory/batch_fit.h"

#include <algorithm>
#include <numeric>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/format_bytes.h"
#include "core/random.h"

namespace mg::memory {

namespace {
// Row indices 0, 1, .., rows-1, 0, 1, .. for a batch of b rows.
Tensor remainder_index(int64_t b, int64_t rows, Device dev) {
  std::vector<int64_t> idx(b);
  for (int64_t i = 0; i < b; ++i) idx[i] = i % rows;
  Tensor t = from_vector(idx, {b});
  return dev.is_cuda() ? raw::to_device(t, dev) : t;
}
}  // namespace

double accumulate_gradients(const Tensor& inputs, const Tensor& targets, int64_t micro_batches,
                            const std::function<Tensor(const Tensor& x, const Tensor& y)>& loss_fn) {
  MG_CHECK(inputs.defined() && targets.defined() && inputs.dim() >= 1 && targets.dim() >= 1, ShapeError,
           "accumulate_gradients: inputs and targets need a batch dimension");
  const int64_t n = inputs.size(0);
  MG_CHECK(targets.size(0) == n, ShapeError, "accumulate_gradients: ", n, " inputs but ", targets.size(0), " targets");
  MG_CHECK(micro_batches >= 1 && micro_batches <= n, ValueError, "accumulate_gradients: micro_batches must be in [1, ",
           n, "] (the batch size), got ", micro_batches);
  double total = 0.0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    const int64_t a = m * n / micro_batches, b = (m + 1) * n / micro_batches;
    if (b == a) continue;
    Tensor loss = loss_fn(inputs.narrow(0, a, b - a), targets.narrow(0, a, b - a));
    MG_CHECK(loss.defined() && loss.numel() == 1, ShapeError,
             "accumulate_gradients: loss_fn must return a scalar, got ",
             loss.defined() ? shape_str(loss.sizes()) : std::string("(undefined)"));
    const double share = static_cast<double>(b - a) / static_cast<double>(n);
    mul(loss, share).backward();
    total += loss.item() * share;
  }
  return total;
}

BatchSearchResult find_max_batch_size(const std::function<void(int64_t batch)>& try_step,
                                      const BatchSearchOptions& opts) {
  MG_CHECK(opts.start >= 1 && opts.max_batch >= opts.start, ValueError,
           "find_max_batch_size: need 1 <= start <= max_batch, got start ", opts.start, ", max_batch ", opts.max_batch);
  GeneratorStateGuard rng;  // the trial steps' random draws leave no trace in the caller's stream
  BatchSearchResult r;
  auto fits = [&](int64_t b) {
    bool ok = true;
    try {
      try_step(b);
    } catch (const OutOfMemoryError&) {
      ok = false;
    }
    r.tries.emplace_back(b, ok);
    return ok;
  };
  int64_t lo = 0, hi = 0;  // lo fits (0 = nothing yet), hi fails (0 = no failure yet)
  for (int64_t b = opts.start;; b = std::min(opts.max_batch, b * 2)) {
    if (!fits(b)) {
      hi = b;
      break;
    }
    lo = b;
    if (b == opts.max_batch) break;
  }
  if (hi == 0 || lo == 0) {
    r.max_batch = lo;
    return r;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  r.max_batch = lo;
  return r;
}

BatchSearchResult find_max_batch_size(nn::Module& model, const Tensor& sample, const BatchSearchOptions& opts,
                                      const std::function<Tensor(const Tensor& output)>& loss_fn) {
  MG_CHECK(sample.defined() && sample.dim() >= 1 && sample.size(0) >= 1, ShapeError,
           "find_max_batch_size: the sample needs at least one row, got ",
           sample.defined() ? shape_str(sample.sizes()) : std::string("(undefined)"));
  auto step = [&](int64_t b) {
    model.zero_grad(true);
    try {
      Tensor batch;
      {
        NoGradGuard ng;
        Tensor idx = remainder_index(b, sample.size(0), sample.device());
        batch = index_select(sample, 0, idx);
      }
      Tensor out = model(batch);
      Tensor loss = loss_fn ? loss_fn(out) : mean(square(out));
      loss.backward();
    } catch (...) {
      model.zero_grad(true);
      throw;
    }
    model.zero_grad(true);
  };
  BatchSearchResult r = find_max_batch_size(step, opts);
  if (sample.is_cuda()) cuda::empty_cache();  // the failed tries' cached segments
  return r;
}

int64_t LinearMemoryModel::operator()(int64_t count, int64_t longest) const {
  return static_cast<int64_t>(fixed_bytes + bytes_per_unit * static_cast<double>(count) * static_cast<double>(longest));
}

LinearMemoryModel fit_linear_memory_model(const std::function<int64_t(int64_t units)>& measure, int64_t units_a,
                                          int64_t units_b) {
  MG_CHECK(units_a > 0 && units_b > units_a, ValueError, "fit_linear_memory_model: need 0 < units_a < units_b, got ",
           units_a, " and ", units_b);
  const double pa = static_cast<double>(measure(units_a)), pb = static_cast<double>(measure(units_b));
  LinearMemoryModel m;
  m.bytes_per_unit = std::max(0.0, (pb - pa) / static_cast<double>(units_b - units_a));
  m.fixed_bytes = std::max(0.0, pa - m.bytes_per_unit * static_cast<double>(units_a));
  return m;
}

std::vector<std::vector<int64_t>> split_batches_by_memory(
    const std::vector<int64_t>& sizes, int64_t budget_bytes,
    const std::function<int64_t(int64_t count, int64_t longest)>& estimate) {
  MG_CHECK(budget_bytes > 0, ValueError, "split_batches_by_memory: budget must be positive, got ", budget_bytes);
  std::vector<int64_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  // Longest first: each batch's padding length is its first sample's size.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sizes[a] > sizes[b]; });
  std::vector<std::vector<int64_t>> batches;
  for (int64_t i : order) {
    MG_CHECK(sizes[i] > 0, ValueError, "split_batches_by_memory: sample ", i, " has size ", sizes[i]);
    if (!batches.empty()) {
      auto& cur = batches.back();
      if (estimate(static_cast<int64_t>(cur.size()) + 1, sizes[cur.front()]) <= budget_bytes) {
        cur.push_back(i);
        continue;
      }
    }
    const int64_t alone = estimate(1, sizes[i]);
    MG_CHECK(alone <= budget_bytes, OutOfMemoryError, "split_batches_by_memory: sample ", i, " (size ", sizes[i],
             ") needs an estimated ", alone, " bytes alone, over the budget of ", budget_bytes, " bytes");
    batches.push_back({i});
  }
  return batches;
}

BudgetFitResult fit_to_budget(const std::vector<BudgetOption>& options, const std::function<void()>& step,
                              int64_t budget_bytes, Device device) {
  MG_CHECK(!options.empty(), ValueError, "fit_to_budget: no options to try");
  MG_CHECK(budget_bytes > 0, ValueError, "fit_to_budget: the budget must be > 0 bytes, got ", budget_bytes);
  GeneratorStateGuard rng;  // as in find_max_batch_size
  BudgetFitResult r;
  int smallest_index = -1;
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i].apply) options[i].apply();
    int64_t peak = -1;
    try {
      reset_peak_memory_stats(device);
      step();
      if (device.is_cuda()) cuda::synchronize();
      peak = max_memory_allocated(device);
    } catch (const OutOfMemoryError&) {
      if (device.is_cuda()) cuda::empty_cache();
    }
    r.peaks.emplace_back(options[i].name, peak);
    if (peak >= 0 && (r.smallest_peak < 0 || peak < r.smallest_peak)) {
      r.smallest_peak = peak;
      r.smallest = options[i].name;
      smallest_index = static_cast<int>(i);
    }
    if (peak >= 0 && peak <= budget_bytes) {
      r.chosen = static_cast<int>(i);
      return r;
    }
  }
  // Nothing fits: leave the smallest one applied (the last one applied otherwise).
  if (smallest_index >= 0 && smallest_index + 1 != static_cast<int>(options.size()) && options[smallest_index].apply)
    options[smallest_index].apply();
  return r;
}

std::string BudgetFitResult::summary(int64_t budget_bytes) const {
  if (fits())
    return "fits: " + peaks[chosen].first + ", peak " + format_bytes(peaks[chosen].second) + " of a budget of " +
           format_bytes(budget_bytes);
  if (smallest_peak < 0)
    return "does not fit: every option ran out of memory (budget " + format_bytes(budget_bytes) + ")";
  return "does not fit: the smallest peak is " + format_bytes(smallest_peak) + " (" + smallest +
         ") against a budget of " + format_bytes(budget_bytes);
}

const char* state_mode_name(StateMode mode) {
  switch (mode) {
    case StateMode::Resident:
      return "resident";
    case StateMode::EightBit:
      return "8-bit optimizer state";
    case StateMode::OptimizerOffload:
      return "optimizer offload";
    case StateMode::ParameterOffload:
      return "parameter offload";
  }
  return "?";
}

StateFitResult fit_state_to_budget(const std::vector<StateMode>& modes,
                                   const std::function<StateTrial(StateMode)>& setup, int64_t budget_bytes,
                                   Device device) {
  MG_CHECK(!modes.empty(), ValueError, "fit_state_to_budget: no state modes to try");
  MG_CHECK(budget_bytes > 0, ValueError, "fit_state_to_budget: the budget must be > 0 bytes, got ", budget_bytes);
  GeneratorStateGuard rng;
  StateFitResult r;
  for (StateMode mode : modes) {
    r.modes.push_back(mode);
    BudgetFitResult fit;
    try {
      StateTrial trial = setup(mode);
      try {
        trial.step();  // the optimizer's state, before any rung counts it
      } catch (const OutOfMemoryError&) {
        if (device.is_cuda()) cuda::empty_cache();
      }
      fit = fit_to_budget(trial.ladder, trial.step, budget_bytes, device);
    } catch (const OutOfMemoryError&) {
      if (device.is_cuda()) cuda::empty_cache();  // the state alone does not fit
    }
    r.ladders.push_back(fit);
    if (fit.fits()) {
      r.chosen = static_cast<int>(r.modes.size()) - 1;
      return r;
    }
  }
  return r;
}

std::string StateFitResult::summary(int64_t budget_bytes) const {
  if (fits()) {
    const BudgetFitResult& f = ladders[chosen];
    return std::string("fits: ") + state_mode_name(modes[chosen]) + ", " + f.peaks[f.chosen].first + ", peak " +
           format_bytes(f.peaks[f.chosen].second) + " of a budget of " + format_bytes(budget_bytes);
  }
  int64_t smallest = -1;
  std::string whose;
  for (size_t i = 0; i < modes.size(); ++i)
    if (ladders[i].smallest_peak >= 0 && (smallest < 0 || ladders[i].smallest_peak < smallest)) {
      smallest = ladders[i].smallest_peak;
      whose = std::string(state_mode_name(modes[i])) + ", " + ladders[i].smallest;
    }
  if (smallest < 0) return "does not fit: every mode ran out of memory (budget " + format_bytes(budget_bytes) + ")";
  return "does not fit: the smallest peak is " + format_bytes(smallest) + " (" + whose + ") against a budget of " +
         format_bytes(budget_bytes);
}

}  // namespace mg::memory
