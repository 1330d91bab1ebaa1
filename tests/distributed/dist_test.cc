// dist/ on the CPU backend: ranks are processes (this binary re-executed), talking over TCP
// on localhost. Collectives, DDP, tensor parallelism and ZeRO-1 at world sizes 1, 2 and 4, the
// distributed sampler, the post-accumulate-grad hook, and the error paths (missing peer,
// timeout, a peer that dies, mismatched collectives).
#include <gtest/gtest.h>

#include <signal.h>

#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "autograd/node.h"
#include "core/profiler.h"
#include "tests/error_of.h"
#include "data/dataloader.h"
#include "distributed/distributed_sampler.h"
#include "distributed/launch_env.h"
#include "distributed/tcp_rendezvous.h"
#include "tests/distributed/amp_ckpt_cases.h"
#include "tests/distributed/tp_zero_cases.h"

namespace mg::dist {
namespace {

using namespace mg::dist::testing;
constexpr Backend kCpu = Backend::Cpu;

using mg::testing::error_of;

// ---------------- collectives ----------------

TEST(CpuCollectives, ValuesF64) {
  for (int w : {1, 2, 4}) collectives_case(kCpu, DType::f64, w);
}

TEST(CpuCollectives, ValuesF32AndI64) {
  collectives_case(kCpu, DType::f32, 2);
  collectives_case(kCpu, DType::i64, 4);
}

TEST(CpuCollectives, WorldSizeOneNeedsNoNetwork) {
  ProcessGroupOptions o;
  o.backend = kCpu;
  o.rank = 0;
  o.world_size = 1;
  o.master_port = 1;  // never used
  auto pg = init_process_group(o);
  Tensor t = tensor({1, 2, 3}, {3}, {DType::f64});
  pg->all_reduce(t, ReduceOp::Avg);
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(pg->all_gather(t).sizes(), (Shape{1, 3}));
  pg->barrier();
}

TEST(CpuCollectives, RendezvousThroughMasterPort) {
  run_ranks(2, [](int rank, int) {
    unsetenv("MG_DIST_INIT_FILE");  // MASTER_ADDR / MASTER_PORT from spawn_ranks
    auto pg = join(kCpu);
    Tensor t = full({4}, rank + 1.0, {DType::f64});
    pg->all_reduce(t);
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(4, 3.0));
  });
}

TEST(CpuCollectives, BadArgumentsAreClearErrors) {
  auto pg = init_process_group({.backend = kCpu, .rank = 0, .world_size = 1});
  Tensor t = zeros({4, 4}, {DType::f64});
  EXPECT_THROW(pg->all_reduce_async(raw::transpose(t, 0, 1), ReduceOp::Sum), ValueError);
  EXPECT_THROW(pg->all_reduce(zeros({2}, {DType::i64}), ReduceOp::Avg), DTypeError);
  EXPECT_THROW(pg->broadcast(t, 3), ValueError);
  EXPECT_THROW(pg->all_gather(zeros({5}, {DType::f64}), zeros({4}, {DType::f64})), ShapeError);
  EXPECT_THROW(pg->all_reduce(Tensor()), ValueError);
  EXPECT_THROW(init_process_group({.backend = kCpu, .rank = 2, .world_size = 2}), ValueError);
}

TEST(CpuCollectives, EnvironmentIsParsedAndChecked) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "3", 1);
  setenv("MASTER_PORT", "12345", 1);
  setenv("MG_DIST_TIMEOUT_S", "2.5", 1);
  setenv("MG_DIST_TOKEN", "t", 1);
  ProcessGroupOptions o = resolve_options({});
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world_size, 3);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.master_port, 12345);
  EXPECT_EQ(o.timeout.count(), 2500);
  setenv("RANK", "one", 1);
  std::string msg = error_of([] { resolve_options({}); });
  EXPECT_NE(msg.find("RANK='one'"), std::string::npos) << msg;
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_PORT", "MG_DIST_TIMEOUT_S", "MG_DIST_TOKEN"}) unsetenv(v);
}

// ---------------- failures ----------------

