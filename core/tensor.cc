// The Tensor type's methods (views, factories, checked sizes, copies), on one set of private
// helpers (shape checks, stride arithmetic, the copy paths).
#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/strided_loop.h"

namespace mg {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

StorageImpl::~StorageImpl() {
  if (counted) CategoryStats::get(device).on_free(category, static_cast<int64_t>(nbytes));
  if (deleter) {
    deleter(data);
  } else if (allocator) {
    allocator->deallocate(data, nbytes);
  }
}

Storage make_storage(size_t nbytes, Device device) {
  auto s = std::make_shared<StorageImpl>();
  Allocator& a = allocator_for(device);
  s->data = a.allocate(nbytes);
  s->nbytes = nbytes;
  s->device = device;
  s->allocator = &a;
  s->category = MemoryCategoryGuard::current();
  s->counted = true;
  CategoryStats::get(device).on_alloc(s->category, static_cast<int64_t>(nbytes));
  return s;
}

void release_storage(const Storage& s) {
  MG_CHECK(s != nullptr && s->allocator != nullptr && !s->deleter, ValueError,
           "release_storage: only a storage the allocator made can be released");
  if (s->data == nullptr) return;
  if (s->counted) CategoryStats::get(s->device).on_free(s->category, static_cast<int64_t>(s->nbytes));
  s->allocator->deallocate(s->data, s->nbytes);
  s->data = nullptr;
  s->counted = false;
}

void reallocate_storage(const Storage& s) {
  MG_CHECK(s != nullptr && s->allocator != nullptr && !s->deleter, ValueError,
           "reallocate_storage: only a storage the allocator made can be reallocated");
  if (s->data != nullptr || s->nbytes == 0) return;
  s->data = s->allocator->allocate(s->nbytes);
  s->category = MemoryCategoryGuard::current();
  s->counted = true;
  CategoryStats::get(s->device).on_alloc(s->category, static_cast<int64_t>(s->nbytes));
}

void retarget(const Tensor& t, const Tensor& moved) {
  if (moved.is_same(t)) return;
  TensorImpl* impl = t.impl();
  impl->storage = moved.storage();
  impl->sizes = moved.sizes();
  impl->strides = moved.strides();
  impl->offset = moved.offset();
  impl->dtype = moved.dtype();
  t.bump_version();
}

Storage adopt_storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter) {
  auto s = std::make_shared<StorageImpl>();
  s->data = data;
  s->nbytes = nbytes;
  s->device = device;
  s->deleter = std::move(deleter);
  return s;
}

void throw_size_overflow(const char* op, int64_t a, int64_t b, char sign) {
  MG_THROW(ShapeError, op, ": size overflow: ", a, " ", sign, " ", b, " does not fit in a signed 64-bit integer");
}

void throw_undefined_tensor(const char* method) { MG_THROW(ValueError, method, ": called on an undefined tensor"); }

int64_t shape_numel(const Shape& shape, const char* op) {
  int64_t n = 1;
  for (int64_t s : shape) n = checked_mul(n, s, op);
  return n;
}

size_t storage_nbytes(const Shape& shape, DType dtype, const char* op) {
  for (int64_t s : shape) MG_CHECK(s >= 0, ShapeError, op, ": negative size in shape ", shape_str(shape));
  return static_cast<size_t>(checked_mul(shape_numel(shape, op), static_cast<int64_t>(dtype_size(dtype)), op));
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc = checked_mul(acc, std::max<int64_t>(shape[i], 1), "contiguous_strides");
  }
  return st;
}

Shape channels_last_strides(const Shape& shape, const char* op) {
  MG_CHECK(shape.size() == 4, ShapeError, op, ": the channels-last layout is for 4-D [N, C, H, W] tensors, got shape ",
           shape_str(shape));
  // Contiguous strides of the NHWC permutation, mapped back to the NCHW dims.
  const Shape p = contiguous_strides({shape[0], shape[2], shape[3], shape[1]});
  return {p[0], p[3], p[1], p[2]};
}

