// Tensor parallel layers against the unsharded layers (outputs and every gradient); ZeRO-1 and
// ZeRO-2 against a plain optimizer, their state gathered whole and saved in shards. Shared by the
// CPU and NCCL binaries.
#pragma once

#include <filesystem>

#include "distributed/tensor_parallel.h"
#include "distributed/zero.h"
#include "optim/clip_grad.h"
#include "tests/distributed/ddp_cases.h"

namespace mg::dist::testing {

inline Tensor slice_dim(const Tensor& t, int64_t dim, int64_t start, int64_t len) {
  return raw::contiguous(raw::slice(t, dim, start, start + len, 1));
}

// A loss that weighs every output element differently (a plain sum would hide errors).
inline Tensor weighted(const Tensor& y, uint64_t seed) {
  Generator g(seed);
  Tensor w = on(randn(y.sizes(), {DType::f64}, &g), y.dtype(), y.device());
  return sum(mul(y, w));
}

inline void column_parallel_case(Backend backend, DType dt, int world, bool gather_output) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    const int64_t in = 8, out = 12, n = out / W;
    Generator g1(3), g2(3);
    nn::Linear full(in, out, true, {dt}, &g1);
    full.to(dev);
    ColumnParallelLinear col(in, out, pg, true, gather_output, {dt, dev}, &g2);  // same draws, sliced
    ASSERT_EQ(col.weight.sizes(), (Shape{n, in}));
    EXPECT_TRUE(all_close(col.weight, slice_dim(full.weight, 0, rank * n, n), 0, 0)) << "init shard";
    Generator xg(9);
    Tensor x0 = on(randn({2, 3, in}, {DType::f64}, &xg), dt, dev);
    Tensor x = raw::clone(x0).requires_grad_(), xr = raw::clone(x0).requires_grad_();
    Tensor y = col(x), yr = full(xr);
    weighted(yr, 5).backward();
    if (gather_output) {
      EXPECT_TRUE(all_close(y, yr, rtol_for(dt), atol_for(dt))) << "output";
      weighted(y, 5).backward();
    } else {
      Tensor yr_mine = slice_dim(yr, 2, rank * n, n);
      EXPECT_TRUE(all_close(y, yr_mine, rtol_for(dt), atol_for(dt))) << "output slice";
      // Each rank's share of the same weighted loss: the weights for its columns.
      Generator wg(5);
      Tensor w = on(randn(yr.sizes(), {DType::f64}, &wg), dt, dev);
      sum(mul(y, slice_dim(w, 2, rank * n, n))).backward();
    }
    EXPECT_TRUE(all_close(x.grad(), xr.grad(), rtol_for(dt), atol_for(dt))) << "input gradient";
    EXPECT_TRUE(all_close(col.weight.grad(), slice_dim(full.weight.grad(), 0, rank * n, n), rtol_for(dt), atol_for(dt)))
        << "weight gradient";
    EXPECT_TRUE(all_close(col.bias.grad(), slice_dim(full.bias.grad(), 0, rank * n, n), rtol_for(dt), atol_for(dt)))
        << "bias gradient";
  });
}

inline void row_parallel_case(Backend backend, DType dt, int world, bool input_is_parallel) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    const int64_t in = 12, out = 5, n = in / W;
    Generator g1(4);
    nn::Linear full(in, out, true, {dt}, &g1);
    full.to(dev);
    RowParallelLinear row(full, pg, input_is_parallel, dev);
    Generator xg(10);
    Tensor x0 = on(randn({3, in}, {DType::f64}, &xg), dt, dev);
    Tensor xr = raw::clone(x0).requires_grad_();
    Tensor x = input_is_parallel ? slice_dim(x0, 1, rank * n, n) : raw::clone(x0);
    x.requires_grad_();
    Tensor y = row(x), yr = full(xr);
    EXPECT_TRUE(all_close(y, yr, rtol_for(dt), atol_for(dt))) << "output";
    weighted(y, 6).backward();
    weighted(yr, 6).backward();
    Tensor want_x = input_is_parallel ? slice_dim(xr.grad(), 1, rank * n, n) : xr.grad();
    EXPECT_TRUE(all_close(x.grad(), want_x, rtol_for(dt), atol_for(dt))) << "input gradient";
    EXPECT_TRUE(all_close(row.weight.grad(), slice_dim(full.weight.grad(), 1, rank * n, n), rtol_for(dt), atol_for(dt)))
        << "weight gradient";
    EXPECT_TRUE(all_close(row.bias.grad(), full.bias.grad(), rtol_for(dt), atol_for(dt))) << "bias gradient";
  });
}

