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
  int prev_ = -1;
};

// A CUDA stream (non-blocking); handle() is the cudaStream_t as an opaque pointer.
class Stream {
 public:
  // The legacy default stream of a device.
  static Stream default_stream(int device = -1);
  // A new stream owned by the returned object.
  static Stream create(int device = -1, int priority = 0);
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

}  // namespace mg::cuda
