// Device runtime seen from plain C++: device count and properties, current device, guards,
// streams and events. Works in every build; without CUDA there are simply zero devices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"

namespace mg::cuda {

struct DeviceProperties {
  std::string name;
  int64_t total_memory = 0;
  int multi_processor_count = 0;
  int major = 0;
  int minor = 0;
};

// Number of visible CUDA devices (after CUDA_VISIBLE_DEVICES); 0 without a driver or GPU.
int device_count();
bool is_available();
DeviceProperties get_device_properties(int index);
void set_device(int index);
int current_device();
// Waits for all work on the current (or given) device.
void synchronize(int index = -1);
// Free and total bytes on the device as the driver reports them.
void mem_get_info(int index, int64_t* free_bytes, int64_t* total_bytes);

// Sets the current device for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  explicit DeviceGuard(Device d) : DeviceGuard(d.is_cuda() ? d.index : -1) {}
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;  // the device to restore on exit; -1: the guard changed nothing
};

// A CUDA stream (non-blocking); handle() is the cudaStream_t as an opaque pointer.
class Stream {
 public:
  // The legacy default stream of a device.
  static Stream default_stream(int device = -1);
  // A new stream owned by the returned object.
  static Stream create(int device = -1, int priority = 0);
  // A new stream that is never destroyed: for a stream that tensors are recorded on
  // (record_stream) by an owner they may outlive. The caching allocator records an event on each
  // recorded stream when such a tensor is freed, which on a destroyed stream is an error or a
  // crash; so the NCCL process group's communication stream is one (PyTorch keeps its side
  // streams in a pool it never frees, for the same reason). One per owner that lives long.
  static Stream create_lasting(int device = -1, int priority = 0);
  // The stream ops on the current device are issued to (default unless a StreamGuard is set).
  static Stream current(int device = -1);
  void* handle() const { return handle_; }
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all work is done
  bool operator==(const Stream& o) const { return handle_ == o.handle_ && device_ == o.device_; }

 private:
  void* handle_ = nullptr;
  int device_ = 0;
  std::shared_ptr<void> owner_;
};

// Makes `s` the current stream of its device for a scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

class Event {
 public:
  explicit Event(bool enable_timing = false);
  void record(const Stream& s);
  void synchronize() const;
  bool query() const;
  // Makes `s` wait for this event (on the device, no host sync).
  void wait(const Stream& s) const;
  // Milliseconds between two recorded timing events.
  float elapsed_ms(const Event& end) const;
  void* handle() const { return handle_.get(); }

 private:
  std::shared_ptr<void> handle_;
};

// Whether the work issued to the current stream of `device` (-1: the current device) is being
// captured into a CUDA graph: such work only runs when the graph is replayed, so code that
// would read a result on the host (a label check, item()) must not run then.
bool is_capturing(int device = -1);

// A CUDA graph of the work issued to one stream, replayed with one launch (PyTorch's
// torch.cuda.CUDAGraph). Capture runs on the current stream, which must be one made with
// Stream::create (the legacy default stream cannot be captured); what the captured work
// allocates comes from a private memory pool of the caching allocator that eager code never
// gets (docs/cuda_graphs.md). Replays reuse the captured addresses, so tensors the capture made
// (outputs, gradients) keep their storage and are rewritten by every replay; inputs are static
// tensors the caller copies new data into before replay().
class Graph {
 public:
  Graph();
  ~Graph();  // reset()
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing. Waits for the device first (eager frees pending on events must finish
  // before the allocator may route). `share_pool_with`: allocate from that captured graph's
  // pool (graphs replayed one after another in capture order can share memory).
  // mg::ValueError when already captured or capturing, or on the legacy default stream.
  void capture_begin(const Graph* share_pool_with = nullptr);
  // Ends the capture and instantiates the graph. When the captured work did something a graph
  // cannot hold (a host read, a synchronization), raises mg::DeviceError naming CUDA's reason;
  // the graph is then reset.
  void capture_end();
  // Launches the graph on the current stream (asynchronously, like a kernel), so it is ordered
  // after the copies into its static inputs issued there.
  void replay();
  // Frees the graph and its hold on the memory pool (waiting for pending replays first).
  void reset();
  bool captured() const;
  // The allocator pool's id (0 before capture_begin): memory_stats' graph_pool_* count it.
  std::uint64_t pool_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mg::cuda
