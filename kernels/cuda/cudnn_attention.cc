// cuDNN flash attention through the graph ("backend") API: cudnn_attention.h says what and why.
//
// The graphs are the ones cuDNN's SDPA engines recognise (the cuDNN frontend builds the same):
//   forward  S = Q K^T * scale, causal: S = (row >= col) ? S : -inf; M = rowmax S,
//            E = exp(S - M), Z = rowsum E, stats = M + log Z (our lse), O = (E / Z) V.
//   backward sum = rowsum(dO * O); S as above less the stats (the probabilities recomputed,
//            P = exp(S - stats)); dV = P^T dO; dS = P (dO V^T - sum) * scale; dK = dS^T Q;
//            dQ = dS K summed in an f32 buffer and rounded to dQ's type.
// Intermediate tensors are "virtual" (they never reach memory, the engine fuses the graph);
// the row sums and the f32 dQ buffer are real, allocated here from memgrad's allocator with
// the engine's workspace.
#include "kernels/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/device_runtime.h"
#include "kernels/cuda/cudnn.h"

namespace mg::kernels::cuda {
namespace {

// A cuDNN graph-API call failed while a configuration was being built: cuDNN has no engine for
// it (or rejects the graph), so the caller falls back to its own kernels.
struct Unsupported {
  std::string what;
};

void build_check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw Unsupported{std::string(what) + ": " + cudnnGetErrorString(st) + " (" + cudnn_last_error() + ")"};
}

std::string& last_decline() {
  thread_local std::string why;
  return why;
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    build_check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, int64_t n = 1) {
    build_check(cudnnBackendSetAttribute(d_, name, type, n, values), "cudnnBackendSetAttribute");
    return *this;
  }
  Desc& desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t other) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &other);
  }
  Desc& finalize(const char* what) {
    build_check(cudnnBackendFinalize(d_), what);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::vector<int64_t>;

// The tensors of a graph that the caller binds to memory, by unique id.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kRowSum, kDQAcc };

// A graph under construction: it owns every descriptor (operations keep pointers to them).
class Graph {
 public:
  explicit Graph(cudnnDataType_t io) : io_(io) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                  bool is_virtual = false, bool by_value = false) {
    Desc& t = own(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t n = static_cast<int64_t>(dims.size()), align = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), n)
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), n)
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    return t.finalize("tensor").get();
  }
  // An intermediate the engine keeps on chip ("virtual"): [B, H, rows, cols], packed unless
  // strides are given.
  cudnnBackendDescriptor_t inner(cudnnDataType_t type, const Dims& d, Dims strides = {}) {
    if (strides.empty()) strides = {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
    return tensor(next_uid_++, type, d, strides, true);
  }
  // A scalar passed by value at execution (a host float).
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b[, t]]); axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis = -1,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT) {
    Desc& pw = own(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &math);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw.finalize("pointwise");
    Desc& op = own(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get()).desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) op.desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    ops_.push_back(op.finalize("pointwise operation").get());
  }
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    Desc& mm = own(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32).finalize("matmul");
    Desc& op = own(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    ops_.push_back(op.finalize("matmul operation").get());
  }
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    Desc& red = own(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32)
        .finalize("reduction");
    Desc& op = own(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
    ops_.push_back(op.finalize("reduction operation").get());
  }
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc& op = own(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    ops_.push_back(op.finalize("reshape operation").get());
  }

  // S masked above the diagonal (top-left: key j is seen by query i when j <= i), as cuDNN's
  // engines expect the mask: two index generators, a comparison and a select.
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, const Dims& d, cudnnBackendDescriptor_t neg_inf) {
    cudnnBackendDescriptor_t row = inner(CUDNN_DATA_INT32, d), col = inner(CUDNN_DATA_INT32, d);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, 3);
    cudnnBackendDescriptor_t keep = inner(CUDNN_DATA_BOOLEAN, d), masked = inner(CUDNN_DATA_FLOAT, d);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, -1, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf, keep, masked);
    return masked;
  }

  cudnnDataType_t io() const { return io_; }

  // The operation graph, ranked engine configurations, and the first that builds a plan.
  // Fills *workspace with its workspace bytes.
  std::unique_ptr<Desc> plan(cudnnHandle_t h, int64_t* workspace) {
    Desc& graph = own(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph
        .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
             static_cast<int64_t>(ops_.size()))
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h)
        .finalize("operation graph");
    std::string tried;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      const cudnnBackendDescriptor_t g = graph.get();
      heur.desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
      if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) continue;
      int64_t count = 0;
      if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                   nullptr) != CUDNN_STATUS_SUCCESS ||
          count <= 0)
        continue;
      std::vector<std::unique_ptr<Desc>> cfgs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(cfgs.back()->get());
      }
      int64_t got = 0;
      if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &got, raw.data()) != CUDNN_STATUS_SUCCESS)
        continue;
      for (int64_t i = 0; i < got; ++i) {
        auto p = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        p->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h)
            .desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[static_cast<size_t>(i)]);
        const cudnnStatus_t st = cudnnBackendFinalize(p->get());
        if (st != CUDNN_STATUS_SUCCESS) {
          tried += std::string(" ") + cudnnGetErrorString(st);
          continue;
        }
        int64_t ws = 0, n = 0;
        build_check(
            cudnnBackendGetAttribute(p->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
            "workspace size");
        *workspace = ws;
        return p;
      }
    }
    throw Unsupported{"no engine configuration builds a plan (" + cudnn_last_error() + ";" + tried + ")"};
  }

 private:
  Desc& own(cudnnBackendDescriptorType_t type) { return descs_.emplace_back(type); }

  cudnnDataType_t io_;
  int64_t next_uid_ = 100;
  std::deque<Desc> descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// The flash views fold their leading dims into [B, H] as their strides allow, so one call may
