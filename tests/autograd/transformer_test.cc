// layer_norm, embedding and scaled dot-product attention beyond their op-table rows: values
// against hand-computed formulas, the loop kernel against its composed reference, the causal
// mask, accumulation of repeated indices, and bad input.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/device_runtime.h"
#include "kernels/ops.h"
#include "kernels/reference/layer_norm_composed.h"
#include "tests/autograd/gradcheck.h"
#include "tests/rounding.h"

namespace mg {
namespace {

using V = std::vector<Tensor>;

Tensor rn(const Shape& s, uint64_t seed, bool grad = true) {
  Generator g(seed);
  Tensor t = randn(s, {DType::f64}, &g);
  if (grad) t.requires_grad_(true);
  return t;
}

void expect_close(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_EQ(a.sizes(), b.sizes());
  auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  for (size_t i = 0; i < av.size(); ++i) ASSERT_NEAR(av[i], bv[i], tol) << "element " << i;
}

// ---------------- layer norm ----------------

TEST(LayerNorm, MatchesFormulaAndStatistics) {
  Tensor x = tensor({1, 2, 3, 4, -1, 0, 1, 6}, {2, 4}, {DType::f64});
  auto [y, mean, rstd] = kernels::layer_norm_forward(x, {4}, Tensor(), Tensor(), 0.0);
  EXPECT_EQ(mean.sizes(), (Shape{2, 1}));
  auto m = mean.to_vector<double>(), r = rstd.to_vector<double>();
  EXPECT_DOUBLE_EQ(m[0], 2.5);
  EXPECT_DOUBLE_EQ(m[1], 1.5);
  EXPECT_NEAR(r[0], 1 / std::sqrt(1.25), 1e-12);
  EXPECT_NEAR(r[1], 1 / std::sqrt((6.25 + 2.25 + 0.25 + 20.25) / 4), 1e-12);
  auto yv = y.to_vector<double>();
  EXPECT_NEAR(yv[0], (1 - 2.5) * r[0], 1e-12);
  EXPECT_NEAR(yv[7], (6 - 1.5) * r[1], 1e-12);
}

TEST(LayerNorm, LoopKernelMatchesComposedReference) {
  for (DType dt : {DType::f64, DType::f32}) {
    Generator g(21);
    Tensor x = randn({3, 2, 7}, {dt}, &g), w = randn({2, 7}, {dt}, &g), b = randn({2, 7}, {dt}, &g);
    Tensor go = randn({3, 2, 7}, {dt}, &g);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    auto [y, mean, rstd] = kernels::layer_norm_forward(x, {2, 7}, w, b, 1e-5);
    auto [yr, meanr, rstdr] = kernels::layer_norm_forward_composed(x, {2, 7}, w, b, 1e-5);
    expect_close(y, yr, tol);
    expect_close(mean, meanr, tol);
    expect_close(rstd, rstdr, tol);
    auto [gx, gw, gb] = kernels::layer_norm_backward(go, x, {2, 7}, mean, rstd, w);
    auto [gxr, gwr, gbr] = kernels::layer_norm_backward_composed(go, x, {2, 7}, mean, rstd, w);
    expect_close(gx, gxr, tol);
    expect_close(gw, gwr, tol * 10);
    expect_close(gb, gbr, tol * 10);
    // The mask skips outputs.
    auto [gx2, gw2, gb2] = kernels::layer_norm_backward(go, x, {2, 7}, mean, rstd, w, {true, false, false});
    EXPECT_TRUE(gx2.defined());
    EXPECT_FALSE(gw2.defined());
    EXPECT_FALSE(gb2.defined());
  }
}

// Half inputs: statistics in f32, the output rounded once to the input dtype. Against the f64
// layer norm of the same rounded inputs: the f32 work (16-term sums for the mean and variance, a
// subtraction, rsqrt and a product) costs at most 64 u(f32) of |y| + 1 (y = (x - mean) rstd, and
// mean's error times rstd is of the order of 1 for unit-scale rows), the final rounding u(dt) |y|;
// the statistics themselves are f32 and within 64 u(f32) relative.
TEST(LayerNorm, HalfTypesComputeInF32) {
  Generator g(5);
  Tensor x = randn({4, 16}, {DType::f32}, &g);
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto [ref, mean_ref, rstd_ref] =
        kernels::layer_norm_forward(testing::rounded_f64(x, dt), {16}, Tensor(), Tensor(), 1e-5);
    auto [y, mean, rstd] = kernels::layer_norm_forward(x.to(dt), {16}, Tensor(), Tensor(), 1e-5);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(mean.dtype(), DType::f32);
    const double uf = testing::unit_roundoff(DType::f32);
    std::vector<double> bound;
    for (double r : ref.to_vector<double>())
      bound.push_back(testing::unit_roundoff(dt) * std::abs(r) + 64 * uf * (std::abs(r) + 1));
    EXPECT_TRUE(testing::within(y, ref, bound));
    std::vector<double> rstd_bound;
    for (double r : rstd_ref.to_vector<double>()) rstd_bound.push_back(64 * uf * r);
    EXPECT_TRUE(testing::within(rstd, rstd_ref, rstd_bound));
  }
}

TEST(LayerNormErrors, ShapeMismatchesAreClear) {
  Tensor x = randn({2, 3, 5});
  try {
    layer_norm(x, {4});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer_norm"), std::string::npos) << m;
    EXPECT_NE(m.find("[4]"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3, 5]"), std::string::npos) << m;
  }
  EXPECT_THROW(layer_norm(x, {2, 3, 5, 1}), ShapeError);  // more dims than the input
  EXPECT_THROW(layer_norm(x, {}), ValueError);
  EXPECT_THROW(layer_norm(x, {5}, randn({4})), ShapeError);               // weight shape
  EXPECT_THROW(layer_norm(x, {3, 5}, Tensor(), randn({5})), ShapeError);  // bias shape
  EXPECT_THROW(layer_norm(x, {5}, Tensor(), Tensor(), -1.0), ValueError);
  EXPECT_THROW(layer_norm(arange(5), {5}), DTypeError);
}

// ---------------- embedding ----------------

TEST(EmbeddingGrad, RepeatedIndicesAccumulate) {
  Tensor idx = from_vector<int64_t>({1, 3, 1, 0, 1, 3}, {2, 3});
  // With d loss / d out = 1, row r of the gradient is (count of r) * ones.
  Tensor w = rn({5, 4}, 32);
  sum(embedding(w, idx)).backward();
  auto gv = w.grad().to_vector<double>();
  const double count[5] = {1, 3, 0, 2, 0};
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(gv[r * 4 + c], count[r]);
}

TEST(Embedding, PicksRowsAnyIndexShapeAndI32) {
  Tensor w = rn({6, 3}, 33, false);
  Tensor out = embedding(w, from_vector<int32_t>({5, 0, 2}, {3}));
  EXPECT_EQ(out.sizes(), (Shape{3, 3}));
  auto wv = w.to_vector<double>(), ov = out.to_vector<double>();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(ov[c], wv[15 + c]);
    EXPECT_EQ(ov[3 + c], wv[c]);
    EXPECT_EQ(ov[6 + c], wv[6 + c]);
  }
  EXPECT_EQ(embedding(w, scalar_tensor(4, {DType::i64})).sizes(), (Shape{3}));
  EXPECT_EQ(embedding(w, from_vector<int64_t>({1, 2, 3, 4}, {2, 1, 2})).sizes(), (Shape{2, 1, 2, 3}));
}

TEST(EmbeddingErrors, OutOfRangeNamesIndexAndSize) {
  Tensor w = randn({5, 2});
  for (int64_t bad : {7, -1}) {
    try {
      embedding(w, from_vector<int64_t>({0, 4, bad}, {3}));
      FAIL() << "expected IndexError";
    } catch (const IndexError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("embedding: index " + std::to_string(bad)), std::string::npos) << m;
      EXPECT_NE(m.find("num_embeddings 5"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(embedding(w, tensor({1, 2}, {2})), DTypeError);
  EXPECT_THROW(embedding(randn({5}), from_vector<int64_t>({0}, {1})), ShapeError);
}

// ---------------- scaled dot-product attention ----------------

TEST(Sdpa, MatchesManualSoftmaxAttention) {
  Tensor q = rn({3, 2}, 53, false), k = rn({4, 2}, 54, false), v = rn({4, 3}, 55, false);
  Tensor out = scaled_dot_product_attention(q, k, v, false, 0.0, 0.5);
  auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  auto ov = out.to_vector<double>();
  for (int i = 0; i < 3; ++i) {
    double p[4], z = 0;
    for (int j = 0; j < 4; ++j) {
      p[j] = std::exp(0.5 * (qv[i * 2] * kv[j * 2] + qv[i * 2 + 1] * kv[j * 2 + 1]));
      z += p[j];
    }
    for (int c = 0; c < 3; ++c) {
      double ref = 0;
      for (int j = 0; j < 4; ++j) ref += p[j] / z * vv[j * 3 + c];
      EXPECT_NEAR(ov[i * 3 + c], ref, 1e-12);
    }
  }
}

TEST(Sdpa, CausalOutputIgnoresLaterPositions) {
  const int64_t T = 6;
  Tensor q = rn({2, T, 4}, 56, false), k = rn({2, T, 4}, 57, false), v = rn({2, T, 4}, 58, false);
  Tensor out = scaled_dot_product_attention(q, k, v, true);
  for (int64_t t = 0; t < T - 1; ++t) {
    // Replace every position after t in q, k and v with fresh values.
    auto perturb = [&](const Tensor& a, uint64_t seed) {
      Tensor b = raw::clone(a);
      raw::copy_(raw::slice(b, 1, t + 1, T, 1), rn({2, T - t - 1, 4}, seed, false));
      return b;
    };
    Tensor out2 = scaled_dot_product_attention(perturb(q, 60 + t), perturb(k, 70 + t), perturb(v, 80 + t), true);
    expect_close(raw::slice(out2, 1, 0, t + 1, 1), raw::slice(out, 1, 0, t + 1, 1), 1e-12);
    // ... while a later position does change (the perturbation is visible there).
    auto a = raw::slice(out2, 1, T - 1, T, 1).to_vector<double>(),
         b = raw::slice(out, 1, T - 1, T, 1).to_vector<double>();
    EXPECT_NE(a, b);
  }
  // Position 0 attends only to itself: its output is v[:, 0].
  expect_close(raw::select(out, 1, 0), raw::select(v, 1, 0), 1e-12);
}

TEST(SdpaErrors, MismatchedShapesAreClear) {
  try {
    scaled_dot_product_attention(randn({2, 3, 4}), randn({2, 3, 5}), randn({2, 3, 4}));
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("scaled_dot_product_attention: query head dim 4 does not match key head dim 5"), std::string::npos)
        << m;
  }
  EXPECT_THROW(scaled_dot_product_attention(randn({2, 3, 4}), randn({2, 3, 4}), randn({2, 2, 4})), ShapeError);
  EXPECT_THROW(scaled_dot_product_attention(randn({2, 3, 4}), randn({3, 3, 4}), randn({3, 3, 4})), ShapeError);
  EXPECT_THROW(scaled_dot_product_attention(randn({3, 4}), randn({2, 3, 4}), randn({2, 3, 4})), ShapeError);
  EXPECT_THROW(scaled_dot_product_attention(randn({3, 4}), randn({3, 4}).to(DType::f64), randn({3, 4})), DTypeError);
  EXPECT_THROW(scaled_dot_product_attention(randn({3, 4}), randn({3, 4}), randn({3, 4}), false, 1.0), ValueError);
}

// ---------------- attention from packed qkv ----------------

// The composed meaning attention_packed_qkv must have: narrow, split heads, attend, merge.
Tensor packed_reference(const Tensor& qkv, int64_t H, bool causal, double dropout_p = 0.0) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  auto split = [&](int64_t i) { return qkv.narrow(2, i * C, C).reshape({B, T, H, C / H}).transpose(1, 2); };
  return sdpa_composed(split(0), split(1), split(2), causal, dropout_p).transpose(1, 2).reshape({B, T, C});
}

TEST(PackedQkv, MatchesComposedPathValuesAndGradients) {
  for (bool causal : {false, true}) {
    Tensor a = rn({2, 5, 24}, 104), b = rn({2, 5, 24}, 104);
    Tensor ya = attention_packed_qkv(a, 4, causal), yb = packed_reference(b, 4, causal);
    ASSERT_EQ(ya.sizes(), (Shape{2, 5, 8}));
    expect_close(ya, yb, 1e-12);
    Tensor w = rn({2, 5, 8}, 105, false);
    ya.backward(w);
    yb.backward(w);
    expect_close(a.grad(), b.grad(), 1e-12);
  }
}

// attention_packed_qkv's definition written out as loops in f64, independent of every kernel:
// for batch b, head h and query t, with q, k, v the head's slices of qkv [B, T, 3C],
//   S[t, s] = scale * q[t] . k[s]   (s <= t when causal),   P = softmax_s(S),   y[t] = sum_s P[t, s] v[s],
// and the gradient for an upstream gradient w (same shape as y):
//   dv[s] += P[t, s] w[t],  dP[t, s] = w[t] . v[s],  dS = P (dP - sum_s' P dP),
//   dq[t] += scale dS[t, s] k[s],  dk[s] += scale dS[t, s] q[t].
struct NaiveAttention {
  std::vector<double> y, dqkv;
};

NaiveAttention naive_packed_attention(const std::vector<double>& qkv, const std::vector<double>& w, int64_t B,
                                      int64_t T, int64_t C, int64_t H, bool causal, double scale) {
  const int64_t D = C / H;
  NaiveAttention r{std::vector<double>(B * T * C, 0.0), std::vector<double>(B * T * 3 * C, 0.0)};
  // Element d of part i (0: q, 1: k, 2: v) of head h at position t of batch b.
  auto at = [&](int64_t b, int64_t t, int64_t i, int64_t h, int64_t d) {
    return (b * T + t) * 3 * C + i * C + h * D + d;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = causal ? t + 1 : T;  // the keys query t sees
        std::vector<double> P(n), dP(n);
        double mx = -INFINITY, z = 0;
        for (int64_t s = 0; s < n; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qkv[at(b, t, 0, h, d)] * qkv[at(b, s, 1, h, d)];
          P[s] = scale * dot;
          mx = std::max(mx, P[s]);
        }
        for (int64_t s = 0; s < n; ++s) z += (P[s] = std::exp(P[s] - mx));
        for (double& p : P) p /= z;
        const int64_t yo = (b * T + t) * C + h * D;
        double pdp = 0;
        for (int64_t s = 0; s < n; ++s) {
          dP[s] = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.y[yo + d] += P[s] * qkv[at(b, s, 2, h, d)];
            r.dqkv[at(b, s, 2, h, d)] += P[s] * w[yo + d];
            dP[s] += w[yo + d] * qkv[at(b, s, 2, h, d)];
          }
          pdp += P[s] * dP[s];
        }
        for (int64_t s = 0; s < n; ++s) {
          const double dS = P[s] * (dP[s] - pdp);
          for (int64_t d = 0; d < D; ++d) {
            r.dqkv[at(b, t, 0, h, d)] += scale * dS * qkv[at(b, s, 1, h, d)];
            r.dqkv[at(b, s, 1, h, d)] += scale * dS * qkv[at(b, t, 0, h, d)];
          }
        }
      }
  return r;
}

// The op (CPU, f64) against the loops above: values and the gradient of qkv. Both are f64 sums of
// at most T * D = 40 terms of size ~10, so 1e-12 leaves three orders of magnitude above rounding.
TEST(PackedQkv, MatchesNaiveF64Loops) {
  struct Case {
    int64_t B, T, C, H;
    bool causal;
    double scale;  // 0: the default 1 / sqrt(head dim)
  };
  for (const Case& c : {Case{2, 5, 24, 4, false, 0}, Case{2, 5, 24, 4, true, 0}, Case{1, 7, 12, 1, true, 0.3},
                        Case{3, 4, 18, 3, false, 0.7}}) {
    SCOPED_TRACE(::testing::Message() << "B " << c.B << " T " << c.T << " C " << c.C << " H " << c.H << " causal "
                                      << c.causal << " scale " << c.scale);
    Tensor qkv = rn({c.B, c.T, 3 * c.C}, 106 + c.H);
    Tensor w = rn({c.B, c.T, c.C}, 107 + c.H, false);
    const double scale = c.scale > 0 ? c.scale : 1 / std::sqrt(static_cast<double>(c.C / c.H));
    NaiveAttention want =
        naive_packed_attention(qkv.to_vector<double>(), w.to_vector<double>(), c.B, c.T, c.C, c.H, c.causal, scale);
    Tensor y =
        attention_packed_qkv(qkv, c.H, c.causal, 0.0, c.scale > 0 ? std::optional<double>(c.scale) : std::nullopt);
    ASSERT_EQ(y.sizes(), (Shape{c.B, c.T, c.C}));
    expect_close(y, from_vector(want.y, y.sizes()), 1e-12);
    y.backward(w);
    expect_close(qkv.grad(), from_vector(want.dqkv, qkv.sizes()), 1e-12);
  }
}

TEST(PackedQkvErrors, BadShapesAndValuesAreClear) {
  try {
    attention_packed_qkv(randn({2, 3, 10}), 2);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("attention_packed_qkv"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3, 10]"), std::string::npos) << m;
  }
  EXPECT_THROW(attention_packed_qkv(randn({3, 12}), 2), ShapeError);
  EXPECT_THROW(attention_packed_qkv(randn({1, 3, 12}), 0), ValueError);
  EXPECT_THROW(attention_packed_qkv(randn({1, 3, 12}), 2, false, 1.0), ValueError);
  EXPECT_THROW(attention_packed_qkv(from_vector<int64_t>({0, 1, 2, 3, 4, 5}, {1, 1, 6}), 2), DTypeError);
}

}  // namespace
}  // namespace mg
