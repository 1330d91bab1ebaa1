// ZeRO-3 on CPU process groups (each rank a process): equality with DDP over 20 steps, the model
// state a rank holds, the gathered working set, the full state dict. The NCCL runs are in
// nccl_test.
#include <gtest/gtest.h>

#include "tests/distributed/zero3_cases.h"

namespace mg::dist::testing {
namespace {

constexpr Backend kCpu = Backend::Cpu;

TEST(CpuZero3, MlpAdamWEqualsDDPBitwise) {
  for (int w : {2, 4}) zero3_mlp_matches_ddp({kCpu, w, Zero3Opt::AdamW});
}

TEST(CpuZero3, MlpSgdEqualsDDPBitwise) { zero3_mlp_matches_ddp({kCpu, 2, Zero3Opt::Sgd}); }

// A forward that fails in its last unit, then ParamUnits::abandon_step: training goes on as if
// the failed step never ran, bitwise DDP's.
TEST(CpuZero3, AFailedStepIsAbandonedCleanly) {
  Zero3Case c{kCpu, 2, Zero3Opt::AdamW};
  c.abort_step = 3;
  zero3_mlp_matches_ddp(c);
}

TEST(CpuZero3, MlpAccumulatesMicroBatches) { zero3_mlp_matches_ddp({kCpu, 2, Zero3Opt::AdamW, /*micro=*/2}); }

TEST(CpuZero3, MlpClipsTheGlobalNormFromTheShards) {
  for (int w : {2, 4}) zero3_mlp_matches_ddp({kCpu, w, Zero3Opt::Sgd, /*micro=*/1, /*clip=*/0.05});
}

TEST(CpuZero3, GptWithTiedHeadEqualsDDPBitwise) {
  zero3_gpt_matches_ddp(kCpu, 2, /*prefetch=*/1);
  zero3_gpt_matches_ddp(kCpu, 4, /*prefetch=*/0);
}

TEST(CpuZero3, HostResidentShardsEqualDDP) {
  for (int w : {2, 4}) zero3_host_shards_case(kCpu, w);
}

TEST(CpuZero3, ModelStateIsAnNthOfDDPs) {
  for (int w : {2, 4}) zero3_memory_case(kCpu, w);
}

TEST(CpuZero3, ShardedCheckpointReshardsAndResumesBitwise) {
  zero3_sharded_checkpoint_case(kCpu, /*save_world=*/2, /*load_world=*/4);
  zero3_sharded_checkpoint_case(kCpu, /*save_world=*/4, /*load_world=*/2);
}

TEST(CpuZero3, DeadPeerDuringAGatherRaisesWithinTheTimeout) { zero3_dead_peer_case(); }

}  // namespace
}  // namespace mg::dist::testing
