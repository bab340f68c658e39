// The CUDA back end of the trainer: checks each call's TensorViews (CUDA memory, the compute dtype
// or f32 as cuda_backend.h says, packed, shapes that agree), then queues the layer's kernels
// (layers_cuda.h), cuBLASLt products (matmul_cublaslt.h) or sciattn's sparse attention op on the
// back end's stream. CUDA layer of the trainer (host code).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status_try.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/device.h"
#include "sciattn/train/cuda_backend.h"
#include "sciattn/train/cuda_optimizer.h"
#include "train/backend_checks.h"
#include "train/cuda/layers_cuda.h"
#include "train/cuda/matmul_cublaslt.h"

namespace sciattn::train {
namespace {

using cuda::Matmul;
using cuda::MatmulShape;

Status device_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::ok_status();
  return Status(StatusCode::kDeviceError, what + ": " + cudaGetErrorString(e));
}

// Rows and columns of a rank-2 view (0 when the rank is not 2).
int64_t rows_of(const TensorView& t) {
  return t.rank == 2 ? t.sizes[0] : 0;
}
int64_t cols_of(const TensorView& t) {
  return t.rank == 2 ? t.sizes[1] : 0;
}

size_t align_up(size_t x) {
  constexpr size_t kAlign = 256;
  return (x + kAlign - 1) / kAlign * kAlign;
}

// Makes `device` current for the guard's lifetime and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) {
      status_ = device_status(cudaSetDevice(device), "cudaSetDevice");
      switched_ = status_.ok() && previous_ >= 0;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  Status status_;
};

