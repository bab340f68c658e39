// Device buffers for the CUDA benchmarks (bench layer): cudaMalloc'd, filled on the host with
// pseudo-random values and copied once, freed on destruction. The host fill runs in parallel over
// fixed chunks of 1 Mi elements, each from its own generator seeded by (seed, chunk), so the values
// do not depend on the number of threads. (One generator element by element took 4.3 s for each
// 134 M-element bf16 tensor of a 65,536-token, D = 128 row on the 2-core development machine:
// four inputs per row, so most of a row's wall time and of the device time a benchmark run costs.)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "sciattn/dtype.h"

namespace sciattn::bench {

// What a buffer holds: nothing written (outputs), standard normal values, or a mask bias of 0
// with 10% -1e9 (OpenFold's mask convention).
enum class Fill { kNone, kNormal, kMask };

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  cudaError_t error = cudaSuccess;

  DeviceBuffer(size_t count, DType dtype, uint64_t seed, Fill fill = Fill::kNormal)
      : bytes(count * dtype_size(dtype)) {
    if (bytes == 0) return;
    error = cudaMalloc(&ptr, bytes);
    if (error != cudaSuccess) {
      ptr = nullptr;
      cudaGetLastError();
      return;
    }
    if (fill == Fill::kNone) return;
    std::vector<std::byte> host(bytes);
    constexpr size_t kChunk = size_t{1} << 20;
    const size_t chunks = (count + kChunk - 1) / kChunk;
    auto fill_chunks = [&](size_t first, size_t step) {
      for (size_t c = first; c < chunks; c += step) {
        std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + c);
        std::normal_distribution<float> normal;
        std::uniform_real_distribution<float> uniform;
        for (size_t i = c * kChunk; i < std::min(count, (c + 1) * kChunk); ++i) {
          const float v = fill == Fill::kMask ? (uniform(rng) < 0.1f ? -1e9f : 0.0f) : normal(rng);
          store_from_float(host.data(), dtype, static_cast<int64_t>(i), v);
        }
      }
    };
    const size_t threads =
        std::min<size_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (size_t w = 1; w < threads; ++w) pool.emplace_back(fill_chunks, w, threads);
    fill_chunks(0, threads);
    for (std::thread& th : pool) th.join();
    error = cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
};

}  // namespace sciattn::bench
