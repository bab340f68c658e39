// Host emulation of the Evoformer attention kernels (test layer, tests/cuda/emulation; a developer
// tool run by run_emulation.sh, not part of CTest): the real kernel sources (forward, delta,
// dK/dV, dQ, dbias2), compiled as host C++ with emulated CUDA (emu_runtime.h), run on small
// problems with the arguments the dispatch builds (evoformer_device_params_of.h) and are compared
// with the fp64 oracle, the CPU reference giving lowp_ref (the tolerance rule). Each case runs the
// mma.sync kernels (the portable path, with two stages and, at head dims 64 and 128, one) and,
// where the host picks them, the sm_90a warpgroup kernels through the launchers the dispatch
// calls (evoformer_launch_impl.cuh; the fused dK/dV/dQ kernel included, and at head dim 32 also
// its form in clusters of two CTAs). The bias reduction (dbias1 over heads, dbias2 over N chunks)
// is a plain loop in the dispatch's kernel and is redone here on the host in the same order. It
// checks index arithmetic, fragments, copies and the dbias2 chunking without a GPU; it cannot see
// cp.async races or alignment faults.
#include "emu_runtime.h"
// clang-format off
#include "cuda/evoformer/evoformer_fwd_kernel.cuh"
#include "cuda/evoformer/evoformer_bwd_kernels.cuh"
#include "cuda/evoformer/evoformer_launch_impl.cuh"
#include "cuda/evoformer/evoformer_row_copy.cuh"
#include "evoformer_ctas.h"
// clang-format on

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/evoformer_test_util.h"
#include "cuda/evoformer/evoformer_device_params_of.h"

namespace sciattn::cuda {
// The launchers' delta step (the dispatch's, on a grid of three CTAs).
template <typename T>
cudaError_t launch_evoformer_backward_delta(const EvoformerDeviceParams& p, cudaStream_t) {
  return launch_with_delta_lanes(p.dim, evoformer_delta_vec<T>(p), [&](auto lanes) {
    return ::emu::launch(evoformer_bwd_delta_kernel<T, decltype(lanes)::value>, 3, 256, 0, p);
  });
}
// The kernels' `extern __shared__ smem_raw`, 1024-byte aligned as the warpgroup kernels' swizzled
// tiles are on the GPU.
__attribute__((aligned(1024))) unsigned char smem_raw[1 << 18];
}  // namespace sciattn::cuda

using namespace sciattn;
using namespace sciattn::test;

