// Validation of the block-sparse ops' Params (see block_sparse_checks.h). Host-only common layer.
#include "common/block_sparse_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/tensor_checks.h"

namespace sciattn::detail {
namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

Status invalid_index(const std::string& what) {
  return Status::invalid_argument("index is not a valid BlockSparseIndex (" + what +
                                  "); build it with build_block_sparse_index(layout, block, "
                                  "&index) and do not modify it");
}

// A required tensor of rank `rank` whose sizes are read by the caller before the full check.
Status check_present_rank(const TensorView& t, const char* name, int rank, const char* symbolic) {
  if (t.data == nullptr) {
    return Status::invalid_argument(std::string(name) + " is required but is a null pointer");
  }
  if (t.rank != rank) {
    return Status::invalid_argument(std::string(name) + " must have rank " + str(rank) + " " +
                                    symbolic + "; got rank " + str(t.rank));
  }
  for (int d = 0; d < rank; ++d) {
    if (t.sizes[d] < 1) {
      return Status::invalid_argument(std::string(name) + " has shape " + t.shape_string() + " (" +
                                      symbolic + "); every size must be >= 1");
    }
  }
  return Status::ok_status();
}

// An output: distinct addresses, and no memory shared with any other tensor of the call.
struct Named {
  const TensorView* view;
  const char* name;
};

Status check_outputs(const std::vector<Named>& outputs, const std::vector<Named>& all) {
  for (const Named& out : outputs) {
    if (!out.view->present()) continue;
    SCIATTN_BS_RETURN_IF_ERROR(check_non_overlapping(*out.view, out.name));
    for (const Named& other : all) {
      if (other.view == out.view) continue;
      SCIATTN_BS_RETURN_IF_ERROR(check_disjoint(*out.view, out.name, *other.view, other.name));
    }
  }
  return Status::ok_status();
}

Status check_mask_mode(MaskMode mode, const char* name) {
  if (mode != MaskMode::kAdd && mode != MaskMode::kMul) {
    return Status::invalid_argument(std::string(name) +
                                    " must be MaskMode::kAdd or MaskMode::kMul");
  }
  return Status::ok_status();
}

Status check_scale(float scale, const char* name) {
  if (!std::isfinite(scale)) {
    return Status::invalid_argument(std::string(name) + " must be a finite number; got " +
                                    std::to_string(scale));
  }
  return Status::ok_status();
}

// The dense operand `t` of a MatMul: stored [Z, H, rows, cols], or [Z, H, cols, rows] when
// `transposed`, where op(t) is [Z, H, rows, cols].
Status check_dense_operand(const TensorView& t, const char* name, bool transposed,
                           const char* op_symbolic, const char* stored_symbolic, int64_t z,
                           int64_t h, int64_t rows, int64_t cols,
                           std::initializer_list<DType> dtypes, Device device) {
  // A transposed operand is stored with its last two dimensions swapped: say which flag did it.
  const std::string symbolic =
      transposed ? std::string(stored_symbolic) + (name[0] == 'a' ? " (trans_a)" : " (trans_b)")
                 : std::string(op_symbolic);
  const std::vector<int64_t> sizes =
      transposed ? std::vector<int64_t>{z, h, cols, rows} : std::vector<int64_t>{z, h, rows, cols};
  return check_tensor_any_strides(t, name, symbolic.c_str(), sizes, dtypes, device);
}

constexpr std::initializer_list<DType> kFloatTypes = {DType::kF32, DType::kF16, DType::kBF16};

// The operands of MatMul `mode`, with `c_name` the result (the forward's c, the backward's dc).
Status check_matmul_operands(const BlockSparseMatMulParams& p, const char* c_name, MatMulShape* s) {
  SCIATTN_BS_RETURN_IF_ERROR(check_index(p.index));
  const BlockSparseIndex& ix = *p.index;
  const int64_t rb = ix.num_row_blocks * ix.block, cb = ix.num_col_blocks * ix.block;
  const int64_t h = ix.num_heads;
  const Device dev = p.a.device;
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd: {
      SCIATTN_BS_RETURN_IF_ERROR(
          check_present_rank(p.a, "a", 4, p.trans_a ? "[Z, H, K, M]" : "[Z, H, M, K]"));
      const int64_t z = p.a.sizes[0], k = p.a.sizes[p.trans_a ? 2 : 3];
      // sdd: M must be the layout's R * b rows and N its C * b columns (DeepSpeed does not check;
      // its kernel would read out of bounds).
      SCIATTN_BS_RETURN_IF_ERROR(check_dense_operand(p.a, "a", p.trans_a, "[Z, H, M=R*b, K]",
                                                     "[Z, H, K, M=R*b]", z, h, rb, k, kFloatTypes,
                                                     dev));
      SCIATTN_BS_RETURN_IF_ERROR(check_dense_operand(p.b, "b", p.trans_b, "[Z, H, K, N=C*b]",
                                                     "[Z, H, N=C*b, K]", z, h, k, cb, {p.a.dtype},
                                                     dev));
      SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.c, c_name, ix, z, {p.a.dtype}, dev));
      *s = {z, h, rb, cb, k};
      return Status::ok_status();
    }
    case BlockSparseMatMulMode::kDsd: {
      SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.a, "a", ix, -1, kFloatTypes, dev));
      const int64_t z = p.a.sizes[0];
      const int64_t kin = p.trans_a ? rb : cb, m = p.trans_a ? cb : rb;
      const char* kin_name = p.trans_a ? "[Z, H, K=R*b, N]" : "[Z, H, K=C*b, N]";
      const char* kin_name_t = p.trans_a ? "[Z, H, N, K=R*b]" : "[Z, H, N, K=C*b]";
      SCIATTN_BS_RETURN_IF_ERROR(
          check_present_rank(p.b, "b", 4, p.trans_b ? kin_name_t : kin_name));
      const int64_t n = p.b.sizes[p.trans_b ? 2 : 3];
      SCIATTN_BS_RETURN_IF_ERROR(check_dense_operand(p.b, "b", p.trans_b, kin_name, kin_name_t, z,
                                                     h, kin, n, {p.a.dtype}, dev));
      SCIATTN_BS_RETURN_IF_ERROR(check_dense_operand(
          p.c, c_name, false, p.trans_a ? "[Z, H, M=C*b, N]" : "[Z, H, M=R*b, N]", "", z, h, m, n,
          {p.a.dtype}, dev));
      *s = {z, h, m, n, kin};
      return Status::ok_status();
    }
    case BlockSparseMatMulMode::kDds: {
      const int64_t kin = p.trans_b ? cb : rb, n = p.trans_b ? rb : cb;
      const char* kin_name = p.trans_b ? "[Z, H, M, K=C*b]" : "[Z, H, M, K=R*b]";
      const char* kin_name_t = p.trans_b ? "[Z, H, K=C*b, M]" : "[Z, H, K=R*b, M]";
      SCIATTN_BS_RETURN_IF_ERROR(
          check_present_rank(p.a, "a", 4, p.trans_a ? kin_name_t : kin_name));
      const int64_t z = p.a.sizes[0], m = p.a.sizes[p.trans_a ? 3 : 2];
      SCIATTN_BS_RETURN_IF_ERROR(check_dense_operand(p.a, "a", p.trans_a, kin_name, kin_name_t, z,
                                                     h, m, kin, kFloatTypes, dev));
      SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.b, "b", ix, z, {p.a.dtype}, dev));
      SCIATTN_BS_RETURN_IF_ERROR(check_dense_operand(
          p.c, c_name, false, p.trans_b ? "[Z, H, M, N=R*b]" : "[Z, H, M, N=C*b]", "", z, h, m, n,
          {p.a.dtype}, dev));
      *s = {z, h, m, n, kin};
      return Status::ok_status();
    }
  }
  return Status::invalid_argument("mode must be BlockSparseMatMulMode::kSdd, kDsd or kDds");
}

