// Element types: the DType enum, host half/bfloat16 types and the dispatch macros that
// turn a runtime DType into a C++ type inside kernels.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace mg {

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

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::b8;
};
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// The type arithmetic on T is carried out in (half types compute in float).
template <class T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<Half> {
  using type = float;
};
template <>
struct OpMath<BFloat16> {
  using type = float;
};
template <class T>
using opmath_t = typename OpMath<T>::type;

}  // namespace mg

#define MG_DTYPE_CASE(enum_v, T, ...) \
  case ::mg::DType::enum_v: {         \
    using scalar_t = T;               \
    __VA_ARGS__();                    \
    break;                            \
  }

// MG_DISPATCH_ALL(dtype, "op", [&] { ... scalar_t ... });
#define MG_DISPATCH_ALL(DT, NAME, ...)                                \
  switch (DT) {                                                       \
    MG_DTYPE_CASE(f64, double, __VA_ARGS__)                           \
    MG_DTYPE_CASE(f32, float, __VA_ARGS__)                            \
    MG_DTYPE_CASE(f16, ::mg::Half, __VA_ARGS__)                       \
    MG_DTYPE_CASE(bf16, ::mg::BFloat16, __VA_ARGS__)                  \
    MG_DTYPE_CASE(i64, int64_t, __VA_ARGS__)                          \
    MG_DTYPE_CASE(i32, int32_t, __VA_ARGS__)                          \
    MG_DTYPE_CASE(u8, uint8_t, __VA_ARGS__)                           \
    MG_DTYPE_CASE(b8, bool, __VA_ARGS__)                              \
    default:                                                          \
      MG_THROW(::mg::DTypeError, NAME, ": unsupported dtype ", (DT)); \
  }

// Floating types only (f64, f32, f16, bf16).
#define MG_DISPATCH_FLOAT(DT, NAME, ...)                                           \
  switch (DT) {                                                                    \
    MG_DTYPE_CASE(f64, double, __VA_ARGS__)                                        \
    MG_DTYPE_CASE(f32, float, __VA_ARGS__)                                         \
    MG_DTYPE_CASE(f16, ::mg::Half, __VA_ARGS__)                                    \
    MG_DTYPE_CASE(bf16, ::mg::BFloat16, __VA_ARGS__)                               \
    default:                                                                       \
      MG_THROW(::mg::DTypeError, NAME, ": expected a floating dtype, got ", (DT)); \
  }

// Integer index types (i64, i32).
#define MG_DISPATCH_INDEX(DT, NAME, ...)                                                      \
  switch (DT) {                                                                               \
    MG_DTYPE_CASE(i64, int64_t, __VA_ARGS__)                                                  \
    MG_DTYPE_CASE(i32, int32_t, __VA_ARGS__)                                                  \
    default:                                                                                  \
      MG_THROW(::mg::DTypeError, NAME, ": expected an index dtype (i64 or i32), got ", (DT)); \
  }
