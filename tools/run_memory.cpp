// What a run needs and what the machine has (see run_memory.h). Tools layer.
#include "run_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "sciattn/device.h"
#include "sciattn/dtype.h"
#include "table.h"

namespace sciattn::tools {
namespace {

// The whole text of a small kernel file, or nullopt when it cannot be read.
std::optional<std::string> read_text(const std::string& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// The first unsigned number in `text`, or nullopt.
std::optional<uint64_t> leading_number(std::string_view text) {
  const size_t start = text.find_first_of("0123456789");
  if (start == std::string_view::npos) return std::nullopt;
  uint64_t value = 0;
  for (size_t i = start; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (__builtin_mul_overflow(value, uint64_t{10}, &value) ||
        __builtin_add_overflow(value, static_cast<uint64_t>(text[i] - '0'), &value)) {
      return UINT64_MAX;
    }
  }
  return value;
}

// The value after "key" at the start of a line of `text` ("key: 123 kB", "key 123").
std::optional<uint64_t> keyed_number(std::string_view text, std::string_view key) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, end - pos);
    if (line.size() > key.size() && line.substr(0, key.size()) == key &&
        (line[key.size()] == ':' || line[key.size()] == ' ')) {
      return leading_number(line.substr(key.size()));
    }
    pos = end + 1;
  }
  return std::nullopt;
}

struct Limit {
  uint64_t available = 0;
  std::string source;
};

// The memory cgroup's limits, from this process's cgroup up to the root: the tightest one.
std::optional<Limit> cgroup_limit() {
  const std::optional<std::string> self = read_text("/proc/self/cgroup");
  if (!self) return std::nullopt;
  const std::optional<CgroupPath> cg = parse_memory_cgroup(*self);
  if (!cg) return std::nullopt;
  const std::string root = cg->v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
  const char* limit_file = cg->v2 ? "/memory.max" : "/memory.limit_in_bytes";
  const char* usage_file = cg->v2 ? "/memory.current" : "/memory.usage_in_bytes";
  const char* inactive_key = cg->v2 ? "inactive_file" : "total_inactive_file";
  std::optional<Limit> best;
  // Inside a container the cgroup's path is often not visible under the mount; its root is then
  // the container's own cgroup, which the walk reaches last.
  std::string path = cg->path;
  while (true) {
    const std::string dir = root + (path == "/" ? "" : path);
    const std::optional<std::string> limit_text = read_text(dir + limit_file);
    if (limit_text) {
      const std::optional<uint64_t> limit = parse_cgroup_limit(*limit_text);
      const std::optional<std::string> usage_text = read_text(dir + usage_file);
      if (limit && usage_text) {
        const uint64_t usage = leading_number(*usage_text).value_or(0);
        const std::optional<std::string> stat = read_text(dir + "/memory.stat");
        // Page cache that is not in active use is reclaimed before the limit bites.
        const uint64_t inactive = stat ? parse_memory_stat(*stat, inactive_key) : 0;
        const uint64_t used = usage > inactive ? usage - inactive : 0;
        const uint64_t available = *limit > used ? *limit - used : 0;
        if (!best || available < best->available) {
          best = Limit{available, "the cgroup memory limit of " + human_bytes(*limit) + ", " +
                                      human_bytes(used) + " in use"};
        }
      }
    }
    if (path.empty() || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return best;
}

// `ulimit -v`: the address-space limit less what this process already maps.
std::optional<Limit> address_space_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const std::optional<std::string> status = read_text("/proc/self/status");
  const uint64_t mapped = status ? keyed_number(*status, "VmSize").value_or(0) * 1024 : 0;
  const uint64_t cap = limit.rlim_cur;
  return Limit{cap > mapped ? cap - mapped : 0, "the address-space limit (ulimit -v) of " +
                                                    human_bytes(cap) + ", " + human_bytes(mapped) +
                                                    " mapped"};
}

std::optional<Limit> meminfo_limit() {
  const std::optional<std::string> meminfo = read_text("/proc/meminfo");
  if (!meminfo) return std::nullopt;
  const std::optional<uint64_t> available = parse_meminfo_available(*meminfo);
  if (!available) return std::nullopt;
  return Limit{*available, "MemAvailable in /proc/meminfo"};
}

}  // namespace

ByteCount ByteCount::of_tensor(const std::vector<int64_t>& sizes, size_t element_bytes) {
  ByteCount r(element_bytes);
  for (int64_t s : sizes) r = r.times(s);
  return r;
}

