// upload_block_sparse_index: packs a BlockSparseIndex's arrays, and the fused attention's tile
// index built from it, as int32 into one buffer and copies it to the chosen CUDA device. CUDA
// layer (host code).
#include <cuda_runtime.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/block_sparse_device_index.h"
#include "common/sparse_attention_tiles.h"
#include "cuda/device_guard.h"

namespace sciattn {
namespace {

// The int32 arrays of the upload, appended one after another; each array starts on a 16-byte
// boundary so that kernels may read them with vector loads.
class Int32Packer {
 public:
  // Appends `values` and returns the element offset of its first entry; sets *fits = false when a
  // value does not fit in int32.
  size_t add(const std::vector<int64_t>& values, bool* fits) {
    while (data_.size() % 4 != 0) data_.push_back(0);
    const size_t offset = data_.size();
    for (int64_t v : values) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        *fits = false;
      }
      data_.push_back(static_cast<int32_t>(v));
    }
    return offset;
  }
  const std::vector<int32_t>& data() const { return data_; }

 private:
  std::vector<int32_t> data_;
};

struct SplitOffsets {
  size_t line_items, item_line, item_begin, item_end;
};

SplitOffsets add_split(Int32Packer& packer, const BlockSparseWorkSplit& s, bool* fits) {
  SplitOffsets o{};
  o.line_items = packer.add(s.line_items, fits);
  o.item_line = packer.add(s.item_line, fits);
  o.item_begin = packer.add(s.item_begin, fits);
  o.item_end = packer.add(s.item_end, fits);
  return o;
}

BlockSparseDeviceIndex::Split device_split(const int32_t* base, const SplitOffsets& o,
                                           const BlockSparseWorkSplit& s) {
  BlockSparseDeviceIndex::Split d;
  d.pieces = static_cast<int32_t>(s.pieces());
  d.max_blocks = static_cast<int32_t>(s.max_blocks);
  d.line_items = base + o.line_items;
  d.item_line = base + o.item_line;
  d.item_begin = base + o.item_begin;
  d.item_end = base + o.item_end;
  return d;
}

struct TileWorkOffsets {
  size_t line_items, item_line, item_begin, item_end, item_slot, split_lines;
};

TileWorkOffsets add_tile_work(Int32Packer& packer, const detail::SparseAttentionTileWork& w,
                              bool* fits) {
  TileWorkOffsets o{};
  o.line_items = packer.add(w.split.line_items, fits);
  o.item_line = packer.add(w.split.item_line, fits);
  o.item_begin = packer.add(w.split.item_begin, fits);
  o.item_end = packer.add(w.split.item_end, fits);
  o.item_slot = packer.add(w.item_slot, fits);
  o.split_lines = packer.add(w.split_lines, fits);
  return o;
}

BlockSparseDeviceIndex::TileWork device_tile_work(const int32_t* base, const TileWorkOffsets& o,
                                                  const detail::SparseAttentionTileWork& w) {
  BlockSparseDeviceIndex::TileWork d;
  d.pieces = static_cast<int32_t>(w.split.pieces());
  d.max_tiles = static_cast<int32_t>(w.split.max_blocks);
  d.slots = static_cast<int32_t>(w.slots);
  d.num_split_lines = static_cast<int32_t>(w.split_lines.size());
  d.line_items = base + o.line_items;
  d.item_line = base + o.item_line;
  d.item_begin = base + o.item_begin;
  d.item_end = base + o.item_end;
  d.item_slot = base + o.item_slot;
  d.split_lines = base + o.split_lines;
  return d;
}

}  // namespace

BlockSparseDeviceIndex::~BlockSparseDeviceIndex() {
  if (memory == nullptr) return;
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess && current != device) {
    cudaSetDevice(device);
    cudaFree(memory);
    cudaSetDevice(current);
  } else {
    cudaFree(memory);
  }
}

// Runs `body` with `device` current, restoring the caller's device afterwards.
template <typename Body>
Status on_device(int device, Body body) {
  int current = 0;
  cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) return cuda::device_status(e, "upload_block_sparse_index: cudaGetDevice");
  if (current != device) {
    e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda::device_status(e, "upload_block_sparse_index: cudaSetDevice");
  }
  const Status status = body();
  if (current != device) cudaSetDevice(current);
  return status;
}

