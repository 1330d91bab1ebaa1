// Parameters in host memory, read on the device through their casts: ZeRO-Offload on one GPU.
// A host parameter's f32 master weight, its optimizer state and the optimizer's update live on
// the host; the device holds only the low-precision cast the forward reads.
//
// One step, and where each piece runs:
//   provide_casts()  waits for the host updates of the last step and gives the next autocast
//                    region each parameter's new cast on the device: the worker copied it there on
//                    a side stream right after the update wrote it (in pinned host memory), so the
//                    copies ran during backward; the first call copies them itself. It gives them
//                    to the region
//                    (autocast::provide_cast); the ops find it there (autograd/op_policy.h: a host
//                    parameter read by an op on the device comes to it, autocast::lower_to).
//   forward          reads the casts; nothing else of a host parameter is on the device. A
//                    checkpointed block's recomputation, in a region of its own, copies its casts
//                    over again (autocast::add_host_cast_source), 2 bytes a parameter.
//   backward         each host parameter's f32 gradient, as soon as backward has it (a gradient
//                    sink on the parameter, autograd/node.h), is copied to pinned host memory on
//                    a side stream; a worker thread waits for that copy, runs the optimizer on the
//                    parameter (kernels/cpu/optim.cc: AdamW's rule, over all cores), writes its
//                    new cast and copies that to the device. The updates of the last blocks run
//                    while backward still computes the first blocks' gradients.
//
// The update is the optimizer's own, on the f32 master and the f32 gradient the device-resident
// model would have: the same result as the device's optimizer, up to the rounding of fused
// multiply-adds (the CUDA kernel contracts them, the host loop does not).
//
// What it saves: a host parameter costs the device 2 bytes (its bf16 cast) instead of 16 or 18
// (f32 master, f32 gradient, two f32 moments, the cast). What it costs: the cast's copy to the
// device and the gradient's copy back (2 bytes a parameter to the device, 4 back, hidden behind
// compute where the link allows) and the host update, at the host's memory bandwidth;
// a step takes at least the host's update time (bench_models --host-params prints both).
// Which parameters qualify: ones the model reads only through ops with an autocast rule under a
// CUDA autocast region (Linear weights and biases: gpt_linear_params); an embedding table or a
// norm's weight stays on the device.
//
// What combines with it: activation checkpointing, the step inside backward (for the device's
// parameters), 8-bit optimizer state (an AdamW8bit factory: its host loop), gradient
// accumulation (set_step(false) for every micro-batch but the last: the gradients add up on the
// host in f32). What does not: gradient clipping by the global norm and GradScaler's inf check
// (both need every gradient before the first update), CUDA graphs (the casts are eager memory).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/device_runtime.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "nn/models/gpt.h"
#include "optim/optimizer.h"

namespace mg::memory {

// Builds the optimizer that steps the host parameters (given in host memory), e.g.
//   [](std::vector<Tensor> ps) { return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{}); }
using HostOptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> host_params)>;

class HostParams {
 public:
  // Moves every tensor of `params` (f32 leaves that require grad, contiguous, on the CUDA device
  // `device`, without a gradient) to pinned host memory in place (the module sees host tensors
  // from now on), builds their optimizer with `make_optimizer`, and starts the update thread.
  // A ValueError names the first parameter that does not qualify; a failed pinned allocation is
  // the CUDA error it raised.
  HostParams(std::vector<Tensor> params, Device device, HostOptimizerFactory make_optimizer,
             DType cast_dtype = DType::bf16);
  // One cast dtype a parameter (bf16, f16, or f32: the device reads the f32 master itself, no
  // cast kept). Parameters may also be given on the CPU: they are pinned in place.
  HostParams(std::vector<Tensor> params, Device device, HostOptimizerFactory make_optimizer,
             std::vector<DType> cast_dtypes);
  // Waits for the updates in flight; the parameters stay in host memory.
  ~HostParams();
  HostParams(const HostParams&) = delete;
  HostParams& operator=(const HostParams&) = delete;

