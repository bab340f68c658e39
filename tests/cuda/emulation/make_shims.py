#!/usr/bin/env python3
"""Writes the host-emulation shims of the attention kernels into OUT_DIR.

Test layer (tests/cuda/emulation; a developer tool, not part of CTest). The shared device
helpers the kernels include (src/cuda/common/device_utils.cuh, tile_copies.cuh, wgmma.cuh,
wgmma_tiles.cuh, cluster.cuh) are copied with their inline PTX (mma.sync, ldmatrix, cp.async,
ex2.approx, wgmma and its fences) and shared-window addresses replaced by calls into
emu_runtime.h, and accumulator_row_store.cuh with an alignment check on its 32-bit stores; both families' launchers (evoformer_launch_impl.cuh,
sparse_attention_launch_impl.cuh) are copied with each <<<...>>> launch replaced by an emulated
grid; and the fp32 kernels of sparse_attention_f32.cu are copied without their launchers, so that
the kernel sources compile unchanged as host C++. Every replacement asserts that it matched, so a
change to those sources that the shims no longer fit stops here.
"""
import re
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[3]
out = Path(sys.argv[1])
for folder in ("common", "evoformer", "block_sparse"):
    (out / "cuda" / folder).mkdir(parents=True, exist_ok=True)

src = (root / "src/cuda/common/device_utils.cuh").read_text()
for t in ("__half", "__nv_bfloat16"):
    src, n = re.subn(
        r"(mma_16816<" + t + r">\(float c\[4\], const uint32_t a\[4\],\s*const uint32_t b\[2\]\) \{)"
        r"\s*asm volatile\(.*?\);\n",
        r"\1\n  ::emu::mma<" + t + r">(c, a, b);\n", src, flags=re.S)
    assert n == 1, t
src, n = re.subn(r"(void ldmatrix_x4\(uint32_t r\[4\], const void\* row\) \{).*?\n\}",
                 r"\1\n  ::emu::ldmatrix_x4<kTrans>(r, row);\n}", src, flags=re.S)
assert n == 1, "ldmatrix_x4"
for name, size in (("cp_async_16", 16), ("cp_async_4", 4)):
    src, n = re.subn(r"(void " + name + r"\(void\* smem, const void\* src, int bytes\) \{).*?\n\}",
                     r"\1\n  ::emu::cp_async(smem, src, " + str(size) + ", bytes);\n}", src,
                     flags=re.S)
    assert n == 1, name
src, n1 = re.subn(r"(void cp_async_commit\(\) \{).*?\n\}", r"\1 ::emu::cp_async_commit(); }", src,
                  flags=re.S)
src, n2 = re.subn(r"(void cp_async_wait\(\) \{).*?\n\}", r"\1 ::emu::cp_async_wait(kPending); }", src,
                  flags=re.S)
assert n1 == 1 and n2 == 1
src, n = re.subn(r"(float fast_exp2\(float x\) \{).*?\n\}",
                 r"\1 return ::emu::ex2_approx_ftz(x); }", src, flags=re.S)
assert n == 1, "fast_exp2"
assert not re.search(r"\basm\b", src)
src = src.replace("#pragma once\n", '#pragma once\n#include "emu_runtime.h"\n', 1)
(out / "cuda/common/device_utils.cuh").write_text(src)
ts = (root / "src/cuda/common/tile_copies.cuh").read_text()
ts, n1 = re.subn(r"return static_cast<uint32_t>\(__cvta_generic_to_shared\(smem\)\);",
                 "return ::emu::shared_offset(smem);", ts)
ts, n2 = re.subn(r"(void cp_async_16_to\(uint32_t dst, const void\* src, int bytes\) \{).*?\n\}",
                 r"\1\n  ::emu::cp_async(::emu::shared_at(dst), src, 16, bytes);\n}", ts, flags=re.S)
ts, n3 = re.subn(r"(void cp_async_4_to\(uint32_t dst, const void\* src, int bytes\) \{).*?\n\}",
                 r"\1\n  ::emu::cp_async(::emu::shared_at(dst), src, 4, bytes);\n}", ts, flags=re.S)