// A [B, H, L, D] output of an attention call: stride 1 on D.
Status check_qkv(const TensorView& t, const char* name, const AttentionShape& s,
                 std::initializer_list<DType> dtypes, Device device) {
  return check_tensor(t, name, "[B, H, L, D]", {s.batch, s.heads, s.len, s.dim}, dtypes, device);
}

// A [B, H, L, D] input: any strides, so that DeepSpeed's pre-transposed key ([B, H, D, L] in
// memory) is passed as a view, without a copy.
Status check_qkv_input(const TensorView& t, const char* name, const AttentionShape& s,
                       std::initializer_list<DType> dtypes, Device device) {
  return check_tensor_any_strides(t, name, "[B, H, L, D]", {s.batch, s.heads, s.len, s.dim}, dtypes,
                                  device);
}

// q and the index, and the inputs shared by forward and backward.
Status check_attention_inputs(const BlockSparseIndex* index, const TensorView& q,
                              const TensorView& k, const TensorView& v, const TensorView& rpe,
                              const TensorView& kpm, const TensorView& attn,
                              const SparseAttentionOptions& o, AttentionShape* s) {
  SCIATTN_BS_RETURN_IF_ERROR(check_index(index));
  const BlockSparseIndex& ix = *index;
  SCIATTN_BS_RETURN_IF_ERROR(check_present_rank(q, "q", 4, "[B, H, L, D]"));
  *s = {q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]};
  if (ix.num_row_blocks != ix.num_col_blocks) {
    return Status::invalid_argument(
        "index must be square for self-attention (num_row_blocks == num_col_blocks); got " +
        str(ix.num_row_blocks) + " x " + str(ix.num_col_blocks) + " blocks");
  }
  if (s->heads != ix.num_heads) {
    return Status::invalid_argument(
        "q has H = " + str(s->heads) + " heads in [B, H, L, D] (shape " + q.shape_string() +
        ") but index's layout has num_heads = " + str(ix.num_heads) + "; they must be equal");
  }
  if (s->len != ix.num_row_blocks * ix.block) {
    return Status::invalid_argument(
        "q has L = " + str(s->len) + " in [B, H, L, D] (shape " + q.shape_string() +
        ") but index is for L = num_row_blocks * block = " + str(ix.num_row_blocks) + " * " +
        str(ix.block) + " = " + str(ix.num_row_blocks * ix.block) +
        " tokens; build the index for this length, padding the sequence to a multiple of the "
        "block (pad_to_block_size) if needed");
  }
  int64_t scores = 0;
  if (!checked_product({s->batch, s->heads, s->len, s->len}, &scores)) {
    return Status::invalid_argument("q has shape " + q.shape_string() +
                                    ": B*H*L*L overflows int64; the problem is too large");
  }
  // The workspaces hold at most a few 4-byte values per score (the reference's and the
  // composite's score buffers) and per row element of the head dim padded to the kernels' (the
  // CUDA path's fp32 partials of split lines: D padded up to 32, 64 or 128, plus two per row), so
  // that 64 bytes for each keeps every size an int64. Views with zero strides on the inputs can
  // describe such shapes without the memory; no real problem comes near.
  int64_t workspace_bytes = 0;
  if (!checked_product({scores, 64}, &workspace_bytes) ||
      !checked_product({s->batch, s->heads, s->len, std::max<int64_t>(s->dim, 128) + 8, 64},
                       &workspace_bytes)) {
    return Status::invalid_argument("q has shape " + q.shape_string() +
                                    ": the problem is too large (its workspace would need more "
                                    "than 2^63 bytes; B*H*L*L and B*H*L*max(D, 128) must stay "
                                    "below 2^57)");
  }
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv_input(q, "q", *s, kFloatTypes, q.device));
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv_input(k, "k", *s, {q.dtype}, q.device));
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv_input(v, "v", *s, {q.dtype}, q.device));
  if (rpe.present()) {
    SCIATTN_BS_RETURN_IF_ERROR(check_tensor_any_strides(rpe, "rpe", "[B, H, L, L]",
                                                        {s->batch, s->heads, s->len, s->len},
                                                        {q.dtype, DType::kF32}, q.device));
  }
  if (kpm.present()) {
    SCIATTN_BS_RETURN_IF_ERROR(
        check_tensor_any_strides(kpm, "key_padding_mask", "[B, L]", {s->batch, s->len},
                                 {q.dtype, DType::kF32, DType::kBool}, q.device));
  }
  if (attn.present()) {
    SCIATTN_BS_RETURN_IF_ERROR(
        check_tensor_any_strides(attn, "attn_mask", "[L, L]", {s->len, s->len},
                                 {q.dtype, DType::kF32, DType::kBool}, q.device));
  }
  if (o.scale.has_value() && !std::isfinite(*o.scale)) {
    return Status::invalid_argument(
        "options.scale must be a finite number (or unset for 1/sqrt(D)); got " +
        std::to_string(*o.scale));
  }
  SCIATTN_BS_RETURN_IF_ERROR(
      check_mask_mode(o.key_padding_mask_mode, "options.key_padding_mask_mode"));
  SCIATTN_BS_RETURN_IF_ERROR(check_mask_mode(o.attn_mask_mode, "options.attn_mask_mode"));
  SCIATTN_BS_RETURN_IF_ERROR(check_num_threads(o.num_threads));
  if (o.algorithm != SparseAttentionAlgorithm::kFused &&
      o.algorithm != SparseAttentionAlgorithm::kComposite &&
      o.algorithm != SparseAttentionAlgorithm::kReference) {
    return Status::invalid_argument(
        "options.algorithm must be SparseAttentionAlgorithm::kFused, kComposite or kReference");
  }
  return Status::ok_status();
}

}  // namespace