// GPT-2's MLP (n_embd 8, hidden 32) split across ranks vs nn::MLP: output, input gradient,
// each shard's gradients; and the seeded constructor draws the same layer as nn::MLP.
inline void tp_mlp_case(Backend backend, DType dt, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    nn::TransformerBlockOptions o;
    o.n_embd = 8;
    o.n_head = 2;
    o.dropout = 0.0;
    const int64_t hidden = 4 * o.n_embd, h = hidden / W;
    Generator g1(21), g2(21);
    nn::MLP full(o, {dt}, &g1);
    full.to(dev);
    TensorParallelMLP tp(full, pg, dev);
    TensorParallelMLP seeded(o, pg, {dt, dev}, &g2);
    Generator xg(12);
    Tensor x0 = on(randn({2, 5, o.n_embd}, {DType::f64}, &xg), dt, dev);
    Tensor x = raw::clone(x0).requires_grad_(), xr = raw::clone(x0).requires_grad_();
    Tensor y = tp(x), yr = full(xr);
    EXPECT_TRUE(all_close(y, yr, rtol_for(dt), atol_for(dt))) << "output";
    {
      NoGradGuard ng;
      EXPECT_TRUE(all_close(seeded(x0), yr, rtol_for(dt), atol_for(dt))) << "seeded constructor output";
    }
    weighted(y, 8).backward();
    weighted(yr, 8).backward();
    const double rt = rtol_for(dt), at = atol_for(dt);
    EXPECT_TRUE(all_close(x.grad(), xr.grad(), rt, at)) << "input gradient";
    EXPECT_TRUE(all_close(tp.c_fc->weight.grad(), slice_dim(full.c_fc->weight.grad(), 0, rank * h, h), rt, at));
    EXPECT_TRUE(all_close(tp.c_fc->bias.grad(), slice_dim(full.c_fc->bias.grad(), 0, rank * h, h), rt, at));
    EXPECT_TRUE(all_close(tp.c_proj->weight.grad(), slice_dim(full.c_proj->weight.grad(), 1, rank * h, h), rt, at));
    EXPECT_TRUE(all_close(tp.c_proj->bias.grad(), full.c_proj->bias.grad(), rt, at));
    EXPECT_EQ(tp.num_parameters() * W - (W - 1) * o.n_embd, full.num_parameters()) << "shards + replicated bias";
  });
}

// ZeRO-1 (SGD with momentum, Nesterov, weight decay) vs plain SGD over a few steps, with odd
// parameter sizes and tiny chunks so slices straddle parameters and the flat space is padded.
// reduce_gradients: each rank has its own gradients; the reference steps on their average.
inline void zero_matches_plain_case(Backend backend, DType dt, int world, bool reduce_gradients) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    const std::vector<Shape> shapes = {{7, 5}, {3}, {11, 2}, {1}, {4, 4}};
    Generator pg_gen(1);
    std::vector<Tensor> ps, rs;
    int64_t total = 0;
    for (const Shape& s : shapes) {
      Tensor t = on(randn(s, {DType::f64}, &pg_gen), dt, dev);
      ps.push_back(nn::parameter(raw::clone(t)));
      rs.push_back(nn::parameter(raw::clone(t)));
      total += shape_numel(s);
    }
    const optim::SGDOptions so{.lr = 0.1, .momentum = 0.9, .dampening = 0.0, .weight_decay = 0.01, .nesterov = true};
    ZeroOptions zo;
    zo.chunk_mb = 24.0 * dtype_size(dt) / 1048576.0;  // 24 elements per chunk
    zo.reduce_gradients = reduce_gradients;
    ZeroRedundancyOptimizer zero(
        ps, pg, [&](std::vector<Tensor> shard) { return std::make_unique<optim::SGD>(shard, so); }, zo);
    optim::SGD plain(rs, so);
    EXPECT_GE(zero.shard_numel() * W, total);
    EXPECT_LT(zero.shard_numel() * W, total + W * 8);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < ps.size(); ++i) {
        Tensor avg;
        for (int r = 0; r < W; ++r) {
          Generator gg(100 * step + 10 * i + (reduce_gradients ? r : 0));
          Tensor g = randn(shapes[i], {DType::f64}, &gg);
          avg = avg.defined() ? kernels::add(avg, g) : g;
          if (r == rank) ps[i].set_grad(on(g, dt, dev));
        }
        rs[i].set_grad(on(kernels::mul_scalar(avg, 1.0 / W), dt, dev));
      }
      zero.step();
      plain.step();
      for (size_t i = 0; i < ps.size(); ++i)
        EXPECT_TRUE(all_close(ps[i], rs[i], rtol_for(dt), atol_for(dt))) << "step " << step << ", param " << i;
    }
    // Each rank keeps momentum for its own elements only: together exactly one copy.
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    EXPECT_LE(zero.state_nbytes(), zero.shard_numel() * es);
    Tensor state = on(full({1}, static_cast<double>(zero.state_nbytes()), {DType::i64}), DType::i64, dev);
    pg->all_reduce(state, ReduceOp::Sum);
    EXPECT_EQ(state.cpu().item<int64_t>(), total * es);
    EXPECT_EQ(plain.state_nbytes(), total * static_cast<int64_t>(dtype_size(dt)));
  });
}