// The calls that check token ids on the device; each has a slot for the first bad id.
enum TokenCheck : int { kEmbeddingForward = 0, kEmbeddingBackward = 1, kLmHead = 2, kTokenChecks };
constexpr const char* kTokenCheckNames[kTokenChecks] = {
    "embedding_forward: tokens", "embedding_backward: tokens", "lm head: targets"};

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(const CudaBackendOptions& options)
      : options_(options),
        dtype_context_(std::string(" on this CUDA back end (compute dtype ") +
                       dtype_name(options.compute_dtype) + ")") {}

  ~CudaBackendImpl() override {
    DeviceGuard guard(options_.device);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (cudaStream_t s : copy_streams_) {
      if (s != nullptr) cudaStreamSynchronize(s);
    }
    indexes_.clear();
    cudaFree(scratch_);
    cudaFree(matmul_workspace_);
    cudaFree(bad_tokens_);
    cudaFree(norm_workspace_);
    for (auto& pool : copy_events_) {
      for (cudaEvent_t e : pool) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
    if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
    for (cudaStream_t s : copy_streams_) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
    if (own_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status init() {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    // One clear error for a GPU this build's kernels cannot run on (older than sm_80, or no code
    // for its architecture) before anything is allocated.
    SCIATTN_TRY(cuda_check_kernels());
    if (options_.stream.handle != nullptr) {
      stream_ = static_cast<cudaStream_t>(options_.stream.handle);
    } else {
      SCIATTN_TRY(device_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                "creating the back end's stream"));
      own_stream_ = true;
    }
    SCIATTN_TRY(matmul_.init());
    SCIATTN_TRY(device_status(cudaMalloc(&matmul_workspace_, options_.matmul_workspace_bytes),
                              "allocating cuBLASLt's workspace"));
    SCIATTN_TRY(device_status(cudaMalloc(&bad_tokens_, kTokenChecks * sizeof(unsigned long long)),
                              "allocating the token check"));
    count_device_bytes(options_.matmul_workspace_bytes + kTokenChecks * sizeof(unsigned long long));
    // The copy streams (one per direction, so that offloading and prefetching run at once on the
    // two copy engines) and their events.
    for (cudaStream_t& s : copy_streams_) {
      SCIATTN_TRY(device_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                "creating a copy stream"));
    }
    SCIATTN_TRY(device_status(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming),
                              "creating an event"));
    for (auto& pool : copy_events_) {
      for (cudaEvent_t& e : pool) {
        SCIATTN_TRY(device_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                  "creating an event"));
      }
    }
    SCIATTN_TRY(reset_token_checks());
    SCIATTN_TRY(device_status(cudaStreamSynchronize(stream_), "initialising the back end"));
    cudaDeviceProp prop{};
    SCIATTN_TRY(
        device_status(cudaGetDeviceProperties(&prop, options_.device), "cudaGetDeviceProperties"));
    device_name_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                   std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) +
                   " SMs)";
    return Status::ok_status();
  }

  Device device() const override { return Device::kCuda; }
  DType compute_dtype() const override { return options_.compute_dtype; }
  std::string description() const override {
    return "cuda:" + std::to_string(options_.device) + " " + device_name_ + ", " +
           dtype_name(options_.compute_dtype) + ", " + matmul_.description() + ", token chunk " +
           std::to_string(options_.token_chunk);
  }
  int64_t token_chunk() const override { return options_.token_chunk; }
  Stream stream() const override { return Stream{stream_}; }
  int device_ordinal() const override { return options_.device; }

  // ---- memory ----

  Status allocate(size_t bytes, void** ptr) override {
    *ptr = nullptr;
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const size_t rounded = align_up(std::max<size_t>(bytes, 1));
    const cudaError_t e = cudaMalloc(ptr, rounded);
    if (e != cudaSuccess) {
      cudaGetLastError();
      *ptr = nullptr;
      return Status(StatusCode::kDeviceError,
                    "cannot allocate " + std::to_string(bytes) +
                        " bytes of CUDA memory: " + cudaGetErrorString(e));
    }
    // Zeroed before the call returns, so that any stream (or the host) sees zeros.
    Status s = device_status(cudaMemsetAsync(*ptr, 0, rounded, stream_), "zeroing an allocation");
    if (s.ok()) s = device_status(cudaStreamSynchronize(stream_), "zeroing an allocation");
    if (!s.ok()) {
      cudaFree(*ptr);
      *ptr = nullptr;
      return s;
    }
    allocations_[*ptr] = rounded;
    count_device_bytes(rounded);
    return s;
  }
  void release(void* ptr) override {
    if (ptr == nullptr) return;
    DeviceGuard guard(options_.device);
    // Queued work may still use it, a copy included.
    cudaStreamSynchronize(stream_);
    for (cudaStream_t s : copy_streams_) cudaStreamSynchronize(s);
    cudaFree(ptr);
    auto it = allocations_.find(ptr);
    if (it != allocations_.end()) {
      device_bytes_ -= it->second;
      allocations_.erase(it);
    }
  }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    if (bytes == 0) return Status::ok_status();
    // Waits: the caller may reuse its host buffer as soon as the call returns.
    SCIATTN_TRY(device_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                              "copy_to_device"));
    return device_status(cudaStreamSynchronize(stream_), "copy_to_device");
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    if (bytes > 0) {
      SCIATTN_TRY(device_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                                "copy_to_host"));
    }
    SCIATTN_TRY(device_status(cudaStreamSynchronize(stream_), "copy_to_host"));
    return check_tokens_reported();
  }
  Status fill_zero(void* dst, size_t bytes) override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    if (bytes == 0) return Status::ok_status();
    return device_status(cudaMemsetAsync(dst, 0, bytes, stream_), "fill_zero");
  }
  Status synchronize() override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    SCIATTN_TRY(device_status(cudaStreamSynchronize(stream_), "synchronize"));
    return check_tokens_reported();
  }
  size_t scratch_bytes() const override { return scratch_bytes_ + options_.matmul_workspace_bytes; }
  uint64_t peak_device_bytes() const override { return peak_device_bytes_; }

  // ---- host memory and the copy streams ----

  Status allocate_host(size_t bytes, void** ptr) override {
    *ptr = nullptr;
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const size_t rounded = align_up(std::max<size_t>(bytes, 1));
    const cudaError_t e = cudaHostAlloc(ptr, rounded, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      *ptr = nullptr;
      return Status(StatusCode::kDeviceError,
                    "cannot allocate " + std::to_string(bytes) +
                        " bytes of page-locked host memory: " + cudaGetErrorString(e));
    }
    zero_host(*ptr, rounded);
    return Status::ok_status();
  }
  void release_host(void* ptr) override {
    if (ptr == nullptr) return;
    DeviceGuard guard(options_.device);
    for (cudaStream_t s : copy_streams_) cudaStreamSynchronize(s);
    cudaFreeHost(ptr);
  }

  Status copy_async(void* dst, const void* src, size_t bytes, CopyDirection direction,
                    CopyTicket* ticket) override {
    const char* call = "copy_async";
    if (ticket != nullptr) *ticket = CopyTicket{direction, 0};
    if (bytes == 0) return Status::ok_status();
    if (dst == nullptr || src == nullptr) {
      return Status::invalid_argument("copy_async: dst and src must not be null");
    }
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const int d = direction == CopyDirection::kToHost ? 0 : 1;
    cudaStream_t copy = copy_streams_[d];
    // After everything queued on the compute stream so far.
    SCIATTN_TRY(device_status(cudaEventRecord(compute_done_, stream_), call));
    SCIATTN_TRY(device_status(cudaStreamWaitEvent(copy, compute_done_, 0), call));
    SCIATTN_TRY(device_status(
        cudaMemcpyAsync(dst, src, bytes, d == 0 ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                        copy),
        call));
    const uint64_t id = ++copy_ids_[d];
    const size_t slot = static_cast<size_t>(id % kCopyEvents);
    SCIATTN_TRY(device_status(cudaEventRecord(copy_events_[d][slot], copy), call));
    copy_event_ids_[d][slot] = id;
    if (ticket != nullptr) ticket->id = id;
    return Status::ok_status();
  }
  Status wait_for_copy(const CopyTicket& ticket) override {
    cudaEvent_t e = nullptr;
    SCIATTN_TRY(ticket_event("wait_for_copy", ticket, &e));
    if (e == nullptr) return Status::ok_status();
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return device_status(cudaStreamWaitEvent(stream_, e, 0), "wait_for_copy");
  }
  Status finish_copy(const CopyTicket& ticket) override {
    cudaEvent_t e = nullptr;
    SCIATTN_TRY(ticket_event("finish_copy", ticket, &e));
    if (e == nullptr) return Status::ok_status();
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return device_status(cudaEventSynchronize(e), "finish_copy");
  }

  // ---- the optimizer step's elementwise work (cuda_optimizer.h, on the back end's stream) ----

  Status adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                    const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                    void* param_copy, DType copy_dtype) override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return cuda_adamw_step(h, step, grad_scale, params, grads, exp_avg, exp_avg_sq, n, param_copy,
                           copy_dtype, Stream{stream_});
  }
  Status sum_squares(const float* data, int64_t n, SumSquares* out) override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const size_t ws = cuda_sum_squares_workspace(n);
    if (ws > norm_workspace_bytes_) {
      SCIATTN_TRY(device_status(cudaStreamSynchronize(stream_), "sum_squares"));
      cudaFree(norm_workspace_);
      device_bytes_ -= norm_workspace_bytes_;
      norm_workspace_ = nullptr;
      norm_workspace_bytes_ = 0;
      SCIATTN_TRY(
          device_status(cudaMalloc(&norm_workspace_, ws), "allocating the norm's workspace"));
      norm_workspace_bytes_ = ws;
      count_device_bytes(ws);
    }
    SCIATTN_TRY(
        cuda_sum_squares(data, n, norm_workspace_, norm_workspace_bytes_, Stream{stream_}, out));
    return check_tokens_reported();
  }
  Status scale_in_place(float* data, int64_t n, float factor) override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return cuda_scale_in_place(data, n, factor, Stream{stream_});
  }
  Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) override {
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return cuda_cast(src, src_dtype, dst, dst_dtype, n, Stream{stream_});
  }

  // ---- layers ----

  Status embedding_forward(const EmbeddingParams& p) override {
    const char* call = "embedding_forward";
    const int64_t V = rows_of(p.wte), C = cols_of(p.wte);
    SCIATTN_TRY(check(call, p.wte, "wte", act(), {V, C}));
    SCIATTN_TRY(check_tokens(call, p.tokens, p.batch, p.seq_len));
    SCIATTN_TRY(check(call, p.out, "out", act(), {p.batch * p.seq_len, C}));
    if (p.wpe.present()) {
      SCIATTN_TRY(check(call, p.wpe, "wpe", act(), {rows_of(p.wpe), C}));
      if (rows_of(p.wpe) < p.seq_len) {
        return Status::invalid_argument(
            "embedding_forward: wpe has " + std::to_string(rows_of(p.wpe)) +
            " positions, fewer than the sequence length " + std::to_string(p.seq_len));
      }
    }
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    token_vocab_[kEmbeddingForward] = V;
    return launched(call, cuda::embedding_forward(options_.compute_dtype, p.out.data, p.tokens,
                                                  p.wte.data, p.wpe.data, p.batch, p.seq_len, C, V,
                                                  bad_tokens_ + kEmbeddingForward, stream_));
  }

  Status embedding_backward(const EmbeddingBackwardParams& p) override {
    const char* call = "embedding_backward";
    const int64_t V = rows_of(p.dwte), C = cols_of(p.dwte);
    SCIATTN_TRY(check(call, p.dwte, "dwte", DType::kF32, {V, C}));
    SCIATTN_TRY(check_tokens(call, p.tokens, p.batch, p.seq_len));
    SCIATTN_TRY(check(call, p.dout, "dout", act(), {p.batch * p.seq_len, C}));
    if (p.dwpe.present()) {
      SCIATTN_TRY(check(call, p.dwpe, "dwpe", DType::kF32, {rows_of(p.dwpe), C}));
      if (rows_of(p.dwpe) < p.seq_len) {
        return Status::invalid_argument(
            "embedding_backward: dwpe has " + std::to_string(rows_of(p.dwpe)) +
            " positions, fewer than the sequence length " + std::to_string(p.seq_len));
      }
    }
    if (p.batch * p.seq_len >= (int64_t{1} << 31)) {
      return Status::not_supported(
          "embedding_backward: batch * seq_len must be below 2^31 (the "
          "token sort's count is 32-bit); got " +
          std::to_string(p.batch * p.seq_len));
    }
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const size_t ws = cuda::embedding_backward_workspace(p.batch * p.seq_len, V);
    SCIATTN_TRY(ensure_scratch(ws));
    token_vocab_[kEmbeddingBackward] = V;
    return launched(
        call, cuda::embedding_backward(options_.compute_dtype, static_cast<float*>(p.dwte.data),
                                       static_cast<float*>(p.dwpe.data), p.dout.data, p.tokens,
                                       p.batch, p.seq_len, C, V, scratch_, scratch_bytes_,
                                       bad_tokens_ + kEmbeddingBackward, stream_));
  }

  Status layernorm_forward(const LayerNormParams& p) override {
    const char* call = "layernorm_forward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", act(), {C}));
    SCIATTN_TRY(check(call, p.bias, "bias", act(), {C}));
    SCIATTN_TRY(check(call, p.out, "out", act(), {N, C}));
    SCIATTN_TRY(check(call, p.mean, "mean", DType::kF32, {N}));
    SCIATTN_TRY(check(call, p.rstd, "rstd", DType::kF32, {N}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return launched(call, cuda::layernorm_forward(
                              options_.compute_dtype, p.out.data, static_cast<float*>(p.mean.data),
                              static_cast<float*>(p.rstd.data), p.in.data, p.weight.data,
                              p.bias.data, N, C, p.eps, stream_));
  }

  Status layernorm_backward(const LayerNormBackwardParams& p) override {
    const char* call = "layernorm_backward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", act(), {C}));
    SCIATTN_TRY(check(call, p.mean, "mean", DType::kF32, {N}));
    SCIATTN_TRY(check(call, p.rstd, "rstd", DType::kF32, {N}));
    SCIATTN_TRY(check(call, p.dout, "dout", act(), {N, C}));
    SCIATTN_TRY(check(call, p.din, "din", act(), {N, C}));
    SCIATTN_TRY(check(call, p.dweight, "dweight", DType::kF32, {C}));
    SCIATTN_TRY(check(call, p.dbias, "dbias", DType::kF32, {C}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const size_t ws = cuda::column_sums_workspace(N, C, options_.token_chunk, 2);
    SCIATTN_TRY(ensure_scratch(ws));
    const auto* mean = static_cast<const float*>(p.mean.data);
    const auto* rstd = static_cast<const float*>(p.rstd.data);
    SCIATTN_TRY(launched(
        call, cuda::layernorm_backward_input(options_.compute_dtype, p.din.data, p.dout.data,
                                             p.in.data, p.weight.data, mean, rstd, N, C, stream_)));
    return launched(call, cuda::layernorm_backward_params(
                              options_.compute_dtype, static_cast<float*>(p.dweight.data),
                              static_cast<float*>(p.dbias.data), p.dout.data, p.in.data, mean, rstd,
                              N, C, options_.token_chunk, scratch_, scratch_bytes_, stream_));
  }

  Status linear_forward(const LinearParams& p) override {
    const char* call = "linear_forward";
    const int64_t N = rows_of(p.in), IC = cols_of(p.in), OC = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, IC}));
    SCIATTN_TRY(check(call, p.weight, "weight", act(), {OC, IC}));
    if (p.bias.present()) SCIATTN_TRY(check(call, p.bias, "bias", act(), {OC}));
    SCIATTN_TRY(check(call, p.out, "out", act(), {N, OC}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const bool epilogue = p.bias.present() && Matmul::bias_in_epilogue(p.bias.data);
    for (int64_t r0 = 0; r0 < N; r0 += options_.token_chunk) {
      const int64_t rows = std::min(options_.token_chunk, N - r0);
      // out_chunk [rows, OC] = in_chunk [rows, IC] W^T: m = OC, n = rows, k = IC.
      SCIATTN_TRY(product(true, false, OC, rows, IC, p.weight.data, IC, at(p.in, r0 * IC), IC,
                          at(p.out, r0 * OC), OC, act(), epilogue ? p.bias.data : nullptr, 0.0f));
    }
    if (p.bias.present() && !epilogue) {
      SCIATTN_TRY(launched(
          call, cuda::add_bias(options_.compute_dtype, p.out.data, p.bias.data, N, OC, stream_)));
    }
    return Status::ok_status();
  }

  Status linear_backward(const LinearBackwardParams& p) override {
    const char* call = "linear_backward";
    const int64_t N = rows_of(p.in), IC = cols_of(p.in), OC = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, IC}));
    SCIATTN_TRY(check(call, p.weight, "weight", act(), {OC, IC}));
    SCIATTN_TRY(check(call, p.dout, "dout", act(), {N, OC}));
    SCIATTN_TRY(check(call, p.dweight, "dweight", DType::kF32, {OC, IC}));
    if (p.din.present()) SCIATTN_TRY(check(call, p.din, "din", act(), {N, IC}));
    if (p.dbias.present()) SCIATTN_TRY(check(call, p.dbias, "dbias", DType::kF32, {OC}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    for (int64_t r0 = 0; r0 < N; r0 += options_.token_chunk) {
      const int64_t rows = std::min(options_.token_chunk, N - r0);
      const void* dout = at(p.dout, r0 * OC);
      if (p.din.present()) {
        // din_chunk [rows, IC] = dout_chunk [rows, OC] W: m = IC, n = rows, k = OC.
        SCIATTN_TRY(product(false, false, IC, rows, OC, p.weight.data, IC, dout, OC,
                            at(p.din, r0 * IC), IC, act(), nullptr, 0.0f));
      }
      // dW [OC, IC] += dout_chunk^T in_chunk: column-major dW^T = in_chunk^T dout_chunk,
      // m = IC, n = OC, k = rows.
      SCIATTN_TRY(product(false, true, IC, OC, rows, at(p.in, r0 * IC), IC, dout, OC,
                          p.dweight.data, IC, DType::kF32, nullptr, 1.0f));
    }
    if (p.dbias.present()) {
      const size_t ws = cuda::column_sums_workspace(N, OC, options_.token_chunk, 1);
      SCIATTN_TRY(ensure_scratch(ws));
      SCIATTN_TRY(launched(
          call, cuda::bias_backward(options_.compute_dtype, static_cast<float*>(p.dbias.data),
                                    p.dout.data, N, OC, options_.token_chunk, scratch_,
                                    scratch_bytes_, stream_)));
    }
    return Status::ok_status();
  }

  Status gelu_forward(const GeluParams& p) override {
    const char* call = "gelu_forward";
    SCIATTN_TRY(check(call, p.in, "in", act(), {rows_of(p.in), cols_of(p.in)}));
    SCIATTN_TRY(check(call, p.out, "out", act(), {rows_of(p.in), cols_of(p.in)}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return launched(call, cuda::gelu_forward(options_.compute_dtype, p.out.data, p.in.data,
                                             p.in.numel(), stream_));
  }

  Status gelu_backward(const GeluBackwardParams& p) override {
    const char* call = "gelu_backward";
    const int64_t N = rows_of(p.in), F = cols_of(p.in);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, F}));
    SCIATTN_TRY(check(call, p.dout, "dout", act(), {N, F}));
    SCIATTN_TRY(check(call, p.din, "din", act(), {N, F}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return launched(call, cuda::gelu_backward(options_.compute_dtype, p.din.data, p.in.data,
                                              p.dout.data, p.in.numel(), stream_));
  }

  Status rotary(const RotaryParams& p) override {
    const char* call = "rotary";
    if (p.qkv.rank != 5 || p.qkv.sizes[2] != 3) {
      return Status::invalid_argument("rotary: qkv must have shape [B, L, 3, H, D]; got " +
                                      p.qkv.shape_string());
    }
    const int64_t B = p.qkv.sizes[0], L = p.qkv.sizes[1], H = p.qkv.sizes[3], D = p.qkv.sizes[4];
    SCIATTN_TRY(check(call, p.qkv, "qkv", act(), {B, L, 3, H, D}));
    if (D % 2 != 0) {
      return Status::invalid_argument("rotary: the head dim must be even; got " +
                                      std::to_string(D));
    }
    // The kernel keeps the (cos, sin) of 8 rows of D / 2 angles in 48 KB of shared memory.
    if (D > 1536) {
      return Status::not_supported("rotary: the CUDA back end takes head dims up to 1536; got " +
                                   std::to_string(D));
    }
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return launched(call, cuda::rotary(options_.compute_dtype, p.qkv.data, B, L, H, D, p.base,
                                       p.inverse, stream_));
  }

  Status prepare_index(BlockSparseIndex* index) override {
    if (index == nullptr) return Status::invalid_argument("prepare_index: index is null");
    if (index->device != nullptr) return Status::ok_status();
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    Status s = upload_block_sparse_index(index, options_.device);
    if (!s.ok()) return Status(s.code(), "prepare_index: uploading the index: " + s.message());
    return Status::ok_status();
  }

  Status attention_forward(const AttentionParams& p) override {
    const char* call = "attention_forward";
    Shape s;
    SCIATTN_TRY(attention_tensors(call, p.index, p.qkv, p.out, p.lse, &s));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const BlockSparseIndex* index = nullptr;
    SCIATTN_TRY(device_index(call, p.index, &index));
    // Padded: copies of qkv and out with Lp rows per sequence at the start of the scratch.
    const size_t es = dtype_size(act());
    const size_t qkv_bytes = s.padded() ? static_cast<size_t>(s.B * s.Lp * 3 * s.C) * es : 0;
    const size_t out_bytes = s.padded() ? static_cast<size_t>(s.B * s.Lp * s.C) * es : 0;
    const size_t copies = align_up(qkv_bytes) + align_up(out_bytes);
    auto build = [&]() {
      std::byte* base = static_cast<std::byte*>(scratch_);
      SparseAttentionForwardParams op;
      op.index = index;
      op.options.causal = true;
      void* qkv = s.padded() ? base : p.qkv.data;
      void* out = s.padded() ? base + align_up(qkv_bytes) : p.out.data;
      set_qkv_views(&op.q, &op.k, &op.v, qkv, s);
      op.out = bhld(out, s, s.C);
      op.lse = TensorView::contiguous(p.lse.data, DType::kF32, {s.B, s.H, s.Lp}, Device::kCuda);
      return op;
    };
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    SparseAttentionForwardParams op;
    SCIATTN_TRY(size_attention_scratch(build, copies, &op, &workspace, &workspace_bytes));
    if (s.padded()) SCIATTN_TRY(pad_rows(call, scratch_, p.qkv.data, s, 3 * s.C));
    SCIATTN_TRY(run(op, workspace, workspace_bytes, Stream{stream_}));
    if (s.padded()) {
      SCIATTN_TRY(
          launched(call, cuda::copy_rows(p.out.data, s.L * s.C * int64(es), s.C * int64(es),
                                         static_cast<std::byte*>(scratch_) + align_up(qkv_bytes),
                                         s.Lp * s.C * int64(es), s.C * int64(es), s.B, s.L, s.L,
                                         s.C * int64(es), stream_)));
    }
    return Status::ok_status();
  }

  Status attention_backward(const AttentionBackwardParams& p) override {
    const char* call = "attention_backward";
    Shape s;
    SCIATTN_TRY(attention_tensors(call, p.index, p.qkv, p.out, p.lse, &s));
    SCIATTN_TRY(check(call, p.dout, "dout", act(), {s.B, s.L, s.H, s.D}));
    SCIATTN_TRY(check(call, p.dqkv, "dqkv", act(), {s.B, s.L, 3, s.H, s.D}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    const BlockSparseIndex* index = nullptr;
    SCIATTN_TRY(device_index(call, p.index, &index));
    // The op's outputs may not share address ranges, so dq, dk and dv are formed in three
    // [B, Lp, C] buffers and interleaved into dqkv afterwards. Padded, copies of qkv, out and
    // dout with Lp rows per sequence come first.
    const size_t es = dtype_size(act());
    const size_t n3 = align_up(static_cast<size_t>(s.B * s.Lp * 3 * s.C) * es);
    const size_t n1 = align_up(static_cast<size_t>(s.B * s.Lp * s.C) * es);
    const size_t copies = s.padded() ? n3 + 2 * n1 : 0;
    const size_t region = copies + 3 * n1;
    auto build = [&]() {
      std::byte* base = static_cast<std::byte*>(scratch_);
      SparseAttentionBackwardParams op;
      op.index = index;
      op.options.causal = true;
      void* qkv = s.padded() ? base : p.qkv.data;
      void* out = s.padded() ? base + n3 : p.out.data;
      void* dout = s.padded() ? base + n3 + n1 : p.dout.data;
      set_qkv_views(&op.q, &op.k, &op.v, qkv, s);
      op.dq = bhld(base + copies, s, s.C);
      op.dk = bhld(base + copies + n1, s, s.C);
      op.dv = bhld(base + copies + 2 * n1, s, s.C);
      op.out = bhld(out, s, s.C);
      op.dout = bhld(dout, s, s.C);
      op.lse = TensorView::contiguous(p.lse.data, DType::kF32, {s.B, s.H, s.Lp}, Device::kCuda);
      return op;
    };
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    SparseAttentionBackwardParams op;
    SCIATTN_TRY(size_attention_scratch(build, region, &op, &workspace, &workspace_bytes));
    std::byte* base = static_cast<std::byte*>(scratch_);
    if (s.padded()) {
      SCIATTN_TRY(pad_rows(call, base, p.qkv.data, s, 3 * s.C));
      SCIATTN_TRY(pad_rows(call, base + n3, p.out.data, s, s.C));
      SCIATTN_TRY(pad_rows(call, base + n3 + n1, p.dout.data, s, s.C));
    }
    SCIATTN_TRY(run(op, workspace, workspace_bytes, Stream{stream_}));
    const int64_t row = s.C * int64(es);
    for (int64_t part = 0; part < 3; ++part) {
      SCIATTN_TRY(launched(
          call, cuda::copy_rows(static_cast<std::byte*>(p.dqkv.data) + part * row, s.L * 3 * row,
                                3 * row, base + copies + static_cast<size_t>(part) * n1, s.Lp * row,
                                row, s.B, s.L, s.L, row, stream_)));
    }
    return Status::ok_status();
  }

  Status add(const AddParams& p) override {
    const char* call = "add";
    const int64_t N = rows_of(p.a), C = cols_of(p.a);
    SCIATTN_TRY(check(call, p.a, "a", act(), {N, C}));
    SCIATTN_TRY(check(call, p.b, "b", act(), {N, C}));
    SCIATTN_TRY(check(call, p.out, "out", act(), {N, C}));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return launched(
        call, cuda::add(options_.compute_dtype, p.out.data, p.a.data, p.b.data, N * C, stream_));
  }

  // The layout copies of Ulysses sequence parallelism (gpt.h), on the back end's stream.
  Status strided_copy(const StridedCopyParams& p) override {
    SCIATTN_TRY(check_strided_copy(p, Device::kCuda, "CUDA memory for the CUDA back end"));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    return launched("strided_copy",
                    cuda::strided_copy(p.dst.data, p.dst.strides, p.src.data, p.src.strides,
                                       p.src.sizes, p.src.rank, dtype_size(p.src.dtype), stream_));
  }

  Status lm_head_loss(const LmHeadParams& p) override {
    const char* call = "lm_head_loss";
    const int64_t N = rows_of(p.in), C = cols_of(p.in), V = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", act(), {V, C}));
    SCIATTN_TRY(check(call, p.losses, "losses", DType::kF32, {N}));
    SCIATTN_TRY(check_tile(call, p.tile_rows));
    SCIATTN_TRY(check(call, p.logits, "logits", act(), {p.tile_rows, V}));
    SCIATTN_TRY(check_targets(call, p.targets));
    const bool grad = p.din.present() || p.dweight.present();
    if (grad) {
      SCIATTN_TRY(check(call, p.din, "din", act(), {N, C}));
      SCIATTN_TRY(check(call, p.dweight, "dweight", DType::kF32, {V, C}));
    }
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    token_vocab_[kLmHead] = V;
    const int64_t chunk = options_.token_chunk;
    for (int64_t t0 = 0; t0 < N; t0 += p.tile_rows) {
      const int64_t tile = std::min(p.tile_rows, N - t0);
      for (int64_t r0 = t0; r0 < t0 + tile; r0 += chunk) {
        const int64_t rows = std::min(chunk, t0 + tile - r0);
        void* logits = at(p.logits, (r0 - t0) * V);
        SCIATTN_TRY(lm_chunk(call, p.in, p.weight, p.targets, logits, r0, rows, C, V,
                             static_cast<float*>(p.losses.data) + r0, p.grad_scale, grad,
                             grad ? at(p.din, r0 * C) : nullptr, grad ? p.dweight.data : nullptr));
      }
    }
    return Status::ok_status();
  }

  Status lm_head_forward(const LmHeadForwardParams& p) override {
    const char* call = "lm_head_forward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in), V = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", act(), {V, C}));
    SCIATTN_TRY(check(call, p.losses, "losses", DType::kF32, {N}));
    SCIATTN_TRY(check(call, p.logits, "logits", act(), {N, V}));
    SCIATTN_TRY(check_targets(call, p.targets));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    token_vocab_[kLmHead] = V;
    for (int64_t r0 = 0; r0 < N; r0 += options_.token_chunk) {
      const int64_t rows = std::min(options_.token_chunk, N - r0);
      SCIATTN_TRY(lm_chunk(call, p.in, p.weight, p.targets, at(p.logits, r0 * V), r0, rows, C, V,
                           static_cast<float*>(p.losses.data) + r0, 1.0f, false, nullptr, nullptr));
    }
    return Status::ok_status();
  }

  Status lm_head_backward(const LmHeadBackwardParams& p) override {
    const char* call = "lm_head_backward";
    const int64_t N = rows_of(p.in), C = cols_of(p.in), V = rows_of(p.weight);
    SCIATTN_TRY(check(call, p.in, "in", act(), {N, C}));
    SCIATTN_TRY(check(call, p.weight, "weight", act(), {V, C}));
    SCIATTN_TRY(check(call, p.logits, "logits", act(), {N, V}));
    SCIATTN_TRY(check(call, p.din, "din", act(), {N, C}));
    SCIATTN_TRY(check(call, p.dweight, "dweight", DType::kF32, {V, C}));
    SCIATTN_TRY(check_targets(call, p.targets));
    DeviceGuard guard(options_.device);
    SCIATTN_TRY(guard.status());
    token_vocab_[kLmHead] = V;
    for (int64_t r0 = 0; r0 < N; r0 += options_.token_chunk) {
      const int64_t rows = std::min(options_.token_chunk, N - r0);
      void* logits = at(p.logits, r0 * V);
      SCIATTN_TRY(launched(
          call, cuda::cross_entropy(options_.compute_dtype, logits, nullptr, p.targets + r0, rows,
                                    V, p.grad_scale, true, bad_tokens_ + kLmHead, stream_)));
      SCIATTN_TRY(lm_backward_chunk(p.in, p.weight, logits, r0, rows, C, V, at(p.din, r0 * C),
                                    p.dweight.data));
    }
    return Status::ok_status();
  }

 private:
  using Shape = AttentionShape;
  struct UploadedIndex {
    BlockSparseIndex index;
    int64_t block, heads, rows, cols, nnz;
  };

  static int64_t int64(size_t x) { return static_cast<int64_t>(x); }
  DType act() const { return options_.compute_dtype; }

  // The address of element `offset` of a view.
  void* at(const TensorView& t, int64_t offset) const {
    return static_cast<std::byte*>(t.data) + offset * int64(dtype_size(t.dtype));
  }

  // A packed CUDA tensor of exactly these sizes and this dtype.
  Status check(const char* call, const TensorView& t, const char* name, DType dtype,
               std::initializer_list<int64_t> sizes) const {
    const TensorRule rule{Device::kCuda, "CUDA memory for the CUDA back end", dtype,
                          dtype_context_.c_str()};
    return check_packed(call, t, name, rule, sizes);
  }

  static Status check_tokens(const char* call, const int32_t* tokens, int64_t B, int64_t L) {
    if (tokens == nullptr) return Status::invalid_argument(std::string(call) + ": tokens missing");
    if (B < 0 || L < 0) {
      return Status::invalid_argument(std::string(call) + ": batch and seq_len must be >= 0; got " +
                                      std::to_string(B) + " and " + std::to_string(L));
    }
    return Status::ok_status();
  }
  static Status check_targets(const char* call, const int32_t* targets) {
    if (targets == nullptr) {
      return Status::invalid_argument(std::string(call) + ": targets missing");
    }
    return Status::ok_status();
  }
  Status check_tile(const char* call, int64_t tile_rows) const {
    if (tile_rows < 1 || tile_rows % options_.token_chunk != 0) {
      return Status::invalid_argument(std::string(call) + ": tile_rows (" +
                                      std::to_string(tile_rows) +
                                      ") must be a positive multiple of the token chunk (" +
                                      std::to_string(options_.token_chunk) + ")");
    }
    return Status::ok_status();
  }

  // A launch's error as a Status naming the call.
  static Status launched(const char* call, cudaError_t e) {
    if (e == cudaSuccess) return Status::ok_status();
    if (e == cudaErrorInvalidValue) {
      return Status(StatusCode::kInternal,
                    std::string(call) + ": a kernel was launched with an invalid argument (" +
                        cudaGetErrorString(e) + ")");
    }
    return device_status(e, std::string(call) + ": launch");
  }

  // One product on cuBLASLt (see MatmulShape): D [m, n] (column-major, ldd) = op(A) op(B) +
  // beta D (+ bias), A and B in the compute dtype, D in d_dtype.
  Status product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                 int64_t lda, const void* b, int64_t ldb, void* d, int64_t ldd, DType d_dtype,
                 const void* bias, float beta) {
    MatmulShape shape;
    shape.trans_a = trans_a;
    shape.trans_b = trans_b;
    shape.m = m;
    shape.n = n;
    shape.k = k;
    shape.lda = lda;
    shape.ldb = ldb;
    shape.ldd = ldd;
    shape.ab_dtype = act();
    shape.d_dtype = d_dtype;
    shape.bias = bias != nullptr;
    return matmul_.run(shape, a, b, d, bias, beta, matmul_workspace_,
                       options_.matmul_workspace_bytes, stream_);
  }

  // Rows [r0, r0 + rows) of the LM head: logits, cross-entropy (losses, and dlogits in place
  // with grad), then din and dweight.
  Status lm_chunk(const char* call, const TensorView& in, const TensorView& weight,
                  const int32_t* targets, void* logits, int64_t r0, int64_t rows, int64_t C,
                  int64_t V, float* losses, float grad_scale, bool grad, void* din, void* dweight) {
    // logits [rows, V] = in_chunk W^T: m = V, n = rows, k = C.
    SCIATTN_TRY(product(true, false, V, rows, C, weight.data, C, at(in, r0 * C), C, logits, V,
                        act(), nullptr, 0.0f));
    SCIATTN_TRY(launched(
        call, cuda::cross_entropy(options_.compute_dtype, logits, losses, targets + r0, rows, V,
                                  grad_scale, grad, bad_tokens_ + kLmHead, stream_)));
    if (!grad) return Status::ok_status();
    return lm_backward_chunk(in, weight, logits, r0, rows, C, V, din, dweight);
  }

  // din_chunk [rows, C] = dlogits W (m = C, n = rows, k = V); dW [V, C] += dlogits^T in_chunk
  // (column-major dW^T = in_chunk^T dlogits: m = C, n = V, k = rows).
  Status lm_backward_chunk(const TensorView& in, const TensorView& weight, const void* dlogits,
                           int64_t r0, int64_t rows, int64_t C, int64_t V, void* din,
                           void* dweight) {
    SCIATTN_TRY(product(false, false, C, rows, V, weight.data, C, dlogits, V, din, C, act(),
                        nullptr, 0.0f));
    return product(false, true, C, V, rows, at(in, r0 * C), C, dlogits, V, dweight, C, DType::kF32,
                   nullptr, 1.0f);
  }

  // The shared geometry checks (backend_checks.h), then qkv, out and lse as packed CUDA tensors.
  Status attention_tensors(const char* call, const BlockSparseIndex* index, const TensorView& qkv,
                           const TensorView& out, const TensorView& lse, Shape* s) const {
    SCIATTN_TRY(attention_shape(call, index, qkv, s));
    SCIATTN_TRY(check(call, qkv, "qkv", act(), {s->B, s->L, 3, s->H, s->D}));
    SCIATTN_TRY(check(call, out, "out", act(), {s->B, s->L, s->H, s->D}));
    SCIATTN_TRY(check(call, lse, "lse", DType::kF32, {s->B, s->H, s->Lp}));
    return Status::ok_status();
  }

  // The index the op reads: the caller's when it is uploaded, else the back end's uploaded copy
  // for that address (made on first use).
  Status device_index(const char* call, const BlockSparseIndex* index,
                      const BlockSparseIndex** out) {
    if (index->device != nullptr) {
      *out = index;
      return Status::ok_status();
    }
    auto it = indexes_.find(index);
    const bool same = it != indexes_.end() && it->second->block == index->block &&
                      it->second->heads == index->num_heads &&
                      it->second->rows == index->num_row_blocks &&
                      it->second->cols == index->num_col_blocks && it->second->nnz == index->nnz;
    if (!same) {
      auto copy = std::make_unique<UploadedIndex>();
      copy->index = *index;
      copy->block = index->block;
      copy->heads = index->num_heads;
      copy->rows = index->num_row_blocks;
      copy->cols = index->num_col_blocks;
      copy->nnz = index->nnz;
      Status s = upload_block_sparse_index(&copy->index, options_.device);
      if (!s.ok()) return Status(s.code(), std::string(call) + ": uploading index: " + s.message());
      it = indexes_.insert_or_assign(index, std::move(copy)).first;
    }
    *out = &it->second->index;
    return Status::ok_status();
  }

  // [B, H, Lp, D] views of q, k, v inside a packed [B, Lp, 3, H, D] buffer.
  void set_qkv_views(TensorView* q, TensorView* k, TensorView* v, void* qkv, const Shape& s) const {
    const int64_t row = 3 * s.C;
    const int64_t es = int64(dtype_size(act()));
    std::byte* base = static_cast<std::byte*>(qkv);
    *q = TensorView::strided(base, act(), {s.B, s.H, s.Lp, s.D}, {s.Lp * row, s.D, row, 1},
                             Device::kCuda);
    *k = TensorView::strided(base + s.C * es, act(), {s.B, s.H, s.Lp, s.D},
                             {s.Lp * row, s.D, row, 1}, Device::kCuda);
    *v = TensorView::strided(base + 2 * s.C * es, act(), {s.B, s.H, s.Lp, s.D},
                             {s.Lp * row, s.D, row, 1}, Device::kCuda);
  }
  // A [B, H, Lp, D] view of a [B, Lp, H, D] buffer with `row` elements per token.
  TensorView bhld(void* data, const Shape& s, int64_t row) const {
    return TensorView::strided(data, act(), {s.B, s.H, s.Lp, s.D}, {s.Lp * row, s.D, row, 1},
                               Device::kCuda);
  }
  // Copies [B, L, row] into [B, Lp, row] with zero rows appended.
  Status pad_rows(const char* call, void* dst, const void* src, const Shape& s, int64_t row) {
    const int64_t bytes = row * int64(dtype_size(act()));
    return launched(call, cuda::copy_rows(dst, s.Lp * bytes, bytes, src, s.L * bytes, bytes, s.B,
                                          s.Lp, s.L, bytes, stream_));
  }

  // Places the op's workspace after `reserved` bytes of the scratch and grows the scratch to
  // hold both. The op's views point into the scratch, so it is built, sized, and built again
  // once the scratch has its final address; nothing has been written to the scratch yet.
  template <class Build, class Op>
  Status size_attention_scratch(Build build, size_t reserved, Op* op, void** workspace,
                                size_t* workspace_bytes) {
    SCIATTN_TRY(ensure_scratch(std::max<size_t>(reserved, 1)));
    *op = build();
    const size_t ws = workspace_size(*op);
    SCIATTN_TRY(ensure_scratch(reserved + ws));
    *op = build();
    std::string why;
    const Status can = can_implement(*op, &why);
    if (!can.ok()) {
      // A build without the kernel for this head dim or dtype says so (kNotSupported); any
      // other rejection is the back end's mistake.
      return Status(can.code() == StatusCode::kNotSupported ? can.code() : StatusCode::kInternal,
                    "the attention op rejected the trainer's call: " + why);
    }
    *workspace = static_cast<std::byte*>(scratch_) + reserved;
    *workspace_bytes = scratch_bytes_ - reserved;
    return Status::ok_status();
  }

  // Grows the scratch to `bytes` (its contents are not kept: callers size it before writing).
  Status ensure_scratch(size_t bytes) {
    if (bytes <= scratch_bytes_) return Status::ok_status();
    SCIATTN_TRY(device_status(cudaStreamSynchronize(stream_), "growing the scratch"));
    cudaFree(scratch_);
    device_bytes_ -= scratch_bytes_;
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    const size_t rounded = align_up(bytes);
    const cudaError_t e = cudaMalloc(&scratch_, rounded);
    if (e != cudaSuccess) {
      cudaGetLastError();
      scratch_ = nullptr;
      return Status(StatusCode::kDeviceError, "cannot allocate " + std::to_string(rounded) +
                                                  " bytes of scratch: " + cudaGetErrorString(e));
    }
    scratch_bytes_ = rounded;
    count_device_bytes(rounded);
    return Status::ok_status();
  }

  // Device bytes now held, and the peak.
  void count_device_bytes(size_t added) {
    device_bytes_ += added;
    peak_device_bytes_ = std::max(peak_device_bytes_, device_bytes_);
  }

  // Zeroes page-locked memory; large buffers (checkpoints of long sequences: tens of GiB) with a
  // few threads, since one thread writes about 10 GB/s.
  static void zero_host(void* ptr, size_t bytes) {
    constexpr size_t kPerThread = size_t{1} << 30;
    const size_t threads = std::min<size_t>(
        std::max<size_t>(1, std::thread::hardware_concurrency()), bytes / kPerThread + 1);
    if (threads <= 1) {
      std::memset(ptr, 0, bytes);
      return;
    }
    const size_t part = (bytes + threads - 1) / threads;
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t) {
      const size_t begin = t * part, end = std::min(bytes, begin + part);
      if (begin >= end) break;
      pool.emplace_back([=] { std::memset(static_cast<std::byte*>(ptr) + begin, 0, end - begin); });
    }
    for (std::thread& t : pool) t.join();
  }

  // The event of a ticket: null for "no copy"; a later copy's event when the ticket's slot has
  // been reused (copies of one direction finish in order, so that one finishing implies it).
  Status ticket_event(const char* call, const CopyTicket& ticket, cudaEvent_t* out) const {
    *out = nullptr;
    if (ticket.id == 0) return Status::ok_status();
    const int d = ticket.direction == CopyDirection::kToHost ? 0 : 1;
    const size_t slot = static_cast<size_t>(ticket.id % kCopyEvents);
    if (ticket.id > copy_ids_[d] || copy_event_ids_[d][slot] < ticket.id) {
      return Status::invalid_argument(std::string(call) + ": ticket " + std::to_string(ticket.id) +
                                      " was not issued here");
    }
    *out = copy_events_[d][slot];
    return Status::ok_status();
  }

  // Every slot back to "nothing seen" (all bits set: larger than any position << 32 | id).
  Status reset_token_checks() {
    return device_status(
        cudaMemsetAsync(bad_tokens_, 0xff, kTokenChecks * sizeof(unsigned long long), stream_),
        "resetting the token check");
  }

  // After the stream has finished: the first bad token id a call reported, as an error.
  Status check_tokens_reported() {
    unsigned long long seen[kTokenChecks];
    SCIATTN_TRY(device_status(cudaMemcpy(seen, bad_tokens_, sizeof seen, cudaMemcpyDeviceToHost),
                              "token check"));
    for (int i = 0; i < kTokenChecks; ++i) {
      if (seen[i] == ~0ull) continue;
      const int64_t position = static_cast<int64_t>(seen[i] >> 32);
      const int32_t id = static_cast<int32_t>(static_cast<uint32_t>(seen[i] & 0xffffffffu));
      SCIATTN_TRY(reset_token_checks());
      SCIATTN_TRY(device_status(cudaStreamSynchronize(stream_), "resetting the token check"));
      return Status::invalid_argument(std::string(kTokenCheckNames[i]) + ": id " +
                                      std::to_string(id) + " at position " +
                                      std::to_string(position) + " is outside the vocabulary [0, " +
                                      std::to_string(token_vocab_[i]) + ")");
    }
    return Status::ok_status();
  }

  CudaBackendOptions options_;
  // The words after a required dtype in check()'s messages, formed once.
  std::string dtype_context_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  Matmul matmul_;
  void* matmul_workspace_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  unsigned long long* bad_tokens_ = nullptr;  // [kTokenChecks] device
  void* norm_workspace_ = nullptr;
  size_t norm_workspace_bytes_ = 0;
  std::map<void*, size_t> allocations_;  // allocate()'s, for the byte count
  uint64_t device_bytes_ = 0, peak_device_bytes_ = 0;
  // Copy streams and events, [0] device to host, [1] host to device.
  static constexpr uint64_t kCopyEvents = 256;
  std::array<cudaStream_t, 2> copy_streams_{};
  cudaEvent_t compute_done_ = nullptr;
  std::array<std::array<cudaEvent_t, kCopyEvents>, 2> copy_events_{};
  std::array<std::array<uint64_t, kCopyEvents>, 2> copy_event_ids_{};
  std::array<uint64_t, 2> copy_ids_{};
  int64_t token_vocab_[kTokenChecks] = {};
  std::map<const BlockSparseIndex*, std::unique_ptr<UploadedIndex>> indexes_;
};

}  // namespace

