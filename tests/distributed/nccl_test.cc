// dist/ on NCCL, one process per GPU (this binary re-executed per rank with LOCAL_RANK = rank):
// the same cases as the CPU backend's, in f32 on the GPUs. Every test skips without enough
// GPUs or without the NCCL backend. NCCL_NVLS_ENABLE=0 is set in every rank.
#include <gtest/gtest.h>

#include "core/cuda_memory.h"
#include "tests/distributed/amp_ckpt_cases.h"
#include "tests/distributed/tp_zero_cases.h"

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

TEST(NcclZero, ShardsAdamsMoments) {
  MG_REQUIRE_GPUS(1);
  zero_adam_case(kNccl, 1);
  if (cuda::device_count() >= 2) zero_adam_case(kNccl, 2);
}

TEST(NcclDDP, CheckpointedModelUnderAutocast) {
  MG_REQUIRE_GPUS(1);
  ddp_checkpoint_autocast_case(kNccl, 1);
  if (cuda::device_count() >= 2) ddp_checkpoint_autocast_case(kNccl, 2);
}

}  // namespace
}  // namespace mg::dist
