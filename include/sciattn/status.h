// Status: the result of every public sciattn call. Public API layer (plain C++17).
// No exceptions cross the core; a failed call returns a Status whose message says what was
// wrong and what would have been accepted.
#pragma once

#include <string>
#include <utility>

namespace sciattn {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // a shape, dtype, stride, pointer or option the op does not accept
  kWorkspaceTooSmall,  // the caller's workspace is smaller than workspace_size() says
  kNotSupported,       // valid input that this build or device cannot run (e.g. no CUDA build)
  kDeviceError,        // an error reported by the device runtime
  kInternal,           // a bug in sciattn: please report it
  kOutOfMemory,        // the host could not allocate what a call that allocates (a layout, an
                       // index) needs; ops themselves never allocate
};

// Human-readable name of a status code ("invalid argument", ...).
const char* status_code_name(StatusCode code);

class Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  static Status invalid_argument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status not_supported(std::string message) {
    return Status(StatusCode::kNotSupported, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: bias2 must have shape ..." or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace sciattn
