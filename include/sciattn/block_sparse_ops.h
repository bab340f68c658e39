// Block-sparse tensor ops of DeepSpeed Sparse Attention (MatMul sdd/dsd/dds, Softmax) and sparse
// self-attention (the composite sdd -> softmax -> dsd path and a fused path). Public API layer
// (plain C++17). Semantics: docs/block_sparse_ops.md and spec/block_sparse.md section 2.
//
// Every op follows the library's protocol:
//   std::string why;
//   if (!can_implement(p, &why).ok()) ...;          // nothing runs, `why` says what is wrong
//   std::vector<std::byte> ws(workspace_size(p));   // the call allocates nothing itself
//   Status s = run(p, ws.data(), ws.size());
//
// The sparse tensor format (spec 2.1): a layout [H, R, C] of 0/1 blocks has nnz nonzero blocks,
// numbered p = 0..nnz-1 in (head, block row, block column) order, DeepSpeed's layout.nonzero()
// order. A sparse tensor is a TensorView of shape [Z, nnz, b, b] whose element [z, p, r, c] is the
// logical element [z, h_p, I_p * b + r, J_p * b + c]; heads are folded into the nnz axis.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sciattn/block_sparse.h"
#include "sciattn/device.h"
#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn {

// =================================================================================================
// The block-sparse index: built once per (layout, block), shared by every op on that layout
// =================================================================================================

// How parallel kernels divide the lines (block rows, or block columns) of a layout into pieces
// of at most max_blocks nonzero blocks each, so that a long line (a global block attends to every
// block) is shared by several workers instead of serialising one; the pieces of a split line are
// combined in piece order, which keeps results deterministic. Lines are numbered g * R + r (rows)
// or g * C + c (columns) over the index's stored heads g (BlockSparseIndex::layout_heads); a line
// without blocks is one empty piece, so that its output (zero) is still written.
struct BlockSparseWorkSplit {
  int64_t max_blocks = 0;           // the most nonzero blocks one piece holds (>= 1)
  std::vector<int64_t> line_items;  // [lines + 1]: pieces of line l are line_items[l] .. [l+1]-1
  std::vector<int64_t> item_line;   // [pieces] the line of each piece
  // [pieces] the piece's positions in the row-wise (CSR: s) or column-wise (CSC: k) index, a
  // contiguous range item_begin .. item_end - 1 of the line's range, in the line's order.
  std::vector<int64_t> item_begin, item_end;
  int64_t split_lines = 0;          // lines cut into more than one piece
  int64_t max_pieces_per_line = 0;  // 1 when nothing is split

  int64_t pieces() const { return static_cast<int64_t>(item_line.size()); }
  // The pieces of split lines: each needs an fp32 partial result (in the GPU kernels'
  // workspace) until the pieces of its line are combined.
  int64_t split_pieces() const {
    return line_items.empty()
               ? 0
               : pieces() - (static_cast<int64_t>(line_items.size()) - 1 - split_lines);
  }
};

// A copy of an index's arrays in CUDA device memory, which the GPU kernels read (32-bit, plus
// the fused attention kernel's tile lists). Opaque; made by upload_block_sparse_index and freed
// when the last index holding it goes away.
struct BlockSparseDeviceIndex;

// The nonzero blocks of a layout and the row-wise and column-wise indexes the kernels walk.
// Build it with build_block_sparse_index (from a layout; reads the whole layout) or
// build_sparse_attention_index (from a config, without the dense layout: about 1-2 ms at 65,536
// tokens and block 64 for BigBird, BSLongformer and Variable); the ops hold a pointer to it, so
// it must outlive them. Build it once per layout and keep it.
//
// Stored heads. When every head has the same layout (the configs' default,
// different_layout_per_head = false), the lists are kept once: layout_heads = 1 and the arrays
// describe head 0 only, 1/H of the bytes to build, pack and upload. In general the arrays hold
// the lists of layout_heads heads (num_heads, or 1; layout_heads divides num_heads), head h reads
// those of stored head stored_head(h) = h % layout_heads, and a stored position s of its lists
// (an index into head, row, col, col_rows and col_blocks' values) is the sparse tensors' block
// p = s + position_shift(h). With layout_heads == num_heads both are the identity.
struct BlockSparseIndex {
  int64_t block = 0;           // b: tokens per block side
  int64_t num_heads = 0;       // H
  int64_t layout_heads = 0;    // heads whose lists the arrays hold: H, or 1 (see above)
  int64_t num_row_blocks = 0;  // R: the logical matrix of one head has R * b rows
  int64_t num_col_blocks = 0;  // C: ... and C * b columns
  int64_t nnz = 0;  // nonzero blocks over all H heads: the sparse tensors' [Z, nnz, b, b]