Status check_num_threads(int num_threads) {
  if (num_threads < 0) {
    return Status::invalid_argument("num_threads must be >= 0 (0 = all hardware threads); got " +
                                    std::to_string(num_threads));
  }
  return Status::ok_status();
}

Status check_index(const BlockSparseIndex* index) {
  if (index == nullptr) {
    return Status::invalid_argument(
        "index is a null pointer; build one with build_block_sparse_index(layout, block, &index)");
  }
  const BlockSparseIndex& ix = *index;
  if (!is_supported_block_size(ix.block)) return invalid_index("block " + str(ix.block));
  if (ix.num_heads < 1 || ix.num_row_blocks < 1 || ix.num_col_blocks < 1 || ix.nnz < 0 ||
      ix.layout_heads < 1 || ix.num_heads % ix.layout_heads != 0) {
    return invalid_index("a count is out of range");
  }
  int64_t entries = 0, tokens = 0;
  if (!checked_product({ix.num_heads, ix.num_row_blocks, ix.num_col_blocks}, &entries) ||
      !checked_product({ix.num_row_blocks, ix.num_col_blocks, ix.block, ix.block}, &tokens) ||
      ix.nnz > entries) {
    return invalid_index("its sizes overflow or nnz exceeds the layout");
  }
  // The stored lists: layout_heads heads, repeated num_heads / layout_heads times.
  const int64_t stored = ix.stored_nnz();
  const auto n = static_cast<size_t>(stored);
  if (ix.head.size() != n || ix.row.size() != n || ix.col.size() != n || ix.col_rows.size() != n ||
      ix.col_blocks.size() != n ||
      ix.row_offsets.size() != static_cast<size_t>(ix.layout_heads * ix.num_row_blocks + 1) ||
      ix.col_offsets.size() != static_cast<size_t>(ix.layout_heads * ix.num_col_blocks + 1) ||
      ix.row_offsets.front() != 0 || ix.col_offsets.front() != 0 ||
      ix.col_offsets.back() != stored || stored * (ix.num_heads / ix.layout_heads) != ix.nnz) {
    return invalid_index("its arrays do not match its counts");
  }
  return Status::ok_status();
}

