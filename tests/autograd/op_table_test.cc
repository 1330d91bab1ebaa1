// Runs the op table (op_table.h): every row's gradient against finite differences in f64 on
// the CPU, and its forward result and gradients on the CUDA device against the CPU in f32,
// f16, bf16 and f64. A public op of autograd/functions.h without a row fails the build's tests.
// MG_TEST_SEED reseeds the inputs; --gtest_filter='*softmax*' picks ops, as ggml's -o does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/source_path.h"
#include "autograd/functions.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "kernels/ops.h"
#include "tests/autograd/op_table.h"
#include "tests/rounding.h"

namespace mg::op_table {
namespace {

uint64_t test_seed() {
  const char* s = std::getenv("MG_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20240611;
}

// Fresh f64 CPU inputs for a row (never zeros: random draws, shaped by the row's Init).
V make_inputs(const Row& row) {
  Generator gen(test_seed() + std::hash<std::string>{}(row.name));
  V inputs;
  for (const Shape& s : row.shapes) {
    Tensor z =
        row.init == Init::Uniform ? uniform(s, row.lo, row.hi, {DType::f64}, &gen) : randn(s, {DType::f64}, &gen);
    if (row.init == Init::Positive) {
      z = add(abs(z), 0.5);
    } else if (row.init == Init::AwayFromZero) {
      z = mul(kernels::unary(kernels::Unary::Sign, z), add(abs(z), 0.5));
    }
    inputs.push_back(z.detach());
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (std::find(row.constant.begin(), row.constant.end(), i) == row.constant.end()) inputs[i].requires_grad_(true);
  return inputs;
}

std::string row_name(const ::testing::TestParamInfo<Row>& info) { return info.param.name; }

// ---------------------------------------------------------------- (a) finite differences

class OpGradcheck : public ::testing::TestWithParam<Row> {};

TEST_P(OpGradcheck, MatchesFiniteDifferences) {
  const Row& row = GetParam();
  // 64 elements per input keep the parity-sized rows (up to 300k elements) to a fraction of
  // a second; small rows are checked element by element.
  EXPECT_TRUE(gradcheck(row.fn, make_inputs(row), row.eps, row.atol, row.rtol, /*max_checked=*/64));
}

INSTANTIATE_TEST_SUITE_P(Ops, OpGradcheck, ::testing::ValuesIn(all_rows()), row_name);

// ---------------------------------------------------------------- (b) device vs CPU

using ::mg::testing::unit_roundoff;

// See Row::roundings / Row::cond: low-precision roundings of the result plus the growth of
// the accumulator's error (f32 for every dtype but f64). In f64 the CPU reference makes errors
// of the same size as the device's, so the bound counts both sides.
double tolerance(const Row& row, DType dt, double roundings) {
  const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;
  const double tol = roundings * unit_roundoff(dt) + row.cond * unit_roundoff(acc);
  return dt == DType::f64 ? 2 * tol : tol;
}

// Below the smallest normal number results are spaced absolutely (f16's spacing 2^-24 is large
// enough to matter for a mean's gradient over 10^5 elements); one spacing per rounding.
double subnormal_floor(DType dt, double roundings) {
  switch (dt) {
    case DType::f16:
      return roundings * std::ldexp(1.0, -24);
    case DType::bf16:
      return roundings * std::ldexp(1.0, -133);
    case DType::f32:
      return roundings * std::ldexp(1.0, -149);
    default:
      return 0;
  }
}

// The best a device result in dtype dt can be is the exact value rounded to dt (a half sum of
// 10^5 ones is inf): compare with that.
Tensor rounded(const Tensor& ref, DType dt) { return raw::to_dtype(raw::to_dtype(ref, dt), DType::f64); }

// One dtype: the inputs are rounded to dt first and the CPU reference runs in f64 on those very
// values, so only the device's own error is measured. The output gradient is rounded the same way.
void check_device(const Row& row, DType dt) {
  SCOPED_TRACE(std::string("dtype ") + dtype_name(dt));
  const V base = make_inputs(row);
  V ref, dev;
  for (const Tensor& t : base) {
    Tensor r = raw::to_dtype(raw::to_dtype(t, dt), DType::f64);
    Tensor d = raw::to_device(raw::to_dtype(t, dt), Device::cuda(0));
    if (t.requires_grad()) r.requires_grad_(true), d.requires_grad_(true);
    ref.push_back(r);
    dev.push_back(d);
  }
  Tensor y_ref, y_dev;
  {
    EnableGradGuard grad_on(true);
    y_ref = row.fn(ref);
    y_dev = row.fn(dev);
  }
  ASSERT_TRUE(y_dev.is_cuda()) << "the row ran on " << y_dev.device();
  EXPECT_TRUE(parity(rounded(y_ref, y_dev.dtype()), y_dev, tolerance(row, dt, row.roundings),
                     subnormal_floor(y_dev.dtype(), row.roundings)))
      << "forward";
  const double grad_roundings = row.grad_roundings > 0 ? row.grad_roundings : row.roundings;
  Generator wgen(0x9c4ecc);
  Tensor w = raw::to_dtype(randn(y_ref.sizes(), {DType::f64}, &wgen), y_dev.dtype());
  {
    EnableGradGuard grad_on(true);
    y_ref.backward(raw::to_dtype(w, DType::f64));
    y_dev.backward(raw::to_device(w, Device::cuda(0)));
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!ref[i].requires_grad()) continue;
    ASSERT_EQ(ref[i].grad().defined(), dev[i].grad().defined()) << "gradient of input " << i;
    if (!ref[i].grad().defined()) continue;
    EXPECT_TRUE(dev[i].grad().is_cuda()) << "gradient of input " << i;
    EXPECT_EQ(dev[i].grad().dtype(), dt) << "gradient of input " << i;
    EXPECT_TRUE(parity(rounded(ref[i].grad(), dt), dev[i].grad(), tolerance(row, dt, grad_roundings),
                       subnormal_floor(dt, grad_roundings)))
        << "gradient of input " << i;
  }
}

class OpDeviceParity : public ::testing::TestWithParam<Row> {};

TEST_P(OpDeviceParity, MatchesCpu) {
  const Row& row = GetParam();
  if (row.device_dtypes.empty()) GTEST_SKIP() << "CPU-only row (the reason is at the row)";
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : row.device_dtypes) check_device(row, dt);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpDeviceParity, ::testing::ValuesIn(all_rows()), row_name);

// ---------------------------------------------------------------- the table itself

// Public functions that return a Tensor but have no gradient to check: comparisons and
// index-valued results (b8 / i64 outputs). Their device parity lives in
// tests/kernels/cuda/cuda_parity_test.cc (comparisons, argmax, one_hot).
const std::set<std::string> kNotDifferentiable = {"eq", "ne", "lt", "le", "gt", "ge", "argmax", "one_hot"};

using test::source_path;

// `Tensor name(`, `Tensor& name(` and `std::pair<Tensor, Tensor> name(` declarations in the
// header and in the autograd/ headers it includes.
void public_ops(const std::string& rel, std::set<std::string>& seen_files, std::map<std::string, std::string>& ops) {
  if (!seen_files.insert(rel).second) return;
  std::ifstream in(source_path(rel));
  ASSERT_TRUE(in) << "cannot read " << source_path(rel) << ": add it to the test's data in BUILD.bazel";
  static const std::regex decl(R"(^\s*(?:Tensor&?|std::pair<Tensor,\s*Tensor>)\s+(\w+)\()");
  static const std::regex include(R"re(^#include "(autograd/[\w/]+\.h)")re");
  std::string line;
  std::smatch m;
  std::vector<std::string> includes;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, decl)) ops.emplace(m[1], rel);
    if (std::regex_search(line, m, include)) includes.push_back(m[1]);
  }
  for (const std::string& inc : includes) public_ops(inc, seen_files, ops);
}

