// The sciattn torch ops: schemas (TORCH_LIBRARY), CPU and CUDA kernels that turn tensors into
// the public Params, allocate outputs and the workspace as tensors, and turn a Status into a
// Python exception. Binding layer: uses the public API only (include/sciattn).
//
// float64 tensors do not reach the library (it stores f32, f16 and bf16): they go to the ATen
// implementation in fp64.cpp, which exists for torch.autograd.gradcheck (docs/python.md).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp64.h"
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/device.h"
#include "sciattn/evoformer.h"

#ifdef SCIATTN_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace sciattn::torch_ext {
namespace {

using OptTensor = std::optional<at::Tensor>;

// ---- Tensors -> TensorViews, Status -> exceptions -------------------------------------------

// TORCH_CHECK_VALUE raises ValueError, TORCH_CHECK_TYPE TypeError, TORCH_CHECK_NOT_IMPLEMENTED
// NotImplementedError (a RuntimeError) in Python. The library's messages already name the
// argument (its Params field names are the Python argument names) and say what is accepted.
void check_status(const Status& s, const char* op) {
  if (s.ok()) return;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, "sciattn.", op, ": ", s.message());
    case StatusCode::kNotSupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "sciattn.", op, ": ", s.message());
    default:
      TORCH_CHECK(false, "sciattn.", op, ": ", s.to_string());
  }
}

DType to_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kBool:
      return DType::kBool;
    default:
      TORCH_CHECK_TYPE(false, name, " has dtype ", t.scalar_type(),
                       "; sciattn accepts float32, float16, bfloat16 or float64 (masks also bool)");
  }
}