const char* memory_format_name(MemoryFormat f) {
  return f == MemoryFormat::ChannelsLast ? "channels_last" : "contiguous";
}
std::ostream& operator<<(std::ostream& os, MemoryFormat f) { return os << memory_format_name(f); }

MemoryFormat suggest_memory_format(const Tensor& t) {
  return t.is_contiguous(MemoryFormat::ChannelsLast) && !t.is_contiguous() ? MemoryFormat::ChannelsLast
                                                                           : MemoryFormat::Contiguous;
}

bool is_channels_last(const Tensor& t) { return suggest_memory_format(t) == MemoryFormat::ChannelsLast; }

MemoryFormat result_memory_format(const Shape& shape, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    if (t && t->defined() && t->sizes() == shape && suggest_memory_format(*t) == MemoryFormat::ChannelsLast)
      return MemoryFormat::ChannelsLast;
  return MemoryFormat::Contiguous;
}

bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || !a.is_dense()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);
  MG_CHECK(dim >= -n && dim < n, IndexError, op, ": dim ", dim, " out of range for a tensor with ", ndim,
           " dims (expected [", -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

static Tensor make_tensor(Storage st, Shape sizes, Shape strides, int64_t offset, DType dtype,
                          std::shared_ptr<uint32_t> version = nullptr) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  impl->version = version ? std::move(version) : std::make_shared<uint32_t>(0);
  return Tensor(std::move(impl));
}