// see [B, H] in one operand and [1, B * H] in another (a contiguous tensor beside a packed
// one). cuDNN's products want one batch shape: the split of the first operand that has two
// (B, H > 1), else [1, B * H].
struct Split {
  int64_t B = 1, H = 1;
};
Split split_of(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->size(0) > 1 && t->size(1) > 1) return {t->size(0), t->size(1)};
  const Tensor& t = **ts.begin();
  return {1, t.size(0) * t.size(1)};
}

// The [B, H, n, D] dims and strides of a flash operand under split `sp`; a size-1 dim gets a
// nonzero stride (the flash views give it 0, which cuDNN rejects).
struct Bhnd {
  Dims dims, strides;
};
Bhnd bhnd(const Tensor& t, Split sp) {
  const int64_t n = t.size(2), d = t.size(3), sn = n == 1 ? d : t.stride(2);
  int64_t sb = t.stride(0), sh = t.stride(1);
  if (t.size(0) != sp.B || t.size(1) != sp.H) {
    // Heads laid out one stride apart, [1, B * H] or [B * H, 1]: split that stride.
    if (t.size(0) != 1 && t.size(1) != 1) throw Unsupported{"operands fold their heads differently"};
    const int64_t s = t.size(0) == 1 ? sh : sb;
    sb = sp.H * s, sh = s;
  }
  if (sp.H == 1) sh = sn * n;
  if (sp.B == 1) sb = sh * sp.H;
  return {{sp.B, sp.H, n, d}, {sb, sh, sn, 1}};
}
// The same operand seen transposed in its last two dims ([B, H, D, n]): K^T and V^T.
Bhnd transposed(Bhnd t) {
  std::swap(t.dims[2], t.dims[3]);
  std::swap(t.strides[2], t.strides[3]);
  return t;
}

struct Plan {
  std::unique_ptr<Graph> graph;  // the descriptors the plan was built from
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
};

