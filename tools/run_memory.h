// What a command's run needs and what the machine has: byte counts that cannot overflow, the host
// memory this process may still use (its cgroup's limit, `ulimit -v`, MemAvailable) and the free
// memory of the GPU. Commands add up a run's buffers and workspaces before allocating anything and
// refuse a run that does not fit with a message saying what it needs and what there is. Tools
// layer (public API only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn::tools {

// A byte count that saturates instead of wrapping: the sizes come from the command line, and
// their products may pass 2^64.
class ByteCount {
 public:
  ByteCount() = default;
  explicit ByteCount(uint64_t bytes) : bytes_(bytes) {}
  // The bytes of a packed tensor: the product of `sizes` (each >= 0) times `element_bytes`.
  static ByteCount of_tensor(const std::vector<int64_t>& sizes, size_t element_bytes);

  ByteCount& operator+=(const ByteCount& other);
  friend ByteCount operator+(ByteCount a, const ByteCount& b) { return a += b; }
  // This count `n` times (n >= 0).
  ByteCount times(int64_t n) const;

  bool saturated() const { return saturated_; }
  uint64_t bytes() const { return saturated_ ? UINT64_MAX : bytes_; }
  bool operator>(uint64_t limit) const { return saturated_ || bytes_ > limit; }
  // "7.50 GiB", or "more than 16 EiB" when saturated.
  std::string to_string() const;

 private:
  uint64_t bytes_ = 0;
  bool saturated_ = false;
};

// How much memory a run may still take, and where that number comes from.
struct MemoryAvailable {
  std::optional<uint64_t> bytes;  // nullopt when nothing could be read (nothing is checked)
  std::string source;             // "the cgroup memory limit (4.00 GiB, 1.10 GiB in use)"
};

// The least of: the memory cgroup's limit less its usage (v2 memory.max, or v1
// memory.limit_in_bytes, at every level up to the root; reclaimable page cache does not count as
// usage), the address-space limit (`ulimit -v`) less this process's size, and MemAvailable of
// /proc/meminfo.
MemoryAvailable host_memory_available();
// The free memory of the current CUDA device (cuda_memory_info); unknown without one.
MemoryAvailable gpu_memory_available();

// OK when `needed` fits in `available` (or nothing is known about it); otherwise
// kInvalidArgument: "<what> needs about <needed> of <kind> memory but <available> is available
// (<source>); <advice>".
Status check_fits(const std::string& what, const ByteCount& needed,
                  const MemoryAvailable& available, const char* kind, const char* advice);

// Packed views at distinct addresses of an address range that is never touched, for asking the
// library's workspace_size() (which reads no tensor, only the views' sizes, strides and
// addresses) what a run will need before anything is allocated. Every byte handed out counts in
// bytes().
class ViewPlanner {
 public:
  explicit ViewPlanner(Device device) : device_(device) {}
  // A packed row-major view of `sizes`; absent (a default TensorView) when `present` is false.
  // Call only while fits_in_address_space() holds for the sizes handed out so far and these.
  TensorView view(DType dtype, const std::vector<int64_t>& sizes, bool present = true);
  const ByteCount& bytes() const { return bytes_; }
  // True when the views' addresses, and workspaces a few times their size, cannot wrap around:
  // below 2^56 bytes (64 PiB) in all, far beyond any machine's memory.
  bool fits_in_address_space() const { return !(bytes_ > (uint64_t{1} << 56)); }

 private:
  Device device_;
  uintptr_t next_ = uintptr_t{1} << 20;
  ByteCount bytes_;
};

// The library's workspaces of a run of forward (and backward) calls beside their reference: the
// run's and the reference's, each the larger of its forward and backward (one buffer serves
// both). `can_implement` and `workspace_size` are the op family's (found by argument-dependent
// lookup); the first call can_implement refuses gives its Status and leaves *out unfinished.
struct RunWorkspaces {
  ByteCount run, reference;
};
template <typename Forward, typename Backward>
Status run_workspaces(const Forward& fwd, const Backward& bwd, const Forward& ref_fwd,
                      const Backward& ref_bwd, bool backward, bool ask_reference,
                      RunWorkspaces* out) {
  auto bytes_of = [](const auto& p, ByteCount* bytes) {
    std::string why;
    const Status status = can_implement(p, &why);
    if (status.ok()) *bytes = ByteCount(workspace_size(p));
    return status;
  };
  ByteCount run_fwd, run_bwd, ref_fwd_bytes, ref_bwd_bytes;
  Status status = bytes_of(fwd, &run_fwd);
  if (status.ok() && backward) status = bytes_of(bwd, &run_bwd);
  if (status.ok() && ask_reference) status = bytes_of(ref_fwd, &ref_fwd_bytes);
  if (status.ok() && ask_reference && backward) status = bytes_of(ref_bwd, &ref_bwd_bytes);
  if (!status.ok()) return status;
  out->run = run_fwd.bytes() > run_bwd.bytes() ? run_fwd : run_bwd;
  out->reference = ref_fwd_bytes.bytes() > ref_bwd_bytes.bytes() ? ref_fwd_bytes : ref_bwd_bytes;
  return Status::ok_status();
}

// The parsers behind host_memory_available, separate so that tests can feed them text.
// MemAvailable of /proc/meminfo, in bytes.
std::optional<uint64_t> parse_meminfo_available(std::string_view meminfo);
// The memory cgroup of /proc/self/cgroup: the path of the v1 memory controller's line
// ("4:memory:/a/b"), else the v2 line ("0::/a/b").
struct CgroupPath {
  bool v2 = false;
  std::string path;
};
std::optional<CgroupPath> parse_memory_cgroup(std::string_view proc_self_cgroup);
// A cgroup limit file's value: a number of bytes, or nullopt for "max" and v1's "no limit"
// (a value of 2^62 or more).
std::optional<uint64_t> parse_cgroup_limit(std::string_view text);
// The value of `key` (e.g. "inactive_file") in a memory.stat file; 0 when absent.
uint64_t parse_memory_stat(std::string_view stat, std::string_view key);

}  // namespace sciattn::tools
