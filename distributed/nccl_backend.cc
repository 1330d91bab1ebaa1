// The NCCL backend: one communicator per process (one GPU each), collectives queued on a
// dedicated communication stream that first waits for the caller's current stream (an event,
// no host sync). Work::wait makes the caller's stream wait for the collective in turn, so
// compute and communication overlap and nothing blocks the host. Built only with CUDA.
//
// Every wait is bounded: the communicator is non-blocking (init and enqueue return at once and
// are polled against the group's timeout), and a watchdog thread follows every collective in
// flight. When NCCL reports an asynchronous error or a collective is not done by its deadline
// (a dead or hung peer), the watchdog aborts the communicator -- NCCL's kernels waiting for the
// peer return, so a host sync behind Work::wait does not hang -- and marks the group broken:
// every later call raises DistributedError with the reason, and the destructor does not block.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/profiler.h"
#include "core/cuda_memory.h"
#include "core/enum_name.h"
#include "core/device_runtime.h"
#include "distributed/backends.h"

namespace mg::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_dtype(DType d, const std::string& who) {
  // Indexed by DType (core/dtype.h's order); bool travels as bytes.
  static constexpr ncclDataType_t kTypes[] = {ncclFloat64, ncclFloat32, ncclFloat16, ncclBfloat16,
                                              ncclInt64,   ncclInt32,   ncclUint8,   ncclUint8};
  const ncclDataType_t* type = enum_lookup(d, kTypes);
  MG_CHECK(type, DTypeError, who, ": dtype ", d, " has no NCCL equivalent");
  return *type;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
  }
  return ncclSum;
}

std::string nccl_error(ncclResult_t r) {
  return std::string(ncclGetErrorString(r)) + " (" + ncclGetLastError(nullptr) + ")";
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << ms.count() / 1000.0 << " s";
  return os.str();
}

// One collective in flight, as the watchdog sees it.
struct Pending {
  enum State { Running, Done, Failed };
  Pending(cuda::Event e, Clock::time_point d, std::string w) : done(std::move(e)), deadline(d), what(std::move(w)) {}
  cuda::Event done;
  Clock::time_point deadline;
  std::string what;
  std::atomic<int> state{Running};
};

// The communicator and everything the group, its Works and the watchdog share.
class Comm {
 public:
  Comm(std::string who, std::chrono::milliseconds timeout) : who_(std::move(who)), timeout_ms_(timeout.count()) {}

