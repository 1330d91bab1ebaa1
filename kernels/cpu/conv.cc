// 2-D convolution on the CPU: im2col + one Eigen GEMM per group over a chunk of the
// mini-batch (so small feature maps still make wide GEMMs), and col2im for the input grad.
//
// Shapes: x [N, C, H, W], w [O, Cg = C/G, kH, kW], out [N, O, Ho, Wo]. For group g and
// samples [n0, n1) the column matrix is cols [K = Cg*kH*kW, (n1-n0)*L], L = Ho*Wo, with
// cols[(c*kH + i)*kW + j][(n-n0)*L + oh*Wo + ow] = x[n, g*Cg + c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
// (0 outside the input). Then out_g = W_g [Og, K] @ cols, dW_g += grad_g @ cols^T, and
// dcols = W_g^T @ grad_g is scattered back (col2im) into dx.
#include <Eigen/Core>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Map = Eigen::Map<RowMat<T>>;
template <class T>
using CMap = Eigen::Map<const RowMat<T>>;
// A column block of a row-major matrix (row stride = the full matrix's width).
template <class T>
using SMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using CSMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;

struct Geo {
  int64_t N, C, H, W, O, kh, kw, Ho, Wo, G, Cg, Og, K, L;
  int64_t sh, sw, ph, pw, dh, dw;
};

Geo geometry(const Shape& x, const Shape& w, int64_t Ho, int64_t Wo, const Conv2dArgs& a) {
  Geo g{};
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
  g.O = w[0], g.Cg = w[1], g.kh = w[2], g.kw = w[3];
  g.Ho = Ho, g.Wo = Wo, g.G = a.groups, g.Og = g.O / g.G;
  g.K = g.Cg * g.kh * g.kw, g.L = Ho * Wo;
  g.sh = a.stride.h, g.sw = a.stride.w, g.ph = a.padding.h, g.pw = a.padding.w;
  g.dh = a.dilation.h, g.dw = a.dilation.w;
  return g;
}

// Output positions o in [lo, hi) have 0 <= o*s + off < n_in (the others read padding).
void valid_range(int64_t n_out, int64_t n_in, int64_t s, int64_t off, int64_t* lo, int64_t* hi) {
  const int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
  const int64_t last = n_in - 1 - off;  // largest o*s allowed
  const int64_t h = last < 0 ? 0 : last / s + 1;
  *lo = std::min(l, n_out);
  *hi = std::max(*lo, std::min(h, n_out));
}

// Walks every (column row, sample, output row) of the cols matrix for group `grp` and
// samples [n0, n1), calling row_fn(col_row_ptr, input_row_ptr, wlo, whi) for output rows
// that read the input and pad_fn(col_row_ptr) for rows entirely in the padding.
template <class T, class RowFn, class PadFn>
void for_each_col_row(const Geo& g, T* x, T* cols, int64_t grp, int64_t n0, int64_t n1, RowFn row_fn, PadFn pad_fn) {
  const int64_t ld = (n1 - n0) * g.L;
  for (int64_t c = 0; c < g.Cg; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T* dst = cols + ((c * g.kh + i) * g.kw + j) * ld;
        const int64_t off_h = i * g.dh - g.ph, off_w = j * g.dw - g.pw;
        int64_t hl, hh, wl, wh;
        valid_range(g.Ho, g.H, g.sh, off_h, &hl, &hh);
        valid_range(g.Wo, g.W, g.sw, off_w, &wl, &wh);
        for (int64_t n = n0; n < n1; ++n) {
          T* plane = x + ((n * g.C + grp * g.Cg + c) * g.H) * g.W;
          T* d = dst + (n - n0) * g.L;
          for (int64_t oh = 0; oh < g.Ho; ++oh) {
            T* drow = d + oh * g.Wo;
            if (oh < hl || oh >= hh) {
              pad_fn(drow);
              continue;
            }
            // srow[ow * sw] is the input element read by output column ow.
            row_fn(drow, plane + (oh * g.sh + off_h) * g.W + off_w, wl, wh);
          }
        }
      }
}

