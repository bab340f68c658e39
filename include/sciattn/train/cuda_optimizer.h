// The optimizer step's kernels on the GPU, over the flat fp32 buffers of the trainer (master
// weights, gradients, AdamW's m and v): AdamW writing the 16-bit compute copy, the global
// gradient norm, unscaling with the fp16 overflow check, and casts. Public API of the trainer
// (plain C++17; no CUDA headers). Every pointer is CUDA memory of the stream's device; work is
// queued on `stream` (a cudaStream_t; null is the default stream). In a build without CUDA each
// function returns kNotSupported.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sciattn/device.h"
#include "sciattn/dtype.h"
#include "sciattn/status.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/gradients.h"

namespace sciattn::train {

// cpu_adamw_step / cpu_adamw_step_copy on the GPU, with the same order of operations and one
// rounding each (no contracted multiply-add), so the results equal the CPU's bit for bit. The
// step's constants are formed on the host as the CPU forms them. param_copy may be null (no
// copy); otherwise n elements of copy_dtype (kF16 or kBF16), rounded to nearest even. Returns
// after queueing. Fails, naming the argument, as the CPU functions do.
Status cuda_adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale, float* params,
                       const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                       void* param_copy, DType copy_dtype, Stream stream);

// Bytes of device workspace cuda_sum_squares and cuda_unscale_and_check need for n elements.
size_t cuda_sum_squares_workspace(int64_t n);

// sum_squares (gradients.h) on the GPU, with the CPU's formula: each chunk of kNormChunk elements
// summed in fp64 (a fixed tree order inside the chunk instead of the CPU's sequential one), the
// chunks' partial sums added in fp64 in a fixed order, and whether every element is finite.
// Deterministic; equal to the CPU's to fp64 rounding (relative 1e-15 or so). Waits for the
// stream (the caller needs the result on the host) and writes *out.
Status cuda_sum_squares(const float* data, int64_t n, void* workspace, size_t workspace_bytes,
                        Stream stream, SumSquares* out);

// data[i] *= factor, queued (scale_in_place on the GPU: one rounding, the CPU's bits).
Status cuda_scale_in_place(float* data, int64_t n, float factor, Stream stream);

// The fp16 gradient check and unscale in one pass ("ds_enhanced" order on one rank): *overflow
// tells whether any element was Inf or NaN before scaling; every element is multiplied by factor
// (on overflow the step is skipped and the buffer's values do not matter). Waits for the stream.
Status cuda_unscale_and_check(float* data, int64_t n, float factor, void* workspace,
                              size_t workspace_bytes, Stream stream, bool* overflow);

// dst = src converted, n elements; f32 <-> f16 / bf16 (and a plain copy for equal dtypes),
// rounding to nearest even as store_from_float does. Queued.
Status cuda_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                 Stream stream);

}  // namespace sciattn::train