// A 0-dim tensor has no dim to ask about (wrap_dim alone would let 0 and -1 through).
static int64_t existing_dim(int64_t d, int64_t ndim, const char* op) {
  MG_CHECK(ndim > 0, IndexError, op, ": dim ", d, " of a 0-dim tensor (it has no dims)");
  return wrap_dim(d, ndim, op);
}
int64_t Tensor::size(int64_t d) const { return checked("size").sizes[existing_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return checked("stride").strides[existing_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return shape_numel(checked("numel").sizes); }
size_t Tensor::nbytes() const {
  const TensorImpl& impl = checked("nbytes");
  return static_cast<size_t>(
      checked_mul(shape_numel(impl.sizes), static_cast<int64_t>(dtype_size(impl.dtype)), "nbytes"));
}

bool Tensor::is_contiguous() const {
  const TensorImpl& impl = checked("is_contiguous");
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl.sizes[i] == 1) continue;
    if (impl.strides[i] != expected) return false;
    expected *= impl.sizes[i];  // bounded by numel, checked when the shape was made
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat fmt) const {
  if (fmt == MemoryFormat::Contiguous) return is_contiguous();
  const TensorImpl& impl = checked("is_contiguous");
  if (impl.sizes.size() != 4) return false;
  int64_t expected = 1;
  for (int d : {1, 3, 2, 0}) {  // C, W, H, N: innermost first
    if (impl.sizes[d] == 1) continue;
    if (impl.strides[d] != expected) return false;
    expected *= impl.sizes[d];
  }
  return true;
}

bool Tensor::is_dense() const {
  // The two layouts every elementwise launch asks about first, without the sort below.
  if (is_contiguous() || is_contiguous(MemoryFormat::ChannelsLast)) return true;
  const TensorImpl& impl = checked("is_dense");
  std::vector<int64_t> dims;
  for (size_t d = 0; d < impl.sizes.size(); ++d)
    if (impl.sizes[d] != 1) dims.push_back(static_cast<int64_t>(d));
  std::sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return impl.strides[a] < impl.strides[b]; });
  int64_t expected = 1;
  for (int64_t d : dims) {
    if (impl.sizes[d] == 0) return true;  // no elements: nothing overlaps
    if (impl.strides[d] != expected) return false;
    expected *= impl.sizes[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  const TensorImpl& impl = checked("raw_data");
  if (impl.storage->data == nullptr && impl.storage->nbytes > 0) [[unlikely]]
    MG_THROW(ValueError, "a tensor of shape ", shape_str(impl.sizes), " was read while its storage (",
             impl.storage->nbytes,
             " bytes) is released: a parameter of a ZeRO-3 or host-offloaded unit used outside its unit's "
             "gather (autograd/param_units.h)");
  return static_cast<char*>(impl.storage->data) + impl.offset * static_cast<int64_t>(element_size());
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>(checked("detach"));
  impl->autograd = nullptr;
  return Tensor(std::move(impl));
}

double Tensor::item() const {
  checked("item");
  MG_CHECK(numel() == 1, ValueError, "item: expected a tensor with one element, got shape ", shape_str(sizes()), " (",
           numel(), " elements)");
  Tensor c = is_cuda() ? raw::to_device(*this, Device::cpu()) : *this;
  double v = 0;
  MG_DISPATCH_ALL(c.dtype(), "item", [&] {
    v = static_cast<double>(static_cast<opmath_t<scalar_t>>(*static_cast<scalar_t*>(c.raw_data())));
  });
  return v;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  checked("to_vector");
  Tensor c = raw::contiguous(raw::to_dtype(is_cuda() ? raw::to_device(*this, Device::cpu()) : *this, dtype_of<T>));
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

std::string Tensor::str() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  std::vector<double> v = t.to_vector<double>();
  const Shape& s = t.sizes();
  const int64_t nd = t.dim();
  const bool fp = is_floating(t.dtype());
  const int64_t limit = 6;  // elements shown per dim edge when summarizing
  std::function<void(int64_t, int64_t, int)> rec = [&](int64_t d, int64_t base, int indent) {
    if (d == nd) {
      if (fp)
        os << std::setprecision(5) << v[base];
      else
        os << static_cast<long long>(v[base]);
      return;
    }
    int64_t stride = 1;
    for (int64_t k = d + 1; k < nd; ++k) stride *= s[k];
    os << "[";
    for (int64_t i = 0; i < s[d]; ++i) {
      if (s[d] > 2 * limit && i == limit) {
        os << "...";
        i = s[d] - limit - 1;
        if (d + 1 < nd)
          os << ",\n" << std::string(indent + 1, ' ');
        else
          os << ", ";
        continue;
      }
      if (i) {
        if (d + 1 < nd)
          os << ",\n" << std::string(indent + 1, ' ');
        else
          os << ", ";
      }
      rec(d + 1, base + i * stride, indent + 1);
    }
    os << "]";
  };
  os << "tensor(";
  if (nd == 0)
    rec(0, 0, 7);
  else
    rec(0, 0, 7);
  os << ", shape=" << shape_str(s) << ", dtype=" << t.dtype() << ", device=" << t.device();
  if (t.requires_grad()) os << ", requires_grad";
  return os << ")";
}

// ---------------- factories ----------------

Tensor empty(const Shape& shape, TensorOptions opts) {
  Storage st = make_storage(storage_nbytes(shape, opts.dtype, "empty"), opts.device);
  Tensor t = make_tensor(std::move(st), shape, contiguous_strides(shape), 0, opts.dtype);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor empty(const Shape& shape, TensorOptions opts, MemoryFormat fmt) {
  if (fmt == MemoryFormat::Contiguous) return empty(shape, opts);
  const Shape strides = channels_last_strides(shape, "empty");
  Storage st = make_storage(storage_nbytes(shape, opts.dtype, "empty"), opts.device);
  Tensor t = make_tensor(std::move(st), shape, strides, 0, opts.dtype);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  raw::fill_(t, value);
  if (rg) t.requires_grad_(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), {t.dtype(), t.device()}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), {t.dtype(), t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), {t.dtype(), t.device()}); }
