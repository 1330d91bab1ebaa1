// The runtime in a build without CUDA: no devices; anything that needs one says so.
#include "core/device_runtime.h"
#include "core/error.h"

namespace mg::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  MG_THROW(DeviceError, what,
           ": this build of memgrad has no CUDA backend (built with --config=nocuda or without the toolkit)");
}
}  // namespace

int device_count() { return 0; }
bool is_available() { return false; }
DeviceProperties get_device_properties(int) { no_cuda("get_device_properties"); }
void set_device(int) { no_cuda("set_device"); }
int current_device() { return -1; }
void synchronize(int) {}
void mem_get_info(int, int64_t*, int64_t*) { no_cuda("mem_get_info"); }
DeviceGuard::DeviceGuard(int index) {
  if (index >= 0) no_cuda("DeviceGuard");
}
DeviceGuard::~DeviceGuard() = default;
Stream Stream::default_stream(int) { no_cuda("Stream::default_stream"); }
Stream Stream::create(int, int) { no_cuda("Stream::create"); }
Stream Stream::create_lasting(int, int) { no_cuda("Stream::create_lasting"); }
Stream Stream::current(int) { no_cuda("Stream::current"); }
void Stream::synchronize() const {}
bool Stream::query() const { return true; }
StreamGuard::StreamGuard(const Stream&) { no_cuda("StreamGuard"); }
StreamGuard::~StreamGuard() = default;
Event::Event(bool) {}
void Event::record(const Stream&) { no_cuda("Event::record"); }
void Event::synchronize() const {}
bool Event::query() const { return true; }
void Event::wait(const Stream&) const {}
float Event::elapsed_ms(const Event&) const { no_cuda("Event::elapsed_ms"); }

}  // namespace mg::cuda

// ---- core/cuda_memory.h without CUDA ----
#include "core/cuda_memory.h"

namespace mg::cuda {
void empty_cache() {}
std::string memory_summary(int) { no_cuda("memory_summary"); }
void set_per_process_memory_fraction(double, int) { no_cuda("set_per_process_memory_fraction"); }
void set_per_process_memory_limit(int64_t, int) { no_cuda("set_per_process_memory_limit"); }
void record_stream(const Tensor&, const Stream&) { no_cuda("record_stream"); }
void set_expandable_segments(bool, int) { no_cuda("set_expandable_segments"); }
void record_memory_history(bool, int, int64_t) { no_cuda("record_memory_history"); }
void write_memory_snapshot(const std::string&, int) { no_cuda("write_memory_snapshot"); }
void write_memory_timeline(const std::string&, int) { no_cuda("write_memory_timeline"); }
Fragmentation fragmentation(int) { no_cuda("fragmentation"); }
Tensor pin_memory(const Tensor&) { no_cuda("pin_memory"); }
bool is_pinned(const Tensor&) { return false; }
PinnedBlock PinnedBlock::allocate(size_t) { no_cuda("PinnedBlock::allocate"); }
PinnedBlock::~PinnedBlock() = default;
PinnedBlock::PinnedBlock(PinnedBlock&&) noexcept {}
PinnedBlock& PinnedBlock::operator=(PinnedBlock&&) noexcept { return *this; }
void PinnedBlock::record(const Stream&) { no_cuda("PinnedBlock::record"); }
Tensor PinnedBlock::view(const Shape&, DType) const { no_cuda("PinnedBlock::view"); }
void PinnedBlock::release() {}
PinnedPoolStats pinned_pool_stats() { return {}; }
void empty_pinned_cache() {}
bool is_capturing(int) { return false; }
struct Graph::Impl {};
Graph::Graph() = default;
Graph::~Graph() = default;
void Graph::capture_begin(const Graph*) { no_cuda("Graph::capture_begin"); }
void Graph::capture_end() { no_cuda("Graph::capture_end"); }
void Graph::replay() { no_cuda("Graph::replay"); }
void Graph::reset() {}
bool Graph::captured() const { return false; }
std::uint64_t Graph::pool_id() const { return 0; }

}  // namespace mg::cuda
