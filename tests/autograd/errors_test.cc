// Bad input, one row per mistake: each must raise the right mg::Error subclass with a
// message that names the op (and, where it matters, the offending values).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "core/random.h"

namespace mg {
namespace {

struct BadRow {
  std::string name;
  std::function<void()> fn;
  std::function<bool(const Error&)> is_expected_type;
  std::string type_name;
  std::vector<std::string> message_has;  // substrings the message must contain
};

template <class E>
BadRow bad(std::string name, std::function<void()> fn, std::vector<std::string> message_has) {
  return BadRow{std::move(name), std::move(fn), [](const Error& e) { return dynamic_cast<const E*>(&e) != nullptr; },
                "", std::move(message_has)};
}

Tensor f(const Shape& s) { return ones(s, {DType::f64}); }
Tensor p(const Shape& s) {  // a leaf that requires grad
  Tensor t = ones(s, {DType::f64});
  t.requires_grad_(true);
  return t;
}
Tensor idx(const std::vector<int64_t>& v) { return from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}); }

std::vector<BadRow> bad_rows() {
  return {
      // elementwise / linear algebra (shape checks live in kernels, surfaced through the ops)
      bad<ShapeError>("add_shape_mismatch",
                      [] {
                        add(f({2, 3}), f({4}));
                      },
                      {"[2, 3]", "[4]"}),
      bad<ShapeError>("mul_shape_mismatch",
                      [] {
                        mul(p({2, 3}), f({3, 2}));
                      },
                      {}),
      bad<ShapeError>("matmul_inner_dims",
                      [] {
                        matmul(p({2, 3}), f({4, 5}));
                      },
                      {"matmul"}),
      bad<ShapeError>("bmm_batch_mismatch",
                      [] {
                        bmm(p({2, 3, 4}), f({3, 4, 5}));
                      },
                      {"bmm"}),
      bad<ShapeError>("linear_in_features",
                      [] {
                        linear(p({3, 4}), f({5, 3}));
                      },
                      {"linear"}),
      bad<ValueError>("clamp_lo_above_hi", [] { clamp(p({3}), 1.0, -1.0); }, {"clamp"}),
      bad<IndexError>("sum_dim_out_of_range",
                      [] {
                        sum(p({2, 3}), {2});
                      },
                      {"sum"}),
      bad<IndexError>("softmax_dim_out_of_range",
                      [] {
                        softmax(p({2, 3}), 3);
                      },
                      {"softmax"}),
      bad<IndexError>("max_dim_out_of_range",
                      [] {
                        max(p({2, 3}), -3);
                      },
                      {"max"}),
      // views
      bad<ShapeError>("view_wrong_numel",
                      [] {
                        p({2, 3}).view({4, 2});
                      },
                      {"view", "[4, 2]"}),
      bad<ShapeError>("view_noncontiguous",
                      [] {
                        p({2, 3}).t().view({6});
                      },
                      {"view", "reshape"}),
      bad<ShapeError>("reshape_two_infers",
                      [] {
                        p({2, 3}).reshape({-1, -1});
                      },
                      {"reshape"}),
      bad<ShapeError>("permute_wrong_rank",
                      [] {
                        p({2, 3}).permute({0});
                      },
                      {"permute"}),
      bad<ShapeError>("permute_repeated_dim",
                      [] {
                        p({2, 3}).permute({1, 1});
                      },
                      {"permute"}),
      bad<ShapeError>("t_on_3d",
                      [] {
                        p({2, 3, 4}).t();
                      },
                      {"t:", "transpose"}),
      bad<IndexError>("transpose_dim",
                      [] {
                        p({2, 3}).transpose(0, 2);
                      },
                      {"transpose"}),
      bad<IndexError>("unsqueeze_dim",
                      [] {
                        p({2, 3}).unsqueeze(4);
                      },
                      {"unsqueeze"}),
      bad<IndexError>("narrow_past_end",
                      [] {
                        p({4, 5}).narrow(1, 3, 3);
                      },
                      {"narrow", "size 5"}),
      bad<ValueError>("narrow_negative_length",
                      [] {
                        p({4, 5}).narrow(1, 0, -1);
                      },
                      {"narrow"}),
      bad<IndexError>("select_index",
                      [] {
                        p({4, 5}).select(0, 4);
                      },
                      {"select", "4"}),
      bad<ValueError>("slice_step_zero",
                      [] {
                        p({4, 5}).slice(0, 0, 4, 0);
                      },
                      {"slice", "step"}),
      bad<ShapeError>("expand_incompatible",
                      [] {
                        p({3, 2}).expand({3, 4});
                      },
                      {"expand"}),
      bad<ValueError>("flatten_start_after_end",
                      [] {
                        p({2, 3, 4}).flatten(2, 1);
                      },
                      {"flatten"}),
      // joining / indexing
      bad<ShapeError>("cat_shape_mismatch",
                      [] {
                        cat({p({2, 3}), f({2, 4})}, 0);
                      },
                      {"cat"}),
      bad<ShapeError>("stack_shape_mismatch",
                      [] {
                        stack({p({2, 3}), f({3, 2})}, 0);
                      },
                      {"stack"}),
      bad<IndexError>("gather_index_out_of_range",
                      [] {
                        gather(p({2, 3}), 1, from_vector<int64_t>({0, 3}, {2, 1}));
                      },
                      {"gather"}),
      bad<IndexError>("index_select_out_of_range",
                      [] {
                        index_select(p({4, 3}), 0, idx({1, 4}));
                      },
                      {"index_select"}),
      bad<DTypeError>("index_select_float_index",
                      [] {
                        index_select(p({4, 3}), 0, f({2}));
                      },
                      {"index_select"}),
      // losses
      bad<ShapeError>("cross_entropy_one_hot_target_shape",
                      [] {
                        cross_entropy(p({64, 10}), zeros({64, 11}, {DType::f32}));
                      },
                      {"cross_entropy: probability targets must have the input's shape [64, 10], got [64, 11]",
                       "class-index targets"}),
      bad<ShapeError>("cross_entropy_target_shape",
                      [] {
                        cross_entropy(p({4, 10}), idx({1, 2, 3}));
                      },
                      {"cross_entropy", "[3]", "[4, 10]"}),
      bad<IndexError>("cross_entropy_class_out_of_range",
                      [] {
                        cross_entropy(p({3, 10}), idx({1, 10, 3}));
                      },
                      {"cross_entropy", "target 10", "position 1", "10 classes"}),
      bad<IndexError>("cross_entropy_negative_class",
                      [] {
                        cross_entropy(p({3, 10}), idx({1, -1, 3}));
                      },
                      {"target -1"}),
      bad<ValueError>("cross_entropy_bad_reduction",
                      [] {
                        cross_entropy(p({3, 10}), idx({1, 2, 3}), "avg");
                      },
                      {"reduction", "avg"}),
      bad<ValueError>("cross_entropy_label_smoothing_range",
                      [] {
                        cross_entropy(p({3, 10}), idx({1, 2, 3}), "mean", -100, 1.5);
                      },
                      {"label_smoothing"}),
      bad<IndexError>("nll_loss_out_of_range",
                      [] {
                        nll_loss(p({2, 3}), idx({0, 3}));
                      },
                      {"nll_loss", "target 3"}),
      bad<DTypeError>("nll_loss_float_target",
                      [] {
                        nll_loss(p({2, 3}), f({2}));
                      },
                      {"nll_loss", "class indices"}),
      bad<ShapeError>("mse_loss_shape_mismatch",
                      [] {
                        mse_loss(p({4, 1}), f({4}));
                      },
                      {"mse_loss", "[4, 1]", "[4]"}),
      bad<ValueError>("mse_loss_bad_reduction", [] { mse_loss(p({4}), f({4}), "max"); }, {"mse_loss"}),
      // dropout
      bad<ValueError>("dropout_p_one", [] { dropout(p({4}), 1.0, true); }, {"dropout", "[0, 1)"}),
      bad<ValueError>("dropout_p_negative", [] { dropout(p({4}), -0.1, true); }, {"dropout"}),
      // autograd misuse
      bad<AutogradError>("backward_non_scalar",
                         [] {
                           (p({2, 3}) * 2.0).backward();
                         },
                         {"scalar outputs", "[2, 3]"}),
      bad<AutogradError>("backward_no_grad_root", [] { sum(f({2})).backward(); }, {"does not require grad"}),
      bad<ShapeError>("backward_wrong_gradient_shape",
                      [] {
                        (p({2, 3}) * 2.0).backward(f({6}));
                      },
                      {"backward"}),
      bad<AutogradError>("inplace_on_leaf",
                         [] {
                           Tensor x = p({2});
                           add_(x, 1.0);
                         },
                         {"leaf Variable", "add_"}),
      bad<AutogradError>("relu_inplace_on_leaf",
                         [] {
                           Tensor x = p({2});
                           relu_(x);
                         },
                         {"relu_"}),
      bad<AutogradError>("scatter_on_leaf",
                         [] {
                           Tensor x = p({2, 2});
                           scatter_(x, 1, from_vector<int64_t>({0, 1}, {2, 1}), f({2, 1}));
                         },
                         {"scatter_"}),
      bad<AutogradError>("requires_grad_integer", [] { arange(4).requires_grad_(true); }, {"requires_grad_"}),
      bad<AutogradError>("requires_grad_non_leaf", [] { (p({2}) * 2.0).requires_grad_(true); }, {"leaf"}),
  };
}

