// The finite-difference checker itself (tests/autograd/gradcheck.h): it must catch a wrong
// backward and say where. The op rows it runs live in the op table (op_table_*.cc).
#include <string>
#include <vector>

#include "autograd/node.h"
#include "kernels/ops.h"
#include "tests/autograd/gradcheck.h"

namespace mg {
namespace {

using V = std::vector<Tensor>;

// The checker itself must fail on a wrong backward, and say where.
TEST(GradcheckSelfTest, CatchesAWrongGradient) {
  GradFn wrong_square = [](const V& x) {
    Tensor out = kernels::unary(kernels::Unary::Square, x[0]);
    autograd::record("wrong_square", {x[0]}, out, [](const V& g) { return V{g[0]}; });  // forgot the 2x
    return out;
  };
  Generator gen(1);
  Tensor x = randn({2, 3}, {DType::f64}, &gen);
  x.requires_grad_(true);
  ::testing::AssertionResult r = gradcheck(wrong_square, {x});
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("input 0 [2, 3] element 0: analytic"), std::string::npos) << r.message();
  EXPECT_TRUE(gradcheck([](const V& v) { return square(v[0]); }, {x}));
  EXPECT_FALSE(x.grad().defined()) << "gradcheck works on copies of the inputs";
  EXPECT_FALSE(gradcheck([](const V& v) { return square(v[0]); }, {x.detach()})) << "nothing requires grad";
  // Checking a spread of elements (large op-table rows) still sees a wrong gradient.
  Tensor big = randn({1000}, {DType::f64}, &gen);
  big.requires_grad_(true);
  ::testing::AssertionResult sampled = gradcheck(wrong_square, {big}, 1e-6, 1e-5, 1e-4, /*max_checked=*/16);
  EXPECT_FALSE(sampled);
  EXPECT_NE(std::string(sampled.message()).find("checked elements differ"), std::string::npos) << sampled.message();
}

}  // namespace
}  // namespace mg
