// Packs int64 index arrays into one int32 buffer for a device upload (upload_block_sparse_index):
// each array starts on a 16-byte boundary, so that kernels may read it with vector loads. The
// arrays are registered first (their offsets are known at once) and converted in one pass into a
// buffer allocated once: growing the buffer array by array was most of an upload's host time
// (BigBird, 65,536 tokens, block 64: 18 ms for 5 MB on the 2-core CI-class machine).
// Host-only common layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace sciattn::detail {

class Int32Packer {
 public:
  static constexpr size_t kAlign = 4;  // int32 elements per 16 bytes

  // Registers `values`, which must stay alive and unchanged until pack(); returns the element
  // offset its first entry will have in the packed buffer.
  size_t add(const std::vector<int64_t>& values) {
    const size_t offset = size_;
    arrays_.push_back({&values, offset});
    size_ = (offset + values.size() + kAlign - 1) / kAlign * kAlign;
    return offset;
  }

  // Elements of the packed buffer (the registered arrays with their padding).
  size_t size() const { return size_; }

  // Converts every registered array into `data` (room for size() elements; padding is written as
  // 0). Returns false, leaving `data` unspecified, when a value does not fit in int32.
  bool pack(int32_t* data) const {
    // A value v fits in int32 exactly when v + 2^31 (in unsigned 64-bit arithmetic, which wraps
    // instead of overflowing) is below 2^32: the high halves of those sums, OR-ed, are zero. An
    // add, a shift and an OR per value vectorise, where a running min / max (a compare-and-move
    // chain from one value to the next) ran at ~1 ns per value.
    uint64_t high_bits = 0;
    size_t end = 0;  // the end of the previous array, where its padding starts
    for (const Array& a : arrays_) {
      std::memset(data + end, 0, (a.offset - end) * sizeof(int32_t));
      const int64_t* src = a.values->data();
      int32_t* dst = data + a.offset;
      const size_t n = a.values->size();
      for (size_t i = 0; i < n; ++i) {
        high_bits |= (static_cast<uint64_t>(src[i]) + kInt32Bias) >> 32;
        dst[i] = static_cast<int32_t>(src[i]);
      }
      end = a.offset + n;
    }
    std::memset(data + end, 0, (size_ - end) * sizeof(int32_t));
    return high_bits == 0;
  }

 private:
  static constexpr uint64_t kInt32Bias = uint64_t{1} << 31;  // -INT32_MIN
  struct Array {
    const std::vector<int64_t>* values;
    size_t offset;
  };
  std::vector<Array> arrays_;
  size_t size_ = 0;
};

}  // namespace sciattn::detail