// A view of t. Tensors whose last dimension is not unit-stride are copied first: autograd hands
// out expanded (stride 0) gradients, and the library wants stride 1 on the innermost dimension.
TensorView view_of(at::Tensor& t, const char* name, bool any_strides = false) {
  TensorView v;
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.dim() <= TensorView::kMaxRank, name, " must have 1 to ",
                    TensorView::kMaxRank, " dimensions; got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.numel() > 0, name, " must not be empty; got shape ", t.sizes());
  if (!any_strides && t.stride(-1) != 1) t = t.contiguous();
  v.dtype = to_dtype(t, name);
  if (t.is_cuda()) {
    v.device = Device::kCuda;
  } else {
    TORCH_CHECK_VALUE(t.is_cpu(), name, " is on device ", t.device(),
                      "; sciattn runs on cpu and cuda tensors");
    v.device = Device::kCpu;
  }
  v.data = t.data_ptr();
  v.rank = static_cast<int>(t.dim());
  for (int d = 0; d < v.rank; ++d) {
    v.sizes[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

TensorView optional_view(OptTensor& t, const char* name, bool any_strides = false) {
  if (!t.has_value() || !t->defined()) return {};
  return view_of(*t, name, any_strides);
}

// Every tensor argument on q's device (index included): the library only knows cpu vs cuda.
void check_same_device(const at::Tensor& q, const char* q_name,
                       std::initializer_list<std::pair<const at::Tensor*, const char*>> others) {
  for (const auto& [t, name] : others) {
    if (t == nullptr || !t->defined()) continue;
    TORCH_CHECK_VALUE(t->device() == q.device(), name, " is on ", t->device(), " but ", q_name,
                      " is on ", q.device(), "; every tensor must be on the same device");
  }
}
const at::Tensor* opt_ptr(const OptTensor& t) {
  return t.has_value() ? &*t : nullptr;
}

void check_dim(const at::Tensor& t, int64_t dim, const char* name, const char* shape) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must have shape ", shape, " (", dim,
                    " dimensions); got shape ", t.sizes());
}

int num_threads() {
  return at::get_num_threads();
}

// Runs one op: workspace as a byte tensor on the op's device, the current stream on CUDA.
template <typename Params>
void run_op(const Params& p, const at::Tensor& like, const char* op) {
  std::string why;
  check_status(can_implement(p, &why), op);
  const size_t bytes = workspace_size(p);
  at::Tensor ws;  // none when the call needs none (the CUDA forward): an allocation less
  if (bytes > 0) ws = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
  Stream stream;
#ifdef SCIATTN_TORCH_CUDA
  std::optional<c10::cuda::CUDAGuard> guard;
  if (like.is_cuda()) {
    guard.emplace(like.device());
    stream.handle = c10::cuda::getCurrentCUDAStream(like.device().index()).stream();
  }
#endif
  check_status(run(p, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream), op);
}

std::optional<float> scale_of(std::optional<double> scale, const char* name = "scale") {
  if (!scale.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE(std::isfinite(*scale), name, " must be a finite number; got ", *scale);
  return static_cast<float>(*scale);
}

// ---- Evoformer ------------------------------------------------------------------------------

EvoformerCpuAlgorithm evoformer_algorithm(int64_t a) {
  TORCH_CHECK_VALUE(a == 0 || a == 1, "algorithm must be 0 (tiled) or 1 (reference); got ", a);
  return a == 0 ? EvoformerCpuAlgorithm::kTiled : EvoformerCpuAlgorithm::kReference;
}

std::tuple<at::Tensor, at::Tensor> evoformer_fwd(at::Tensor q, at::Tensor k, at::Tensor v,
                                                 OptTensor bias1, OptTensor bias2,
                                                 std::optional<double> scale, int64_t algorithm) {
  check_dim(q, 5, "q", "[B, N, L, H, D]");
  check_same_device(q, "q",
                    {{&k, "k"}, {&v, "v"}, {opt_ptr(bias1), "bias1"}, {opt_ptr(bias2), "bias2"}});
  if (q.scalar_type() == at::kDouble) {
    return fp64::evoformer_fwd(q, k, v, bias1, bias2, scale);
  }
  const int64_t B = q.size(0), N = q.size(1), L = q.size(2), H = q.size(3);
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({B * N, H, L}, q.options().dtype(at::kFloat));
  EvoformerForwardParams p;
  p.q = view_of(q, "q");
  p.k = view_of(k, "k");
  p.v = view_of(v, "v");
  p.bias1 = optional_view(bias1, "bias1");
  p.bias2 = optional_view(bias2, "bias2");
  p.out = view_of(out, "out");
  p.lse = view_of(lse, "lse");
  p.options.scale = scale_of(scale);
  p.options.num_threads = num_threads();
  p.options.cpu_algorithm = evoformer_algorithm(algorithm);
  run_op(p, q, "evoformer_attention");
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> evoformer_bwd(
    at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, OptTensor bias1, OptTensor bias2,
    at::Tensor out, at::Tensor lse, std::optional<double> scale, bool need_dbias1, bool need_dbias2,
    int64_t algorithm) {
  check_dim(q, 5, "q", "[B, N, L, H, D]");
  check_same_device(q, "q",
                    {{&dout, "dout"},
                     {&k, "k"},
                     {&v, "v"},
                     {opt_ptr(bias1), "bias1"},
                     {opt_ptr(bias2), "bias2"},
                     {&out, "out"},
                     {&lse, "lse"}});
  TORCH_CHECK_VALUE(!need_dbias1 || (bias1.has_value() && bias1->is_floating_point()),
                    "need_dbias1 needs a floating-point bias1");
  TORCH_CHECK_VALUE(!need_dbias2 || bias2.has_value(), "need_dbias2 needs bias2");
  if (q.scalar_type() == at::kDouble) {
    return fp64::evoformer_bwd(dout, q, k, v, bias1, bias2, out, lse, scale, need_dbias1,
                               need_dbias2);
  }
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(q.sizes(), q.options());
  at::Tensor dv = at::empty(q.sizes(), q.options());
  at::Tensor dbias1 =
      need_dbias1 ? at::empty(bias1->sizes(), bias1->options()) : at::empty({0}, q.options());
  at::Tensor dbias2 =
      need_dbias2 ? at::empty(bias2->sizes(), bias2->options()) : at::empty({0}, q.options());
  EvoformerBackwardParams p;
  p.q = view_of(q, "q");
  p.k = view_of(k, "k");
  p.v = view_of(v, "v");
  p.bias1 = optional_view(bias1, "bias1");
  p.bias2 = optional_view(bias2, "bias2");
  p.out = view_of(out, "out");
  p.lse = view_of(lse, "lse");
  p.dout = view_of(dout, "dout");
  p.dq = view_of(dq, "dq");
  p.dk = view_of(dk, "dk");
  p.dv = view_of(dv, "dv");
  if (need_dbias1) p.dbias1 = view_of(dbias1, "dbias1");
  if (need_dbias2) p.dbias2 = view_of(dbias2, "dbias2");
  p.options.scale = scale_of(scale);
  p.options.num_threads = num_threads();
  p.options.cpu_algorithm = evoformer_algorithm(algorithm);
  run_op(p, q, "evoformer_attention (backward)");
  return {dq, dk, dv, dbias1, dbias2};
}

// ---- Block-sparse: layouts and the index ----------------------------------------------------

// The index of a [H, R, C] 0/1 layout tensor (any integer or bool dtype, any device: it is read
// on the host). nnz is what the caller (and the fake kernels) sized the sparse tensors with.
BlockSparseIndex index_of(const at::Tensor& layout_in, int64_t block, int64_t nnz) {
  TORCH_CHECK_VALUE(layout_in.dim() == 3, "layout must have shape [H, R, C] (3 dimensions); got ",
                    layout_in.sizes());
  TORCH_CHECK_TYPE(!layout_in.is_floating_point() && !layout_in.is_complex(),
                   "layout must be an integer or bool tensor of 0s and 1s; got dtype ",
                   layout_in.scalar_type());
  // Read in its own dtype, checked and converted in one pass: the torch expression
  // (layout == 0 | layout == 1).all() on an int64 copy made three passes and three temporaries
  // over 16.8 M entries at 65,536 tokens and block 64, 0.1-0.3 s against a few-ms GPU call.
  const at::Tensor layout = layout_in.to(at::kCPU).contiguous();
  Layout l = Layout::zeros(layout.size(0), layout.size(1), layout.size(2));
  bool binary = true;
  AT_DISPATCH_INTEGRAL_TYPES_AND(at::kBool, layout.scalar_type(), "layout", [&] {
    const scalar_t* src = layout.data_ptr<scalar_t>();
    uint8_t* dst = l.blocks.data();
    const int64_t count = layout.numel();
    uint8_t all_binary = 1;
    for (int64_t i = 0; i < count; ++i) {
      const auto x = src[i];
      all_binary &= static_cast<uint8_t>(x == 0 || x == 1);
      dst[i] = static_cast<uint8_t>(x != 0);
    }
    binary = all_binary != 0;
  });
  TORCH_CHECK_VALUE(binary, "layout must hold only 0s and 1s");
  BlockSparseIndex index;
  check_status(build_block_sparse_index(l, block, &index), "block-sparse layout");
  TORCH_CHECK_VALUE(index.nnz == nnz, "nnz is ", nnz, " but the layout has ", index.nnz,
                    " nonzero blocks");
  return index;
}

// The indexes of the most recently used layout tensors. A model calls the block-sparse ops with
// one layout in every layer, forward and backward, and building an index reads the whole dense
// layout (16.8 M entries at 65,536 tokens with block 64), so each is built once and kept. An
// entry holds a reference to its layout tensor, so that tensor object (the key) stays alive and
// cannot be confused with a later one, and the version of its data when the index was built:
// any in-place change of the layout (or of a view of it) bumps the version and misses. Inference
// tensors have no version counter and are never cached.
//
// The ops on CUDA tensors also need the index's device copy (upload_block_sparse_index), once per
// layout and CUDA device, like the index itself. An entry keeps one index per device it has been
// used on: the first upload goes into a copy of the host-only index, which then replaces it (the
// CPU ops read the host arrays of any copy), so that a layout used on one GPU is held once on the
// host. Indexes are handed out as shared_ptr<const>: one that is evicted (or replaced) while an
// op still runs with it stays alive until that op returns, and its device memory is released
// with cudaFree, which waits for the kernels already queued on the device, so an asynchronous
// kernel never reads freed memory. Building and uploading happen outside the lock (they take
// milliseconds at 65,536 tokens); two threads that miss together both build, and the first to
// finish is kept.
class IndexCache {
 public:
  // device: -1 for the CPU ops, else the CUDA device ordinal of the op's tensors.
  std::shared_ptr<const BlockSparseIndex> get(const at::Tensor& layout, int64_t block, int64_t nnz,
                                              int device) {
    if (layout.is_inference()) return build(nullptr, layout, block, nnz, device);
    const int64_t version = static_cast<int64_t>(layout._version());
    std::shared_ptr<const BlockSparseIndex> base;  // a host index of this layout, if cached
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = find(layout, version, block);
      if (it != entries_.end()) {
        TORCH_CHECK_VALUE(it->copies.front().index->nnz == nnz, "nnz is ", nnz,
                          " but the layout has ", it->copies.front().index->nnz, " nonzero blocks");
        entries_.splice(entries_.begin(), entries_, it);  // most recently used first
        const Entry& e = entries_.front();
        if (device < 0) return e.copies.front().index;  // the CPU ops read any copy
        for (const Copy& c : e.copies) {
          if (c.device == device) return c.index;
        }
        base = e.copies.front().index;
      }
    }
    std::shared_ptr<const BlockSparseIndex> index = build(base, layout, block, nnz, device);
    // What leaves the cache is destroyed after the lock is released (declared before it): freeing
    // an index's device memory waits for the device's queued kernels.
    std::list<Entry> evicted;
    Copy replaced;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = find(layout, version, block);
    if (it == entries_.end()) {
      entries_.push_front({layout, version, block, {{device, index}}});
      if (entries_.size() > kCapacity) evicted.splice(evicted.begin(), entries_, --entries_.end());
      return index;
    }
    for (Copy& c : it->copies) {
      if (c.device == device) return c.index;  // another thread was first
      if (c.device < 0 && device >= 0) {       // the device copy also serves the CPU ops
        replaced = std::exchange(c, Copy{device, index});
        return index;
      }
    }
    if (device >= 0) it->copies.push_back({device, index});
    return index;
  }

 private:
  static constexpr size_t kCapacity = 8;
  struct Copy {
    int device = -1;  // -1: host arrays only; else the CUDA device of index->device
    std::shared_ptr<const BlockSparseIndex> index;
  };
  struct Entry {
    at::Tensor layout;
    int64_t version;
    int64_t block;
    std::vector<Copy> copies;  // never empty; at most one per device
  };

  std::list<Entry>::iterator find(const at::Tensor& layout, int64_t version, int64_t block) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->layout.unsafeGetTensorImpl() == layout.unsafeGetTensorImpl() &&
          it->version == version && it->block == block) {
        return it;
      }
    }
    return entries_.end();
  }

  // A new index: a copy of base (without its device copy) or built from the layout, uploaded to
  // `device` when that is a CUDA device.
  static std::shared_ptr<const BlockSparseIndex> build(
      const std::shared_ptr<const BlockSparseIndex>& base, const at::Tensor& layout, int64_t block,
      int64_t nnz, int device) {
    BlockSparseIndex index;
    if (base != nullptr) {
      index = *base;
      index.device = nullptr;
    } else {
      index = index_of(layout, block, nnz);
    }
    if (device >= 0) upload(&index, device);
    return std::make_shared<const BlockSparseIndex>(std::move(index));
  }

  static void upload(BlockSparseIndex* index, int device) {
#ifdef SCIATTN_TORCH_CUDA
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
#endif
    check_status(upload_block_sparse_index(index, device), "block-sparse layout (device upload)");
  }

  std::mutex mutex_;
  std::list<Entry> entries_;
};