Status upload_block_sparse_index(BlockSparseIndex* index, int device) {
  if (index == nullptr) return Status::invalid_argument("index is a null pointer");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    devices = 0;
  }
  if (device < 0 || device >= devices) {
    return Status::invalid_argument("device must be a CUDA device ordinal in [0, " +
                                    std::to_string(devices) + "); got " + std::to_string(device));
  }
  const BlockSparseIndex& ix = *index;
  if (ix.block < 1 ||
      static_cast<int64_t>(ix.row_offsets.size()) != ix.num_heads * ix.num_row_blocks + 1) {
    return Status::invalid_argument(
        "index has not been built; build it with build_block_sparse_index first");
  }
  bool fits = true;
  Int32Packer packer;
  const size_t head = packer.add(ix.head, &fits);
  const size_t row = packer.add(ix.row, &fits);
  const size_t col = packer.add(ix.col, &fits);
  const size_t row_offsets = packer.add(ix.row_offsets, &fits);
  const size_t col_offsets = packer.add(ix.col_offsets, &fits);
  const size_t col_rows = packer.add(ix.col_rows, &fits);
  const size_t col_blocks = packer.add(ix.col_blocks, &fits);
  const SplitOffsets row_split = add_split(packer, ix.row_split, &fits);
  const SplitOffsets col_split = add_split(packer, ix.col_split, &fits);
  // The fused attention's tiles, for square layouts (sparse self-attention); the MatMul and
  // Softmax ops also take rectangular ones, which get none.
  detail::SparseAttentionTiles tiles;
  const bool with_tiles = ix.num_row_blocks == ix.num_col_blocks;
  if (with_tiles) {
    const Status built = detail::build_sparse_attention_tiles(ix, &tiles);
    if (!built.ok()) return built;
  }
  const size_t tile_row_offsets = packer.add(tiles.row_offsets, &fits);
  const size_t tile_row_slots = packer.add(tiles.row_slots, &fits);
  const size_t tile_row_masks = packer.add(tiles.row_masks, &fits);
  const size_t tile_col_offsets = packer.add(tiles.col_offsets, &fits);
  const size_t tile_col_slots = packer.add(tiles.col_slots, &fits);
  const size_t tile_col_masks = packer.add(tiles.col_masks, &fits);
  const TileWorkOffsets tile_rows = add_tile_work(packer, tiles.rows, &fits);
  const TileWorkOffsets tile_cols = add_tile_work(packer, tiles.cols, &fits);
  if (!fits) {
    return Status::invalid_argument(
        "index has a count that does not fit the GPU kernels' 32-bit "
        "indexes (at most 2^31 - 1 blocks per dimension and in all)");
  }

  auto d = std::make_shared<BlockSparseDeviceIndex>();
  d->device = device;
  d->bytes = packer.data().size() * sizeof(int32_t);
  const Status copied = on_device(device, [&] {
    if (d->bytes == 0) return Status::ok_status();
    cudaError_t e = cudaMalloc(&d->memory, d->bytes);
    if (e != cudaSuccess) {
      d->memory = nullptr;
      return cuda::device_status(e, "upload_block_sparse_index: cudaMalloc");
    }
    e = cudaMemcpy(d->memory, packer.data().data(), d->bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return cuda::device_status(e, "upload_block_sparse_index: cudaMemcpy");
    return Status::ok_status();
  });
  if (!copied.ok()) return copied;
  const int32_t* base = static_cast<const int32_t*>(d->memory);
  d->block = static_cast<int32_t>(ix.block);
  d->num_heads = static_cast<int32_t>(ix.num_heads);
  d->num_row_blocks = static_cast<int32_t>(ix.num_row_blocks);
  d->num_col_blocks = static_cast<int32_t>(ix.num_col_blocks);
  d->nnz = static_cast<int32_t>(ix.nnz);
  d->max_row_nnz = static_cast<int32_t>(ix.max_row_nnz);
  d->max_col_nnz = static_cast<int32_t>(ix.max_col_nnz);
  d->head = base + head;
  d->row = base + row;
  d->col = base + col;
  d->row_offsets = base + row_offsets;
  d->col_offsets = base + col_offsets;
  d->col_rows = base + col_rows;
  d->col_blocks = base + col_blocks;
  d->row_split = device_split(base, row_split, ix.row_split);
  d->col_split = device_split(base, col_split, ix.col_split);
  if (with_tiles) {
    BlockSparseDeviceIndex::Tiles& t = d->tiles;
    t.sub = static_cast<int32_t>(tiles.sub);
    t.shift = static_cast<int32_t>(tiles.shift);
    t.full_mask = static_cast<int32_t>(tiles.full_mask);
    t.num_tiles = static_cast<int32_t>(tiles.num_tiles);
    t.row_entries = static_cast<int32_t>(tiles.row_entries);
    t.col_entries = static_cast<int32_t>(tiles.col_entries);
    t.row_offsets = base + tile_row_offsets;
    t.row_slots = base + tile_row_slots;
    t.row_masks = base + tile_row_masks;
    t.col_offsets = base + tile_col_offsets;
    t.col_slots = base + tile_col_slots;
    t.col_masks = base + tile_col_masks;
    t.rows = device_tile_work(base, tile_rows, tiles.rows);
    t.cols = device_tile_work(base, tile_cols, tiles.cols);
  }
  index->device = std::move(d);
  return Status::ok_status();
}

namespace detail {

Status check_device_index(const BlockSparseIndex& index, const void* tensor_data) {
  const BlockSparseDeviceIndex* d = index.device.get();
  if (d == nullptr) {
    return Status::invalid_argument(
        "index: the tensors are on a CUDA device but the index has not been uploaded; call "
        "upload_block_sparse_index(&index, device) once after building it");
  }
  if (d->nnz != index.nnz || d->block != index.block || d->num_heads != index.num_heads ||
      d->num_row_blocks != index.num_row_blocks || d->num_col_blocks != index.num_col_blocks ||
      d->row_split.pieces != index.row_split.pieces() ||
      d->col_split.pieces != index.col_split.pieces()) {
    return Status::invalid_argument(
        "index: its device copy does not match it (the index was changed after "
        "upload_block_sparse_index); upload it again");
  }
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, tensor_data) != cudaSuccess) {
    cudaGetLastError();
    return Status::ok_status();  // cannot tell; the launch reports a real mismatch
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != d->device) {
    return Status::invalid_argument(
        "index: uploaded to CUDA device " + std::to_string(d->device) +
        " but the tensors are on CUDA device " + std::to_string(attributes.device) +
        "; upload it to that device (upload_block_sparse_index(&index, " +
        std::to_string(attributes.device) + "))");
  }
  return Status::ok_status();
}

}  // namespace detail
}  // namespace sciattn