std::unique_ptr<Plan> build_forward(cudnnHandle_t h, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, bool causal) {
  auto p = std::make_unique<Plan>();
  p->graph = std::make_unique<Graph>(cudnn_data_type(q.dtype(), "flash_attention"));
  Graph& g = *p->graph;
  const Split sp = split_of({&q, &k, &v, &out});
  const int64_t B = sp.B, H = sp.H, L = q.size(2), S = k.size(2);
  const Bhnd bq = bhnd(q, sp), bk = transposed(bhnd(k, sp)), bv = bhnd(v, sp), bo = bhnd(out, sp);
  auto Q = g.tensor(kQ, g.io(), bq.dims, bq.strides), KT = g.tensor(kK, g.io(), bk.dims, bk.strides);
  auto V = g.tensor(kV, g.io(), bv.dims, bv.strides), O = g.tensor(kO, g.io(), bo.dims, bo.strides);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, {B, H, L, 1}, {H * L, L, 1, 1});
  auto scale = g.scalar(kScale);
  const Dims ls = {B, H, L, S}, l1 = {B, H, L, 1};
  auto s = g.inner(CUDNN_DATA_FLOAT, ls), scaled = g.inner(CUDNN_DATA_FLOAT, ls);
  g.matmul(Q, KT, s);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, scaled);
  if (causal) scaled = g.causal_mask(scaled, ls, g.scalar(kNegInf));
  auto mx = g.inner(CUDNN_DATA_FLOAT, l1), centered = g.inner(CUDNN_DATA_FLOAT, ls), e = g.inner(CUDNN_DATA_FLOAT, ls);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, mx);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, mx, nullptr, centered);
  g.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, nullptr, e);
  auto z = g.inner(CUDNN_DATA_FLOAT, l1), log_z = g.inner(CUDNN_DATA_FLOAT, l1);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, log_z, nullptr, stats);
  // P in the io type: the engines take both operands of P V in one type (P is rounded to it
  // before the product, as in our kernels).
  auto prob = g.inner(g.io(), ls);
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, nullptr, prob);
  g.matmul(prob, V, O);
  p->plan = g.plan(h, &p->workspace);
  return p;
}

std::unique_ptr<Plan> build_backward(cudnnHandle_t h, const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv, bool causal) {
  auto p = std::make_unique<Plan>();
  p->graph = std::make_unique<Graph>(cudnn_data_type(q.dtype(), "flash_attention"));
  Graph& g = *p->graph;
  const Split sp = split_of({&q, &k, &v, &out, &dout, &dq, &dk, &dv});
  const int64_t B = sp.B, H = sp.H, L = q.size(2), S = k.size(2), D = q.size(3);
  const Bhnd bq = bhnd(q, sp), bk = transposed(bhnd(k, sp)), bv = transposed(bhnd(v, sp)), bo = bhnd(out, sp);
  const Bhnd bdo = bhnd(dout, sp), bdq = bhnd(dq, sp), bdk = bhnd(dk, sp), bdv = bhnd(dv, sp);
  auto Q = g.tensor(kQ, g.io(), bq.dims, bq.strides), KT = g.tensor(kK, g.io(), bk.dims, bk.strides);
  auto VT = g.tensor(kV, g.io(), bv.dims, bv.strides), O = g.tensor(kO, g.io(), bo.dims, bo.strides);
  auto dO = g.tensor(kDO, g.io(), bdo.dims, bdo.strides);
  auto dQ = g.tensor(kDQ, g.io(), bdq.dims, bdq.strides), dK = g.tensor(kDK, g.io(), bdk.dims, bdk.strides);
  auto dV = g.tensor(kDV, g.io(), bdv.dims, bdv.strides);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, {B, H, L, 1}, {H * L, L, 1, 1});
  auto row_sum = g.tensor(kRowSum, CUDNN_DATA_FLOAT, {B, H, L, 1}, {H * L, L, 1, 1});
  auto dq_acc = g.tensor(kDQAcc, CUDNN_DATA_FLOAT, {B, H, L, D}, {H * L * D, L * D, D, 1});
  auto scale = g.scalar(kScale), one = g.scalar(kOne);
  const Dims ls = {B, H, L, S}, l1 = {B, H, L, 1}, ld = {B, H, L, D};
  // sum = rowsum(dO * O), kept in memory for the whole pass.
  auto prod = g.inner(CUDNN_DATA_FLOAT, ld, {H * L * D, L * D, H * D, 1}), red = g.inner(CUDNN_DATA_FLOAT, l1);
  g.pointwise(CUDNN_POINTWISE_MUL, dO, O, nullptr, prod);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, red);
  g.pointwise(CUDNN_POINTWISE_MUL, red, one, nullptr, row_sum);
  // P = exp(scale * Q K^T - stats), masked.
  auto s = g.inner(CUDNN_DATA_FLOAT, ls), scaled = g.inner(CUDNN_DATA_FLOAT, ls),
       centered = g.inner(CUDNN_DATA_FLOAT, ls);
  g.matmul(Q, KT, s);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, scaled);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, centered);
  if (causal) centered = g.causal_mask(centered, ls, g.scalar(kNegInf));
  auto prob = g.inner(CUDNN_DATA_FLOAT, ls);
  g.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, nullptr, prob);
  // dV = P^T dO (P^T: the same values read transposed, rounded to the io type).
  auto prob_t = g.inner(g.io(), {B, H, S, L}, {H * L * S, L * S, 1, S});
  g.reshape(prob, prob_t);
  g.matmul(prob_t, dO, dV);
  // dS = P (dO V^T - sum) * scale.
  auto dp = g.inner(CUDNN_DATA_FLOAT, ls), dp_c = g.inner(CUDNN_DATA_FLOAT, ls), ds = g.inner(CUDNN_DATA_FLOAT, ls);
  auto ds_scaled = g.inner(CUDNN_DATA_FLOAT, ls);
  g.matmul(dO, VT, dp);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, row_sum, nullptr, dp_c);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_c, prob, nullptr, ds);
  g.pointwise(CUDNN_POINTWISE_MUL, ds, scale, nullptr, ds_scaled);
  // dK = dS^T Q.
  auto ds_t = g.inner(g.io(), {B, H, S, L}, {H * L * S, L * S, 1, S});
  g.reshape(ds_scaled, ds_t);
  g.matmul(ds_t, Q, dK);
  // dQ = dS K, through the f32 buffer. K's view is f32 like dS (the engines take the two
  // operands of a product in one type; the values are read as they are).
  const Bhnd bkk = bhnd(k, sp);
  auto K = g.inner(CUDNN_DATA_FLOAT, bkk.dims, bkk.strides);
  g.reshape(KT, K);
  g.matmul(ds_scaled, K, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, nullptr, dQ);
  p->plan = g.plan(h, &p->workspace);
  return p;
}

