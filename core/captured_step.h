// CapturedStep: one training step (forward, backward, optimizer) captured into a CUDA graph
// and replayed with one launch, removing the per-op host cost of eager execution
// (docs/cuda_graphs.md). The recipe of torch.cuda.graphs' whole-network capture:
//   1. the step reads its batch from static device tensors the caller copies each batch into;
//   2. warm-up calls run the step eagerly on a side stream (lazily created state such as
//      optimizer buffers and library handles exists before capture);
//   3. one call is captured on that side stream, its allocations in the graph's private pool;
//   4. replay() runs the captured step on the current stream.
// The warm-up calls are real steps: they train on whatever the static inputs hold.
#pragma once

#include <functional>

#include "core/device_runtime.h"

namespace mg {

class CapturedStep {
 public:
  // Runs `step` `warmup` times eagerly, then captures one call (which does not run). The
  // capture shares `share_pool_with`'s memory pool when given (e.g. an eval step beside a
  // training step). Errors from the capture (mg::DeviceError naming what a graph cannot hold)
  // propagate; the object is then unusable.
  explicit CapturedStep(std::function<void()> step, int warmup = 3, const CapturedStep* share_pool_with = nullptr);
  // Runs the captured step once more on the current stream.
  void replay() { graph_.replay(); }
  const cuda::Graph& graph() const { return graph_; }

 private:
  cuda::Graph graph_;
};

}  // namespace mg