Status check_tensor_any_strides(const TensorView& t, const char* name, const char* symbolic,
                                const std::vector<int64_t>& sizes,
                                std::initializer_list<DType> dtypes, Device device) {
  // check_tensor does everything but insists on a unit last stride; give it a copy with one,
  // then check that the real strides do not overflow.
  TensorView unit = t;
  if (t.rank > 0 && t.rank <= TensorView::kMaxRank) unit.strides[t.rank - 1] = 1;
  SCIATTN_BS_RETURN_IF_ERROR(check_tensor(unit, name, symbolic, sizes, dtypes, device));
  int64_t span = 0;
  for (int d = 0; d < t.rank; ++d) {
    const int64_t stride = t.strides[d];
    int64_t term = 0;
    if (stride == std::numeric_limits<int64_t>::min() ||
        __builtin_mul_overflow(t.sizes[d] - 1, stride < 0 ? -stride : stride, &term) ||
        __builtin_add_overflow(span, term, &span)) {
      return Status::invalid_argument(std::string(name) +
                                      " addresses more memory than int64 can index (sizes " +
                                      t.shape_string() + " times its strides overflow)");
    }
  }
  int64_t bytes = 0;
  if (__builtin_add_overflow(span, 1, &bytes) ||
      __builtin_mul_overflow(bytes, static_cast<int64_t>(dtype_size(t.dtype)), &bytes)) {
    return Status::invalid_argument(std::string(name) +
                                    " addresses more memory than int64 can index (sizes " +
                                    t.shape_string() + " times its strides overflow)");
  }
  return Status::ok_status();
}

