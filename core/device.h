// Where a tensor lives: the CPU or a CUDA device (logical index, after CUDA_VISIBLE_DEVICES).
// Parsing "cpu", "cuda", "cuda:1" and printing follow PyTorch's spelling.
#pragma once

#include <ostream>
#include <string>

namespace mg {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(i) {}  // NOLINT
  // Parses "cpu", "cuda", "cuda:N"; anything else raises mg::ValueError.
  explicit Device(const std::string& spec);
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT

  static Device cpu() { return Device(DeviceType::CPU, 0); }
  static Device cuda(int i = 0) { return Device(DeviceType::CUDA, i); }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && (type == DeviceType::CPU || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace mg