  // Waits for the updates of the last backward, then gives the calling thread's next autocast
  // region the casts of every parameter, copied to the device on the current stream (each as
  // soon as its own updates have run, while the later ones still run). Call before
  // the first forward and between each backward and the next forward; it also starts a new round
  // (a parameter may receive one gradient a round while stepping is on).
  void provide_casts();
  // On: provide_casts() waits for no update. It gives the region the casts whose updates have
  // run and leaves each other parameter to the region's first read of it, which waits for that
  // update (the next forward's first blocks run while the updates of its last ones finish: with
  // the last blocks on the host, gpt_linear_params(model, first_block)). Default off:
  // provide_casts() waits for every update.
  void set_casts_on_first_use(bool on) { casts_on_first_use_ = on; }
  // Off: the gradients of the next backwards add up on the host (f32) without an update; the next
  // backward with it on updates with the sum. Default on.
  void set_step(bool on) { step_ = on; }
  // Blocks until every update queued so far has run; rethrows the first error an update raised.
  void wait();
  // Blocks until parameter i's queued updates have run. After an update's error, waits as wait()
  // does (the updates queued after it are dropped) and rethrows it.
  void wait_for(size_t i);
  // Copies parameter i's cast (its master where its cast dtype is f32) into `dst` on the device,
  // asynchronously on the current stream, after its queued updates: what a parameter-offload
  // source fetches (memory/param_offload.h). The worker writes the cast again only after the
  // parameter's next gradient, which the device makes after reading `dst`.
  void copy_to_device(size_t i, const Tensor& dst);
  // The gradient of parameter i for this round (f32, f16 or bf16, on the device): copied home
  // and queued for the update as a gradient sink would (what a parameter-offload source reduces).
  void add_gradient(size_t i, Tensor grad) { on_gradient(i, std::move(grad)); }
  // A new round: each parameter may receive one gradient again (provide_casts() starts one).
  void start_round();

  const std::vector<Tensor>& params() const { return params_; }
  // The optimizer stepping the host parameters (its learning rate, state_dict, ...). Change it
  // only between wait() and the next backward.
  optim::Optimizer& optimizer() { return *opt_; }
  // The host optimizer's state (optimizer().state_dict() once the queued updates have run), so a
  // TrainingCheckpoint saves it as a component: add("host_optimizer", host_params) beside "model"
  // (which holds the parameters' values: they are the module's tensors) and "optimizer" (the
  // device optimizer's). optim/state_by_name.h turns these two into one resident optimizer's state
  // and back. stage_state_dict waits too, then stages the host optimizer's load. Load before
  // provide_casts(): a master changed outside the update (a loaded model state dict bumps its
  // version) has its cast written again by the next provide_casts() or copy_to_device(), but
  // casts already given to a region are copies of the values before.
  StateDict state_dict();
  StagedLoad stage_state_dict(const StateDict& sd);
  void load_state_dict(const StateDict& sd) { stage_state_dict(sd)(); }
  // The tensors of `all` that are not host parameters (what a device optimizer should step).
  std::vector<Tensor> others(const std::vector<Tensor>& all) const;
  // Bytes of f32 masters held in host memory.
  int64_t host_bytes() const;

  // Since construction: gradients copied home and updates run, the bytes copied each way, the
  // worker's time in the optimizer and in writing casts, and the time provide_casts() waited for
  // the worker (the update time not hidden behind backward).
  struct Stats {
    int64_t gradients = 0, updates = 0;
    int64_t casts_ahead = 0;  // casts the worker copied to the device right after their update
    int64_t to_host_bytes = 0, to_device_bytes = 0;
    double update_ms = 0.0, cast_ms = 0.0, wait_ms = 0.0;
  };
  Stats stats() const;
  // Zeroes the stats (after a first step that created the optimizer's state, say, so that they
  // count steady steps only). Waits for the queued updates first.
  void reset_stats();

 private:
  struct Task;
  void on_gradient(size_t i, Tensor grad);
  Tensor device_cast(size_t i);  // the parameter's cast copied to the device on the current stream
  void refresh_cast(size_t i);   // writes the cast again if the master changed since (after a wait)
  void run_worker();
  void process(Task& t);
  void copy_cast_ahead(Task& t);
  Tensor take_cast(size_t i);  // after i's queued updates: its cast on the device, on the current stream

  std::vector<Tensor> params_;
  Device device_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::vector<Tensor> casts_;  // each parameter's cast, pinned, written by the update (undefined: f32)
  std::vector<DType> cast_dtypes_;
  // Each master's version when its cast was written: a master changed outside the update (a
  // loaded model state dict) has its cast written again before the device reads it.
  std::vector<uint32_t> cast_versions_;
  std::vector<int64_t> pending_;  // updates queued and not yet run, a parameter
  std::vector<Tensor> sums_;      // gradients added up while stepping is off (f32, host)
  std::vector<uint8_t> seen_;     // a gradient arrived for this parameter in this round
  cuda::Stream stream_;           // the gradients' copies home
  cuda::Stream cast_stream_;      // the new casts' copies to the device
  // A parameter's new cast on the device, copied by the worker after its update (the master's
  // version it was cast from), for the next provide_casts().
  struct Ahead {
    Tensor cast;
    cuda::Event copied;
    uint32_t version = 0;
  };
  std::vector<std::unique_ptr<Ahead>> ahead_;
  // The device gradients on their way home, each with its copy's event: dropped on the caller's
  // thread once the copy is done (release_sent_gradients), where a record_stream on stream_ could
  // have outlived this object (a gradient the caller keeps, freed after the destructor).
  std::deque<std::pair<cuda::Event, Tensor>> sending_;
  std::mutex sending_mu_;
  void release_sent_gradients(bool wait_all);
  // Set by the first provide_casts(): each update's cast then follows it to the device (a
  // parameter-offload source, which fetches with copy_to_device(), never sets it).
  bool casts_ahead_ = false;
  bool casts_on_first_use_ = false;
  std::unordered_map<const TensorImpl*, size_t> index_;
  uint64_t source_ = 0;  // autocast's host cast source (a checkpoint's recomputation reads it)
  bool step_ = true;
  bool takes_16bit_grads_ = false;  // the optimizer is an Adam: 16-bit gradients go to it as they are

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Task>> queue_;
  size_t busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  Stats stats_;
  std::thread worker_;
};

