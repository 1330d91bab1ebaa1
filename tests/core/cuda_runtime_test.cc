// The CUDA runtime and the caching allocator on a real device. Every test skips (and is
// counted as skipped) on a machine without a GPU.
#include <gtest/gtest.h>

#include <limits>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mg {
namespace {

#define REQUIRE_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine"

const Device kGpu = Device::cuda(0);

Tensor mul_by_10(const Tensor& t) {
  Tensor out = raw::clone(t);
  float* p = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] *= 10;
  return out;
}

TEST(CudaRuntime, NoDeviceIsAClearError) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_THROW(empty({4}, {DType::f32, kGpu}), DeviceError);
}

TEST(CudaRuntime, DeviceProperties) {
  REQUIRE_GPU();
  auto p = cuda::get_device_properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.total_memory, int64_t{1} << 30);
  EXPECT_GT(p.multi_processor_count, 0);
  EXPECT_GE(p.major, 7);
  std::printf("device 0: %s, %.1f GiB, %d SMs, sm_%d%d\n", p.name.c_str(), p.total_memory / 1073741824.0,
              p.multi_processor_count, p.major, p.minor);
  EXPECT_THROW(cuda::get_device_properties(cuda::device_count()), DeviceError);
  EXPECT_THROW(cuda::set_device(-1), DeviceError);
  {
    cuda::DeviceGuard g(0);
    EXPECT_EQ(cuda::current_device(), 0);
  }
}

TEST(CudaRuntime, RoundTripAllDtypes) {
  REQUIRE_GPU();
  Generator gen(1);
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8, DType::b8}) {
    Tensor h = raw::to_dtype(mul_by_10(randn({37, 5}, DType::f32, &gen)), d);
    Tensor g = raw::to_device(h, kGpu);
    EXPECT_TRUE(g.is_cuda());
    Tensor back = raw::to_device(g, Device::cpu());
    EXPECT_EQ(back.to_vector<double>(), h.to_vector<double>()) << dtype_name(d);
  }
}

TEST(CudaRuntime, StridedCastsAndFillsOnDevice) {
  REQUIRE_GPU();
  Generator gen(2);
  Tensor h = randn({6, 7}, DType::f32, &gen);
  Tensor g = raw::to_device(h, kGpu);
  // Transposed view -> contiguous f16 on the device, compared with the same on the host.
  Tensor gt = raw::to_dtype(raw::contiguous(raw::transpose(g, 0, 1)), DType::bf16);
  Tensor ht = raw::to_dtype(raw::contiguous(raw::transpose(h, 0, 1)), DType::bf16);
  EXPECT_EQ(raw::to_device(gt, Device::cpu()).to_vector<float>(), ht.to_vector<float>());
  Tensor col = raw::select(g, 1, 3);
  raw::fill_(col, 2.5);
  auto v = raw::to_device(g, Device::cpu()).to_vector<float>();
  for (int r = 0; r < 6; ++r) EXPECT_EQ(v[r * 7 + 3], 2.5f);
  EXPECT_EQ(v[0], h.to_vector<float>()[0]);
}

