// The backward engine: runs the recorded graph from some roots in dependency order,
// accumulates into leaves' .grad, and frees each node's saved tensors once it has run.
#pragma once

#include <functional>
#include <vector>

#include "autograd/node.h"

namespace mg::autograd {

// Backpropagates `grads` (undefined = ones for scalar roots) from `roots`.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);

// Returns d(outputs)/d(inputs) without touching .grad (like torch.autograd.grad).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

// Runs `fn` when the backward now running on this thread has finished: every node has run and
// every leaf has its gradient (PyTorch's queue_callback). A backward started inside another (a
// checkpoint region's replay) hands its callbacks to the outermost one, so "finished" means the
// whole backward the user called. Callbacks run in the order queued, after the graph, under
// no_grad; one that throws ends the call with its error (the rest are dropped). Outside a
// backward it is an AutogradError.
void queue_callback(std::function<void()> fn);
// Whether this thread is running a backward (a node, a hook or a sink calling).
bool in_backward();

}  // namespace mg::autograd
