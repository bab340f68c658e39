// WorkspaceLayout: carves one caller-provided workspace into aligned typed regions, so that the
// size an op reports and the regions it uses come from the same code. Host-only common layer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sciattn::detail {

class WorkspaceLayout {
 public:
  // Every region starts on this boundary (a cache line, and enough for any vector load).
  static constexpr size_t kAlignment = 64;

  // Reserves `count` elements of T and returns the region's offset from the aligned base.
  template <typename T>
  size_t add(int64_t count) {
    const size_t offset = used_;
    used_ += round_up(static_cast<size_t>(count) * sizeof(T));
    return offset;
  }

  // Bytes the regions take, each rounded up to kAlignment (so a multiple of kAlignment).
  size_t used_bytes() const { return used_; }

  // Bytes the caller must provide: the regions plus slack to align an arbitrary base pointer.
  size_t total_bytes() const { return used_ == 0 ? 0 : used_ + kAlignment; }

  // The region at `offset` inside `workspace` (any alignment).
  template <typename T>
  T* at(void* workspace, size_t offset) const {
    const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t aligned = (base + kAlignment - 1) & ~static_cast<uintptr_t>(kAlignment - 1);
    return reinterpret_cast<T*>(aligned + offset);
  }

 private:
  static size_t round_up(size_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  size_t used_ = 0;
};

}  // namespace sciattn::detail
