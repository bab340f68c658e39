// Host emulation of the CUDA features the fused sparse attention and Evoformer kernels use (test
// layer, a developer tool): one CTA (or cluster) at a time, its blockDim.x (up to 256) threads as
// cooperative user-level threads on the calling thread (emu_fibers.h), barriers for __syncthreads
// and the warp collectives (__shfl_xor_sync, mma.sync m16n8k16 with the PTX
// fragment layout, ldmatrix), synchronous cp.async with zero fill, ex2.approx.ftz, and Hopper's
// warpgroup MMA (wgmma.mma_async, completing at issue) reading its shared-memory operands through
// their matrix descriptors and swizzle modes as the PTX ISA defines them. The operand alignment
// the hardware requires (cp.async: both addresses to the copy size; ldmatrix: each row address to
// 16 bytes) is checked, and a violation stops the run as the GPU would; so is a wgmma operand
// read outside the launch's shared memory. Thread-block clusters run their CTAs at once, each with
// its own shared memory, a cluster barrier and stores into a partner CTA's shared memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <driver_types.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "emu_fibers.h"

// Kernels are plain functions and shared memory plain storage here (replacing the CUDA headers'
// host definitions of these keywords).
#undef __global__
#undef __launch_bounds__
#undef __shared__
#undef __align__
#define __global__
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct EmuDim {
  unsigned x = 0, y = 0, z = 0;
};
inline EmuDim threadIdx, blockIdx;  // the running fiber's (set at each switch)
inline EmuDim blockDim{128, 1, 1}, gridDim{1, 1, 1};

