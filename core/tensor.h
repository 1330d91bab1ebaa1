// The Tensor: a refcounted handle to strided view over a Storage, with dtype, device, a
// version counter shared by all views, and an opaque autograd state autograd/ gives meaning to.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace mg {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

// How a 4-D [N, C, H, W] tensor's elements lie in memory. Contiguous: NCHW, row-major.
// ChannelsLast: NHWC, the channel innermost (strides {H*W*C, 1, W*C, C}), the layout that
// cuDNN's tensor-core convolutions and memgrad's NHWC batch-norm and pooling kernels read
// without a transpose. Sizes stay [N, C, H, W] in both: only the strides differ.
enum class MemoryFormat { Contiguous, ChannelsLast };
const char* memory_format_name(MemoryFormat f);
std::ostream& operator<<(std::ostream& os, MemoryFormat f);

// A block of memory from an Allocator (or adopted external memory with its own deleter).
struct StorageImpl {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;
  MemoryCategory category = MemoryCategory::Other;
  std::function<void(void*)> deleter;  // for adopted memory (mmap, user buffers)
  bool counted = false;

  StorageImpl() = default;
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;
  ~StorageImpl();
};
using Storage = std::shared_ptr<StorageImpl>;

// Allocates nbytes on `device` under the current MemoryCategoryGuard category.
Storage make_storage(size_t nbytes, Device device);
// Wraps memory memgrad did not allocate; `deleter` runs when the last view dies.
Storage adopt_storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
// A storage's block can be given back and taken again while its views stay, as a parameter
// that lives elsewhere between uses does (a ZeRO-3 shard's gathered form, a parameter streamed
// from host memory: autograd/param_units.h; FSDP's untyped_storage().resize_(0)).
// release_storage frees the block and keeps the size: reading a view's data is then a
// ValueError. reallocate_storage takes a block of the same size again, under the current
// MemoryCategoryGuard category, contents undefined. Both are no-ops when already in that state;
// memory the allocator did not make (adopt_storage) is a ValueError.
void release_storage(const Storage& s);
void reallocate_storage(const Storage& s);
inline bool storage_released(const Storage& s) { return s->data == nullptr && s->nbytes > 0; }

class Tensor;
// Points t's own TensorImpl at `moved`'s storage, layout and dtype, so every handle to t (a
// module's, an optimizer's) sees it; bumps t's version (nn::retarget, Module::to).
void retarget(const Tensor& t, const Tensor& moved);

struct TensorImpl;

// What a TensorImpl knows of autograd: a flag, a leaf bit and a .grad. The one implementation
// (with grad_fn and accumulator) lives in autograd/ and core gets it only through
// AutogradHooks::make_meta, so //core links and runs without //autograd.
struct AutogradMetaInterface {
  virtual ~AutogradMetaInterface() = default;
  virtual bool requires_grad() const = 0;
  virtual void set_requires_grad(bool on) = 0;
  // False for an op's output (it has a grad_fn), true otherwise.
  virtual bool is_leaf() const = 0;
  virtual void set_retains_grad() = 0;
  virtual const std::shared_ptr<TensorImpl>& grad() const = 0;
  virtual void set_grad(std::shared_ptr<TensorImpl> grad) = 0;
};

struct TensorImpl {
  Storage storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::shared_ptr<uint32_t> version;                // shared with every view of the same storage
  std::shared_ptr<AutogradMetaInterface> autograd;  // null until the tensor takes part in autograd
  std::shared_ptr<TensorImpl> view_base;            // set for views (the tensor the view was taken of)
};

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}    // NOLINT
  TensorOptions(Device d) : device(d) {}  // NOLINT
  TensorOptions(DType t, Device d, bool rg = false) : dtype(t), device(d), requires_grad(rg) {}
};