Status check_sparse_tensor(const TensorView& t, const char* name, const BlockSparseIndex& index,
                           int64_t z, std::initializer_list<DType> dtypes, Device device) {
  if (z < 0) {
    // A layout without blocks has empty sparse tensors, which may have a null pointer.
    if (t.data == nullptr && index.nnz > 0) {
      return Status::invalid_argument(std::string(name) + " is required but is a null pointer");
    }
    if (t.rank != 4) {
      return Status::invalid_argument(std::string(name) +
                                      " must have rank 4 [Z, nnz, b, b] (a sparse tensor); got "
                                      "rank " +
                                      str(t.rank));
    }
    z = t.sizes[0];
    if (z < 1) {
      return Status::invalid_argument(std::string(name) + " has Z = " + str(z) +
                                      " in [Z, nnz, b, b]; Z must be >= 1");
    }
  }
  return check_tensor(t, name, "[Z, nnz, b, b] (a sparse tensor)",
                      {z, index.nnz, index.block, index.block}, dtypes, device);
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.device != b.device || a.rank != b.rank) {
    return false;
  }
  for (int d = 0; d < a.rank; ++d) {
    if (a.sizes[d] != b.sizes[d] || a.strides[d] != b.strides[d]) return false;
  }
  return true;
}

Status check_matmul(const BlockSparseMatMulParams& p, MatMulShape* shape) {
  MatMulShape s;
  SCIATTN_BS_RETURN_IF_ERROR(check_matmul_operands(p, "c", &s));
  SCIATTN_BS_RETURN_IF_ERROR(check_num_threads(p.num_threads));
  SCIATTN_BS_RETURN_IF_ERROR(check_outputs({{&p.c, "c"}}, {{&p.a, "a"}, {&p.b, "b"}, {&p.c, "c"}}));
  *shape = s;
  return Status::ok_status();
}

Status check_matmul_backward(const BlockSparseMatMulBackwardParams& p, MatMulShape* shape) {
  BlockSparseMatMulParams f;
  f.index = p.index;
  f.mode = p.mode;
  f.trans_a = p.trans_a;
  f.trans_b = p.trans_b;
  f.a = p.a;
  f.b = p.b;
  f.c = p.dc;
  MatMulShape s;
  SCIATTN_BS_RETURN_IF_ERROR(check_matmul_operands(f, "dc", &s));
  SCIATTN_BS_RETURN_IF_ERROR(check_num_threads(p.num_threads));
  if (!p.da.present() && !p.db.present()) {
    return Status::invalid_argument(
        "da and db are both absent (null data pointers); pass at least one of them");
  }
  // A gradient has its operand's shape and dtype; a sparse gradient has the sparse layout's
  // stride rule (unit last stride), a dense one any strides.
  auto check_grad = [&](const TensorView& g, const char* gname, const TensorView& x, bool sparse,
                        const char* symbolic) {
    if (!g.present()) return Status::ok_status();
    if (sparse) return check_sparse_tensor(g, gname, *p.index, s.batch, {x.dtype}, x.device);
    const std::vector<int64_t> sizes(x.sizes, x.sizes + x.rank);
    return check_tensor_any_strides(g, gname, symbolic, sizes, {x.dtype}, x.device);
  };
  SCIATTN_BS_RETURN_IF_ERROR(
      check_grad(p.da, "da", p.a, p.mode == BlockSparseMatMulMode::kDsd, "(the shape of a)"));
  SCIATTN_BS_RETURN_IF_ERROR(
      check_grad(p.db, "db", p.b, p.mode == BlockSparseMatMulMode::kDds, "(the shape of b)"));
  SCIATTN_BS_RETURN_IF_ERROR(
      check_outputs({{&p.da, "da"}, {&p.db, "db"}},
                    {{&p.a, "a"}, {&p.b, "b"}, {&p.dc, "dc"}, {&p.da, "da"}, {&p.db, "db"}}));
  *shape = s;
  return Status::ok_status();
}

