// Checks, strided head views and dispatch for kernels/attention.h, and the one choice of
// attention kernel (attention_kernel); the kernels are in cuda/attention.cu and cuda/attention_tc.cu.
#include "kernels/attention.h"

#include <cmath>
#include <initializer_list>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/enum_name.h"
#include "core/env.h"
#include "kernels/backend.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {

namespace {

struct FlashShape {
  Shape lead;  // the leading dims, flattened to bh
  int64_t bh = 1, L = 0, S = 0, E = 0;
};

// Fails with an error naming `op` and the values, or (op == nullptr) just returns false.
#define MG_FLASH_REQUIRE(cond, ErrorType, ...)    \
  do {                                            \
    if (!(cond)) {                                \
      if (!op) return false;                      \
      MG_THROW(ErrorType, op, ": ", __VA_ARGS__); \
    }                                             \
  } while (0)

bool check_flash(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, FlashShape* shape) {
  MG_FLASH_REQUIRE(q.defined() && k.defined() && v.defined(), ValueError, "got an undefined tensor");
  MG_FLASH_REQUIRE(q.device() == k.device() && q.device() == v.device(), DeviceError, "query, key and value are on ",
                   q.device(), ", ", k.device(), " and ", v.device());
  MG_FLASH_REQUIRE(q.is_cuda(), DeviceError, "runs on CUDA only, got tensors on ", q.device(),
                   " (the CPU path is sdpa_composed)");
  MG_FLASH_REQUIRE(has_backend(q.device()), DeviceError, "this build has no CUDA attention kernels");
  MG_FLASH_REQUIRE(q.dtype() == k.dtype() && q.dtype() == v.dtype(), DTypeError,
                   "query, key and value must share one dtype, got ", q.dtype(), ", ", k.dtype(), " and ", v.dtype());
  MG_FLASH_REQUIRE(q.dtype() == DType::f32 || q.dtype() == DType::f16 || q.dtype() == DType::bf16, DTypeError,
                   "expected f32, f16 or bf16, got ", q.dtype());
  MG_FLASH_REQUIRE(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), ShapeError,
                   "query, key and value must have one rank >= 2 ([..., L, E], [..., S, E], [..., S, E]), got ",
                   shape_str(q.sizes()), ", ", shape_str(k.sizes()), " and ", shape_str(v.sizes()));
  const int64_t E = q.size(-1);
  MG_FLASH_REQUIRE(k.size(-1) == E && v.size(-1) == E, ShapeError, "query, key and value must share the head dim, got ",
                   shape_str(q.sizes()), ", ", shape_str(k.sizes()), " and ", shape_str(v.sizes()));
  MG_FLASH_REQUIRE(E >= 1 && E <= kFlashAttentionMaxHeadDim, ShapeError, "head dim must be in [1, ",
                   kFlashAttentionMaxHeadDim, "], got ", E);
  MG_FLASH_REQUIRE(k.size(-2) == v.size(-2), ShapeError, "key has ", k.size(-2), " positions but value has ",
                   v.size(-2));
  MG_FLASH_REQUIRE(k.size(-2) >= 1, ShapeError, "needs at least one key position, got key ", shape_str(k.sizes()));
  FlashShape s;
  for (int64_t d = 0; d < q.dim() - 2; ++d) {
    MG_FLASH_REQUIRE(q.size(d) == k.size(d) && q.size(d) == v.size(d), ShapeError,
                     "query, key and value must have the same batch/head dims, got ", shape_str(q.sizes()), ", ",
                     shape_str(k.sizes()), " and ", shape_str(v.sizes()), " (dim ", d, ")");
    s.lead.push_back(q.size(d));
    s.bh *= q.size(d);
  }
  s.L = q.size(-2), s.S = k.size(-2), s.E = E;
  if (shape) *shape = s;
  return true;
}

#undef MG_FLASH_REQUIRE

double flash_scale(const char* op, const FlashShape& s, std::optional<double> scale) {
  MG_CHECK(!scale || std::isfinite(*scale), ValueError, op, ": scale must be finite, got ", scale.value_or(0.0));
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(s.E));
}

// t [..., n, e] as a [B, H, n, e] view of its own storage, when its head dim is unit-stride and
// its leading dims fold into two (batch, head) strides; undefined otherwise. This is what lets
// the kernels read q/k/v narrowed and transposed out of a packed [B, T, 3C] projection.
Tensor heads_view(const Tensor& t, int64_t n, int64_t e) {
  if (t.dim() < 2 || (e > 1 && t.stride(-1) != 1)) return Tensor();
  std::vector<std::pair<int64_t, int64_t>> lead;  // (size, stride), outermost first
  for (int64_t d = 0; d < t.dim() - 2; ++d) {
    if (t.size(d) == 1) continue;
    if (!lead.empty() && lead.back().second == t.stride(d) * t.size(d)) {
      lead.back() = {lead.back().first * t.size(d), t.stride(d)};
    } else {
      lead.emplace_back(t.size(d), t.stride(d));
    }
  }
  if (lead.size() > 2) return Tensor();
  while (lead.size() < 2) lead.insert(lead.begin(), {1, 0});
  return raw::as_strided(t, {lead[0].first, lead[1].first, n, e},
                         {lead[0].second, lead[1].second, n > 1 ? t.stride(-2) : e, 1}, t.offset());
}