TEST(CpuCollectives, MissingPeerTimesOutWithAClearMessage) {
  char path[] = "/tmp/mg_dist_missing_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  unlink(path);
  ProcessGroupOptions o;
  o.backend = kCpu;
  o.world_size = 2;
  o.init_file = path;
  o.token = "t";
  o.timeout = std::chrono::milliseconds(800);
  // Rank 0 waits for rank 1, who never comes.
  o.rank = 0;
  std::string msg = error_of([&] { init_process_group(o); });
  EXPECT_NE(msg.find("rank 0 of 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank(s) 1"), std::string::npos) << msg;
  unlink(path);
  // Rank 1 waits for rank 0's init file.
  o.rank = 1;
  msg = error_of([&] { init_process_group(o); });
  EXPECT_NE(msg.find("rank 1 of 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MG_DIST_INIT_FILE"), std::string::npos) << msg;
  // Rank 1 of 3 connecting to a port nobody listens on.
  o.init_file.clear();
  o.world_size = 3;
  o.master_port = mg::dist::detail::free_tcp_port();
  msg = error_of([&] { init_process_group(o); });
  EXPECT_NE(msg.find("rank 1 of 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("connecting to rank 0 at 127.0.0.1:" + std::to_string(o.master_port)), std::string::npos) << msg;
}

TEST(CpuCollectives, PeerThatExitsIsAnErrorNotAHang) {
  run_ranks(2, [](int rank, int) {
    auto pg = join(kCpu, 30);
    pg->barrier();
    if (rank == 1) {
      std::fflush(nullptr);
      _exit(0);  // leaves without calling the collective
    }
    std::string msg = error_of([&] { pg->all_reduce(ones({8}, {DType::f64})); });
    EXPECT_NE(msg.find("rank 0 of 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("closed the connection"), std::string::npos) << msg;
    // The group stays unusable, with the reason.
    msg = error_of([&] { pg->all_reduce(ones({8}, {DType::f64})); });
    EXPECT_NE(msg.find("unusable after an earlier error"), std::string::npos) << msg;
  });
}

// A rank SIGKILLed while the others are in an all-reduce: every survivor raises
// DistributedError well within the timeout (the dead socket is seen at once; rank 0 forwards the
// reason and shuts its connections, so rank 1, which only talks to rank 0, learns too), later
// calls raise at once, and the group is destroyed without waiting.
TEST(CpuCollectives, KilledPeerDuringAllReduceRaisesWithinTheTimeout) {
  for (int victim : {2, 0}) {
    run_ranks(3,
              [victim](int rank, int) {
                auto pg = join(kCpu, 30);  // process start-up may take seconds; the collective may not
                pg->barrier();
                const auto timeout = std::chrono::seconds(5);
                pg->set_timeout(timeout);
                if (rank == victim) {
                  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting in it
                  std::fflush(nullptr);
                  ::kill(::getpid(), SIGKILL);
                }
                const auto t0 = std::chrono::steady_clock::now();
                auto since = [&] {
                  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                };
                std::string msg = "(no error)";
                try {
                  pg->all_reduce(ones({1 << 16}, {DType::f64}));
                } catch (const DistributedError& e) {
                  msg = e.what();
                }
                EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
                EXPECT_LT(since(), 5.0) << "took longer than the timeout: " << msg;
                EXPECT_THROW(pg->all_reduce(ones({4}, {DType::f64})), DistributedError);
                pg.reset();  // joins the worker; nothing may block
                EXPECT_LT(since(), 5.0);
              },
              120, {}, {{victim, 128 + SIGKILL}});
  }
}

TEST(CpuCollectives, SlowPeerTimesOut) {
  run_ranks(2, [](int rank, int) {
    auto pg = join(kCpu, 30);  // process start-up may take seconds; the collective may not
    pg->barrier();
    pg->set_timeout(std::chrono::milliseconds(700));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::string msg = error_of([&] { pg->all_reduce(ones({8}, {DType::f64})); });
    if (rank == 0) {
      EXPECT_NE(msg.find("timed out after 0.7 s in all_reduce #2 waiting for rank 1"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("rank 1 of 2"), std::string::npos) << msg;  // rank 0 gave up: closed or timed out
    }
  });
}

TEST(CpuCollectives, MismatchedCollectivesAreReportedOnEveryRank) {
  run_ranks(2, [](int rank, int) {
    auto pg = join(kCpu, 30);
    std::string msg = error_of([&] { pg->all_reduce(ones({rank == 0 ? 4 : 5}, {DType::f64})); });
    EXPECT_NE(msg.find("rank 1 passed 40 bytes of f64"), std::string::npos) << msg;
  });
  run_ranks(2, [](int rank, int) {
    auto pg = join(kCpu, 30);
    Tensor t = ones({4}, {DType::f32});
    std::string msg = error_of([&] {
      if (rank == 0)
        pg->all_reduce(t);
      else
        pg->broadcast(t, 0);
    });
    EXPECT_NE(msg.find("rank 1 called broadcast #1 while rank 0 called all_reduce #1"), std::string::npos) << msg;
  });
}

// ---------------- the post-accumulate-grad hook ----------------

TEST(PostAccumulateGradHook, FiresOnceWithTheTotalGradient) {
  Tensor w = tensor({1, 2, 3}, {3}, {DType::f64}).requires_grad_();
  std::vector<std::vector<double>> seen;
  uint64_t h = autograd::register_post_accumulate_grad_hook(w, [&](const Tensor& leaf) {
    EXPECT_TRUE(leaf.is_same(w));
    seen.push_back(leaf.grad().to_vector<double>());
  });
  // w reaches the loss twice: the engine sums both paths before the accumulator runs.
  sum(add(mul(w, 2.0), mul(w, w))).backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{4, 6, 8}));
  sum(w).backward();  // accumulates: the hook sees the running total
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<double>{5, 7, 9}));
  autograd::remove_post_accumulate_grad_hook(h);
  sum(w).backward();
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_THROW(autograd::register_post_accumulate_grad_hook(mul(w, 2.0), [](const Tensor&) {}), AutogradError);
}

TEST(PostAccumulateGradHook, DeadTensorsHooksDoNotLeakToNewOnes) {
  int fired = 0;
  {
    Tensor a = ones({2}, {DType::f64}).requires_grad_();
    autograd::register_post_accumulate_grad_hook(a, [&](const Tensor&) { ++fired; });
  }
  for (int i = 0; i < 4; ++i) {  // new tensors may reuse the dead one's address
    Tensor b = ones({2}, {DType::f64}).requires_grad_();
    sum(b).backward();
  }
  EXPECT_EQ(fired, 0);
}

// ---------------- DDP ----------------

TEST(CpuDDP, GradientsEqualSingleProcessOnTheWholeBatch) {
  for (int w : {1, 2, 4}) ddp_matches_single_process({.backend = kCpu, .dtype = DType::f64, .world = w});
}

// Two simulated nodes on this host: `tools/launch --nnodes 2 --node-rank k --nproc 1` twice at
// once (RANK = k, LOCAL_RANK = 0 on both), training DDP that must equal one process on the
// whole batch, hence agree across the nodes.
TEST(CpuDDP, TwoNodesThroughToolsLaunchTrainAndAgree) {
  run_launched_nodes(2, [](int rank, int W) {
    const LaunchEnv e = LaunchEnv::from_environment();
    EXPECT_EQ(e.rank, rank);
    EXPECT_EQ(e.world_size, W);
    EXPECT_EQ(e.local_rank, 0);
    EXPECT_EQ(e.local_world_size, 1);
    auto pg = join(kCpu);
    ddp_rank_matches_single_process({.backend = kCpu, .dtype = DType::f64, .world = W, .steps = 3}, pg);
  });
}

TEST(CpuDDP, ManySmallBucketsAndBucketViews) {
  DDPCase c{.backend = kCpu, .dtype = DType::f64, .world = 2};
  c.opts.bucket_cap_mb = 0.0005;  // ~500 bytes: one bucket per parameter or two
  c.opts.first_bucket_cap_mb = 0.0001;
  ddp_matches_single_process(c);
  c.opts.gradient_as_bucket_view = true;
  c.world = 4;
  c.steps = 3;
  ddp_matches_single_process(c);
  c.dtype = DType::f32;
  ddp_matches_single_process(c);
}

TEST(CpuDDP, BucketsFollowReverseParameterOrderAndTheCap) {
  auto pg = init_process_group({.backend = kCpu, .rank = 0, .world_size = 1});
  auto model = small_mlp(1, DType::f64, Device::cpu());  // params 6x16,16, 16x8,8, 8x3,3
  DistributedDataParallel one(model, pg, {.bucket_cap_mb = 25, .first_bucket_cap_mb = 25});
  ASSERT_EQ(one.bucket_assignment().size(), 1u);
  EXPECT_EQ(one.bucket_assignment()[0], (std::vector<size_t>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(one.bucket_bytes(), model->num_parameters() * 8);
  // Bytes in reverse order: 24, 192 | 64 | 1024 | 128, 768. The first bucket holds 256 B,
  // the others 1 KiB; a parameter larger than the cap gets a bucket of its own.
  DistributedDataParallel many(model, pg, {.bucket_cap_mb = 1024 / 1048576.0, .first_bucket_cap_mb = 256 / 1048576.0});
  EXPECT_EQ(many.bucket_assignment(), (std::vector<std::vector<size_t>>{{5, 4}, {3}, {2}, {1, 0}}));
}

TEST(CpuDDP, NoSyncAccumulatesLocally) {
  ddp_no_sync_accumulates(kCpu, DType::f64, 2);
  ddp_no_sync_accumulates(kCpu, DType::f64, 4);
}

// A model whose second head never reaches the loss.
struct TwoHeads : nn::Module {
  std::shared_ptr<nn::Linear> used, unused;
  explicit TwoHeads(Generator* g) : nn::Module("TwoHeads") {
    used = register_module("used", std::make_shared<nn::Linear>(4, 2, true, TensorOptions{DType::f64}, g));
    unused = register_module("unused", std::make_shared<nn::Linear>(4, 2, true, TensorOptions{DType::f64}, g));
  }
  Tensor forward(const Tensor& x) override { return (*used)(x); }
};

TEST(CpuDDP, UnusedParameters) {
  run_ranks(2, [](int rank, int W) {
    auto pg = join(kCpu, 30);
    Generator g(3), gr(3);
    auto model = std::make_shared<TwoHeads>(&g);
    auto ref = std::make_shared<TwoHeads>(&gr);
    Generator dg(4);
    Tensor X = randn({2 * W, 4}, {DType::f64}, &dg);
    Tensor x = raw::contiguous(raw::slice(X, 0, 2 * rank, 2 * rank + 2, 1));
    {
      DistributedDataParallel ddp(model, pg, {.find_unused_parameters = true});
      sum(ddp(x)).backward();  // completes: the unused head was marked ready after forward
      sum((*ref)(X)).backward();
      EXPECT_TRUE(all_close(model->used->weight.grad(), kernels::mul_scalar(ref->used->weight.grad(), 1.0 / W)));
      EXPECT_TRUE(all_close(model->unused->weight.grad(), zeros({2, 4}, {DType::f64}), 0, 0));
    }
    model->zero_grad();
    DistributedDataParallel strict(model, pg);
    sum(strict(x)).backward();
    std::string msg = error_of([&] { strict.finish(); });
    EXPECT_NE(msg.find("'unused.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
  });
}

TEST(CpuDDP, RejectsParametersOffTheGroupsDevice) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "needs a GPU to put a parameter elsewhere than the CPU group";
  auto pg = init_process_group({.backend = kCpu, .rank = 0, .world_size = 1});
  EXPECT_THROW(DistributedDataParallel(small_mlp(1, DType::f32, Device::cuda(0)), pg), DeviceError);
}

// ---------------- distributed sampler ----------------

TEST(DistributedSampler, PartitionsLikePyTorch) {
  for (bool shuffle : {false, true})
    for (int64_t R : {1, 2, 3, 4})
      for (int64_t N : {0, 1, 7, 8, 10}) {
        std::multiset<int64_t> seen;
        int64_t per = -1;
        for (int64_t r = 0; r < R; ++r) {
          DistributedSampler s(N, {.num_replicas = R, .rank = r, .shuffle = shuffle, .seed = 3});
          auto idx = s.indices();
          EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
          EXPECT_EQ(s.num_samples(), (N + R - 1) / R);
          if (per >= 0) {
            EXPECT_EQ(static_cast<int64_t>(idx.size()), per) << "ranks get equal shares";
          }
          per = idx.size();
          seen.insert(idx.begin(), idx.end());
        }
        // Every index appears; padding repeats the first ones, never more than R - 1 extras.
        for (int64_t i = 0; i < N; ++i) EXPECT_GE(seen.count(i), 1u) << "N=" << N << " R=" << R;
        EXPECT_EQ(static_cast<int64_t>(seen.size()), N == 0 ? 0 : per * R);
      }
  // Without shuffling: strided, like torch (rank 1 of 3 over 8: 1, 4, 7).
  DistributedSampler s(8, {.num_replicas = 3, .rank = 1, .shuffle = false});
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{1, 4, 7}));
  DistributedSampler pad(8, {.num_replicas = 3, .rank = 2, .shuffle = false});
  EXPECT_EQ(pad.indices(), (std::vector<int64_t>{2, 5, 0}));
  DistributedSampler drop(8, {.num_replicas = 3, .rank = 2, .shuffle = false, .drop_last = true});
  EXPECT_EQ(drop.indices(), (std::vector<int64_t>{2, 5}));
  EXPECT_THROW(DistributedSampler(8, {.num_replicas = 2, .rank = 2}), ValueError);
}

TEST(DistributedSampler, DropLastIsDisjointAndEpochsReshuffleDeterministically) {
  const int64_t N = 23, R = 4;
  std::set<int64_t> all;
  for (int64_t r = 0; r < R; ++r) {
    DistributedSampler s(N, {.num_replicas = R, .rank = r, .shuffle = true, .seed = 9, .drop_last = true});
    auto idx = s.indices();
    EXPECT_EQ(idx.size(), 5u);
    for (int64_t i : idx) EXPECT_TRUE(all.insert(i).second) << "index " << i << " on two ranks";
  }
  DistributedSampler a(N, {.num_replicas = R, .rank = 1, .seed = 9}), b(N, {.num_replicas = R, .rank = 1, .seed = 9});
  auto e0 = a.indices();
  a.set_epoch(1);
  auto e1 = a.indices();
  EXPECT_NE(e0, e1) << "a new epoch reshuffles";
  b.set_epoch(1);
  EXPECT_EQ(b.indices(), e1) << "same seed and epoch, same order";
}

TEST(DistributedSampler, ShardFeedsADataLoader) {
  auto ds = std::make_shared<data::TensorDataset>(arange(10, {DType::f64}).view({10, 1}), arange(10));
  auto sampler = std::make_shared<DistributedSampler>(10, DistributedSamplerOptions{.num_replicas = 2, .rank = 1});
  auto shard = std::make_shared<DistributedShard>(ds, sampler);
  data::DataLoader loader(shard, {.batch_size = 2});
  std::vector<int64_t> got;
  for (auto& batch : loader)
    for (int64_t v : batch.target.to_vector<int64_t>()) got.push_back(v);
  EXPECT_EQ(got, shard->indices());
  sampler->set_epoch(5);
  shard->refresh();
  EXPECT_EQ(shard->indices(), sampler->indices());
}

// ---------------- tensor parallel ----------------

TEST(CpuTensorParallel, ColumnParallelLinearMatchesLinear) {
  for (int w : {1, 2, 4}) column_parallel_case(kCpu, DType::f64, w, /*gather_output=*/true);
  for (int w : {2, 4}) column_parallel_case(kCpu, DType::f64, w, /*gather_output=*/false);
}

TEST(CpuTensorParallel, RowParallelLinearMatchesLinear) {
  for (int w : {1, 2, 4}) row_parallel_case(kCpu, DType::f64, w, /*input_is_parallel=*/false);
  for (int w : {2, 4}) row_parallel_case(kCpu, DType::f64, w, /*input_is_parallel=*/true);
}

TEST(CpuTensorParallel, GPT2MLPMatchesUnsharded) {
  for (int w : {1, 2, 4}) tp_mlp_case(kCpu, DType::f64, w);
}

TEST(CpuTensorParallel, IndivisibleSizesAreErrors) {
  run_ranks(2, [](int, int) {
    auto pg = join(kCpu, 30);
    EXPECT_THROW(ColumnParallelLinear(4, 5, pg), ValueError);
    EXPECT_THROW(RowParallelLinear(5, 4, pg), ValueError);
  });
}

// ---------------- ZeRO-1 ----------------

TEST(CpuZero, StepEqualsPlainSGD) {
  for (int w : {1, 2, 4}) zero_matches_plain_case(kCpu, DType::f64, w, /*reduce_gradients=*/false);
}

TEST(CpuZero, ReduceScatterOfPerRankGradients) {
  for (int w : {2, 4}) zero_matches_plain_case(kCpu, DType::f64, w, /*reduce_gradients=*/true);
}

TEST(CpuZero, ShardsAdamsMoments) {
  for (int w : {1, 2, 3}) zero_adam_case(kCpu, w);
}

TEST(CpuZero, Stage2ShardsGradientsDuringBackward) {
  for (int w : {1, 2, 4}) zero2_matches_plain_case(kCpu, DType::f64, w, /*micro=*/1);
}

TEST(CpuZero, Stage2AccumulatesMicroBatchesInTheShards) {
  for (int w : {2, 3}) zero2_matches_plain_case(kCpu, DType::f64, w, /*micro=*/2);
}

TEST(CpuZero, FullStateDictReshardsAndLoadsInOneProcess) {
  for (int w : {1, 2, 3}) zero_full_state_case(kCpu, w);
}

TEST(CpuZero, ShardedCheckpointLoadsAtAnotherWorldSize) { zero_sharded_checkpoint_case(kCpu); }

TEST(CpuZero, Stage2ClipsTheGlobalNormFromTheShards) {
  for (int w : {2, 4}) zero2_matches_plain_case(kCpu, DType::f64, w, /*micro=*/1, /*clip=*/0.05);
}

// ---------------- DDP with the other memory techniques ----------------

// A trace taken on a rank holds its collectives: each blocking collective as a range in the
// "collective" category on the calling thread and again on the process group's worker as it
// runs, each DDP bucket's launch as an instant with its bytes (its all-reduce a range on the
// worker only); the file passes the trace validator.
TEST(CpuProfiler, CollectivesAreOnTheTrace) {
  run_ranks(2, [](int, int) {
    auto pg = join(kCpu);
    auto model = small_mlp(3, DType::f32, pg->device());
    DistributedDataParallel ddp(model, pg);
    profiler::start();
    Tensor t = ones({64});
    pg->all_reduce(t);
    Tensor out = empty({32});
    pg->reduce_scatter(out, t);
    mse_loss(ddp(randn({4, 6})), randn({4, 3})).backward();
    profiler::stop();
    const std::string json = profiler::chrome_trace_json();
    EXPECT_EQ(profiler::validate_chrome_trace(json), "");
    const nlohmann::json trace = nlohmann::json::parse(json);
    std::map<std::string, int> seen;
    std::map<std::string, std::set<int64_t>> threads;
    for (const auto& e : trace["traceEvents"])
      if (e.value("cat", "") == "collective") {
        seen[e["name"].get<std::string>()]++;
        threads[e["name"].get<std::string>()].insert(e["tid"].get<int64_t>());
        if (e["name"] == "ddp bucket all_reduce") {
          EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
        }
      }
    EXPECT_GE(seen["ddp bucket all_reduce"], 1);
    EXPECT_EQ(seen["reduce_scatter"], 2);  // the call, and its run on the worker
    EXPECT_EQ(threads["reduce_scatter"].size(), 2u);
    EXPECT_EQ(seen["all_reduce"], 2 + seen["ddp bucket all_reduce"]);  // + each bucket's run
  });
}

TEST(CpuDDP, CheckpointedModelUnderAutocast) {
  for (int w : {1, 2}) ddp_checkpoint_autocast_case(kCpu, w);
}

}  // namespace
}  // namespace mg::dist
