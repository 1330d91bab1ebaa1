// The backward engine: runs the recorded graph from some roots in dependency order,
// accumulates into leaves' .grad, and frees each node's saved tensors once it has run.
#pragma once

#include <vector>

#include "autograd/node.h"

namespace mg::autograd {

// Backpropagates `grads` (undefined = ones for scalar roots) from `roots`.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);

// Returns d(outputs)/d(inputs) without touching .grad (like torch.autograd.grad).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

}  // namespace mg::autograd