std::mutex g_stats_mu;
CudnnAttentionPlanStats g_stats;

// The plans of this thread (the handle they were built with is this thread's), by
// configuration; a null entry is a configuration cuDNN has no engine for.
using Key = std::vector<int64_t>;
std::map<Key, std::unique_ptr<Plan>>& plans() {
  thread_local std::map<Key, std::unique_ptr<Plan>> cache;
  return cache;
}

void add_layout(Key& key, const Tensor& t) {
  for (int64_t d = 0; d < 4; ++d) key.push_back(t.size(d)), key.push_back(t.stride(d));
}

// The cached plan for `key`, built by `build` on first use; null when cuDNN can't run it.
// Never built inside a CUDA-graph capture on `device`: building compiles kernels and may
// synchronize or allocate, which a capture cannot hold. The captured call then runs on our
// kernels and nothing is remembered; the first eager call builds the plan.
template <class Build>
Plan* plan_for(const Key& key, int device, Build&& build) {
  if (auto found = plans().find(key); found != plans().end()) return found->second.get();
  if (mg::cuda::is_capturing(device)) {
    last_decline() = "not built during a CUDA graph capture (the first eager call builds it)";
    return nullptr;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Plan> plan;
  try {
    plan = build();
  } catch (const Unsupported& e) {
    last_decline() = e.what;  // remembered (a null plan): the caller's kernels run this configuration
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    (plan ? g_stats.built : g_stats.declined) += 1;
    g_stats.build_seconds += s;
  }
  return plans().emplace(key, std::move(plan)).first->second.get();
}

std::atomic<int64_t> g_runs{0};

// Binds the tensors by unique id, with a workspace of the plan's size from our allocator, and runs.
void execute(cudnnHandle_t h, const Plan& p, Device dev, std::vector<std::pair<int64_t, void*>> binds) {
  Tensor ws;
  if (p.workspace > 0) {
    MemoryCategoryGuard cat(MemoryCategory::Other);
    ws = empty({p.workspace}, {DType::u8, dev});
  }
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (auto& [uid, ptr] : binds) uids.push_back(uid), ptrs.push_back(ptr);
  void* wsp = ws.defined() ? ws.raw_data() : nullptr;
  cudnnBackendDescriptor_t pack = nullptr;
  MG_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
  const auto run = [&] {
    const int64_t n = static_cast<int64_t>(uids.size());
    MG_CUDNN_CHECK(
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data()));
    MG_CUDNN_CHECK(
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data()));
    MG_CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp));
    MG_CUDNN_CHECK(cudnnBackendFinalize(pack));
    MG_CUDNN_CHECK(cudnnBackendExecute(h, p.plan->get(), pack));
  };
  try {
    run();
  } catch (...) {
    cudnnBackendDestroyDescriptor(pack);
    throw;
  }
  cudnnBackendDestroyDescriptor(pack);
  g_runs.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

