// ZeRO-3 (distributed/fully_shard.h) against DDP, on any backend: the same parameters after 20
// steps, the model state each rank holds, the gathered working set, the full state dict.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <iostream>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "distributed/ddp.h"
#include "distributed/fully_shard.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "serialize/serialize.h"
#include "tests/distributed/ddp_cases.h"

namespace mg::dist::testing {

// f32 parameters after `steps` steps of two runs whose gradients differ only in the order of
// their sums (micro-batch averages added in another order, a clip coefficient from another
// summation of squares): each gradient differs by a few ulps (2^-24 relative). SGD carries that
// into the parameter as lr * |g| * 2^-22 a step; AdamW's normalized step m / sqrt(v) moves by the
// same few ulps relative, lr * 2^-22 a step. Over 20 steps at lr 0.01 that stays below 1e-7
// absolute; the bound keeps a factor of ten: 1e-6 + 1e-5 |p|.
constexpr double kZero3Atol = 1e-6, kZero3Rtol = 1e-5;

// Two GPU runs of one training whose backward kernels accumulate atomically differ in their
// gradients' last bits; AdamW's step m / sqrt(v) is insensitive to such changes except where a
// gradient is near zero, where its direction may flip: each step can then differ by up to
// 2 lr in one element. 20 steps at lr 0.01 of the tiny GPT, measured, stay far below that
// worst case; the bound, 1e-3, is 1/20 of one step's full move: a wrong or stale unit (a step
// taken on other parameters) moves every element by about lr and fails it.
constexpr double kGpuTrainingAtol = 1e-3;

enum class Zero3Opt { Sgd, AdamW };

inline std::unique_ptr<optim::Optimizer> zero3_optimizer(Zero3Opt kind, std::vector<Tensor> params) {
  if (kind == Zero3Opt::Sgd) {
    optim::SGDOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    return std::make_unique<optim::SGD>(std::move(params), o);
  }
  optim::AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  return std::make_unique<optim::AdamW>(std::move(params), o);
}

// The largest |a - b| over two state dicts' common tensors (0: bitwise equal).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.cpu().to_vector<double>(), y = b.cpu().to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

struct Zero3Case {
  Backend backend = Backend::Cpu;
  int world = 2;
  Zero3Opt opt = Zero3Opt::AdamW;
  int micro = 1;      // micro-batches a step (gradient accumulation)
  double clip = 0.0;  // > 0: clip the global norm
  int steps = 20;
  // >= 0: at this step a forward first fails in its last unit (an out-of-memory error would);
  // ParamUnits::abandon_step, and the step runs again.
  int abort_step = -1;
};

// small_mlp's three Linears as three units (no root); DDP over an identical model beside it.
// Bitwise equal where the reduction order is the same (one micro-batch, no clipping); else
// within kZero3Atol/Rtol.
inline void zero3_mlp_matches_ddp(const Zero3Case& c) {
  run_ranks(c.world, [&](int rank, int W) {
    auto pg = join(c.backend);
    const Device dev = pg->device();
    auto model = small_mlp(11, DType::f32, dev), refm = small_mlp(11, DType::f32, dev);
    DistributedDataParallel ddp(refm, pg);
    std::vector<std::vector<Tensor>> units;
    std::vector<size_t> unit_of;  // the unit of each child, or -1
    for (const auto& child : model->children()) {
      auto params = child->parameters();
      unit_of.push_back(params.empty() ? static_cast<size_t>(-1) : units.size());
      if (!params.empty()) units.push_back(params);
    }
    FullyShardOptions fo;
    fo.keep = {};
    auto fsdp = fully_shard(units, pg, fo);
    auto opt = zero3_optimizer(c.opt, fsdp.source->shards());
    auto ref_opt = zero3_optimizer(c.opt, refm->parameters());
    const auto children = model->children();
    auto forward = [&](Tensor x) {
      for (size_t i = 0; i < children.size(); ++i)
        x = unit_of[i] == static_cast<size_t>(-1)
                ? (*children[i])(x)
                : fsdp.units->run(
                      unit_of[i], [&](const Tensor& in) { return (*children[i])(in); }, x);
      return x;
    };
    const int64_t B = 8;
    for (int step = 0; step < c.steps; ++step) {
      Generator data_gen(100 + step);
      Tensor X = randn({W * B, 6}, {}, &data_gen).to(dev), Y = randn({W * B, 3}, {}, &data_gen).to(dev);
      if (step == c.abort_step) {
        const size_t last = units.size() - 1;
        EXPECT_THROW(
            {
              Tensor h = raw::contiguous(raw::slice(X, 0, 0, B, 1));
              for (size_t i = 0; i < children.size(); ++i)
                h = unit_of[i] == static_cast<size_t>(-1) ? (*children[i])(h)
                    : unit_of[i] == last
                        ? fsdp.units->run(
                              last, [](const Tensor&) -> Tensor { MG_THROW(OutOfMemoryError, "test"); }, h)
                        : fsdp.units->run(
                              unit_of[i], [&](const Tensor& in) { return (*children[i])(in); }, h);
            },
            OutOfMemoryError);
        fsdp.units->abandon_step();
        for (const Tensor& p : model->parameters())
          EXPECT_TRUE(storage_released(p.storage())) << "a unit stayed gathered after abandon_step";
      }
      const int64_t rows = B / c.micro;
      for (int k = 0; k < c.micro; ++k) {
        const int64_t r0 = rank * B + k * rows;
        Tensor x = raw::contiguous(raw::slice(X, 0, r0, r0 + rows, 1));
        Tensor y = raw::contiguous(raw::slice(Y, 0, r0, r0 + rows, 1));
        (mse_loss(forward(x), y) * (1.0 / c.micro)).backward();
        (mse_loss(ddp(x), y) * (1.0 / c.micro)).backward();
        for (const Tensor& p : model->parameters())
          EXPECT_TRUE(storage_released(p.storage())) << "a unit stayed gathered after backward";
      }
      if (c.clip > 0) {
        const double a = fsdp.source->clip_grad_norm_(c.clip), b = optim::clip_grad_norm_(refm->parameters(), c.clip);
        EXPECT_NEAR(a, b, 1e-5 * b) << "step " << step;  // two summation orders of f32 squares
      }
      opt->step();
      ref_opt->step();
      opt->zero_grad();
      ref_opt->zero_grad();
    }
    const StateDict full = fsdp.full_state_dict(*model), ref = refm->state_dict();
    const bool exact = c.micro == 1 && c.clip == 0;
    for (const auto& [name, t] : ref.tensors) {
      ASSERT_TRUE(full.tensors.count(name)) << name;
      if (exact)
        EXPECT_EQ(max_abs_diff(full.tensors.at(name), t), 0.0) << name << " after " << c.steps << " steps";
      else
        EXPECT_TRUE(all_close(full.tensors.at(name), t, kZero3Rtol, kZero3Atol)) << name;
    }
    EXPECT_EQ(fsdp.source->reductions(), static_cast<int64_t>(c.steps * c.micro * units.size()));
  });
}

inline nn::GPTConfig zero3_gpt_config() {
  nn::GPTConfig cfg;
  cfg.vocab_size = 64;
  cfg.block_size = 16;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  return cfg;
}

// GPT (tied head, every block checkpointed on both sides so that both run the same ops) as
// root + one unit a block, AdamW, 20 steps: the parameters equal DDP's bitwise. The full state
// dict loads into a freshly sharded model of another init, which then holds the same values.
// On a GPU the two models' runs are not bitwise reproducible (atomic accumulations in backward
// kernels sum in any order): there the bound is kGpuTrainingAtol.
inline void zero3_gpt_matches_ddp(Backend backend, int world, int prefetch) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    const nn::GPTConfig cfg = zero3_gpt_config();
    Generator g1(5), g2(5);
    auto model = std::make_shared<nn::GPT>(cfg, TensorOptions{}, &g1);
    auto refm = std::make_shared<nn::GPT>(cfg, TensorOptions{}, &g2);
    model->to(dev);
    refm->to(dev);
    model->recompute.checkpoint_blocks = refm->recompute.checkpoint_blocks = true;
    DistributedDataParallel ddp(refm, pg);
    FullyShardOptions fo;
    fo.prefetch = prefetch;
    auto fsdp = fully_shard(nn::gpt_param_units(*model), pg, fo);
    model->recompute.units = fsdp.units.get();
    auto opt = zero3_optimizer(Zero3Opt::AdamW, fsdp.source->shards());
    auto ref_opt = zero3_optimizer(Zero3Opt::AdamW, refm->parameters());
    const int64_t B = 2, T = 16;
    for (int step = 0; step < 20; ++step) {
      Generator data_gen(300 + step);
      Tensor idx = randint(0, cfg.vocab_size, {W * B, T + 1}, {DType::i64}, &data_gen).to(dev);
      Tensor mine = raw::contiguous(raw::slice(idx, 0, rank * B, (rank + 1) * B, 1));
      Tensor x = raw::contiguous(raw::slice(mine, 1, 0, T, 1)), y = raw::contiguous(raw::slice(mine, 1, 1, T + 1, 1));
      nn::GPT::loss(model->forward(x), y).backward();
      nn::GPT::loss(ddp(x), y).backward();
      opt->step();
      ref_opt->step();
      opt->zero_grad();
      ref_opt->zero_grad();
    }
    const ParamUnits::Stats st = fsdp.units->stats();
    // The gathered working set: the running block and the ones prefetched, never more.
    EXPECT_LE(st.peak_gathered_units, 1 + prefetch);
    EXPECT_GE(st.peak_gathered_units, 1);
    const StateDict full = fsdp.full_state_dict(*model), ref = refm->state_dict();
    double worst = 0;
    for (const auto& [name, t] : ref.tensors) {
      const double d = max_abs_diff(full.tensors.at(name), t);
      worst = std::max(worst, d);
      EXPECT_LE(d, backend == Backend::Cpu ? 0.0 : kGpuTrainingAtol) << name << " after 20 steps";
    }
    if (rank == 0) std::cout << "[zero3 gpt] largest parameter difference from DDP: " << worst << std::endl;