// ZeRO-2: each rank trains the same MLP on its slice of a global batch with AdamW, the gradients
// reduce-scattered chunk by chunk during backward (tiny chunks: slices straddle parameters);
// the reference trains on the whole batch (its MSE is the mean of the ranks'). `micro` backwards
// per step (each on a part of the rank's slice, its loss scaled by 1/micro) add up in the
// reduced slices. After every backward no rank holds a full gradient, only its slices: together
// exactly one copy of the (padded) flat space. `clip` > 0: the global norm clipped to it from the
// slices, against optim::clip_grad_norm_ over the reference's full gradients (the same norm within
// the dtype's tolerance: two summation orders of the squares).
inline void zero2_matches_plain_case(Backend backend, DType dt, int world, int micro, double clip = 0) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    auto model = small_mlp(1000, dt, dev), ref = small_mlp(1000, dt, dev);
    const optim::AdamWOptions ao = [] {
      optim::AdamWOptions o;
      o.lr = 0.01;
      o.weight_decay = 0.1;
      return o;
    }();
    ZeroOptions zo;
    zo.chunk_mb = 24.0 * dtype_size(dt) / 1048576.0;  // 24 elements per chunk
    zo.stage = 2;
    ZeroRedundancyOptimizer zero(
        model->parameters(), pg, [&](std::vector<Tensor> shard) { return std::make_unique<optim::AdamW>(shard, ao); },
        zo);
    optim::AdamW plain(ref->parameters(), ao);
    const int64_t B = 4, es = static_cast<int64_t>(dtype_size(dt));
    for (int step = 0; step < 3; ++step) {
      Generator data_gen(77 + step);
      Tensor X = on(randn({W * B, 6}, {DType::f64}, &data_gen), dt, dev);
      Tensor Y = on(randn({W * B, 3}, {DType::f64}, &data_gen), dt, dev);
      const int64_t rows = B / micro;
      for (int k = 0; k < micro; ++k) {
        const int64_t r0 = rank * B + k * rows;
        Tensor x = raw::contiguous(raw::slice(X, 0, r0, r0 + rows, 1));
        Tensor y = raw::contiguous(raw::slice(Y, 0, r0, r0 + rows, 1));
        (mse_loss((*model)(x), y) * (1.0 / micro)).backward();
        for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "a full gradient was kept";
        EXPECT_EQ(zero.shard_grad_nbytes(), zero.shard_numel() * es);
        // Measured, not computed: what the allocator counts as gradients on this rank's device
        // after backward is its slices, 1/N of the padded flat space (the reference model holds
        // no gradient here: its backward comes after, its last ones were dropped).
        EXPECT_EQ(CategoryStats::get(dev).counter(MemoryCategory::Gradients).current, zero.shard_numel() * es);
      }
      mse_loss((*ref)(X), Y).backward();
      if (clip > 0) {
        const double a = zero.clip_grad_norm_(clip), b = optim::clip_grad_norm_(ref->parameters(), clip);
        EXPECT_NEAR(a, b, rtol_for(dt) * b) << "step " << step;  // two summation orders of the squares
        EXPECT_GT(b, clip) << "the test should clip";
      }
      zero.step();
      plain.step();
      zero.zero_grad();
      plain.zero_grad();
      auto mp = model->parameters(), rp = ref->parameters();
      for (size_t i = 0; i < mp.size(); ++i)
        EXPECT_TRUE(all_close(mp[i], rp[i], rtol_for(dt), atol_for(dt))) << "step " << step << ", param " << i;
    }
    // Every parameter has a gradient in every backward: each backward reduced every chunk.
    EXPECT_EQ(zero.chunks_reduced_in_backward(), 3 * micro * static_cast<int64_t>(zero.num_chunks()));
  });
}