// mg::ValueError "<method>: called on an undefined tensor".
[[noreturn]] void throw_undefined_tensor(const char* method);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // Every accessor and method below raises mg::ValueError "<method>: called on an undefined
  // tensor" on a default-constructed Tensor (one predictable branch each).
  const Shape& sizes() const { return checked("sizes").sizes; }
  const Shape& shape() const { return checked("shape").sizes; }
  const Shape& strides() const { return checked("strides").strides; }
  // mg::IndexError for a dim out of range (any dim of a 0-dim tensor).
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(checked("dim").sizes.size()); }
  int64_t numel() const;
  int64_t offset() const { return checked("offset").offset; }
  DType dtype() const { return checked("dtype").dtype; }
  Device device() const { return checked("device").storage->device; }
  bool is_cuda() const { return device().is_cuda(); }
  size_t element_size() const { return dtype_size(dtype()); }
  // numel() * element_size(), checked (an expanded view can count more bytes than exist).
  size_t nbytes() const;
  bool is_contiguous() const;
  // In the given layout's own strides (size-1 dims' strides don't count, as for
  // is_contiguous()); ChannelsLast is false for anything but 4-D.
  bool is_contiguous(MemoryFormat fmt) const;
  // Non-overlapping and dense: the elements fill numel() consecutive slots in some dim
  // order (contiguous, channels-last, or any permutation of a contiguous tensor).
  bool is_dense() const;
  const Storage& storage() const { return checked("storage").storage; }

  // Pointer to the first element (storage base + offset).
  void* raw_data() const;
  template <class T>
  T* data_ptr() const {
    MG_CHECK(dtype_of<T> == dtype(), DTypeError, "data_ptr: tensor has dtype ", dtype(), ", asked for ", dtype_of<T>);
    return static_cast<T*>(raw_data());
  }

  // Version counter: bumped by every in-place op; saved tensors compare against it.
  uint32_t version() const { return *checked("version").version; }
  void bump_version() const { ++*checked("bump_version").version; }

  // --- autograd state (meaning given by autograd/; see core/autograd_hooks.h) ---
  bool requires_grad() const {
    const TensorImpl& i = checked("requires_grad");
    return i.autograd && i.autograd->requires_grad();
  }
  // Only leaves may be flagged; raises mg::AutogradError on a non-leaf or integer tensor, or
  // when turning it on in a binary without //autograd.
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  bool is_leaf() const {
    const TensorImpl& i = checked("is_leaf");
    return !i.autograd || i.autograd->is_leaf();
  }
  void retain_grad() const;
  // Shares storage, no autograd history.
  Tensor detach() const;
  // Backpropagates from this tensor (mg::AutogradError without //autograd).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

  // --- views and conversions: raw:: ones in //core alone, differentiable once //autograd
  // is linked (each dispatches through the installed AutogradHooks) ---
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor contiguous() const;
  // The same values in `fmt`'s layout: this tensor when it already is, else a copy (the
  // gradient flows back unchanged). ChannelsLast needs a 4-D tensor (mg::ShapeError).
  Tensor contiguous(MemoryFormat fmt) const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }

  // --- in-place (version-counted; recorded on the tape once //autograd is linked) ---
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_();

  // --- host access ---
  double item() const;  // one-element tensor as double
  template <class T>
  T item() const {
    return static_cast<T>(item());
  }
  // Copies all elements (in logical order) to the host, converted to T.
  template <class T>
  std::vector<T> to_vector() const;
  std::string str() const;

 private:
  TensorImpl& checked(const char* method) const {
    if (!impl_) [[unlikely]]
      throw_undefined_tensor(method);
    return *impl_;
  }

  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// --- factories (core: never differentiable, but may create leaves with requires_grad) ---
Tensor empty(const Shape& shape, TensorOptions opts = {});
// Uninitialized, in `fmt`'s layout (ChannelsLast: shape must be 4-D, mg::ShapeError otherwise).
Tensor empty(const Shape& shape, TensorOptions opts, MemoryFormat fmt);
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor scalar_tensor(double value, TensorOptions opts = {});
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {DType::i64});
Tensor arange(int64_t end, TensorOptions opts = {DType::i64});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts = {dtype_of<T>});
// Convenience: a float tensor from a flat list, e.g. tensor({1, 2, 3, 4}, {2, 2}).
Tensor tensor(std::initializer_list<double> values, const Shape& shape, TensorOptions opts = {});