    Generator g3(6);
    auto other = std::make_shared<nn::GPT>(cfg, TensorOptions{}, &g3);
    other->to(dev);
    auto fsdp2 = fully_shard(nn::gpt_param_units(*other), pg, fo);
    fsdp2.load_full_state_dict(*other, full);
    const StateDict back = fsdp2.full_state_dict(*other);
    for (const auto& [name, t] : full.tensors) EXPECT_EQ(max_abs_diff(back.tensors.at(name), t), 0.0) << name;
  });
}

// The model state `dev` holds now, by the allocator's categories: parameters, gradients and
// optimizer state.
inline int64_t model_state_bytes(Device dev) {
  int64_t n = 0;
  for (MemoryCategory c : {MemoryCategory::Parameters, MemoryCategory::Gradients, MemoryCategory::OptimizerState})
    n += CategoryStats::get(dev).counter(c).current;
  return n;
}

// Per rank, measured by the allocator's categories: DDP's model state (parameters, gradients,
// optimizer state after a step, gradients kept) against ZeRO-3's, each measured alone as the
// growth over what the rank held before it; ZeRO-3's is at most 1/N + 5 % of DDP's. The gathered
// parameters peak at the root and two blocks.
inline void zero3_memory_case(Backend backend, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    nn::GPTConfig cfg = zero3_gpt_config();
    cfg.n_embd = 64;
    cfg.n_head = 4;
    auto held = [&] { return model_state_bytes(dev); };
    Tensor idx = randint(0, cfg.vocab_size, {2, 17}, {DType::i64}).to(dev);
    Tensor x = raw::contiguous(raw::slice(idx, 1, 0, 16, 1)), y = raw::contiguous(raw::slice(idx, 1, 1, 17, 1));
    int64_t ddp_bytes = 0, zero3_bytes = 0;
    {
      const int64_t before = held();
      auto m = std::make_shared<nn::GPT>(cfg);
      m->to(dev);
      DistributedDataParallel ddp(m, pg);
      auto opt = zero3_optimizer(Zero3Opt::AdamW, m->parameters());
      nn::GPT::loss(ddp(x), y).backward();
      opt->step();
      ddp_bytes = held() - before;
    }
    {
      const int64_t before = held();
      auto m = std::make_shared<nn::GPT>(cfg);
      m->to(dev);
      auto fsdp = fully_shard(nn::gpt_param_units(*m), pg);
      m->recompute.units = fsdp.units.get();
      auto opt = zero3_optimizer(Zero3Opt::AdamW, fsdp.source->shards());
      CategoryStats::get(dev).reset_peak();
      const int64_t gathered_before = CategoryStats::get(dev).counter(MemoryCategory::Gathered).current;
      nn::GPT::loss(m->forward(x), y).backward();
      opt->step();
      zero3_bytes = held() - before;
      const int64_t gathered_peak = CategoryStats::get(dev).counter(MemoryCategory::Gathered).peak - gathered_before;
      EXPECT_LE(gathered_peak, fsdp.units->unit_bytes(0) + 2 * fsdp.units->unit_bytes(1))
          << "the gathered parameters: the root and at most two blocks";
      EXPECT_GE(gathered_peak, fsdp.units->unit_bytes(0) + fsdp.units->unit_bytes(1));
    }
    if (rank == 0)
      std::cout << "[zero3 memory] world " << W << ": model state " << zero3_bytes << " bytes a rank, DDP's "
                << ddp_bytes << " (" << static_cast<double>(zero3_bytes) / static_cast<double>(ddp_bytes) << ")"
                << std::endl;
    EXPECT_GT(ddp_bytes, 0);
    EXPECT_LE(static_cast<double>(zero3_bytes), (1.0 / W + 0.05) * static_cast<double>(ddp_bytes))
        << "ZeRO-3 " << zero3_bytes << " bytes of model state against DDP's " << ddp_bytes;
  });
}

