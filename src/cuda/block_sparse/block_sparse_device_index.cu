// The CUDA side of upload_block_sparse_index: copies the int32 packing of a BlockSparseIndex and
// its tile index (detail::pack_block_sparse_index) to the chosen CUDA device; and the checks the
// ops make of that copy. CUDA layer (host code).
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "common/block_sparse_device_index.h"
#include "common/block_sparse_device_pack.h"
#include "cuda/block_sparse/block_sparse_ops_cuda.h"
#include "cuda/common/device_guard.h"

namespace sciattn {

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

namespace cuda {

Status upload_block_sparse_index(BlockSparseIndex* index, int device) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    devices = 0;
  }
  if (device < 0 || device >= devices) {
    return Status::invalid_argument("device must be a CUDA device ordinal in [0, " +
                                    std::to_string(devices) + "); got " + std::to_string(device));
  }
  // The host step (the tile index and the int32 packing), then one allocation and one copy.
  detail::PackedBlockSparseIndex packed;
  const Status built = detail::pack_block_sparse_index(*index, &packed);
  if (!built.ok()) return built;
  auto d = std::make_shared<BlockSparseDeviceIndex>();
  d->device = device;
  d->bytes = packed.size() * sizeof(int32_t);
  const Status copied = on_device(device, [&] {
    if (d->bytes == 0) return Status::ok_status();
    cudaError_t e = cudaMalloc(&d->memory, d->bytes);
    if (e != cudaSuccess) {
      d->memory = nullptr;
      return cuda::device_status(e, "upload_block_sparse_index: cudaMalloc");
    }
    e = cudaMemcpy(d->memory, packed.data(), d->bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return cuda::device_status(e, "upload_block_sparse_index: cudaMemcpy");
    return Status::ok_status();
  });
  if (!copied.ok()) return copied;
  static_cast<BlockSparseDeviceArrays&>(*d) = packed.at(static_cast<const int32_t*>(d->memory));
  index->device = std::move(d);
  return Status::ok_status();
}

}  // namespace cuda

namespace detail {

Status check_device_index(const BlockSparseIndex& index, const void* tensor_data) {
  const BlockSparseDeviceIndex* d = index.device.get();
  if (d == nullptr) {
    return Status::invalid_argument(
        "index: the tensors are on a CUDA device but the index has not been uploaded; call "
        "upload_block_sparse_index(&index, device) once after building it");
  }
  if (d->nnz != index.nnz || d->block != index.block || d->num_heads != index.num_heads ||
      d->layout_heads != index.layout_heads || d->stored_nnz != index.stored_nnz() ||
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
