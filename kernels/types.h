// The argument types the dispatch layer (kernels/<family>.cc) and the backends
// (kernels/backend.h, cpu/, cuda/) share: op enums, convolution/pooling geometry, optimizer lists.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mg {

// A (height, width) pair. An integer means the same value for both, like PyTorch's _pair,
// so conv2d(x, w, b, /*stride=*/2) and conv2d(x, w, b, Int2{2, 1}) both read naturally.
struct Int2 {
  int64_t h = 0, w = 0;
  Int2() = default;
  Int2(int64_t v) : h(v), w(v) {}  // NOLINT(runtime/explicit): the int shorthand is the point
  Int2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  bool operator==(const Int2& o) const { return h == o.h && w == o.w; }
};

namespace kernels {

enum class Unary {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Relu,
  Gelu /* erf */,
  GeluTanh,
  Sigmoid,
  Tanh,
  Sign,
  Reciprocal,
  Square,
  Silu,
  Softplus,  // log(1 + exp(x)), x itself above 20 (PyTorch's threshold)
  LogicalNot
};
// The op's name in error messages.
inline const char* op_name(Unary op) {
  static const char* names[] = {"neg",        "exp",    "log",       "sqrt",     "rsqrt",      "abs",
                                "relu",       "gelu",   "gelu_tanh", "sigmoid",  "tanh",       "sign",
                                "reciprocal", "square", "silu",      "softplus", "logical_not"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(Unary::LogicalNot) + 1,
                "a Unary op was added: name it here");
  return names[static_cast<int>(op)];
}
// Unary ops whose result is floating even for integer inputs (promote to f32 like PyTorch).
inline bool unary_float_only(Unary op) {
  switch (op) {
    case Unary::Neg:
    case Unary::Abs:
    case Unary::Relu:
    case Unary::Sign:
    case Unary::Square:
    case Unary::LogicalNot:
      return false;
    default:
      return true;
  }
}
enum class Binary {
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,  // comparisons return b8
  // Backward helpers: grad (a) combined with the forward input or output (b).
  ReluBackward,      // a * (b > 0), b = input
  GeluBackward,      // a * gelu'(b), b = input (erf form)
  GeluTanhBackward,  // a * gelu_tanh'(b)
  SigmoidBackward,   // a * b * (1 - b), b = output
  TanhBackward,      // a * (1 - b^2), b = output
  SiluBackward,      // a * silu'(b), b = input
  SoftplusBackward,  // a * sigmoid(b), b = input (a itself above softplus's threshold)
};
inline const char* op_name(Binary op) {
  static const char* names[] = {"add",
                                "sub",
                                "mul",
                                "div",
                                "pow",
                                "maximum",
                                "minimum",
                                "eq",
                                "ne",
                                "lt",
                                "le",
                                "gt",
                                "ge",
                                "relu_backward",
                                "gelu_backward",
                                "gelu_tanh_backward",
                                "sigmoid_backward",
                                "tanh_backward",
                                "silu_backward",
                                "softplus_backward"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(Binary::SoftplusBackward) + 1,
                "a Binary op was added: name it here");
  return names[static_cast<int>(op)];
}

struct Conv2dArgs {
  Int2 stride{1}, padding{0}, dilation{1};
  int64_t groups = 1;
};

struct Pool2dArgs {
  Int2 kernel{1}, stride{1}, padding{0}, dilation{1};  // stride is already resolved (no "= kernel" default here)
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg_pool2d only
};

// The two 8-bit float formats of Hopper's tensor cores (kernels/fp8_math.h).
enum class Fp8Format : uint8_t {
  E4M3,  // 4 exponent, 3 mantissa bits, largest 448: weights and activations
  E5M2,  // 5 exponent, 2 mantissa bits, largest 57344: gradients (more range, less precision)
};

// How an FP8 GEMM accumulates on the device. Hopper's FP8 tensor cores keep partial sums in an
// accumulator narrower than f32; Promoted adds them into f32 every few steps of K (cuBLASLt's
// default), Fast leaves them there for the whole of K (CUBLASLT_MATMUL_DESC_FAST_ACCUM: faster,
// and less exact as K grows). Auto: Fast for e4m3 x e4m3 (the FP8 recipe's forward), Promoted
// where an operand is e5m2 (its gradients), as torchao's and TransformerEngine's recipes do. The
// CPU reference accumulates in f32 whichever is asked.
enum class Fp8Accum : uint8_t { Auto, Fast, Promoted };

// What kernels::fp8_gemm applies to the GEMM's result.
enum class Fp8Epilogue : uint8_t {
  None,   // the result (+ bias)
  DGelu,  // out = the result * gelu_tanh'(aux): the gradient reaching c_fc's output
};

// Which attention implementation runs; chosen once, by kernels::attention_kernel (attention.h).
enum class AttentionKernel {
  Composed,         // generic kernels (matmul, softmax, ...): every device, dropout, f64
  FlashSimt,        // kernels/cuda/attention.cu: tiled online softmax on CUDA cores, any head dim <= 128
  FlashTensorCore,  // kernels/cuda/attention_tc.cu: mma.sync tiles, f16/bf16 at head dim 64 or 128
  FlashCudnn,       // kernels/cuda/cudnn_attention.cc: cuDNN's fused SDPA engines, f16/bf16, the
                    // tensor-core (or SIMT) kernels where cuDNN declines a configuration
};
constexpr int64_t kFlashAttentionMaxHeadDim = 128;

// Hyper-parameters shared by every tensor of one call (one parameter group).
struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // AdamW: p *= 1 - lr*wd instead of g += wd*p
  bool amsgrad = false;
  bool maximize = false;
};
// Parallel lists, one entry per parameter. steps[i] is the parameter's step count including
// this update (>= 1): bias corrections are per parameter because state is created lazily.
// max_exp_avg_sq is only read when amsgrad is set.
// step_counts replaces steps in a capturable update (below): one i64 [1] counter per
// parameter on its device, incremented by the update itself, so a replayed step counts.
// low_copies (empty, or one entry per parameter): where defined, a contiguous f16/bf16 tensor of
// the f32 parameter's shape that the update also writes: the new parameter rounded to nearest
// (the parameter as it was when a GradScaler skips the update), the cast the next autocast
// region would make. Every defined one of one dtype.
// fp8_casts (empty, or one entry per parameter): where an entry's codes are defined, the FP8
// recipe's cast of the updated 2-D f32 parameter that its layer's next forward would make
// (autograd/fp8_linear.h, fp8_next_weight_cast), written by the update: see Fp8WeightCast.
// 8-bit state (adam8bit_multi_tensor_): exp_avg and exp_avg_sq are u8 codes of the params' shapes
// (kernels/optim_math.h's dynamic codes) and exp_avg_absmax / exp_avg_sq_absmax their f32 block
// scales, [ceil(numel / 2048)] each.
// A weight's cast for an FP8 GEMM with delayed scaling, reserved (kernels/fp8.h, fp8_reserve_delayed): codes
// [R, C] and codes_t [C, R] (u8) of the parameter times the scale that the amax `history` (f32
// [kFp8HistorySlots]) gives at `slot`, whose amax the cast records; `scale` and `scale_inv` (f32
// [1]) receive the scale used and its reciprocal. The same codes, scale and history as
// fp8_cast_delayed casting the updated parameter at that slot.
struct Fp8WeightCast {
  Tensor codes, codes_t, history, scale, scale_inv;
  int slot = 0;
  Fp8Format format = Fp8Format::E4M3;
  int margin = 0;
};
struct AdamTensors {
  std::vector<Tensor> params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq;
  std::vector<Tensor> exp_avg_absmax, exp_avg_sq_absmax;
  std::vector<int64_t> steps;
  std::vector<Tensor> step_counts;
  std::vector<Tensor> low_copies;
  std::vector<Fp8WeightCast> fp8_casts;
};
struct SGDHyper {
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false, maximize = false;
};
// momentum_buffers is empty when momentum == 0; first_step[i] != 0 makes buffer i a copy of
// the (decayed) gradient, PyTorch's rule for a fresh buffer, instead of mixing it in.
struct SGDTensors {
  std::vector<Tensor> params, grads, momentum_buffers;
  std::vector<uint8_t> first_step;
};

// A capturable update (CUDA graphs, optim/optimizer.h) reads what changes between replays from
// device memory when it runs instead of taking it as a launch argument. Undefined members fall
// back to the host values of the Hyper struct.
struct DeviceScalars {
  Tensor lr;         // f64 [1] on the parameters' device: replaces Hyper::lr
  Tensor found_inf;  // f32 [1]: nonzero skips the whole update, step counts included (GradScaler)
};

// An inverted dropout's draw (kernels::bias_dropout_add): Philox block `base + i / 4` of `seed`,
// word i % 4, gives element i (row-major) its number r, and the element is kept when
// (r >> 8) < keep_below, i.e. when (r >> 8) / 2^24 < 1 - p: the very test bernoulli_(1 - p)
// makes, so the mask is the one dropout's fill would draw at this point of the stream. A kept
// element is scaled by `scale` = 1 / (1 - p). device_offset: added to base on the device (a
// CUDA graph's replay counter, core/random.h), else null.
struct DropoutDraw {
  uint64_t seed = 0;
  uint64_t base = 0;
  const int64_t* device_offset = nullptr;
  uint32_t keep_below = 0;
  double scale = 1.0;
};

}  // namespace kernels
}  // namespace mg
