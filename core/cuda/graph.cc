// mg::cuda::Graph: stream capture into a CUDA graph, with the caching allocator routing the
// captured work's allocations to a private pool (core/allocator/caching_allocator_pools.cc).
#include <cuda_runtime.h>

#include "core/allocator/caching_allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/cuda_device_memory.h"
#include "core/device_runtime.h"
#include "core/random.h"

namespace mg::cuda {

using namespace allocator;  // this backend serves the caching allocator (core/allocator/)

bool is_capturing(int device) {
  if (!is_available()) return false;
  const Stream s = Stream::current(device);
  if (!s.handle()) return false;  // the legacy default stream is never captured
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MG_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(s.handle()), &status));
  return status != cudaStreamCaptureStatusNone;
}

struct Graph::Impl {
  int device = -1;
  Stream stream;  // keeps the capture stream alive while the graph may replay on it
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CachingAllocator::PoolId pool = 0;
  bool capturing = false;
  std::vector<CapturedRng> rngs;  // the generators the captured work draws from (core/random.h)
  cudaStream_t handle() const { return static_cast<cudaStream_t>(stream.handle()); }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}

Graph::~Graph() {
  try {
    reset();
  } catch (...) {  // a destructor must not throw; the pool stays held (memory, not corruption)
  }
}

void Graph::capture_begin(const Graph* share_pool_with) {
  Impl& g = *impl_;
  MG_CHECK(!g.capturing && !g.exec, ValueError, "Graph::capture_begin: this graph is already ",
           g.capturing ? "capturing" : "captured", "; reset() it first");
  const int device = current_device();
  Stream s = Stream::current(device);
  MG_CHECK(s.handle() != nullptr, ValueError, "Graph::capture_begin: the current stream of cuda:", device,
           " is the legacy default stream, which cannot be captured; capture under a "
           "StreamGuard of a stream made with Stream::create()");
  if (share_pool_with) {
    MG_CHECK(share_pool_with->impl_->pool != 0 && share_pool_with->impl_->device == device, ValueError,
             "Graph::capture_begin: the graph to share a pool with has no pool on cuda:", device,
             " (capture it first, on the same device)");
  }
  // Eager frees still waiting on events must settle before routing starts (event queries are
  // deferred during capture), and nothing queued may still use memory the pool could reuse.
  synchronize(device);
  CachingAllocator& alloc = caching_allocator(device);
  CachingAllocator::PoolId pool = 0;
  if (share_pool_with) {
    pool = share_pool_with->impl_->pool;
    alloc.retain_pool(pool);
  } else {
    pool = alloc.create_pool();
  }
  const auto sid = reinterpret_cast<StreamId>(s.handle());
  alloc.begin_allocate_to_pool(pool, sid);
  const cudaError_t e = cudaStreamBeginCapture(static_cast<cudaStream_t>(s.handle()), cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    alloc.end_allocate_to_pool(sid);
    alloc.release_pool(pool);
    MG_THROW(CudaError, "Graph::capture_begin: cudaStreamBeginCapture failed: ", cudaGetErrorString(e));
  }
  g.device = device;
  g.stream = s;
  g.pool = pool;
  g.capturing = true;
  begin_rng_capture();
}

void Graph::capture_end() {
  Impl& g = *impl_;
  MG_CHECK(g.capturing, ValueError, "Graph::capture_end: no capture is under way (call capture_begin first)");
  DeviceGuard guard(g.device);
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(g.handle(), &graph);
  g.capturing = false;
  g.rngs = end_rng_capture();
  CachingAllocator& alloc = caching_allocator(g.device);
  alloc.end_allocate_to_pool(reinterpret_cast<StreamId>(g.stream.handle()));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph) (void)cudaGraphDestroy(graph);
    g.rngs.clear();
    alloc.release_pool(g.pool);
    g.pool = 0;
    MG_THROW(DeviceError, "Graph::capture_end: the capture was invalidated: ", cudaGetErrorName(e), " (",
             cudaGetErrorString(e),
             "). Something in the captured work synchronized with the host or read a result on it (item(), "
             "a copy to the CPU, a label check) or used the legacy default stream");
  }
  g.graph = graph;
  const cudaError_t ie = cudaGraphInstantiate(&g.exec, graph, 0);
  if (ie != cudaSuccess) {
    (void)cudaGetLastError();
    reset();
    MG_THROW(CudaError, "Graph::capture_end: cudaGraphInstantiate failed: ", cudaGetErrorString(ie));
  }
}

void Graph::replay() {
  Impl& g = *impl_;
  MG_CHECK(g.exec, ValueError, "Graph::replay: nothing captured (capture_begin/capture_end first)");
  DeviceGuard guard(g.device);
  prepare_rng_replay(g.rngs);  // fresh random numbers for this replay (a fill per generator drawn from)
  MG_CUDA_CHECK(cudaGraphLaunch(g.exec, static_cast<cudaStream_t>(Stream::current(g.device).handle())));
}

void Graph::reset() {
  Impl& g = *impl_;
  if (g.capturing) {  // abandoned mid-capture: end it and drop what was recorded
    DeviceGuard guard(g.device);
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(g.handle(), &graph);
    (void)cudaGetLastError();
    if (graph) (void)cudaGraphDestroy(graph);
    caching_allocator(g.device).end_allocate_to_pool(reinterpret_cast<StreamId>(g.stream.handle()));
    g.capturing = false;
    (void)end_rng_capture();
  }
  if (g.exec || g.graph) {
    DeviceGuard guard(g.device);
    MG_CUDA_CHECK(cudaDeviceSynchronize());  // pending replays (on any stream) still use the pool
    if (g.exec) MG_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
    if (g.graph) MG_CUDA_CHECK(cudaGraphDestroy(g.graph));
    g.exec = nullptr;
    g.graph = nullptr;
  }
  g.rngs.clear();  // their counters are pool blocks
  if (g.pool) {
    caching_allocator(g.device).release_pool(g.pool);
    g.pool = 0;
  }
}

bool Graph::captured() const { return impl_->exec != nullptr; }
std::uint64_t Graph::pool_id() const { return impl_->pool; }

}  // namespace mg::cuda