assert n1 == 1 and n2 == 1 and n3 == 1, "tile copies"
assert not re.search(r"\basm\b", ts)
(out / "cuda/common/tile_copies.cuh").write_text(ts)
# The epilogues' 32-bit pair stores: the GPU traps on a misaligned one, which plain host stores
# would not show.
rs = (root / "src/cuda/common/accumulator_row_store.cuh").read_text()
rs, n = re.subn(r"(void store_pair\(T\* at, uint32_t pair\) \{)\n",
                r'\1\n  ::emu::require_aligned(at, 4, "32-bit global store");\n', rs)
assert n == 1, "store_pair"
(out / "cuda/common/accumulator_row_store.cuh").write_text(rs)

# The warpgroup MMA (sm_90a): every wgmma.mma_async becomes a call of ::emu::wgmma with its shape,
# dtype, operand sources and transposes read from the instruction; the fences, commit and wait
# become nothing (the emulated product completes at issue).
wg = (root / "src/cuda/common/wgmma.cuh").read_text()


def emulated_wgmma(m):
    body = m.group(0)
    n = int(re.search(r"m64n(\d+)k16", body).group(1))
    dtype = "__nv_bfloat16" if ".f32.bf16.bf16" in body else "__half"
    flags = re.search(r"p((?:, [01])+);", body).group(1).replace(",", " ").split()
    if '"r"(a[0])' in body:  # A from registers: scale-a, scale-b, transpose-b
        assert len(flags) == 3, body
        return "::emu::wgmma_rs<%s, %d, %s>(d, a, desc_b, accumulate);" % (dtype, n, flags[2])
    assert len(flags) == 4, body  # scale-a, scale-b, transpose-a, transpose-b
    return "::emu::wgmma_ss<%s, %d, %s, %s>(d, desc_a, desc_b, accumulate);" % (
        dtype, n, flags[2], flags[3])


wg, n = re.subn(r"asm volatile\(\s*\"\{\\n\.reg \.pred p;.*?\);", emulated_wgmma, wg, flags=re.S)
assert n >= 10, "wgmma products: %d" % n
wg, n = re.subn(r"asm volatile\(\"(fence\.proxy|wgmma\.(fence|commit_group|wait_group))[^;]*;[^;]*;",
                "", wg)
assert n == 4, "wgmma fences: %d" % n
assert not re.search(r"\basm\b", wg)
wg = wg.replace("#pragma once\n", '#pragma once\n#include "emu_runtime.h"\n', 1)
(out / "cuda/common/wgmma.cuh").write_text(wg)
wt = (root / "src/cuda/common/wgmma_tiles.cuh").read_text()
wt, n = re.subn(r'asm volatile\("" : "\+f"\(d\[i\]\[e\]\)::"memory"\);', "(void)d[i][e];", wt)
wt, n2 = re.subn(r'asm volatile\("" : "\+r"\(a\[i\]\[e\]\)::"memory"\);', "(void)a[i][e];", wt)
assert n == 1 and n2 == 1 and not re.search(r"\basm\b", wt), "wgmma_pin"
(out / "cuda/common/wgmma_tiles.cuh").write_text(wt)
# Thread-block clusters: each function's body becomes the emulator's (emu::cluster_*).
cl = (root / "src/cuda/common/cluster.cuh").read_text()
cluster_bodies = {
    "cluster_cta_rank()": "return ::emu::cluster_rank();",
    "cluster_sync()": "::emu::cluster_sync();",
    "cluster_shared_address(uint32_t address, uint32_t rank)":
        "return ::emu::cluster_address(address, rank);",
    "store_cluster_shared(uint32_t address, float4 v)": "::emu::cluster_store(address, v);",
    "store_cluster_shared(uint32_t address, float v)": "::emu::cluster_store(address, v);",
}
for signature, body in cluster_bodies.items():
    cl, n = re.subn(r"(" + re.escape(signature) + r" \{).*?\n\}", lambda m: m.group(1) + "\n  " +
                    body + "\n}", cl, flags=re.S)
    assert n == 1, signature