// Out-of-range and NaN floating values cast to integers the same way on both devices (NaN -> 0,
// saturation at int64's limits, then modulo 2^bits; tensor_test has the CPU's expected values).
TEST(CudaRuntime, FloatToIntegerCastsMatchCpuOutOfRange) {
  REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  Tensor h = from_vector(std::vector<double>{nan, 1e30, -1e30, inf, -inf, 3.7, -3.7, 300.0}, {8});
  for (DType from : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    Tensor hf = raw::to_dtype(h, from);
    Tensor gf = raw::to_device(hf, kGpu);
    for (DType to : {DType::i64, DType::i32, DType::u8}) {
      Tensor g = raw::to_device(raw::to_dtype(gf, to), Device::cpu());
      EXPECT_EQ(g.to_vector<int64_t>(), raw::to_dtype(hf, to).to_vector<int64_t>())
          << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

TEST(CudaRuntime, PhiloxMatchesCpu) {
  REQUIRE_GPU();
  Generator a(99), b(99);
  auto cpu = randn({1001}, DType::f32, &a).to_vector<float>();
  auto gpu = raw::to_device(randn({1001}, {DType::f32, kGpu}, &b), Device::cpu()).to_vector<float>();
  for (size_t i = 0; i < cpu.size(); ++i) ASSERT_NEAR(cpu[i], gpu[i], 1e-5) << i;
  auto cu = rand({333}, DType::f64, &a).to_vector<double>();
  auto gu = raw::to_device(rand({333}, {DType::f64, kGpu}, &b), Device::cpu()).to_vector<double>();
  EXPECT_EQ(cu, gu);
  // A fill of more than 2^21 elements splits over the host's threads: still the same values.
  const int64_t big = (int64_t{3} << 20) + 5;
  auto cb = rand({big}, DType::f64, &a).to_vector<double>();
  auto gb = raw::to_device(rand({big}, {DType::f64, kGpu}, &b), Device::cpu()).to_vector<double>();
  EXPECT_EQ(cb, gb);
}

// Pinned host memory is host-resident state: it counts in the host's categories (the one active
// when it was pinned) while it lives, and not after.
TEST(CudaRuntime, PinnedMemoryCountsInTheHostsCategories) {
  REQUIRE_GPU();
  CategoryStats& host = CategoryStats::get(Device::cpu());
  Tensor src = arange(1 << 18, DType::f32);  // 1 MiB, counted as it is made (Other)
  const int64_t before = host.counter(MemoryCategory::OptimizerState).current;
  {
    Tensor pinned;
    {
      MemoryCategoryGuard cat(MemoryCategory::OptimizerState);
      pinned = cuda::pin_memory(src);
    }
    EXPECT_EQ(host.counter(MemoryCategory::OptimizerState).current - before, int64_t{1} << 20);
    // The storage says so too: a copy made by category (Module::to) stays optimizer state.
    EXPECT_EQ(pinned.storage()->category, MemoryCategory::OptimizerState);
  }
  EXPECT_EQ(host.counter(MemoryCategory::OptimizerState).current, before);
}

TEST(CudaRuntime, StreamsEventsAndPinnedAsyncCopies) {
  REQUIRE_GPU();
  cuda::Stream s = cuda::Stream::create(0);
  Tensor h = cuda::pin_memory(arange(1 << 20, DType::f32));
  EXPECT_TRUE(cuda::is_pinned(h));
  EXPECT_FALSE(cuda::is_pinned(arange(4, DType::f32)));
  Tensor g = empty({1 << 20}, {DType::f32, kGpu});
  cuda::Event start(true), stop(true);
  {
    cuda::StreamGuard sg(s);
    start.record(s);
    raw::copy_(g, h, /*non_blocking=*/true);
    stop.record(s);
  }
  stop.synchronize();
  EXPECT_TRUE(s.query());
  EXPECT_GE(start.elapsed_ms(stop), 0.0f);
  EXPECT_EQ(raw::to_device(g, Device::cpu()).to_vector<float>()[12345], 12345.0f);
}

TEST(CachingAllocatorGpu, ReuseWithoutNewDeviceAllocation) {
  REQUIRE_GPU();
  cuda::empty_cache();
  auto stats = [] { return memory_stats(kGpu); };
  int64_t base_alloc = memory_allocated(kGpu);
  {
    Tensor t = empty({1 << 20}, {DType::f32, kGpu});
    EXPECT_EQ(memory_allocated(kGpu) - base_alloc, 4 << 20);
  }
  int64_t n_dev = stats()["num_device_alloc"];
  int64_t reserved = memory_reserved(kGpu);
  EXPECT_GT(reserved, 0);
  for (int i = 0; i < 100; ++i) Tensor t = empty({1 << 20}, {DType::f32, kGpu});
  EXPECT_EQ(stats()["num_device_alloc"], n_dev) << "freed blocks must be reused from the cache";
  EXPECT_EQ(memory_reserved(kGpu), reserved);
  EXPECT_EQ(memory_allocated(kGpu), base_alloc);
  cuda::empty_cache();
  EXPECT_LT(memory_reserved(kGpu), reserved);
  std::string summary = cuda::memory_summary(0);
  EXPECT_NE(summary.find("Allocated memory"), std::string::npos) << summary;
}

TEST(CachingAllocatorGpu, OomUnderLimitIsCatchableAndRecovers) {
  REQUIRE_GPU();
  cuda::empty_cache();
  cuda::set_per_process_memory_limit(int64_t{256} << 20, 0);
  Tensor keep = empty({int64_t{100} << 20}, {DType::u8, kGpu});
  bool threw = false;
  try {
    Tensor big = empty({int64_t{512} << 20}, {DType::u8, kGpu});
  } catch (const OutOfMemoryError& e) {
    threw = true;
    std::string m = e.what();
    EXPECT_NE(m.find("512.00 MiB"), std::string::npos) << m;
    std::printf("OOM message:\n%s\n", m.c_str());
  }
  EXPECT_TRUE(threw);
  Tensor smaller = empty({int64_t{64} << 20}, {DType::u8, kGpu});  // carries on with a smaller batch
  raw::fill_(smaller, 1);
  EXPECT_EQ(raw::to_device(raw::slice(smaller, 0, 0, 4, 1), Device::cpu()).to_vector<uint8_t>(),
            (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_GE(memory_stats(kGpu)["num_ooms"], 1);
  cuda::set_per_process_memory_limit(0, 0);
  EXPECT_THROW(cuda::set_per_process_memory_fraction(1.5, 0), ValueError);
}

TEST(CachingAllocatorGpu, RealDeviceOomWithoutLimit) {
  REQUIRE_GPU();
  cuda::empty_cache();
  int64_t free_b = 0, total = 0;
  cuda::mem_get_info(0, &free_b, &total);
  EXPECT_THROW(empty({total * 2}, {DType::u8, kGpu}), OutOfMemoryError);
  Tensor ok = empty({1 << 20}, {DType::u8, kGpu});
  EXPECT_TRUE(ok.is_cuda());
}

TEST(CachingAllocatorGpu, RecordStreamDelaysReuse) {
  REQUIRE_GPU();
  cuda::Stream side = cuda::Stream::create(0);
  void* first = nullptr;
  {
    Tensor t = empty({1 << 18}, {DType::f32, kGpu});
    first = t.raw_data();
    cuda::record_stream(t, side);
  }
  side.synchronize();
  Tensor again = empty({1 << 18}, {DType::f32, kGpu});
  EXPECT_TRUE(again.is_cuda());
  (void)first;  // reuse once the side stream is done is allowed; not before (fake-device tests check the order)
}

// A tensor recorded on a lasting stream outlives every Stream that named it (as a collective's
// tensors outlive the NCCL process group whose stream recorded them): freeing it records the
// allocator's event on that stream, which still exists, and the memory is reused once it fires.
TEST(CachingAllocatorGpu, RecordStreamOnALastingStreamOutlivesItsOwner) {
  REQUIRE_GPU();
  Tensor kept = empty({1 << 18}, {DType::f32, kGpu});
  void* handle = nullptr;
  {
    cuda::Stream side = cuda::Stream::create_lasting(0);
    handle = side.handle();
    kept.fill_(1.0f);
    cuda::record_stream(kept, side);
  }                 // the owner, and every Stream naming the stream, gone
  kept = Tensor();  // freed: the allocator records its event on the lasting stream
  cuda::synchronize(0);
  Tensor again = empty({1 << 18}, {DType::f32, kGpu});
  again.fill_(2.0f);
  const std::vector<float> v = raw::to_device(again, Device::cpu()).to_vector<float>();
  EXPECT_EQ(v.front(), 2.0f);
  EXPECT_EQ(v.back(), 2.0f);
  EXPECT_NE(handle, nullptr);
}

TEST(CachingAllocatorGpu, ExpandableSegmentsGrowInPlace) {
  REQUIRE_GPU();
  cuda::empty_cache();
  cuda::set_expandable_segments(true, 0);
  int64_t before = memory_stats(kGpu)["segment.all.current"];
  {
    std::vector<Tensor> ts;
    for (int i = 1; i <= 8; ++i) ts.push_back(empty({int64_t{i} * (24 << 20)}, {DType::u8, kGpu}));
    auto frag = cuda::fragmentation(0);
    std::printf("expandable: reserved %lld MiB for %lld MiB allocated, largest free block %lld MiB\n",
                static_cast<long long>(memory_reserved(kGpu) >> 20),
                static_cast<long long>(memory_allocated(kGpu) >> 20),
                static_cast<long long>(frag.largest_free_block >> 20));
    EXPECT_LE(memory_stats(kGpu)["segment.all.current"] - before, 2) << "growth should map pages into one segment";
  }
  cuda::empty_cache();
  cuda::set_expandable_segments(false, 0);
}

// Elements of t (on any device) that differ from v.
int64_t count_not_equal(const Tensor& t, float v) {
  int64_t bad = 0;
  for (float x : raw::to_device(t, Device::cpu()).to_vector<float>()) bad += x != v;
  return bad;
}

// empty_cache unmaps the pages of a freed block of the default stream's expandable segment
// while a side stream still copies through blocks of its own segment and the default stream's
// queued copies still use a live neighbour of the freed block. The allocator waits for the
// default stream only (not the device): neither the side stream's blocks nor the neighbour may
// be corrupted. Whether the side stream was still busy when empty_cache returned is printed
// (it should be: empty_cache had no reason to wait for it).
TEST(CachingAllocatorGpu, ExpandableUnmapWhileOtherBlocksAreInUse) {
  REQUIRE_GPU();
  cuda::empty_cache();
  cuda::set_expandable_segments(true, 0);
  const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
  const auto f32 = TensorOptions{DType::f32, kGpu};
  cuda::Stream side = cuda::Stream::create(0);
  Tensor a, b;
  {
    cuda::StreamGuard sg(side);
    a = full({n}, 1.0, f32);
    b = empty({n}, f32);
    for (int i = 0; i < 1000; ++i) {  // ~0.1 s of copies queued on the side stream
      raw::copy_(b, a);
      raw::copy_(a, b);
    }
  }
  Tensor live = full({n}, 2.0, f32), live2 = empty({n}, f32);
  { Tensor gone = full({4 * n}, 3.0, f32); }  // freed: its pages are what empty_cache unmaps
  for (int i = 0; i < 50; ++i) {
    raw::copy_(live2, live);
    raw::copy_(live, live2);
  }
  const int64_t unmaps = memory_stats(kGpu)["num_device_free"];
  const auto t0 = std::chrono::steady_clock::now();
  cuda::empty_cache();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bool side_busy = !side.query();
  std::printf("empty_cache: %.2f ms, %lld unmaps, %lld stream waits; side stream still busy after it: %s\n", ms,
              static_cast<long long>(memory_stats(kGpu)["num_device_free"] - unmaps),
              static_cast<long long>(memory_stats(kGpu)["num_unmap_stream_syncs"]), side_busy ? "yes" : "no");
  EXPECT_GT(memory_stats(kGpu)["num_device_free"], unmaps) << "nothing was unmapped: the test checks nothing";
  EXPECT_EQ(count_not_equal(a, 1.0f), 0) << "side stream's block corrupted";
  EXPECT_EQ(count_not_equal(live, 2.0f), 0) << "live neighbour corrupted";
  a = b = live = live2 = Tensor();
  side.synchronize();
  cuda::empty_cache();
  cuda::set_expandable_segments(false, 0);
}

TEST(CachingAllocatorGpu, SnapshotAndTimeline) {
  REQUIRE_GPU();
  cuda::record_memory_history(true, 0);
  {
    Tensor a = empty({1000}, {DType::f32, kGpu});
    Tensor b = empty({5 << 20}, {DType::f32, kGpu});
  }
  std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  cuda::write_memory_snapshot(dir + "/snap.json", 0);
  cuda::write_memory_timeline(dir + "/timeline.html", 0);
  std::ifstream f(dir + "/timeline.html");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("<svg"), std::string::npos);
  cuda::record_memory_history(false, 0);
}

}  // namespace
}  // namespace mg
