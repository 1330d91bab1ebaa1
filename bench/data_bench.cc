// Data pipeline throughput: images/s through the DataLoader with 0 vs N worker threads (a
// per-sample augmentation + decode cost so workers matter), Fashion-MNIST from a memory-mapped
// record file vs in memory, and on CUDA: pageable vs pinned H2D bandwidth, and a training-like
// loop where the side-stream copy of batch k+1 overlaps the (simulated) step on batch k.
// Ratios are against a baseline measured in the same run. Runs on a CPU-only machine too.
// Each measurement is one JSON line with the keys bench/pytorch/data_loader.py prints for the
// same one (the suite, bench/runner, pairs them). Equal work per image on both sides: the
// augmentation's own cost is measured and the decode stand-in makes up the rest of --decode-us,
// so every image costs --decode-us of transform time (transform_us_per_image says what it was).
//
//   bench_data [--images N] [--batch B] [--workers 1,2,4,8] [--decode-us U] [--epochs E]
//              [--glibc-malloc-defaults]
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/flag_value.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "data/mmap_dataset.h"
#include "kernels/ops.h"

using namespace mg;
using namespace mg::data;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Stands in for JPEG decoding: about `us` microseconds of arithmetic per sample, deterministic
// (so it is CPU work that threads can share, not a sleep that would scale without cores).
class DecodeCost final : public Transform {
 public:
  explicit DecodeCost(int64_t iters) : iters_(iters) {}
  Tensor operator()(const Tensor& x, SampleRng& rng) const override {
    double acc = static_cast<double>(rng.next() & 0xff);
    for (int64_t i = 0; i < iters_; ++i) acc = std::sqrt(acc + static_cast<double>(i));
    sink_ = acc;  // keeps the loop
    return x;
  }
  std::string name() const override { return "DecodeCost"; }
  static int64_t iters_for_us(double us) {
    DecodeCost probe(1 << 20);
    SampleRng rng(1);
    Tensor t = zeros({1});
    const double t0 = now_s();
    probe(t, rng);
    const double per_iter = (now_s() - t0) / (1 << 20);
    return static_cast<int64_t>(us * 1e-6 / per_iter);
  }

 private:
  int64_t iters_;
  static inline thread_local double sink_ = 0;
};

