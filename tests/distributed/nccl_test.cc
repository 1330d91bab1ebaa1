// dist/ on NCCL, one process per GPU (this binary re-executed per rank with LOCAL_RANK = rank):
// the same cases as the CPU backend's, in f32 on the GPUs. Every test skips without enough
// GPUs or without the NCCL backend. NCCL_NVLS_ENABLE=0 is set in every rank.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "core/captured_step.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "distributed/launch_env.h"
#include "tests/distributed/amp_ckpt_cases.h"
#include "tests/distributed/tp_zero_cases.h"
#include "tests/distributed/zero3_cases.h"

namespace mg::dist {
namespace {

using namespace mg::dist::testing;
constexpr Backend kNccl = Backend::Nccl;

TEST(NcclCollectives, OneGpu) {
  MG_REQUIRE_GPUS(1);
  collectives_case(kNccl, DType::f32, 1);
}

TEST(NcclCollectives, TwoGpus) {
  MG_REQUIRE_GPUS(2);
  collectives_case(kNccl, DType::f32, 2);
  collectives_case(kNccl, DType::i64, 2);
  collectives_case(kNccl, DType::bf16, 2);
}

TEST(NcclCollectives, NvlsStaysOffAndTheDeviceIsTheLocalRank) {
  MG_REQUIRE_GPUS(2);
  run_ranks(2, [](int rank, int) {
    auto pg = join(kNccl);
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
    EXPECT_EQ(pg->device(), Device::cuda(rank));
    EXPECT_EQ(cuda::current_device(), rank);
    EXPECT_THROW(pg->all_reduce(ones({4})), DeviceError);  // a CPU tensor
  });
}

TEST(NcclDDP, GradientsEqualSingleGpuOnTheWholeBatch) {
  MG_REQUIRE_GPUS(2);
  ddp_matches_single_process({.backend = kNccl, .dtype = DType::f32, .world = 2});
  DDPCase c{.backend = kNccl, .dtype = DType::f32, .world = 2, .steps = 3};
  c.opts.bucket_cap_mb = 0.0005;
  c.opts.first_bucket_cap_mb = 0.0001;
  c.opts.gradient_as_bucket_view = true;
  ddp_matches_single_process(c);
}

TEST(NcclDDP, OneGpu) {
  MG_REQUIRE_GPUS(1);
  ddp_matches_single_process({.backend = kNccl, .dtype = DType::f32, .world = 1});
}

// DDP's bucketed all-reduce inside a CUDA graph: each rank captures its whole training step
// (forward, backward with the buckets' NCCL all-reduces, SGD) and replays it; the parameters
// end bitwise equal to the same DDP trained eagerly on the same batches.
void ddp_captured_matches_eager(int world) {
  run_ranks(world, [](int rank, int) {
    auto pg = join(kNccl);
    const Device dev = pg->device();
    Generator gen(40 + rank);  // each rank its own shard of the data
    std::vector<std::pair<Tensor, Tensor>> data;
    for (int i = 0; i < 6; ++i)
      data.emplace_back(on(randn({4, 6}, {DType::f64}, &gen), DType::f32, dev),
                        on(randn({4, 3}, {DType::f64}, &gen), DType::f32, dev));
    auto train = [&](bool graphed) {
      auto model = small_mlp(5, DType::f32, dev);
      DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0001});
      optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
      Tensor x = empty({4, 6}, {DType::f32, dev}), y = empty({4, 3}, {DType::f32, dev});
      size_t next = 0;
      auto load = [&] {
        raw::copy_(x, data[next].first);
        raw::copy_(y, data[next].second);
      };
      auto step = [&] {
        if (!cuda::is_capturing()) {
          load();
          ++next;
        }
        opt.zero_grad();
        mse_loss(ddp(x), y).backward();
        opt.step();
      };
      if (graphed) {
        CapturedStep captured(step, /*warmup=*/2);
        for (; next < data.size(); ++next) {
          load();
          captured.replay();
        }
      } else {
        while (next < data.size()) step();
      }
      cuda::synchronize();
      std::vector<std::vector<float>> out;
      for (const Tensor& p : model->parameters()) out.push_back(p.cpu().to_vector<float>());
      return out;
    };
    EXPECT_EQ(train(false), train(true)) << "rank " << rank;
  });
}

TEST(NcclDDP, CapturedStepMatchesEagerOneGpu) {
  MG_REQUIRE_GPUS(1);
  ddp_captured_matches_eager(1);
}