namespace emu {
constexpr int kMaxWarps = 8;
constexpr int kMaxClusterCtas = 2;

// cp.async: immediate copies by default (the earliest a copy can land), or, with `defer` (the
// EMU_DEFER environment variable), held back until the cp.async.wait_group that must complete
// them (the latest it can land), so that a read before its wait sees stale shared memory.
inline bool defer = false;
struct PendingCopy {
  void* dst;
  const void* src;
  int size, bytes, group;
};

// The emulated threads of the running cluster are fibers (emu_fibers.h), all run by the launching
// thread; each has its thread index, its CTA's rank in the cluster, and its cp.async groups.
struct ThreadState {
  unsigned thread = 0;
  int rank = 0;
  std::vector<PendingCopy> pending;
  int group_id = 0;
};
inline std::vector<ThreadState> thread_states(static_cast<size_t>(32 * kMaxWarps *
                                                                  kMaxClusterCtas));
inline ThreadState* running = nullptr;
inline ThreadState& fiber() {
  return *running;
}

// One CTA of the running cluster (a launch without clusters runs one CTA at a time): its barriers,
// the staging its warp collectives exchange through, and its shared memory.
struct CtaState {
  Barrier block_bar;
  Barrier warp_bar[kMaxWarps];
  float shfl_buf[kMaxWarps][32];
  uint32_t a_buf[kMaxWarps][32][4], b_buf[kMaxWarps][32][2];
  const void* row_buf[kMaxWarps][32];
  unsigned char* shared_base = nullptr;
};
inline CtaState cta_states[kMaxClusterCtas];
inline int cta_rank = 0;  // the running fiber's CTA in its cluster (set at each switch)
inline CtaState& cta() {
  return cta_states[cta_rank];
}
inline Barrier cluster_bar;  // every thread of the running cluster

// Stops the run when `address` is not a multiple of `alignment` (cudaErrorMisalignedAddress on
// the GPU).
inline void require_aligned(const void* address, int alignment, const char* what) {
  if (reinterpret_cast<uintptr_t>(address) % static_cast<uintptr_t>(alignment) != 0) {
    std::fprintf(stderr, "emulator: misaligned %s address %p (needs %d-byte alignment)\n", what,
                 address, alignment);
    std::abort();
  }
}

inline void copy_now(const PendingCopy& c) {
  if (c.bytes > 0) std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
  if (c.bytes < c.size) {
    std::memset(static_cast<char*>(c.dst) + c.bytes, 0, static_cast<size_t>(c.size - c.bytes));
  }
}
inline void cp_async(void* dst, const void* src, int size, int bytes) {
  require_aligned(dst, size, "cp.async shared");
  require_aligned(src, size, "cp.async global");
  const PendingCopy c{dst, src, size, bytes, fiber().group_id};
  if (defer) {
    fiber().pending.push_back(c);
  } else {
    copy_now(c);
  }
}
// ex2.approx.ftz.f32: 2^x with results below 2^-126 flushed to +0 (the host's exp2f is exact to
// within the instruction's 2 ulp).
inline float ex2_approx_ftz(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}
inline void cp_async_commit() {
  ++fiber().group_id;
}
// Completes every committed group except the newest n.
inline void cp_async_wait(int n) {
  std::vector<PendingCopy>& pending = fiber().pending;
  std::vector<PendingCopy> keep;
  for (const PendingCopy& c : pending) {
    if (c.group < fiber().group_id - n) {
      copy_now(c);
    } else {
      keep.push_back(c);
    }
  }
  pending.swap(keep);
}

template <typename T>
inline float half_bits(uint16_t bits);
template <>
inline float half_bits<__half>(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}
template <>
inline float half_bits<__nv_bfloat16>(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The 16 x 16 A operand of warp w's mma.sync m16n8k16 (or its 16 rows of a wgmma with A in
// registers) from the fragments its 32 lanes left in a_buf: lane (g, t) = (l / 4, l % 4) holds
// rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9.
template <typename T>
inline void a_fragments(int w, float (&A)[16][16]) {
  for (int L = 0; L < 32; ++L) {
    const int g = L / 4, t = L % 4;
    auto put = [&](int r, int c, uint32_t v) {
      A[r][c] = half_bits<T>(static_cast<uint16_t>(v & 0xffff));
      A[r][c + 1] = half_bits<T>(static_cast<uint16_t>(v >> 16));
    };
    put(g, 2 * t, emu::cta().a_buf[w][L][0]);
    put(g + 8, 2 * t, emu::cta().a_buf[w][L][1]);
    put(g, 2 * t + 8, emu::cta().a_buf[w][L][2]);
    put(g + 8, 2 * t + 8, emu::cta().a_buf[w][L][3]);
  }
}

template <typename T>
inline void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, l = tid % 32;
  for (int i = 0; i < 4; ++i) emu::cta().a_buf[w][l][i] = a[i];
  emu::cta().b_buf[w][l][0] = b[0];
  emu::cta().b_buf[w][l][1] = b[1];
  emu::cta().warp_bar[w].arrive_and_wait();
  float A[16][16], B[16][8];
  a_fragments<T>(w, A);
  for (int L = 0; L < 32; ++L) {
    const int g = L / 4, t = L % 4;
    B[2 * t][g] = half_bits<T>(static_cast<uint16_t>(emu::cta().b_buf[w][L][0] & 0xffff));
    B[2 * t + 1][g] = half_bits<T>(static_cast<uint16_t>(emu::cta().b_buf[w][L][0] >> 16));
    B[2 * t + 8][g] = half_bits<T>(static_cast<uint16_t>(emu::cta().b_buf[w][L][1] & 0xffff));
    B[2 * t + 9][g] = half_bits<T>(static_cast<uint16_t>(emu::cta().b_buf[w][L][1] >> 16));
  }
  const int g = l / 4, t = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    float acc = c[e];
    for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][col];
    c[e] = acc;
  }
  emu::cta().warp_bar[w].arrive_and_wait();
}
// ldmatrix .x4 (optionally .trans): lane l passes the address of row l % 8 of matrix l / 8; of
// matrix i it receives elements (l / 4, 2 (l % 4) .. +1), or with kTrans (2 (l % 4) .. +1, l / 4).
template <bool kTrans>
inline void ldmatrix_x4(uint32_t r[4], const void* row) {
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, l = tid % 32;
  require_aligned(row, 16, "ldmatrix row");
  emu::cta().row_buf[w][l] = row;
  emu::cta().warp_bar[w].arrive_and_wait();
  auto element = [&](int m, int rr, int c) {
    uint16_t v;
    std::memcpy(&v, static_cast<const char*>(emu::cta().row_buf[w][m * 8 + rr]) + 2 * c, 2);
    return static_cast<uint32_t>(v);
  };
  for (int m = 0; m < 4; ++m) {
    const int g = l / 4, t = l % 4;
    r[m] = kTrans ? element(m, 2 * t, g) | (element(m, 2 * t + 1, g) << 16)
                  : element(m, g, 2 * t) | (element(m, g, 2 * t + 1) << 16);
  }
  emu::cta().warp_bar[w].arrive_and_wait();
}
// The CTA's shared memory (run_grid's buffer), so that a 32-bit shared-window address (an offset
// into it here) can be made from a pointer and turned back into one.
inline uint32_t shared_offset(const void* p) {
  return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - ::emu::cta().shared_base);
}
inline void* shared_at(uint32_t offset) {
  return ::emu::cta().shared_base + offset;
}

