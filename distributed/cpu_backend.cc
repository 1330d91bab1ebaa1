// The CPU backend: collectives on host tensors through the TCP star. Rank 0 is the hub: it
// receives every rank's buffer, checks that all ranks called the same collective on the same
// shape, reduces in rank order with the ordinary kernels (so every dtype works and results are
// deterministic), and sends the result back. A worker thread runs the collectives in the order
// they were issued, so *_async really overlaps with the caller (DDP's backward). Every size a
// peer announces is checked against what this rank expects before anything is allocated or
// received, and a group that fails shuts its connections so the other ranks learn at once.
#include "distributed/cpu_backend.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/enum_name.h"
#include "core/profiler.h"
#include "distributed/backends.h"
#include "kernels/ops.h"

namespace mg::dist::detail {

namespace {

using OpCode = CpuOp;
using Header = CpuHeader;
using Reply = CpuReply;

const char* op_name(OpCode op) {
  return enum_name(op, {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"}, 1);
}

class CpuWork final : public Work {
 public:
  explicit CpuWork(std::function<void()> fn) : fn_(std::move(fn)) {}
  void run() {
    std::exception_ptr err;
    try {
      fn_();
    } catch (...) {
      err = std::current_exception();
    }
    fn_ = nullptr;  // drop the tensors the collective held
    std::lock_guard<std::mutex> lock(mu_);
    err_ = err;
    done_ = true;
    cv_.notify_all();
  }
  void wait() override { synchronize(); }
  void synchronize() override {
    // The collective itself is deadline-bounded (every receive has the group's timeout).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (err_) std::rethrow_exception(err_);
  }
  bool completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  std::function<void()> fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr err_;
};

class CpuProcessGroup final : public ProcessGroup {
 public:
  CpuProcessGroup(std::unique_ptr<Star> star, const ProcessGroupOptions& o)
      : ProcessGroup(o.rank, o.world_size, o.local_rank, Backend::Cpu, o.timeout), star_(std::move(star)) {
    worker_ = std::thread([this] { loop(); });
  }
  ~CpuProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    worker_.join();
  }

  void timeout_changed() override { star_->set_timeout(timeout()); }

  Device device() const override { return Device::cpu(); }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    MG_CHECK(op != ReduceOp::Avg || is_floating(t.dtype()), DTypeError, "all_reduce: ", describe(),
             ": avg needs a floating dtype, got ", t.dtype());
    return enqueue([this, t, op] {
      Tensor r = exchange(OpCode::AllReduce, static_cast<int>(op), t,
                          [&](std::vector<Tensor>& all) { return reduce(all, op); });
      if (r.defined()) kernels::copy_(raw::view(t, {t.numel()}), r);
    });
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    check_root(root, "broadcast");
    return enqueue([this, t, root] {
      Tensor r = exchange(OpCode::Broadcast, root, t, [&](std::vector<Tensor>& all) { return all[root]; });
      if (r.defined() && rank() != root) kernels::copy_(raw::view(t, {t.numel()}), r);
    });
  }

  WorkPtr all_gather_async(const Tensor& out, const Tensor& in) override {
    check_tensor(out, "all_gather");
    check_tensor(in, "all_gather");
    check_sizes(in, out, "all_gather");
    return enqueue([this, out, in] {
      Tensor r = exchange(OpCode::AllGather, 0, in, [&](std::vector<Tensor>& all) {
        for (auto& a : all) a = raw::view(a, {1, a.numel()});
        return kernels::cat(all, 0);
      });
      kernels::copy_(raw::view(out, {out.numel()}), raw::view(r, {r.numel()}));
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_tensor(out, "reduce_scatter");
    check_tensor(in, "reduce_scatter");
    check_sizes(out, in, "reduce_scatter");
    MG_CHECK(op != ReduceOp::Avg || is_floating(in.dtype()), DTypeError, "reduce_scatter: ", describe(),
             ": avg needs a floating dtype, got ", in.dtype());
    return enqueue([this, out, in, op] {
      // The whole reduction comes back and each rank keeps its slice: a star hub has to touch
      // every byte anyway, and one reply shape keeps the protocol small.
      Tensor r = exchange(OpCode::ReduceScatter, static_cast<int>(op), in,
                          [&](std::vector<Tensor>& all) { return reduce(all, op); });
      const int64_t n = out.numel();
      kernels::copy_(raw::view(out, {n}), raw::slice(raw::view(r, {r.numel()}), 0, rank() * n, (rank() + 1) * n, 1));
    });
  }

  void barrier() override {
    enqueue([this] {
      exchange(OpCode::Barrier, 0, Tensor(), [](std::vector<Tensor>&) { return Tensor(); });
    })->synchronize();
  }

 private:
  WorkPtr enqueue(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      MG_CHECK(broken_.empty(), DistributedError, describe(),
               ": the process group is unusable after an earlier error: ", broken_);
    }
    auto w = std::make_shared<CpuWork>(std::move(fn));
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(w);
    cv_.notify_all();
    return w;
  }

  void loop() {
    for (;;) {
      std::shared_ptr<CpuWork> w;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        w = queue_.front();
        queue_.pop_front();
      }
      w->run();
    }
  }

  Tensor reduce(std::vector<Tensor>& all, ReduceOp op) const {
    Tensor acc = raw::clone(all[0]);
    for (size_t r = 1; r < all.size(); ++r)
      kernels::binary_(op == ReduceOp::Max ? kernels::Binary::Maximum : kernels::Binary::Add, acc, all[r]);
    if (op == ReduceOp::Avg && all.size() > 1) kernels::axpby_(acc, 1.0 / static_cast<double>(all.size()), acc, 0.0);
    return acc;
  }

  // One collective through the hub. Every rank sends its header (and its input, unless this is
  // a broadcast from another rank); rank 0 checks them, `combine`s the inputs (index = rank)
  // and replies with the result. Returns the result (undefined for a barrier).
  template <class Combine>
  Tensor exchange(OpCode op, int arg, const Tensor& in, Combine&& combine) {
    // On the worker's track of a trace: when the collective actually ran, beside the compute of
    // the thread that launched it (the overlap an asynchronous gather buys).
    profiler::Range range(op_name(op), "collective");
    const uint64_t seq = ++seq_;
    const std::string what = std::string(op_name(op)) + " #" + std::to_string(seq);
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      MG_CHECK(broken_.empty(), DistributedError, describe(), ": ", what,
               ": the process group is unusable after an earlier error: ", broken_);
    }
    try {
      return exchange_impl(op, arg, in, seq, what, combine);
    } catch (const std::exception& e) {
      break_group(e.what(), what);
      throw;
    }
  }

