#include "core/device.h"

#include <cctype>

#include "core/error.h"

namespace mg {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    type = DeviceType::CPU;
    index = 0;
    return;
  }
  if (spec.rfind("cuda", 0) == 0) {
    type = DeviceType::CUDA;
    index = 0;
    if (spec.size() == 4) return;
    if (spec[4] == ':' && spec.size() > 5) {
      bool digits = true;
      for (size_t i = 5; i < spec.size(); ++i) digits &= std::isdigit(static_cast<unsigned char>(spec[i])) != 0;
      if (digits && spec.size() < 10) {
        index = std::stoi(spec.substr(5));
        return;
      }
    }
  }
  MG_THROW(ValueError, "Device: cannot parse '", spec, "' (expected \"cpu\", \"cuda\" or \"cuda:N\")");
}

std::string Device::str() const {
  return type == DeviceType::CPU ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace mg