Status check_softmax(const BlockSparseSoftmaxParams& p, int64_t* batch) {
  SCIATTN_BS_RETURN_IF_ERROR(check_index(p.index));
  const BlockSparseIndex& ix = *p.index;
  SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.x, "x", ix, -1, kFloatTypes, p.x.device));
  const int64_t z = p.x.sizes[0];
  const Device dev = p.x.device;
  SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.y, "y", ix, z, {p.x.dtype}, dev));
  SCIATTN_BS_RETURN_IF_ERROR(check_scale(p.scale, "scale"));
  const int64_t rows = ix.num_row_blocks * ix.block, cols = ix.num_col_blocks * ix.block;
  if (p.rpe.present()) {
    SCIATTN_BS_RETURN_IF_ERROR(check_tensor_any_strides(p.rpe, "rpe", "[Z, H, R*b, C*b]",
                                                        {z, ix.num_heads, rows, cols},
                                                        {p.x.dtype, DType::kF32}, dev));
  }
  if (p.key_padding_mask.present()) {
    SCIATTN_BS_RETURN_IF_ERROR(
        check_tensor_any_strides(p.key_padding_mask, "key_padding_mask", "[Z, C*b]", {z, cols},
                                 {p.x.dtype, DType::kF32, DType::kBool}, dev));
  }
  if (p.attn_mask.present()) {
    SCIATTN_BS_RETURN_IF_ERROR(
        check_tensor_any_strides(p.attn_mask, "attn_mask", "[R*b, C*b]", {rows, cols},
                                 {p.x.dtype, DType::kF32, DType::kBool}, dev));
  }
  SCIATTN_BS_RETURN_IF_ERROR(check_mask_mode(p.key_padding_mask_mode, "key_padding_mask_mode"));
  SCIATTN_BS_RETURN_IF_ERROR(check_mask_mode(p.attn_mask_mode, "attn_mask_mode"));
  SCIATTN_BS_RETURN_IF_ERROR(check_num_threads(p.num_threads));
  // In place (y is x) is DeepSpeed's call; any other y must not touch the inputs.
  const bool in_place = same_view(p.x, p.y);
  std::vector<Named> all = {{&p.y, "y"},
                            {&p.rpe, "rpe"},
                            {&p.key_padding_mask, "key_padding_mask"},
                            {&p.attn_mask, "attn_mask"}};
  if (!in_place) all.push_back({&p.x, "x"});
  SCIATTN_BS_RETURN_IF_ERROR(check_outputs({{&p.y, "y"}}, all));
  *batch = z;
  return Status::ok_status();
}

Status check_softmax_backward(const BlockSparseSoftmaxBackwardParams& p, int64_t* batch) {
  SCIATTN_BS_RETURN_IF_ERROR(check_index(p.index));
  const BlockSparseIndex& ix = *p.index;
  SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.y, "y", ix, -1, kFloatTypes, p.y.device));
  const int64_t z = p.y.sizes[0];
  SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.dy, "dy", ix, z, {p.y.dtype}, p.y.device));
  SCIATTN_BS_RETURN_IF_ERROR(check_sparse_tensor(p.dx, "dx", ix, z, {p.y.dtype}, p.y.device));
  SCIATTN_BS_RETURN_IF_ERROR(check_scale(p.scale, "scale"));
  SCIATTN_BS_RETURN_IF_ERROR(check_num_threads(p.num_threads));
  // dx may be dy itself (DeepSpeed writes the gradient into dy's buffer).
  std::vector<Named> all = {{&p.dx, "dx"}, {&p.y, "y"}};
  if (!same_view(p.dx, p.dy)) all.push_back({&p.dy, "dy"});
  SCIATTN_BS_RETURN_IF_ERROR(check_outputs({{&p.dx, "dx"}}, all));
  *batch = z;
  return Status::ok_status();
}

