// Names and parsing for the public core types (Status, DType, Device). Host-only common layer.
#include <string>

#include "sciattn/device.h"
#include "sciattn/dtype.h"
#include "sciattn/status.h"

namespace sciattn {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kWorkspaceTooSmall:
      return "workspace too small";
    case StatusCode::kNotSupported:
      return "not supported";
    case StatusCode::kDeviceError:
      return "device error";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kOutOfMemory:
      return "out of memory";
  }
  return "unknown status";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kBool:
      return "bool";
  }
  return "unknown dtype";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "bool") return DType::kBool;
  return std::nullopt;
}

const char* device_name(Device d) {
  switch (d) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "unknown device";
}

}  // namespace sciattn
