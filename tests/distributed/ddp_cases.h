// DDP against a single process: gradients on W ranks (each with 1/W of the batch) must equal
// the gradients of the same model on the whole batch. Shared by the CPU and NCCL binaries.
#pragma once

#include "autograd/functions.h"
#include "distributed/ddp.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "optim/sgd.h"
#include "tests/distributed/collective_cases.h"

namespace mg::dist::testing {

inline double rtol_for(DType dt) { return dt == DType::f64 ? 1e-10 : 2e-4; }
inline double atol_for(DType dt) { return dt == DType::f64 ? 1e-12 : 2e-5; }

inline std::shared_ptr<nn::Sequential> small_mlp(uint64_t seed, DType dt, Device dev) {
  Generator gen(seed);
  auto m = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 16, true, TensorOptions{dt}, &gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 8, true, TensorOptions{dt}, &gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 3, true, TensorOptions{dt}, &gen)});
  m->to(dev);
  return m;
}

struct DDPCase {
  Backend backend = Backend::Cpu;
  DType dtype = DType::f64;
  int world = 2;
  DDPOptions opts;
  int steps = 2;
};

// Every rank starts from a different init (rank 0's must win), trains `steps` SGD steps on its
// slice of a global batch; the reference trains on the whole batch. Gradients and parameters
// must match at every step, and every bucket must have been reduced inside backward.
inline void ddp_rank_matches_single_process(const DDPCase& c, const std::shared_ptr<ProcessGroup>& pg) {
  {
    const int rank = pg->rank(), W = pg->size();
    const Device dev = pg->device();
    const DType dt = c.dtype;
    auto model = small_mlp(1000 + rank, dt, dev);
    auto ref = small_mlp(1000, dt, dev);
    DistributedDataParallel ddp(model, pg, c.opts);
    auto mp = model->parameters(), rp = ref->parameters();
    ASSERT_EQ(mp.size(), rp.size());
    for (size_t i = 0; i < mp.size(); ++i) EXPECT_TRUE(all_close(mp[i], rp[i], 0, 0)) << "broadcast, param " << i;
    optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
    const int64_t B = 4;
    for (int step = 0; step < c.steps; ++step) {
      Generator data_gen(77 + step);
      Tensor X = on(randn({W * B, 6}, {DType::f64}, &data_gen), dt, dev);
      Tensor Y = on(randn({W * B, 3}, {DType::f64}, &data_gen), dt, dev);
      Tensor x = raw::contiguous(raw::slice(X, 0, rank * B, (rank + 1) * B, 1));
      Tensor y = raw::contiguous(raw::slice(Y, 0, rank * B, (rank + 1) * B, 1));
      const int64_t launched_before = ddp.buckets_launched_in_backward();
      mse_loss(ddp(x), y).backward();
      // Reduced inside backward: no finish() needed, every bucket launched from the hooks.
      EXPECT_EQ(ddp.buckets_launched_in_backward() - launched_before,
                static_cast<int64_t>(ddp.bucket_assignment().size()));
      ddp.finish();
      mse_loss((*ref)(X), Y).backward();
      for (size_t i = 0; i < mp.size(); ++i) {
        ASSERT_TRUE(mp[i].grad().defined()) << "param " << i;
        EXPECT_TRUE(all_close(mp[i].grad(), rp[i].grad(), rtol_for(dt), atol_for(dt)))
            << "step " << step << ", gradient of param " << i;
      }
      opt.step();
      ref_opt.step();
      opt.zero_grad();
      ref_opt.zero_grad();
      for (size_t i = 0; i < mp.size(); ++i)
        EXPECT_TRUE(all_close(mp[i], rp[i], rtol_for(dt), atol_for(dt))) << "step " << step << ", param " << i;
    }
  }
}

inline void ddp_matches_single_process(const DDPCase& c) {
  run_ranks(c.world, [&](int, int) { ddp_rank_matches_single_process(c, join(c.backend)); });
}

// no_sync: micro-batch 1 accumulates locally, micro-batch 2 syncs the accumulated sum. The
// result equals the reference's gradient accumulated over both global micro-batches.
inline void ddp_no_sync_accumulates(Backend backend, DType dt, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    auto model = small_mlp(5, dt, dev);
    auto ref = small_mlp(5, dt, dev);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0005});
    const int64_t B = 3;
    Generator data_gen(11);
    std::vector<Tensor> Xs, Ys;
    for (int m = 0; m < 2; ++m) {
      Xs.push_back(on(randn({W * B, 6}, {DType::f64}, &data_gen), dt, dev));
      Ys.push_back(on(randn({W * B, 3}, {DType::f64}, &data_gen), dt, dev));
    }
    auto mine = [&](const Tensor& t) { return raw::contiguous(raw::slice(t, 0, rank * B, (rank + 1) * B, 1)); };
    const int64_t launched0 = ddp.buckets_launched_in_backward();
    {
      auto guard = ddp.no_sync();
      mse_loss(ddp(mine(Xs[0])), mine(Ys[0])).backward();
    }
    EXPECT_EQ(ddp.buckets_launched_in_backward(), launched0) << "no_sync backward communicated";
    // Local (unsynced) gradients after micro-batch 1: equal a local model's.
    auto local = small_mlp(5, dt, dev);
    mse_loss((*local)(mine(Xs[0])), mine(Ys[0])).backward();
    auto mp = model->parameters(), lp = local->parameters(), rp = ref->parameters();
    for (size_t i = 0; i < mp.size(); ++i)
      EXPECT_TRUE(all_close(mp[i].grad(), lp[i].grad(), rtol_for(dt), atol_for(dt))) << "local grad " << i;
    mse_loss(ddp(mine(Xs[1])), mine(Ys[1])).backward();
    EXPECT_GT(ddp.buckets_launched_in_backward(), launched0);
    for (int m = 0; m < 2; ++m) mse_loss((*ref)(Xs[m]), Ys[m]).backward();
    for (size_t i = 0; i < mp.size(); ++i)
      EXPECT_TRUE(all_close(mp[i].grad(), rp[i].grad(), rtol_for(dt), atol_for(dt))) << "accumulated grad " << i;
  });
}

}  // namespace mg::dist::testing
