// Options from the environment, shared argument checks, the blocking conveniences, and
// init_process_group choosing a backend.
#include "distributed/process_group.h"

#include <cstdlib>

#include "core/device_runtime.h"
#include "core/enum_name.h"
#include "core/env.h"
#include "core/profiler.h"
#include "distributed/backends.h"
#include "distributed/launch_env.h"
#include "kernels/ops.h"

namespace mg::dist {

const char* reduce_op_name(ReduceOp op) { return enum_name(op, {"sum", "avg", "max"}); }

const char* backend_name(Backend b) { return enum_name(b, {"auto", "cpu", "nccl"}); }

namespace detail {
GroupFactory& nccl_factory() {
  static GroupFactory f = nullptr;
  return f;
}
}  // namespace detail

bool nccl_available() { return detail::nccl_factory() != nullptr; }

ProcessGroupOptions resolve_options(ProcessGroupOptions o) {
  if (o.rank < 0 || o.world_size < 0 || o.local_rank < 0 || o.master_addr.empty() || o.master_port < 0) {
    const LaunchEnv e = LaunchEnv::from_environment();
    if (o.local_rank < 0) o.local_rank = o.rank >= 0 && e.launcher == "none" ? o.rank : e.local_rank;
    if (o.rank < 0) o.rank = e.rank;
    if (o.world_size < 0) o.world_size = e.world_size;
    if (o.master_addr.empty()) o.master_addr = e.master_addr;
    if (o.master_port < 0) o.master_port = e.master_port;
  }
  if (o.token.empty() && env::get("MG_DIST_TOKEN")) o.token = env::get("MG_DIST_TOKEN");
  if (o.init_file.empty() && env::get("MG_DIST_INIT_FILE")) o.init_file = env::get("MG_DIST_INIT_FILE");
  if (o.timeout.count() <= 0) {
    const char* t = env::get("MG_DIST_TIMEOUT_S");
    double s = 60.0;
    if (t) {
      char* end = nullptr;
      s = std::strtod(t, &end);
      MG_CHECK(end && *end == '\0' && s > 0, ValueError, "init_process_group: MG_DIST_TIMEOUT_S='", t,
               "' is not a positive number of seconds");
    }
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  if (o.backend == Backend::Auto) {
    if (const char* b = env::get("MG_DIST_BACKEND")) {
      std::string v = b;
      MG_CHECK(v == "cpu" || v == "nccl", ValueError, "init_process_group: MG_DIST_BACKEND='", v,
               "' (expected cpu or nccl)");
      o.backend = v == "cpu" ? Backend::Cpu : Backend::Nccl;
    } else {
      o.backend = nccl_available() && cuda::device_count() > 0 ? Backend::Nccl : Backend::Cpu;
    }
  }
  MG_CHECK(o.world_size >= 1, ValueError, "init_process_group: world size must be >= 1, got ", o.world_size);
  MG_CHECK(o.rank < o.world_size, ValueError, "init_process_group: rank ", o.rank, " is not below world size ",
           o.world_size);
  MG_CHECK(o.master_port > 0 && o.master_port < 65536, ValueError, "init_process_group: MASTER_PORT ", o.master_port,
           " is not a TCP port");
  MG_CHECK(o.world_size == 1 || !o.token.empty(), ValueError, "init_process_group: rank ", o.rank, " of ", o.world_size,
           ": no job token; set MG_DIST_TOKEN to the same secret on every rank (tools/launch and ",
           "spawn_ranks do; with srun, mpirun or torchrun: export MG_DIST_TOKEN=$(head -c 16 /dev/urandom | od -An ",
           "-tx1 | tr -d ' \\n') before launching)");
  MG_CHECK(o.token.size() <= detail::kMaxTokenBytes, ValueError, "init_process_group: MG_DIST_TOKEN has ",
           o.token.size(), " bytes, at most ", detail::kMaxTokenBytes, " are used");
  return o;
}

std::shared_ptr<ProcessGroup> init_process_group(ProcessGroupOptions opts) {
  ProcessGroupOptions o = resolve_options(std::move(opts));
  if (o.backend == Backend::Nccl) {
    MG_CHECK(nccl_available(), Error, "init_process_group: rank ", o.rank, " of ", o.world_size,
             ": the NCCL backend is not in this build (built without CUDA); use the cpu backend");
    int n = cuda::device_count();
    MG_CHECK(o.local_rank < n, DeviceError, "init_process_group: rank ", o.rank, " of ", o.world_size,
             " wants cuda:", o.local_rank, " (LOCAL_RANK) but ", n, " GPU(s) are visible");
  }
  auto star = detail::Star::connect(o);
  if (o.backend == Backend::Nccl) return detail::nccl_factory()(std::move(star), o);
  return detail::make_cpu_group(std::move(star), o);
}

// ---------------- ProcessGroup ----------------

void ProcessGroup::set_timeout(std::chrono::milliseconds t) {
  MG_CHECK(t.count() > 0, ValueError, "set_timeout: ", describe(), ": the timeout must be positive, got ", t.count(),
           " ms");
  timeout_ = t;
  timeout_changed();
}

std::string ProcessGroup::describe() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + " (" + backend_name(backend_) + ")";
}

void ProcessGroup::check_tensor(const Tensor& t, const char* op) const {
  MG_CHECK(t.defined(), ValueError, op, ": ", describe(), ": got an undefined tensor");
  MG_CHECK(t.device() == device(), DeviceError, op, ": ", describe(), ": tensor is on ", t.device(),
           " but this process group works on ", device());
  MG_CHECK(t.is_contiguous(), ValueError, op, ": ", describe(), ": tensor of shape ", shape_str(t.sizes()),
           " must be contiguous (the blocking form accepts any strides)");
}

void ProcessGroup::check_sizes(const Tensor& small, const Tensor& big, const char* op) const {
  MG_CHECK(small.dtype() == big.dtype(), DTypeError, op, ": ", describe(), ": dtypes differ (", small.dtype(), " vs ",
           big.dtype(), ")");
  MG_CHECK(big.numel() == small.numel() * size(), ShapeError, op, ": ", describe(), ": the large tensor has ",
           big.numel(), " elements, expected world size x ", small.numel(), " = ", small.numel() * size());
}

void ProcessGroup::check_root(int root, const char* op) const {
  MG_CHECK(root >= 0 && root < size(), ValueError, op, ": ", describe(), ": root ", root, " is not a rank");
}

namespace {
// Runs `fn` on a contiguous stand-in for `t` and copies the result back when it was not.
template <class F>
void on_contiguous(const Tensor& t, F&& fn) {
  if (!t.defined() || t.is_contiguous()) {  // (an undefined tensor: the collective's check raises)
    fn(t);
    return;
  }
  Tensor c = raw::contiguous(t);
  fn(c);
  raw::copy_(t, c);
}
}  // namespace

void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) {
  profiler::Range range("all_reduce", "collective");  // a trace's collective track (core/profiler.h)
  on_contiguous(t, [&](const Tensor& c) { all_reduce_async(c, op)->wait(); });
}

void ProcessGroup::broadcast(const Tensor& t, int root) {
  profiler::Range range("broadcast", "collective");
  on_contiguous(t, [&](const Tensor& c) { broadcast_async(c, root)->wait(); });
}

void ProcessGroup::all_gather(const Tensor& out, const Tensor& in) {
  profiler::Range range("all_gather", "collective");
  Tensor src = in.defined() && !in.is_contiguous() ? raw::contiguous(in) : in;
  on_contiguous(out, [&](const Tensor& c) { all_gather_async(c, src)->wait(); });
}

Tensor ProcessGroup::all_gather(const Tensor& in) {
  MG_CHECK(in.defined(), ValueError, "all_gather: ", describe(), ": got an undefined tensor");
  Shape s = in.sizes();
  s.insert(s.begin(), size());
  Tensor out = empty(s, {in.dtype(), in.device()});
  all_gather(out, in);
  return out;
}

void ProcessGroup::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  profiler::Range range("reduce_scatter", "collective");
  Tensor src = in.defined() && !in.is_contiguous() ? raw::contiguous(in) : in;
  on_contiguous(out, [&](const Tensor& c) { reduce_scatter_async(c, src, op)->wait(); });
}

}  // namespace mg::dist