// The index of `layout` for an op on `like`'s device: host arrays for CPU tensors, plus the
// device copy on like's CUDA device for CUDA tensors.
std::shared_ptr<const BlockSparseIndex> cached_index_of(const at::Tensor& layout, int64_t block,
                                                        int64_t nnz, const at::Tensor& like) {
  static IndexCache cache;
  const int device = like.is_cuda() ? static_cast<int>(like.device().index()) : -1;
  return cache.get(layout, block, nnz, device);
}

MaskMode mask_mode(int64_t m, const char* name) {
  TORCH_CHECK_VALUE(m == 0 || m == 1, name, " must be 0 ('add') or 1 ('mul'); got ", m);
  return m == 0 ? MaskMode::kAdd : MaskMode::kMul;
}

BlockSparseMatMulMode matmul_mode(int64_t m) {
  TORCH_CHECK_VALUE(m >= 0 && m <= 2, "mode must be 0 (sdd), 1 (dsd) or 2 (dds); got ", m);
  return static_cast<BlockSparseMatMulMode>(m);
}

// The output shape of a MatMul (docs/block_sparse_ops.md); the Python fake kernel mirrors it.
std::vector<int64_t> matmul_out_shape(const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& layout, int64_t block, int64_t nnz,
                                      int64_t mode, bool trans_a, bool trans_b) {
  const int64_t H = layout.size(0), R = layout.size(1), C = layout.size(2);
  if (mode == 0) {
    check_dim(a, 4, "a", "[Z, H, M, K]");
    return {a.size(0), nnz, block, block};
  }
  if (mode == 1) {
    check_dim(b, 4, "b", "[Z, H, K, N]");
    return {b.size(0), H, (trans_a ? C : R) * block, trans_b ? b.size(2) : b.size(3)};
  }
  check_dim(a, 4, "a", "[Z, H, M, K]");
  return {a.size(0), H, trans_a ? a.size(3) : a.size(2), (trans_b ? R : C) * block};
}

