// Starting ranks from C++: N copies of a program on one host with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and MG_DIST_TOKEN set (what tools/launch does from
// the shell). Tests and the distributed benchmark use it so one command runs a whole job.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mg::dist {

struct SpawnOptions {
  int nproc = 1;
  std::string executable;                                // default: this program (/proc/self/exe)
  std::vector<std::string> args;                         // argv[1..]
  std::vector<std::pair<std::string, std::string>> env;  // set (or overridden) in every child
  std::vector<std::string> unset_env;                    // removed from the children's environment
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a currently free port (one node only; several need the same port)
  // This host as node `node_rank` of `nnodes` (tools/launch --nnodes/--node-rank): local rank l
  // gets RANK = node_rank * nproc + l, WORLD_SIZE = nnodes * nproc, LOCAL_RANK = l.
  int nnodes = 1;
  int node_rank = 0;
  std::vector<int> only_ranks;           // start just these local ranks (tests of missing peers); empty = all
  std::map<int, int> expected_exit;      // local rank -> exit code that counts as success (fault tests)
  std::chrono::milliseconds timeout{0};  // 0: wait as long as it takes
};

struct SpawnResult {
  int exit_code = 0;  // 0 when every rank exited with 0; else the first failure's code (128+signal)
  int failed_rank = -1;
  bool timed_out = false;
  std::string message;  // what went wrong, for test output
};

// Starts the ranks and waits for them. When one fails, the others are terminated (SIGTERM,
// then SIGKILL after 3 s), so a crashed rank never leaves its peers hanging. Sets
// NCCL_NVLS_ENABLE=0 in the children unless the caller's environment sets it, and a random
// MG_DIST_TOKEN unless the caller's environment or `env` sets one (several nodes must share it).
SpawnResult spawn_ranks(const SpawnOptions& opts);

// 32 hex digits from the system's random source: a fresh job token.
std::string random_token();

}  // namespace mg::dist
