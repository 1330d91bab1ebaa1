// Multi-process tests from one gtest binary: run_ranks(world, body) re-executes this binary
// `world` times with only the current test selected and RANK/WORLD_SIZE/... set; each child
// runs body(rank, world) for the matching run_ranks call and exits with its gtest verdict. The
// parent expects every rank to pass. Fresh processes (fork + exec) keep CUDA usable in ranks.
// run_launched_nodes does the same through tools/launch, one invocation per simulated node.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/device_runtime.h"
#include "distributed/process_group.h"
#include "distributed/spawn.h"
#include "distributed/tcp_rendezvous.h"

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

inline std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

// In a child: runs the rank's body and exits with its verdict.
[[noreturn]] inline void run_as_rank(const RankBody& body, int world, const std::string& name) {
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

// Variables of the parent's test run that must not reach the ranks.
inline const std::vector<std::string>& test_env_to_unset() {
  static const std::vector<std::string> v = {"GTEST_OUTPUT",      "XML_OUTPUT_FILE",        "TEST_PREMATURE_EXIT_FILE",
                                             "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS",     "TEST_SHARD_INDEX",
                                             "TEST_TOTAL_SHARDS", "TEST_SHARD_STATUS_FILE", "GTEST_FILTER",
                                             "GTEST_REPEAT",      "MG_DIST_BACKEND"};
  return v;
}

// `expected_exit`: rank -> the exit code of a rank the test kills on purpose (128 + signal).
inline void run_ranks(int world, const RankBody& body, int timeout_s = 180, std::vector<int> only_ranks = {},
                      std::map<int, int> expected_exit = {}) {
  const std::string name = current_test_name();
  static std::string last_test;
  static int calls = 0;
  if (name != last_test) {
    last_test = name;
    calls = 0;
  }
  const int call = calls++;

  if (const char* c = std::getenv("MG_DIST_TEST_CALL")) {
    if (std::atoi(c) != call) return;  // another run_ranks call of this test
    run_as_rank(body, world, name);
  }

  char path[] = "/tmp/mg_dist_init_XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ::unlink(path);  // rank 0 creates it; its absence means "not yet"
  SpawnOptions o;
  o.nproc = world;
  o.only_ranks = std::move(only_ranks);
  o.expected_exit = std::move(expected_exit);
  o.args = {"--gtest_filter=" + name, "--gtest_color=no"};
  o.env = {{"MG_DIST_TEST_CALL", std::to_string(call)}, {"MG_DIST_INIT_FILE", path}};
  o.unset_env = test_env_to_unset();
  o.timeout = std::chrono::seconds(timeout_s);
  SpawnResult r = spawn_ranks(o);
  ::unlink(path);
  EXPECT_EQ(r.exit_code, 0) << "world size " << world << ": " << r.message << " (see the rank's output above)";
}

// tools/launch, found beside the sources (MG_SOURCE_ROOT, the working directory, or Bazel's
// runfiles); empty when none is there.
inline std::string find_launcher() {
  std::vector<std::string> roots;
  if (const char* r = std::getenv("MG_SOURCE_ROOT")) roots.push_back(r);
  roots.push_back(".");
  if (const char* r = std::getenv("TEST_SRCDIR"))
    roots.push_back(std::string(r) + "/" + (std::getenv("TEST_WORKSPACE") ? std::getenv("TEST_WORKSPACE") : "memgrad"));
  for (const auto& r : roots)
    if (::access((r + "/tools/launch").c_str(), X_OK) == 0) return r + "/tools/launch";
  return "";
}

// A job of `nnodes` simulated nodes on this host: `tools/launch --nnodes N --node-rank k --nproc
// 1` once per node, all at once, each re-running this test as its one rank (RANK = k).
// `node_env(k)` adds variables for node k (e.g. CUDA_VISIBLE_DEVICES=k, so LOCAL_RANK 0 is a
// different GPU on each "node"). Every rank must pass.
inline void run_launched_nodes(int nnodes, const RankBody& body, const std::function<std::string(int)>& node_env = {},
                               int timeout_s = 180) {
  const std::string name = current_test_name();
  if (std::getenv("MG_DIST_TEST_NODE")) run_as_rank(body, nnodes, name);
  const std::string launch = find_launcher();
  ASSERT_FALSE(launch.empty()) << "tools/launch not found (set MG_SOURCE_ROOT to the source tree)";
  char exe[PATH_MAX] = {};
  ASSERT_GT(::readlink("/proc/self/exe", exe, sizeof(exe) - 1), 0);
  const int port = detail::free_tcp_port();
  const std::string token = random_token();
  std::string unset;
  for (const auto& v : test_env_to_unset()) unset += " -u " + v;
  std::vector<int> rc(nnodes, -1);
  std::vector<std::thread> nodes;
  for (int k = 0; k < nnodes; ++k) {
    const std::string cmd = "timeout " + std::to_string(timeout_s) + " env" + unset +
                            " MG_DIST_TEST_NODE=1 MG_DIST_TOKEN=" + token + " " + (node_env ? node_env(k) : "") + " " +
                            launch + " --nnodes " + std::to_string(nnodes) + " --node-rank " + std::to_string(k) +
                            " --nproc 1 --master-addr 127.0.0.1 --master-port " + std::to_string(port) + " -- " + exe +
                            " --gtest_filter=" + name + " --gtest_color=no";
    nodes.emplace_back([&rc, k, cmd] { rc[k] = std::system(cmd.c_str()); });
  }
  for (auto& t : nodes) t.join();
  for (int k = 0; k < nnodes; ++k) EXPECT_EQ(rc[k], 0) << "node " << k << " of " << nnodes << " (see its output above)";
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
