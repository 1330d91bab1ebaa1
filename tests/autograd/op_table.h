// The one op table (ggml's tests/test-backend-ops.cpp, for memgrad): a row per case of every
// public differentiable op, run by op_table_test.cc through finite differences and device parity.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "tests/autograd/gradcheck.h"

namespace mg::op_table {

using V = std::vector<Tensor>;

// How a row's fresh random inputs are drawn so the op is smooth (and defined) around them.
enum class Init {
  Normal,        // N(0, 1)
  Positive,      // |N(0, 1)| + 0.5      (log, sqrt, pow)
  AwayFromZero,  // sign(z) (|z| + 0.5)  (abs, div denominators)
  Uniform,       // U(lo, hi)            (the ranges the kernel parity tables used)
};

struct Row {
  std::string name;           // unique: the gtest name
  std::string op;             // the public function (or Tensor method) the row checks: the coverage key
  std::vector<Shape> shapes;  // one input per shape, f64 on the CPU, fresh random values
  GradFn fn;                  // must be deterministic and build its constants on its inputs' device
  Init init = Init::Normal;
  double lo = -2, hi = 2;  // Init::Uniform's range
  // Inputs (by position) that stay constants: no gradient, not perturbed.
  std::vector<size_t> constant = {};
  // Finite differences in f64 (gradcheck's arguments).
  double eps = 1e-6, atol = 1e-5, rtol = 1e-4;
  // Device parity, per dtype dt: tol(dt) = roundings * u(dt) + cond * u(acc(dt)), where u is the
  // unit roundoff (f64 2^-53, f32 2^-24, f16 2^-11, bf16 2^-8) and acc(dt) the accumulator
  // (f64 for f64, else f32: half kernels accumulate in f32). `roundings` counts the
  // low-precision roundings a result passes through (the op's output, each intermediate of a
  // composed op, each gradient node), `cond` the growth of accumulation error (about the
  // square root of the longest reduction, times the op's conditioning). The defaults were set
  // on an H200 over 30 input seeds: 4 and 16 left a tail of cases cancelling a little more.
  double roundings = 6, cond = 32;
  // The gradients' roundings where a backward is worse conditioned than its forward (0: the same).
  double grad_roundings = 0;
  // The dtypes the device runs; empty = CPU only, with the reason at the row.
  std::vector<DType> device_dtypes = {DType::f32, DType::f16, DType::bf16, DType::f64};
};

// A builder that keeps the rows one line each: add("name", "op", shapes, fn) returns the row
// for the few fields a case changes.
class Table {
 public:
  Row& add(std::string name, std::string op, std::vector<Shape> shapes, GradFn fn, Init init = Init::Normal) {
    rows_.push_back(Row{std::move(name), std::move(op), std::move(shapes), std::move(fn), init});
    return rows_.back();
  }
  std::vector<Row>& rows() { return rows_; }
  std::vector<Row> take() { return std::move(rows_); }
  // The rows the sections add, in order (each section fills a Table).
  static std::vector<Row> of(std::initializer_list<void (*)(Table&)> sections) {
    Table t;
    for (auto section : sections) section(t);
    return t.take();
  }

 private:
  std::vector<Row> rows_;
};

// A constant (index tensor, mask, running statistics) moved to where `like` lives, so the same
// row runs on the CPU and on the device.
inline Tensor on(const Tensor& like, const Tensor& t) { return raw::to_device(t, like.device()); }
inline Tensor idx(const Tensor& like, const std::vector<int64_t>& v, const Shape& shape) {
  return on(like, from_vector<int64_t>(v, shape));
}
inline Tensor mask(const Tensor& like, const std::vector<bool>& v, const Shape& shape) {
  return on(like, from_vector<bool>(v, shape));
}
// A floating constant in like's dtype and device.
inline Tensor constant(const Tensor& like, std::initializer_list<double> v, const Shape& shape) {
  return raw::to_dtype(on(like, tensor(v, shape, {DType::f64})), like.dtype());
}

std::vector<Row> math_rows();  // op_table_math.cc: elementwise, reductions, linear algebra, softmax, views
std::vector<Row> nn_rows();    // op_table_nn.cc: indexing, losses, dropout, in-place, conv/pool/norm, attention

inline std::vector<Row> all_rows() {
  std::vector<Row> r = math_rows(), n = nn_rows();
  r.insert(r.end(), n.begin(), n.end());
  return r;
}

}  // namespace mg::op_table
