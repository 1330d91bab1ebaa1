// The FP8 recipe's linear layers (core/autocast.h, Fp8Autocast): mg::linear and mg::gelu_mlp run
// their GEMMs here when fp8_linear_applies(). Included by autograd/linalg_ops.cc, and by the
// optimizers that write the recipe's weight casts (fp8_next_weight_cast).
//
// The recipe, per GEMM (kernels/fp8.h):
//   forward    x and w cast to e4m3 with per-tensor scaling, current (each tensor's own amax,
//              on the device) or delayed (the amax of the operand's recent casts: a history per
//              layer operand, kept by the layer's f32 weight, kernels/fp8.h Fp8History), the
//              product accumulated in f32 and written in the region's dtype
//              with the bias in the GEMM's epilogue; the MLP's hidden activation gelu(pre) is
//              cast from c_fc's output pre, the GELU taken in the cast's passes (kernels::Fp8Of);
//   backward   the output gradient cast to e5m2 (more range: gradients span more binades);
//              dx = g @ w and dw = g^T @ x read the e4m3 codes of x and w the forward made,
//              transposed (Hopper's FP8 GEMMs read both operands along the reduced dimension),
//              and dw comes out in f32 where w is autocast's cast of an f32 weight; the bias
//              gradient is the f32 column sums of g, taken in the pass that casts g.
// What it keeps for backward: x's and w's transposed codes, 1 byte an element (the bf16 path
// keeps x itself, 2 bytes), and the MLP's GELU argument in the region's dtype. An f32 weight is
// cast to FP8 from f32 (fp8_keeps_f32_weight): no bf16 copy of it is made or kept.
// Delayed scaling applies where grad is on and in checkpoint regions, whose forward (grad off)
// keeps each cast's scale for the replay to cast with (autograd/node.h RegionScales), so the
// replay's codes are the forward's; evaluations under no_grad and CUDA-graph captures cast with
// current scaling. A weight used by two layers shares one history of each operand, so each
// layer's scale covers both.
// Attention, the head and the norms stay in the region's dtype. The f32 master weights and the
// optimizer's rule are untouched: the recipe changes only what the GEMMs read. An optimizer may
// write a weight's next cast in its update (fp8_next_weight_cast), as it writes autocast's casts.

#pragma once

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"
#include "kernels/types.h"

namespace mg {
class Normed;
}  // namespace mg

namespace mg::autograd {

// Whether the recipe takes a linear of x [..., K] with weight w [N, K]: Fp8Autocast on, autocast
// enabled for x's device, x already in its f16/bf16 dtype and w in that dtype or an f32 weight on
// x's device, K and N at least the recipe's min_features, and K, N and the rows multiples of 16
// (the FP8 GEMMs' granularity; other shapes keep the region's dtype).
bool fp8_linear_applies(const Tensor& x, const Tensor& w);
// Whether autocast leaves the f32 weight w of a linear of x as it is because the recipe will take
// the linear (the rules above, x in any floating dtype before autocast lowers it): the FP8 cast
// reads the f32 weight itself, so the region keeps no f16/bf16 copy of it (2 bytes a parameter),
// and the weight's gradient comes straight from the FP8 GEMM in f32.
bool fp8_keeps_f32_weight(const Tensor& x, const Tensor& w);

// The casts delayed scaling has made of the layer with weight `weight` (its f32 weight, or the
// cast of it): its input's, weight's and output gradient's, on the calling thread; zeros where
// it has none (tests, and a check that the histories carry from step to step).
std::array<int64_t, 3> fp8_history_casts(const Tensor& weight);

// Delayed scaling's histories of the layers whose f32 weights are `weights` (named as the model
// names its parameters: model.named_parameters()), as a checkpoint component, so that a resumed
// run casts with the scales an uninterrupted one would:
//   serialize::TrainingCheckpoint ckpt;  ckpt.add("fp8", fp8_state);   // Fp8HistoryState fp8_state(named)
// Saved: "<name>.x", "<name>.w", "<name>.g" (the input's, weight's and output gradient's amax
// slots, f32 [kFp8HistoryLen + 2]) and meta[name] {"x": casts, ...} for each history a layer has.
// Loading checks every entry first (a ValueError naming the entry: an unknown name or operand, a
// wrong shape or dtype, a count missing or below 1), then replaces the named weights' histories
// on the calling thread (a weight with none saved starts again), each on its weight's device (a
// cast on another device brings its history there).
class Fp8HistoryState {
 public:
  explicit Fp8HistoryState(std::vector<std::pair<std::string, Tensor>> weights);
  StateDict state_dict() const;
  StagedLoad stage_state_dict(const StateDict& sd);
  void load_state_dict(const StateDict& sd) { stage_state_dict(sd)(); }