namespace {

template <typename Kernel>
void launch(Kernel kernel, int64_t ctas, unsigned threads, size_t smem_bytes,
            const cuda::EvoformerDeviceParams& p) {
  emu::launch(kernel, ctas, static_cast<int>(threads), smem_bytes, p);
}

// One padded copy as the dispatch's kernel makes it (evoformer_row_copy.cuh's copy_rows, with the
// fast divisors the GPU takes below 2^31 chunks), for elements of kBytes.
template <int kBytes>
void copy_rows_job(const cuda::EvoformerRowCopyArgs& a) {
  cuda::copy_rows<kBytes, uint32_t, true>(a);
}

int copy_failures = 0;

// The padded copies of unaligned biases and inputs that the dispatch makes before a launch
// (evoformer_row_copy.cu): its kernel's code on an emulated grid of up to four CTAs of 256 threads
// (so that the grid-stride loop turns), checked byte for byte against the same copy made element
// by element here.
void make_copies(const cuda::EvoformerCopyJobs& jobs) {
  for (int i = 0; i < jobs.count; ++i) {
    const cuda::EvoformerRowCopyArgs& a = jobs.job[i];
    const auto* src = static_cast<const unsigned char*>(a.src);
    const size_t e = static_cast<size_t>(a.elem_bytes);
    const int64_t rows = a.outer[0] * a.outer[1] * a.outer[2] * a.outer[3];
    std::vector<unsigned char> want(static_cast<size_t>(rows * a.row) * e);
    int64_t row = 0;
    for (int64_t i0 = 0; i0 < a.outer[0]; ++i0)
      for (int64_t i1 = 0; i1 < a.outer[1]; ++i1)
        for (int64_t i2 = 0; i2 < a.outer[2]; ++i2)
          for (int64_t i3 = 0; i3 < a.outer[3]; ++i3, ++row) {
            const int64_t from = i0 * a.outer_stride[0] + i1 * a.outer_stride[1] +
                                 i2 * a.outer_stride[2] + i3 * a.outer_stride[3];
            for (int64_t j = 0; j < a.row; ++j) {
              unsigned char* to = want.data() + static_cast<size_t>(row * a.row + j) * e;
              if (j < a.len) {
                std::memcpy(to, src + static_cast<size_t>(from + j * a.len_stride) * e, e);
              } else {
                std::memset(to, 0, e);
              }
            }
          }
    const int64_t chunks = rows * a.row * a.elem_bytes / 16;
    const int64_t ctas = std::min<int64_t>((chunks + 255) / 256, 4);
    switch (a.elem_bytes) {
      case 1:
        emu::run_grid(copy_rows_job<1>, ctas, 256, cuda::smem_raw, 0, a);
        break;
      case 2:
        emu::run_grid(copy_rows_job<2>, ctas, 256, cuda::smem_raw, 0, a);
        break;
      default:
        emu::run_grid(copy_rows_job<4>, ctas, 256, cuda::smem_raw, 0, a);
        break;
    }
    if (std::memcmp(a.dst, want.data(), want.size()) != 0) {
      std::printf(
          "row copy %d (%d-byte elements, rows of %lld into %lld) differs from the host's\n", i,
          a.elem_bytes, static_cast<long long>(a.len), static_cast<long long>(a.row));
      ++copy_failures;
    }
  }
}

// The sum the dispatch's reduction kernel makes: dbias1[b, n, j] over heads, dbias2[b, h, i, j]
// over N chunks, in index order, stored in the bias's dtype.
void reduce_biases(const cuda::EvoformerDeviceParams& p, HostTensor& dbias1, HostTensor& dbias2) {
  if (dbias1.present()) {
    for (int64_t bn = 0; bn < p.batch * p.n; ++bn)
      for (int64_t j = 0; j < p.len; ++j) {
        float sum = 0.0f;
        for (int64_t h = 0; h < p.heads; ++h)
          sum += p.dbias1_partial[(bn * p.heads + h) * p.len + j];
        dbias1.set(bn * p.len + j, sum);  // logical index of [B, N, 1, 1, L]
      }
  }
  if (dbias2.present() && p.dbias2_chunks > 1) {
    const int64_t chunk_stride = p.batch * p.heads * p.len * p.len;
    for (int64_t x = 0; x < chunk_stride; ++x) {
      float sum = 0.0f;
      for (int64_t c = 0; c < p.dbias2_chunks; ++c) sum += p.dbias2_partial[c * chunk_stride + x];
      dbias2.set(x, sum);  // logical index of [B, 1, H, L, L]
    }
  }
}

// "mma.sync, 2 stages", or for the launchers "wgmma" with the backward's form.
std::string path_name(int stages, const cuda::EvoformerDeviceParams& p) {
  if (stages == -2) return "wgmma, fused backward in clusters of two CTAs";
  if (stages > 0)
    return "mma.sync, " + std::to_string(stages) + (stages == 1 ? " stage" : " stages");
  std::string name = p.padded_tiles     ? "wgmma PaddedDimTypes"
                     : p.in_place_tiles ? "wgmma InPlaceDimTypes"
                                        : "wgmma";
  if (p.dim <= 32 && p.dq != nullptr) {
    const detail::CudaFusedBackwardPlan plan = cuda::evoformer_fused_backward_plan(p);
    name += plan.ranks > 0 ? ", fused backward (" + std::to_string(plan.stages) + " buffers)"
                           : ", separate dK/dV and dQ";
  }
  return name;
}

// huge_v: V filled with 1e37, whose weighted mean (the output) is finite although the sum of a
// row's P V terms passes fp32's largest value; only the forward is checked.
// kStages: the mma.sync kernels' stages of streamed tiles (1: the form sm_86 and sm_89 run at the
// widest head dims, kEvoformerOneStage); 0: the dispatch's launchers with the host's choice of
// kernels (the warpgroup ones where it picks them; a case it keeps on mma.sync is skipped there);
// -2 (head dim 32): the same forward, and the backward's fused kernel in clusters of two CTAs per
// slice, the form the host plans where one CTA cannot hold a slice's dQ (triangle 768), forced
// here at lengths the emulator runs quickly.
template <typename T, int kHD, int kStages = 2>
bool run_case(const EvoConfig& cfg, bool huge_v) {
  EvoInputs in = make_inputs(cfg);
  if (huge_v) {
    for (int64_t i = 0; i < in.v.numel(); ++i) in.v.set(i, 1e37);
  }
  const bool want_dbias1 = in.bias1.present() && in.bias1.dtype() != DType::kBool;
  const bool want_dbias2 = in.bias2.present();
  const NaiveProblem naive = to_naive(in);
  const NaiveForward f64 = naive_forward(naive);
  const NaiveGrads g64 = naive_backward(naive, in.dout.values());
  const ForwardRun fref = run_forward(in, EvoformerCpuAlgorithm::kReference);
  const BackwardRun bref = run_backward(in, fref.out, fref.lse, EvoformerCpuAlgorithm::kReference,
                                        0, want_dbias1, want_dbias2);
  if (!fref.status.ok() || !bref.status.ok()) {
    std::printf("  CPU reference failed\n");
    return false;
  }
  const detail::EvoformerShape s{cfg.shape.B, cfg.shape.N, cfg.shape.L, cfg.shape.H, cfg.shape.D};
  const int64_t row_tiles = (s.len + 63) / 64 * s.heads * s.batch * s.n;

  // Forward.
  HostTensor out = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  HostTensor lse = HostTensor::packed(DType::kF32, cfg.shape.lse());
  EvoformerForwardParams f = forward_params_of(in, out.view(), lse.view());
  f.options.scale = cfg.scale;
  // The dispatch's launchers as on a device with the warpgroup kernels; the mma.sync kernels as
  // on one without (the forward's plan differs: forward_reads_in_place).
  const bool warpgroup = kStages <= 0;
  const detail::CudaForwardWorkspace fw = cuda::forward_workspace(f, s, warpgroup);
  std::vector<float> fwd_workspace(fw.layout.total_bytes() / 4 + 16, NAN);
  make_copies(cuda::forward_copy_jobs(f, s, fwd_workspace.data(), warpgroup));
  const cuda::EvoformerDeviceParams pf =
      cuda::forward_device_params(f, s, fwd_workspace.data(), warpgroup);
  if (kStages <= 0 && !pf.wgmma_tiles) return true;
  if constexpr (kStages <= 0) {
    cuda::launch_evoformer_forward<T, kHD>(pf, nullptr);
  } else {
    const size_t bias_smem_fwd =
        kStages *
        static_cast<size_t>(cuda::bias_stage_bytes(pf.bias2_type, cuda::EvoformerFwdTile::kBlockM) +
                            cuda::bias_stage_bytes(pf.bias1_type, 1));
    launch(cuda::evoformer_fwd_kernel<T, kHD, kStages>, row_tiles, cuda::EvoformerFwdTile::kThreads,
           sizeof(cuda::EvoformerFwdSmem<T, kHD, kStages>) + bias_smem_fwd, pf);
  }

  // Backward, from the emulated forward.
  HostTensor dq = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  HostTensor dk = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  HostTensor dv = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  HostTensor dbias1, dbias2;
  if (want_dbias1) dbias1 = make_tensor(in.bias1.dtype(), cfg.shape.bias1(), cfg.out_layout);
  if (want_dbias2) dbias2 = make_tensor(in.bias2.dtype(), cfg.shape.bias2(), cfg.out_layout);
  const EvoformerBackwardParams b = backward_params_of(f, in.dout.view(), dq.view(), dk.view(),
                                                       dv.view(), dbias1.view(), dbias2.view());
  const detail::CudaBackwardWorkspace w = cuda::backward_workspace(b, s);
  std::vector<float> workspace(w.layout.total_bytes() / 4 + 16, NAN);
  make_copies(cuda::backward_copy_jobs(b, s, workspace.data()));
  const cuda::EvoformerDeviceParams pb = cuda::backward_device_params(b, s, workspace.data());
  if constexpr (kStages == 0) {
    cuda::launch_evoformer_backward<T, kHD>(pb, nullptr);
  } else if constexpr (kStages == -2) {
    // launch_evoformer_backward_wgmma's fused branch with the plan {2 CTAs, 2 buffers}.
    using Smem = cuda::EvoformerWgmmaSmem<kHD>;
    cuda::launch_evoformer_backward_delta<T>(pb, nullptr);
    cuda::launch_evoformer_backward_fused<T, kHD>(pb, detail::CudaFusedBackwardPlan{2, 2}, nullptr);
    if (pb.dbias2 != nullptr) {
      cuda::with_bias_types<T>(pb, [&](auto types) {
        return cuda::launch_1d(cuda::evoformer_bwd_dbias2_wgmma_kernel<T, kHD, decltype(types)>,
                               cuda::evoformer_dbias2_ctas(pb),
                               cuda::kWgmmaThreads * Smem::kDbias2Groups, Smem::kDbias2Bytes + 1024,
                               pb, nullptr);
      });
    }
  } else {
    // The lanes per row the launcher picks, through the launcher's own selection.
    cuda::launch_with_delta_lanes(pb.dim, cuda::evoformer_delta_vec<T>(pb), [&](auto lanes) {
      launch(cuda::evoformer_bwd_delta_kernel<T, decltype(lanes)::value>, 3, 256, 0, pb);
      return 0;
    });
    const size_t bias_smem_bwd =
        kStages *
        static_cast<size_t>(cuda::bias_stage_bytes(pb.bias2_type, cuda::EvoformerBwdTile::kBlock) +
                            cuda::bias_stage_bytes(pb.bias1_type, 1));
    const size_t bwd_smem = sizeof(cuda::EvoformerBwdSmem<T, kHD, kStages>) + bias_smem_bwd;
    launch(cuda::evoformer_bwd_dkdv_kernel<T, kHD, kStages>, row_tiles,
           cuda::EvoformerBwdTile::kThreads, bwd_smem, pb);
    launch(cuda::evoformer_bwd_dq_kernel<T, kHD, kStages>, row_tiles,
           cuda::EvoformerBwdTile::kThreads, bwd_smem, pb);
    if (want_dbias2) {
      launch(cuda::evoformer_bwd_dbias2_kernel<T, kHD, kStages>,
             detail::cuda_dbias2_tiles(s) * pb.dbias2_chunks,
             cuda::EvoformerDbias2Tile<kHD>::kThreads,
             sizeof(cuda::EvoformerDbias2Smem<T, kHD, kStages>), pb);
    }
  }
  reduce_biases(pb, dbias1, dbias2);

  bool ok = true;
  auto check = [&](const char* what, const ::testing::AssertionResult& r) {
    if (!r) {
      std::printf("  FAIL %s: %s\n", what, r.message());
      ok = false;
    }
  };
  check("out", within_tolerance("out", out.values(), fref.out.values(), f64.out, cfg.dtype));
  check("lse", within_tolerance("lse", lse.values(), fref.lse.values(), f64.lse, cfg.dtype));
  if (huge_v) {
    std::printf("%s, %s, V = 1e37: %s\n", cfg.str().c_str(), path_name(kStages, pf).c_str(),
                ok ? "OK" : "FAILED");
    return ok;
  }
  check("dq", within_tolerance("dq", dq.values(), bref.dq.values(), g64.dq, cfg.dtype));
  check("dk", within_tolerance("dk", dk.values(), bref.dk.values(), g64.dk, cfg.dtype));
  check("dv", within_tolerance("dv", dv.values(), bref.dv.values(), g64.dv, cfg.dtype));
  if (want_dbias1) {
    check("dbias1", bias_grad_within_tolerance("dbias1", dbias1.values(), bref.dbias1.values(),
                                               g64.dbias1, cfg.dtype));
  }
  if (want_dbias2) {
    check("dbias2", bias_grad_within_tolerance("dbias2", dbias2.values(), bref.dbias2.values(),
                                               g64.dbias2, cfg.dtype));
  }
  std::printf("%s, %s%s: vec %d%d%d%d%d, load_dim %lld, staged %d%d, dbias2 chunks %lld: %s\n",
              cfg.str().c_str(), path_name(kStages, pb).c_str(),
              pf.in_place_tiles
                  ? (pf.shifted_slices ? " (forward in place, shifted)" : " (forward in place)")
                  : "",
              pb.vec_q, pb.vec_k, pb.vec_v, pb.vec_dout, pb.vec_out,
              static_cast<long long>(pb.load_dim), pb.bias1_staged, pb.bias2_staged,
              static_cast<long long>(pb.dbias2_chunks), ok ? "OK" : "FAILED");
  return ok;
}

template <typename T>
bool run_dim(const EvoConfig& c, bool huge_v) {
  switch (detail::cuda_evoformer_head_dim(c.shape.D)) {
    case 8:
      return run_case<T, 8>(c, huge_v);
    case 16:
      return run_case<T, 16>(c, huge_v);
    case 32:
      return run_case<T, 32>(c, huge_v) & run_case<T, 32, 0>(c, huge_v) &
             (huge_v || run_case<T, 32, -2>(c, huge_v));
    case 64:  // and the one-stage form of the widest head dims (kEvoformerOneStage)
      return run_case<T, 64>(c, huge_v) & run_case<T, 64, 1>(c, huge_v) &
             run_case<T, 64, 0>(c, huge_v);
    default:
      return run_case<T, 128>(c, huge_v) & run_case<T, 128, 1>(c, huge_v) &
             run_case<T, 128, 0>(c, huge_v);
  }
}

bool run(const EvoConfig& c, bool huge_v = false) {
  return c.dtype == DType::kF16 ? run_dim<__half>(c, huge_v) : run_dim<__nv_bfloat16>(c, huge_v);
}

// bf16 cases for huge_v: several key tiles, a partial last one, biases moving the row maxima, and
// enough keys (L x 1e37 past fp32's 3.4e38) that an unguarded O overflows. (The GPU suite runs
// L 700 at head dim 64; here L 260, a seventh of its emulation time.)
std::vector<EvoConfig> huge_v_cases() {
  std::vector<EvoConfig> out;
  EvoConfig c;
  c.dtype = DType::kBF16;
  c.shape = {1, 2, 300, 2, 32};
  c.bias1 = Bias1Kind::kBool;
  c.bias2 = Bias2Kind::kSameAsQ;
  c.seed = kBaseSeed + 90100;
  out.push_back(c);
  c.shape = {1, 1, 260, 1, 64};
  c.bias1 = Bias1Kind::kSameAsQ;
  c.bias2 = Bias2Kind::kF32;
  c.seed = kBaseSeed + 90101;
  out.push_back(c);
  return out;
}

std::vector<EvoConfig> cases() {
  std::vector<EvoConfig> out;
  uint64_t seed = kBaseSeed + 90000;
  auto add = [&](EvoShape shape, DType dtype, Bias1Kind b1, Bias2Kind b2, Layout in_layout) {
    EvoConfig c;
    c.shape = shape;
    c.dtype = dtype;
    c.bias1 = b1;
    c.bias2 = b2;
    c.in_layout = in_layout;
    c.seed = seed++;
    out.push_back(c);
  };
  // Head dims of every instantiation, lengths that are not tile multiples, several query and key
  // tiles, chunked (N > 1) and unchunked (N = 1) dbias2 sums, both 16-bit dtypes.
  add({1, 3, 17, 2, 32}, DType::kBF16, Bias1Kind::kBool, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 3, 130, 2, 32}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 1, 150, 2, 32}, DType::kF16, Bias1Kind::kF32, Bias2Kind::kF32, Layout::kPacked);
  add({2, 2, 70, 2, 16}, DType::kF16, Bias1Kind::kBool, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 3, 33, 2, 8}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 2, 70, 2, 64}, DType::kBF16, Bias1Kind::kF32, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 2, 40, 1, 128}, DType::kF16, Bias1Kind::kNone, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 3, 96, 2, 24}, DType::kBF16, Bias1Kind::kBool, Bias2Kind::kNone, Layout::kPacked);
  // Three whole tiles (the streamed copies, common/tile_copies.cuh) at the widest head dim and
  // bias element, and at head dim 64 with a partial fourth tile.
  add({1, 2, 192, 1, 128}, DType::kF16, Bias1Kind::kBool, Bias2Kind::kF32, Layout::kPacked);
  add({1, 2, 200, 2, 64}, DType::kBF16, Bias1Kind::kF32, Bias2Kind::kSameAsQ, Layout::kPacked);
  // A length that is a multiple of 8 but not of 64: both 16-bit biases read in place (rows end on
  // whole chunks), the last query and key tiles through the masked streams.
  add({1, 2, 200, 2, 32}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ, Layout::kPacked);
  // Strided inputs (the element-wise copy paths) and transposed N / L.
  add({1, 2, 45, 2, 32}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ, Layout::kPadded);
  add({1, 3, 80, 2, 32}, DType::kF16, Bias1Kind::kBool, Bias2Kind::kSameAsQ, Layout::kTransposedNL);
  // Head dims that are not a multiple of 8, read from staged copies with rows of 24 and 104 (bias
  // pairs that keep the mma.sync kernels).
  add({1, 2, 77, 2, 20}, DType::kBF16, Bias1Kind::kF32, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 1, 70, 1, 100}, DType::kF16, Bias1Kind::kBool, Bias2Kind::kF32, Layout::kPacked);
  // Head dims padded in whole chunks with a compiled bias pair (PaddedDimTypes): whole tiles
  // through the streams with the chunks past D zero-filled (the first two read from rows with
  // poisoned columns past D), a partial last tile, each head dim.
  add({1, 3, 130, 2, 24}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ,
      Layout::kWideRows);
  add({1, 2, 200, 1, 48}, DType::kF16, Bias1Kind::kSameAsQ, Bias2Kind::kNone, Layout::kWideRows);
  add({1, 1, 130, 2, 120}, DType::kBF16, Bias1Kind::kNone, Bias2Kind::kSameAsQ, Layout::kPacked);
  // Inputs read from staged copies (detail::CudaInputCopies) by PaddedDimTypes: D 33 from an
  // unaligned strided view (rows of 40 zero-padded past 33, the outputs written at 33 in place),
  // and by the head dim 8 kernels: D 5.
  add({1, 2, 130, 2, 33}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ, Layout::kPadded);
  add({1, 2, 70, 2, 5}, DType::kF16, Bias1Kind::kSameAsQ, Bias2Kind::kNone, Layout::kPacked);
  // Forwards that read Q, K, V in place in 4-byte pieces (InPlaceDimTypes; their backward reads
  // staged copies): odd D in shifted slices (the second head's rows start on a 2-byte boundary;
  // in wide rows the element before them is a poisoned column, which must be zeroed), even D
  // with poisoned columns past D, partial last tiles, each head dim.
  add({1, 2, 130, 2, 127}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ,
      Layout::kWideRows);
  add({1, 2, 77, 2, 63}, DType::kF16, Bias1Kind::kSameAsQ, Bias2Kind::kNone, Layout::kPacked);
  add({1, 1, 70, 2, 116}, DType::kBF16, Bias1Kind::kNone, Bias2Kind::kSameAsQ, Layout::kWideRows);
  add({1, 2, 100, 2, 26}, DType::kF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ, Layout::kPacked);
  add({1, 3, 64, 2, 31}, DType::kBF16, Bias1Kind::kNone, Bias2Kind::kNone, Layout::kWideRows);
  add({2, 2, 70, 2, 58}, DType::kBF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ,
      Layout::kTransposedNL);
  return out;
}

