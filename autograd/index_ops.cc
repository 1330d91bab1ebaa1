// Joining and indexing: cat/stack hand each input its slice of the gradient; gather and
// index_select scatter-add it back; scatter_ is in-place (history rebase).
#include "autograd/op_support.h"

namespace mg {

namespace {
// The inputs of cat/stack: their shapes, and which of them want a gradient.
struct Parts {
  std::vector<Shape> shapes;
  std::vector<bool> needed;
  explicit Parts(const std::vector<Tensor>& ts) {
    for (const Tensor& t : ts) {
      shapes.push_back(t.sizes());
      needed.push_back(needs_grad(t));
    }
  }
};
}  // namespace

namespace {
// cat and stack: when an input wants a gradient, records backward(g, d, parts), d being the
// joined dim wrapped against the output.
template <class Backward>
Tensor record_join(const char* op, const std::vector<Tensor>& ts, int64_t dim, Tensor out, Backward backward) {
  if (!any_requires_grad(ts)) return out;
  const int64_t d = wrap_dim(dim, out.dim(), op);
  record(op, ts, out, [d, p = Parts(ts), backward](const Grads& g) { return backward(g[0], d, p); });
  return out;
}
}  // namespace

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  return record_join("cat", ts, dim, kernels::cat(ts, dim), [](const Tensor& g, int64_t d, const Parts& p) {
    Grads gs(p.shapes.size());
    int64_t off = 0;
    for (size_t i = 0; i < p.shapes.size(); ++i) {
      // An empty 1-D input next to N-D ones is skipped by cat (PyTorch's legacy rule).
      if (static_cast<int64_t>(p.shapes[i].size()) != g.dim()) continue;
      const int64_t n = p.shapes[i][d];
      if (p.needed[i]) gs[i] = raw::slice(g, d, off, off + n, 1);
      off += n;
    }
    return gs;
  });
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  return record_join("stack", ts, dim, kernels::stack(ts, dim), [](const Tensor& g, int64_t d, const Parts& p) {
    Grads gs(p.needed.size());
    for (size_t i = 0; i < p.needed.size(); ++i)
      if (p.needed[i]) gs[i] = raw::select(g, d, static_cast<int64_t>(i));
    return gs;
  });
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor out = kernels::gather(a, dim, index);
  if (any_requires_grad({a}))
    record("gather", {a, index}, out, [shape = a.sizes(), dim, si = SavedTensor(index, "gather")](const Grads& g) {
      Tensor z = zeros(shape, {g[0].dtype(), g[0].device()});
      kernels::scatter_add_(z, dim, si.unpack(), g[0]);
      return Grads{z, Tensor()};
    });
  return out;
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor out = kernels::index_select(a, dim, index);
  if (any_requires_grad({a}))
    record("index_select", {a, index}, out,
           [shape = a.sizes(), dim, si = SavedTensor(index, "index_select")](const Grads& g) {
             Tensor z = zeros(shape, {g[0].dtype(), g[0].device()});
             kernels::index_add_(z, dim, si.unpack(), g[0]);
             return Grads{z, Tensor()};
           });
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) { return kernels::one_hot(indices, num_classes); }

Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  autograd::inplace_update(self, "scatter_", [&] { kernels::scatter_(self, dim, index, src); });
  if (any_requires_grad({self, src}))
    autograd::record_inplace("scatter_", self, {src},
                             [dim, si = SavedTensor(index, "scatter_"), src_shape = src.sizes(),
                              need_self = needs_grad(self), need_src = needs_grad(src)](const Grads& g) {
                               Tensor idx = si.unpack(), g_self, g_src;
                               if (need_self) {  // overwritten positions got nothing from the old self
                                 g_self = raw::clone(g[0]);
                                 kernels::scatter_(g_self, dim, idx, zeros(idx.sizes(), {g[0].dtype(), g[0].device()}));
                               }
                               if (need_src) {
                                 Tensor picked = kernels::gather(g[0], dim, idx);  // index-shaped
                                 if (picked.sizes() == src_shape) {
                                   g_src = picked;
                                 } else {  // src larger than index: only its leading corner was used
                                   g_src = zeros(src_shape, {g[0].dtype(), g[0].device()});
                                   Tensor corner = g_src;
                                   for (int64_t d = 0; d < idx.dim(); ++d)
                                     corner = raw::slice(corner, d, 0, idx.size(d), 1);
                                   raw::copy_(corner, picked);
                                 }
                               }
                               return Grads{g_self, g_src};
                             });
  return self;
}

// ---------------- embedding ----------------

namespace {
// Host-side bounds check with a message naming the index, where it sits and the table size
// (CUDA indices are checked by the index_select kernel itself).
template <class I>
void check_embedding_indices(const Tensor& flat, int64_t num_embeddings) {
  const I* p = flat.data_ptr<I>();
  for (int64_t i = 0; i < flat.numel(); ++i)
    MG_CHECK(p[i] >= 0 && p[i] < num_embeddings, IndexError, "embedding: index ", static_cast<int64_t>(p[i]),
             " at position ", i, " is out of range for num_embeddings ", num_embeddings, " (valid indices are 0..",
             num_embeddings - 1, ")");
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  MG_CHECK(weight.defined() && indices.defined(), ValueError, "embedding: got an undefined tensor");
  MG_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be 2-D [num_embeddings, embedding_dim], got shape ",
           shape_str(weight.sizes()));
  MG_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32, DTypeError,
           "embedding: indices must be integers (i64 or i32), got ", indices.dtype());
  MG_CHECK(indices.device() == weight.device(), DeviceError, "embedding: indices are on ", indices.device(),
           " but weight is on ", weight.device());
  const int64_t V = weight.size(0), D = weight.size(1);
  Tensor flat = raw::reshape(raw::contiguous(indices), {indices.numel()});
  if (!flat.is_cuda())
    MG_DISPATCH_INDEX(flat.dtype(), "embedding", [&] { check_embedding_indices<scalar_t>(flat, V); });
  Shape out_shape = indices.sizes();
  out_shape.push_back(D);
  Tensor out = raw::view(kernels::index_select(weight, 0, flat), out_shape);
  if (any_requires_grad({weight}))
    record("embedding", {weight}, out, [V, D, si = SavedTensor(flat, "embedding")](const Grads& g) {
      // Dense gradient: one row per embedding, repeated indices add up (no sparse gradients).
      // The forward checked these indices (index_select, or the loop above on the CPU), and the
      // saved tensor raises if they were modified since: no second check (on CUDA, a sync).
      Tensor z = zeros({V, D}, {g[0].dtype(), g[0].device()});
      kernels::index_add_(z, 0, si.unpack(), raw::reshape(g[0], {-1, D}), kernels::IndexBounds::Checked);
      return Grads{z};
    });
  return out;
}

}  // namespace mg