at::Tensor bsmm(at::Tensor a, at::Tensor b, const at::Tensor& layout, int64_t block, int64_t nnz,
                int64_t mode, bool trans_a, bool trans_b) {
  check_same_device(a, "a", {{&b, "b"}});
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "b has dtype ", b.scalar_type(),
                   " but a has dtype ", a.scalar_type(), "; they must be equal");
  const auto shape = matmul_out_shape(a, b, layout, block, nnz, mode, trans_a, trans_b);
  if (a.scalar_type() == at::kDouble) {
    return fp64::bsmm(a, b, layout, block, mode, trans_a, trans_b);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, a);
  at::Tensor c = at::empty(shape, a.options());
  BlockSparseMatMulParams p;
  p.index = index.get();
  p.mode = matmul_mode(mode);
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  // Dense operands may have any strides (a transposed view needs no copy); sparse ones need
  // stride 1 on the last dimension.
  p.a = view_of(a, "a", /*any_strides=*/mode != 1);
  p.b = view_of(b, "b", /*any_strides=*/mode != 2);
  p.c = view_of(c, "c");
  p.num_threads = num_threads();
  run_op(p, a, "MatMul");
  return c;
}

std::tuple<at::Tensor, at::Tensor> bsmm_bwd(at::Tensor dc, at::Tensor a, at::Tensor b,
                                            const at::Tensor& layout, int64_t block, int64_t nnz,
                                            int64_t mode, bool trans_a, bool trans_b, bool need_da,
                                            bool need_db) {
  check_same_device(a, "a", {{&b, "b"}, {&dc, "dc"}});
  TORCH_CHECK_VALUE(need_da || need_db, "need_da or need_db must be true");
  if (a.scalar_type() == at::kDouble) {
    return fp64::bsmm_bwd(dc, a, b, layout, block, mode, trans_a, trans_b, need_da, need_db);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, a);
  at::Tensor da = need_da ? at::empty(a.sizes(), a.options()) : at::empty({0}, a.options());
  at::Tensor db = need_db ? at::empty(b.sizes(), b.options()) : at::empty({0}, b.options());
  BlockSparseMatMulBackwardParams p;
  p.index = index.get();
  p.mode = matmul_mode(mode);
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.a = view_of(a, "a", /*any_strides=*/mode != 1);
  p.b = view_of(b, "b", /*any_strides=*/mode != 2);
  p.dc = view_of(dc, "dc", /*any_strides=*/mode != 0);
  if (need_da) p.da = view_of(da, "da");
  if (need_db) p.db = view_of(db, "db");
  p.num_threads = num_threads();
  run_op(p, a, "MatMul (backward)");
  return {da, db};
}