// a * b and a + b for sizes, strides, offsets and byte counts: the one overflow check every size
// computation in core goes through. Overflow is an mg::ShapeError naming `op` and both operands.
[[noreturn]] void throw_size_overflow(const char* op, int64_t a, int64_t b, char sign);
inline int64_t checked_mul(int64_t a, int64_t b, const char* op) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    throw_size_overflow(op, a, b, '*');
  return r;
}
inline int64_t checked_add(int64_t a, int64_t b, const char* op) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    throw_size_overflow(op, a, b, '+');
  return r;
}
// Contiguous strides for a shape (checked).
Shape contiguous_strides(const Shape& shape);
// NHWC strides for a 4-D [N, C, H, W] shape (checked; mg::ShapeError naming `op` otherwise).
Shape channels_last_strides(const Shape& shape, const char* op = "channels_last_strides");
// The layout t is in: ChannelsLast when it is channels-last and not also contiguous (C == 1
// or H = W = 1 are both at once; those count as Contiguous), else Contiguous.
MemoryFormat suggest_memory_format(const Tensor& t);
// suggest_memory_format(t) == ChannelsLast: t's NHWC strides are not also NCHW ones.
bool is_channels_last(const Tensor& t);
// The layout of an elementwise result of shape `shape`: ChannelsLast when one of the
// operands has that shape and is channels-last (suggest_memory_format), else Contiguous. So
// relu, residual adds and casts of an NHWC activation stay NHWC, as in PyTorch.
MemoryFormat result_memory_format(const Shape& shape, std::initializer_list<const Tensor*> operands);
// True when a and b have the same sizes and the same strides (size-1 dims aside) and are
// dense: element k of a's memory is element k of b's, so a kernel can walk both as flat
// arrays (a contiguous or channels-last fast path).
bool same_dense_layout(const Tensor& a, const Tensor& b);
// The product of the sizes (checked; `op` names the caller in the error).
int64_t shape_numel(const Shape& shape, const char* op = "numel");
// Bytes of a contiguous tensor: validates the shape (sizes >= 0, mg::ShapeError naming `op`
// otherwise) and checks numel * dtype_size for overflow.
size_t storage_nbytes(const Shape& shape, DType dtype, const char* op);
// Wraps a possibly negative dim into [0, ndim) (a 0-dim tensor takes -1 and 0, as in
// PyTorch); raises mg::IndexError naming `op`.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// Raw (non-differentiable) building blocks used by kernels/ and autograd/.
namespace raw {
// A view of t's storage; mg::ShapeError unless sizes are >= 0, strides >= 0 and every element
// of the view lies inside the storage.
Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset);
Tensor view(const Tensor& t, const Shape& shape);  // -1 allowed once; must be viewable
bool viewable(const Tensor& t, const Shape& shape, Shape* strides_out);
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);
Tensor reshape(const Tensor& t, const Shape& shape);  // view if possible, else copy
Tensor permute(const Tensor& t, const Shape& dims);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t);                                      // every size-1 dim
Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim);  // view if possible, else copy
Tensor t(const Tensor& t);                                            // <= 2 dims
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor contiguous(const Tensor& t);
Tensor contiguous(const Tensor& t, MemoryFormat fmt);  // t itself when already in fmt, else a copy
Tensor clone(const Tensor& t);                         // contiguous
Tensor to_dtype(const Tensor& t, DType dtype);         // keeps a channels-last layout
Tensor to_device(const Tensor& t, Device device, bool non_blocking = false);
// dst[...] = src[...] with broadcasting of src to dst's shape and dtype conversion.
void copy_(const Tensor& dst, const Tensor& src, bool non_blocking = false);
void fill_(const Tensor& dst, double value);
}  // namespace raw

// CUDA hooks: the CUDA backend registers these at start-up; the CPU build leaves them null.
struct CudaHooks {
  void (*copy)(const Tensor& dst, const Tensor& src, bool non_blocking) = nullptr;  // any side on CUDA
  void (*fill)(const Tensor& dst, double value) = nullptr;
  // device_offset: null, or a device counter added to `offset` when the kernel runs (capture).
  void (*philox_fill)(const Tensor& dst, int kind, uint64_t seed, uint64_t offset, double a, double b,
                      const int64_t* device_offset) = nullptr;
};
CudaHooks& cuda_hooks();

}  // namespace mg