Tensor full_like(const Tensor& t, double value) { return full(t.sizes(), value, {t.dtype(), t.device()}); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  MG_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), ValueError, "arange: start ", start,
           ", end ", end, " and step ", step, " must be finite");
  MG_CHECK(step != 0, ValueError, "arange: step must be nonzero");
  const double count = std::ceil((end - start) / step);
  MG_CHECK(count >= 0, ValueError, "arange: start ", start, ", end ", end, " and step ", step, " are inconsistent");
  // 2^62 elements is far beyond any memory; the bound keeps the cast to int64 defined.
  MG_CHECK(count < 0x1p62, ShapeError, "arange: start ", start, ", end ", end, " and step ", step, " give ", count,
           " elements");
  int64_t n = static_cast<int64_t>(count);
  Tensor h = empty({n}, {opts.dtype, Device::cpu()});
  MG_DISPATCH_ALL(opts.dtype, "arange", [&] {
    auto* p = h.data_ptr<scalar_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(start + i * step));
  });
  return opts.device.is_cpu() ? h : raw::to_device(h, opts.device);
}
Tensor arange(int64_t end, TensorOptions opts) { return arange(0.0, static_cast<double>(end), 1.0, opts); }

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  MG_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), ShapeError, "from_vector: ", values.size(),
           " values do not fill shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
  Tensor h = empty(shape, {dtype_of<T>, Device::cpu()});
  if (!values.empty()) {
    if constexpr (std::is_same_v<T, bool>) {
      bool* p = h.data_ptr<bool>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    } else {
      std::memcpy(h.raw_data(), values.data(), values.size() * sizeof(T));
    }
  }
  Tensor out = h;
  if (opts.dtype != dtype_of<T>) out = raw::to_dtype(out, opts.dtype);
  if (!opts.device.is_cpu()) out = raw::to_device(out, opts.device);
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, TensorOptions);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&, TensorOptions);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&, TensorOptions);

Tensor tensor(std::initializer_list<double> values, const Shape& shape, TensorOptions opts) {
  return from_vector(std::vector<double>(values), shape, opts);
}

CudaHooks& cuda_hooks() {
  static CudaHooks h;
  return h;
}

// ---------------- raw views ----------------
namespace raw {

Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset) {
  MG_CHECK(sizes.size() == strides.size() && offset >= 0, ShapeError, "as_strided: sizes ", shape_str(sizes),
           ", strides ", shape_str(strides), ", offset ", offset, " do not describe a view");
  // The last element the view reaches must lie in the storage: no view can read past it.
  int64_t last = offset;
  bool empty_view = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    MG_CHECK(sizes[i] >= 0 && strides[i] >= 0, ShapeError, "as_strided: negative size or stride in sizes ",
             shape_str(sizes), ", strides ", shape_str(strides));
    empty_view |= sizes[i] == 0;
    if (sizes[i] > 0) last = checked_add(last, checked_mul(sizes[i] - 1, strides[i], "as_strided"), "as_strided");
  }
  shape_numel(sizes, "as_strided");
  const Storage& st = t.storage();
  const int64_t elems = static_cast<int64_t>(st->nbytes / t.element_size());
  MG_CHECK(empty_view || last < elems, ShapeError, "as_strided: a view with sizes ", shape_str(sizes), ", strides ",
           shape_str(strides), " and offset ", offset, " reaches element ", last, " of a storage of ", elems,
           " elements");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  impl->version = t.impl()->version;
  impl->view_base = t.impl()->view_base ? t.impl()->view_base : t.impl_ptr();
  return Tensor(std::move(impl));
}

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      MG_CHECK(infer < 0, ShapeError, op, ": only one dimension can be -1, got ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      MG_CHECK(out[i] >= 0, ShapeError, op, ": invalid size ", out[i], " in shape ", shape_str(shape));
      known = checked_mul(known, out[i], op);
    }
  }
  if (infer >= 0) {
    MG_CHECK(known != 0 && numel % known == 0, ShapeError, op, ": shape ", shape_str(shape),
             " is invalid for input of size ", numel);
    out[infer] = numel / known;
  }
  MG_CHECK(shape_numel(out, op) == numel, ShapeError, op, ": shape ", shape_str(shape),
           " is invalid for input of size ", numel);
  return out;
}