at::Tensor bs_softmax(at::Tensor x, const at::Tensor& layout, int64_t block, int64_t nnz,
                      double scale, OptTensor rpe, OptTensor key_padding_mask, OptTensor attn_mask,
                      int64_t key_padding_mask_mode, int64_t attn_mask_mode) {
  check_dim(x, 4, "x", "[Z, nnz, block, block]");
  check_same_device(x, "x",
                    {{opt_ptr(rpe), "rpe"},
                     {opt_ptr(key_padding_mask), "key_padding_mask"},
                     {opt_ptr(attn_mask), "attn_mask"}});
  if (x.scalar_type() == at::kDouble) {
    return fp64::bs_softmax(x, layout, block, scale, rpe, key_padding_mask, attn_mask,
                            key_padding_mask_mode, attn_mask_mode);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, x);
  at::Tensor y = at::empty(x.sizes(), x.options());
  BlockSparseSoftmaxParams p;
  p.index = index.get();
  p.x = view_of(x, "x");
  p.y = view_of(y, "y");
  p.scale = *scale_of(scale);
  p.rpe = optional_view(rpe, "rpe", true);
  p.key_padding_mask = optional_view(key_padding_mask, "key_padding_mask", true);
  p.attn_mask = optional_view(attn_mask, "attn_mask", true);
  p.key_padding_mask_mode = mask_mode(key_padding_mask_mode, "key_padding_mask_mode");
  p.attn_mask_mode = mask_mode(attn_mask_mode, "attn_mask_mode");
  p.num_threads = num_threads();
  run_op(p, x, "Softmax");
  return y;
}

at::Tensor bs_softmax_bwd(at::Tensor dy, at::Tensor y, const at::Tensor& layout, int64_t block,
                          int64_t nnz, double scale) {
  check_same_device(y, "y", {{&dy, "dy"}});
  if (y.scalar_type() == at::kDouble) {
    return fp64::bs_softmax_bwd(dy, y, layout, block, scale);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, y);
  at::Tensor dx = at::empty(y.sizes(), y.options());
  BlockSparseSoftmaxBackwardParams p;
  p.index = index.get();
  p.y = view_of(y, "y");
  p.dy = view_of(dy, "dy");
  p.dx = view_of(dx, "dx");
  p.scale = *scale_of(scale);
  p.num_threads = num_threads();
  run_op(p, y, "Softmax (backward)");
  return dx;
}