// The parameters HostParams takes from a GPT: its blocks' Linear weights and biases
// (nn/models/gpt.h), of every block or of the last ones (first_block).
using nn::gpt_linear_params;

// Partial optimizer offload (ZeRO-Offload++'s offload ratio, in whole blocks). The host update
// bounds a fully offloaded step: it overlaps backward only (provide_casts() waits for every
// update before the next forward), and the first block's gradient comes last. Offloading only
// the last N blocks' Linear parameters lets their updates start with backward's first gradients
// and end while backward still runs on the device; the other blocks keep their state and update
// on the device. plan_host_param_blocks picks the largest N whose predicted step stays within
// max_step_ratio of the resident step, from the resident step's measured phases and the host
// update of one block (measure_host_params_update_ms). The model leaves out the launching
// thread's waits for the updates; search_host_param_blocks checks its count by timing.
struct HostBlocksInput {
  int64_t n_layer = 0;
  double forward_ms = 0, backward_ms = 0;  // the resident step's (backward with the device update in it)
  double block_update_ms = 0;              // the host update of one block's Linear parameters
  double block_copy_ms = 0;                // one block's new casts over the host link
  double max_step_ratio = 1.3;             // the longest step allowed, against forward + backward
  // HostParams::set_casts_on_first_use: the next forward waits for a block's update only when it
  // reaches the block, so the updates overlap that forward's earlier blocks too.
  bool casts_on_first_use = false;
};
struct HostBlocksPlan {
  int64_t blocks = 0;           // the last `blocks` blocks go to the host
  double resident_ms = 0;       // forward + backward
  double predicted_ms = 0;      // the step with `blocks` offloaded
  std::vector<double> step_ms;  // the predicted step for 0 .. n_layer blocks offloaded
};
// The model: backward takes backward_ms / n_layer a block, last block first; the j-th block
// offloaded (counted from the last) hands its gradient over after j such slices; one worker
// updates the blocks in that order, block_update_ms each, and the last cast reaches the device
// block_copy_ms after its update. The next forward starts when backward and that copy are done;
// with casts_on_first_use it starts when backward is done and waits, if at all, when it reaches
// block n_layer - N (the last offloaded block to be updated). A ValueError names an input out
// of range.
HostBlocksPlan plan_host_param_blocks(const HostBlocksInput& in);

// The model leaves out the launching thread's waits, so a run checks its count by timing:
// `step_ms(n)` runs steps with the last n blocks on the host and returns their step time. The
// search times `first` (the model's count), then doubles the step above a count within
// max_step_ratio x resident_ms while the counts stay within, and bisects below the first count
// over it. It returns the largest count found within (0 when none is) and every count timed, in
// order, with its step. A ValueError names an input out of range.
struct HostBlocksSearch {
  int64_t blocks = 0;
  std::vector<std::pair<int64_t, double>> trials;
};
HostBlocksSearch search_host_param_blocks(int64_t n_layer, int64_t first, double resident_ms, double max_step_ratio,
                                          const std::function<double(int64_t)>& step_ms);

// The host update of parameters shaped as `like` inside a HostParams on `device`, as a training
// step runs it: f32 masters and bf16 casts in pinned memory, a gradient each copied home from the
// device (bf16: a GPT's f32 master gets an f32 one, 2 bytes an element more to read), the
// worker's update over all cores but one. The median over `repeats` rounds (after
// one that creates the state) of the worker's time a round (Stats::update_ms + cast_ms), in
// milliseconds: what a run meets, pinned pages and the copies to and from the device beside it
// (the same loop on pageable memory of its own measures less: docs/bigger_than_gpu.md).
// A DeviceError for a device that is not CUDA, a ValueError for no shapes.
double measure_host_params_update_ms(const std::vector<Tensor>& like, Device device,
                                     const HostOptimizerFactory& make_optimizer, int repeats = 3);

// The host's memory bandwidth as a parallel copy of `bytes` over every core sees it (bytes read
// plus bytes written, per millisecond; the median of `repeats`): the ceiling of a host update.
double measure_host_copy_bandwidth(int64_t bytes = int64_t{1} << 30, int repeats = 5);

}  // namespace mg::memory