// Can `t` be viewed as `shape` without copying? (PyTorch's computeStride.)
bool viewable(const Tensor& t, const Shape& shape, Shape* strides_out) {
  const Shape& old_sizes = t.sizes();
  const Shape& old_strides = t.strides();
  Shape new_strides(shape.size());
  if (t.numel() == 0 || old_sizes.empty()) {
    *strides_out = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_sizes.size()) - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= old_sizes[tensor_d];
    if (tensor_d == 0 ||
        (old_sizes[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return false;
  *strides_out = new_strides;
  return true;
}

Tensor view(const Tensor& t, const Shape& shape) {
  Shape s = infer_shape(shape, t.numel(), "view");
  Shape st;
  MG_CHECK(viewable(t, s, &st), ShapeError, "view: cannot view a tensor of shape ", shape_str(t.sizes()),
           " with strides ", shape_str(t.strides()), " as ", shape_str(s),
           " without copying (use reshape, or call contiguous() first)");
  return as_strided(t, s, st, t.offset());
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  Shape s = infer_shape(shape, t.numel(), "reshape");
  Shape st;
  if (viewable(t, s, &st)) return as_strided(t, s, st, t.offset());
  return view(contiguous(t), s);
}

Tensor permute(const Tensor& t, const Shape& dims) {
  const int64_t nd = t.dim();
  MG_CHECK(static_cast<int64_t>(dims.size()) == nd, ShapeError, "permute: got ", dims.size(), " dims ", shape_str(dims),
           " for a tensor with ", nd, " dims");
  Shape sizes(nd), strides(nd);
  std::vector<bool> seen(nd, false);
  for (int64_t i = 0; i < nd; ++i) {
    int64_t d = wrap_dim(dims[i], nd, "permute");
    MG_CHECK(!seen[d], ShapeError, "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    sizes[i] = t.sizes()[d];
    strides[i] = t.strides()[d];
  }
  return as_strided(t, sizes, strides, t.offset());
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  const int64_t nd = t.dim();
  if (nd == 0) return as_strided(t, t.sizes(), t.strides(), t.offset());
  d0 = wrap_dim(d0, nd, "transpose");
  d1 = wrap_dim(d1, nd, "transpose");
  Shape sizes = t.sizes(), strides = t.strides();
  std::swap(sizes[d0], sizes[d1]);
  std::swap(strides[d0], strides[d1]);
  return as_strided(t, sizes, strides, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  const int64_t nd = t.dim();
  dim = wrap_dim(dim, nd + 1, "unsqueeze");
  Shape sizes = t.sizes(), strides = t.strides();
  int64_t st = dim < nd ? sizes[dim] * strides[dim] : 1;
  sizes.insert(sizes.begin() + dim, 1);
  strides.insert(strides.begin() + dim, st);
  return as_strided(t, sizes, strides, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  const int64_t nd = t.dim();
  if (nd == 0) return as_strided(t, t.sizes(), t.strides(), t.offset());
  dim = wrap_dim(dim, nd, "squeeze");
  Shape sizes = t.sizes(), strides = t.strides();
  if (sizes[dim] != 1) return as_strided(t, sizes, strides, t.offset());
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return as_strided(t, sizes, strides, t.offset());
}

Tensor squeeze(const Tensor& t) {
  Shape sizes, strides;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.sizes()[i] != 1) {
      sizes.push_back(t.sizes()[i]);
      strides.push_back(t.strides()[i]);
    }
  return as_strided(t, sizes, strides, t.offset());
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  if (t.dim() == 0) return reshape(t, {1});
  const int64_t s = wrap_dim(start_dim, t.dim(), "flatten"), e = wrap_dim(end_dim, t.dim(), "flatten");
  MG_CHECK(s <= e, ValueError, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for shape ",
           shape_str(t.sizes()));
  Shape shape(t.sizes().begin(), t.sizes().begin() + s);
  shape.push_back(shape_numel(Shape(t.sizes().begin() + s, t.sizes().begin() + e + 1)));
  shape.insert(shape.end(), t.sizes().begin() + e + 1, t.sizes().end());
  return reshape(t, shape);
}

Tensor t(const Tensor& x) {
  MG_CHECK(x.dim() <= 2, ShapeError, "t: expects a tensor with <= 2 dims, got ", x.dim(), " dims of shape ",
           shape_str(x.sizes()), " (use transpose(d0, d1) or permute)");
  if (x.dim() < 2) return as_strided(x, x.sizes(), x.strides(), x.offset());
  return transpose(x, 0, 1);
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int64_t nd = t.dim();
  MG_CHECK(nd > 0, ShapeError, "slice: cannot slice a 0-dim tensor");
  dim = wrap_dim(dim, nd, "slice");
  MG_CHECK(step > 0, ValueError, "slice: step must be positive, got ", step);
  const int64_t n = t.sizes()[dim];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sizes = t.sizes(), strides = t.strides();
  sizes[dim] = end == start ? 0 : (end - start - 1) / step + 1;  // (end - start + step - 1) could overflow
  strides[dim] = checked_mul(strides[dim], step, "slice");
  return as_strided(t, sizes, strides, t.offset() + start * t.strides()[dim]);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  const int64_t nd = t.dim();
  MG_CHECK(nd > 0, ShapeError, "select: cannot select from a 0-dim tensor");
  dim = wrap_dim(dim, nd, "select");
  const int64_t n = t.sizes()[dim];
  MG_CHECK(index >= -n && index < n, IndexError, "select: index ", index, " out of range for dim ", dim, " of size ",
           n);
  if (index < 0) index += n;
  Shape sizes = t.sizes(), strides = t.strides();
  int64_t off = t.offset() + index * strides[dim];
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return as_strided(t, sizes, strides, off);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  const int64_t nd = t.dim();
  const int64_t nn = static_cast<int64_t>(shape.size());
  MG_CHECK(nn >= nd, ShapeError, "expand: target shape ", shape_str(shape), " has fewer dims than the tensor's ",
           shape_str(t.sizes()));
  Shape sizes(nn), strides(nn);
  for (int64_t i = nn - 1; i >= 0; --i) {
    int64_t j = i - (nn - nd);
    int64_t want = shape[i];
    if (j >= 0) {
      int64_t have = t.sizes()[j];
      if (want == -1) want = have;  // -1 keeps an existing dim
      MG_CHECK(want >= 0, ShapeError, "expand: invalid size ", shape[i], " at dim ", i, " of ", shape_str(shape));
      MG_CHECK(have == want || have == 1, ShapeError, "expand: cannot expand shape ", shape_str(t.sizes()), " to ",
               shape_str(shape), " (dim ", i, ": ", have, " vs ", want, ")");
      sizes[i] = want;
      strides[i] = have == want ? t.strides()[j] : 0;
    } else {
      MG_CHECK(want >= 0, ShapeError, "expand: invalid size ", want, " for new leading dim ", i, " in ",
               shape_str(shape), " (-1 only keeps an existing dim)");
      sizes[i] = want;
      strides[i] = 0;
    }
  }
  return as_strided(t, sizes, strides, t.offset());
}

Tensor contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  return clone(t);
}

Tensor contiguous(const Tensor& t, MemoryFormat fmt) {
  if (fmt == MemoryFormat::Contiguous) return contiguous(t);
  channels_last_strides(t.sizes(), "contiguous(channels_last)");
  if (t.is_contiguous(fmt)) return t;
  Tensor out = empty(t.sizes(), {t.dtype(), t.device()}, fmt);
  copy_(out, t);
  return out;
}

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.sizes(), {t.dtype(), t.device()});
  copy_(out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.sizes(), {dtype, t.device()}, suggest_memory_format(t));
  copy_(out, t);
  return out;
}

Tensor to_device(const Tensor& t, Device device, bool non_blocking) {
  if (t.device() == device) return t;
  Tensor out = empty(t.sizes(), {t.dtype(), device});
  copy_(out, t, non_blocking);
  return out;
}

template <class D, class S>
static void copy_loop(const Tensor& dst, const Tensor& src) {
  auto* dp = static_cast<D*>(dst.raw_data());
  const auto* sp = static_cast<const S*>(src.raw_data());
  strided_loop<2>(dst.sizes(), {dst.strides(), src.strides()}, [&](auto off, auto inner, int64_t n) {
    D* d = dp + off[0];
    const S* s = sp + off[1];
    const int64_t ds = inner[0], ss = inner[1];
    if constexpr (std::is_same_v<D, S>) {
      if (ds == 1 && ss == 1) {
        std::memcpy(d, s, n * sizeof(D));
        return;
      }
      for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
    } else {
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<D, bool>)
          d[i * ds] = static_cast<opmath_t<S>>(s[i * ss]) != 0;
        else if constexpr (std::is_integral_v<D> && std::is_integral_v<S>)  // through i64: wraps modulo 2^bits
          d[i * ds] = static_cast<D>(static_cast<int64_t>(s[i * ss]));
        else if constexpr (std::is_integral_v<D>)  // NaN -> 0, saturating at int64's range, then wraps
          d[i * ds] = static_cast<D>(float_to_int64(static_cast<double>(static_cast<opmath_t<S>>(s[i * ss]))));
        else
          d[i * ds] = static_cast<D>(static_cast<opmath_t<D>>(static_cast<opmath_t<S>>(s[i * ss])));
      }
    }
  });
}