// ZeRO's full state dict: after two AdamW steps (stage 2, 24-element chunks) the gathered state
// equals the one-process AdamW's, moments and steps; a ZeRO over 40-element chunks (stage 1: other
// slices) and a one-process AdamW both take it, and one more step on each gives the one-process
// parameters.
inline void zero_full_state_case(Backend backend, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    const DType dt = DType::f64;
    auto model = small_mlp(1000, dt, dev), ref = small_mlp(1000, dt, dev);
    optim::AdamWOptions ao;
    ao.lr = 0.01;
    ao.weight_decay = 0.1;
    auto adamw = [&](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(p, ao); };
    ZeroOptions zo;
    zo.chunk_mb = 24.0 * dtype_size(dt) / 1048576.0;
    zo.stage = 2;
    ZeroRedundancyOptimizer zero(model->parameters(), pg, adamw, zo);
    optim::AdamW plain(ref->parameters(), ao);
    const int64_t B = 4;
    auto batch = [&](int step) {
      Generator data_gen(77 + step);
      Tensor X = on(randn({W * B, 6}, {DType::f64}, &data_gen), dt, dev);
      Tensor Y = on(randn({W * B, 3}, {DType::f64}, &data_gen), dt, dev);
      return std::make_pair(X, Y);
    };
    for (int step = 0; step < 2; ++step) {
      auto [X, Y] = batch(step);
      Tensor x = raw::contiguous(raw::slice(X, 0, rank * B, (rank + 1) * B, 1));
      Tensor y = raw::contiguous(raw::slice(Y, 0, rank * B, (rank + 1) * B, 1));
      mse_loss((*model)(x), y).backward();
      mse_loss((*ref)(X), Y).backward();
      zero.step();
      plain.step();
      zero.zero_grad();
      plain.zero_grad();
    }
    const StateDict full = zero.full_state_dict(), want = plain.state_dict();
    EXPECT_EQ(full.meta["state"], want.meta["state"]);
    ASSERT_EQ(full.tensors.size(), want.tensors.size());
    for (const auto& [k, t] : want.tensors) {
      ASSERT_TRUE(full.tensors.count(k)) << k;
      EXPECT_TRUE(all_close(full.tensors.at(k), t, rtol_for(dt), atol_for(dt))) << k;
    }
    // Resharded: other chunks, stage 1 (its gradients are the averaged ones, as DDP leaves them).
    std::vector<Tensor> other, solo_params;
    for (const Tensor& p : ref->parameters()) {
      other.push_back(nn::parameter(raw::clone(p)));
      solo_params.push_back(nn::parameter(raw::clone(p)));
    }
    ZeroOptions zo1;
    zo1.chunk_mb = 40.0 * dtype_size(dt) / 1048576.0;
    ZeroRedundancyOptimizer resharded(other, pg, adamw, zo1);
    resharded.load_full_state_dict(full);
    optim::AdamW solo(solo_params, ao);
    solo.load_state_dict(full);
    auto [X, Y] = batch(2);
    mse_loss((*ref)(X), Y).backward();
    const auto rp = ref->parameters();
    for (size_t i = 0; i < rp.size(); ++i) {
      other[i].set_grad(raw::clone(rp[i].grad()));
      solo_params[i].set_grad(raw::clone(rp[i].grad()));
    }
    plain.step();
    resharded.step();
    solo.step();
    for (size_t i = 0; i < rp.size(); ++i) {
      EXPECT_TRUE(all_close(other[i], rp[i], rtol_for(dt), atol_for(dt))) << "resharded, param " << i;
      EXPECT_TRUE(all_close(solo_params[i], rp[i], rtol_for(dt), atol_for(dt))) << "one process, param " << i;
    }
  });
}

