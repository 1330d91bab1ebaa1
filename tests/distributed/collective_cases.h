// Collective values on any backend: every rank builds inputs from its rank, runs the
// collective, and checks the closed-form result. Shared by the CPU and the NCCL test binaries.
#pragma once

#include "core/random.h"
#include "kernels/ops.h"
#include "tests/distributed/dist_test_util.h"

namespace mg::dist::testing {

inline Tensor on(const Tensor& t, DType dt, Device dev) { return raw::to_device(raw::to_dtype(t, dt), dev); }

inline std::vector<double> host(const Tensor& t) { return t.cpu().to_vector<double>(); }

// Sum, avg and max all-reduce, broadcast from the last rank, all-gather, reduce-scatter,
// the blocking form on a non-contiguous view, two collectives in flight at once, barrier.
inline void collectives_case(Backend backend, DType dt, int world) {
  run_ranks(world, [&](int rank, int W) {
    auto pg = join(backend);
    ASSERT_EQ(pg->rank(), rank);
    ASSERT_EQ(pg->size(), W);
    const Device dev = pg->device();
    const int64_t n = 15;
    const double tri = W * (W + 1) / 2.0;
    auto iota = [&](double scale, double shift) {
      std::vector<double> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = scale * (i + 1) + shift;
      return on(from_vector(v, {5, 3}), dt, dev);
    };

    Tensor s = iota(rank + 1, 0);  // (rank + 1) * (i + 1)
    pg->all_reduce(s, ReduceOp::Sum);
    auto sv = host(s);
    for (int64_t i = 0; i < n; ++i) EXPECT_DOUBLE_EQ(sv[i], tri * (i + 1)) << "sum, element " << i;

    if (is_floating(dt)) {
      Tensor a = iota(rank + 1, 0);
      pg->all_reduce(a, ReduceOp::Avg);
      auto av = host(a);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(av[i], tri * (i + 1) / W, 1e-5 * (i + 1)) << "avg, element " << i;
    }

    std::vector<double> mv(n);
    for (int64_t i = 0; i < n; ++i) mv[i] = (i % 3 == 0 ? 1 : -1) * rank;
    Tensor m = on(from_vector(mv, {n}), dt, dev);
    pg->all_reduce(m, ReduceOp::Max);
    auto mx = host(m);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(mx[i], i % 3 == 0 ? W - 1 : 0) << "max, element " << i;

    Tensor b = iota(0, 100 * rank);  // every element = 100 * rank
    pg->broadcast(b, W - 1);
    for (double v : host(b)) EXPECT_EQ(v, 100.0 * (W - 1)) << "broadcast from rank " << W - 1;

    Tensor g = pg->all_gather(
        on(from_vector(std::vector<double>{10.0 * rank, 10.0 * rank + 1, 10.0 * rank + 2, 10.0 * rank + 3}, {2, 2}), dt,
           dev));
    ASSERT_EQ(g.sizes(), (Shape{W, 2, 2}));
    auto gv = host(g);
    for (int r = 0; r < W; ++r)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(gv[r * 4 + j], 10.0 * r + j) << "all_gather, rank " << r << " elem " << j;

    std::vector<double> rsv(3 * W);
    for (int k = 0; k < 3 * W; ++k) rsv[k] = rank + k;
    Tensor out = on(zeros({3}), dt, dev);
    pg->reduce_scatter(out, on(from_vector(rsv, {3 * W}), dt, dev), ReduceOp::Sum);
    auto ov = host(out);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(ov[j], W * (W - 1) / 2.0 + W * (rank * 3 + j)) << "reduce_scatter " << j;

    // A transposed (non-contiguous) view through the blocking form.
    Tensor base = iota(rank + 1, 0);
    Tensor view = raw::transpose(base, 0, 1);
    pg->all_reduce(view, ReduceOp::Sum);
    auto bv = host(base);
    for (int64_t i = 0; i < n; ++i) EXPECT_DOUBLE_EQ(bv[i], tri * (i + 1)) << "strided all_reduce " << i;

    // Two in flight, waited in reverse order.
    Tensor x1 = iota(rank + 1, 0), x2 = iota(2.0 * (rank + 1), 0);
    WorkPtr w1 = pg->all_reduce_async(x1, ReduceOp::Sum);
    WorkPtr w2 = pg->all_reduce_async(x2, ReduceOp::Sum);
    w2->wait();
    w1->wait();
    w1->synchronize();
    w2->synchronize();
    EXPECT_TRUE(w1->completed() && w2->completed());
    auto x2v = host(x2);
    for (int64_t i = 0; i < n; ++i) EXPECT_DOUBLE_EQ(x2v[i], 2 * tri * (i + 1)) << "async, element " << i;

    pg->barrier();
  });
}

}  // namespace mg::dist::testing
