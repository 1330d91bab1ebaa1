// Multi-process tests from one gtest binary: run_ranks(world, body) re-executes this binary
// `world` times with only the current test selected and RANK/WORLD_SIZE/... set; each child
// runs body(rank, world) for the matching run_ranks call and exits with its gtest verdict. The
// parent expects every rank to pass. Fresh processes (fork + exec) keep CUDA usable in ranks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/device_runtime.h"
#include "distributed/process_group.h"
#include "distributed/spawn.h"

namespace mg::dist::testing {

using RankBody = std::function<void(int rank, int world)>;

inline bool in_child() { return std::getenv("MG_DIST_TEST_CALL") != nullptr; }

// The group a rank body talks through (rendezvous via the init file run_ranks set up).
inline std::shared_ptr<ProcessGroup> join(Backend backend, double timeout_s = 60) {
  ProcessGroupOptions o;
  o.backend = backend;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return init_process_group(o);
}

inline void run_ranks(int world, const RankBody& body, int timeout_s = 180, std::vector<int> only_ranks = {}) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  static std::string last_test;
  static int calls = 0;
  if (name != last_test) {
    last_test = name;
    calls = 0;
  }
  const int call = calls++;

  if (const char* c = std::getenv("MG_DIST_TEST_CALL")) {
    if (std::atoi(c) != call) return;  // another run_ranks call of this test
    const int rank = std::atoi(std::getenv("RANK"));
    try {
      body(rank, world);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << " of " << world << " threw: " << e.what();
    }
    const bool failed = ::testing::Test::HasFailure();
    if (failed) std::cout << "!!! rank " << rank << " of " << world << " failed in " << name << std::endl;
    std::cout.flush();
    std::fflush(nullptr);
    _exit(failed ? 1 : 0);
  }

  char path[] = "/tmp/mg_dist_init_XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ::unlink(path);  // rank 0 creates it; its absence means "not yet"
  SpawnOptions o;
  o.nproc = world;
  o.only_ranks = std::move(only_ranks);
  o.args = {"--gtest_filter=" + name, "--gtest_color=no"};
  o.env = {{"MG_DIST_TEST_CALL", std::to_string(call)}, {"MG_DIST_INIT_FILE", path}};
  o.unset_env = {"GTEST_OUTPUT",       "XML_OUTPUT_FILE",  "TEST_PREMATURE_EXIT_FILE", "GTEST_SHARD_INDEX",
                 "GTEST_TOTAL_SHARDS", "TEST_SHARD_INDEX", "TEST_TOTAL_SHARDS",        "TEST_SHARD_STATUS_FILE",
                 "GTEST_FILTER",       "GTEST_REPEAT",     "MG_DIST_BACKEND"};
  o.timeout = std::chrono::seconds(timeout_s);
  SpawnResult r = spawn_ranks(o);
  ::unlink(path);
  EXPECT_EQ(r.exit_code, 0) << "world size " << world << ": " << r.message << " (see the rank's output above)";
}

// Elementwise |a - b| <= atol + rtol * |b| over two tensors of the same shape.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double rtol = 1e-10,
                                            double atol = 1e-12) {
  if (a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(a.sizes()) << " vs " << shape_str(b.sizes());
  std::vector<double> x = a.cpu().to_vector<double>(), y = b.cpu().to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i])))
      return ::testing::AssertionFailure() << "element " << i << " of " << x.size() << ": " << x[i] << " vs " << y[i]
                                           << " (shape " << shape_str(a.sizes()) << ")";
  return ::testing::AssertionSuccess();
}

#define MG_REQUIRE_GPUS(n)                                                                                      \
  do {                                                                                                          \
    if (!::mg::dist::testing::in_child()) {                                                                     \
      if (!::mg::dist::nccl_available()) GTEST_SKIP() << "this build has no NCCL backend (built without CUDA)"; \
      if (::mg::cuda::device_count() < (n))                                                                     \
        GTEST_SKIP() << "needs " << (n) << " GPU(s), " << ::mg::cuda::device_count() << " visible";             \
    }                                                                                                           \
  } while (0)

}  // namespace mg::dist::testing