TEST(OpTable, EveryPublicOpHasARow) {
  std::set<std::string> files;
  std::map<std::string, std::string> ops;
  public_ops("autograd/functions.h", files, ops);
  ASSERT_TRUE(!HasFatalFailure());
  // A parser that silently found nothing would pass everything.
  ASSERT_GE(ops.size(), 60u) << "the declaration pattern no longer matches autograd/functions.h";
  std::set<std::string> covered;
  for (const Row& r : all_rows()) covered.insert(r.op);
  for (const auto& [op, file] : ops) {
    if (kNotDifferentiable.count(op)) {
      EXPECT_FALSE(covered.count(op)) << op << " has rows now: take it off kNotDifferentiable";
      continue;
    }
    EXPECT_TRUE(covered.count(op)) << op << " (" << file << ") has no row in tests/autograd/op_table_*.cc";
  }
  for (const std::string& op : kNotDifferentiable) EXPECT_TRUE(ops.count(op)) << op << " is exempt but not declared";
}

TEST(OpTable, RowsAreUniqueAndRunOnTheDevice) {
  const std::vector<Row> rows = all_rows();
  std::set<std::string> names;
  size_t device_rows = 0;
  for (const Row& r : rows) {
    EXPECT_TRUE(names.insert(r.name).second) << "duplicate row " << r.name;
    EXPECT_FALSE(r.op.empty()) << r.name;
    EXPECT_FALSE(r.shapes.empty()) << r.name;
    device_rows += !r.device_dtypes.empty();
  }
  // CPU-only rows are exceptions with a reason each, not a way to skip the device.
  EXPECT_LE(rows.size() - device_rows, 5u);
}

// softplus past its threshold is x itself, with gradient 1, where log1p(exp(x)) would overflow
// in f32 (exp(100) = inf); far below it the value and gradient underflow towards 0, never
// negative or NaN. Exact comparisons: above the threshold the op returns its input unchanged.
TEST(OpTable, SoftplusThresholdAndTails) {
  std::vector<Device> devices{Device::cpu()};
  if (cuda::device_count() > 0) devices.push_back(Device::cuda(0));
  for (const Device& d : devices)
    for (DType t : {DType::f32, DType::f64}) {
      SCOPED_TRACE(d.str() + " " + dtype_name(t));
      Tensor x = tensor({25.0, 100.0, 1e4, -100.0}, {4}, {t}).to(d).requires_grad_(true);
      Tensor y = softplus(x);
      sum(y).backward();
      const auto v = y.cpu().to_vector<double>(), g = x.grad().cpu().to_vector<double>();
      const auto in = x.detach().cpu().to_vector<double>();
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(v[i], in[i]);
        EXPECT_EQ(g[i], 1.0);
      }
      EXPECT_GE(v[3], 0.0);
      EXPECT_LT(v[3], 1e-40);
      EXPECT_GE(g[3], 0.0);
      EXPECT_LT(g[3], 1e-40);
    }
  EXPECT_THROW(softplus(ones({2}), 0.0), ValueError);
}

}  // namespace
}  // namespace mg::op_table