// Stops the run at a feature this emulation does not have.
[[noreturn]] inline void not_emulated(const char* what) {
  std::fprintf(stderr, "emulator: %s are not emulated\n", what);
  std::abort();
}

// wgmma.mma_async m64nNk16 with fp32 accumulators, for the calling thread of a warpgroup (four
// warps; warp w % 4 owns rows 16 (w % 4) .. +15 of the 64 x N result in mma.sync m16n8's
// accumulator layout, one [4] per eight columns). A shared-memory operand is read through its
// matrix descriptor: start address, leading and stride byte offsets (bits 0-13, 16-29, 32-45, each
// >> 4) and swizzle mode (bits 62-63: 1 = 128-byte, 2 = 64-byte, 3 = 32-byte). In the swizzled
// layouts a matrix is made of 8-row atoms of W-byte rows (W the swizzle width); the byte address
// of an element is computed unswizzled and then its bits 4.. (the 16-byte chunk within W) are
// XORed with its bits 7.. (the row within the atom), as the hardware does with the absolute
// shared address (the CTA's tiles are 1024-byte aligned, so offsets from the shared base do).
//  - K-major (no transpose): element (r, k) at start + (r / 8) SBO + (r % 8) W + 2 k;
//  - MN-major (transposed): element (k, c) at start + (c / (W / 2)) LBO + (k / 8) SBO
//    + (k % 8) W + 2 (c % (W / 2)).
inline size_t launch_smem_bytes = 0;  // the running launch's dynamic shared memory
struct SmemMatrix {
  uint32_t start, leading, stride, width;
};
inline SmemMatrix decode_descriptor(uint64_t desc) {
  const unsigned mode = static_cast<unsigned>(desc >> 62);
  if (mode == 0) not_emulated("wgmma descriptors without swizzle");
  if (((desc >> 49) & 7) != 0) not_emulated("wgmma descriptors with a base offset");
  return {static_cast<uint32_t>(desc & 0x3FFF) << 4,
          static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4, 256u >> mode};
}
template <typename T>
inline float smem_element(const SmemMatrix& m, bool mn_major, int row, int k) {
  // row: the M (or N) index; k: the reduction index.
  const uint32_t w = m.width;
  const uint32_t logical = mn_major ? m.start + (row / (w / 2)) * m.leading + (k / 8) * m.stride +
                                          (k % 8) * w + 2 * (row % (w / 2))
                                    : m.start + (row / 8) * m.stride + (row % 8) * w + 2 * k;
  const uint32_t address = logical ^ (((logical >> 7) & (w / 16 - 1)) << 4);
  if (address + 2 > launch_smem_bytes) {
    std::fprintf(stderr,
                 "emulator: wgmma operand read at shared offset %u, outside the %zu bytes\n",
                 address, launch_smem_bytes);
    std::abort();
  }
  uint16_t bits;
  std::memcpy(&bits, ::emu::cta().shared_base + address, 2);
  return half_bits<T>(bits);
}
template <typename T, int kN, typename AOf>
inline void wgmma_product(float (&d)[kN / 8][4], const AOf& a_of, const SmemMatrix& b, bool b_mn,
                          int accumulate) {
  const int l = static_cast<int>(threadIdx.x) % 32, wg = (static_cast<int>(threadIdx.x) / 32) % 4;
  const int g = l / 4, t = l % 4;
  for (int j = 0; j < kN / 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * wg + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
      float acc = accumulate ? d[j][e] : 0.0f;
      for (int k = 0; k < 16; ++k) acc += a_of(row, k) * smem_element<T>(b, b_mn, col, k);
      d[j][e] = acc;
    }
  }
}
// Both operands in shared memory; kTransA / kTransB: the MN-major (transposed) layouts.
template <typename T, int kN, int kTransA, int kTransB>
inline void wgmma_ss(float (&d)[kN / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  const SmemMatrix a = decode_descriptor(desc_a), b = decode_descriptor(desc_b);
  wgmma_product<T, kN>(
      d, [&](int row, int k) { return smem_element<T>(a, kTransA != 0, row, k); }, b, kTransB != 0,
      accumulate);
}
// A in registers: each warp's 16 rows as mma.sync m16n8k16 A fragments of its 32 lanes.
template <typename T, int kN, int kTransB>
inline void wgmma_rs(float (&d)[kN / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                     int accumulate) {
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, l = tid % 32;
  for (int i = 0; i < 4; ++i) emu::cta().a_buf[w][l][i] = a[i];
  emu::cta().warp_bar[w].arrive_and_wait();
  float A[16][16];
  a_fragments<T>(w, A);
  emu::cta().warp_bar[w].arrive_and_wait();
  const SmemMatrix b = decode_descriptor(desc_b);
  wgmma_product<T, kN>(
      d, [&](int row, int k) { return A[row % 16][k]; }, b, kTransB != 0, accumulate);
}

// Runs kernel(args...) on a 1-D grid of `ctas` CTAs of `threads` threads in clusters of `cluster`
// CTAs (1: one CTA at a time), the CTAs of one cluster at once, CTA rank r with the shared memory
// smem[r] (`smem_bytes`, filled with garbage before each cluster). Each cluster starts its threads
// afresh (the state a new thread has: no pending copies) with reset barriers, as fibers
// (run_fibers: a barrier some threads never reach stops the run as a deadlock).
template <typename Kernel, typename... Args>
void run_clusters(Kernel kernel, int64_t ctas, unsigned threads, int cluster,
                  unsigned char* const* smem, size_t smem_bytes, const Args&... args) {
  gridDim.x = static_cast<unsigned>(ctas);
  blockDim.x = threads;
  const int count = static_cast<int>(threads) * cluster;
  for (int64_t first = 0; first < ctas; first += cluster) {
    cluster_bar.reset(count);
    for (int r = 0; r < cluster; ++r) {
      CtaState& c = cta_states[r];
      c.shared_base = smem[r];
      std::memset(smem[r], 0xA5, smem_bytes);
      c.block_bar.reset(static_cast<int>(threads));
      for (Barrier& w : c.warp_bar) w.reset(32);
    }
    for (int i = 0; i < count; ++i) {
      ThreadState& t = thread_states[static_cast<size_t>(i)];
      t.thread = static_cast<unsigned>(i) % threads;
      t.rank = i / static_cast<int>(threads);
      t.pending.clear();
      t.group_id = 0;
    }
    const auto enter = [&](int i) {
      running = &thread_states[static_cast<size_t>(i)];
      threadIdx.x = running->thread;
      cta_rank = running->rank;
      blockIdx.x = static_cast<unsigned>(first + running->rank);
    };
    char what[64];
    std::snprintf(what, sizeof what, "CTA %lld", static_cast<long long>(first));
    run_fibers(
        count, enter, [&](int) { kernel(args...); }, what);
  }
  running = nullptr;
}
template <typename Kernel, typename... Args>
void run_grid(Kernel kernel, int64_t ctas, unsigned threads, unsigned char* smem, size_t smem_bytes,
              const Args&... args) {
  run_clusters(kernel, ctas, threads, 1, &smem, smem_bytes, args...);
}

// Thread-block clusters: the CTA's rank, the cluster barrier, and stores into another CTA's shared
// memory, whose cluster-window address carries the rank + 1 above the shared offset (bits 24..).
inline uint32_t cluster_rank() {
  return static_cast<uint32_t>(cta_rank);
}
inline void cluster_sync() {
  cluster_bar.arrive_and_wait();
}
inline uint32_t cluster_address(uint32_t address, uint32_t rank) {
  return address | ((rank + 1) << 24);
}
template <typename V>
inline void cluster_store(uint32_t address, const V& v) {
  const uint32_t rank = (address >> 24) - 1;
  if (rank >= kMaxClusterCtas) not_emulated("stores outside a cluster's shared memory");
  std::memcpy(cta_states[rank].shared_base + (address & 0xFFFFFFu), &v, sizeof v);
}

// A launch as the kernels' launchers make it (the <<<ctas, threads, smem_bytes>>> of
// evoformer_launch_impl.cuh's launch_1d, or a cluster launch of `cluster` CTAs): run_clusters on
// the emulation's shared memory buffer (launch_smem, set by the program, for rank 0; further
// ranks get buffers of the same size here), which must hold `smem_bytes`.
inline unsigned char* launch_smem = nullptr;
inline size_t launch_smem_capacity = 0;
template <typename Kernel, typename... Args>
cudaError_t launch_cluster(Kernel kernel, int64_t ctas, int threads, size_t smem_bytes, int cluster,
                           const Args&... args) {
  if (ctas == 0) return cudaSuccess;
  if (smem_bytes > launch_smem_capacity || threads > 32 * kMaxWarps || threads % 32 != 0 ||
      cluster < 1 || cluster > kMaxClusterCtas || ctas % cluster != 0) {
    std::fprintf(stderr,
                 "emulator: a launch of %lld CTAs of %d threads in clusters of %d, %zu bytes of "
                 "shared memory (at most %d threads, %d CTAs a cluster, %zu bytes here)\n",
                 static_cast<long long>(ctas), threads, cluster, smem_bytes, 32 * kMaxWarps,
                 kMaxClusterCtas, launch_smem_capacity);
    std::abort();
  }
  static std::vector<std::vector<unsigned char>> extra;  // ranks 1.., 1024-byte aligned below
  unsigned char* smem[kMaxClusterCtas] = {launch_smem};
  for (int r = 1; r < cluster; ++r) {
    if (extra.size() < static_cast<size_t>(r)) extra.emplace_back(launch_smem_capacity + 1024);
    const uintptr_t at = reinterpret_cast<uintptr_t>(extra[static_cast<size_t>(r - 1)].data());
    smem[r] = reinterpret_cast<unsigned char*>((at + 1023) & ~uintptr_t{1023});
  }
  launch_smem_bytes = smem_bytes;
  run_clusters(kernel, ctas, static_cast<unsigned>(threads), cluster, smem, launch_smem_capacity,
               args...);
  return cudaSuccess;
}
template <typename Kernel, typename... Args>
cudaError_t launch(Kernel kernel, int64_t ctas, int threads, size_t smem_bytes,
                   const Args&... args) {
  return launch_cluster(kernel, ctas, threads, smem_bytes, 1, args...);
}
}  // namespace emu

inline void __syncthreads() {
  ::emu::cta().block_bar.arrive_and_wait();
}
// The fast math intrinsics, as their exact host counterparts (the hardware's are within 2 ulp).
inline float __fdividef(float x, float y) {
  return x / y;
}
inline float __log2f(float x) {
  return std::log2(x);
}
inline float __logf(float x) {
  return std::log(x);
}
// The bit reinterpretation intrinsics (the bf16 bias pair conversion and the bias loads use them).
inline float __uint_as_float(unsigned int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
// An int from lane `src` of the warp (exact through the float staging: the kernels broadcast
// small indexes).
inline int __shfl_sync(unsigned, int v, int src) {
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, l = tid % 32;
  emu::cta().shfl_buf[w][l] = static_cast<float>(v);
  emu::cta().warp_bar[w].arrive_and_wait();
  const int r = static_cast<int>(emu::cta().shfl_buf[w][src]);
  emu::cta().warp_bar[w].arrive_and_wait();
  return r;
}
// A float from lane `src` (the epilogues pass a neighbour's column: store_accumulator_row).
inline float __shfl_sync(unsigned, float v, int src) {
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, l = tid % 32;
  emu::cta().shfl_buf[w][l] = v;
  emu::cta().warp_bar[w].arrive_and_wait();
  const float r = emu::cta().shfl_buf[w][src];
  emu::cta().warp_bar[w].arrive_and_wait();
  return r;
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, l = tid % 32;
  emu::cta().shfl_buf[w][l] = v;
  emu::cta().warp_bar[w].arrive_and_wait();
  const float r = emu::cta().shfl_buf[w][l ^ m];
  emu::cta().warp_bar[w].arrive_and_wait();
  return r;
}