int64_t cudnn_attention_runs() { return g_runs.load(std::memory_order_relaxed); }

std::string cudnn_attention_last_decline() { return last_decline(); }

CudnnAttentionPlanStats cudnn_attention_plan_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  return g_stats;
}

bool cudnn_attention_eligible(DType dt, int64_t L, int64_t S, int64_t D) {
  return (dt == DType::f16 || dt == DType::bf16) && D % 8 == 0 && D >= 8 && D <= 128 && L >= 64 && S >= 64 &&
         L % 64 == 0 && S % 64 == 0;
}

// The logsumexp as the graphs declare it: [B * H, L] f32, contiguous and 16-byte aligned.
bool lse_ok(const Tensor& lse) {
  return lse.dtype() == DType::f32 && lse.is_contiguous() && reinterpret_cast<uintptr_t>(lse.raw_data()) % 16 == 0;
}

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                             const Tensor& out, const Tensor& lse) {
  if (!cudnn_attention_eligible(q.dtype(), q.size(2), k.size(2), q.size(3)) || !lse_ok(lse)) return false;
  const Device dev = q.device();
  cudnnHandle_t h = cudnn_handle(dev.index);
  Key key = {0, dev.index, static_cast<int64_t>(q.dtype()), causal};
  for (const Tensor* t : {&q, &k, &v, &out}) add_layout(key, *t);
  Plan* p = plan_for(key, dev.index, [&] { return build_forward(h, q, k, v, out, causal); });
  if (!p) return false;
  float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<std::pair<int64_t, void*>> binds = {{kQ, q.raw_data()},   {kK, k.raw_data()},       {kV, v.raw_data()},
                                                  {kO, out.raw_data()}, {kStats, lse.raw_data()}, {kScale, &scale}};
  if (causal) binds.emplace_back(kNegInf, &neg_inf);
  execute(h, *p, dev, std::move(binds));
  return true;
}

bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, bool causal, float scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv) {
  if (!cudnn_attention_eligible(q.dtype(), q.size(2), k.size(2), q.size(3)) || !lse_ok(lse)) return false;
  const Device dev = q.device();
  cudnnHandle_t h = cudnn_handle(dev.index);
  Key key = {1, dev.index, static_cast<int64_t>(q.dtype()), causal};
  for (const Tensor* t : {&dout, &q, &k, &v, &out, &dq, &dk, &dv}) add_layout(key, *t);
  Plan* p = plan_for(key, dev.index, [&] { return build_backward(h, dout, q, k, v, out, dq, dk, dv, causal); });
  if (!p) return false;
  const int64_t BH = q.size(0) * q.size(1), L = q.size(2), D = q.size(3);
  Tensor row_sum = empty({BH, L}, {DType::f32, dev}), dq_acc = empty({BH, L, D}, {DType::f32, dev});
  float one = 1.f, neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<std::pair<int64_t, void*>> binds = {{kQ, q.raw_data()},
                                                  {kK, k.raw_data()},
                                                  {kV, v.raw_data()},
                                                  {kO, out.raw_data()},
                                                  {kDO, dout.raw_data()},
                                                  {kStats, lse.raw_data()},
                                                  {kDQ, dq.raw_data()},
                                                  {kDK, dk.raw_data()},
                                                  {kDV, dv.raw_data()},
                                                  {kRowSum, row_sum.raw_data()},
                                                  {kDQAcc, dq_acc.raw_data()},
                                                  {kScale, &scale},
                                                  {kOne, &one}};
  if (causal) binds.emplace_back(kNegInf, &neg_inf);
  execute(h, *p, dev, std::move(binds));
  return true;
}

}  // namespace mg::kernels::cuda
