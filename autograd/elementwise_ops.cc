// Elementwise differentiable ops: forward through kernels::unary/binary, backward beside it.
#include "autograd/op_support.h"
#include "core/random.h"

namespace mg {

using kernels::Binary;
using kernels::Unary;

namespace {
// Whether an input wants a gradient: `ma(g)` hands `g` on to it, or nothing. The engine sums
// a broadcast gradient back to the input's shape and casts it to the input's dtype.
struct Wants {
  bool needed;
  explicit Wants(const Tensor& t) : needed(needs_grad(t)) {}
  Tensor operator()(const Tensor& g) const { return needed ? g : Tensor(); }
};

Tensor scalar_like(double v, const Tensor& t) { return scalar_tensor(v, {t.dtype(), t.device()}); }
}  // namespace

// ---------------- binary ----------------

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::add(a, b);
  if (any_requires_grad({a, b}))
    record("add", {a, b}, out, [ma = Wants(a), mb = Wants(b)](const Grads& g) { return Grads{ma(g[0]), mb(g[0])}; });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::sub(a, b);
  if (any_requires_grad({a, b}))
    record("sub", {a, b}, out, [ma = Wants(a), mb = Wants(b)](const Grads& g) {
      return Grads{ma(g[0]), mb.needed ? mb(kernels::unary(Unary::Neg, g[0])) : Tensor()};
    });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::mul(a, b);
  if (any_requires_grad({a, b})) {
    Wants ma(a), mb(b);
    // Each input is saved only if the *other* one needs a gradient (what PyTorch saves).
    record("mul", {a, b}, out,
           [ma, mb, sa = save_if(mb.needed, a, "mul"), sb = save_if(ma.needed, b, "mul")](const Grads& g) {
             return Grads{ma.needed ? ma(kernels::mul(g[0], sb.unpack())) : Tensor(),
                          mb.needed ? mb(kernels::mul(g[0], sa.unpack())) : Tensor()};
           });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::div(a, b);
  if (any_requires_grad({a, b})) {
    Wants ma(a), mb(b);
    record("div", {a, b}, out, [ma, mb, sa = save_if(mb.needed, a, "div"), sb = SavedTensor(b, "div")](const Grads& g) {
      Tensor bv = sb.unpack();
      Tensor ga, gb;
      if (ma.needed) ga = ma(kernels::div(g[0], bv));
      if (mb.needed) {  // d(a/b)/db = -a / b^2
        Tensor t = kernels::div(kernels::mul(g[0], sa.unpack()), kernels::unary(Unary::Square, bv));
        gb = mb(kernels::unary(Unary::Neg, t));
      }
      return Grads{ga, gb};
    });
  }
  return out;
}

namespace {
Tensor pow_math(const Tensor& a, const Tensor& exponent) {
  Tensor out = kernels::binary(Binary::Pow, a, exponent);
  if (any_requires_grad({a, exponent})) {
    Wants ma(a), mb(exponent);
    record("pow", {a, exponent}, out,
           [ma, mb, sa = SavedTensor(a, "pow"), sb = SavedTensor(exponent, "pow"),
            so = save_if(mb.needed, out, "pow")](const Grads& g) {
             Tensor av = sa.unpack(), bv = sb.unpack(), ga, gb;
             if (ma.needed) {  // b * a^(b-1)
               Tensor d = kernels::mul(bv, kernels::binary(Binary::Pow, av, kernels::add_scalar(bv, -1.0)));
               ga = ma(kernels::mul(g[0], d));
             }
             if (mb.needed)  // a^b * log(a)
               gb = mb(kernels::mul(g[0], kernels::mul(so.unpack(), kernels::unary(Unary::Log, av))));
             return Grads{ga, gb};
           });
  }
  return out;
}
}  // namespace

Tensor pow(const Tensor& a, const Tensor& exponent) { return around(policy::pow, pow_math, a, exponent); }

namespace {
// max/min: the gradient goes to the winner, split evenly on ties (PyTorch's convention).
Tensor extremum(const char* op, Binary which, Binary wins, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(which, a, b);
  if (any_requires_grad({a, b})) {
    Wants ma(a), mb(b);
    record(op, {a, b}, out, [ma, mb, wins, sa = SavedTensor(a, op), sb = SavedTensor(b, op)](const Grads& g) {
      Tensor av = sa.unpack(), bv = sb.unpack();
      Tensor w =
          kernels::add(kernels::cast(kernels::binary(wins, av, bv), g[0].dtype()),
                       kernels::mul_scalar(kernels::cast(kernels::binary(Binary::Eq, av, bv), g[0].dtype()), 0.5));
      Tensor ga = kernels::mul(g[0], w);  // output-shaped
      return Grads{ma(ga), mb.needed ? mb(kernels::sub(g[0], ga)) : Tensor()};
    });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum("maximum", Binary::Maximum, Binary::Gt, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum("minimum", Binary::Minimum, Binary::Lt, a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::where(cond, a, b);
  if (any_requires_grad({a, b})) {
    Wants ma(a), mb(b);
    record("where", {cond, a, b}, out, [ma, mb, sc = SavedTensor(cond, "where")](const Grads& g) {
      Tensor c = sc.unpack(), zero = scalar_like(0.0, g[0]);
      return Grads{Tensor(), ma.needed ? ma(kernels::where(c, g[0], zero)) : Tensor(),
                   mb.needed ? mb(kernels::where(c, zero, g[0])) : Tensor()};
    });
  }
  return out;
}

// Comparisons: b8 results, never part of the graph.
Tensor eq(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return kernels::binary(Binary::Ge, a, b); }

// ---------------- with a scalar ----------------

Tensor add(const Tensor& a, double s) {
  Tensor out = kernels::add_scalar(a, s);
  record("add", {a}, out, [ma = Wants(a)](const Grads& g) { return Grads{ma(g[0])}; });
  return out;
}

Tensor sub(const Tensor& a, double s) {
  Tensor out = kernels::add_scalar(a, -s);
  record("sub", {a}, out, [ma = Wants(a)](const Grads& g) { return Grads{ma(g[0])}; });
  return out;
}

Tensor mul(const Tensor& a, double s) {
  Tensor out = kernels::mul_scalar(a, s);
  record("mul", {a}, out, [ma = Wants(a), s](const Grads& g) { return Grads{ma(kernels::mul_scalar(g[0], s))}; });
  return out;
}

Tensor div(const Tensor& a, double s) {
  Tensor out = kernels::mul_scalar(a, 1.0 / s);
  record("div", {a}, out, [ma = Wants(a), s](const Grads& g) { return Grads{ma(kernels::mul_scalar(g[0], 1.0 / s))}; });
  return out;
}

Tensor rsub(double s, const Tensor& a) {
  Tensor out = kernels::add_scalar(kernels::unary(Unary::Neg, a), s);
  record("rsub", {a}, out, [ma = Wants(a)](const Grads& g) { return Grads{ma(kernels::unary(Unary::Neg, g[0]))}; });
  return out;
}

namespace {
Tensor pow_scalar_math(const Tensor& a, double e) {
  Tensor out = kernels::pow_scalar(a, e);
  if (any_requires_grad({a}))
    record("pow", {a}, out, [ma = Wants(a), e, sa = SavedTensor(a, "pow")](const Grads& g) {
      if (e == 0.0) return Grads{zeros(g[0].sizes(), {g[0].dtype(), g[0].device()})};
      Tensor d = kernels::mul_scalar(kernels::pow_scalar(sa.unpack(), e - 1.0), e);
      return Grads{ma(kernels::mul(g[0], d))};
    });
  return out;
}
}  // namespace

Tensor pow(const Tensor& a, double e) { return around(policy::pow, pow_scalar_math, a, e); }

Tensor clamp(const Tensor& a, double lo, double hi) {
  MG_CHECK(!(lo > hi), ValueError, "clamp: lo (", lo, ") must not exceed hi (", hi, ")");
  Tensor out = kernels::clamp(a, lo, hi);
  if (any_requires_grad({a}))
    record("clamp", {a}, out, [ma = Wants(a), lo, hi, sa = SavedTensor(a, "clamp")](const Grads& g) {
      return Grads{ma(kernels::clamp_backward(g[0], sa.unpack(), lo, hi))};
    });
  return out;
}

// ---------------- unary ----------------

namespace {
// grad = combine(g, saved), where the saved tensor is the input x or, where the formula
// allows, the output y (cheaper to keep when the input may be freed).
enum class Keep { Input, Output };
template <class F>
Tensor unary_saving(Keep keep, const char* op, Unary u, const Tensor& a, F combine) {
  Tensor out = kernels::unary(u, a);
  if (any_requires_grad({a}))
    record(op, {a}, out, [ma = Wants(a), s = SavedTensor(keep == Keep::Input ? a : out, op), combine](const Grads& g) {
      return Grads{ma(combine(g[0], s.unpack()))};
    });
  return out;
}
template <class F>
Tensor unary_from_input(const char* op, Unary u, const Tensor& a, F combine) {
  return unary_saving(Keep::Input, op, u, a, combine);
}
template <class F>
Tensor unary_from_output(const char* op, Unary u, const Tensor& a, F combine) {
  return unary_saving(Keep::Output, op, u, a, combine);
}
}  // namespace

Tensor neg(const Tensor& a) {
  Tensor out = kernels::unary(Unary::Neg, a);
  record("neg", {a}, out, [ma = Wants(a)](const Grads& g) { return Grads{ma(kernels::unary(Unary::Neg, g[0]))}; });
  return out;
}

namespace {
Tensor exp_math(const Tensor& a) {
  return unary_from_output("exp", Unary::Exp, a, [](const Tensor& g, const Tensor& y) { return kernels::mul(g, y); });
}
}  // namespace

Tensor exp(const Tensor& a) { return around(policy::exp, exp_math, a); }
namespace {
Tensor log_math(const Tensor& a) {
  return unary_from_input("log", Unary::Log, a, [](const Tensor& g, const Tensor& x) { return kernels::div(g, x); });
}
}  // namespace

Tensor log(const Tensor& a) { return around(policy::log, log_math, a); }
Tensor sqrt(const Tensor& a) {  // 1 / (2 sqrt(x))
  return unary_from_output("sqrt", Unary::Sqrt, a, [](const Tensor& g, const Tensor& y) {
    return kernels::div(g, kernels::mul_scalar(y, 2.0));
  });
}
Tensor rsqrt(const Tensor& a) {  // -x^(-3/2) / 2 = -y^3 / 2
  return unary_from_output("rsqrt", Unary::Rsqrt, a, [](const Tensor& g, const Tensor& y) {
    return kernels::mul(g, kernels::mul_scalar(kernels::pow_scalar(y, 3.0), -0.5));
  });
}
Tensor abs(const Tensor& a) {
  return unary_from_input("abs", Unary::Abs, a, [](const Tensor& g, const Tensor& x) {
    return kernels::mul(g, kernels::unary(Unary::Sign, x));
  });
}
Tensor square(const Tensor& a) {
  return unary_from_input("square", Unary::Square, a, [](const Tensor& g, const Tensor& x) {
    return kernels::mul(g, kernels::mul_scalar(x, 2.0));
  });
}
// y > 0 exactly where x > 0, so the output is enough
namespace {
Tensor relu_math(const Tensor& a) {
  return unary_from_output("relu", Unary::Relu, a, [](const Tensor& g, const Tensor& y) {
    return kernels::binary(Binary::ReluBackward, g, y);
  });
}
}  // namespace

Tensor relu(const Tensor& a) { return around(policy::relu, relu_math, a); }
namespace {
Tensor gelu_math(const Tensor& a, bool tanh_approx) {
  if (tanh_approx)
    return unary_from_input("gelu", Unary::GeluTanh, a, [](const Tensor& g, const Tensor& x) {
      return kernels::binary(Binary::GeluTanhBackward, g, x);
    });
  return unary_from_input("gelu", Unary::Gelu, a,
                          [](const Tensor& g, const Tensor& x) { return kernels::binary(Binary::GeluBackward, g, x); });
}
}  // namespace

Tensor gelu(const Tensor& a, bool tanh_approx) { return around(policy::gelu, gelu_math, a, tanh_approx); }
namespace {
Tensor silu_math(const Tensor& a) {
  return unary_from_input("silu", Unary::Silu, a,
                          [](const Tensor& g, const Tensor& x) { return kernels::binary(Binary::SiluBackward, g, x); });
}
}  // namespace

Tensor silu(const Tensor& a) { return around(policy::silu, silu_math, a); }
Tensor softplus(const Tensor& a, double beta) {
  MG_CHECK(beta > 0.0, ValueError, "softplus: beta must be positive, got ", beta);
  if (beta != 1.0) return div(softplus(mul(a, beta)), beta);  // log(1 + exp(beta x)) / beta
  return unary_from_input("softplus", Unary::Softplus, a, [](const Tensor& g, const Tensor& x) {
    return kernels::binary(Binary::SoftplusBackward, g, x);
  });
}
Tensor sigmoid(const Tensor& a) {
  return unary_from_output("sigmoid", Unary::Sigmoid, a, [](const Tensor& g, const Tensor& y) {
    return kernels::binary(Binary::SigmoidBackward, g, y);
  });
}
Tensor tanh(const Tensor& a) {
  return unary_from_output("tanh", Unary::Tanh, a, [](const Tensor& g, const Tensor& y) {
    return kernels::binary(Binary::TanhBackward, g, y);
  });
}

// ---------------- in-place ----------------
// The tensor's history is rebased onto the in-place node (see record_inplace); values the
// backward needs from before the write are cloned first, only when actually needed.

Tensor& add_(Tensor& a, const Tensor& b) {
  autograd::inplace_update(a, "add_", [&] { kernels::binary_(Binary::Add, a, b); });
  autograd::record_inplace("add_", a, {b}, [ma = Wants(a), mb = Wants(b)](const Grads& g) {
    return Grads{ma(g[0]), mb(g[0])};
  });
  return a;
}

Tensor& add_(Tensor& a, double s) {
  autograd::inplace_update(a, "add_", [&] { kernels::binary_(Binary::Add, a, scalar_like(s, a)); });
  autograd::record_inplace("add_", a, {}, [](const Grads& g) { return Grads{g[0]}; });
  return a;
}

Tensor& mul_(Tensor& a, const Tensor& b) {
  const bool record_it = any_requires_grad({a, b});
  SavedTensor a_before, sb;
  if (record_it && needs_grad(b)) a_before = SavedTensor(raw::clone(a), "mul_");
  if (record_it && needs_grad(a))  // b aliasing a would be overwritten: keep a copy then
    sb = SavedTensor(b.storage() == a.storage() ? raw::clone(b) : b, "mul_");
  autograd::inplace_update(a, "mul_", [&] { kernels::binary_(Binary::Mul, a, b); });
  if (record_it)
    autograd::record_inplace("mul_", a, {b}, [ma = Wants(a), mb = Wants(b), a_before, sb](const Grads& g) {
      return Grads{ma.needed ? ma(kernels::mul(g[0], sb.unpack())) : Tensor(),
                   mb.needed ? mb(kernels::mul(g[0], a_before.unpack())) : Tensor()};
    });
  return a;
}

Tensor& mul_(Tensor& a, double s) {
  autograd::inplace_update(a, "mul_", [&] { kernels::binary_(Binary::Mul, a, scalar_like(s, a)); });
  autograd::record_inplace("mul_", a, {}, [s](const Grads& g) { return Grads{kernels::mul_scalar(g[0], s)}; });
  return a;
}

Tensor& relu_(Tensor& a) {
  autograd::inplace_update(a, "relu_", [&] { kernels::unary_(Unary::Relu, a); });
  if (any_requires_grad({a}))
    autograd::record_inplace("relu_", a, {}, [sy = SavedTensor(a, "relu_")](const Grads& g) {
      return Grads{kernels::binary(Binary::ReluBackward, g[0], sy.unpack())};
    });
  return a;
}

// ---------------- dropout ----------------

namespace {
Tensor dropout_math(const Tensor& a, double p, bool training) {
  MG_CHECK(p >= 0.0 && p < 1.0, ValueError, "dropout: probability p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return a;
  MG_CHECK(is_floating(a.dtype()), DTypeError, "dropout: input must be floating, got ", a.dtype());
  // Inverted dropout: keep with probability 1 - p and scale by 1 / (1 - p), so eval is identity.
  auto [out, keep] = kernels::bias_dropout_add(Tensor(), a, Tensor(), p);
  if (any_requires_grad({a}))
    record("dropout", {a}, out,
           [keep = std::move(keep), p](const Grads& g) { return Grads{kernels::dropout_backward(g[0], keep, p)}; });
  return out;
}
}  // namespace

Tensor dropout(const Tensor& a, double p, bool training) {
  // Dropout is the identity outside training: nothing to rebuild.
  if (!training || p == 0.0) return dropout_math(a, p, training);
  return around(policy::dropout, dropout_math, a, p, training);
}

Tensor bias_dropout_add(const Tensor& x_in, const Tensor& branch_in, const Tensor& bias_in, double p, bool training) {
  MG_CHECK(p >= 0.0 && p < 1.0, ValueError, "bias_dropout_add: probability p must be in [0, 1), got ", p);
  MG_CHECK(branch_in.defined(), ValueError, "bias_dropout_add: branch is an undefined tensor");
  MG_CHECK(is_floating(branch_in.dtype()), DTypeError, "bias_dropout_add: branch must be floating, got ",
           branch_in.dtype());
  Tensor x = x_in, branch = branch_in, bias = bias_in;
  if (x.defined()) {  // the dtype pairs the kernel takes: one dtype, or an f32 stream with a half branch
    MG_CHECK(is_floating(x.dtype()), DTypeError, "bias_dropout_add: residual must be floating, got ", x.dtype());
    const DType wide = promote_types(x.dtype(), branch.dtype());
    const bool half_branch = branch.dtype() == DType::f16 || branch.dtype() == DType::bf16;
    if (x.dtype() != wide) x = x.to(wide);
    if (branch.dtype() != wide && !(wide == DType::f32 && half_branch)) branch = branch.to(wide);
  }
  if (bias.defined() && bias.dtype() != branch.dtype()) bias = bias.to(branch.dtype());
  if (!training || p == 0.0) {
    Tensor h = bias.defined() ? add(branch, bias) : branch;
    return x.defined() ? add(x, h) : h;
  }
  auto [out, keep] = kernels::bias_dropout_add(x, branch, bias, p);
  if (!any_requires_grad({x, branch, bias})) return out;
  const bool need_b = needs_grad(branch), need_bias = needs_grad(bias);
  record("bias_dropout_add", {x, branch, bias}, out,
         [keep = std::move(keep), p, need_b, need_bias, bdt = branch.dtype()](const Grads& g) {
           Tensor gb, gbias;
           if (need_b || need_bias) gb = kernels::dropout_backward(g[0], keep, p, bdt);
           if (need_bias) gbias = kernels::sum_to(gb, {gb.size(-1)});  // the bias broadcast over the rows
           return Grads{g[0], gb, gbias};
         });
  return out;
}

}  // namespace mg