// ZeRO-3 with its shards in host memory (FullyShardOptions::offload_to_host): a GPT (tied head,
// checkpointed blocks) with AdamW, clipped at 0.05, stepped on the host, equals DDP after 20
// steps (on the CPU within kZero3Atol/Rtol: the clip coefficient comes from another summation of
// the squares; on a GPU within kGpuTrainingAtol, the host AdamW beside the device's). The shards, their gradients and
// the optimizer's state are host tensors (pinned on a GPU); after a step the device holds none of the model's state:
// its parameters, gradients and optimizer-state categories grow by no more than 5 % of DDP's model state (on a GPU; on
// the CPU backend host and device are one memory).
inline void zero3_host_shards_case(Backend backend, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    const nn::GPTConfig cfg = zero3_gpt_config();
    auto held = [&] { return model_state_bytes(dev); };
    const int64_t before = held();
    Generator g1(5), g2(5);
    auto model = std::make_shared<nn::GPT>(cfg, TensorOptions{}, &g1);
    model->to(dev);
    model->recompute.checkpoint_blocks = true;
    FullyShardOptions fo;
    fo.offload_to_host = true;
    auto fsdp = fully_shard(nn::gpt_param_units(*model), pg, fo);
    model->recompute.units = fsdp.units.get();
    EXPECT_EQ(fsdp.source->shard_device(), Device::cpu());
    auto opt = zero3_optimizer(Zero3Opt::AdamW, fsdp.source->shards());
    const int64_t B = 2, T = 16;
    auto batch = [&](int step) {
      Generator data_gen(300 + step);
      Tensor idx = randint(0, cfg.vocab_size, {W * B, T + 1}, {DType::i64}, &data_gen).to(dev);
      Tensor mine = raw::contiguous(raw::slice(idx, 0, rank * B, (rank + 1) * B, 1));
      return std::make_pair(raw::contiguous(raw::slice(mine, 1, 0, T, 1)),
                            raw::contiguous(raw::slice(mine, 1, 1, T + 1, 1)));
    };
    auto sharded_step = [&](int step) {
      auto [x, y] = batch(step);
      nn::GPT::loss(model->forward(x), y).backward();
      fsdp.source->clip_grad_norm_(0.05);
      opt->step();
    };
    sharded_step(0);
    for (const Tensor& s : fsdp.source->shards()) {
      EXPECT_TRUE(s.device().is_cpu());
      ASSERT_TRUE(s.grad().defined());
      EXPECT_TRUE(s.grad().device().is_cpu());
      if (dev.is_cuda()) EXPECT_TRUE(cuda::is_pinned(s));
    }
    for (const auto& [key, t] : opt->state_dict().tensors) EXPECT_TRUE(t.device().is_cpu()) << key;
    const int64_t on_device = held() - before;
    opt->zero_grad();

    const int64_t before_ddp = held();
    auto refm = std::make_shared<nn::GPT>(cfg, TensorOptions{}, &g2);
    refm->to(dev);
    refm->recompute.checkpoint_blocks = true;
    DistributedDataParallel ddp(refm, pg);
    auto ref_opt = zero3_optimizer(Zero3Opt::AdamW, refm->parameters());
    auto ddp_step = [&](int step) {
      auto [x, y] = batch(step);
      nn::GPT::loss(ddp(x), y).backward();
      optim::clip_grad_norm_(refm->parameters(), 0.05);
      ref_opt->step();
    };
    ddp_step(0);
    const int64_t ddp_bytes = held() - before_ddp;
    ref_opt->zero_grad();
    if (dev.is_cuda())
      EXPECT_LE(static_cast<double>(on_device), 0.05 * static_cast<double>(ddp_bytes))
          << "model state left on the device with the shards in host memory";
    for (int step = 1; step < 20; ++step) {
      sharded_step(step);
      ddp_step(step);
      opt->zero_grad();
      ref_opt->zero_grad();
    }
    const StateDict full = fsdp.full_state_dict(*model), ref = refm->state_dict();
    double worst = 0;
    for (const auto& [name, t] : ref.tensors) {
      worst = std::max(worst, max_abs_diff(full.tensors.at(name), t));
      if (backend == Backend::Cpu)
        EXPECT_TRUE(all_close(full.tensors.at(name), t, kZero3Rtol, kZero3Atol)) << name << " after 20 steps";
      else
        EXPECT_LE(max_abs_diff(full.tensors.at(name), t), kGpuTrainingAtol) << name << " after 20 steps";
    }
    if (rank == 0)
      std::cout << "[zero3 host shards] world " << W << ": largest parameter difference from DDP " << worst
                << "; model state on the device after a step " << on_device << " bytes, DDP's " << ddp_bytes
                << std::endl;
  });
}

