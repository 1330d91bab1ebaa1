// fork + execve of N ranks, a polling wait that notices the first failure, and cleanup that
// only ever signals the processes started here.
#include "distributed/spawn.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "core/error.h"
#include "distributed/tcp_rendezvous.h"

extern char** environ;

namespace mg::dist {

namespace {
using Clock = std::chrono::steady_clock;

int decode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void stop_all(std::map<pid_t, int>& running) {
  for (auto& [pid, rank] : running) ::kill(pid, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (!running.empty() && Clock::now() < deadline) {
    for (auto it = running.begin(); it != running.end();) {
      int st = 0;
      it = ::waitpid(it->first, &st, WNOHANG) == it->first ? running.erase(it) : std::next(it);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& [pid, rank] : running) {
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
  running.clear();
}
}  // namespace

std::string random_token() {
  std::random_device rd;  // /dev/urandom on Linux
  std::string t;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 4; ++i) {
    const uint32_t x = rd();
    for (int k = 0; k < 8; ++k) t += hex[(x >> (4 * k)) & 15];
  }
  return t;
}

SpawnResult spawn_ranks(const SpawnOptions& o) {
  MG_CHECK(o.nproc >= 1, ValueError, "spawn_ranks: nproc must be >= 1, got ", o.nproc);
  MG_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes, ValueError, "spawn_ranks: node_rank ",
           o.node_rank, " of nnodes ", o.nnodes);
  MG_CHECK(o.nnodes == 1 || o.master_port > 0, ValueError, "spawn_ranks: ", o.nnodes,
           " nodes need one master_port chosen for all of them");
  const std::string exe = o.executable.empty() ? "/proc/self/exe" : o.executable;
  const int port = o.master_port > 0 ? o.master_port : detail::free_tcp_port();

  // The environment shared by all ranks: inherited, minus unset_env, plus env.
  std::map<std::string, std::string> base;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) base[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& k : o.unset_env) base.erase(k);
  base.emplace("NCCL_NVLS_ENABLE", "0");
  if (base.count("MG_DIST_TOKEN") == 0 || base["MG_DIST_TOKEN"].empty()) base["MG_DIST_TOKEN"] = random_token();
  base["WORLD_SIZE"] = std::to_string(o.nnodes * o.nproc);
  base["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc);
  base["MASTER_ADDR"] = o.master_addr;
  base["MASTER_PORT"] = std::to_string(port);
  for (const auto& [k, v] : o.env) base[k] = v;

  std::vector<int> ranks = o.only_ranks;
  if (ranks.empty())
    for (int r = 0; r < o.nproc; ++r) ranks.push_back(r);

  std::map<pid_t, int> running;
  SpawnResult res;
  for (int rank : ranks) {
    // Everything execve needs is built before fork (the child may only call async-signal-safe
    // functions in a threaded parent).
    auto env = base;
    env["RANK"] = std::to_string(o.node_rank * o.nproc + rank);
    env["LOCAL_RANK"] = std::to_string(rank);
    std::vector<std::string> env_str;
    for (const auto& [k, v] : env) env_str.push_back(k + "=" + v);
    std::vector<char*> envp, argv;
    for (auto& s : env_str) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string arg0 = exe;
    std::vector<std::string> args = o.args;
    argv.push_back(arg0.data());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) {
      stop_all(running);
      MG_THROW(Error, "spawn_ranks: fork failed for rank ", rank, ": ", std::strerror(errno));
    }
    running[pid] = rank;
  }

  const auto deadline = o.timeout.count() > 0 ? Clock::now() + o.timeout : Clock::time_point::max();
  while (!running.empty()) {
    bool progressed = false;
    for (auto it = running.begin(); it != running.end();) {
      int st = 0;
      if (::waitpid(it->first, &st, WNOHANG) != it->first) {
        ++it;
        continue;
      }
      progressed = true;
      const int code = decode(st);
      const int rank = it->second;
      it = running.erase(it);
      const auto expected = o.expected_exit.find(rank);
      if (code != (expected == o.expected_exit.end() ? 0 : expected->second) && res.exit_code == 0) {
        res.exit_code = code == 0 ? 1 : code;  // (0 from a rank expected to die is a failure too)
        res.failed_rank = rank;
        res.message = "rank " + std::to_string(rank) + " exited with " +
                      (WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st)) : "code " + std::to_string(code)) +
                      (running.empty() ? "" : "; stopping the other ranks");
        stop_all(running);
        return res;
      }
    }
    if (Clock::now() >= deadline) {
      res.exit_code = 124;
      res.timed_out = true;
      res.message = "spawn_ranks: " + std::to_string(running.size()) + " rank(s) still running after " +
                    std::to_string(o.timeout.count() / 1000.0) + " s; killed them";
      stop_all(running);
      return res;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return res;
}

}  // namespace mg::dist