  // Joins the non-blocking communicator; bounded by the timeout (a peer that dies during init
  // leaves NCCL in progress forever).
  void init(int world, const ncclUniqueId& id, int rank) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::lock_guard<std::mutex> lock(comm_mu_);
    ncclResult_t r = ncclCommInitRankConfig(&comm_, world, id, rank, &config);
    settle(r, "ncclCommInitRank", Clock::now() + timeout());
  }

  // Runs one NCCL call on the communicator (an enqueue), bounded like init.
  template <class F>
  void call(F&& fn, const std::string& what) {
    check_usable();
    std::lock_guard<std::mutex> lock(comm_mu_);
    settle(fn(comm_), what, Clock::now() + timeout());
  }

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load()); }
  void set_timeout(std::chrono::milliseconds t) { timeout_ms_ = t.count(); }

  void check_usable() {
    std::lock_guard<std::mutex> lock(mu_);
    MG_CHECK(broken_.empty(), DistributedError, who_,
             ": the process group is unusable after an earlier error: ", broken_);
  }

  // Marks the group broken (the first reason wins) and aborts the communicator once.
  void fail(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.empty()) broken_ = reason;
      for (auto& p : pending_) p->state = Pending::Failed;
      pending_.clear();
    }
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_ && !aborted_) {
      (void)ncclCommAbort(comm_);  // also frees it
      aborted_ = true;
    }
  }

  std::string broken_reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  std::shared_ptr<Pending> track(cuda::Event done, const std::string& what) {
    auto p = std::make_shared<Pending>(std::move(done), Clock::now() + timeout(), what);
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty())
      pending_.push_back(p);
    else
      p->state = Pending::Failed;  // broke between the enqueue and here
    return p;
  }

  // One round of the watchdog: retire finished collectives, then fail the group on an NCCL
  // error or an overdue collective. Returns false once the group is broken.
  bool poll() {
    std::shared_ptr<Pending> oldest;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.empty()) return false;
      while (!pending_.empty() && finished(*pending_.front())) {
        pending_.front()->state = Pending::Done;
        pending_.pop_front();
      }
      if (!pending_.empty()) oldest = pending_.front();
    }
    ncclResult_t async = ncclSuccess;
    {
      std::unique_lock<std::mutex> lock(comm_mu_, std::try_to_lock);  // an enqueue polls for itself
      if (lock.owns_lock() && comm_ && !aborted_) ncclCommGetAsyncError(comm_, &async);
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      fail((oldest ? oldest->what + ": " : std::string()) + "NCCL reported " + nccl_error(async) +
           "; the communicator was aborted");
      return false;
    }
    if (oldest && Clock::now() >= oldest->deadline) {
      fail(oldest->what + " did not finish within " + seconds(timeout()) +
           " (a peer died, hangs, or called a different collective); the communicator was aborted");
      return false;
    }
    return true;
  }

  // Waits (bounded) for every collective in flight, then releases the communicator: finalize
  // and destroy when healthy, nothing more after an abort.
  void close() {
    const auto deadline = Clock::now() + timeout();
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_.empty() || !broken_.empty()) break;
      }
      if (!poll()) break;
      if (Clock::now() >= deadline) {
        fail("collectives still running when the process group was destroyed");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::unique_lock<std::mutex> lock(comm_mu_);
    if (!comm_ || aborted_) return;
    try {
      settle(ncclCommFinalize(comm_), "ncclCommFinalize", Clock::now() + timeout());
    } catch (const Error&) {
      if (!aborted_) (void)ncclCommAbort(comm_);
      aborted_ = true;
      return;
    }
    (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

 private:
  bool finished(const Pending& p) {
    try {
      return p.done.query();
    } catch (const Error&) {
      return true;  // a failed stream: the async error check below reports it
    }
  }

  // A non-blocking call returns ncclInProgress: poll until it settles or the deadline passes
  // (then abort). Caller holds comm_mu_.
  void settle(ncclResult_t r, const std::string& what, Clock::time_point deadline) {
    while (r == ncclInProgress && comm_) {
      if (Clock::now() >= deadline) {
        (void)ncclCommAbort(comm_);
        aborted_ = true;
        std::string reason = what + " did not complete within " + seconds(timeout()) +
                             " (a peer died or never joined); the communicator was aborted";
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (broken_.empty()) broken_ = reason;
        }
        MG_THROW(DistributedError, who_, ": ", reason);
      }
      ncclCommGetAsyncError(comm_, &r);
      if (r == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (r != ncclSuccess) {
      const std::string reason = what + " failed: " + nccl_error(r);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (broken_.empty()) broken_ = reason;
      }
      if (comm_ && !aborted_) (void)ncclCommAbort(comm_);
      aborted_ = true;
      MG_THROW(DistributedError, who_, ": ", reason);
    }
  }

  const std::string who_;
  std::atomic<int64_t> timeout_ms_;
  std::mutex comm_mu_;  // NCCL calls on comm_ (never held while waiting on mu_'s holders)
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  std::mutex mu_;
  std::string broken_;
  std::deque<std::shared_ptr<Pending>> pending_;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Comm> comm, std::shared_ptr<Pending> p, int device)
      : comm_(std::move(comm)), p_(std::move(p)), device_(device) {}
  void wait() override {
    raise_if_failed();
    p_->done.wait(cuda::Stream::current(device_));
  }
  void synchronize() override {
    // Polls instead of cudaEventSynchronize (a dead peer would block forever there); the
    // watchdog decides when the collective is overdue and aborts it.
    while (p_->state == Pending::Running && comm_->broken_reason().empty()) {
      try {
        if (p_->done.query()) break;
      } catch (const Error&) {
        raise_if_failed();  // an aborted stream may report an error: say why
        throw;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    raise_if_failed();
  }
  bool completed() override { return p_->state != Pending::Running || p_->done.query(); }

 private:
  void raise_if_failed() {
    if (p_->state == Pending::Failed || !comm_->broken_reason().empty())
      MG_THROW(DistributedError, p_->what, ": the process group failed: ", comm_->broken_reason());
  }
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<Pending> p_;
  int device_;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(std::unique_ptr<Star> star, const ProcessGroupOptions& o)
      : ProcessGroup(o.rank, o.world_size, o.local_rank, Backend::Nccl, o.timeout), star_(std::move(star)) {
    // NVLink multicast (NVLS) stays off unless the user chose otherwise: on shared hosts a
    // program using it can take the GPUs out of service. Must be set before the communicator.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    cuda::set_device(local_rank());
    ncclUniqueId id{};
    std::string blob;
    if (rank() == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      MG_CHECK(r == ncclSuccess, CudaError, describe(), ": ncclGetUniqueId failed: ", nccl_error(r));
      blob.assign(reinterpret_cast<const char*>(&id), sizeof(id));
    }
    star_->broadcast_bytes(blob, "NCCL unique id exchange");
    MG_CHECK(blob.size() == sizeof(id), DistributedError, describe(), ": got a malformed NCCL unique id");
    std::memcpy(&id, blob.data(), sizeof(id));
    comm_ = std::make_shared<Comm>(describe(), timeout());
    comm_->init(size(), id, rank());
    // A lasting stream: the collectives' tensors are recorded on it and may outlive this group.
    stream_ = cuda::Stream::create_lasting(local_rank());
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    watchdog_.join();
    comm_->close();
  }

  void timeout_changed() override {
    star_->set_timeout(timeout());
    comm_->set_timeout(timeout());
  }

  Device device() const override { return Device::cuda(local_rank()); }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    return launch("all_reduce", {t}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(t.raw_data(), t.raw_data(), t.numel(), nccl_dtype(t.dtype(), describe()), nccl_op(op), c, s);
    });
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    check_root(root, "broadcast");
    return launch("broadcast", {t}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(t.raw_data(), t.raw_data(), t.numel(), nccl_dtype(t.dtype(), describe()), root, c, s);
    });
  }

  WorkPtr all_gather_async(const Tensor& out, const Tensor& in) override {
    check_tensor(out, "all_gather");
    check_tensor(in, "all_gather");
    check_sizes(in, out, "all_gather");
    return launch("all_gather", {out, in}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in.raw_data(), out.raw_data(), in.numel(), nccl_dtype(in.dtype(), describe()), c, s);
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_tensor(out, "reduce_scatter");
    check_tensor(in, "reduce_scatter");
    check_sizes(out, in, "reduce_scatter");
    return launch("reduce_scatter", {out, in}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in.raw_data(), out.raw_data(), out.numel(), nccl_dtype(in.dtype(), describe()),
                               nccl_op(op), c, s);
    });
  }

  void barrier() override {
    // Device work queued so far (on the caller's and the communication stream) first, then
    // the host-side rendezvous. The all-reduce is watched; the stream sync behind it returns
    // once the watchdog aborts a stuck collective; the TCP barrier has the timeout.
    Tensor one = zeros({1}, {DType::f32, device()});
    auto w = all_reduce_async(one, ReduceOp::Sum);
    w->synchronize();
    cuda::Stream::current(local_rank()).synchronize();
    comm_->check_usable();
    star_->barrier("barrier");
  }

 private:
  template <class F>
  WorkPtr launch(const char* op, std::vector<Tensor> tensors, F&& call) {
    const std::string what = describe() + ": " + op + " #" + std::to_string(++seq_);
    cuda::DeviceGuard g(local_rank());
    cuda::Stream current = cuda::Stream::current(local_rank());
    cuda::Event ready;
    ready.record(current);
    ready.wait(stream_);
    {
      // The launch on a trace's collective track: NCCL's kernels (at world size 1, its copies) are
      // linked to it, on the communication stream's track (core/profiler.h).
      profiler::Range range(op, "collective");
      comm_->call([&](ncclComm_t c) { return call(c, static_cast<cudaStream_t>(stream_.handle())); }, what);
    }
    // Inside a CUDA graph capture (a captured DDP step) the collective is a node of the graph:
    // the event edges above and in Work::wait order it, the graph's pool keeps its memory from
    // eager code, and there is nothing in flight for the watchdog to follow, so a replayed
    // collective has no timeout of its own.
    const bool captured = cuda::is_capturing(local_rank());
    // The caching allocator must not hand these blocks to the caller's stream before the
    // collective has finished with them.
    if (!captured)
      for (const Tensor& t : tensors) cuda::record_stream(t, stream_);
    cuda::Event done;
    done.record(stream_);
    if (captured) {
      auto p = std::make_shared<Pending>(std::move(done), Clock::now(), what);
      p->state = Pending::Done;  // wait() still joins the event; synchronize() has nothing to poll
      return std::make_shared<NcclWork>(comm_, std::move(p), local_rank());
    }
    return std::make_shared<NcclWork>(comm_, comm_->track(std::move(done), what), local_rank());
  }

  // The watchdog: a round every 20 ms until the group is destroyed or broken.
  void watch() {
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (!stop_) {
      stop_cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (stop_) break;
      lock.unlock();
      const bool healthy = comm_->poll();
      lock.lock();
      if (!healthy) break;
    }
  }

  std::unique_ptr<Star> star_;
  std::shared_ptr<Comm> comm_;
  cuda::Stream stream_;
  uint64_t seq_ = 0;
  std::thread watchdog_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
};

std::shared_ptr<ProcessGroup> make_nccl_group(std::unique_ptr<Star> star, const ProcessGroupOptions& opts) {
  return std::make_shared<NcclProcessGroup>(std::move(star), opts);
}

// Registers the backend when this library is linked in (alwayslink).
const bool registered = [] {
  nccl_factory() = &make_nccl_group;
  return true;
}();

}  // namespace

}  // namespace mg::dist::detail