float attention_scale(const SparseAttentionOptions& options, int64_t dim) {
  return options.scale.has_value() ? *options.scale
                                   : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
}

Status check_attention_forward(const SparseAttentionForwardParams& p, AttentionShape* shape) {
  AttentionShape s;
  SCIATTN_BS_RETURN_IF_ERROR(check_attention_inputs(
      p.index, p.q, p.k, p.v, p.rpe, p.key_padding_mask, p.attn_mask, p.options, &s));
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv(p.out, "out", s, {p.q.dtype}, p.q.device));
  if (p.lse.present()) {
    SCIATTN_BS_RETURN_IF_ERROR(check_tensor(p.lse, "lse", "[B, H, L]", {s.batch, s.heads, s.len},
                                            {DType::kF32}, p.q.device));
  }
  SCIATTN_BS_RETURN_IF_ERROR(
      check_outputs({{&p.out, "out"}, {&p.lse, "lse"}}, {{&p.q, "q"},
                                                         {&p.k, "k"},
                                                         {&p.v, "v"},
                                                         {&p.rpe, "rpe"},
                                                         {&p.key_padding_mask, "key_padding_mask"},
                                                         {&p.attn_mask, "attn_mask"},
                                                         {&p.out, "out"},
                                                         {&p.lse, "lse"}}));
  *shape = s;
  return Status::ok_status();
}

Status check_attention_backward(const SparseAttentionBackwardParams& p, AttentionShape* shape) {
  AttentionShape s;
  SCIATTN_BS_RETURN_IF_ERROR(check_attention_inputs(
      p.index, p.q, p.k, p.v, p.rpe, p.key_padding_mask, p.attn_mask, p.options, &s));
  const Device dev = p.q.device;
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv_input(p.out, "out", s, {p.q.dtype}, dev));
  SCIATTN_BS_RETURN_IF_ERROR(
      check_tensor(p.lse, "lse", "[B, H, L]", {s.batch, s.heads, s.len}, {DType::kF32}, dev));
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv_input(p.dout, "dout", s, {p.q.dtype}, dev));
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv(p.dq, "dq", s, {p.q.dtype}, dev));
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv(p.dk, "dk", s, {p.q.dtype}, dev));
  SCIATTN_BS_RETURN_IF_ERROR(check_qkv(p.dv, "dv", s, {p.q.dtype}, dev));
  SCIATTN_BS_RETURN_IF_ERROR(check_outputs({{&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}},
                                           {{&p.q, "q"},
                                            {&p.k, "k"},
                                            {&p.v, "v"},
                                            {&p.rpe, "rpe"},
                                            {&p.key_padding_mask, "key_padding_mask"},
                                            {&p.attn_mask, "attn_mask"},
                                            {&p.out, "out"},
                                            {&p.lse, "lse"},
                                            {&p.dout, "dout"},
                                            {&p.dq, "dq"},
                                            {&p.dk, "dk"},
                                            {&p.dv, "dv"}}));
  *shape = s;
  return Status::ok_status();
}