Status make_cuda_backend(const CudaBackendOptions& options, std::unique_ptr<CudaBackend>* out) {
  if (out == nullptr) return Status::invalid_argument("make_cuda_backend: out is null");
  out->reset();
  const DType t = options.compute_dtype;
  if (t != DType::kBF16 && t != DType::kF16 && t != DType::kF32) {
    return Status::invalid_argument(std::string("compute_dtype must be bf16, f16 or f32; got ") +
                                    dtype_name(t));
  }
  // The largest chunk keeps the column sums' groups within one grid dimension.
  constexpr int64_t kMaxChunk = int64_t{1} << 22;
  if (options.token_chunk < 8 || options.token_chunk % 8 != 0 || options.token_chunk > kMaxChunk) {
    return Status::invalid_argument("token_chunk must be a positive multiple of 8 up to " +
                                    std::to_string(kMaxChunk) + "; got " +
                                    std::to_string(options.token_chunk));
  }
  if (options.matmul_workspace_bytes < (size_t{1} << 20)) {
    return Status::invalid_argument("matmul_workspace_bytes must be at least 1 MiB; got " +
                                    std::to_string(options.matmul_workspace_bytes));
  }
  const int devices = cuda_device_count();
  if (options.device < 0 || options.device >= devices) {
    return Status::not_supported("no CUDA device " + std::to_string(options.device) +
                                 " (this machine has " + std::to_string(devices) + ")");
  }
  auto backend = std::make_unique<CudaBackendImpl>(options);
  SCIATTN_TRY(backend->init());
  *out = std::move(backend);
  return Status::ok_status();
}

Status cuda_device_memory(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
  *free_bytes = 0;
  *total_bytes = 0;
  const int devices = cuda_device_count();
  if (device < 0 || device >= devices) {
    return Status::not_supported("no CUDA device " + std::to_string(device) +
                                 " (this machine has " + std::to_string(devices) + ")");
  }
  DeviceGuard guard(device);
  SCIATTN_TRY(guard.status());
  size_t free = 0, total = 0;
  SCIATTN_TRY(device_status(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
  *free_bytes = free;
  *total_bytes = total;
  return Status::ok_status();
}

Status make_cuda_backend(const CudaBackendOptions& options, std::unique_ptr<Backend>* out) {
  if (out == nullptr) return Status::invalid_argument("make_cuda_backend: out is null");
  std::unique_ptr<CudaBackend> backend;
  Status s = make_cuda_backend(options, &backend);
  *out = std::move(backend);
  return s;
}

}  // namespace sciattn::train