struct Args {
  int64_t images = 20000;
  int64_t batch = 128;
  std::vector<int> workers{1, 2, 4, 8};
  double decode_us = 50;
  int epochs = 2;
  bool malloc_defaults = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&] { return mg::bench::flag_value("bench_data", argc, argv, i); };
    if (k == "--images")
      a.images = std::stoll(val());
    else if (k == "--batch")
      a.batch = std::stoll(val());
    else if (k == "--decode-us")
      a.decode_us = std::stod(val());
    else if (k == "--epochs")
      a.epochs = std::stoi(val());
    else if (k == "--glibc-malloc-defaults")
      a.malloc_defaults = true;
    else if (k == "--workers") {
      a.workers.clear();
      std::stringstream ss(val());
      for (std::string w; std::getline(ss, w, ',');) a.workers.push_back(std::stoi(w));
    } else {
      std::fprintf(stderr, "bench_data: unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// images/s over `epochs` epochs after one warm-up epoch (the first batch of each epoch is
// included: worker start-up counts).
double images_per_s(DataLoader& loader, int epochs) {
  for (auto& b : loader) (void)b;
  int64_t n = 0;
  const double t0 = now_s();
  for (int e = 0; e < epochs; ++e)
    for (auto& b : loader) n += b.data.size(0);
  return static_cast<double>(n) / (now_s() - t0);
}

// Microseconds per image of `t` applied serially to the first images of `ds`.
double transform_us(const Transform& t, const TensorDataset& ds, int64_t n) {
  n = std::min(n, ds.size());
  SampleRng rng(1);
  const double t0 = now_s();
  for (int64_t i = 0; i < n; ++i) (void)t(ds.get(i).data, rng);
  return (now_s() - t0) * 1e6 / static_cast<double>(n);
}

void bench_workers(const Args& a) {
  std::printf(
      "\n== DataLoader throughput, CIFAR-like 3x32x32 f32, RandomCrop(32, pad 4) + flip + Normalize, "
      "%.0f us of transform per image, batch %lld, %u hardware threads\n",
      a.decode_us, static_cast<long long>(a.batch), std::thread::hardware_concurrency());
  Tensor x = rand({a.images, 3, 32, 32});
  Tensor y = arange(a.images);
  auto ds = std::make_shared<TensorDataset>(x, y);
  const std::vector<TransformPtr> augment = {
      std::make_shared<RandomCrop>(32, 32, 4), std::make_shared<RandomHorizontalFlip>(0.5),
      std::make_shared<Normalize>(std::vector<double>{0.49, 0.48, 0.45}, std::vector<double>{0.25, 0.24, 0.26})};
  const double augment_us = transform_us(Compose(augment), *ds, 2000);
  std::vector<TransformPtr> all = {
      std::make_shared<DecodeCost>(DecodeCost::iters_for_us(std::max(0.0, a.decode_us - augment_us)))};
  all.insert(all.end(), augment.begin(), augment.end());
  auto transform = std::make_shared<Compose>(all);
  const double per_image_us = transform_us(*transform, *ds, 500);
  double base = 0;
  std::vector<int> counts{0};
  counts.insert(counts.end(), a.workers.begin(), a.workers.end());
  for (int w : counts) {
    DataLoaderOptions o;
    o.batch_size = a.batch;
    o.shuffle = true;
    o.num_workers = w;
    o.transform = transform;
    DataLoader loader(ds, o);
    const double ips = images_per_s(loader, a.epochs);
    if (w == 0) base = ips;
    std::printf(
        "{\"bench\":\"loader_workers\",\"workers\":%d,\"images_per_s\":%.0f,\"ratio_vs_0_workers\":%.2f,"
        "\"decode_us\":%.0f,\"transform_us_per_image\":%.1f}\n",
        w, ips, ips / base, a.decode_us, per_image_us);
  }
}

void bench_mmap(const Args& a) {
  const std::string root = FashionMNIST::default_root();
  if (!FashionMNIST::available(root)) {
    std::printf("\n== Fashion-MNIST mmap: skipped (no data set in %s)\n", root.c_str());
    return;
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/memgrad_fmnist_train.rec";
  double t0 = now_s();
  convert_fashion_mnist(root, true, path);
  const double convert_s = now_s() - t0;
  auto mm = fashion_mnist_mmap(path, true);
  FashionMNISTOptions fo;
  fo.normalize = true;
  t0 = now_s();
  auto mem = std::make_shared<FashionMNIST>(Split::Train, root, fo);
  const double load_s = now_s() - t0;
  std::printf(
      "\n== Fashion-MNIST train (60000), shuffled, batch %lld: IDX->record file %.2f s (once), "
      "IDX->memory %.2f s (every run)\n",
      static_cast<long long>(a.batch), convert_s, load_s);
  MmapDatasetOptions keep_opts;
  keep_opts.out_dtype = DType::f32;
  keep_opts.scale = 1.0 / (255.0 * fo.std);
  keep_opts.shift = -fo.mean / fo.std;
  keep_opts.resident_budget = 0;
  auto kept = std::make_shared<MmapDataset>(path, fashion_mnist_layout(), keep_opts);
  double base = 0;
  for (auto [name, ds] : {std::pair<const char*, std::shared_ptr<const Dataset>>{"in-memory", mem},
                          {"mmap, resident budget 32 MiB", mm},
                          {"mmap, pages kept", kept}}) {
    DataLoaderOptions o;
    o.batch_size = a.batch;
    o.shuffle = true;
    DataLoader loader(ds, o);
    const double ips = images_per_s(loader, a.epochs);
    if (base == 0) base = ips;
    std::printf(
        "{\"bench\":\"fashion_mnist_mmap\",\"dataset\":\"%s\",\"images_per_s\":%.0f,\"ratio_vs_in_memory\":%.2f}\n",
        name, ips, ips / base);
  }
  std::printf("resident after the passes: budget 32 MiB %.1f MiB, pages kept %.1f MiB, of a %.1f MiB file\n",
              mm->resident_bytes() / 1048576.0, kept->resident_bytes() / 1048576.0, mm->file_bytes() / 1048576.0);
}

// Host->device bandwidth of one batch-sized tensor, pageable vs pinned.
void bench_h2d(int64_t bytes) {
  Tensor host = rand({bytes / 4});
  Tensor pinned = cuda::pin_memory(host);
  Tensor dev = empty({bytes / 4}, {DType::f32, Device::cuda(0)});
  double base = 0;
  std::printf("\n== H2D copy of %.1f MiB\n", bytes / 1048576.0);
  for (auto [name, src] : {std::pair<const char*, Tensor>{"pageable", host}, {"pinned", pinned}}) {
    raw::copy_(dev, src);  // warm-up
    cuda::synchronize(0);
    const int reps = 20;
    const double t0 = now_s();
    for (int r = 0; r < reps; ++r) raw::copy_(dev, src, /*non_blocking=*/true);
    cuda::synchronize(0);
    const double gbs = reps * static_cast<double>(bytes) / (now_s() - t0) / 1e9;
    if (base == 0) base = gbs;
    std::printf("{\"bench\":\"h2d\",\"memory\":\"%s\",\"GB_per_s\":%.2f,\"ratio_vs_pageable\":%.2f}\n", name, gbs,
                gbs / base);
  }
}

// A step that keeps the device busy for about as long as one batch's copy: a chain of matmuls.
struct Step {
  Tensor w;
  int reps = 1;
  Tensor run(const Tensor& batch) const {
    Tensor flat = raw::reshape(batch, {batch.size(0), -1});
    Tensor h = raw::contiguous(raw::slice(flat, 1, 0, w.size(0), 1));
    Tensor acc;
    for (int r = 0; r < reps; ++r) acc = kernels::matmul(h, w);
    return kernels::sum(acc);
  }
};

double ms_per_batch(DataLoader& loader, const Step& step, bool copy_here) {
  int64_t n = 0;
  Tensor total;
  for (int e = 0; e < 2; ++e) {  // epoch 0 warms up pools and allocator
    cuda::synchronize(0);
    const double t0 = now_s();
    n = 0;
    for (auto& b : loader) {
      // The serial baseline: a blocking copy on the compute stream, then the step.
      Tensor x = copy_here ? raw::to_device(b.data, Device::cuda(0)) : b.data;
      Tensor s = step.run(x);
      total = total.defined() ? kernels::add(total, s) : s;
      ++n;
    }
    cuda::synchronize(0);
    if (e == 1) return (now_s() - t0) * 1e3 / static_cast<double>(n);
  }
  return 0;
}

void bench_overlap(const Args& a) {
  // ImageNet-sized batches: 64 x 3 x 224 x 224 f32 = 36.8 MiB per batch, 16 batches an epoch.
  const int64_t b = 64, n = 16 * b;
  Tensor x = rand({n, 3, 224, 224});
  Tensor y = zeros({n}, {DType::i64});
  auto ds = std::make_shared<TensorDataset>(x, y);
  const int64_t batch_bytes = b * 3 * 224 * 224 * 4;
  bench_h2d(batch_bytes);

  // Calibrate the step to about one pinned copy's time.
  Tensor pinned = cuda::pin_memory(raw::slice(x, 0, 0, b, 1));
  Tensor dev = empty(pinned.sizes(), {DType::f32, Device::cuda(0)});
  cuda::synchronize(0);
  double t0 = now_s();
  for (int r = 0; r < 10; ++r) raw::copy_(dev, pinned, true);
  cuda::synchronize(0);
  const double copy_ms = (now_s() - t0) * 100;
  Step step{rand({4096, 4096}, {DType::f32, Device::cuda(0)}), 1};
  step.run(dev);
  cuda::synchronize(0);
  t0 = now_s();
  for (int r = 0; r < 5; ++r) step.run(dev);
  cuda::synchronize(0);
  const double one = (now_s() - t0) * 200;
  step.reps = std::max(1, static_cast<int>(std::lround(copy_ms / one)));
  t0 = now_s();
  for (int r = 0; r < 5; ++r) step.run(dev);
  cuda::synchronize(0);
  const double step_ms = (now_s() - t0) * 200;

  std::printf(
      "\n== Copy/step overlap, batch 64x3x224x224 f32, 4 workers: copy alone %.2f ms (pinned), "
      "step alone %.2f ms (%d matmuls 64x4096x4096)\n",
      copy_ms, step_ms, step.reps);
  struct Mode {
    const char* name;
    bool pin;
    bool side_stream;
  };
  double base = 0;
  // Mode names as bench/pytorch/data_loader.py prints them ("serial": a blocking copy).
  for (Mode m : {Mode{"serial pageable", false, false}, Mode{"side stream pageable", false, true},
                 Mode{"serial pinned", true, false}, Mode{"side stream pinned", true, true}}) {
    DataLoaderOptions o;
    o.batch_size = b;
    o.num_workers = 4;
    o.pin_memory = m.pin;
    o.device = m.side_stream ? Device::cuda(0) : Device::cpu();
    DataLoader loader(ds, o);
    const double ms = ms_per_batch(loader, step, !m.side_stream);
    if (base == 0) base = ms;
    std::printf(
        "{\"bench\":\"overlap\",\"mode\":\"%s\",\"ms_per_batch\":%.2f,\"speedup_vs_serial_pageable\":%.2f,"
        "\"copy_ms\":%.2f,\"step_reps\":%d}\n",
        m.name, ms, base / ms, copy_ms, step.reps);
  }
  std::printf("(perfect overlap: ms/batch = max(copy, step) = %.2f; none: copy + step = %.2f)\n",
              std::max(copy_ms, step_ms), copy_ms + step_ms);
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  if (!a.malloc_defaults) {
    // glibc's main arena gives batch-sized blocks back to the kernel after each free (trim and
    // the sliding mmap threshold), so the main thread page-faults every batch in again: measured
    // 4-5x slower than a worker thread's arena for the same loading. Fixed thresholds keep the
    // 0-worker baseline honest; --glibc-malloc-defaults shows the untuned behaviour.
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  }
  std::printf("malloc: %s\n", a.malloc_defaults ? "glibc defaults" : "fixed mmap/trim thresholds (64/256 MiB)");
  bench_workers(a);
  bench_mmap(a);
  if (cuda::is_available())
    bench_overlap(a);
  else
    std::printf("\n== CUDA parts skipped: no device (pinned memory and side-stream copies need one)\n");
  return 0;
}