// The tensor-core kernels move rows 16 bytes (8 half elements) at a time: the first element
// and every row start must be 16-byte aligned (kernels/cuda/attention_tc.h, tc_layout_aligned).
bool tc_aligned(const Tensor& h) {
  if (reinterpret_cast<uintptr_t>(h.raw_data()) % 16 != 0) return false;
  for (int64_t d = 0; d < 3; ++d)
    if (h.stride(d) % 8 != 0) return false;
  return true;
}

// The switches are read on every call, so a test or a benchmark can flip them at run time
// (getenv costs nothing next to a kernel launch).
std::string_view forced_kernel() {
  return env::choice("MG_ATTENTION_KERNEL", {"auto", "composed", "simt", "tc", "cudnn"});
}

// An input as the kernels' [B, H, n, e] layout of dtype dt: the tensor itself when its strides
// allow, else (another dtype, a non-unit head stride, misaligned for the tensor cores) a
// contiguous copy viewed as [1, bh, n, e].
Tensor heads_in(const Tensor& t, DType dt, int64_t bh, int64_t n, int64_t e, bool tc) {
  if (t.dtype() == dt)
    if (Tensor h = heads_view(t, n, e); h.defined() && (!tc || tc_aligned(h))) return h;
  return raw::view(as_rows(t, dt, {bh, n, e}), {1, bh, n, e});
}

// An output the kernels write: the caller's tensor viewed as [B, H, n, e] when its strides allow,
// else a contiguous scratch that finish() copies into it.
struct HeadsOut {
  Tensor dst, heads;
  HeadsOut(const Tensor& t, int64_t bh, int64_t n, int64_t e, bool tc) : dst(t), heads(heads_view(t, n, e)) {
    if (!heads.defined() || (tc && !tc_aligned(heads))) heads = empty({1, bh, n, e}, {t.dtype(), t.device()});
  }
  void finish() const {
    if (heads.storage() != dst.storage()) raw::copy_(dst, raw::view(heads, dst.sizes()));
  }
};

void check_out(const char* op, const Tensor& t, const char* what, const Shape& shape, const Tensor& q) {
  MG_CHECK(t.defined() && t.sizes() == shape, ShapeError, op, ": ", what, " must have shape ", shape_str(shape),
           ", got ", t.defined() ? shape_str(t.sizes()) : std::string("undefined"));
  MG_CHECK(t.dtype() == q.dtype(), DTypeError, op, ": ", what, " must be ", q.dtype(), " like the query, got ",
           t.dtype());
  check_same_device(op, q, t, what);
}

Shape with_tail(Shape lead, std::initializer_list<int64_t> tail) {
  lead.insert(lead.end(), tail);
  return lead;
}

}  // namespace

bool flash_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  return check_flash(nullptr, q, k, v, nullptr);
}

Tensor flash_attention_forward_out(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, bool causal,
                                   std::optional<double> scale) {
  const char* op = "flash_attention_forward";
  FlashShape s;
  check_flash(op, q, k, v, &s);
  const double sc = flash_scale(op, s, scale);
  check_out(op, out, "out", with_tail(s.lead, {s.L, s.E}), q);
  Tensor lse = empty({s.bh, s.L}, {DType::f32, q.device()});
  const DType dt = q.dtype();
  const AttentionKernel kernel = flash_attention_kernel(dt, s.E);
  const bool tc = kernel != AttentionKernel::FlashSimt;
  const HeadsOut o(out, s.bh, s.L, s.E, tc);
  backend(q.device(), op)
      .flash_attention_forward(kernel, heads_in(q, dt, s.bh, s.L, s.E, tc), heads_in(k, dt, s.bh, s.S, s.E, tc),
                               heads_in(v, dt, s.bh, s.S, s.E, tc), causal, sc, o.heads, lse);
  o.finish();
  return raw::view(lse, with_tail(s.lead, {s.L}));
}

std::tuple<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                   std::optional<double> scale) {
  FlashShape s;
  check_flash("flash_attention_forward", q, k, v, &s);
  Tensor out = empty(with_tail(s.lead, {s.L, s.E}), {q.dtype(), q.device()});
  Tensor lse = flash_attention_forward_out(q, k, v, out, causal, scale);
  return {out, lse};
}

