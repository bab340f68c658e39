#!/usr/bin/env python3
"""Evoformer attention on the GPU: sciattn against its peers, in one process, on the same inputs.

Peers: naive PyTorch (materialised scores), SDPA with the memory-efficient backend and a
materialised bias, and FlexAttention (torch.compile) with a score_mod bias. DeepSpeed's DS4Sci
kernel is not installed on the GPU machine; its times, measured by the project on 2026-11-30 and
recorded in docs/perf/evoformer.md, are shown
for reference only (measured there, not here).

sciattn is called through libsciattn_capi.so (ctypes: the C API's forward and backward, each
call's workspace from torch's allocator; the `sciattn` columns and ratios) and, when the sciattn
Python package with CUDA kernels is importable (scripts/build_torch_ext.sh --cuda), also as users
call it, `sciattn.evoformer_attention` through autograd, timed exactly as the peers are (the
`sciattn_package` columns; the table's `best/pkg` is the fastest peer's time over it).

Usage (on the GPU machine):
  python3 bench/compare/evoformer.py --lib build/gpu/bindings/capi/libsciattn_capi.so --out results/
Prints a table; writes results/evoformer.json and results/evoformer.png. --kernels portable times
sciattn's mma.sync kernels (the code Ampere and Ada run) on the same GPU.
"""
import argparse
import ctypes
import math
import os
import sys

import torch
import torch.nn.functional as F

from common import (EXP_CEILING, MATMUL_CEILING, error_text, gpu_meta, import_sciattn,
                    peak_extra_bytes, raise_compile_limits, time_ms, write_json)

# [B, N, L, H, D]; the last field says whether the shape has a pair bias (MSA column: mask only).
SHAPES = [
    ("triangle 256", (1, 256, 256, 4, 32), True),
    ("MSA row 512x256", (1, 512, 256, 8, 32), True),
    ("MSA column 256x512", (1, 256, 512, 8, 32), False),
    ("triangle 384", (1, 384, 384, 4, 32), True),
    ("triangle 768", (1, 768, 768, 4, 32), True),
    ("extra MSA", (1, 1024, 256, 8, 8), True),
    ("head dim 64", (1, 256, 256, 4, 64), True),
]
# DS4Sci forward+backward times (ms, bf16) from PERFORMANCE.md, for reference.
DS4SCI_MS = {"triangle 256": 1.36, "MSA row 512x256": 4.42, "MSA column 256x512": 4.77,
             "triangle 384": 3.97, "triangle 768": 30.1, "extra MSA": 8.41, "head dim 64": 1.40}

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.bool: 3}