SparseAttentionOptions attention_options(std::optional<double> scale, bool causal, int64_t kpm_mode,
                                         int64_t attn_mode, int64_t algorithm) {
  SparseAttentionOptions o;
  o.scale = scale_of(scale);
  o.causal = causal;
  o.key_padding_mask_mode = mask_mode(kpm_mode, "key_padding_mask_mode");
  o.attn_mask_mode = mask_mode(attn_mode, "attn_mask_mode");
  o.num_threads = num_threads();
  TORCH_CHECK_VALUE(algorithm >= 0 && algorithm <= 2,
                    "algorithm must be 0 (fused), 1 (composite) or 2 (reference); got ", algorithm);
  o.algorithm = static_cast<SparseAttentionAlgorithm>(algorithm);
  return o;
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_fwd(
    at::Tensor q, at::Tensor k, at::Tensor v, const at::Tensor& layout, int64_t block, int64_t nnz,
    OptTensor rpe, OptTensor key_padding_mask, OptTensor attn_mask, std::optional<double> scale,
    bool causal, int64_t key_padding_mask_mode, int64_t attn_mask_mode, int64_t algorithm) {
  check_dim(q, 4, "query", "[B, H, L, D]");
  check_same_device(q, "query",
                    {{&k, "key"},
                     {&v, "value"},
                     {opt_ptr(rpe), "rpe"},
                     {opt_ptr(key_padding_mask), "key_padding_mask"},
                     {opt_ptr(attn_mask), "attn_mask"}});
  if (q.scalar_type() == at::kDouble) {
    return fp64::sparse_attention_fwd(q, k, v, layout, block, rpe, key_padding_mask, attn_mask,
                                      scale, causal, key_padding_mask_mode, attn_mask_mode);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, q);
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  SparseAttentionForwardParams p;
  p.index = index.get();
  p.q = view_of(q, "query", true);
  p.k = view_of(k, "key", true);
  p.v = view_of(v, "value", true);
  p.rpe = optional_view(rpe, "rpe", true);
  p.key_padding_mask = optional_view(key_padding_mask, "key_padding_mask", true);
  p.attn_mask = optional_view(attn_mask, "attn_mask", true);
  p.out = view_of(out, "out");
  p.lse = view_of(lse, "lse");
  p.options = attention_options(scale, causal, key_padding_mask_mode, attn_mask_mode, algorithm);
  run_op(p, q, "SparseSelfAttention");
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attention_bwd(
    at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse,
    const at::Tensor& layout, int64_t block, int64_t nnz, OptTensor rpe, OptTensor key_padding_mask,
    OptTensor attn_mask, std::optional<double> scale, bool causal, int64_t key_padding_mask_mode,
    int64_t attn_mask_mode, int64_t algorithm) {
  check_dim(q, 4, "query", "[B, H, L, D]");
  check_same_device(q, "query",
                    {{&dout, "dout"},
                     {&k, "key"},
                     {&v, "value"},
                     {&out, "out"},
                     {&lse, "lse"},
                     {opt_ptr(rpe), "rpe"},
                     {opt_ptr(key_padding_mask), "key_padding_mask"},
                     {opt_ptr(attn_mask), "attn_mask"}});
  if (q.scalar_type() == at::kDouble) {
    return fp64::sparse_attention_bwd(dout, q, k, v, layout, block, rpe, key_padding_mask,
                                      attn_mask, scale, causal, key_padding_mask_mode,
                                      attn_mask_mode);
  }
  const std::shared_ptr<const BlockSparseIndex> index = cached_index_of(layout, block, nnz, q);
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(q.sizes(), q.options());
  at::Tensor dv = at::empty(q.sizes(), q.options());
  SparseAttentionBackwardParams p;
  p.index = index.get();
  p.q = view_of(q, "query", true);
  p.k = view_of(k, "key", true);
  p.v = view_of(v, "value", true);
  p.rpe = optional_view(rpe, "rpe", true);
  p.key_padding_mask = optional_view(key_padding_mask, "key_padding_mask", true);
  p.attn_mask = optional_view(attn_mask, "attn_mask", true);
  p.out = view_of(out, "out", true);
  p.lse = view_of(lse, "lse", true);
  p.dout = view_of(dout, "dout", true);
  p.dq = view_of(dq, "dq");
  p.dk = view_of(dk, "dk");
  p.dv = view_of(dv, "dv");
  p.options = attention_options(scale, causal, key_padding_mask_mode, attn_mask_mode, algorithm);
  run_op(p, q, "SparseSelfAttention (backward)");
  return {dq, dk, dv};
}

// ---- Layouts (no tensor inputs: plain functions) ---------------------------------------------

AttentionDirection direction(const std::string& s) {
  auto d = parse_attention_direction(s);
  TORCH_CHECK_VALUE(d.has_value(), "attention must be 'bidirectional' or 'unidirectional'; got '",
                    s, "'");
  return *d;
}

std::vector<int64_t> to_vec(c10::ArrayRef<int64_t> a) {
  return std::vector<int64_t>(a.begin(), a.end());
}

// One entry point for every built-in config: each mode reads the fields it has (the others are
// ignored). seq_len 0 validates only; max_seq_length > 0 applies SparseSelfAttention's crop rule.
at::Tensor sparsity_layout(const std::string& mode, int64_t num_heads, int64_t block,
                           bool different_layout_per_head, int64_t num_local_blocks,
                           int64_t num_global_blocks, const std::string& attention,
                           bool horizontal_global_attention, int64_t num_different_global_patterns,
                           int64_t num_random_blocks, c10::ArrayRef<int64_t> local_window_blocks,
                           c10::ArrayRef<int64_t> global_block_indices,
                           std::optional<c10::ArrayRef<int64_t>> global_block_end_indices,
                           int64_t num_sliding_window_blocks, int64_t seed, int64_t seq_len,
                           int64_t max_seq_length) {
  auto m = parse_sparsity_mode(mode);
  TORCH_CHECK_VALUE(m.has_value() && *m != SparsityMode::kUser, "unknown sparsity mode '", mode,
                    "'");
  TORCH_CHECK_VALUE(seed >= 0, "seed must be >= 0; got ", seed);
  SparsityConfig config = default_sparsity_config(*m, num_heads);
  SparsityCommon& common = sparsity_common(config);
  common.block = block;
  common.seed = static_cast<uint64_t>(seed);
  std::optional<std::vector<int64_t>> ends;
  if (global_block_end_indices.has_value()) ends = to_vec(*global_block_end_indices);
  std::visit(
      [&](auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, DenseSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
        } else if constexpr (std::is_same_v<T, FixedSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_local_blocks = num_local_blocks;
          c.num_global_blocks = num_global_blocks;
          c.attention = direction(attention);
          c.horizontal_global_attention = horizontal_global_attention;
          c.num_different_global_patterns = num_different_global_patterns;
        } else if constexpr (std::is_same_v<T, VariableSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_random_blocks = num_random_blocks;
          c.local_window_blocks = to_vec(local_window_blocks);
          c.global_block_indices = to_vec(global_block_indices);
          c.global_block_end_indices = ends;
          c.attention = direction(attention);
          c.horizontal_global_attention = horizontal_global_attention;
        } else if constexpr (std::is_same_v<T, BigBirdSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_random_blocks = num_random_blocks;
          c.num_sliding_window_blocks = num_sliding_window_blocks;
          c.num_global_blocks = num_global_blocks;
          c.attention = direction(attention);
        } else if constexpr (std::is_same_v<T, BSLongformerSparsityConfig>) {
          c.different_layout_per_head = different_layout_per_head;
          c.num_sliding_window_blocks = num_sliding_window_blocks;
          c.global_block_indices = to_vec(global_block_indices);
          c.global_block_end_indices = ends;
          c.attention = direction(attention);
        } else if constexpr (std::is_same_v<T, LocalSlidingWindowSparsityConfig>) {
          c.num_sliding_window_blocks = num_sliding_window_blocks;
          c.attention = direction(attention);
        }
      },
      config);
  if (seq_len == 0) {
    check_status(validate_sparsity_config(config), "SparsityConfig");
    return at::empty({0}, at::kLong);
  }
  Layout layout;
  if (max_seq_length > 0) {
    check_status(make_layout_for_length(config, max_seq_length, seq_len, &layout), "make_layout");
  } else {
    check_status(make_layout(config, seq_len, &layout), "make_layout");
  }
  at::Tensor t =
      at::empty({layout.num_heads, layout.num_row_blocks, layout.num_col_blocks}, at::kLong);
  int64_t* dst = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < layout.size(); ++i) dst[i] = layout.blocks[static_cast<size_t>(i)];
  return t;
}

