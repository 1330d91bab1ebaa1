// The NCCL backend: one communicator per process (one GPU each), collectives queued on a
// dedicated communication stream that first waits for the caller's current stream (an event,
// no host sync). Work::wait makes the caller's stream wait for the collective in turn, so
// compute and communication overlap and nothing blocks the host. Built only with CUDA.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "distributed/backends.h"

namespace mg::dist::detail {

namespace {

#define MG_NCCL_CHECK(call, who)                                                                \
  do {                                                                                          \
    ncclResult_t mg_r_ = (call);                                                                \
    if (mg_r_ != ncclSuccess && mg_r_ != ncclInProgress)                                        \
      MG_THROW(::mg::CudaError, who, ": ", #call, " failed: ", ncclGetErrorString(mg_r_), " (", \
               ncclGetLastError(nullptr), ")");                                                 \
  } while (0)

ncclDataType_t nccl_dtype(DType d, const std::string& who) {
  switch (d) {
    case DType::f64:
      return ncclFloat64;
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i64:
      return ncclInt64;
    case DType::i32:
      return ncclInt32;
    case DType::u8:
      return ncclUint8;
    case DType::b8:
      return ncclUint8;
  }
  MG_THROW(DTypeError, who, ": dtype ", d, " has no NCCL equivalent");
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

class NcclWork final : public Work {
 public:
  NcclWork(cuda::Event done, int device, ncclComm_t comm, std::chrono::milliseconds timeout, std::string what)
      : done_(std::move(done)), device_(device), comm_(comm), timeout_(timeout), what_(std::move(what)) {}
  void wait() override { done_.wait(cuda::Stream::current(device_)); }
  void synchronize() override {
    // Poll instead of cudaEventSynchronize: a dead peer would block forever there.
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!done_.query()) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      MG_CHECK(async == ncclSuccess || async == ncclInProgress, CudaError, what_, ": NCCL reported ",
               ncclGetErrorString(async));
      MG_CHECK(std::chrono::steady_clock::now() < deadline, Error, what_, ": timed out after ",
               timeout_.count() / 1000.0, " s waiting for the collective to finish (a peer may have died or ",
               "called a different collective)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  bool completed() override { return done_.query(); }

 private:
  cuda::Event done_;
  int device_;
  ncclComm_t comm_;
  std::chrono::milliseconds timeout_;
  std::string what_;
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
      MG_NCCL_CHECK(ncclGetUniqueId(&id), describe());
      blob.assign(reinterpret_cast<const char*>(&id), sizeof(id));
    }
    star_->broadcast_bytes(blob, "NCCL unique id exchange");
    MG_CHECK(blob.size() == sizeof(id), Error, describe(), ": got a malformed NCCL unique id");
    std::memcpy(&id, blob.data(), sizeof(id));
    // Every rank is known to be alive (the TCP rendezvous finished), so the blocking init
    // returns unless a peer dies in these milliseconds.
    MG_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()), describe());
    stream_ = cuda::Stream::create(local_rank());
  }

  ~NcclProcessGroup() override {
    if (comm_) {
      try {
        stream_.synchronize();
      } catch (const Error&) {
      }
      (void)ncclCommDestroy(comm_);
    }
  }

  void timeout_changed() override { star_->set_timeout(timeout()); }

  Device device() const override { return Device::cuda(local_rank()); }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    return launch("all_reduce", {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.raw_data(), t.raw_data(), t.numel(), nccl_dtype(t.dtype(), describe()), nccl_op(op), comm_,
                           s);
    });
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    check_root(root, "broadcast");
    return launch("broadcast", {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.raw_data(), t.raw_data(), t.numel(), nccl_dtype(t.dtype(), describe()), root, comm_, s);
    });
  }

  WorkPtr all_gather_async(const Tensor& out, const Tensor& in) override {
    check_tensor(out, "all_gather");
    check_tensor(in, "all_gather");
    check_sizes(in, out, "all_gather");
    return launch("all_gather", {out, in}, [&](cudaStream_t s) {
      return ncclAllGather(in.raw_data(), out.raw_data(), in.numel(), nccl_dtype(in.dtype(), describe()), comm_, s);
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_tensor(out, "reduce_scatter");
    check_tensor(in, "reduce_scatter");
    check_sizes(out, in, "reduce_scatter");
    return launch("reduce_scatter", {out, in}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.raw_data(), out.raw_data(), out.numel(), nccl_dtype(in.dtype(), describe()),
                               nccl_op(op), comm_, s);
    });
  }

  void barrier() override {
    // Device work queued so far (on the caller's and the communication stream) first, then
    // the host-side rendezvous, which is bounded by the timeout.
    Tensor one = zeros({1}, {DType::f32, device()});
    auto w = all_reduce_async(one, ReduceOp::Sum);
    w->synchronize();
    cuda::Stream::current(local_rank()).synchronize();
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
    MG_NCCL_CHECK(call(static_cast<cudaStream_t>(stream_.handle())), what);
    // The caching allocator must not hand these blocks to the caller's stream before the
    // collective has finished with them.
    for (const Tensor& t : tensors) cuda::record_stream(t, stream_);
    cuda::Event done;
    done.record(stream_);
    return std::make_shared<NcclWork>(done, local_rank(), comm_, timeout(), what);
  }

  std::unique_ptr<Star> star_;
  ncclComm_t comm_ = nullptr;
  cuda::Stream stream_;
  uint64_t seq_ = 0;
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