  // The stored enumeration: stored block s is (head[s], row[s], col[s]), sorted by head, then
  // row, then column; head[s] < layout_heads. Over all heads the sparse tensors' blocks p are in
  // DeepSpeed's (head, row, column) order: block_head / block_row / block_col read them.
  std::vector<int64_t> head, row, col;  // [stored_nnz()] each

  // Row-wise index (CSR). Because the enumeration is sorted by (head, row, column), the blocks of
  // block row I of stored head g are exactly s = row_offsets[g * R + I] .. row_offsets[g * R + I +
  // 1] - 1, in ascending column order: the CSR's entries are the stored positions themselves, and
  // their columns are col[s]. row_begin(h, I) / row_end(h, I) give that range for head h.
  std::vector<int64_t> row_offsets;  // [layout_heads * R + 1]

  // Column-wise index (CSC): the blocks of block column J of stored head g are col_blocks[k] (a
  // stored position) for k = col_offsets[g * C + J] .. col_offsets[g * C + J + 1] - 1, in
  // ascending row order; col_rows[k] is that block's row (== row[col_blocks[k]]).
  std::vector<int64_t> col_offsets;  // [layout_heads * C + 1]
  std::vector<int64_t> col_rows;     // [stored_nnz()]
  std::vector<int64_t> col_blocks;   // [stored_nnz()] stored positions s

  int64_t max_row_nnz = 0;  // the longest block row over all heads
  int64_t max_col_nnz = 0;  // the longest block column over all heads

  // The work split of the stored rows (forward and dQ walk rows) and of the stored columns
  // (dK/dV walk columns), with max_blocks = default_split_blocks(*this) unless rebuilt with
  // split_block_sparse_work. Its lines are those of the stored heads (g * R + r, g * C + c).
  BlockSparseWorkSplit row_split, col_split;

  // The device copy the GPU ops read, on the CUDA device it was uploaded to; null until
  // upload_block_sparse_index. An op on CUDA tensors fails, saying so, without it. Rebuilding
  // the splits (split_block_sparse_work) drops it, since it would no longer match.
  std::shared_ptr<const BlockSparseDeviceIndex> device;

  // Blocks in the stored lists (nnz / (num_heads / layout_heads)).
  int64_t stored_nnz() const { return row_offsets.empty() ? 0 : row_offsets.back(); }
  // The stored head whose lists head h reads, and the shift from its stored positions to the
  // sparse tensors' blocks.
  int64_t stored_head(int64_t h) const { return h % layout_heads; }
  int64_t position_shift(int64_t h) const { return (h / layout_heads) * stored_nnz(); }

  // The stored range of block row r (column c) of head h.
  int64_t row_begin(int64_t h, int64_t r) const {
    return row_offsets[static_cast<size_t>(stored_head(h) * num_row_blocks + r)];
  }
  int64_t row_end(int64_t h, int64_t r) const {
    return row_offsets[static_cast<size_t>(stored_head(h) * num_row_blocks + r + 1)];
  }
  int64_t col_begin(int64_t h, int64_t c) const {
    return col_offsets[static_cast<size_t>(stored_head(h) * num_col_blocks + c)];
  }
  int64_t col_end(int64_t h, int64_t c) const {
    return col_offsets[static_cast<size_t>(stored_head(h) * num_col_blocks + c + 1)];
  }

