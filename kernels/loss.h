// Raw losses over class-index targets: the NLL gather, and the fused cross-entropy whose
// forward keeps one logsumexp per row and whose backward writes softmax - onehot in one pass.
#pragma once

#include <tuple>

#include "core/tensor.h"

namespace mg::kernels {

// ---- losses' fused pieces ----
// -log_probs[i, target[i]] per row, skipping ignore_index (0 loss); targets i64 [N].
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100);

// logits [M, C] (any floating dtype; f16/bf16 are read as is and computed in f32), target
// integer [M]. Per row i with t = target[i] and e = label_smoothing:
//   lse[i]  = log(sum_j exp(logits[i, j]))
//   loss[i] = lse[i] - (1 - e) * logits[i, t] - e / C * sum_j logits[i, j]   (0 where t == ignore_index)
// Both [M], f64 for f64 logits, else f32. A target outside [0, C) (other than ignore_index)
// raises mg::IndexError.
std::tuple<Tensor, Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                 double label_smoothing);

// grad[i, j] = coef[i] * (exp(logits[i, j] - lse[i]) - (1 - e) [j == t_i] - e / C), 0 for
// ignored rows; coef [M] (or one element, broadcast). Same dtype and shape as logits. With
// `out` (contiguous, logits' dtype and shape) the gradient is written there instead: `out` may
// be logits itself, since every element is read before it is written, by the same thread.
Tensor cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              int64_t ignore_index, double label_smoothing, const Tensor& out = Tensor());

// cross_entropy_forward, then cross_entropy_backward(coef, ..., out) in one call, for a loss whose
// gradient is known in the forward pass up to coef (linear_cross_entropy's chunks): returns
// {loss, lse}, and the gradient is in `out` (required; it may be logits itself). On CUDA a row
// that fits in shared memory (GPT-2's 50304 classes in any dtype) is read from memory once,
// where the two calls read it twice; the results are the two calls' to the bit.
std::tuple<Tensor, Tensor> cross_entropy_forward_backward(const Tensor& logits, const Tensor& target,
                                                          int64_t ignore_index, double label_smoothing,
                                                          const Tensor& coef, const Tensor& out);

}  // namespace mg::kernels
