#include "core/random.h"

#include <cmath>
#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>
#include <utility>

#include "core/strided_loop.h"

namespace mg {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> g(mu_);
  state_.seed = seed;
  state_.offset = 0;
}
PhiloxState Generator::get_state() const {
  std::lock_guard<std::mutex> g(mu_);
  return state_;
}
void Generator::set_state(PhiloxState s) {
  std::lock_guard<std::mutex> g(mu_);
  state_ = s;
}
uint64_t Generator::reserve(uint64_t blocks) {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t o = state_.offset;
  state_.offset += blocks;
  return o;
}

Generator& default_generator() {
  static Generator* g = new Generator(0x5eed);
  return *g;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {
enum Kind { kUniform = 0, kNormal = 1, kBernoulli = 2 };

inline double u32_to_unit(uint32_t x) { return (x >> 8) * (1.0 / 16777216.0); }  // [0, 1)

// Element i's value of the stream; the CUDA backend computes exactly this per element.
inline double philox_value(int kind, uint64_t seed, uint64_t base, int64_t i, double a, double b) {
  uint32_t r[4];
  if (kind == kNormal) {
    philox4x32(base + static_cast<uint64_t>(i) / 2, 0, seed, r);
    int j = static_cast<int>(i & 1) * 2;
    double u1 = 1.0 - u32_to_unit(r[j]);  // (0, 1]
    double u2 = u32_to_unit(r[j + 1]);
    return a + b * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  philox4x32(base + static_cast<uint64_t>(i) / 4, 0, seed, r);
  double u = u32_to_unit(r[i & 3]);
  if (kind == kBernoulli) return u < a ? 1.0 : 0.0;
  return a + (b - a) * u;
}

// The capture under way on this thread, if any: the generators its fills drew from.
thread_local bool t_capturing = false;
thread_local std::vector<CapturedRng> t_captured;

// A fill inside a capture: its offset within the graph, and the graph's counter for `g`.
uint64_t reserve_in_capture(Generator& g, uint64_t blocks, const Device& dev, const int64_t** counter) {
  auto it = std::find_if(t_captured.begin(), t_captured.end(), [&](const CapturedRng& r) { return r.gen == &g; });
  if (it == t_captured.end()) {
    t_captured.push_back({&g, g.seed(), 0, empty({1}, {DType::i64, dev})});
    it = t_captured.end() - 1;
  }
  MG_CHECK(it->offset.device() == dev, DeviceError, "random fill: one generator drew on ", it->offset.device(),
           " and on ", dev, " in one CUDA graph capture");
  *counter = static_cast<const int64_t*>(it->offset.raw_data());
  const uint64_t within = it->blocks;
  it->blocks += blocks;
  return within;
}

}  // namespace

PhiloxDraw reserve_philox(Generator* gen, uint64_t blocks, const Device& dev) {
  Generator& g = gen ? *gen : default_generator();
  PhiloxDraw d;
  d.seed = g.seed();
  d.base = t_capturing && dev.is_cuda() ? reserve_in_capture(g, blocks, dev, &d.device_offset) : g.reserve(blocks);
  return d;
}

namespace {
void philox_fill(const Tensor& t, int kind, double a, double b, Generator* gen) {
  const int64_t n = t.numel();
  uint64_t blocks = kind == kNormal ? (n + 1) / 2 : (n + 3) / 4;
  if (t.is_cuda())
    MG_CHECK(cuda_hooks().philox_fill != nullptr, DeviceError, "random fill: no CUDA backend in this build");
  const PhiloxDraw d = reserve_philox(gen, blocks, t.device());
  if (t.is_cuda()) {
    cuda_hooks().philox_fill(t, kind, d.seed, d.base, a, b, d.device_offset);
    return;
  }
  const uint64_t base = d.base, seed = d.seed;
  // Logical (row-major) element order, whatever the strides.
  Tensor c = t.is_contiguous() ? t : empty(t.sizes(), {t.dtype(), t.device()});
  // Element i is a function of (seed, base, i) alone: the fill splits over threads and draws the
  // same values (a GPT-3 6.7B's initialization is 13 billion draws).
  MG_DISPATCH_FLOAT(t.dtype(), "random fill", [&] {
    auto* p = static_cast<scalar_t*>(c.raw_data());
    auto fill = [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        p[i] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(philox_value(kind, seed, base, i, a, b)));
    };
    const int64_t workers =
        std::min<int64_t>(static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())), n >> 20);
    if (workers <= 1) return fill(0, n);
    std::vector<std::thread> pool;
    const int64_t per = (n + workers - 1) / workers;
    for (int64_t w = 1; w < workers; ++w) pool.emplace_back(fill, w * per, std::min(n, (w + 1) * per));
    fill(0, std::min(n, per));
    for (auto& th : pool) th.join();
  });
  if (!c.is_same(t)) raw::copy_(t, c);
}
}  // namespace