  // Head, block row and block column of the sparse tensors' block p (0 <= p < nnz).
  int64_t block_head(int64_t p) const {
    const int64_t n = stored_nnz();
    return head[static_cast<size_t>(p % n)] + (p / n) * layout_heads;
  }
  int64_t block_row(int64_t p) const { return row[static_cast<size_t>(p % stored_nnz())]; }
  int64_t block_col(int64_t p) const { return col[static_cast<size_t>(p % stored_nnz())]; }
};

// Builds the index of `layout` for blocks of `block` tokens (16, 32, 64 or 128). Fails, naming
// the argument, when block is unsupported, a layout dimension is < 1, layout.blocks does not have
// num_heads * num_row_blocks * num_col_blocks entries, an entry is not 0 or 1, or the sizes in
// tokens overflow. A layout without any nonzero block is valid (nnz = 0).
Status build_block_sparse_index(const Layout& layout, int64_t block, BlockSparseIndex* out);

// The default piece size of the work split: twice the mean line length (rows or columns, the
// larger), at least 16 blocks, so that ordinary lines stay whole and only lines much longer than
// the mean (global blocks) are cut.
int64_t default_split_blocks(const BlockSparseIndex& index);

// Rebuilds index->row_split and index->col_split with pieces of at most max_blocks blocks
// (>= 1; rejected otherwise, naming max_blocks). Drops index->device: upload again afterwards.
Status split_block_sparse_work(int64_t max_blocks, BlockSparseIndex* index);

// Copies the index to CUDA device `device` (an ordinal; index->device), for the ops on CUDA
// tensors of that device: once per layout and device, like building it. The memory (a few int32 per
// nonzero block) is allocated here with cudaMalloc and freed with the last copy of the index; the
// copy is synchronous. Fails with kNotSupported in a build without CUDA, kDeviceError when the
// runtime fails, and kInvalidArgument when a count does not fit the kernels' 32-bit indexes.
Status upload_block_sparse_index(BlockSparseIndex* index, int device = 0);

// The index SparseSelfAttention uses for an input of length seq_len: the layout built for
// max_seq_length, cropped to the first seq_len / block blocks (spec 1.9; make_layout_for_length).
Status build_sparse_attention_index(const SparsityConfig& config, int64_t max_seq_length,
                                    int64_t seq_len, BlockSparseIndex* out);

// How the ops read a mask (spec 2.3). kAdd adds the value to the score (0 keeps, a large negative
// value or -inf removes). kMul is DeepSpeed's "mul": not a multiplication, a value of 0 removes
// the key and any other value keeps it. A kBool mask means true = keep, false = remove, in both
// modes.
enum class MaskMode : int { kAdd = 0, kMul = 1 };
const char* mask_mode_name(MaskMode mode);  // "add", "mul"
std::optional<MaskMode> parse_mask_mode(std::string_view name);

// =================================================================================================
// MatMul (DeepSpeed's MatMul(layout, block, mode, trans_a, trans_b); spec 2.2)
// =================================================================================================

// sdd: C (sparse) = op(A) * op(B) on the layout's blocks only.
// dsd: C (dense)  = op(A) * op(B), A sparse.
// dds: C (dense)  = op(A) * op(B), B sparse.
// op(X) is X, or X with its last two dimensions swapped when the matching trans flag is set. A
// sparse operand is the logical [Z, H, R * b, C * b] matrix (zero outside the layout), so its
// transpose is [Z, H, C * b, R * b].
enum class BlockSparseMatMulMode : int { kSdd = 0, kDsd = 1, kDds = 2 };
const char* matmul_mode_name(BlockSparseMatMulMode mode);  // "sdd", "dsd", "dds"
std::optional<BlockSparseMatMulMode> parse_matmul_mode(std::string_view name);