template <class T>
void im2col(const Geo& g, const T* x, T* cols, int64_t grp, int64_t n0, int64_t n1) {
  const int64_t Wo = g.Wo, sw = g.sw;
  for_each_col_row<T>(
      g, const_cast<T*>(x), cols, grp, n0, n1,
      [Wo, sw](T* drow, const T* srow, int64_t wl, int64_t wh) {
        std::fill(drow, drow + wl, T(0));
        if (sw == 1) {
          std::memcpy(drow + wl, srow + wl, sizeof(T) * (wh - wl));
        } else {
          for (int64_t ow = wl; ow < wh; ++ow) drow[ow] = srow[ow * sw];
        }
        std::fill(drow + wh, drow + Wo, T(0));
      },
      [Wo](T* drow) { std::fill(drow, drow + Wo, T(0)); });
}

// dx += col2im(dcols): the adjoint of im2col.
template <class T>
void col2im(const Geo& g, T* dx, T* dcols, int64_t grp, int64_t n0, int64_t n1) {
  const int64_t sw = g.sw;
  for_each_col_row<T>(
      g, dx, dcols, grp, n0, n1,
      [sw](T* drow, T* xrow, int64_t wl, int64_t wh) {
        for (int64_t ow = wl; ow < wh; ++ow) xrow[ow * sw] += drow[ow];
      },
      [](T*) {});
}

// gmat [Og, (n1-n0)*L] <- grad_out[n, grp*Og + o, :] for n in [n0, n1).
template <class T>
void gather_grad(const Geo& g, const T* gout, T* gmat, int64_t grp, int64_t n0, int64_t n1) {
  const int64_t ld = (n1 - n0) * g.L;
  for (int64_t o = 0; o < g.Og; ++o)
    for (int64_t n = n0; n < n1; ++n)
      std::memcpy(gmat + o * ld + (n - n0) * g.L, gout + (n * g.O + grp * g.Og + o) * g.L, sizeof(T) * g.L);
}

// Samples per chunk: about 1M column elements (4 MiB in f32: the buffer is written by
// im2col and read back by the GEMM right away, so it should stay near the cache), and few
// enough that every worker gets a chunk; never below one sample.
int64_t chunk_size(const Geo& g, int workers) {
  const int64_t per_sample = std::max<int64_t>(g.K * g.L, 1);
  const int64_t per_worker = (g.N + workers - 1) / workers;
  return std::clamp<int64_t>((int64_t{1} << 20) / per_sample, 1, std::max<int64_t>(per_worker, 1));
}

// Runs f(chunk_begin, chunk_end, worker) over the batch in chunks, on up to `workers`
// threads (worker 0 is the caller). Chunks are disjoint in the batch, so writes to
// per-sample outputs never race.
template <class F>
void for_chunks(int64_t N, int64_t chunk, int workers, F f) {
  const int64_t n_chunks = (N + chunk - 1) / chunk;
  workers = static_cast<int>(std::min<int64_t>(workers, n_chunks));
  auto work = [&](int wkr) {
    for (int64_t c = wkr; c < n_chunks; c += workers) f(c * chunk, std::min(N, (c + 1) * chunk), wkr);
  };
  if (workers <= 1) {
    if (n_chunks > 0) work(0);
    return;
  }
  std::vector<std::thread> ts;
  for (int k = 1; k < workers; ++k) ts.emplace_back(work, k);
  work(0);
  for (auto& t : ts) t.join();
}

// Threads for one conv call: all of them, but only when each gets real work (thread
// start-up costs tens of microseconds).
int num_workers(const Geo& g) {
  const double flops = 2.0 * g.N * g.O * g.L * g.K;
  return flops < 4e6 ? 1 : cpu::num_threads();
}