void begin_rng_capture() {
  t_capturing = true;
  t_captured.clear();
}

std::vector<CapturedRng> end_rng_capture() {
  t_capturing = false;
  return std::exchange(t_captured, {});
}

void prepare_rng_replay(const std::vector<CapturedRng>& rngs) {
  for (const CapturedRng& r : rngs) {
    MG_CHECK(r.gen->seed() == r.seed, ValueError,
             "CUDA graph replay: a generator the captured work draws from was "
             "reseeded since the capture (seed ",
             r.seed, " -> ", r.gen->seed(), "); capture again after seeding");
    const uint64_t start = r.gen->reserve(r.blocks);
    // fill_ carries a double: exact below 2^53 blocks.
    MG_CHECK(start < (uint64_t{1} << 53), ValueError, "CUDA graph replay: generator offset ", start,
             " is past 2^53 blocks");
    raw::fill_(r.offset, static_cast<double>(start));
  }
}

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  MG_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high, ValueError,
           "uniform_: expected finite low <= high, got [", low, ", ", high, ")");
  philox_fill(t, kUniform, low, high, gen);
}
void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  MG_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, ValueError,
           "normal_: expected a finite mean and a finite std >= 0, got mean ", mean, ", std ", std);
  philox_fill(t, kNormal, mean, std, gen);
}
void bernoulli_(const Tensor& t, double p, Generator* gen) {
  MG_CHECK(p >= 0 && p <= 1, ValueError, "bernoulli_: probability must be in [0, 1], got ", p);
  philox_fill(t, kBernoulli, p, 0, gen);
}

static Tensor make_random(const Shape& shape, TensorOptions opts, const std::function<void(const Tensor&)>& fill) {
  MG_CHECK(is_floating(opts.dtype), DTypeError, "rand/randn: expected a floating dtype, got ", opts.dtype);
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  fill(t);
  if (rg) t.requires_grad_(true);
  return t;
}

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  return make_random(shape, opts, [&](const Tensor& t) { uniform_(t, 0, 1, gen); });
}
Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  return make_random(shape, opts, [&](const Tensor& t) { normal_(t, 0, 1, gen); });
}
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts, Generator* gen) {
  return make_random(shape, opts, [&](const Tensor& t) { uniform_(t, low, high, gen); });
}
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts, Generator* gen) {
  return make_random(shape, opts, [&](const Tensor& t) { normal_(t, mean, std, gen); });
}

Tensor randperm(int64_t n, Generator* gen) {
  MG_CHECK(n >= 0, ValueError, "randperm: n must be >= 0, got ", n);
  Generator& g = gen ? *gen : default_generator();
  Tensor out = empty({n}, DType::i64);  // through the allocator: too large an n is an OutOfMemoryError
  int64_t* v = out.data_ptr<int64_t>();
  std::iota(v, v + n, 0);
  uint64_t base = g.reserve(static_cast<uint64_t>(n));
  // Fisher-Yates with one Philox block per swap: reproducible from the generator state.
  for (int64_t i = n - 1; i > 0; --i) {
    uint32_t r[4];
    philox4x32(base + static_cast<uint64_t>(i), 0, g.seed(), r);
    uint64_t x = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    int64_t j = static_cast<int64_t>(x % static_cast<uint64_t>(i + 1));
    std::swap(v[i], v[j]);
  }
  return out;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  int64_t range = 0;
  MG_CHECK(high > low && !__builtin_sub_overflow(high, low, &range), ValueError, "randint: high (", high,
           ") must be greater than low (", low, ") by at most 2^63 - 1");
  Tensor u = empty(shape, {DType::f64, Device::cpu()});
  uniform_(u, 0, 1, gen);
  const double* p = u.data_ptr<double>();
  std::vector<int64_t> v(u.numel());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::min<int64_t>(high - 1, low + static_cast<int64_t>(p[i] * static_cast<double>(range)));
  return from_vector(v, shape, opts);
}

}  // namespace mg