// Shapes (Z any batch >= 1, H = index->num_heads; dense tensors may have any strides, e.g. a
// transposed view; sparse tensors any strides with stride 1 on the last dimension):
//   sdd: a dense [Z, H, R*b, K] ([Z, H, K, R*b] with trans_a); b dense [Z, H, K, C*b]
//        ([Z, H, C*b, K] with trans_b); c sparse [Z, nnz, b, b]. K is any size >= 1.
//   dsd: a sparse [Z, nnz, b, b]; b dense [Z, H, Kin, N] ([Z, H, N, Kin] with trans_b) where
//        Kin = C*b (R*b with trans_a); c dense [Z, H, R*b, N] ([Z, H, C*b, N] with trans_a).
//   dds: a dense [Z, H, M, Kin] ([Z, H, Kin, M] with trans_a) where Kin = R*b (C*b with
//        trans_b); b sparse [Z, nnz, b, b]; c dense [Z, H, M, C*b] ([Z, H, M, R*b] with trans_b).
// a, b and c share one dtype: f32, f16 or bf16 (accumulation is always fp32).
struct BlockSparseMatMulParams {
  const BlockSparseIndex* index = nullptr;  // the layout of the sparse operand or result
  BlockSparseMatMulMode mode = BlockSparseMatMulMode::kSdd;
  bool trans_a = false;
  bool trans_b = false;
  TensorView a;  // see the shapes above
  TensorView b;
  TensorView c;  // written; must not overlap a or b
  // CPU only: the most threads to use; 0 means all hardware threads. Each loop of the call uses
  // fewer when it has less work than keeps them busy (one thread below a few milliseconds of
  // work). Results do not depend on it. The other ops' num_threads mean the same.
  int num_threads = 0;
};

// The gradients of C = op(A) * op(B) (spec 2.2, "Backward"): dA and dB from dC. A gradient of a
// sparse operand is sparse on the same layout (the gradient restricted to the layout, as in
// DeepSpeed). Either output may be absent (a null data pointer) to skip it, not both.
struct BlockSparseMatMulBackwardParams {
  const BlockSparseIndex* index = nullptr;
  BlockSparseMatMulMode mode = BlockSparseMatMulMode::kSdd;
  bool trans_a = false;
  bool trans_b = false;
  TensorView a;   // the forward's a
  TensorView b;   // the forward's b
  TensorView dc;  // gradient of the loss w.r.t. c, c's shape and dtype
  TensorView da;  // optional, a's shape and dtype (written)
  TensorView db;  // optional, b's shape and dtype (written)
  int num_threads = 0;
};

Status can_implement(const BlockSparseMatMulParams& p, std::string* why = nullptr);
Status can_implement(const BlockSparseMatMulBackwardParams& p, std::string* why = nullptr);
size_t workspace_size(const BlockSparseMatMulParams& p);
size_t workspace_size(const BlockSparseMatMulBackwardParams& p);
Status run(const BlockSparseMatMulParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});
Status run(const BlockSparseMatMulBackwardParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});

// 2 * Z * nnz * b * b * (inner size): the multiply-adds on the layout's blocks.
double block_sparse_matmul_flops(const BlockSparseMatMulParams& p);

// =================================================================================================
// Softmax (DeepSpeed's Softmax(layout, block); spec 2.3)
// =================================================================================================

// For each batch z, head h and query row i of the logical [R*b, C*b] matrix, over the row's
// layout entries j only:
//   v = x * scale + rpe[z, h, i, j] + kpm(key_padding_mask[z, j]) + am(attn_mask[i, j])
//   (and v = -inf where causal and j > i)
//   y = exp(v - max_row v) / sum_row exp(v - max_row v)
// A row whose every entry is -inf (fully masked) gets y = 0, not DeepSpeed's NaN. Rows of empty
// block rows have no entries, so nothing is written for them.
struct BlockSparseSoftmaxParams {
  const BlockSparseIndex* index = nullptr;
  TensorView x;  // [Z, nnz, b, b]  f32, f16 or bf16
  // [Z, nnz, b, b]  x's dtype (written). It may be x itself (same data, dtype and strides): the
  // in-place call of DeepSpeed. Otherwise it must not overlap x or any other input.
  TensorView y;
  float scale = 1.0f;  // multiplies x first (finite)
  // Optional inputs; any strides, including 0 (broadcast):
  TensorView rpe;               // [Z, H, R*b, C*b]  x's dtype or f32: relative position bias
  TensorView key_padding_mask;  // [Z, C*b]  x's dtype, f32 or bool
  TensorView attn_mask;         // [R*b, C*b]  x's dtype, f32 or bool
  MaskMode key_padding_mask_mode = MaskMode::kAdd;
  MaskMode attn_mask_mode = MaskMode::kAdd;
  // Token-level causal masking: remove entries with column > row. Not in DeepSpeed's Softmax; the
  // composite attention path uses it for SparseAttentionOptions::causal.
  bool causal = false;
  int num_threads = 0;
};

