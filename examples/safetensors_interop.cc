// Writes and checks safetensors files for the PyTorch interop check (bench/pytorch/read_safetensors.py):
//   safetensors_interop write PATH   one tensor of every dtype, values from the formulas below
//   safetensors_interop check PATH   loads a file PyTorch wrote and checks the same formulas
// Both sides compute the expected values independently: element i (flat, row-major) of a
// floating tensor is (i % 17) * 0.25 - 2 (exact in f16/bf16), i64: i * 1000003 - 500000000000,
// i32: i * 7919 - 100000, u8: (i * 37) % 256, bool: i % 3 == 0.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"
#include "serialize/serialize.h"

namespace {

using mg::DType;
using mg::Shape;
using mg::Tensor;

struct Spec {
  const char* name;
  DType dtype;
  Shape shape;
};
const std::vector<Spec> kSpecs = {
    {"f64", DType::f64, {3, 4}},
    {"f32", DType::f32, {2, 3, 4}},
    {"f16", DType::f16, {5}},
    {"bf16", DType::bf16, {2, 8}},
    {"i64", DType::i64, {6}},
    {"i32", DType::i32, {3, 3}},
    {"u8", DType::u8, {10}},
    {"bool", DType::b8, {7}},
    {"scalar", DType::f32, {}},
    {"empty", DType::f32, {0, 4}},
    {"layers.0.weight", DType::f32, {4, 2}},
};

double expected(DType d, int64_t i) {
  switch (d) {
    case DType::i64:
      return static_cast<double>(i * 1000003 - 500000000000LL);
    case DType::i32:
      return static_cast<double>(i * 7919 - 100000);
    case DType::u8:
      return static_cast<double>((i * 37) % 256);
    case DType::b8:
      return i % 3 == 0 ? 1.0 : 0.0;
    default:
      return static_cast<double>(i % 17) * 0.25 - 2.0;
  }
}

Tensor make(const Spec& s) {
  std::vector<double> v(static_cast<size_t>(mg::shape_numel(s.shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = expected(s.dtype, static_cast<int64_t>(i));
  return mg::from_vector(v, s.shape, {s.dtype});
}

int check(const std::string& path) {
  mg::StateDict sd = mg::serialize::load(path);
  int bad = 0;
  for (const Spec& s : kSpecs) {
    auto it = sd.tensors.find(s.name);
    if (it == sd.tensors.end()) {
      std::printf("MISSING %s\n", s.name);
      ++bad;
      continue;
    }
    const Tensor& t = it->second;
    if (t.dtype() != s.dtype || t.sizes() != s.shape) {
      std::printf("MISMATCH %s: %s %s, expected %s %s\n", s.name, mg::dtype_name(t.dtype()),
                  mg::shape_str(t.sizes()).c_str(), mg::dtype_name(s.dtype), mg::shape_str(s.shape).c_str());
      ++bad;
      continue;
    }
    // Compared as doubles: every expected value here is below 2^53 in magnitude, so exact.
    std::vector<double> v = t.to_vector<double>();
    int wrong = 0;
    for (size_t i = 0; i < v.size(); ++i) wrong += v[i] != expected(s.dtype, static_cast<int64_t>(i));
    std::printf("%-16s %-5s %-10s %s\n", s.name, mg::serialize::safetensors_dtype(s.dtype),
                mg::shape_str(s.shape).c_str(), wrong ? "WRONG VALUES" : "ok");
    bad += wrong != 0;
  }
  std::printf("meta: %s\n", sd.meta.dump().c_str());
  std::printf("%s: %zu tensors, %d problems\n", bad ? "FAIL" : "PASS", sd.tensors.size(), bad);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::fprintf(stderr, "usage: %s write|check PATH\n", argv[0]);
    return 2;
  }
  try {
    if (std::strcmp(argv[1], "check") == 0) return check(argv[2]);
    mg::StateDict sd;
    for (const Spec& s : kSpecs) sd.tensors[s.name] = make(s);
    sd.meta = {{"step", 42}, {"writer", "memgrad"}};
    mg::serialize::save(sd, argv[2]);
    std::printf("wrote %zu tensors to %s\n", sd.tensors.size(), argv[2]);
    return 0;
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