void copy_(const Tensor& dst, const Tensor& src, bool non_blocking) {
  MG_CHECK(dst.defined() && src.defined(), ValueError, "copy_: undefined tensor");
  Tensor s = src;
  if (s.sizes() != dst.sizes()) s = expand(s, dst.sizes());
  if (dst.is_cuda() || s.is_cuda()) {
    MG_CHECK(cuda_hooks().copy != nullptr, DeviceError, "copy_: CUDA tensor (", dst.device(), " <- ", s.device(),
             ") but the CUDA backend is not available in this build");
    cuda_hooks().copy(dst, s, non_blocking);
    return;
  }
  MG_DISPATCH_ALL(dst.dtype(), "copy_", [&] {
    using D = scalar_t;
    MG_DISPATCH_ALL(s.dtype(), "copy_", [&] { copy_loop<D, scalar_t>(dst, s); });
  });
}

// An integer tensor takes only values its type holds (PyTorch: "value cannot be converted to
// type ... without overflow"); the cast of anything else is undefined.
static void check_fill_value(DType dtype, double value) {
  if (!is_integral(dtype) || dtype == DType::b8) return;
  double lo = 0, hi = 0;  // hi exclusive: the type's max + 1, a power of two exact in a double
  switch (dtype) {
    case DType::i64:
      lo = -0x1p63, hi = 0x1p63;
      break;
    case DType::i32:
      lo = -0x1p31, hi = 0x1p31;
      break;
    default:  // u8
      lo = 0, hi = 256;
  }
  MG_CHECK(value >= lo && value < hi, ValueError, "fill_: value ", value, " cannot be converted to ", dtype,
           " without overflow");
}

void fill_(const Tensor& dst, double value) {
  check_fill_value(dst.dtype(), value);
  if (dst.is_cuda()) {
    MG_CHECK(cuda_hooks().fill != nullptr, DeviceError, "fill_: CUDA tensor but no CUDA backend in this build");
    cuda_hooks().fill(dst, value);
    return;
  }
  MG_DISPATCH_ALL(dst.dtype(), "fill_", [&] {
    scalar_t v;
    if constexpr (std::is_same_v<scalar_t, bool>)
      v = value != 0;
    else
      v = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(value));
    auto* p = static_cast<scalar_t*>(dst.raw_data());
    strided_loop<1>(dst.sizes(), {dst.strides()}, [&](auto off, auto inner, int64_t n) {
      scalar_t* d = p + off[0];
      for (int64_t i = 0; i < n; ++i) d[i * inner[0]] = v;
    });
  });
}

}  // namespace raw
}  // namespace mg
