// The device copy of a BlockSparseIndex that the GPU kernels read: 32-bit arrays in one CUDA
// allocation. Host-only C++ (no CUDA headers), so the ops' dispatch point can check it; packed by
// detail::pack_block_sparse_index (common/block_sparse_device_pack.h) and copied by
// upload_block_sparse_index (src/cuda/block_sparse/block_sparse_device_index.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "sciattn/block_sparse_ops.h"

namespace sciattn {

// The arrays of a device index: 32-bit copies of a BlockSparseIndex's arrays and of the fused
// attention's tile index, as pointers into one packed buffer (detail::pack_block_sparse_index,
// common/block_sparse_device_pack.h). On the GPU the buffer is the device allocation; the host
// emulator of the kernels points them at the host buffer itself.
struct BlockSparseDeviceArrays {
  // A BlockSparseWorkSplit on the device (see its comment in sciattn/block_sparse_ops.h).
  // With the partial slots the GPU MatMul combines split lines through: the pieces of split
  // lines are numbered 0 .. slots - 1 in piece order (a line's pieces consecutively), the piece of
  // a whole line has slot -1.
  struct Split {
    int32_t pieces = 0;
    int32_t max_blocks = 0;
    int32_t slots = 0;                     // pieces of split lines
    int32_t num_split_lines = 0;           // lines cut into more than one piece
    const int32_t* line_items = nullptr;   // [lines + 1]
    const int32_t* item_line = nullptr;    // [pieces]
    const int32_t* item_begin = nullptr;   // [pieces]
    const int32_t* item_end = nullptr;     // [pieces]
    const int32_t* item_slot = nullptr;    // [pieces] partial slot, -1 when the line is whole
    const int32_t* split_lines = nullptr;  // [num_split_lines] ascending
  };

  int32_t block = 0, num_heads = 0, num_row_blocks = 0, num_col_blocks = 0, nnz = 0;
  int32_t max_row_nnz = 0, max_col_nnz = 0;
  // The stored heads G (BlockSparseIndex::layout_heads) and their blocks: head h reads stored
  // head h % G, whose stored position s is the sparse tensors' block (h / G) * stored_nnz + s.
  int32_t layout_heads = 0, stored_nnz = 0;

  // The host index's arrays, as int32 (see BlockSparseIndex).
  const int32_t* head = nullptr;         // [stored_nnz]
  const int32_t* row = nullptr;          // [stored_nnz]
  const int32_t* col = nullptr;          // [stored_nnz]
  const int32_t* row_offsets = nullptr;  // [G * R + 1]
  const int32_t* col_offsets = nullptr;  // [G * C + 1]
  const int32_t* col_rows = nullptr;     // [stored_nnz]
  const int32_t* col_blocks = nullptr;   // [stored_nnz]
  Split row_split, col_split;

  // The fused attention's tile index (common/sparse_attention_tiles.h) as int32, for the G
  // stored heads; num_tiles is 0 for a non-square layout, which only the MatMul / Softmax ops
  // take.
  struct TileWork {
    int32_t pieces = 0;
    int32_t max_tiles = 0;
    int32_t slots = 0;  // pieces of split lines (fp32 partials)
    int32_t num_split_lines = 0;
    const int32_t* line_items = nullptr;   // [lines + 1]
    const int32_t* item_line = nullptr;    // [pieces]
    const int32_t* item_begin = nullptr;   // [pieces] positions in the entry list
    const int32_t* item_end = nullptr;     // [pieces]
    const int32_t* item_slot = nullptr;    // [pieces] partial slot, -1 when the line is whole
    const int32_t* split_lines = nullptr;  // [num_split_lines]
    // The tokens of each line's own side, for a packed layout: its units (Tiles::row_units or
    // col_units); null where line T holds tokens T * 64 .. (blocks of 64 and 128).
    const int32_t* line_units = nullptr;
  };
  struct Tiles {
    int32_t sub = 1, shift = 0, full_mask = 1;
    int32_t num_tiles = 0;  // per side
    // 1 when every stored head holds every block at or below the diagonal: under the causal rule
    // the layout is dense causal attention, which the fused forward runs without its lists.
    int32_t lower_complete = 0;
    // H / G: each piece of the stored lists is worked for this many heads (h = g + k * G), as
    // if the batch were this many times larger; the partial slots count (batch, k) pairs.
    int32_t head_repeat = 1;
    int32_t layout_heads = 1;  // G
    int32_t row_entries = 0, col_entries = 0;
    const int32_t* row_offsets = nullptr;  // [G * num_tiles + 1]
    const int32_t* row_slots = nullptr;    // [row_entries * sub] column units, -1 empty
    const int32_t* row_masks = nullptr;    // [row_entries]
    const int32_t* col_offsets = nullptr;  // [G * num_tiles + 1]
    const int32_t* col_slots = nullptr;    // [col_entries * sub] row units, -1 empty
    const int32_t* col_masks = nullptr;    // [col_entries]
    // Packed layouts (sub > 1): the block rows of each tile row, the block columns of each tile
    // column, and the place of each block row and column (common/sparse_attention_tiles.h);
    // empty arrays otherwise.
    const int32_t* row_units = nullptr;       // [G * num_tiles * sub], -1 empty
    const int32_t* col_units = nullptr;       // [G * num_tiles * sub], -1 empty
    const int32_t* row_unit_place = nullptr;  // [G * num_row_blocks]: line * sub + k
    const int32_t* col_unit_place = nullptr;  // [G * num_col_blocks]: line * sub + k
    TileWork rows, cols;
  };
  Tiles tiles;
};

// The device copy of an index: its arrays in one CUDA allocation, which it owns.
struct BlockSparseDeviceIndex : BlockSparseDeviceArrays {
  int device = -1;         // the CUDA device ordinal the arrays live on
  void* memory = nullptr;  // the one allocation holding every array
  size_t bytes = 0;

  BlockSparseDeviceIndex() = default;
  BlockSparseDeviceIndex(const BlockSparseDeviceIndex&) = delete;
  BlockSparseDeviceIndex& operator=(const BlockSparseDeviceIndex&) = delete;
  ~BlockSparseDeviceIndex();  // frees `memory`
};

namespace detail {
// The checks every op on CUDA tensors makes of its index: uploaded, matching the host index it
// travels with, and on the device that holds `tensor_data` (a device pointer of the call). The
// message names `index` and says how to upload.
Status check_device_index(const BlockSparseIndex& index, const void* tensor_data);
}  // namespace detail

}  // namespace sciattn
