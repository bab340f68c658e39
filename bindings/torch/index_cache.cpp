// The block-sparse indexes of the layout tensors the ops are called with, built once per layout
// (and uploaded once per CUDA device) and kept for the next calls (see index_cache.h). Binding
// layer.
#include "index_cache.h"

#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "sciattn/block_sparse.h"
#include "tensor_args.h"

#ifdef SCIATTN_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace sciattn::torch_ext {
namespace {

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

}  // namespace

std::shared_ptr<const BlockSparseIndex> cached_index_of(const at::Tensor& layout, int64_t block,
                                                        int64_t nnz, const at::Tensor& like) {
  static IndexCache cache;
  const int device = like.is_cuda() ? static_cast<int>(like.device().index()) : -1;
  return cache.get(layout, block, nnz, device);
}

}  // namespace sciattn::torch_ext
