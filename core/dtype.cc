#include "core/dtype.h"

#include <ostream>

#include "core/enum_name.h"

namespace mg {

uint16_t Half::from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {
    // Subnormal half (or zero): shift the mantissa with round-to-nearest-even.
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = absu >> 23;
    uint32_t m = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (113 - e) ... maps to half subnormal
    uint32_t half_m = m >> (shift);
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t e = ((absu >> 23) - 112) << 10;
  uint32_t m = (absu >> 13) & 0x3ffu;
  uint32_t h = e | m;
  uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float Half::to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t u;
  if (e == 0) {
    if (m == 0) {
      u = sign;
    } else {
      // Normalize the subnormal.
      int shift = 0;
      while (!(m & 0x400u)) {
        m <<= 1;
        ++shift;
      }
      m &= 0x3ffu;
      u = sign | ((113u - shift) << 23) | (m << 13);
    }
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

size_t dtype_size(DType t) {
  size_t size = 0;
  visit_dtype<HostTypes>(AllDTypes{}, t, [&](auto tag) { size = sizeof(typename decltype(tag)::type); });
  return size;
}

// Indexed by DType. Like PyTorch's promotion lattice: bool < u8 < i32 < i64 < f16/bf16 < f32 < f64;
// f16 with bf16 promotes to f32.
constexpr int kPromotionRank[] = {6, 5, 4, 4, 3, 2, 1, 0};

const char* dtype_name(DType t) { return enum_name(t, {"f64", "f32", "f16", "bf16", "i64", "i32", "u8", "bool"}); }

bool is_floating(DType t) { return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16; }
bool is_integral(DType t) { return !is_floating(t); }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  return kPromotionRank[static_cast<size_t>(a)] >= kPromotionRank[static_cast<size_t>(b)] ? a : b;
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace mg