class Sciattn:
    """ctypes wrapper of libsciattn_capi for contiguous CUDA tensors."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        i64, i32, f32, vp, sz = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_size_t
        shape = [i64] * 5 + [i32, i32, f32]
        fwd = shape + [vp, vp, vp, vp, i32, vp, i32, vp, vp]
        self.lib.sciattn_evoformer_forward_workspace_size.argtypes = fwd
        self.lib.sciattn_evoformer_forward_workspace_size.restype = sz
        self.lib.sciattn_evoformer_forward.argtypes = fwd + [vp, sz, vp, ctypes.c_char_p, sz]
        self.lib.sciattn_evoformer_forward.restype = i32
        bwd = shape + [vp, vp, vp, vp, i32, vp, i32, vp, vp, vp, vp, vp, vp, vp, vp]
        self.lib.sciattn_evoformer_backward_workspace_size.argtypes = bwd
        self.lib.sciattn_evoformer_backward_workspace_size.restype = sz
        self.lib.sciattn_evoformer_backward.argtypes = bwd + [vp, sz, vp, ctypes.c_char_p, sz]
        self.lib.sciattn_evoformer_backward.restype = i32
        self.err = ctypes.create_string_buffer(1024)

    @staticmethod
    def _ptr(t):
        return None if t is None else t.data_ptr()

    @staticmethod
    def _code(t):
        return -1 if t is None else DTYPE_CODE[t.dtype]

    def _shape(self, q):
        B, N, L, H, D = q.shape
        return [B, N, L, H, D, DTYPE_CODE[q.dtype], 1, float("nan")]

    def forward(self, q, k, v, b1, b2):
        out = torch.empty_like(q)
        B, N, L, H, _ = q.shape
        lse = torch.empty((B * N, H, L), device=q.device, dtype=torch.float32)
        args = self._shape(q) + [q.data_ptr(), k.data_ptr(), v.data_ptr(), self._ptr(b1), self._code(b1),
                                 self._ptr(b2), self._code(b2), out.data_ptr(), lse.data_ptr()]
        ws_bytes = self.lib.sciattn_evoformer_forward_workspace_size(*args)
        ws = torch.empty(max(ws_bytes, 1), device=q.device, dtype=torch.uint8)
        rc = self.lib.sciattn_evoformer_forward(*args, ws.data_ptr(), ws_bytes,
                                                torch.cuda.current_stream().cuda_stream, self.err, 1024)
        if rc != 0:
            raise RuntimeError(self.err.value.decode())
        return out, lse

    def backward(self, q, k, v, b1, b2, out, lse, dout, want_dbias2):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        db2 = torch.empty_like(b2) if (want_dbias2 and b2 is not None) else None
        args = self._shape(q) + [q.data_ptr(), k.data_ptr(), v.data_ptr(), self._ptr(b1), self._code(b1),
                                 self._ptr(b2), self._code(b2), out.data_ptr(), lse.data_ptr(), dout.data_ptr(),
                                 dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), None, self._ptr(db2)]
        ws_bytes = self.lib.sciattn_evoformer_backward_workspace_size(*args)
        ws = torch.empty(max(ws_bytes, 1), device=q.device, dtype=torch.uint8)
        rc = self.lib.sciattn_evoformer_backward(*args, ws.data_ptr(), ws_bytes,
                                                 torch.cuda.current_stream().cuda_stream, self.err, 1024)
        if rc != 0:
            raise RuntimeError(self.err.value.decode())
        return dq, dk, dv, db2


def naive(q, k, v, b1, b2, scale):
    qt, kt, vt = (x.transpose(-2, -3) for x in (q, k, v))  # [B, N, H, L, D]
    s = torch.matmul(qt, kt.transpose(-1, -2)) * scale + b1
    if b2 is not None:
        s = s + b2
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return torch.matmul(p, vt).transpose(-2, -3)


def sdpa_efficient(q, k, v, b1, b2, scale):
    B, N, L, H, D = q.shape
    qt, kt, vt = (x.transpose(-2, -3).reshape(B * N, H, L, D) for x in (q, k, v))
    bias = b1 if b2 is None else b1 + b2  # materialised [B, N, H, L, L]
    bias = bias.expand(B, N, H, L, L).reshape(B * N, H, L, L)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION):
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias, scale=scale)
    return o.reshape(B, N, H, L, D).transpose(-2, -3)


_flex = None


def flex(q, k, v, b1, b2, scale):
    global _flex
    from torch.nn.attention.flex_attention import flex_attention
    if _flex is None:
        _flex = torch.compile(flex_attention, dynamic=False)
    B, N, L, H, D = q.shape
    qt, kt, vt = (x.transpose(-2, -3).reshape(B * N, H, L, D) for x in (q, k, v))
    b1f = b1.reshape(B * N, L)
    if b2 is not None:
        b2f = b2.reshape(B, H, L, L)

        def score_mod(score, b, h, qi, ki):
            return score + b1f[b, ki] + b2f[b // N, h, qi, ki]
    else:
        def score_mod(score, b, h, qi, ki):
            return score + b1f[b, ki]
    o = _flex(qt, kt, vt, score_mod=score_mod, scale=scale)
    return o.reshape(B, N, H, L, D).transpose(-2, -3)


def make_inputs(shape, has_bias2, dtype, seed):
    B, N, L, H, D = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, dout = (torch.randn((B, N, L, H, D), device="cuda", dtype=dtype, generator=g) for _ in range(4))
    mask = torch.rand((B, N, 1, 1, L), device="cuda", generator=g) > 0.1
    b1 = (1e9 * (mask.to(dtype) - 1)).to(dtype)  # OpenFold's mask bias
    b2 = torch.randn((B, 1, H, L, L), device="cuda", dtype=dtype, generator=g) if has_bias2 else None
    return q, k, v, b1, b2, dout


def package_attention(package):
    """sciattn's Python package in the peers' calling convention."""
    def attention(q, k, v, b1, b2, scale):
        return package.evoformer_attention(q, k, v, b1, b2, scale)
    return attention


def run_shape(sci, package, name, shape, has_bias2, dtype, seed):
    """One shape: `sci` the ctypes wrapper, `package` the Python package's attention (or a
    string saying why it is not available)."""
    global _flex
    # A fresh compile per shape: FlexAttention recompiles for each new score_mod closure, and
    # past dynamo's recompile limit it silently falls back to an unfused path.
    torch._dynamo.reset()
    _flex = None
    B, N, L, H, D = shape
    scale = 1.0 / math.sqrt(D)
    q, k, v, b1, b2, dout = make_inputs(shape, has_bias2, dtype, seed)
    S = B * N * H * L * L
    row = {"name": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
           "flops_fwd": 4 * S * D, "flops_fwd_bwd": 14 * S * D, "exps_fwd": S, "exps_fwd_bwd": 3 * S}

    # Correctness of sciattn against naive in fp32 on this very input.
    with torch.no_grad():
        ref = naive(q.float(), k.float(), v.float(), b1.float(), None if b2 is None else b2.float(), scale)
        out, lse = sci.forward(q, k, v, b1, b2)
        row["sciattn_rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()

    def sci_fwd():
        sci.forward(q, k, v, b1, b2)

    def sci_fwd_bwd():
        o, l = sci.forward(q, k, v, b1, b2)
        sci.backward(q, k, v, b1, b2, o, l, dout, True)

    impls = {"sciattn": (sci_fwd, sci_fwd_bwd)}
    peers = [("naive", naive), ("sdpa_efficient", sdpa_efficient), ("flex", flex)]
    if isinstance(package, str):
        row["sciattn_package_error"] = package
    else:
        peers.insert(0, ("sciattn_package", package))
    for peer_name, peer in peers:
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        b2g = None if b2 is None else b2.detach().clone().requires_grad_(True)

        def fwd(peer=peer):
            with torch.no_grad():
                peer(q, k, v, b1, b2, scale)

        def fwd_bwd(peer=peer, qg=qg, kg=kg, vg=vg, b2g=b2g):
            # autograd.grad returns the gradients without adding them into .grad, so that no
            # accumulation kernels are timed (sciattn's backward writes its outputs once, too).
            # allow_unused: a peer that leaves bias2 out of its graph runs as with .backward().
            o = peer(qg, kg, vg, b1, b2g, scale)
            torch.autograd.grad(o, [x for x in (qg, kg, vg, b2g) if x is not None], dout,
                                allow_unused=True)
        impls[peer_name] = (fwd, fwd_bwd)

    for impl_name, (fwd, fwd_bwd) in impls.items():
        try:
            row[impl_name + "_fwd_ms"] = time_ms(fwd)
            row[impl_name + "_fwd_bwd_ms"] = time_ms(fwd_bwd)
            row[impl_name + "_peak_bytes"] = peak_extra_bytes(fwd_bwd)
        except Exception as e:  # a peer that cannot run this shape
            row[impl_name + "_error"] = error_text(e)
            torch.cuda.empty_cache()
    return row


def print_table(rows):
    peers = ["naive", "sdpa_efficient", "flex"]
    # ratio: peer / sciattn through ctypes; best/pkg: the fastest peer that ran / sciattn through
    # the package and autograd (timed as the peers are: the 2x target's ratio).
    head = (f"{'shape':<20}{'dtype':<9}{'sciattn fwd':>12}{'fwd+bwd':>10}{'pkg f+b':>9}{'best/pkg':>9}"
            f"{'TFLOP/s':>9}"
            f"{'%mm':>6}{'%exp':>6}"
            + "".join(f"{p + ' f+b':>20}{'ratio':>7}" for p in peers) + f"{'sci mem':>10}{'min peer mem':>13}{'err':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r.get("sciattn_fwd_bwd_ms")
        line = f"{r['name']:<20}{r['dtype']:<9}"
        if t is None:
            line += f"  sciattn failed: {r.get('sciattn_error')}"
            print(line)
            continue
        tflops = r["flops_fwd_bwd"] / (t * 1e-3) / 1e12
        pkg = r.get("sciattn_package_fwd_bwd_ms")
        line += f"{r['sciattn_fwd_ms']:>12.3f}{t:>10.3f}"
        line += f"{pkg:>9.3f}" if pkg is not None else f"{'-':>9}"
        peer_times = [r[p + "_fwd_bwd_ms"] for p in peers if r.get(p + "_fwd_bwd_ms") is not None]
        line += (f"{min(peer_times) / pkg:>9.2f}" if pkg is not None and peer_times
                 else f"{'-':>9}")
        line += f"{tflops:>9.1f}"
        line += f"{100 * tflops * 1e12 / MATMUL_CEILING:>5.1f}%{100 * r['exps_fwd_bwd'] / (t * 1e-3) / EXP_CEILING:>5.1f}%"
        mems = []
        for p in peers:
            pt = r.get(p + "_fwd_bwd_ms")
            if pt is None:
                line += f"{'fails':>20}{'-':>7}"
            else:
                line += f"{pt:>20.3f}{pt / t:>7.2f}"
                mems.append(r[p + "_peak_bytes"])
        line += f"{r['sciattn_peak_bytes'] / 2**20:>9.1f}M"
        line += f"{(min(mems) / 2**20 if mems else float('nan')):>12.1f}M{r['sciattn_rel_err']:>9.1e}"
        print(line)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    impls = ["sciattn", "sciattn_package", "naive", "sdpa_efficient", "flex"]
    labels = [f"{r['name']}\n{r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.2), 5))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        ys = [r.get(impl + "_fwd_bwd_ms", 0.0) for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], ys, width, label=impl)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("forward + backward, ms (lower is better)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("Evoformer attention on H200: sciattn vs peers")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path to libsciattn_capi.so")
    ap.add_argument("--out", default="results", help="folder for evoformer.json and evoformer.png")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--shapes", default="", help="comma-separated subset of shape names")
    ap.add_argument("--kernels", default="auto", choices=["auto", "portable", "portable-99k"],
                    help="SCIATTN_CUDA_KERNELS for sciattn's calls: auto (the fastest this GPU "
                         "has), portable (the mma.sync kernels sm_80/86/89 run) or portable-99k "
                         "(those within sm_86/89's 99 KiB of shared memory per block)")
    args = ap.parse_args()
    # Read by the library at each call (src/cuda/common/kernel_path.h), so set before any.
    os.environ["SCIATTN_CUDA_KERNELS"] = args.kernels
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    raise_compile_limits()
    sci = Sciattn(args.lib)
    try:
        package = import_sciattn()
        package = (package_attention(package) if package.built_with_cuda()
                   else "the sciattn package has no CUDA kernels (scripts/build_torch_ext.sh --cuda)")
    except Exception as e:  # not built here
        package = f"the sciattn package is not importable: {error_text(e)}"
    if isinstance(package, str):
        print(f"warning: {package}; its columns stay empty", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    wanted = [s for s in args.shapes.split(",") if s]
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for i, (name, shape, has_bias2) in enumerate(SHAPES):
            if wanted and name not in wanted:
                continue
            rows.append(run_shape(sci, package, name, shape, has_bias2, dtype, seed=1234 + i))
            print(f"done {name} {dtype_name}", file=sys.stderr, flush=True)
    print_table(rows)
    meta = dict(gpu_meta(), ds4sci_ms_from_performance_md=DS4SCI_MS, sciattn_kernels=args.kernels)
    write_json(os.path.join(args.out, "evoformer.json"), meta, rows)
    try:
        plot(rows, os.path.join(args.out, "evoformer.png"))
    except Exception as e:
        print(f"plot failed: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