// ---- DeepSpeed JSON ---------------------------------------------------------------------------

void json_list(std::ostringstream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}

// Parses the "sparse_attention" section with the library's parser (DeepSpeed's JSON defaults,
// strict key and type checks) and returns the resulting config as JSON for the Python side.
std::string parse_deepspeed_sparsity_config_json(const std::string& text, int64_t num_heads,
                                                 int64_t seed) {
  TORCH_CHECK_VALUE(seed >= 0, "seed must be >= 0; got ", seed);
  SparsityConfig config;
  check_status(
      parse_deepspeed_sparsity_config(text, num_heads, &config, static_cast<uint64_t>(seed)),
      "sparse_attention config");
  std::ostringstream os;
  const SparsityCommon& common = sparsity_common(config);
  os << "{\"mode\": \"" << sparsity_mode_name(sparsity_mode(config))
     << "\", \"num_heads\": " << common.num_heads << ", \"block\": " << common.block;
  auto b = [](bool x) { return x ? "true" : "false"; };
  std::visit(
      [&](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (!std::is_same_v<T, UserSparsityConfig> &&
                      !std::is_same_v<T, LocalSlidingWindowSparsityConfig>) {
          os << ", \"different_layout_per_head\": " << b(c.different_layout_per_head);
        }
        if constexpr (std::is_same_v<T, FixedSparsityConfig>) {
          os << ", \"num_local_blocks\": " << c.num_local_blocks
             << ", \"num_global_blocks\": " << c.num_global_blocks << ", \"attention\": \""
             << attention_direction_name(c.attention)
             << "\", \"horizontal_global_attention\": " << b(c.horizontal_global_attention)
             << ", \"num_different_global_patterns\": " << c.num_different_global_patterns;
        } else if constexpr (std::is_same_v<T, VariableSparsityConfig>) {
          os << ", \"num_random_blocks\": " << c.num_random_blocks << ", \"local_window_blocks\": ";
          json_list(os, c.local_window_blocks);
          os << ", \"global_block_indices\": ";
          json_list(os, c.global_block_indices);
          os << ", \"global_block_end_indices\": ";
          if (c.global_block_end_indices)
            json_list(os, *c.global_block_end_indices);
          else
            os << "null";
          os << ", \"attention\": \"" << attention_direction_name(c.attention)
             << "\", \"horizontal_global_attention\": " << b(c.horizontal_global_attention);
        } else if constexpr (std::is_same_v<T, BigBirdSparsityConfig>) {
          os << ", \"num_random_blocks\": " << c.num_random_blocks
             << ", \"num_sliding_window_blocks\": " << c.num_sliding_window_blocks
             << ", \"num_global_blocks\": " << c.num_global_blocks << ", \"attention\": \""
             << attention_direction_name(c.attention) << "\"";
        } else if constexpr (std::is_same_v<T, BSLongformerSparsityConfig>) {
          os << ", \"num_sliding_window_blocks\": " << c.num_sliding_window_blocks
             << ", \"global_block_indices\": ";
          json_list(os, c.global_block_indices);
          os << ", \"global_block_end_indices\": ";
          if (c.global_block_end_indices)
            json_list(os, *c.global_block_end_indices);
          else
            os << "null";
          os << ", \"attention\": \"" << attention_direction_name(c.attention) << "\"";
        }
      },
      config);
  os << "}";
  return os.str();
}