TEST(NcclDDP, CapturedStepMatchesEagerTwoGpus) {
  MG_REQUIRE_GPUS(2);
  ddp_captured_matches_eager(2);
}

TEST(NcclDDP, NoSyncAccumulates) {
  MG_REQUIRE_GPUS(2);
  ddp_no_sync_accumulates(kNccl, DType::f32, 2);
}

TEST(NcclTensorParallel, ColumnAndRowParallelLinearMatchLinear) {
  MG_REQUIRE_GPUS(2);
  column_parallel_case(kNccl, DType::f32, 2, true);
  column_parallel_case(kNccl, DType::f32, 2, false);
  row_parallel_case(kNccl, DType::f32, 2, false);
  row_parallel_case(kNccl, DType::f32, 2, true);
}

TEST(NcclTensorParallel, GPT2MLPMatchesUnsharded) {
  MG_REQUIRE_GPUS(2);
  tp_mlp_case(kNccl, DType::f32, 2);
}

TEST(NcclZero, StepEqualsPlainSGD) {
  MG_REQUIRE_GPUS(2);
  zero_matches_plain_case(kNccl, DType::f32, 2, false);
  zero_matches_plain_case(kNccl, DType::f32, 2, true);
}

// One GPU and two GPUs are separate tests, so a one-GPU machine reports the 2-GPU half SKIPPED.
TEST(NcclZero, ShardsAdamsMomentsOneGpu) {
  MG_REQUIRE_GPUS(1);
  zero_adam_case(kNccl, 1);
}

TEST(NcclZero, ShardsAdamsMomentsTwoGpus) {
  MG_REQUIRE_GPUS(2);
  zero_adam_case(kNccl, 2);
}

// ZeRO-2 through NCCL: the CPU backend's cases in f32 (gradients reduce-scattered in backward,
// micro-batches, the clipped norm), and the full state dict resharded; one GPU runs the same code
// at world size 1, two GPUs are their own tests.
TEST(NcclZero, Stage2OneGpu) {
  MG_REQUIRE_GPUS(1);
  zero2_matches_plain_case(kNccl, DType::f32, 1, 2, /*clip=*/0.05);
  zero_full_state_case(kNccl, 1);
}

TEST(NcclZero, Stage2TwoGpus) {
  MG_REQUIRE_GPUS(2);
  zero2_matches_plain_case(kNccl, DType::f32, 2, 1);
  zero2_matches_plain_case(kNccl, DType::f32, 2, 2, /*clip=*/0.05);
  zero_full_state_case(kNccl, 2);
}

TEST(NcclDDP, CheckpointedModelUnderAutocastOneGpu) {
  MG_REQUIRE_GPUS(1);
  ddp_checkpoint_autocast_case(kNccl, 1);
}

TEST(NcclDDP, CheckpointedModelUnderAutocastTwoGpus) {
  MG_REQUIRE_GPUS(2);
  ddp_checkpoint_autocast_case(kNccl, 2);
}

// ---------------- faults: every wait is bounded ----------------

// Rank 1 is SIGKILLed (or stays alive but never calls the collective) while rank 0 is in an
// all-reduce. Rank 0 only orders streams (the blocking all_reduce is async + wait) and then
// syncs the host: without the watchdog that sync never returns. With it, the communicator is
// aborted at the deadline, the host sync returns, every later call raises DistributedError, and
// the group is destroyed without blocking in ncclCommDestroy.
void dead_peer_case(bool kill_it) {
  run_ranks(
      2,
      [kill_it](int rank, int) {
        auto pg = join(kNccl, 60);  // start-up and NCCL init may take a while; the collective may not
        pg->barrier();
        const double timeout_s = 5;
        pg->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          std::fflush(nullptr);
          if (kill_it) ::kill(::getpid(), SIGKILL);
          std::this_thread::sleep_for(std::chrono::seconds(15));  // alive, silent, past rank 0's timeout
          _exit(0);
        }
        const auto t0 = std::chrono::steady_clock::now();
        auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
        Tensor t = ones({1 << 20}, {DType::f32, pg->device()});
        try {
          pg->all_reduce(t);  // orders the streams only
          (void)t.cpu();      // the host sync that used to hang
        } catch (const Error&) {
          // Either is fine here (the watchdog may have raced ahead); the next call must raise.
        }
        // The watchdog's deadline plus its 20 ms rounds and the abort itself.
        EXPECT_LT(since(), timeout_s + 5) << "the host sync waited past the timeout";
        std::string msg = "(no error)";
        try {
          pg->all_reduce(t);
          pg->barrier();
        } catch (const DistributedError& e) {
          msg = e.what();
        }
        EXPECT_NE(msg.find("unusable after an earlier error"), std::string::npos) << msg;
        EXPECT_NE(msg.find("all_reduce #"), std::string::npos) << "names the collective: " << msg;
        auto w = std::chrono::steady_clock::now();
        pg.reset();  // the destructor aborts instead of blocking in ncclCommDestroy
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - w).count(), timeout_s + 2);
        EXPECT_LT(since(), 2 * timeout_s + 5);
      },
      120, {}, kill_it ? std::map<int, int>{{1, 128 + SIGKILL}} : std::map<int, int>{});
}

