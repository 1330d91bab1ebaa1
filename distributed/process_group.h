// Process groups: one process per GPU (or per CPU "rank"), collectives on tensors. NCCL moves
// CUDA tensors; a CPU backend over the same TCP rendezvous does real reductions on host tensors
// so the collective logic, DDP and tensor parallelism are tested on machines without a GPU.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace mg::dist {

// A peer died, went silent past the group's timeout, broke the protocol, or failed the
// rendezvous; also every later call on a group that an earlier such failure made unusable.
class DistributedError : public Error {
  using Error::Error;
};

enum class ReduceOp { Sum, Avg, Max };
enum class Backend { Auto, Cpu, Nccl };
const char* reduce_op_name(ReduceOp op);
const char* backend_name(Backend b);

// A collective in flight. For NCCL the work is queued on the group's communication stream.
class Work {
 public:
  virtual ~Work() = default;
  // Makes the result usable by what the caller does next: NCCL makes the caller's current
  // stream wait for the collective (no host block; the group's watchdog aborts the
  // communicator if it does not finish within the timeout, so a later host sync returns);
  // the CPU backend blocks until it is done. Raises DistributedError on a broken group.
  virtual void wait() = 0;
  // Blocks the host until the collective has finished; raises DistributedError after the
  // group's timeout or when a peer failed.
  virtual void synchronize() = 0;
  virtual bool completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Where a process finds its peers. Fields left at -1 / empty are read from the environment:
// the launcher's variables (LaunchEnv: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT; Slurm's; Open MPI's), MG_DIST_TOKEN, MG_DIST_INIT_FILE, MG_DIST_BACKEND ("cpu"
// or "nccl"), MG_DIST_TIMEOUT_S.
struct ProcessGroupOptions {
  Backend backend = Backend::Auto;  // Auto: NCCL when built with CUDA and a GPU is visible, else CPU
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;  // the GPU this process drives (default: rank)
  // Rank 0 listens on this address only (default 127.0.0.1, so a single-host job is not
  // reachable from the network); on several hosts it must be an address of rank 0's host.
  std::string master_addr;
  int master_port = -1;  // default 29500
  // The job's shared secret (MG_DIST_TOKEN; tools/launch and spawn_ranks make a random one):
  // rank 0 admits only peers whose hello carries it. Required when world_size > 1; 1-64 bytes.
  std::string token;
  // Rendezvous through a shared file instead of a fixed port: rank 0 listens on a free port and
  // writes "host port" into this file; the others read it. Takes precedence over MASTER_PORT.
  std::string init_file;
  // How long any wait (rendezvous, a peer's data, a barrier, a collective on the GPU) may take
  // before DistributedError; 0 = MG_DIST_TIMEOUT_S from the environment, else 60 s.
  std::chrono::milliseconds timeout{0};
};

// Fills every unset field of `opts` from the environment (and defaults); raises ValueError
// naming the variable when one is malformed, RANK >= WORLD_SIZE, or a job of several ranks
// has no token.
ProcessGroupOptions resolve_options(ProcessGroupOptions opts);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  Backend backend() const { return backend_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Changes the limit for later waits (collectives, barriers) of this process group.
  void set_timeout(std::chrono::milliseconds t);
  // The device collectives expect tensors on: cpu, or cuda:local_rank for NCCL.
  virtual Device device() const = 0;

  // ---- asynchronous collectives (all ranks must call them in the same order) ----
  // In place on `t` (contiguous).
  virtual WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  virtual WorkPtr broadcast_async(const Tensor& t, int root) = 0;
  // `out` (contiguous, numel = size() * in.numel()) receives rank r's `in` at [r*n, (r+1)*n).
  virtual WorkPtr all_gather_async(const Tensor& out, const Tensor& in) = 0;
  // `in` (numel = size() * out.numel()): out = reduction over ranks of in[rank*n, (rank+1)*n).
  virtual WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) = 0;
  // Blocks until every rank has reached it (and, on NCCL, the device work queued so far ran).
  virtual void barrier() = 0;

  // ---- blocking conveniences (any strides; results visible on return) ----
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  void broadcast(const Tensor& t, int root = 0);
  void all_gather(const Tensor& out, const Tensor& in);
  // Returns [size(), *in.shape]: every rank's `in`, stacked in rank order.
  Tensor all_gather(const Tensor& in);
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum);

  // "rank 1 of 4 (cpu)": the prefix of every error message.
  std::string describe() const;

 protected:
  ProcessGroup(int rank, int world_size, int local_rank, Backend backend, std::chrono::milliseconds timeout)
      : rank_(rank), world_size_(world_size), local_rank_(local_rank), backend_(backend), timeout_(timeout) {}
  // Shared argument checks; raise ValueError/DeviceError/ShapeError naming `op`.
  void check_tensor(const Tensor& t, const char* op) const;
  void check_sizes(const Tensor& small, const Tensor& big, const char* op) const;
  void check_root(int root, const char* op) const;
  virtual void timeout_changed() {}

 private:
  int rank_, world_size_, local_rank_;
  Backend backend_;
  std::chrono::milliseconds timeout_;
};

// Joins the group described by `opts` (environment for unset fields): blocks until every rank
// has arrived or the timeout has passed (then mg::Error naming rank, world size and who is
// missing). For NCCL it also sets NCCL_NVLS_ENABLE=0 when unset (NVLink multicast stays off)
// and makes cuda:local_rank the current device.
std::shared_ptr<ProcessGroup> init_process_group(ProcessGroupOptions opts = {});

// True when this build has the NCCL backend.
bool nccl_available();

}  // namespace mg::dist
