// The device runtime on CUDA: thin, checked wrappers over the CUDA runtime API.
#include <cuda_runtime.h>

#include <map>

#include "core/cuda/check.h"
#include "core/device_runtime.h"

namespace mg::cuda {

int device_count() {
  static int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: CPU-only run
      return 0;
    }
    return c;
  }();
  return n;
}

bool is_available() { return device_count() > 0; }

static void check_index(int index, const char* op) {
  int n = device_count();
  MG_CHECK(index >= 0 && index < n, DeviceError, op, ": CUDA device ", index, " does not exist (", n, " visible device",
           n == 1 ? "" : "s", ")");
}

DeviceProperties get_device_properties(int index) {
  check_index(index, "get_device_properties");
  cudaDeviceProp p{};
  MG_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  DeviceProperties out;
  out.name = p.name;
  out.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  out.multi_processor_count = p.multiProcessorCount;
  out.major = p.major;
  out.minor = p.minor;
  return out;
}

void set_device(int index) {
  check_index(index, "set_device");
  MG_CUDA_CHECK(cudaSetDevice(index));
}

int current_device() {
  if (!is_available()) return -1;
  int d = 0;
  MG_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void synchronize(int index) {
  if (!is_available()) return;
  if (index < 0) {
    MG_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  DeviceGuard g(index);
  MG_CUDA_CHECK(cudaDeviceSynchronize());
}

void mem_get_info(int index, int64_t* free_bytes, int64_t* total_bytes) {
  DeviceGuard g(index);
  size_t f = 0, t = 0;
  MG_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
}

// Every eager op takes a guard or two: it only touches the driver's current device when the
// index differs (a guard on the current device costs one cudaGetDevice).
DeviceGuard::DeviceGuard(int index) {
  if (index < 0) return;
  check_index(index, "DeviceGuard");
  const int current = current_device();
  if (current == index) return;
  MG_CUDA_CHECK(cudaSetDevice(index));
  prev_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)cudaSetDevice(prev_);
}

namespace {
thread_local std::map<int, Stream> tl_current_stream;
int resolve(int device) { return device < 0 ? current_device() : device; }
}  // namespace

Stream Stream::default_stream(int device) {
  Stream s;
  s.device_ = resolve(device);
  s.handle_ = nullptr;
  return s;
}

Stream Stream::create_lasting(int device, int priority) {
  Stream s;
  s.device_ = resolve(device);
  DeviceGuard g(s.device_);
  cudaStream_t st = nullptr;
  MG_CUDA_CHECK(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, priority));
  s.handle_ = st;  // no owner: the stream outlives every Stream that names it
  return s;
}

Stream Stream::create(int device, int priority) {
  Stream s = create_lasting(device, priority);
  s.owner_ = std::shared_ptr<void>(s.handle_, [](void* p) { (void)cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  return s;
}

Stream Stream::current(int device) {
  int d = resolve(device);
  auto it = tl_current_stream.find(d);
  return it == tl_current_stream.end() ? default_stream(d) : it->second;
}

void Stream::synchronize() const {
  DeviceGuard g(device_);
  MG_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

bool Stream::query() const { return MG_CUDA_QUERY(cudaStreamQuery(static_cast<cudaStream_t>(handle_))); }

StreamGuard::StreamGuard(const Stream& s) : prev_(Stream::current(s.device())) { tl_current_stream[s.device()] = s; }
StreamGuard::~StreamGuard() { tl_current_stream[prev_.device()] = prev_; }

Event::Event(bool enable_timing) {
  cudaEvent_t e = nullptr;
  MG_CUDA_CHECK(cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ = std::shared_ptr<void>(e, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
}

void Event::record(const Stream& s) {
  MG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_.get()), static_cast<cudaStream_t>(s.handle())));
}
void Event::synchronize() const { MG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_.get()))); }
bool Event::query() const { return MG_CUDA_QUERY(cudaEventQuery(static_cast<cudaEvent_t>(handle_.get()))); }
void Event::wait(const Stream& s) const {
  MG_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle()), static_cast<cudaEvent_t>(handle_.get()), 0));
}
float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  MG_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_.get()), static_cast<cudaEvent_t>(end.handle())));
  return ms;
}

}  // namespace mg::cuda