TEST(NcclFaults, KilledPeerDuringAllReduceRaisesWithinTheTimeout) {
  MG_REQUIRE_GPUS(2);
  dead_peer_case(/*kill_it=*/true);
}

TEST(NcclFaults, SilentPeerDuringAllReduceRaisesWithinTheTimeout) {
  MG_REQUIRE_GPUS(2);
  dead_peer_case(/*kill_it=*/false);
}

TEST(NcclFaults, SynchronizeRaisesWithinTheTimeout) {
  MG_REQUIRE_GPUS(2);
  run_ranks(2,
            [](int rank, int) {
              auto pg = join(kNccl, 60);
              pg->barrier();
              pg->set_timeout(std::chrono::seconds(3));
              if (rank == 1) {
                std::fflush(nullptr);
                ::kill(::getpid(), SIGKILL);
              }
              const auto t0 = std::chrono::steady_clock::now();
              auto work = pg->all_reduce_async(ones({1 << 20}, {DType::f32, pg->device()}), ReduceOp::Sum);
              EXPECT_THROW(work->synchronize(), DistributedError);
              EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3 + 3);
              EXPECT_THROW(work->wait(), DistributedError);
            },
            120, {}, {{1, 128 + SIGKILL}});
}

// ---------------- launchers ----------------

// Two simulated nodes of one GPU each: `tools/launch --nnodes 2 --node-rank k --nproc 1` twice
// at once with CUDA_VISIBLE_DEVICES=k, so LOCAL_RANK 0 is a different GPU on each "node" and
// RANK picks the data shard. DDP must equal one process on the whole batch on both.
TEST(NcclLaunch, TwoNodesOfOneGpuThroughToolsLaunchTrainAndAgree) {
  MG_REQUIRE_GPUS(2);
  run_launched_nodes(
      2,
      [](int rank, int W) {
        const LaunchEnv e = LaunchEnv::from_environment();
        EXPECT_EQ(e.rank, rank);
        EXPECT_EQ(e.local_rank, 0);
        auto pg = join(kNccl);
        EXPECT_EQ(pg->device(), Device::cuda(0));
        ddp_rank_matches_single_process({.backend = kNccl, .dtype = DType::f32, .world = W, .steps = 3}, pg);
      },
      [](int node) { return "CUDA_VISIBLE_DEVICES=" + std::to_string(node); });
}

// ZeRO-3 through NCCL: the same code as the CPU suite's; at world size 1 the gathers and
// reduce-scatters are copies, and the model equals DDP's.
TEST(NcclZero3, MlpEqualsDDPOneGpu) {
  MG_REQUIRE_GPUS(1);
  zero3_mlp_matches_ddp({Backend::Nccl, 1, Zero3Opt::AdamW});
}

TEST(NcclZero3, GptEqualsDDPOneGpu) {
  MG_REQUIRE_GPUS(1);
  zero3_gpt_matches_ddp(Backend::Nccl, 1, /*prefetch=*/1);
}

// The shards in pinned host memory, the update on the host: the device keeps no model state.
TEST(NcclZero3, HostResidentShardsEqualDDPOneGpu) {
  MG_REQUIRE_GPUS(1);
  zero3_host_shards_case(Backend::Nccl, 1);
}

TEST(NcclZero3, HostResidentShardsEqualDDPTwoGpus) {
  MG_REQUIRE_GPUS(2);
  zero3_host_shards_case(Backend::Nccl, 2);
}

TEST(NcclZero3, GptEqualsDDPTwoGpus) {
  MG_REQUIRE_GPUS(2);
  zero3_gpt_matches_ddp(Backend::Nccl, 2, /*prefetch=*/1);
}

TEST(NcclZero3, ModelStateIsHalfOfDDPsTwoGpus) {
  MG_REQUIRE_GPUS(2);
  zero3_memory_case(Backend::Nccl, 2);
}

}  // namespace
}  // namespace mg::dist
