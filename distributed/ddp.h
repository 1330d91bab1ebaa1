// DistributedDataParallel: one model replica per process; gradients are averaged across ranks
// in ~25 MiB buckets that are all-reduced from inside the backward pass (as soon as every
// gradient in a bucket is ready), so communication overlaps the rest of backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "nn/module.h"

namespace mg::dist {

struct DDPOptions {
  // Bucket size cap (PyTorch's bucket_cap_mb). The first bucket is capped at
  // first_bucket_cap_mb so the first all-reduce starts early in backward.
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  // Re-send rank 0's buffers (batch-norm running stats) at every forward.
  bool broadcast_buffers = true;
  // Walk the autograd graph after forward and mark parameters it does not reach as ready, so
  // a model that skips some parameters still finishes its reduction (their gradient is the
  // average over the ranks that used them, zero from the others).
  bool find_unused_parameters = false;
  // After the reduction, .grad becomes a view of the bucket (no copy back, no second buffer
  // for the averaged gradients); otherwise the averaged values are copied into .grad.
  bool gradient_as_bucket_view = false;
};

// Wraps `module` (registered as child "module", so parameters are "module.<name>"). The
// constructor broadcasts rank 0's parameters and buffers to every rank. Usage per step:
//   Tensor loss = loss_fn(ddp(x), y);  // forward through the wrapper: it arms the reduction
//   loss.backward();                    // buckets are all-reduced during backward
//   opt.step();                         // .grad holds the average over ranks
// All ranks must run the same number of backward passes with gradient sync.
class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> pg, DDPOptions opts = {});
  ~DistributedDataParallel() override;

  Tensor forward(const Tensor& x) override;
  // What forward does besides calling the module, for models called some other way: call it
  // before the forward pass, and after_forward(output) when find_unused_parameters is on.
  void prepare_for_backward();
  void after_forward(const Tensor& output);

  // Waits until every bucket's all-reduce has finished and the averaged gradients are in
  // .grad. Runs by itself inside backward once the last bucket has been launched; calling it
  // again is free. Raises mg::Error naming the parameters that got no gradient when backward
  // ended without reaching them (turn on find_unused_parameters for such models).
  void finish();

  // Gradient accumulation: backward passes whose forward ran inside this guard do not
  // communicate; gradients accumulate locally in .grad and the next synced backward averages
  // the accumulated sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), prev_(ddp.sync_enabled_) {
      ddp_.sync_enabled_ = false;
    }
    ~NoSyncGuard() { ddp_.sync_enabled_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return pg_; }

  // Introspection (tests, docs): parameter indices (into module()->parameters()) per bucket,
  // in launch order, and how many buckets were launched while backward was still running.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  int64_t buckets_launched_in_backward() const { return launched_in_backward_; }
  int64_t bucket_bytes() const;

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in `flat`
    int64_t numel = 0;
    DType dtype = DType::f32;
    Tensor flat;         // the bucket's contiguous buffer
    size_t pending = 0;  // parameters not ready yet this iteration
    WorkPtr work;
  };

  void build_buckets(const DDPOptions& opts);
  void broadcast_state();
  void on_grad_ready(size_t index);
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void launch(Bucket& b);
  void finalize();
  void abandon();
  std::string unready_names() const;

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DDPOptions opts_;
  std::vector<Tensor> params_;  // module_->parameters() that require grad
  std::vector<std::string> names_;
  std::vector<size_t> bucket_of_;  // param index -> bucket
  std::vector<Bucket> buckets_;
  std::vector<uint64_t> hooks_;

  // Per-iteration state.
  bool sync_enabled_ = true;  // toggled by no_sync()
  bool armed_ = false;        // forward ran with sync on; backward should reduce
  std::vector<bool> ready_;
  size_t next_launch_ = 0;
  bool finalized_ = true;
  bool any_hook_fired_ = false;
  int64_t launched_in_backward_ = 0;
};

}  // namespace mg::dist
