// DeferredIndexChecks: index bounds checks read once, at the end of a scope (kernels/index.h's
// ops check their indices; the CUDA backend defers the host read inside a scope).
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

namespace mg::kernels {

// Within a scope of the calling thread, the CUDA bounds checks of gather, scatter, index_select
// and index_add (an embedding's lookup) and the label check of cross_entropy do not wait for their
// result. Each check's finding is copied to pinned host memory behind an event
// (kernels/cuda/deferred_read.h). The op runs on: its kernels skip an index out of range,
// touching nothing outside the tensor (a bad label's row gets a NaN loss). finish() waits for
// those events and raises the first failed check's mg::IndexError, the message the op would have
// raised.
//
// Where it pays: a check that must wait drains the device queue. The host then has nothing
// queued, and the device idles while the host works its way ahead again. GPT::forward_loss
// looks up the token ids at the step's start, where that wait held the host until the previous
// step's backward and optimizer had run. It finishes the scope after the loss: by then the wait is
// for the loss's last label check, with that chunk's gradient kernels still queued behind it,
// where each chunk's own read had drained the queue.
//
// Scopes nest (each finishes its own checks). A scope left without finish() (an exception
// unwinding) waits for its checks and raises nothing. The CPU checks at once, scope or not, as
// do captures into a CUDA graph (no check at all there: docs/cuda_graphs.md).
class DeferredIndexChecks {
 public:
  DeferredIndexChecks() : outer_(innermost()) { innermost() = this; }
  ~DeferredIndexChecks() {
    innermost() = outer_;
    for (auto& settle : pending_) {
      try {
        settle();
      } catch (...) {  // unwinding, or finish() not called: what it holds is freed, nothing raised
      }
    }
  }
  DeferredIndexChecks(const DeferredIndexChecks&) = delete;
  DeferredIndexChecks& operator=(const DeferredIndexChecks&) = delete;
  // Waits for the scope's checks; raises the first bad one's mg::IndexError.
  void finish() {
    std::vector<std::function<void()>> todo = std::move(pending_);
    pending_.clear();
    std::exception_ptr first;
    for (auto& settle : todo) {
      try {
        settle();  // every check is settled (its slot freed) even after one has failed
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  // For backends: the calling thread's innermost scope (null when none), and a check it holds
  // until finish(): settle() waits for the check, frees what it holds, and throws its error.
  static DeferredIndexChecks* current() { return innermost(); }
  void defer(std::function<void()> settle) { pending_.push_back(std::move(settle)); }
  size_t pending() const { return pending_.size(); }

 private:
  static DeferredIndexChecks*& innermost() {
    thread_local DeferredIndexChecks* scope = nullptr;
    return scope;
  }
  DeferredIndexChecks* outer_;
  std::vector<std::function<void()>> pending_;
};

}  // namespace mg::kernels