ByteCount& ByteCount::operator+=(const ByteCount& other) {
  saturated_ =
      saturated_ || other.saturated_ || __builtin_add_overflow(bytes_, other.bytes_, &bytes_);
  return *this;
}

ByteCount ByteCount::times(int64_t n) const {
  ByteCount r = *this;
  const uint64_t factor = n < 0 ? 0 : static_cast<uint64_t>(n);
  r.saturated_ = r.saturated_ || __builtin_mul_overflow(r.bytes_, factor, &r.bytes_);
  // Zero times anything is zero, even a count that overflowed on the way.
  if (factor == 0 || (!saturated_ && bytes_ == 0)) r = ByteCount(0);
  return r;
}

std::string ByteCount::to_string() const {
  return saturated_ ? std::string("more than 16 EiB") : human_bytes(bytes_);
}

MemoryAvailable host_memory_available() {
  std::optional<Limit> best;
  for (std::optional<Limit> limit : {cgroup_limit(), address_space_limit(), meminfo_limit()}) {
    if (limit && (!best || limit->available < best->available)) best = limit;
  }
  if (!best) return {};
  return {best->available, best->source};
}

MemoryAvailable gpu_memory_available() {
  size_t free_bytes = 0, total_bytes = 0;
  if (!cuda_memory_info(&free_bytes, &total_bytes).ok()) return {};
  return {free_bytes, "the free memory of " + cuda_device_description() + ", " +
                          human_bytes(total_bytes) + " in all"};
}

Status check_fits(const std::string& what, const ByteCount& needed,
                  const MemoryAvailable& available, const char* kind, const char* advice) {
  if (!available.bytes || !(needed > *available.bytes)) return Status::ok_status();
  return Status::invalid_argument(what + " needs " + (needed.saturated() ? "" : "about ") +
                                  needed.to_string() + " of " + kind + " memory but " +
                                  human_bytes(*available.bytes) + " is available (" +
                                  available.source + "); " + advice);
}

TensorView ViewPlanner::view(DType dtype, const std::vector<int64_t>& sizes, bool present) {
  if (!present) return TensorView{};
  TensorView v;
  v.data = reinterpret_cast<void*>(next_);
  v.dtype = dtype;
  v.device = device_;
  v.rank = static_cast<int>(sizes.size());
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.sizes[d] = sizes[static_cast<size_t>(d)];
    v.strides[d] = stride;
    // Strides of a view too large to plan may wrap; such a view is never given to the library.
    if (__builtin_mul_overflow(stride, sizes[static_cast<size_t>(d)], &stride)) stride = 0;
  }
  const ByteCount bytes = ByteCount::of_tensor(sizes, dtype_size(dtype));
  bytes_ += bytes;
  // 256-byte steps keep every view as aligned as a real allocation would be.
  if (fits_in_address_space()) next_ += static_cast<uintptr_t>((bytes.bytes() + 511) / 256 * 256);
  return v;
}

std::optional<uint64_t> parse_meminfo_available(std::string_view meminfo) {
  const std::optional<uint64_t> kib = keyed_number(meminfo, "MemAvailable");
  if (!kib || *kib > UINT64_MAX / 1024) return std::nullopt;
  return *kib * 1024;
}

std::optional<CgroupPath> parse_memory_cgroup(std::string_view text) {
  std::optional<CgroupPath> v2;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    // "hierarchy-ID:controller-list:cgroup-path"
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string path(line.substr(second + 1));
    if (controllers.empty() && line.substr(0, first) == "0") {
      v2 = CgroupPath{true, path};
      continue;
    }
    // The v1 memory controller, alone or among others ("4:memory:/x", "5:cpu,memory:/x").
    std::string_view rest = controllers;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      if (rest.substr(0, comma) == "memory") return CgroupPath{false, path};
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  return v2;
}

std::optional<uint64_t> parse_cgroup_limit(std::string_view text) {
  if (text.substr(0, 3) == "max") return std::nullopt;
  const std::optional<uint64_t> value = leading_number(text);
  // cgroup v1 writes "no limit" as the largest page-aligned int64 (about 2^63).
  if (!value || *value >= (uint64_t{1} << 62)) return std::nullopt;
  return value;
}

uint64_t parse_memory_stat(std::string_view stat, std::string_view key) {
  return keyed_number(stat, key).value_or(0);
}

}  // namespace sciattn::tools