class BadInputTest : public ::testing::TestWithParam<BadRow> {};

TEST_P(BadInputTest, RaisesTypedError) {
  const BadRow& row = GetParam();
  try {
    row.fn();
    FAIL() << row.name << ": no exception";
  } catch (const Error& e) {
    EXPECT_TRUE(row.is_expected_type(e)) << row.name << ": wrong error type, message: " << e.what();
    const std::string msg = e.what();
    for (const std::string& part : row.message_has)
      EXPECT_NE(msg.find(part), std::string::npos) << row.name << ": message lacks \"" << part << "\": " << msg;
  } catch (const std::exception& e) {
    FAIL() << row.name << ": not an mg::Error: " << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BadInputTest, ::testing::ValuesIn(bad_rows()),
                         [](const ::testing::TestParamInfo<BadRow>& info) { return info.param.name; });

// Bad input never corrupts state: a failed in-place op leaves the tensor and its version alone.
TEST(BadInput, FailedInplaceLeavesTensorUntouched) {
  Tensor y = p({2, 3}) * 2.0;
  const uint32_t v = y.version();
  auto fn = autograd::grad_fn(y);
  EXPECT_THROW(add_(y, f({4})), ShapeError);
  EXPECT_EQ(y.version(), v);
  EXPECT_EQ(autograd::grad_fn(y), fn);
  EXPECT_EQ(y.to_vector<double>(), std::vector<double>(6, 2.0));
}

}  // namespace
}  // namespace mg