// Sharded checkpoints: 2 ranks train two AdamW steps (stage 2) and save their slices; the
// directory read whole equals the gathered state; 3 ranks (other slices) load it and take the
// next step to the one-process parameters; a directory missing a shard names the file.
inline void zero_sharded_checkpoint_case(Backend backend) {
  const DType dt = DType::f64;
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/zero_shards";
  optim::AdamWOptions ao;
  ao.lr = 0.01;
  ao.weight_decay = 0.1;
  auto adamw = [ao](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(p, ao); };
  const int64_t B = 4, W0 = 2;  // the saving run's ranks: its global batch has W0 * B rows
  auto batch = [&](int step, Device dev) {
    Generator data_gen(77 + step);
    Tensor X = on(randn({W0 * B, 6}, {DType::f64}, &data_gen), dt, dev);
    Tensor Y = on(randn({W0 * B, 3}, {DType::f64}, &data_gen), dt, dev);
    return std::make_pair(X, Y);
  };
  run_ranks(W0, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    auto model = small_mlp(1000, dt, dev);
    ZeroOptions zo;
    zo.chunk_mb = 24.0 * dtype_size(dt) / 1048576.0;
    zo.stage = 2;
    ZeroRedundancyOptimizer zero(model->parameters(), pg, adamw, zo);
    for (int step = 0; step < 2; ++step) {
      auto [X, Y] = batch(step, dev);
      Tensor x = raw::contiguous(raw::slice(X, 0, rank * B, (rank + 1) * B, 1));
      Tensor y = raw::contiguous(raw::slice(Y, 0, rank * B, (rank + 1) * B, 1));
      mse_loss((*model)(x), y).backward();
      zero.step();
      zero.zero_grad();
    }
    std::filesystem::create_directories(dir);
    zero.save_sharded(dir);
    const StateDict full = zero.full_state_dict(), read = ZeroRedundancyOptimizer::read_sharded(dir);
    EXPECT_EQ(read.meta["state"], full.meta["state"]);
    ASSERT_EQ(read.tensors.size(), full.tensors.size());
    for (const auto& [k, t] : full.tensors) EXPECT_TRUE(all_close(read.tensors.at(k), t, 0, 0)) << k;
    EXPECT_TRUE(std::filesystem::exists(dir + "/zero-shard-" + std::to_string(rank) + "-of-2.safetensors"));
  });
  run_ranks(3, [&](int, int) {
    auto pg = join(backend);
    const Device dev = pg->device();
    auto ref = small_mlp(1000, dt, dev);
    optim::AdamW plain(ref->parameters(), ao);
    for (int step = 0; step < 3; ++step) {
      auto [X, Y] = batch(step, dev);
      mse_loss((*ref)(X), Y).backward();
      if (step < 2) {
        plain.step();
        plain.zero_grad();
      }
    }
    // ref now holds the two-step parameters and the third step's gradients.
    std::vector<Tensor> mine;
    for (const Tensor& p : ref->parameters()) {
      mine.push_back(nn::parameter(raw::clone(p)));
      mine.back().set_grad(raw::clone(p.grad()));
    }
    ZeroOptions zo;
    zo.chunk_mb = 40.0 * dtype_size(dt) / 1048576.0;
    ZeroRedundancyOptimizer zero(mine, pg, adamw, zo);
    zero.load_sharded(dir);
    zero.step();
    plain.step();
    const auto rp = ref->parameters();
    for (size_t i = 0; i < rp.size(); ++i)
      EXPECT_TRUE(all_close(mine[i], rp[i], rtol_for(dt), atol_for(dt))) << "param " << i;
  });
  // A shard gone: the error names it.
  const std::string broken = dir + "_broken";
  std::filesystem::create_directories(broken);
  std::filesystem::copy_file(dir + "/zero-shard-0-of-2.safetensors", broken + "/zero-shard-0-of-2.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::remove(broken + "/zero-shard-1-of-2.safetensors");
  try {
    ZeroRedundancyOptimizer::read_sharded(broken);
    ADD_FAILURE() << "a missing shard was not noticed";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("zero-shard-1-of-2.safetensors is missing"), std::string::npos) << e.what();
  }
}

}  // namespace mg::dist::testing
