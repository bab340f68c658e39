// The parts of the CUDA back end that the GPU ops' test suite needs besides the ops themselves,
// for the host emulation (tests/cuda/ops_emulation): the device index "uploaded" to host memory,
// one device (an sm_80 with its shared memory), and the fused attention entry points (never called
// by the suite). Developer tool.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include "common/block_sparse_checks.h"
#include "common/block_sparse_device_index.h"
#include "common/block_sparse_device_pack.h"
#include "cuda/common/device_arch.h"
#include "sciattn/device.h"
namespace sciattn {
BlockSparseDeviceIndex::~BlockSparseDeviceIndex() {
  std::free(memory);
}
int cuda_device_count() {
  return 1;
}
namespace detail {
Status check_device_index(const BlockSparseIndex& ix, const void*) {
  if (!ix.device)
    return Status::invalid_argument(
        "index: the tensors are on a CUDA device but the index has not been uploaded; call "
        "upload_block_sparse_index(&index, device) once after building it");
  return Status::ok_status();
}
}  // namespace detail
namespace cuda {
// The emulated device: an sm_80 (the ops have no warpgroup kernels), 163 KiB of shared memory.
Status current_device_kernels(DeviceKernels* out) {
  out->major = 8;
  out->minor = 0;
  out->binary_arch = 80;
  out->ptx_arch = 80;
  out->warpgroup_mma = false;
  out->smem_limit = 163 * 1024;
  out->name = "host emulation";
  return Status::ok_status();
}
// The CUDA side of upload_block_sparse_index: the packing (detail::pack_block_sparse_index), kept
// in host memory.
Status upload_block_sparse_index(BlockSparseIndex* ix, int) {
  detail::PackedBlockSparseIndex packed;
  const Status s = detail::pack_block_sparse_index(*ix, &packed);
  if (!s.ok()) return s;
  auto d = std::make_shared<BlockSparseDeviceIndex>();
  d->bytes = packed.size() * sizeof(int32_t);
  d->memory = std::malloc(d->bytes > 0 ? d->bytes : 4);
  if (d->bytes > 0) std::memcpy(d->memory, packed.data(), d->bytes);
  static_cast<BlockSparseDeviceArrays&>(*d) = packed.at(static_cast<const int32_t*>(d->memory));
  ix->device = d;
  return Status::ok_status();
}
using detail::AttentionShape;
Status check_sparse_attention_fused_cuda(const SparseAttentionForwardParams&,
                                         const AttentionShape&) {
  std::abort();
}
Status check_sparse_attention_fused_cuda(const SparseAttentionBackwardParams&,
                                         const AttentionShape&) {
  std::abort();
}
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionForwardParams&,
                                                  const AttentionShape&) {
  std::abort();
}
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionBackwardParams&,
                                                  const AttentionShape&) {
  std::abort();
}
Status run_sparse_attention_fused_cuda(const SparseAttentionForwardParams&, const AttentionShape&,
                                       void*, Stream) {
  std::abort();
}
Status run_sparse_attention_fused_cuda(const SparseAttentionBackwardParams&, const AttentionShape&,
                                       void*, Stream) {
  std::abort();
}
}  // namespace cuda
}  // namespace sciattn