// dx = scale * y * (dy - sum_row(y * dy)) over each row's layout entries (DeepSpeed's backward;
// no gradient flows to rpe or the masks). Fully masked rows (y = 0) get dx = 0.
struct BlockSparseSoftmaxBackwardParams {
  const BlockSparseIndex* index = nullptr;
  TensorView y;   // [Z, nnz, b, b]  the forward's output
  TensorView dy;  // [Z, nnz, b, b]  y's dtype
  // [Z, nnz, b, b]  y's dtype (written). It may be dy itself (DeepSpeed writes into dy);
  // otherwise it must not overlap y or dy.
  TensorView dx;
  float scale = 1.0f;  // the forward's scale
  int num_threads = 0;
};

Status can_implement(const BlockSparseSoftmaxParams& p, std::string* why = nullptr);
Status can_implement(const BlockSparseSoftmaxBackwardParams& p, std::string* why = nullptr);
size_t workspace_size(const BlockSparseSoftmaxParams& p);
size_t workspace_size(const BlockSparseSoftmaxBackwardParams& p);
Status run(const BlockSparseSoftmaxParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});
Status run(const BlockSparseSoftmaxBackwardParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});

// =================================================================================================
// Sparse self-attention (DeepSpeed's SparseSelfAttention; spec 2.4)
// =================================================================================================

// For each batch z, head h and query i, over the keys j of the blocks of query block I = i / b in
// the layout of head h:
//   s_ij = scale * <q_i, k_j> + rpe[z, h, i, j] + kpm(key_padding_mask[z, j])
//          + am(attn_mask[i, j])          (and -inf where causal and j > i)
//   out_i = sum_j softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)
// A row with no unmasked key (a fully masked row, or an empty block row) gets out = 0, lse = -inf
// and zero gradients.
enum class SparseAttentionAlgorithm : int {
  // Streams over each query block's nonzero key blocks with an online softmax; never holds more
  // than one b x b score block per thread. The backward walks the column index for dK, dV and the
  // row index for dQ. The default.
  kFused = 0,
  // DeepSpeed's composition: W = sdd(Q, K^T), P = softmax(W), O = dsd(P, V), with W and P held in
  // fp32 in the workspace ([Z, nnz, b, b] each). Its backward recomputes P.
  kComposite = 1,
  // Dense attention with the layout applied as a mask: plain loops, one thread. The
  // specification the other paths are compared with (the CLI's and tests' "naive" baseline).
  kReference = 2,
};
const char* sparse_attention_algorithm_name(SparseAttentionAlgorithm a);  // "fused", ...

struct SparseAttentionOptions {
  // Multiplies <q, k>; std::nullopt means 1 / sqrt(D) (DeepSpeed's head_dim^-0.5).
  std::optional<float> scale;
  // Token-level causal masking inside the diagonal blocks: key j > query i is removed. Combine it
  // with a block-causal (unidirectional) layout for causal attention.
  bool causal = false;
  // SparseSelfAttention's defaults: key_padding_mask_mode 'add', attn_mask_mode 'mul'.
  MaskMode key_padding_mask_mode = MaskMode::kAdd;
  MaskMode attn_mask_mode = MaskMode::kMul;
  // CPU only: the most threads to use, 0 = all; fewer for calls with little work (as for
  // BlockSparseMatMulParams). Results do not depend on it.
  int num_threads = 0;
  SparseAttentionAlgorithm algorithm = SparseAttentionAlgorithm::kFused;
};

