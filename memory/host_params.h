// Parameters in host memory, read on the device through their casts: ZeRO-Offload's layout on
// one GPU. A host parameter's f32 master weight sits in pinned host memory, and so do its
// gradient and the optimizer's state (an optimizer over it steps on the CPU: kernels/cpu/optim.cc
// runs the same AdamW rule as the CUDA kernel, over all cores). The device holds only the
// low-precision cast the forward reads, given to each autocast region before it starts
// (provide_casts). The ops find it there (autograd/op_policy.h: a host parameter read by an op
// on the device comes to it; autocast::lower_to), and the gradient returns to the host through
// the cast's edge (the engine moves a gradient to its input's device).
//
// What it saves: a host parameter costs the device 2 bytes (its bf16 cast) instead of 18 (f32
// master, f32 gradient, two f32 moments, bf16 cast); what it costs: the cast's copy to the device
// each step, the gradient's copy back, and the update at the host's memory bandwidth.
// Which parameters qualify: ones the model reads only through ops with an autocast rule under a
// CUDA autocast region (Linear weights and biases: gpt_linear_params); an embedding table or a
// norm's weight stays on the device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/models/gpt.h"

namespace mg::memory {

class HostParams {
 public:
  // Moves every tensor of `params` (f32 leaves that require grad, contiguous, on the CUDA device
  // `device`, without a gradient) to pinned host memory in place: the module and optimizers
  // holding them see host tensors from now on. A ValueError names the first that does not
  // qualify; a failed pinned allocation is the CUDA error it raised.
  HostParams(std::vector<Tensor> params, Device device, DType cast_dtype = DType::bf16);

  // Gives the calling thread's next autocast region the casts of every parameter as it now is,
  // on the device (one cast on the host and one copy each). Call after each optimizer step and
  // before the first forward.
  void provide_casts() const;

  const std::vector<Tensor>& params() const { return params_; }
  // Bytes of f32 masters held in host memory.
  int64_t host_bytes() const;

 private:
  std::vector<Tensor> params_;
  Device device_;
  DType cast_dtype_;
};

// Every Linear weight and bias of the GPT's blocks: the parameters the blocks read only through
// autocast's casts (the embeddings, the norms and the tied head stay on the device).
std::vector<Tensor> gpt_linear_params(nn::GPT& model);

}  // namespace mg::memory