 private:
  std::vector<std::pair<std::string, Tensor>> weights_;
};

// The weight casts an optimizer's update writes (AdamOptions::write_autocast_casts), the FP8
// counterpart of autocast's low copies: the update reads the f32 weight anyway, so writing its
// codes there spares the next forward's cast a read of 4 bytes a parameter and a launch.
// fp8_next_weight_cast(w): for an f32 2-D weight whose layer has cast it under delayed scaling
// (on the calling thread), the cast its next forward would make, reserved: the codes and scales
// allocated on w's device and the history's next slot, the one that forward's cast would take
// (kernels::Fp8WeightCast). None for a weight without such a history, or while w's device is
// capturing a CUDA graph.
std::optional<kernels::Fp8WeightCast> fp8_next_weight_cast(const Tensor& w);
// Hands the cast an update wrote (fp8_next_weight_cast's) to w's layer: its next forward under
// delayed scaling uses it instead of casting w, the same codes and scale and the same history
// after, where w is unchanged since (its version) and the history has cast nothing since. A
// forward that cannot use it casts as before (the slot's amax cleared first) and drops it; a
// history loaded from a checkpoint drops it too.
void provide_fp8_weight_cast(const Tensor& w, const kernels::Fp8WeightCast& cast);
// Whether w's layer holds a cast an update wrote that its next forward has not taken yet (tests).
bool fp8_weight_cast_provided(const Tensor& w);

// linear and gelu_mlp under the recipe; gw_dtype and the like are the weights' gradient dtypes.
Tensor fp8_linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType gw_dtype);
Tensor fp8_gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj,
                    DType dt_fc, DType dt_proj);

// The same reading a layer norm left pending (mg::Normed, autograd/residual.h): one node runs the
// stream's add, the norm and the cast of its output for the first GEMM in one pass
// (kernels::add_layer_norm_fp8_delayed), so the norm's output is written only as e4m3 codes (the
// bf16 rows and the cast's read of them go), then the layer as fp8_linear and fp8_gelu_mlp run it;
// its backward is the layer's, then the norm's (add_layer_norm's). The same values, codes and
// histories as the norm then the layer, bit for bit. (A norm two layers read runs once in the
// first's node and again for the second, Normed::value(): the stream's gradient then sums two norm
// backwards where the plain ops sum the layers' gradients first, equal up to that rounding.)
// fp8_norm_applies: the norm still pending, the recipe on with delayed scaling, grad on (not an
// evaluation, a checkpoint region or a CUDA graph capture, which cast as they do elsewhere), an f32
// stream, f32 norm parameters and w an f32 weight the recipe casts itself (fp8_keeps_f32_weight)
// on the stream's device, a norm over the last dim, and no policy rebuilding layer_norm;
// set_fp8_norm_casts(false) turns it off on the calling thread (the A/B of bench_models
// --no-norm-casts, and the tests).
bool fp8_norm_applies(const Normed& x, const Tensor& w);
Tensor fp8_norm_linear(const Normed& x, const Tensor& w, const Tensor& bias, DType gw_dtype);
Tensor fp8_norm_gelu_mlp(const Normed& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                         const Tensor& b_proj, DType dt_fc, DType dt_proj);
void set_fp8_norm_casts(bool on);

}  // namespace mg::autograd
