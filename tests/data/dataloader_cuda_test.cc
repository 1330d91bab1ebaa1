// DataLoader on a CUDA device: pinned host batches (pooled, reused), batches copied on the
// side stream and consumed on the current stream with the same values as on the CPU, with
// workers and without, on the default stream and under a StreamGuard. Skips without a GPU.
#include <gtest/gtest.h>

#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "data/dataloader.h"
#include "kernels/ops.h"

namespace mg::data {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// n samples [1, 16, 16] of small integers (exact in f32 sums), target = i.
std::shared_ptr<TensorDataset> ds(int64_t n) {
  std::vector<float> d;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) {
    for (int p = 0; p < 256; ++p) d.push_back(static_cast<float>((i * 7 + p) % 13));
    t.push_back(i);
  }
  return std::make_shared<TensorDataset>(from_vector(d, {n, 1, 16, 16}), from_vector(t, {n}));
}

DataLoaderOptions opts(int workers, bool pin, Device dev) {
  DataLoaderOptions o;
  o.batch_size = 32;
  o.shuffle = true;
  o.seed = 9;
  o.num_workers = workers;
  o.pin_memory = pin;
  o.device = dev;
  o.transform = std::make_shared<RandomHorizontalFlip>(0.5);
  return o;
}

TEST(DataLoaderCuda, PinnedBatchesArePinnedEqualAndReused) {
  SKIP_WITHOUT_GPU();
  auto data = ds(1000);  // 32 batches per epoch
  DataLoader plain(data, opts(2, false, Device::cpu())), pinned(data, opts(2, true, Device::cpu()));
  int64_t batches = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    auto a = plain.begin();
    for (auto b = pinned.begin(); b != pinned.end(); ++b, ++a) {
      ASSERT_TRUE(cuda::is_pinned(b->data));
      ASSERT_TRUE(cuda::is_pinned(b->target));
      ASSERT_FALSE(cuda::is_pinned(a->data));
      ASSERT_EQ(b->data.to_vector<float>(), a->data.to_vector<float>());
      ASSERT_EQ(b->target.to_vector<int64_t>(), a->target.to_vector<int64_t>());
      ++batches;
    }
  }
  EXPECT_EQ(batches, 96);
  // 96 batches (192 tensors) went through a pool of at most 2 * (window + 4) = 16 buffers.
  EXPECT_GT(pinned.pinned_buffers(), 0);
  EXPECT_LE(pinned.pinned_buffers(), 16);
}

// A step on the consumer stream: a matmul reading the batch (keeps the device busy while the
// next batch is copied) whose total is the batch's sum.
Tensor step_sum(const Tensor& x) {
  Tensor flat = raw::reshape(x, {x.size(0), -1});
  Tensor w = ones({flat.size(1), 64}, {DType::f32, x.device()});
  Tensor y = flat;
  for (int k = 0; k < 4; ++k) y = kernels::matmul(flat, w);  // repeated work, same result
  return kernels::mul_scalar(kernels::sum(y), 1.0 / 64.0);
}

void check_device_loader(int workers, bool pin) {
  auto data = ds(700);
  DataLoader ref(data, opts(0, false, Device::cpu()));
  DataLoader dev(data, opts(workers, pin, Device::cuda(0)));
  for (int epoch = 0; epoch < 2; ++epoch) {
    double want = 0;
    std::vector<int64_t> want_t;
    for (auto& b : ref) {
      for (float v : b.data.to_vector<float>()) want += v;
      auto t = b.target.to_vector<int64_t>();
      want_t.insert(want_t.end(), t.begin(), t.end());
    }
    Tensor acc = zeros({}, {DType::f32, Device::cuda(0)});
    std::vector<Tensor> targets;
    for (auto& b : dev) {
      ASSERT_TRUE(b.data.is_cuda());
      ASSERT_TRUE(b.target.is_cuda());
      acc = kernels::add(acc, step_sum(b.data));  // no host sync inside the loop
      targets.push_back(b.target);
    }
    EXPECT_EQ(acc.item(), want) << workers << " workers, pin " << pin << ", epoch " << epoch;
    std::vector<int64_t> got_t;
    for (auto& t : targets) {
      auto v = t.to_vector<int64_t>();
      got_t.insert(got_t.end(), v.begin(), v.end());
    }
    EXPECT_EQ(got_t, want_t);
  }
}

TEST(DataLoaderCuda, DeviceBatchesMatchCpuPageable) {
  SKIP_WITHOUT_GPU();
  check_device_loader(0, false);
  check_device_loader(3, false);
}

TEST(DataLoaderCuda, DeviceBatchesMatchCpuPinned) {
  SKIP_WITHOUT_GPU();
  check_device_loader(0, true);
  check_device_loader(3, true);
}

TEST(DataLoaderCuda, ConsumerOnANonDefaultStream) {
  SKIP_WITHOUT_GPU();
  cuda::Stream s = cuda::Stream::create(0);
  cuda::StreamGuard g(s);  // batches must be ready on this stream, not the default one
  check_device_loader(2, true);
  s.synchronize();
}

}  // namespace
}  // namespace mg::data
