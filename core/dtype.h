// Element types: the DType enum, host half/bfloat16 types and the dispatch macros that
// turn a runtime DType into a C++ type inside kernels.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace mg {

// Floating -> integer conversion defined for every input (C++ leaves NaN and out-of-range values
// undefined): NaN gives 0, values beyond int64's range saturate to its limits, and the int64
// then narrows to a smaller integer type modulo 2^bits like any integer conversion. The CUDA
// casts (core/cuda/dtype_cuda.cuh, from_double) do the same, so both devices agree bit for bit.
inline int64_t float_to_int64(double v) {
  if (v != v) return 0;
  if (v >= 0x1p63) return INT64_MAX;
  if (v < -0x1p63) return INT64_MIN;
  return static_cast<int64_t>(v);
}

enum class DType : uint8_t { f64, f32, f16, bf16, i64, i32, u8, b8 };

// IEEE binary16 on the host; arithmetic goes through float.
struct Half {
  uint16_t x = 0;
  Half() = default;
  Half(float f) : x(from_float(f)) {}  // NOLINT: implicit like a builtin float type
  operator float() const { return to_float(x); }
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// bfloat16 on the host (round to nearest even); arithmetic goes through float.
struct BFloat16 {
  uint16_t x = 0;
  BFloat16() = default;
  BFloat16(float f) : x(from_float(f)) {}  // NOLINT
  operator float() const { return to_float(x); }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool is_floating(DType t);
bool is_integral(DType t);  // i64, i32, u8, b8
DType promote_types(DType a, DType b);
std::ostream& operator<<(std::ostream& os, DType t);

// The C++ element type of each DType, in the enum's order: the one table from a runtime dtype to
// a type. Host code uses HostTypes; CUDA code (core/cuda/dtype_cuda.cuh) swaps in __half and
// __nv_bfloat16 for the 16-bit floats.
template <class... Ts>
struct TypeList {};
template <class F16, class BF16>
using ElementTypes = TypeList<double, float, F16, BF16, int64_t, int32_t, uint8_t, bool>;
using HostTypes = ElementTypes<Half, BFloat16>;

namespace detail {
template <class T, class... Ts>
constexpr int index_of(TypeList<Ts...>) {
  constexpr bool same[] = {std::is_same_v<T, Ts>...};
  for (int i = 0; i < static_cast<int>(sizeof...(Ts)); ++i)
    if (same[i]) return i;
  return static_cast<int>(sizeof...(Ts));
}
template <size_t I, class T, class... Ts>
struct TypeAt : TypeAt<I - 1, Ts...> {};
template <class T, class... Ts>
struct TypeAt<0, T, Ts...> {
  using type = T;
};
template <size_t I, class List>
struct TypeAtList;
template <size_t I, class... Ts>
struct TypeAtList<I, TypeList<Ts...>> : TypeAt<I, Ts...> {};
}  // namespace detail

// The DType of a host element type T (dtype_of<float> == DType::f32).
template <class T>
inline constexpr DType dtype_of = [] {
  constexpr int i = detail::index_of<T>(HostTypes{});
  static_assert(i < 8, "dtype_of: not a memgrad element type");
  return static_cast<DType>(i);
}();
// The element type of DType D in the list Types (dtype_type<HostTypes, DType::f16> is Half).
template <class Types, DType D>
using dtype_type = typename detail::TypeAtList<static_cast<size_t>(D), Types>::type;

template <class T>
struct TypeTag {
  using type = T;
};

// A set of dtypes, for visit_dtype; the sets the dispatch macros accept.
template <DType... Ds>
struct DTypeSet {};
using AllDTypes =
    DTypeSet<DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8, DType::b8>;
using FloatDTypes = DTypeSet<DType::f64, DType::f32, DType::f16, DType::bf16>;
using IntegralDTypes = DTypeSet<DType::i64, DType::i32, DType::u8, DType::b8>;
using IndexDTypes = DTypeSet<DType::i64, DType::i32>;

// The one runtime-dtype-to-type switch: calls f(TypeTag<T>{}) with T the element type of `t` in
// Types, if `t` is in the set; returns whether it was. The MG_DISPATCH_* macros below (and
// MG_CUDA_DISPATCH_* for device types) are this with the message for a dtype outside the set.
template <class Types, DType... Accepted, class F>
bool visit_dtype(DTypeSet<Accepted...>, DType t, F&& f) {
  return ((t == Accepted && (f(TypeTag<dtype_type<Types, Accepted>>{}), true)) || ...);
}

// The type arithmetic on T is carried out in (half types compute in float).
template <class T>
using opmath_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

}  // namespace mg

// MG_DISPATCH_ALL(dtype, "op", [&] { ... scalar_t ... }) runs the lambda with scalar_t the
// element type of dtype, or throws DTypeError naming the op and the dtype.
#define MG_DISPATCH_TYPES(TYPES, SET, DT, NAME, WHAT, ...)         \
  do {                                                             \
    if (!::mg::visit_dtype<TYPES>(SET{}, (DT), [&](auto mg_tag_) { \
          using scalar_t = typename decltype(mg_tag_)::type;       \
          __VA_ARGS__();                                           \
        }))                                                        \
      MG_THROW(::mg::DTypeError, NAME, WHAT, (DT));                \
  } while (0)

#define MG_DISPATCH_ALL(DT, NAME, ...) \
  MG_DISPATCH_TYPES(::mg::HostTypes, ::mg::AllDTypes, DT, NAME, ": unsupported dtype ", __VA_ARGS__)
// Floating types only (f64, f32, f16, bf16).
#define MG_DISPATCH_FLOAT(DT, NAME, ...) \
  MG_DISPATCH_TYPES(::mg::HostTypes, ::mg::FloatDTypes, DT, NAME, ": expected a floating dtype, got ", __VA_ARGS__)
// Integer index types (i64, i32).
#define MG_DISPATCH_INDEX(DT, NAME, ...)                                                                          \
  MG_DISPATCH_TYPES(::mg::HostTypes, ::mg::IndexDTypes, DT, NAME, ": expected an index dtype (i64 or i32), got ", \
                    __VA_ARGS__)