// The index is for the sequence length: num_heads = H and R = C = L / b (see
// build_sparse_attention_index for SparseSelfAttention's crop rule, and pad_to_block_size for
// lengths that are not a multiple of the block).
struct SparseAttentionForwardParams {
  const BlockSparseIndex* index = nullptr;
  // Inputs may have any strides: DeepSpeed's pre-transposed key ([B, H, D, L] in memory) is a
  // view with the last two strides swapped.
  TensorView q;    // [B, H, L, D]  f32, f16 or bf16; any strides
  TensorView k;    // [B, H, L, D]  q's dtype; any strides
  TensorView v;    // [B, H, L, D]  q's dtype; any strides
  TensorView rpe;  // optional [B, H, L, L]  q's dtype or f32; any strides (0 = broadcast)
  TensorView key_padding_mask;  // optional [B, L]  q's dtype, f32 or bool; any strides
  TensorView attn_mask;         // optional [L, L]  q's dtype, f32 or bool; any strides
  TensorView out;               // [B, H, L, D]  q's dtype (written); stride 1 on D
  TensorView lse;  // optional [B, H, L] f32 (written): log-sum-exp of each row's scores
  SparseAttentionOptions options;
};

struct SparseAttentionBackwardParams {
  const BlockSparseIndex* index = nullptr;
  TensorView q, k, v;           // [B, H, L, D]  as in the forward (any strides)
  TensorView rpe;               // optional, as in the forward (it gets no gradient)
  TensorView key_padding_mask;  // optional, as in the forward
  TensorView attn_mask;         // optional, as in the forward
  TensorView out;               // [B, H, L, D]  the forward's output (any strides)
  TensorView lse;               // [B, H, L] f32  the forward's log-sum-exp
  TensorView dout;              // [B, H, L, D]  q's dtype (any strides)
  TensorView dq, dk, dv;        // [B, H, L, D]  q's dtype (written); stride 1 on D
  SparseAttentionOptions options;
};

Status can_implement(const SparseAttentionForwardParams& p, std::string* why = nullptr);
Status can_implement(const SparseAttentionBackwardParams& p, std::string* why = nullptr);
size_t workspace_size(const SparseAttentionForwardParams& p);
size_t workspace_size(const SparseAttentionBackwardParams& p);
Status run(const SparseAttentionForwardParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});
Status run(const SparseAttentionBackwardParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});

// FLOPs on the layout's blocks, as reports count them: forward 4 * B * nnz * b * b * D,
// backward 10 * B * nnz * b * b * D (the fused backward recomputes the scores twice and does
// more; this is the conventional count).
double sparse_attention_forward_flops(const SparseAttentionForwardParams& p);
double sparse_attention_backward_flops(const SparseAttentionBackwardParams& p);

// =================================================================================================
// Padding (SparseAttentionUtils.pad_to_block_size / unpad_sequence_output)
// =================================================================================================

// Positions to append so that seq_len becomes a multiple of block: (block - seq_len % block) %
// block (DeepSpeed's pad_len). 0 for block < 1 or seq_len < 0.
int64_t block_pad_length(int64_t seq_len, int64_t block);

// Copies `src` into `dst`, which has the same rank and sizes except along `dim`, where dst has
// src.sizes[dim] rounded up to a multiple of `block`; the appended positions get `pad_value`
// (rounded to dst's dtype; for kBool, nonzero is true). Use it for Q, K, V (pad 0), for a key
// padding mask (pad -inf in kAdd mode, 0 or false in kMul mode), and for token ids. src and dst
// have one dtype and any strides; dst must not overlap src.
Status pad_to_block_size(const TensorView& src, int dim, int64_t block, double pad_value,
                         const TensorView& dst);

// Writes the key padding mask [B, Lp] for an input that had no mask and was padded from
// valid_len to Lp = dst.sizes[1] tokens: keep for j < valid_len, remove for the padding (kAdd:
// 0 / -inf; kMul: 1 / 0; kBool: true / false). DeepSpeed's pad_to_block_size needs a mask; this
// is what it should have built (spec Decision 7).
Status padding_key_mask(int64_t valid_len, MaskMode mode, const TensorView& dst);

// Copies the first dst.sizes[dim] positions of `src` along `dim` into `dst` (same rank and sizes
// otherwise, same dtype, any strides): DeepSpeed's unpad_sequence_output, seq_out[:, :-pad_len].
Status unpad_sequence_output(const TensorView& src, int dim, const TensorView& dst);

}  // namespace sciattn