// `count` random cases from `seed`: small B, N, H; L from 1 to 200; head dims 1 to 128 (half of
// them the padded dims users bring: 20, 24, 40, 48, 56, 96, 100, 120), both 16-bit dtypes, every
// bias kind and input / output layout.
std::vector<EvoConfig> random_cases(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t common_dims[] = {20, 24, 32, 40, 48, 56, 64, 96, 100, 120, 128};
  const Bias1Kind b1s[] = {Bias1Kind::kNone, Bias1Kind::kSameAsQ, Bias1Kind::kF32,
                           Bias1Kind::kBool};
  const Bias2Kind b2s[] = {Bias2Kind::kNone, Bias2Kind::kSameAsQ, Bias2Kind::kF32};
  const Layout layouts[] = {Layout::kPacked, Layout::kPadded, Layout::kTransposedNL,
                            Layout::kWideRows};
  std::vector<EvoConfig> out;
  for (int i = 0; i < count; ++i) {
    EvoConfig c;
    c.seed = seed + 1 + static_cast<uint64_t>(i);
    c.dtype = rng() % 2 ? DType::kF16 : DType::kBF16;
    c.shape.B = 1 + static_cast<int64_t>(rng() % 2);
    c.shape.N = 1 + static_cast<int64_t>(rng() % 3);
    c.shape.H = 1 + static_cast<int64_t>(rng() % 2);
    c.shape.L = 1 + static_cast<int64_t>(rng() % 200);
    c.shape.D = rng() % 2 ? common_dims[rng() % 11] : 1 + static_cast<int64_t>(rng() % 128);
    c.bias1 = b1s[rng() % 4];
    c.bias2 = b2s[rng() % 3];
    c.in_layout = layouts[rng() % 4];
    c.out_layout = rng() % 4 == 0 ? Layout::kPadded : Layout::kPacked;
    out.push_back(c);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  emu::defer = std::getenv("EMU_DEFER") != nullptr;
  emu::launch_smem = cuda::smem_raw;
  emu::launch_smem_capacity = sizeof(cuda::smem_raw);
  const std::vector<EvoConfig> all = cases();
  int failures = 0;
  if (argc > 1 && std::string(argv[1]) == "random") {
    const int count = argc > 2 ? std::atoi(argv[2]) : 20;
    const uint64_t seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : kBaseSeed + 91000;
    for (const EvoConfig& c : random_cases(count, seed)) failures += !run(c);
  } else if (argc > 1) {
    const int i = std::atoi(argv[1]);
    if (i < 0 || i >= static_cast<int>(all.size())) {
      std::printf("case index must be 0..%zu\n", all.size() - 1);
      return 2;
    }
    failures += !run(all[static_cast<size_t>(i)]);
  } else {
    for (const EvoConfig& c : all) failures += !run(c);
    for (const EvoConfig& c : huge_v_cases()) failures += !run(c, /*huge_v=*/true);
  }
  failures += copy_failures;
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