// A GPT step of the sharded model and of DDP beside it, on step `step`'s data (every rank its
// slice of a global batch of W * 2 sequences).
inline void zero3_gpt_step(int step, int rank, int W, Device dev, nn::GPT& model, DistributedDataParallel& ddp,
                           optim::Optimizer& opt, optim::Optimizer& ref_opt) {
  const nn::GPTConfig cfg = zero3_gpt_config();
  const int64_t B = 2, T = 16;
  Generator data_gen(300 + step);
  Tensor idx = randint(0, cfg.vocab_size, {W * B, T + 1}, {DType::i64}, &data_gen).to(dev);
  Tensor mine = raw::contiguous(raw::slice(idx, 0, rank * B, (rank + 1) * B, 1));
  Tensor x = raw::contiguous(raw::slice(mine, 1, 0, T, 1)), y = raw::contiguous(raw::slice(mine, 1, 1, T + 1, 1));
  nn::GPT::loss(model.forward(x), y).backward();
  nn::GPT::loss(ddp(x), y).backward();
  opt.step();
  ref_opt.step();
  opt.zero_grad();
  ref_opt.zero_grad();
}

// Every tensor of `want` is in `got` with the same shape and bit for bit the same values.
inline void expect_same_tensors(const StateDict& got, const StateDict& want, const std::string& what) {
  EXPECT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (const auto& [name, t] : want.tensors) {
    auto it = got.tensors.find(name);
    ASSERT_TRUE(it != got.tensors.end()) << what << ": no " << name;
    ASSERT_EQ(it->second.sizes(), t.sizes()) << what << ": " << name;
    EXPECT_EQ(max_abs_diff(it->second, t), 0.0) << what << ": " << name;
  }
}

