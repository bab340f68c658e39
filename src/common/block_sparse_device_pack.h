// The host step of upload_block_sparse_index: a BlockSparseIndex's arrays and the fused
// attention's tile index built from it (common/sparse_attention_tiles.h), packed as int32 into one
// buffer, with the BlockSparseDeviceArrays that point into it. The upload copies the buffer to
// the device and points the arrays there (`at`); the host emulator of the kernels
// (tests/cuda/emulation) runs them on the buffer itself, so both read the same packing. Host-only
// common layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/block_sparse_device_index.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::detail {

class PackedBlockSparseIndex {
 public:
  const int32_t* data() const { return data_.get(); }
  size_t size() const { return size_; }  // int32 elements
  // The arrays with their pointers into `base`, a copy of data() (size() elements).
  BlockSparseDeviceArrays at(const int32_t* base) const;

 private:
  friend Status pack_block_sparse_index(const BlockSparseIndex&, PackedBlockSparseIndex*);
  std::unique_ptr<int32_t[]> data_;
  size_t size_ = 0;
  BlockSparseDeviceArrays arrays_;  // pointing into data_
};

// Packs `index` (built; square layouts also get the tile index). Fails, naming the index, when
// it is not built or a value does not fit the kernels' int32 indexes.
Status pack_block_sparse_index(const BlockSparseIndex& index, PackedBlockSparseIndex* out);

}  // namespace sciattn::detail