// Per-worker scratch buffers, allocated before any thread starts (the allocator and the
// memory statistics then see them, under the caller's memory category).
template <class T>
std::vector<Tensor> workspace(int workers, int64_t elems) {
  std::vector<Tensor> ws;
  for (int k = 0; k < workers; ++k) ws.push_back(empty({elems}, {dtype_of<T>}));
  return ws;
}

// Feature maps at least this wide get one GEMM per sample writing straight into the NCHW
// tensor (a column block of cols); narrower ones one GEMM per chunk through a scratch
// matrix, so the GEMM stays wide (e.g. 7x7 maps late in a network).
constexpr int64_t kDirectMinL = 64;

// How one conv pass splits the batch, shared by forward and both backwards: the worker
// count, samples per chunk, whether GEMMs read / write the NCHW tensor in place (`direct`),
// and each worker's scratch: `cols` [K, chunk*L] for im2col, and `staging` [Og, chunk*L]
// for the output or gradient block when not direct.
template <class T>
struct ChunkPlan {
  explicit ChunkPlan(const Geo& g)
      : workers(num_workers(g)),
        chunk(chunk_size(g, workers)),
        direct(g.L >= kDirectMinL),
        cols(workspace<T>(workers, g.K * chunk * g.L)),
        staging(workspace<T>(direct ? 0 : workers, g.Og * chunk * g.L)) {}

  // Runs f(chunk_begin, chunk_end, worker) over the batch.
  template <class F>
  void run(const Geo& g, F f) const {
    for_chunks(g.N, chunk, workers, f);
  }

  const int workers;
  const int64_t chunk;
  const bool direct;
  const std::vector<Tensor> cols, staging;
};

template <class T>
void forward_t(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& a, const Tensor& out) {
  const Geo g = geometry(x.sizes(), w.sizes(), out.size(2), out.size(3), a);
  const T* px = static_cast<const T*>(x.raw_data());
  const T* pw = static_cast<const T*>(w.raw_data());
  const T* pb = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
  T* po = static_cast<T*>(out.raw_data());
  const ChunkPlan<T> plan(g);
  plan.run(g, [&](int64_t n0, int64_t n1, int wkr) {
    const int64_t nl = (n1 - n0) * g.L;
    T* pc = data_as<T>(plan.cols[wkr]);
    for (int64_t grp = 0; grp < g.G; ++grp) {
      im2col(g, px, pc, grp, n0, n1);
      const CMap<T> Wg(pw + grp * g.Og * g.K, g.Og, g.K);
      if (plan.direct) {
        for (int64_t n = n0; n < n1; ++n) {
          Map<T> On(po + (n * g.O + grp * g.Og) * g.L, g.Og, g.L);
          On.noalias() = Wg * CSMap<T>(pc + (n - n0) * g.L, g.K, g.L, Eigen::OuterStride<>(nl));
        }
      } else {
        Map<T> R(data_as<T>(plan.staging[wkr]), g.Og, nl);
        R.noalias() = Wg * CMap<T>(pc, g.K, nl);
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t o = 0; o < g.Og; ++o)
            std::memcpy(po + (n * g.O + grp * g.Og + o) * g.L, data_as<T>(plan.staging[wkr]) + o * nl + (n - n0) * g.L,
                        sizeof(T) * g.L);
      }
      if (pb)
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t o = 0; o < g.Og; ++o) {
            T* dst = po + (n * g.O + grp * g.Og + o) * g.L;
            const T b = pb[grp * g.Og + o];
            for (int64_t l = 0; l < g.L; ++l) dst[l] += b;
          }
    }
  });
}