// Sharded checkpoints of a GPT (tied head, AdamW) saved by ZeRO-3 on `save_world` ranks after 5
// steps, beside DDP trained on the same data, which saves its model and optimizer whole:
// - read in one process, the directory gives DDP's parameters and DDP's AdamW state bitwise (the
//   two trainings are bitwise equal on the CPU), and a one-process AdamW loads that state;
// - loaded on `load_world` ranks (other slices), the model and optimizer state gathered again
//   equal what was saved, bitwise, and 5 more steps equal DDP resumed from its own checkpoint;
// - a model of another shape is refused naming the parameter; a missing shard, a shard of
//   another save, a missing index are IOErrors naming the file.
inline void zero3_sharded_checkpoint_case(Backend backend, int save_world, int load_world) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                           "/zero3_ckpt_" + std::to_string(save_world) + "_" + std::to_string(load_world);
  const std::string dir = root + "/sharded", ref_model = root + "/ddp_model.safetensors",
                    ref_optim = root + "/ddp_optim.safetensors";
  const nn::GPTConfig cfg = zero3_gpt_config();
  auto build = [&](uint64_t seed, Device dev) {
    Generator g(seed);
    auto m = std::make_shared<nn::GPT>(cfg, TensorOptions{}, &g);
    m->to(dev);
    m->recompute.checkpoint_blocks = true;
    return m;
  };
  std::filesystem::create_directories(dir);
  run_ranks(save_world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    auto model = build(5, dev), refm = build(5, dev);
    DistributedDataParallel ddp(refm, pg);
    auto fsdp = fully_shard(nn::gpt_param_units(*model), pg);
    model->recompute.units = fsdp.units.get();
    auto opt = zero3_optimizer(Zero3Opt::AdamW, fsdp.source->shards());
    auto ref_opt = zero3_optimizer(Zero3Opt::AdamW, refm->parameters());
    for (int step = 0; step < 5; ++step) zero3_gpt_step(step, rank, W, dev, *model, ddp, *opt, *ref_opt);
    fsdp.save_sharded(*model, *opt, dir);
    if (rank == 0) {
      serialize::save(refm->state_dict(), ref_model);
      serialize::save(ref_opt->state_dict(), ref_optim);
    }
    pg->barrier();
  });
  // One process, no process group: the whole state back. (The ranks of the next run_ranks are
  // this test's binary again: what only the parent checks is under !in_child().)
  if (!in_child()) {
    const FullCheckpoint whole = read_fsdp_checkpoint(dir);
    const StateDict ddp_model = serialize::load(ref_model), ddp_optim = serialize::load(ref_optim);
    expect_same_tensors(whole.model, ddp_model, "the sharded checkpoint's parameters against DDP's");
    expect_same_tensors(whole.optimizer, ddp_optim, "the sharded checkpoint's AdamW state against DDP's");
    EXPECT_EQ(whole.optimizer.meta["state"], ddp_optim.meta["state"]);
    EXPECT_EQ(whole.optimizer.meta["type"], ddp_optim.meta["type"]);
    {
      auto plain = build(9, Device::cpu());
      plain->load_state_dict(whole.model);
      auto plain_opt = zero3_optimizer(Zero3Opt::AdamW, plain->parameters());
      plain_opt->load_state_dict(whole.optimizer);
      expect_same_tensors(plain_opt->state_dict(), ddp_optim, "a one-process AdamW loaded from the shards");
    }
  }

  run_ranks(load_world, [&](int rank, int W) {
    auto pg = join(backend);
    const Device dev = pg->device();
    auto model = build(6, dev), refm = build(7, dev);  // other initial values: all of it comes from the files
    auto fsdp = fully_shard(nn::gpt_param_units(*model), pg);
    model->recompute.units = fsdp.units.get();
    auto opt = zero3_optimizer(Zero3Opt::AdamW, fsdp.source->shards());
    fsdp.load_sharded(*model, *opt, dir);
    const FullCheckpoint whole = read_fsdp_checkpoint(dir);
    expect_same_tensors(fsdp.full_state_dict(*model), whole.model, "parameters resharded");
    const StateDict back = fsdp.full_optimizer_state_dict(*model, *opt);
    expect_same_tensors(back, whole.optimizer, "optimizer state resharded");
    EXPECT_EQ(back.meta["state"], whole.optimizer.meta["state"]);

    refm->load_state_dict(serialize::load(ref_model));
    DistributedDataParallel ddp(refm, pg);
    auto ref_opt = zero3_optimizer(Zero3Opt::AdamW, refm->parameters());
    ref_opt->load_state_dict(serialize::load(ref_optim));
    for (int step = 5; step < 10; ++step) zero3_gpt_step(step, rank, W, dev, *model, ddp, *opt, *ref_opt);
    expect_same_tensors(fsdp.full_state_dict(*model), refm->state_dict(), "5 steps after resuming, against DDP's");

    // A model of another shape cannot take these shards.
    nn::GPTConfig wide = cfg;
    wide.n_embd = 32;
    Generator g(8);
    auto other = std::make_shared<nn::GPT>(wide, TensorOptions{}, &g);
    other->to(dev);
    auto fsdp2 = fully_shard(nn::gpt_param_units(*other), pg);
    auto opt2 = zero3_optimizer(Zero3Opt::AdamW, fsdp2.source->shards());
    try {
      fsdp2.load_sharded(*other, *opt2, dir);
      ADD_FAILURE() << "a checkpoint of another shape was loaded";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("transformer.wte.weight"), std::string::npos) << e.what();
    }
  });

  // Broken directories: each error names the file.
  if (in_child()) return;
  auto expect_io_error = [](const std::string& d, const std::string& needle) {
    try {
      read_fsdp_checkpoint(d);
      ADD_FAILURE() << "read " << d << " without an error (expected one naming " << needle << ")";
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  namespace fs = std::filesystem;
  const std::string broken = root + "/broken";
  fs::remove_all(broken);
  fs::copy(dir, broken);
  const std::string last =
      "fsdp-shard-" + std::to_string(save_world - 1) + "-of-" + std::to_string(save_world) + ".safetensors";
  fs::remove(broken + "/" + last);
  expect_io_error(broken, last + " is missing (rank " + std::to_string(save_world - 1));
  // A shard of another save under the same name: the index's id tells them apart.
  fs::remove_all(broken);
  fs::copy(dir, broken);
  {
    StateDict shard = serialize::load(dir + "/" + last);
    shard.meta["fsdp"]["id"] = "1";
    serialize::save(shard, broken + "/" + last);
  }
  expect_io_error(broken, last + " (rank " + std::to_string(save_world - 1) + ") belongs to another save");
  fs::remove(broken + "/fsdp-index.json");
  expect_io_error(broken, "fsdp-index.json is missing");
}

// A rank killed between steps: the survivor's next forward (its first gather) raises
// DistributedError naming the dead rank within the group's timeout, and tearing the sharded model
// and the group down does not hang.
inline void zero3_dead_peer_case() {
  run_ranks(2,
            [](int rank, int) {
              auto pg = join(Backend::Cpu, 30);
              const nn::GPTConfig cfg = zero3_gpt_config();
              auto model = std::make_shared<nn::GPT>(cfg);
              auto fsdp = fully_shard(nn::gpt_param_units(*model), pg);
              model->recompute.units = fsdp.units.get();
              Tensor idx = randint(0, cfg.vocab_size, {2, 17}, {DType::i64});
              Tensor x = raw::contiguous(raw::slice(idx, 1, 0, 16, 1)),
                     y = raw::contiguous(raw::slice(idx, 1, 1, 17, 1));
              nn::GPT::loss(model->forward(x), y).backward();
              pg->barrier();
              pg->set_timeout(std::chrono::seconds(5));
              if (rank == 1) {
                std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is waiting in a gather
                std::fflush(nullptr);
                ::kill(::getpid(), SIGKILL);
              }
              const auto t0 = std::chrono::steady_clock::now();
              auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
              std::string msg = "(no error)";
              try {
                nn::GPT::loss(model->forward(x), y).backward();
              } catch (const DistributedError& e) {
                msg = e.what();
              }
              EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
              EXPECT_LT(since(), 5.0) << "took longer than the timeout: " << msg;
              model->recompute.units = nullptr;
              fsdp.units.reset();
              fsdp.source.reset();
              pg.reset();
              EXPECT_LT(since(), 5.0);
            },
            120, {}, {{1, 128 + SIGKILL}});
}

}  // namespace mg::dist::testing
