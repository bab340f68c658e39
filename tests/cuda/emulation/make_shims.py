#!/usr/bin/env python3
"""Writes the host-emulation shims of the fused sparse attention kernels into OUT_DIR.

Test layer (tests/cuda/emulation; a developer tool, not part of CTest). The shared device
helpers the kernels include (src/cuda/common/device_utils.cuh, tile_copies.cuh) are copied
with their inline PTX (mma.sync, ldmatrix, cp.async, ex2.approx) and shared-window addresses
replaced by calls into emu_runtime.h, and the fp32 kernels of sparse_attention_f32.cu
are copied without their launchers, so that the kernel sources compile unchanged as host C++.
"""
import re
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[3]
out = Path(sys.argv[1])
for folder in ("common", "evoformer"):
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
for size in (16, 8, 4):
    ts, n2 = re.subn(r"(void cp_async_" + str(size) +
                     r"_to\(uint32_t dst, const void\* src, int bytes\) \{).*?\n\}",
                     r"\1\n  ::emu::cp_async(::emu::shared_at(dst), src, " + str(size) +
                     r", bytes);\n}", ts, flags=re.S)
    assert n2 == 1, "cp_async_%d_to" % size
ts, n3 = re.subn(r"(void store_chunk_words\(uint32_t dst, const uint32_t \(&words\)\[4\]\) \{).*?\n\}",
                 r"\1\n  std::memcpy(::emu::shared_at(dst), words, 16);\n}", ts, flags=re.S)
assert n1 == 1 and n3 == 1, "tile copies"
assert not re.search(r"\basm\b", ts)
(out / "cuda/common/tile_copies.cuh").write_text(ts)
(out / "cuda/evoformer/evoformer_bwd_kernels.cuh").write_text(
    (root / "src/cuda/evoformer/evoformer_bwd_kernels.cuh").read_text())

f32 = (root / "src/cuda/block_sparse/sparse_attention_f32.cu").read_text()
cut = f32.index("}  // namespace\n\ntemplate <typename T>\ncudaError_t launch_sparse_attention_delta")
f32 = f32[:cut] + "}  // namespace\n}  // namespace sciattn::cuda\n"
f32 = f32.replace('#include "cuda/block_sparse/sparse_attention_launch.h"\n', "")
f32 = f32.replace("namespace sciattn::cuda {\nnamespace {", "namespace sciattn::cuda {\nnamespace f32emu {", 1)
(out / "f32_kernels.h").write_text(f32)
