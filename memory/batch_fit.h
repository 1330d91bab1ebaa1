// Batches that fit: gradient accumulation over micro-batches, the largest batch that trains
// (doubling then bisection over OutOfMemoryError), the fastest configuration whose whole step
// fits a byte budget, and grouping samples under a byte budget.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace mg::memory {

// Splits inputs and targets along dim 0 into `micro_batches` nearly equal pieces; for each,
// runs loss_fn (a mean over its rows), scales it by rows / total and backpropagates, so the
// accumulated .grad equals the full batch's mean-loss gradient while only one micro-batch's
// activations are alive at a time. Returns the full batch's loss. The caller steps once.
double accumulate_gradients(const Tensor& inputs, const Tensor& targets, int64_t micro_batches,
                            const std::function<Tensor(const Tensor& x, const Tensor& y)>& loss_fn);

struct BatchSearchOptions {
  int64_t start = 1;            // first batch tried
  int64_t max_batch = 1 << 20;  // never try more
};

struct BatchSearchResult {
  int64_t max_batch = 0;                        // 0: not even `start` fits
  std::vector<std::pair<int64_t, bool>> tries;  // (batch, fitted) in the order tried
};

// try_step(b) runs one training step at batch b and throws mg::OutOfMemoryError when it
// does not fit (anything else propagates). Doubles from `start` until a step fails, then
// bisects between the last fit and the first failure: O(log max_batch) steps. The default
// generator ends as it began (the trial steps' dropout leaves no trace in training).
BatchSearchResult find_max_batch_size(const std::function<void(int64_t batch)>& try_step,
                                      const BatchSearchOptions& opts = {});

// One training step of `model` on a batch of b rows made by repeating the rows of `sample`
// ([rows, ...]); the loss is loss_fn(output) (default: mean of squares). Gradients are
// dropped after each try, so every try starts from the same memory.
BatchSearchResult find_max_batch_size(nn::Module& model, const Tensor& sample, const BatchSearchOptions& opts = {},
                                      const std::function<Tensor(const Tensor& output)>& loss_fn = nullptr);

// A ladder of memory-saving configurations, ordered from fastest to smallest (e.g. plain;
// selective recomputation; checkpointing 1, 2, ... blocks), each applied by `apply` to the model
// before its trial step.
struct BudgetOption {
  std::string name;
  std::function<void()> apply;
};

struct BudgetFitResult {
  int chosen = -1;  // index of the first option whose step fits; -1: none does
  bool fits() const { return chosen >= 0; }
  // Each option tried, in order: its name and its step's peak (the allocator's whole
  // accounting: parameters, gradients, optimizer state, weight casts, workspaces and
  // activations), -1 where the step ran out of memory.
  std::vector<std::pair<std::string, int64_t>> peaks;
  // The lowest peak measured (over all options when none fits) and whose it is.
  int64_t smallest_peak = -1;
  std::string smallest;
  // "fits: <name>, peak X of budget Y" or "does not fit: the smallest peak is X (<name>) against
  // a budget of Y".
  std::string summary(int64_t budget_bytes) const;
};

// Fits a training step under budget_bytes before training starts: applies each option in order,
// runs one step (step(), which throws mg::OutOfMemoryError if it cannot run) with the peak
// counter of `device` reset, and stops at the first option whose peak is <= budget_bytes (the
// option stays applied). When none fits, every option has been measured, the one with the
// smallest peak is left applied, and the result says so (chosen = -1): the caller decides
// whether to stop. The first step of a fresh optimizer also creates its state: run one step
// before calling, or the first option's peak includes that growth. The default generator ends as
// it began.
BudgetFitResult fit_to_budget(const std::vector<BudgetOption>& options, const std::function<void()>& step,
                              int64_t budget_bytes, Device device);

// Where a model's state (parameters, gradients, optimizer state) lives, fastest first
// (docs/bigger_than_gpu.md gives each one's bytes a parameter and step time):
//   Resident           everything on the device, the optimizer's moments in f32;
//   EightBit           the same with 8-bit moments (optim::AdamW8bit);
//   OptimizerOffload   the large parameters' f32 masters, gradients and optimizer state in host
//                      memory, stepped there; the device keeps their casts (memory::HostParams);
//   ParameterOffload   every parameter's state in host memory, a unit's parameters on the device
//                      only while it runs (memory::HostSource over ParamUnits).
enum class StateMode { Resident, EightBit, OptimizerOffload, ParameterOffload };
const char* state_mode_name(StateMode mode);

// One state mode, set up for its trials: its activation ladder (fit_to_budget's options, fastest
// first) and one training step (which throws mg::OutOfMemoryError if it cannot run).
struct StateTrial {
  std::vector<BudgetOption> ladder;
  std::function<void()> step;
};

struct StateFitResult {
  std::vector<StateMode> modes;          // the modes tried, in order
  std::vector<BudgetFitResult> ladders;  // each one's walk of its ladder (no peaks: its setup ran out of memory)
  int chosen = -1;                       // index into modes of the one chosen; -1: none fits
  bool fits() const { return chosen >= 0; }
  // "fits: <mode>, <rung>, peak X of a budget of Y", or "does not fit: the smallest peak is X
  // (<mode>, <rung>) against a budget of Y".
  std::string summary(int64_t budget_bytes) const;
};

// Fits a training step under budget_bytes over where the state lives and, within each mode, how
// much is recomputed: for each mode in order, setup(mode) builds it (the caller tears down the
// one before it: only one mode lives at a time) and returns its trial; one step creates the
// optimizer's state (an out-of-memory there is forgiven: the ladder's smaller rungs may still
// fit), then fit_to_budget walks the ladder. The first mode with a rung that fits is chosen and
// stays set up with that rung applied. A setup that runs out of memory (the state alone does
// not fit) is a mode with no rung that fits. When nothing fits, the last mode stays set up.
// The default generator ends as it began.
StateFitResult fit_state_to_budget(const std::vector<StateMode>& modes,
                                   const std::function<StateTrial(StateMode)>& setup, int64_t budget_bytes,
                                   Device device);

// Peak bytes of a padded batch as fixed + per_unit * count * longest (fitted from measurements).
struct LinearMemoryModel {
  double fixed_bytes = 0;
  double bytes_per_unit = 0;
  int64_t operator()(int64_t count, int64_t longest) const;
};

// Fits the model from two measurements of peak bytes at `units_a` and `units_b` units
// (count * longest): measure(units) runs one step and returns its peak.
LinearMemoryModel fit_linear_memory_model(const std::function<int64_t(int64_t units)>& measure, int64_t units_a,
                                          int64_t units_b);

// Groups samples of the given sizes (e.g. sequence lengths) into padded batches whose
// estimate(count, longest) stays within budget_bytes: longest samples first, each batch
// filled while it fits. Returns sample indices per batch. A sample that does not fit alone
// is an mg::OutOfMemoryError naming it.
std::vector<std::vector<int64_t>> split_batches_by_memory(
    const std::vector<int64_t>& sizes, int64_t budget_bytes,
    const std::function<int64_t(int64_t count, int64_t longest)>& estimate);

}  // namespace mg::memory
