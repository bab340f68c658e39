// The GPU block-sparse MatMul and Softmax as the ops' dispatch point sees them (declared in
// cuda/block_sparse/block_sparse_ops_cuda.h): what the kernels accept, their workspace (the
// MatMul's partial sums of split lines; none for the Softmax), and the public forward and backward
// expressed through the sdd / dsd / dds and Softmax launchers, following the CPU path
// (cpu/block_sparse_matmul.cpp) operand for operand. CUDA layer (host code).
#include <algorithm>
#include <limits>
#include <string>

#include <cuda_runtime_api.h>

#include "common/workspace_layout.h"
#include "cuda/block_sparse/block_sparse_launch.h"
#include "cuda/block_sparse/block_sparse_ops_cuda.h"

namespace sciattn::cuda {
namespace {

using bs::transposed;

TensorView op(const TensorView& t, bool trans) {
  return trans ? transposed(t) : t;
}

cudaStream_t stream_of(Stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

#define SCIATTN_BS_TRY(expr)           \
  do {                                 \
    Status status_ = (expr);           \
    if (!status_.ok()) return status_; \
  } while (0)

// The workspace of a MatMul call: one fp32 region for the partial sums of split lines, as large
// as the largest dsd / dds of the call needs (the products of a backward run one after another
// on the stream and reuse it).
struct PartialPlan {
  detail::WorkspaceLayout layout;
  size_t offset = 0;
  float* at(void* workspace) const {
    return layout.used_bytes() == 0 ? nullptr : layout.at<float>(workspace, offset);
  }
};
PartialPlan partial_plan(int64_t elems) {
  PartialPlan r;
  if (elems > 0) r.offset = r.layout.add<float>(elems);
  return r;
}

PartialPlan plan_of(const BlockSparseMatMulParams& p) {
  const BlockSparseIndex& ix = *p.index;
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      return partial_plan(0);
    case BlockSparseMatMulMode::kDsd:
      return partial_plan(bs::dsd_partial_elems(ix, p.trans_a, p.a.sizes[0], p.c.sizes[3]));
    case BlockSparseMatMulMode::kDds:
      return partial_plan(bs::dds_partial_elems(ix, p.trans_b, p.a.sizes[0], p.c.sizes[2]));
  }
  return partial_plan(0);
}

// The dsd / dds products of matmul_backward_here, in its order.
PartialPlan plan_of(const BlockSparseMatMulBackwardParams& p) {
  const BlockSparseIndex& ix = *p.index;
  const int64_t batch = p.dc.sizes[0];
  int64_t elems = 0;
  auto need = [&](int64_t e) { elems = std::max(elems, e); };
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      if (p.da.present())
        need(bs::dsd_partial_elems(ix, false, batch, op(p.da, p.trans_a).sizes[3]));
      if (p.db.present())
        need(bs::dds_partial_elems(ix, false, batch, op(p.db, p.trans_b).sizes[2]));
      break;
    case BlockSparseMatMulMode::kDsd:
      if (p.db.present())
        need(bs::dsd_partial_elems(ix, !p.trans_a, batch, op(p.db, p.trans_b).sizes[3]));
      break;
    case BlockSparseMatMulMode::kDds:
      if (p.da.present())
        need(bs::dds_partial_elems(ix, !p.trans_b, batch, op(p.da, p.trans_a).sizes[2]));
      break;
  }
  return partial_plan(elems);
}

Status matmul_here(const BlockSparseMatMulParams& p, void* workspace, cudaStream_t stream) {
  const BlockSparseDeviceIndex& ix = *p.index->device;
  float* partial = plan_of(p).at(workspace);
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      return bs::launch_sdd(ix, op(p.a, p.trans_a), op(p.b, p.trans_b), p.c, stream);
    case BlockSparseMatMulMode::kDsd:
      return bs::launch_dsd(ix, p.a, p.trans_a, op(p.b, p.trans_b), p.c, partial, stream);
    case BlockSparseMatMulMode::kDds:
      return bs::launch_dds(ix, op(p.a, p.trans_a), p.b, p.trans_b, p.c, partial, stream);
  }
  return Status::invalid_argument("mode must be BlockSparseMatMulMode::kSdd, kDsd or kDds");
}

// The backward of C = op(A) op(B) (spec 2.2), as on the CPU: a dense gradient is written through
// the view of its operand's op() (transposed back for free); a sparse gradient is the gradient of
// the sparse operand's logical matrix restricted to the layout.
//   sdd: d op(A) = dC op(B)^T (dsd), d op(B) = op(A)^T dC (dds);
//   dsd: dS = dC op(B)^T, or op(B) dC^T when A is transposed (sdd); d op(B) = op(S)^T dC (dsd);
//   dds: d op(A) = dC op(S)^T (dds); dS = op(A)^T dC, or dC^T op(A) when B is transposed (sdd).
Status matmul_backward_here(const BlockSparseMatMulBackwardParams& p, void* workspace,
                            cudaStream_t stream) {
  const BlockSparseDeviceIndex& ix = *p.index->device;
  const TensorView op_a = op(p.a, p.trans_a), op_b = op(p.b, p.trans_b);
  float* partial = plan_of(p).at(workspace);
  switch (p.mode) {
    case BlockSparseMatMulMode::kSdd:
      if (p.da.present()) {
        SCIATTN_BS_TRY(bs::launch_dsd(ix, p.dc, false, transposed(op_b), op(p.da, p.trans_a),
                                      partial, stream));
      }
      if (p.db.present()) {
        SCIATTN_BS_TRY(bs::launch_dds(ix, transposed(op_a), p.dc, false, op(p.db, p.trans_b),
                                      partial, stream));
      }
      return Status::ok_status();
    case BlockSparseMatMulMode::kDsd:
      if (p.da.present()) {
        SCIATTN_BS_TRY(!p.trans_a ? bs::launch_sdd(ix, p.dc, transposed(op_b), p.da, stream)
                                  : bs::launch_sdd(ix, op_b, transposed(p.dc), p.da, stream));
      }
      if (p.db.present()) {
        SCIATTN_BS_TRY(
            bs::launch_dsd(ix, p.a, !p.trans_a, p.dc, op(p.db, p.trans_b), partial, stream));
      }
      return Status::ok_status();
    case BlockSparseMatMulMode::kDds:
      if (p.da.present()) {
        SCIATTN_BS_TRY(
            bs::launch_dds(ix, p.dc, p.b, !p.trans_b, op(p.da, p.trans_a), partial, stream));
      }
      if (p.db.present()) {
        SCIATTN_BS_TRY(!p.trans_b ? bs::launch_sdd(ix, transposed(op_a), p.dc, p.db, stream)
                                  : bs::launch_sdd(ix, transposed(p.dc), op_a, p.db, stream));
      }
      return Status::ok_status();
  }
  return Status::invalid_argument("mode must be BlockSparseMatMulMode::kSdd, kDsd or kDds");
}

