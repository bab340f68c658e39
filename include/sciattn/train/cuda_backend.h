// The trainer's CUDA back end: the layer calls of backend.h on one CUDA device, matrix products
// on cuBLASLt, activations in bf16 or fp16 (fp32 for exact tests). Public API of the trainer
// (plain C++17; no CUDA headers). It exists in every build: without CUDA, make_cuda_backend
// returns kNotSupported.
//
// Conventions beyond backend.h's (which it keeps, the "+=" outputs and the chunked token sums
// included):
//   - Every TensorView is CUDA memory of the back end's device, packed row-major. Activations,
//     the weights' compute copy, activation gradients (din, dout, dqkv) and the LM head's logits
//     scratch are in compute_dtype(); weight and bias gradients (dweight, dbias, dwte, dwpe) and
//     the statistics (mean, rstd, lse, losses) are f32. Token ids and targets are int32 device
//     arrays.
//   - Work is queued on the back end's stream and the calls return without waiting. Token ids
//     are checked on the device: an id outside [0, V) gives a NaN row (embedding, loss) and makes
//     the next synchronize() or copy_to_host() fail, naming the call, the position and the id.
//   - Deterministic: the same inputs give the same bytes on every run (no floating-point
//     atomics; every sum has a fixed order). Every product over tokens is issued per chunk of
//     token_chunk() rows from the call's first row, as on the CPU, so tiles whose sizes are
//     multiples of the chunk give the same bits as one call.
//   - The attention index: when index->device is null the back end uploads a copy of the index
//     once and keeps it for that address (the index must then not change while the back end
//     lives); upload it with upload_block_sparse_index to share one device copy instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "sciattn/device.h"
#include "sciattn/dtype.h"
#include "sciattn/status.h"
#include "sciattn/train/backend.h"

namespace sciattn::train {

struct CudaBackendOptions {
  DType compute_dtype = DType::kBF16;  // kBF16, kF16 or kF32
  int device = 0;                      // CUDA device ordinal
  // The stream every call is queued on; a null handle makes the back end create its own
  // (non-blocking) stream, destroyed with it.
  Stream stream{};
  // Rows per matrix product over tokens; a multiple of 8, so that every chunk of a 16-bit or
  // fp32 matrix starts on 16 bytes like the whole (cuBLASLt picks its algorithm by alignment).
  int64_t token_chunk = 4096;
  // cuBLASLt's workspace, part of the scratch (32 MiB is NVIDIA's advice for Hopper).
  size_t matmul_workspace_bytes = size_t{32} << 20;
};

// A Backend on CUDA with what the trainer's GPU wiring needs beyond the layer calls.
class CudaBackend : public Backend {
 public:
  // The stream the calls are queued on (Stream::handle is a cudaStream_t).
  virtual Stream stream() const = 0;
  virtual int device_ordinal() const = 0;
};

// Creates the back end on options.device: fails with kNotSupported in a build without CUDA or
// when there is no such device, kInvalidArgument (naming the option) for an unsupported
// compute_dtype or a token_chunk that is not a positive multiple of 8, and kDeviceError when the
// CUDA runtime or cuBLASLt fails.
Status make_cuda_backend(const CudaBackendOptions& options, std::unique_ptr<CudaBackend>* out);

// The free and total memory of CUDA device `device` (cudaMemGetInfo); kNotSupported without CUDA
// or without that device.
Status cuda_device_memory(int device, uint64_t* free_bytes, uint64_t* total_bytes);
Status make_cuda_backend(const CudaBackendOptions& options, std::unique_ptr<Backend>* out);

}  // namespace sciattn::train