bool built_with_cuda_op() {
  return built_with_cuda();
}

}  // namespace
}  // namespace sciattn::torch_ext

// Schemas. Outputs that a call does not need (a bias gradient nobody asked for) are returned as
// empty tensors of shape [0]; the Python side turns them into None.
TORCH_LIBRARY(sciattn, m) {
  using namespace sciattn::torch_ext;
  m.def(
      "evoformer_fwd(Tensor q, Tensor k, Tensor v, Tensor? bias1, Tensor? bias2, float? scale, "
      "int algorithm) -> (Tensor, Tensor)");
  m.def(
      "evoformer_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor? bias1, Tensor? bias2, "
      "Tensor out, Tensor lse, float? scale, bool need_dbias1, bool need_dbias2, int algorithm) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "bsmm(Tensor a, Tensor b, Tensor layout, int block, int nnz, int mode, bool trans_a, "
      "bool trans_b) -> Tensor");
  m.def(
      "bsmm_bwd(Tensor dc, Tensor a, Tensor b, Tensor layout, int block, int nnz, int mode, "
      "bool trans_a, bool trans_b, bool need_da, bool need_db) -> (Tensor, Tensor)");
  m.def(
      "bs_softmax(Tensor x, Tensor layout, int block, int nnz, float scale, Tensor? rpe, "
      "Tensor? key_padding_mask, Tensor? attn_mask, int key_padding_mask_mode, "
      "int attn_mask_mode) -> Tensor");
  m.def(
      "bs_softmax_bwd(Tensor dy, Tensor y, Tensor layout, int block, int nnz, float scale) "
      "-> Tensor");
  m.def(
      "sparse_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor layout, int block, int nnz, "
      "Tensor? rpe, Tensor? key_padding_mask, Tensor? attn_mask, float? scale, bool causal, "
      "int key_padding_mask_mode, int attn_mask_mode, int algorithm) -> (Tensor, Tensor)");
  m.def(
      "sparse_attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor layout, int block, int nnz, Tensor? rpe, Tensor? key_padding_mask, "
      "Tensor? attn_mask, float? scale, bool causal, int key_padding_mask_mode, "
      "int attn_mask_mode, int algorithm) -> (Tensor, Tensor, Tensor)");
  m.def(
      "sparsity_layout(str mode, int num_heads, int block, bool different_layout_per_head, "
      "int num_local_blocks, int num_global_blocks, str attention, "
      "bool horizontal_global_attention, int num_different_global_patterns, "
      "int num_random_blocks, int[] local_window_blocks, int[] global_block_indices, "
      "int[]? global_block_end_indices, int num_sliding_window_blocks, int seed, int seq_len, "
      "int max_seq_length) -> Tensor",
      &sparsity_layout);
  m.def("parse_deepspeed_sparsity_config(str text, int num_heads, int seed) -> str",
        &parse_deepspeed_sparsity_config_json);
  m.def("built_with_cuda() -> bool", &built_with_cuda_op);
}

#define SCIATTN_REGISTER_KERNELS(m)                      \
  m.impl("evoformer_fwd", &evoformer_fwd);               \
  m.impl("evoformer_bwd", &evoformer_bwd);               \
  m.impl("bsmm", &bsmm);                                 \
  m.impl("bsmm_bwd", &bsmm_bwd);                         \
  m.impl("bs_softmax", &bs_softmax);                     \
  m.impl("bs_softmax_bwd", &bs_softmax_bwd);             \
  m.impl("sparse_attention_fwd", &sparse_attention_fwd); \
  m.impl("sparse_attention_bwd", &sparse_attention_bwd)

TORCH_LIBRARY_IMPL(sciattn, CPU, m) {
  using namespace sciattn::torch_ext;
  SCIATTN_REGISTER_KERNELS(m);
}

#ifdef SCIATTN_TORCH_CUDA
TORCH_LIBRARY_IMPL(sciattn, CUDA, m) {
  using namespace sciattn::torch_ext;
  SCIATTN_REGISTER_KERNELS(m);
}
#endif