#undef SCIATTN_BS_TRY

bs::SoftmaxTerms terms_of(const BlockSparseSoftmaxParams& p) {
  bs::SoftmaxTerms t;
  t.scale = p.scale;
  t.rpe = p.rpe;
  t.key_padding_mask = p.key_padding_mask;
  t.attn_mask = p.attn_mask;
  t.key_padding_mask_mode = p.key_padding_mask_mode;
  t.attn_mask_mode = p.attn_mask_mode;
  t.causal = p.causal;
  return t;
}

}  // namespace

// The kernels take everything the common checks accept: f32 / f16 / bf16, blocks 16 to 128, any
// strides on dense operands, rpe and masks in every accepted dtype with any strides, and any
// number of batches and rows (grid-stride loops over int64 tile and row counts, int64 element
// offsets), up to 2^31 - 1 elements of a sparse tensor per batch: the kernels number a batch's
// sparse elements (nnz * block^2) in 32 bits. The fused attention never forms the sparse tensor and
// has no such limit (a 25%-dense Fixed layout at 65,536 tokens has 17 G elements).
Status check_sparse_tensor_elements(const BlockSparseIndex* index) {
  const BlockSparseIndex& ix = *index;
  if (ix.nnz > std::numeric_limits<int32_t>::max() / (int64_t{ix.block} * ix.block)) {
    return Status::invalid_argument(
        "index has " + std::to_string(ix.nnz) + " nonzero blocks of " + std::to_string(ix.block) +
        " x " + std::to_string(ix.block) +
        "; the GPU MatMul and Softmax accept at most 2^31 - 1 elements of a sparse tensor per "
        "batch (the fused attention, SparseSelfAttention's default, has no such limit)");
  }
  return Status::ok_status();
}
Status check_block_sparse_matmul_cuda(const BlockSparseMatMulParams& p) {
  return check_sparse_tensor_elements(p.index);
}
Status check_block_sparse_matmul_cuda(const BlockSparseMatMulBackwardParams& p) {
  return check_sparse_tensor_elements(p.index);
}
Status check_block_sparse_softmax_cuda(const BlockSparseSoftmaxParams& p) {
  return check_sparse_tensor_elements(p.index);
}
Status check_block_sparse_softmax_cuda(const BlockSparseSoftmaxBackwardParams& p) {
  return check_sparse_tensor_elements(p.index);
}

// The MatMul's partial sums of split lines (0 when no line it walks is split); the Softmax needs
// no scratch (it re-reads its row).
size_t block_sparse_matmul_workspace_size_cuda(const BlockSparseMatMulParams& p) {
  return plan_of(p).layout.total_bytes();
}
size_t block_sparse_matmul_workspace_size_cuda(const BlockSparseMatMulBackwardParams& p) {
  return plan_of(p).layout.total_bytes();
}
size_t block_sparse_softmax_workspace_size_cuda(const BlockSparseSoftmaxParams&) {
  return 0;
}
size_t block_sparse_softmax_workspace_size_cuda(const BlockSparseSoftmaxBackwardParams&) {
  return 0;
}

Status run_block_sparse_matmul_cuda(const BlockSparseMatMulParams& p, void* workspace,
                                    Stream stream) {
  return on_device_of(p.a.data, [&] { return matmul_here(p, workspace, stream_of(stream)); });
}
Status run_block_sparse_matmul_cuda(const BlockSparseMatMulBackwardParams& p, void* workspace,
                                    Stream stream) {
  return on_device_of(p.a.data,
                      [&] { return matmul_backward_here(p, workspace, stream_of(stream)); });
}

Status run_block_sparse_softmax_cuda(const BlockSparseSoftmaxParams& p, void*, Stream stream) {
  return on_device_of(p.x.data, [&] {
    return bs::launch_softmax_forward(*p.index->device, p.x.sizes[0], p.x, p.y, terms_of(p),
                                      TensorView{}, stream_of(stream));
  });
}
Status run_block_sparse_softmax_cuda(const BlockSparseSoftmaxBackwardParams& p, void*,
                                     Stream stream) {
  return on_device_of(p.y.data, [&] {
    return bs::launch_softmax_backward(*p.index->device, p.y.sizes[0], p.y, p.dy, p.dx, p.scale,
                                       stream_of(stream));
  });
}

}  // namespace sciattn::cuda
