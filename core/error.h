// Errors raised by memgrad: one base class, a subclass per kind of mistake, and the
// MG_CHECK macro that builds a message naming the op and the offending values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Wrong shapes (matmul inner dims, broadcast, view of an incompatible size).
class ShapeError : public Error {
  using Error::Error;
};
// Unsupported or mismatched dtypes.
class DTypeError : public Error {
  using Error::Error;
};
// Tensors on different devices, or a device that does not exist.
class DeviceError : public Error {
  using Error::Error;
};
// Out-of-range dims or indices (class labels, gather/scatter indices).
class IndexError : public Error {
  using Error::Error;
};
// Any other invalid argument value.
class ValueError : public Error {
  using Error::Error;
};
// Autograd misuse: backward twice without retain_graph, in-place on a saved tensor.
class AutogradError : public Error {
  using Error::Error;
};
// I/O and file-format problems (truncated or corrupt files).
class IOError : public Error {
  using Error::Error;
};
// A CUDA / cuBLAS / cuDNN / NCCL call failed.
class CudaError : public Error {
  using Error::Error;
};
// The allocator could not satisfy a request; its state stays consistent.
class OutOfMemoryError : public Error {
  using Error::Error;
};

namespace detail {
inline void format_into(std::ostringstream&) {}
template <class T, class... Rest>
void format_into(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  format_into(os, rest...);
}
template <class... Args>
std::string format(const Args&... args) {
  std::ostringstream os;
  format_into(os, args...);
  return os.str();
}
}  // namespace detail

}  // namespace mg

// MG_CHECK(cond, ErrorType, "op: ", a, " vs ", b) throws ErrorType with the
// concatenated message when cond is false. The message should start with the op name.
#define MG_CHECK(cond, ErrorType, ...)                               \
  do {                                                               \
    if (!(cond)) throw ErrorType(::mg::detail::format(__VA_ARGS__)); \
  } while (0)

#define MG_THROW(ErrorType, ...) throw ErrorType(::mg::detail::format(__VA_ARGS__))