  // After a failure nothing on this group can succeed: remember why, tell the peers (rank 0
  // forwards the reason, best effort) and shut the connections so nobody waits for a timeout.
  void break_group(const std::string& reason, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      broken_ = reason;
    }
    if (rank() == 0) {
      const std::string msg = reason.substr(0, kMaxControlBytes);
      for (int r = 1; r < size(); ++r) {
        Reply rep{1, 0, msg.size()};
        try {
          star_->send(r, &rep, sizeof(rep), what);
          star_->send(r, msg.data(), msg.size(), what);
        } catch (const Error&) {
        }
      }
    }
    star_->shutdown();
  }

  template <class Combine>
  Tensor exchange_impl(OpCode op, int arg, const Tensor& in, uint64_t seq, const std::string& what, Combine& combine) {
    Header mine;
    mine.op = static_cast<uint32_t>(op);
    mine.dtype = in.defined() ? static_cast<uint32_t>(in.dtype()) : 0;
    mine.seq = seq;
    mine.nbytes = in.defined() ? in.nbytes() : 0;
    mine.arg = arg;
    const bool sends_data = in.defined() && (op != OpCode::Broadcast || arg == rank());
    if (rank() != 0) {
      star_->send(0, &mine, sizeof(mine), what);
      if (sends_data && mine.nbytes) star_->send(0, in.raw_data(), mine.nbytes, what);
      Reply rep;
      star_->recv(0, &rep, sizeof(rep), what);
      MG_CHECK(rep.status <= 1, DistributedError, describe(), ": ", what, ": rank 0 replied with status ", rep.status,
               " (a corrupt stream or not a memgrad peer)");
      if (rep.status != 0) {
        MG_CHECK(rep.nbytes <= kMaxControlBytes, DistributedError, describe(), ": ", what,
                 ": rank 0 announced an error message of ", rep.nbytes, " bytes, at most ", kMaxControlBytes,
                 " are allowed");
        std::string msg(rep.nbytes, '\0');
        if (rep.nbytes) star_->recv(0, msg.data(), rep.nbytes, what);
        MG_THROW(DistributedError, describe(), ": ", what, " failed on rank 0: ", msg);
      }
      // The result's size is known here: the input's, size() times it for all_gather, nothing
      // for a barrier. Anything else is refused before a byte of it is read.
      const int64_t numel = op == OpCode::Barrier ? 0 : op == OpCode::AllGather ? in.numel() * size() : in.numel();
      const uint64_t want = op == OpCode::Barrier ? 0 : static_cast<uint64_t>(numel) * in.element_size();
      MG_CHECK(rep.nbytes == want, DistributedError, describe(), ": ", what, ": rank 0 replied with ", rep.nbytes,
               " bytes, expected exactly ", want);
      if (op == OpCode::Barrier) return Tensor();
      Tensor r = empty({numel}, {in.dtype(), Device::cpu()});
      if (want) star_->recv(0, r.raw_data(), want, what);
      return r;
    }

    // Rank 0: gather the inputs in rank order, checking that everyone agrees.
    std::vector<Tensor> all(size());
    all[0] = in;
    std::string problem;
    for (int r = 1; r < size() && problem.empty(); ++r) {
      Header h;
      star_->recv(r, &h, sizeof(h), what);
      if (h.op != mine.op || h.seq != mine.seq)
        problem = "rank " + std::to_string(r) + " called " + op_name(static_cast<OpCode>(h.op)) + " #" +
                  std::to_string(h.seq) + " while rank 0 called " + what;
      else if (h.dtype != mine.dtype || h.nbytes != mine.nbytes || h.arg != mine.arg)
        problem = "rank " + std::to_string(r) + " passed " + std::to_string(h.nbytes) + " bytes of " +
                  (h.dtype <= static_cast<uint32_t>(DType::b8) ? dtype_name(static_cast<DType>(h.dtype)) : "?") +
                  " (arg " + std::to_string(h.arg) + "), rank 0 passed " + std::to_string(mine.nbytes) + " bytes of " +
                  (in.defined() ? dtype_name(in.dtype()) : "nothing") + " (arg " + std::to_string(mine.arg) + ")";
      else if (op != OpCode::Barrier && (op != OpCode::Broadcast || arg == r)) {
        all[r] = empty({in.numel()}, {in.dtype(), Device::cpu()});
        if (h.nbytes) star_->recv(r, all[r].raw_data(), h.nbytes, what);
      }
    }
    // (break_group reports it to every rank.)
    if (!problem.empty()) MG_THROW(DistributedError, describe(), ": ", what, ": mismatched collective: ", problem);
    Tensor result;
    if (op != OpCode::Barrier) {
      for (auto& a : all)
        if (a.defined()) a = raw::view(a, {a.numel()});
      result = combine(all);
    }
    Reply rep{0, 0, result.defined() ? result.nbytes() : 0};
    for (int r = 1; r < size(); ++r) {
      star_->send(r, &rep, sizeof(rep), what);
      if (rep.nbytes) star_->send(r, result.raw_data(), rep.nbytes, what);
    }
    return result;
  }

  std::unique_ptr<Star> star_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<CpuWork>> queue_;
  bool stop_ = false;
  uint64_t seq_ = 0;  // touched by the worker thread only
  std::mutex broken_mu_;
  std::string broken_;  // why the group is unusable; empty while it works
};

}  // namespace

std::shared_ptr<ProcessGroup> make_cpu_group(std::unique_ptr<Star> star, const ProcessGroupOptions& opts) {
  return std::make_shared<CpuProcessGroup>(std::move(star), opts);
}

}  // namespace mg::dist::detail