assert not re.search(r"\basm\b", cl), "cluster"
cl = cl.replace("#pragma once\n", '#pragma once\n#include "emu_runtime.h"\n', 1)
(out / "cuda/common/cluster.cuh").write_text(cl)
# The Evoformer launchers as the dispatch runs them, each launch an emulated grid; the
# shared-memory attributes have nothing to set; the per-kernel grid sizes from the dispatch.
(out / "cuda/common/kernel_smem_config.h").write_text(
    "#pragma once\n#include <cstddef>\n#include \"emu_runtime.h\"\n"
    "namespace sciattn::cuda {\ninline cudaError_t configure_kernel_smem(const void*, size_t, bool) "
    "{ return cudaSuccess; }\n}  // namespace sciattn::cuda\n")
li = (root / "src/cuda/evoformer/evoformer_launch_impl.cuh").read_text()
li, n1 = re.subn(r"return launch_overlapped\(kernel, dim3\(static_cast<unsigned>\(ctas\)\), threads, "
                 r"smem_bytes, stream,\s*p\.overlap_launches != 0, 1, p\);",
                 "return ::emu::launch(kernel, ctas, threads, smem_bytes, p);", li)
li, n2 = re.subn(r"(cudaError_t launch_cluster_pairs\([^{]*\{).*?\n\}",
                 r"\1\n  return ::emu::launch_cluster(kernel, 2 * pairs, kWgmmaThreads, smem, 2, p);\n}",
                 li, flags=re.S)
assert n1 == 1 and n2 == 1 and "<<<" not in li and "launch_overlapped" not in li, "launch_impl"
(out / "cuda/evoformer/evoformer_launch_impl.cuh").write_text(li)
# The fused backward runs in clusters, whose CTAs run at once here: its shared memory is its CTA's
# (emu::cta()), not the one buffer the other kernels' `extern __shared__` names.
fu = (root / "src/cuda/evoformer/evoformer_bwd_fused_wgmma_kernel.cuh").read_text()
fu, n = re.subn(r"extern __shared__ __align__\(16\) unsigned char smem_raw\[\];",
                "unsigned char* const smem_raw = ::emu::cta().shared_base;", fu)
assert n == 1, "fused kernel's shared memory"
(out / "cuda/evoformer/evoformer_bwd_fused_wgmma_kernel.cuh").write_text(fu)
sl = (root / "src/cuda/block_sparse/sparse_attention_launch_impl.cuh").read_text()
sl, n = re.subn(r"kernel<<<static_cast<unsigned>\(ctas\), threads, smem_bytes, stream>>>"
                r"\(args\.\.\.\);\s*return cudaGetLastError\(\);",
                "return ::emu::launch(kernel, ctas, threads, smem_bytes, args...);", sl)
assert n == 1 and "<<<" not in sl, "sparse launch_impl"
(out / "cuda/block_sparse/sparse_attention_launch_impl.cuh").write_text(sl)
di = (root / "src/cuda/evoformer/evoformer_dispatch.cu").read_text()
ctas = re.search(r"int64_t evoformer_forward_ctas\(.*?\nint64_t evoformer_dbias2_ctas\(.*?\n\}\n", di,
                 flags=re.S).group(0)
(out / "evoformer_ctas.h").write_text(
    "#pragma once\n#include \"common/evoformer_cuda_plan.h\"\n"
    "#include \"cuda/evoformer/evoformer_device_params.h\"\nnamespace sciattn::cuda {\n" + ctas +
    "}  // namespace sciattn::cuda\n")

(out / "cuda/evoformer/evoformer_bwd_kernels.cuh").write_text(
    (root / "src/cuda/evoformer/evoformer_bwd_kernels.cuh").read_text())

f32 = (root / "src/cuda/block_sparse/sparse_attention_f32.cu").read_text()
cut = f32.index("}  // namespace\n\ntemplate <typename T>\ncudaError_t launch_sparse_attention_delta")
f32 = f32[:cut] + "}  // namespace\n}  // namespace sciattn::cuda\n"
f32 = f32.replace('#include "cuda/block_sparse/sparse_attention_launch.h"\n', "")
f32 = f32.replace("namespace sciattn::cuda {\nnamespace {", "namespace sciattn::cuda {\nnamespace f32emu {", 1)
(out / "f32_kernels.h").write_text(f32)