void flash_attention_backward_out(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& logsumexp, bool causal, std::optional<double> scale,
                                  const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) {
  const char* op = "flash_attention_backward";
  FlashShape s;
  check_flash(op, q, k, v, &s);
  const double sc = flash_scale(op, s, scale);
  const Shape out_shape = with_tail(s.lead, {s.L, s.E}), kv_shape = with_tail(s.lead, {s.S, s.E}),
              lse_shape = with_tail(s.lead, {s.L});
  MG_CHECK(grad_out.defined() && grad_out.sizes() == out_shape, ShapeError, op, ": grad_out must have shape ",
           shape_str(out_shape), ", got ", grad_out.defined() ? shape_str(grad_out.sizes()) : std::string("undefined"));
  check_same_device(op, q, grad_out, "grad_out");
  MG_CHECK(is_floating(grad_out.dtype()), DTypeError, op, ": grad_out must be floating, got ", grad_out.dtype());
  check_out(op, out, "out", out_shape, q);
  MG_CHECK(logsumexp.defined() && logsumexp.sizes() == lse_shape, ShapeError, op, ": logsumexp must have shape ",
           shape_str(lse_shape), ", got ",
           logsumexp.defined() ? shape_str(logsumexp.sizes()) : std::string("undefined"));
  MG_CHECK(logsumexp.dtype() == DType::f32, DTypeError, op, ": logsumexp must be f32, got ", logsumexp.dtype());
  check_same_device(op, q, logsumexp, "logsumexp");
  check_out(op, grad_q, "grad_q", out_shape, q);
  check_out(op, grad_k, "grad_k", kv_shape, q);
  check_out(op, grad_v, "grad_v", kv_shape, q);
  const DType dt = q.dtype();
  const AttentionKernel kernel = flash_attention_kernel(dt, s.E);
  const bool tc = kernel != AttentionKernel::FlashSimt;
  const HeadsOut gq(grad_q, s.bh, s.L, s.E, tc), gk(grad_k, s.bh, s.S, s.E, tc), gv(grad_v, s.bh, s.S, s.E, tc);
  backend(q.device(), op)
      .flash_attention_backward(kernel, heads_in(grad_out, dt, s.bh, s.L, s.E, tc), heads_in(q, dt, s.bh, s.L, s.E, tc),
                                heads_in(k, dt, s.bh, s.S, s.E, tc), heads_in(v, dt, s.bh, s.S, s.E, tc),
                                heads_in(out, dt, s.bh, s.L, s.E, tc), as_rows(logsumexp, DType::f32, {s.bh, s.L}),
                                causal, sc, gq.heads, gk.heads, gv.heads, tc && flash_backward_one_pass());
  gq.finish(), gk.finish(), gv.finish();
}

std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                            const Tensor& v, const Tensor& out, const Tensor& logsumexp,
                                                            bool causal, std::optional<double> scale) {
  FlashShape s;
  check_flash("flash_attention_backward", q, k, v, &s);
  const TensorOptions o{q.dtype(), q.device()};
  Tensor gq = empty(with_tail(s.lead, {s.L, s.E}), o), gk = empty(with_tail(s.lead, {s.S, s.E}), o),
         gv = empty(with_tail(s.lead, {s.S, s.E}), o);
  flash_attention_backward_out(grad_out, q, k, v, out, logsumexp, causal, scale, gq, gk, gv);
  return {gq, gk, gv};
}

// The tensor-core kernels (cuda/attention_tc.cu) cover f16, bf16 and f32 at head dims 64 and 128;
// f32 in TF32 when allow_tf32() (as the f32 matmuls: off by default), otherwise as TF32 pairs
// (three products each), as accurate as the SIMT kernels' f32 FMAs to within a few f32 ulps.
//
// f16/bf16 at head dims that are multiples of 8 go to cuDNN's fused attention first
// (FlashCudnn; measured on the H200 in docs/attention.md), which hands a configuration it
// declines (lengths not multiples of 64, no engine) to the tensor-core kernels. Not under
// set_deterministic(true): cuDNN's backward sums dq by atomics, our two-pass backward does not.
AttentionKernel flash_attention_kernel(DType dt, int64_t head_dim) {
  const std::string_view forced = forced_kernel();
  const bool half = dt == DType::f16 || dt == DType::bf16;
  if (half && head_dim % 8 == 0 && !deterministic() && (forced == "auto" || forced == "cudnn"))
    return AttentionKernel::FlashCudnn;
  const bool tc_type = half || dt == DType::f32;
  const bool tc = tc_type && (head_dim == 64 || head_dim == 128);
  return tc && forced != "simt" ? AttentionKernel::FlashTensorCore : AttentionKernel::FlashSimt;
}

AttentionKernel attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v, bool dropout) {
  if (forced_kernel() == "composed" || dropout || !flash_attention_supported(q, k, v)) return AttentionKernel::Composed;
  return flash_attention_kernel(q.dtype(), q.size(-1));
}

bool flash_backward_one_pass() {
  const std::string_view want = env::choice("MG_ATTENTION_BWD", {"auto", "onepass", "twopass"});
  return !deterministic() && want != "twopass";
}

const char* attention_kernel_name(AttentionKernel kernel) {
  return enum_name(kernel, {"composed", "simt", "tc", "cudnn"});
}

}  // namespace mg::kernels