namespace {

// src and dst of a padding helper: present, one rank, `dim` a valid dimension, one dtype.
Status check_pad_pair(const TensorView& src, int dim, const TensorView& dst) {
  if (src.data == nullptr) return Status::invalid_argument("src is required but is a null pointer");
  if (dst.data == nullptr) return Status::invalid_argument("dst is required but is a null pointer");
  if (src.rank < 1 || src.rank > TensorView::kMaxRank) {
    return Status::invalid_argument("src must have rank 1 to " + str(TensorView::kMaxRank) +
                                    "; got rank " + str(src.rank));
  }
  if (dst.rank != src.rank) {
    return Status::invalid_argument("dst must have src's rank " + str(src.rank) + "; got rank " +
                                    str(dst.rank));
  }
  if (dim < 0 || dim >= src.rank) {
    return Status::invalid_argument("dim must be a dimension of src, 0 to " + str(src.rank - 1) +
                                    "; got " + std::to_string(dim));
  }
  for (int d = 0; d < src.rank; ++d) {
    if (src.sizes[d] < 1) {
      return Status::invalid_argument("src has shape " + src.shape_string() +
                                      "; every size must be >= 1");
    }
  }
  if (src.device != Device::kCpu || dst.device != Device::kCpu) {
    return Status::not_supported(
        "the padding helpers run on the host; src and dst must be CPU tensors");
  }
  std::vector<int64_t> sizes(src.sizes, src.sizes + src.rank);
  SCIATTN_BS_RETURN_IF_ERROR(check_tensor_any_strides(
      src, "src", "(any shape)", sizes, {DType::kF32, DType::kF16, DType::kBF16, DType::kBool},
      Device::kCpu));
  return Status::ok_status();
}

Status check_pad_dst(const TensorView& src, int dim, int64_t dst_len, const TensorView& dst,
                     const char* rule) {
  std::vector<int64_t> sizes(src.sizes, src.sizes + src.rank);
  sizes[static_cast<size_t>(dim)] = dst_len;
  const std::string symbolic = std::string("(src's shape with ") + rule + ")";
  SCIATTN_BS_RETURN_IF_ERROR(
      check_tensor_any_strides(dst, "dst", symbolic.c_str(), sizes, {src.dtype}, Device::kCpu));
  return check_outputs({{&dst, "dst"}}, {{&src, "src"}, {&dst, "dst"}});
}

}  // namespace

Status check_pad(const TensorView& src, int dim, int64_t block, const TensorView& dst) {
  if (block < 1) {
    return Status::invalid_argument("block must be >= 1 (16, 32, 64 or 128 for the ops); got " +
                                    str(block));
  }
  SCIATTN_BS_RETURN_IF_ERROR(check_pad_pair(src, dim, dst));
  const int64_t len = src.sizes[dim];
  int64_t padded = 0;
  if (__builtin_add_overflow(len, block_pad_length(len, block), &padded)) {
    return Status::invalid_argument("src's size along dim overflows when padded");
  }
  return check_pad_dst(src, dim, padded, dst, "dim rounded up to a multiple of block");
}

Status check_unpad(const TensorView& src, int dim, const TensorView& dst) {
  SCIATTN_BS_RETURN_IF_ERROR(check_pad_pair(src, dim, dst));
  if (dst.rank == src.rank && (dst.sizes[dim] < 1 || dst.sizes[dim] > src.sizes[dim])) {
    return Status::invalid_argument("dst's size along dim must be 1 to src's " +
                                    str(src.sizes[dim]) + "; got " + str(dst.sizes[dim]));
  }
  return check_pad_dst(src, dim, dst.sizes[dim], dst, "dim cropped");
}

Status check_padding_key_mask(int64_t valid_len, MaskMode mode, const TensorView& dst) {
  SCIATTN_BS_RETURN_IF_ERROR(check_mask_mode(mode, "mode"));
  SCIATTN_BS_RETURN_IF_ERROR(check_present_rank(dst, "dst", 2, "[B, Lp]"));
  if (dst.device != Device::kCpu) {
    return Status::not_supported("padding_key_mask runs on the host; dst must be a CPU tensor");
  }
  SCIATTN_BS_RETURN_IF_ERROR(check_tensor_any_strides(
      dst, "dst", "[B, Lp]", {dst.sizes[0], dst.sizes[1]},
      {DType::kF32, DType::kF16, DType::kBF16, DType::kBool}, Device::kCpu));
  SCIATTN_BS_RETURN_IF_ERROR(check_outputs({{&dst, "dst"}}, {{&dst, "dst"}}));
  if (valid_len < 0 || valid_len > dst.sizes[1]) {
    return Status::invalid_argument("valid_len must be 0 to dst's Lp = " + str(dst.sizes[1]) +
                                    "; got " + str(valid_len));
  }
  return Status::ok_status();
}

}  // namespace sciattn::detail
