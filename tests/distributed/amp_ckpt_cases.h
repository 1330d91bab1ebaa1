// DDP composed with the other memory techniques: a model that checkpoints its blocks, run
// under bf16 autocast, must still reduce every bucket inside backward and match one process
// on the whole batch; and ZeRO-1 must shard Adam's two moments as it shards SGD's momentum.
#pragma once

#include "autograd/recompute.h"
#include "core/autocast.h"
#include "optim/adam.h"
#include "distributed/zero.h"
#include "tests/distributed/ddp_cases.h"

namespace mg::dist::testing {

// Three segments over small_mlp's layers, the first two checkpointed: the forward keeps only
// segment inputs, and the backward's replay produces the parameter gradients DDP's hooks see.
class CheckpointedMlp : public nn::Module {
 public:
  CheckpointedMlp(uint64_t seed, Device dev) : inner_(register_module("inner", small_mlp(seed, DType::f32, dev))) {}
  Tensor forward(const Tensor& x) override {
    auto& seq = *inner_;
    std::vector<std::function<Tensor(const Tensor&)>> fns;
    for (size_t i = 0; i < seq.size(); ++i) fns.push_back([&seq, i](const Tensor& t) { return (*seq[i])(t); });
    return checkpoint_sequential(fns, 3, x);
  }

 private:
  std::shared_ptr<nn::Sequential> inner_;
};

inline void ddp_checkpoint_autocast_case(Backend backend, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    auto model = std::make_shared<CheckpointedMlp>(2000 + rank, dev);  // rank 0's init must win
    auto ref = std::make_shared<CheckpointedMlp>(2000, dev);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0005});
    const int64_t replays0 = checkpoint_replay_count();
    auto mp = model->parameters(), rp = ref->parameters();
    const int64_t B = 4;
    for (int step = 0; step < 2; ++step) {
      Generator data_gen(301 + step);
      Tensor X = on(randn({W * B, 6}, {DType::f64}, &data_gen), DType::f32, dev);
      Tensor Y = on(randn({W * B, 3}, {DType::f64}, &data_gen), DType::f32, dev);
      Tensor x = raw::contiguous(raw::slice(X, 0, rank * B, (rank + 1) * B, 1));
      Tensor y = raw::contiguous(raw::slice(Y, 0, rank * B, (rank + 1) * B, 1));
      const int64_t launched = ddp.buckets_launched_in_backward();
      Tensor out, ref_out;
      {
        Autocast ac(dev.type, DType::bf16);
        out = ddp(x);
        ref_out = (*ref)(X);
      }
      EXPECT_EQ(out.dtype(), DType::bf16);
      mse_loss(out.to(DType::f32), y).backward();
      EXPECT_EQ(ddp.buckets_launched_in_backward() - launched, static_cast<int64_t>(ddp.bucket_assignment().size()));
      ddp.finish();
      mse_loss(ref_out.to(DType::f32), Y).backward();
      for (size_t i = 0; i < mp.size(); ++i) {
        ASSERT_TRUE(mp[i].grad().defined()) << "param " << i;
        EXPECT_EQ(mp[i].grad().dtype(), DType::f32);  // f32 master weights get f32 gradients
        // bf16 activations: per-row results may round differently at another batch size.
        EXPECT_TRUE(all_close(mp[i].grad(), rp[i].grad(), 3e-2, 3e-3)) << "step " << step << ", param " << i;
      }
      model->zero_grad();
      ref->zero_grad();
    }
    EXPECT_GE(checkpoint_replay_count() - replays0, 2 * 2 * 2);  // 2 checkpointed segments, 2 models, 2 steps
  });
}

// ZeRO-1 with Adam: each rank keeps exp_avg and exp_avg_sq for its own slice only, and the
// parameters follow plain Adam on the averaged gradients.
inline void zero_adam_case(Backend backend, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    const std::vector<Shape> shapes = {{9, 5}, {3}, {13, 2}, {1}};
    Generator init(3);
    std::vector<Tensor> ps, rs;
    int64_t total = 0;
    for (const Shape& s : shapes) {
      Tensor t = on(randn(s, {DType::f64}, &init), DType::f32, dev);
      ps.push_back(nn::parameter(raw::clone(t)));
      rs.push_back(nn::parameter(raw::clone(t)));
      total += shape_numel(s);
    }
    optim::AdamOptions ao;
    ao.lr = 0.01;
    ao.weight_decay = 0.01;
    ZeroOptions zo;
    zo.chunk_mb = 16.0 * 4 / 1048576.0;  // 16 elements per chunk: slices straddle parameters
    zo.reduce_gradients = true;          // every rank has its own gradients; Adam sees their mean
    ZeroRedundancyOptimizer zero(
        ps, pg, [&](std::vector<Tensor> shard) { return std::make_unique<optim::Adam>(shard, ao); }, zo);
    optim::Adam plain(rs, ao);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < ps.size(); ++i) {
        Tensor avg;
        for (int r = 0; r < W; ++r) {
          Generator gg(1000 * step + 10 * i + r);
          Tensor g = randn(shapes[i], {DType::f64}, &gg);
          avg = avg.defined() ? kernels::add(avg, g) : g;
          if (r == rank) ps[i].set_grad(on(g, DType::f32, dev));
        }
        rs[i].set_grad(on(kernels::mul_scalar(avg, 1.0 / W), DType::f32, dev));
      }
      zero.step();
      plain.step();
      for (size_t i = 0; i < ps.size(); ++i)
        EXPECT_TRUE(all_close(ps[i], rs[i], 1e-5, 1e-6)) << "step " << step << ", param " << i;
    }
    // Two f32 moments per element, split across ranks: together exactly plain Adam's state.
    Tensor state = on(full({1}, static_cast<double>(zero.state_nbytes()), {DType::i64}), DType::i64, dev);
    pg->all_reduce(state, ReduceOp::Sum);
    EXPECT_EQ(plain.state_nbytes(), total * 2 * 4);
    EXPECT_GE(state.cpu().item<int64_t>(), total * 2 * 4);
    EXPECT_LE(zero.state_nbytes(), plain.state_nbytes() / W + 2 * 4 * 16);
  });
}

}  // namespace mg::dist::testing