template <class T>
void backward_input_t(const Tensor& gout, const Tensor& w, const Conv2dArgs& a, const Tensor& gx) {
  const Geo g = geometry(gx.sizes(), w.sizes(), gout.size(2), gout.size(3), a);
  const T* pg = static_cast<const T*>(gout.raw_data());
  const T* pw = static_cast<const T*>(w.raw_data());
  T* pdx = static_cast<T*>(gx.raw_data());
  std::fill(pdx, pdx + gx.numel(), T(0));
  const ChunkPlan<T> plan(g);
  plan.run(g, [&](int64_t n0, int64_t n1, int wkr) {
    const int64_t nl = (n1 - n0) * g.L;
    T* pd = data_as<T>(plan.cols[wkr]);
    for (int64_t grp = 0; grp < g.G; ++grp) {
      const auto WgT = CMap<T>(pw + grp * g.Og * g.K, g.Og, g.K).transpose();
      if (plan.direct) {
        for (int64_t n = n0; n < n1; ++n) {
          SMap<T> Dn(pd + (n - n0) * g.L, g.K, g.L, Eigen::OuterStride<>(nl));
          Dn.noalias() = WgT * CMap<T>(pg + (n * g.O + grp * g.Og) * g.L, g.Og, g.L);
        }
      } else {
        T* pgm = data_as<T>(plan.staging[wkr]);
        gather_grad(g, pg, pgm, grp, n0, n1);
        Map<T>(pd, g.K, nl).noalias() = WgT * CMap<T>(pgm, g.Og, nl);
      }
      col2im(g, pdx, pd, grp, n0, n1);
    }
  });
}

template <class T>
void backward_weight_t(const Tensor& gout, const Tensor& x, const Conv2dArgs& a, const Tensor& gw) {
  const Geo g = geometry(x.sizes(), gw.sizes(), gout.size(2), gout.size(3), a);
  const T* pg = static_cast<const T*>(gout.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  T* pdw = static_cast<T*>(gw.raw_data());
  const ChunkPlan<T> plan(g);
  // One accumulator per worker (the weight is shared by every chunk), summed at the end.
  std::vector<Tensor> acc = workspace<T>(plan.workers - 1, gw.numel());
  acc.insert(acc.begin(), gw);
  for (const Tensor& t : acc) std::fill(data_as<T>(t), data_as<T>(t) + t.numel(), T(0));
  plan.run(g, [&](int64_t n0, int64_t n1, int wkr) {
    const int64_t nl = (n1 - n0) * g.L;
    T* pc = data_as<T>(plan.cols[wkr]);
    for (int64_t grp = 0; grp < g.G; ++grp) {
      im2col(g, px, pc, grp, n0, n1);
      Map<T> dW(data_as<T>(acc[wkr]) + grp * g.Og * g.K, g.Og, g.K);
      if (plan.direct) {
        for (int64_t n = n0; n < n1; ++n)
          dW.noalias() += CMap<T>(pg + (n * g.O + grp * g.Og) * g.L, g.Og, g.L) *
                          CSMap<T>(pc + (n - n0) * g.L, g.K, g.L, Eigen::OuterStride<>(nl)).transpose();
      } else {
        T* pgm = data_as<T>(plan.staging[wkr]);
        gather_grad(g, pg, pgm, grp, n0, n1);
        dW.noalias() += CMap<T>(pgm, g.Og, nl) * CMap<T>(pc, g.K, nl).transpose();
      }
    }
  });
  for (size_t k = 1; k < acc.size(); ++k) {
    const T* a = data_as<T>(acc[k]);
    for (int64_t i = 0; i < gw.numel(); ++i) pdw[i] += a[i];
  }
}

}  // namespace

template <>
void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args,
                                const Tensor& out) {
  if (x.dtype() == DType::f64) return forward_t<double>(x, w, bias, args, out);
  forward_t<float>(x, w, bias, args, out);
}

template <>
void CpuBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Conv2dArgs& args,
                                       const Tensor& grad_x) {
  if (w.dtype() == DType::f64) return backward_input_t<double>(grad_out, w, args, grad_x);
  backward_input_t<float>(grad_out, w, args, grad_x);
}

template <>
void CpuBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Conv2dArgs& args,
                                        const Tensor& grad_w) {
  if (x.dtype() == DType::f64) return backward_weight_t<double>(grad_out, x, args, grad_w);
  backward_weight_t<float>(grad_out, x, args, grad_w);
}

}  // namespace mg::kernels
