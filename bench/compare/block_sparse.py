#!/usr/bin/env python3
"""Block-sparse self-attention on the GPU: sciattn against its peers, in one process, on the same
inputs.

Implementations, each forward and forward + backward through autograd, q/k/v [B, H, L, D]:
  sciattn fused       sciattn.sparse_attention.SparseSelfAttention(algorithm="fused")
  sciattn composite   the same module, algorithm="composite" (DeepSpeed's sdd -> softmax -> dsd)
  dense flash         F.scaled_dot_product_attention with the FlashAttention backend, no mask
                      (the cost of ignoring the sparsity; independent of the layout)
  flex                torch.compile(flex_attention) with a BlockMask built from the same layout

The layouts are DeepSpeed's BigBird, BSLongformer, Fixed and Variable configs with their class
defaults (sciattn.sparse_attention.*SparsityConfig, seed 0), at block 64 and block 16 (the block of
DeepSpeed's BERT recipe), B = 1, H = 16, D = 64 and 128, fp16 and bf16, L = 4,096, 16,384, 65,536.

FlexAttention's BlockMask works on blocks of BLOCK_SIZE = 128 tokens (64 fails to compile in
torch 2.11, PERFORMANCE.md). A layout with smaller blocks b is therefore coarsened: each 128 x 128
tile covers (128/b)^2 layout blocks; a tile whose layout blocks are all present is a "full" block
(no mask function is evaluated), a tile with some present is a "partial" block on which a
mask_mod reads the layout itself (layout[h, q // b, kv // b]), and a tile with none is skipped.
The BlockMask is made with BlockMask.from_kv_blocks from those tile lists (no dense [L, L] mask is
ever built), so Flex computes exactly the layout's attention; `--self-test` checks the conversion
against the layout on the CPU.

Columns: times in ms; 'x peer' = peer time / sciattn fused time (> 1: sciattn is faster);
'x dens*flash' = sciattn fused time / (density x dense flash time) (the target is <= 1.5 plus a
small fixed overhead); '%ceil' = sciattn fused TFLOP/s on the layout's blocks (forward 4 nnz b^2 D,
backward 10 nnz b^2 D per batch) over the H200's measured 790 TFLOP/s; peak extra memory of
forward + backward.

Usage (on the GPU machine, after scripts/build_torch_ext.sh --cuda):
  PYTHONPATH=bindings/torch/python python3 bench/compare/block_sparse.py --out results/
  ... --quick                       # L 4096 and 16384, D 64, bf16, block 64: a few minutes
  ... --lengths 65536 --layouts bigbird,bslongformer --dtypes float16 --blocks 64
  python3 bench/compare/block_sparse.py --self-test   # CPU only: the BlockMask conversion
  ... --device cpu --lengths 512 --dims 32 --heads 2 --reps 2   # a dry run of every code path
Prints a table; writes <out>/block_sparse.json and <out>/block_sparse.png.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (MATMUL_CEILING, error_text, gpu_meta, import_sciattn,  # noqa: E402
                    peak_extra_bytes, raise_compile_limits, time_ms, write_json)

LAYOUTS = ["bigbird", "bslongformer", "fixed", "variable"]
LENGTHS = [4096, 16384, 65536]
BLOCKS = [64, 16]
DIMS = [64, 128]
DTYPES = ["float16", "bfloat16"]
FLEX_BLOCK = 128
BATCH, HEADS = 1, 16
IMPLS = ["sciattn_fused", "sciattn_composite", "dense_flash", "flex"]
# FlexAttention and dense flash times from PERFORMANCE.md (fp16, D 64, block 64, fwd+bwd, ms),
# for reference only: measured there, not here.
PERFORMANCE_MD_MS = {
    4096: {"dense_flash": 0.96, "bigbird": 1.19, "bslongformer": 1.12, "fixed": 1.63},
    16384: {"dense_flash": 13.3, "bigbird": 4.28, "bslongformer": 3.81, "fixed": 21.0},
    65536: {"dense_flash": 209, "bigbird": 17.2, "bslongformer": 14.6, "fixed": 323},
}


def sparsity_config(sciattn, name, block, heads=None):
    """DeepSpeed's config class `name` with its defaults (seed 0) for `block`, H = heads (the
    benchmark's HEADS by default)."""
    sa = sciattn.sparse_attention
    cls = {"bigbird": sa.BigBirdSparsityConfig, "bslongformer": sa.BSLongformerSparsityConfig,
           "fixed": sa.FixedSparsityConfig, "variable": sa.VariableSparsityConfig}[name]
    return cls(num_heads=HEADS if heads is None else heads, block=block)


# ---- the layout as a FlexAttention BlockMask ---------------------------------------------------

def _block_lists(present):
    """[H, R, C] bool -> (num [1, H, R] int32, indices [1, H, R, C] int32): each row's present
    columns first, in ascending order (what BlockMask.from_kv_blocks takes)."""
    num = present.sum(-1, dtype=torch.int32)
    # A stable sort of "absent" (0 for present) keeps the present columns first and in order.
    idx = torch.argsort((~present).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[None], idx[None]


def coarsen_layout(layout, block, flex_block=FLEX_BLOCK):
    """layout [H, R, C] of blocks of `block` tokens -> (full, partial), [H, R', C'] bool over
    tiles of flex_block tokens: full tiles have every layout block present, partial ones some."""
    if flex_block % block != 0:
        raise ValueError(f"the Flex block {flex_block} must be a multiple of the layout block "
                         f"{block}")
    f = flex_block // block
    H, R, C = layout.shape
    if R % f or C % f:
        raise ValueError(f"the layout's {R} x {C} blocks of {block} do not tile into blocks of "
                         f"{flex_block}; use a length that is a multiple of {flex_block}")
    counts = layout.to(torch.int32).reshape(H, R // f, f, C // f, f).sum(dim=(2, 4))
    full = counts == f * f
    partial = (counts > 0) & ~full
    return full, partial


def layout_block_mask(layout, block, seq_len, device, flex_block=FLEX_BLOCK):
    """The FlexAttention BlockMask (and its mask_mod) of a sciattn/DeepSpeed layout [H, R, C]."""
    from torch.nn.attention.flex_attention import BlockMask
    dense_layout = layout.to(device=device, dtype=torch.bool)
    if block % flex_block == 0:
        # Layout blocks at least as large as Flex's: list them as they are, all full.
        full, partial = layout.bool(), torch.zeros_like(layout, dtype=torch.bool)
        flex_block = block
    else:
        full, partial = coarsen_layout(layout, block, flex_block)

    def mask_mod(b, h, q_idx, kv_idx):
        return dense_layout[h, q_idx // block, kv_idx // block]

    num, idx = _block_lists(partial)
    full_num, full_idx = _block_lists(full)
    bm = BlockMask.from_kv_blocks(num.to(device), idx.to(device), full_num.to(device),
                                  full_idx.to(device), BLOCK_SIZE=flex_block, mask_mod=mask_mod,
                                  seq_lengths=(seq_len, seq_len))
    return bm, mask_mod


def block_mask_to_dense(bm, mask_mod, seq_len, heads):
    """The [H, L, L] bool mask a BlockMask means (full tiles, plus partial tiles through
    mask_mod), built from its tile lists: the check of layout_block_mask."""
    bq, bk = bm.BLOCK_SIZE if isinstance(bm.BLOCK_SIZE, tuple) else (bm.BLOCK_SIZE,) * 2
    out = torch.zeros(heads, seq_len, seq_len, dtype=torch.bool)
    q = torch.arange(seq_len)
    for h in range(heads):
        for r in range(bm.kv_num_blocks.shape[2]):
            rows = slice(r * bq, (r + 1) * bq)
            for j in bm.full_kv_indices[0, h, r, :int(bm.full_kv_num_blocks[0, h, r])].tolist():
                out[h, rows, j * bk:(j + 1) * bk] = True
            for j in bm.kv_indices[0, h, r, :int(bm.kv_num_blocks[0, h, r])].tolist():
                qi = q[rows][:, None]
                ki = torch.arange(j * bk, (j + 1) * bk)[None, :]
                out[h, rows, j * bk:(j + 1) * bk] = mask_mod(0, h, qi, ki).cpu()
    return out


def self_test():
    """CPU check of the layout -> BlockMask conversion on small layouts of every kind and block,
    and (when flex_attention runs on this machine's CPU) of Flex's output against a dense masked
    softmax."""
    sciattn = import_sciattn()
    checked = 0
    for name in LAYOUTS:
        for block in (16, 32, 64, 128):
            L = 512
            config = sparsity_config(sciattn, name, block, heads=2)
            layout = config.make_layout(L)
            bm, mm = layout_block_mask(layout, block, L, "cpu")
            want = layout.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)
            got = block_mask_to_dense(bm, mm, L, layout.shape[0])
            assert torch.equal(got, want), f"{name} block {block}: BlockMask differs from layout"
            checked += 1
    print(f"self-test: {checked} layouts converted to BlockMasks exactly")
    try:
        from torch.nn.attention.flex_attention import flex_attention
        L, block = 256, 16
        config = sparsity_config(sciattn, "bigbird", block, heads=2)
        layout = config.make_layout(L)
        bm, _ = layout_block_mask(layout, block, L, "cpu")
        q, k, v = (torch.randn(1, 2, L, 32) for _ in range(3))
        out = flex_attention(q, k, v, block_mask=bm)
        mask = layout.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None])
        err = (out - ref).abs().max().item()
        assert err < 1e-4, f"flex on the CPU differs from the dense masked softmax by {err}"
        print(f"self-test: flex_attention with the BlockMask matches dense masked SDPA on the CPU "
              f"(max err {err:.1e})")
    except Exception as e:  # flex_attention's CPU path needs a compiler on some installs
        print(f"self-test: flex_attention on the CPU not checked ({error_text(e)})")


# ---- one row ------------------------------------------------------------------------------------

_dense_cache = {}
DEVICE = "cuda"  # --device cpu: a dry run of the whole script on small shapes (wall-clock times)


def _time(fn, warmup, reps):
    if DEVICE == "cuda":
        return time_ms(fn, warmup=warmup, reps=reps)
    import statistics
    import time
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _peak(fn):
    return peak_extra_bytes(fn) if DEVICE == "cuda" else 0


def run_row(sciattn, layout_name, L, block, D, dtype, seed, reps, impls):
    torch._dynamo.reset()  # a fresh compile per layout (the mask_mod closure changes)
    config = sparsity_config(sciattn, layout_name, block)
    layout = config.make_layout(L)
    H, R, C = layout.shape
    nnz = int(layout.sum())
    density = nnz / (H * R * C)
    flops_fwd = 4 * BATCH * nnz * block * block * D
    row = {"layout": layout_name, "L": L, "block": block, "D": D, "B": BATCH, "H": H,
           "dtype": str(dtype).replace("torch.", ""), "nnz": nnz, "density": density,
           "flops_fwd": flops_fwd, "flops_fwd_bwd": flops_fwd * 14 // 4}
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v, dout = (torch.randn((BATCH, H, L, D), device=DEVICE, dtype=dtype, generator=g)
                     for _ in range(4))
    scale = 1.0 / math.sqrt(D)
    outputs = {}

    def sci(algorithm):
        module = sciattn.sparse_attention.SparseSelfAttention(config, max_seq_length=L,
                                                               algorithm=algorithm)
        return lambda qq, kk, vv: module(qq, kk, vv)

    def flash(qq, kk, vv):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qq, kk, vv, scale=scale)

    def flex():
        from torch.nn.attention.flex_attention import flex_attention
        bm, _ = layout_block_mask(layout, block, L, DEVICE)
        compiled = torch.compile(flex_attention, dynamic=False)
        return lambda qq, kk, vv: compiled(qq, kk, vv, block_mask=bm, scale=scale)

    makers = {"sciattn_fused": lambda: sci("fused"), "sciattn_composite": lambda: sci("composite"),
              "dense_flash": lambda: flash, "flex": flex}
    for impl in impls:
        key = (L, D, dtype)
        if impl == "dense_flash" and key in _dense_cache:  # the same for every layout
            row.update({k2.replace("@", impl): v2 for k2, v2 in _dense_cache[key].items()})
            continue
        try:
            fn = makers[impl]()
            qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

            def fwd(fn=fn):
                with torch.no_grad():
                    return fn(q, k, v)

            def fwd_bwd(fn=fn, qg=qg, kg=kg, vg=vg):
                # autograd.grad returns dq, dk, dv without adding them into .grad: no
                # accumulation kernels (3 x 402 MB of traffic at 65,536 tokens) in the timing.
                torch.autograd.grad(fn(qg, kg, vg), (qg, kg, vg), dout)

            warm = 3 if L >= 65536 else 5
            if impl != "dense_flash":
                outputs[impl] = fwd()
            row[impl + "_fwd_ms"] = _time(fwd, warm, reps)
            # The backward may fail where the forward ran (kept): e.g. out of memory.
            row[impl + "_fwd_bwd_ms"] = _time(fwd_bwd, warm, reps)
            row[impl + "_peak_bytes"] = _peak(fwd_bwd)
            if impl == "dense_flash":
                _dense_cache[key] = {k2.replace(impl, "@"): v2 for k2, v2 in row.items()
                                     if k2.startswith(impl)}
        except Exception as e:  # a path that cannot run this shape (or is not there yet)
            row[impl + "_error"] = error_text(e)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    # Agreement on this very input: sciattn against Flex (the same masked attention), relative
    # to the output's norm.
    ref = outputs.get("flex")
    for impl in ("sciattn_fused", "sciattn_composite"):
        if impl in outputs and ref is not None:
            o = outputs[impl].float()
            row[impl + "_rel_err_vs_flex"] = ((o - ref.float()).norm() / ref.float().norm()).item()
    return row


# ---- the report ---------------------------------------------------------------------------------

def _fmt(x, width, digits=2):
    return f"{x:>{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def print_table(rows):
    head = (f"{'layout':<13}{'L':>6}{'blk':>4}{'D':>4}{'dtype':>9}{'dens%':>7}"
            f"{'fused fwd':>10}{'f+b':>8}{'TFLOP/s':>8}{'%ceil':>6}"
            f"{'comp f+b':>9}{'x comp':>7}{'flash f+b':>10}{'x flash':>8}{'x dens*flash':>13}"
            f"{'flex f+b':>9}{'x flex':>7}{'mem fused':>10}{'mem flex':>9}{'err':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r.get("sciattn_fused_fwd_bwd_ms")
        line = (f"{r['layout']:<13}{r['L']:>6}{r['block']:>4}{r['D']:>4}{r['dtype']:>9}"
                f"{100 * r['density']:>7.2f}")
        if t is None:
            line += f"{'-':>10}{'-':>8}{'-':>8}{'-':>6}"
            tflops = None
        else:
            tflops = r["flops_fwd_bwd"] / (t * 1e-3) / 1e12
            line += (f"{r['sciattn_fused_fwd_ms']:>10.3f}{t:>8.3f}{tflops:>8.1f}"
                     f"{100 * tflops * 1e12 / MATMUL_CEILING:>5.1f}%")

        def ratio(peer):
            pt = r.get(peer + "_fwd_bwd_ms")
            return pt, (pt / t if (pt is not None and t) else None)

        comp, x_comp = ratio("sciattn_composite")
        flash, x_flash = ratio("dense_flash")
        flex, x_flex = ratio("flex")
        x_dens = t / (r["density"] * flash) if (t and flash) else None
        line += (_fmt(comp, 9, 3) + _fmt(x_comp, 7) + _fmt(flash, 10, 3) + _fmt(x_flash, 8)
                 + _fmt(x_dens, 13) + _fmt(flex, 9, 3) + _fmt(x_flex, 7))
        for impl, w in (("sciattn_fused", 10), ("flex", 9)):
            b = r.get(impl + "_peak_bytes")
            line += f"{b / 2**20:>{w - 1}.0f}M" if b is not None else f"{'-':>{w}}"
        err = r.get("sciattn_fused_rel_err_vs_flex")
        line += f"{err:>8.1e}" if err is not None else f"{'-':>8}"
        print(line)
    failures = sorted({(impl, r[impl + "_error"]) for r in rows for impl in IMPLS
                       if impl + "_error" in r})
    if failures:
        print("\nFailures (implementation: first line of the error):")
        for impl, msg in failures:
            print(f"  {impl}: {msg}")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    markers = {"sciattn_fused": "o", "sciattn_composite": "s", "flex": "^"}
    lengths = sorted({r["L"] for r in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4.5), squeeze=False)
    for ax, L in zip(axes[0], lengths):
        sub = [r for r in rows if r["L"] == L]
        for impl, m in markers.items():
            pts = [(r["density"], r[impl + "_fwd_bwd_ms"]) for r in sub
                   if impl + "_fwd_bwd_ms" in r]
            if pts:
                ax.scatter(*zip(*pts), marker=m, label=impl)
        # density x dense flash: the time a cost linear in density would give.
        pts = sorted((r["density"], r["density"] * r["dense_flash_fwd_bwd_ms"]) for r in sub
                     if "dense_flash_fwd_bwd_ms" in r)
        if pts:
            ax.plot(*zip(*pts), "k--", lw=1, label="density x dense flash")
            ax.axhline(max(p[1] / p[0] for p in pts), color="gray", lw=1, label="dense flash")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("layout density")
        ax.set_ylabel("forward + backward, ms")
        ax.set_title(f"L = {L}")
        ax.legend(fontsize=7)
    fig.suptitle("Block-sparse attention on the H200 (B=1, H=16): time against density")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def csv_list(text, cast=str):
    return [cast(x) for x in text.split(",") if x]


def main():
    global DEVICE, HEADS
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results", help="folder for block_sparse.json and .png")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--blocks", default=",".join(map(str, BLOCKS)))
    ap.add_argument("--dims", default=",".join(map(str, DIMS)), help="head dims D")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"subset of {','.join(IMPLS)}")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per measurement (median)")
    ap.add_argument("--quick", action="store_true",
                    help="L 4096,16384, D 64, bf16, block 64, 10 reps (overrides those options)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of the script's code paths on small shapes (e.g. "
                         "--lengths 512 --dims 32 --heads 2); times are wall-clock, memory 0")
    ap.add_argument("--heads", type=int, default=HEADS, help="H (16, the benchmark's)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the layout -> BlockMask conversion on the CPU and exit")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    DEVICE, HEADS = args.device, args.heads
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device (use --self-test to check the BlockMask conversion on the CPU)")
    if args.quick:
        args.lengths, args.dims, args.dtypes, args.blocks, args.reps = (
            "4096,16384", "64", "bfloat16", "64", 10)
    sciattn = import_sciattn()
    if not sciattn.built_with_cuda():
        print("warning: this sciattn build has no CUDA kernels (build it with "
              "scripts/build_torch_ext.sh --cuda); its rows will fail", file=sys.stderr)
    raise_compile_limits()
    impls = csv_list(args.impls)
    unknown = set(impls) - set(IMPLS)
    if unknown:
        sys.exit(f"unknown --impls {sorted(unknown)}; choose from {IMPLS}")
    meta = dict(gpu_meta() if DEVICE == "cuda" else {"device": "cpu (dry run)"},
                heads=HEADS, sciattn_built_with_cuda=sciattn.built_with_cuda(),
                flex_block_size=FLEX_BLOCK, performance_md_fwd_bwd_ms=PERFORMANCE_MD_MS,
                matmul_ceiling_flops=MATMUL_CEILING)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "block_sparse.json")
    rows = []
    seed = 1234
    for dtype_name in csv_list(args.dtypes):
        dtype = getattr(torch, dtype_name)
        for D in csv_list(args.dims, int):
            for L in csv_list(args.lengths, int):
                for block in csv_list(args.blocks, int):
                    for name in csv_list(args.layouts):
                        if name not in LAYOUTS:
                            sys.exit(f"unknown layout {name!r}; choose from {LAYOUTS}")
                        seed += 1
                        rows.append(run_row(sciattn, name, L, block, D, dtype, seed, args.reps,
                                            impls))
                        # Written after every row, so that a run cut short (a time limit on
                        # the GPU machine) keeps the rows it finished.
                        write_json(json_path, meta, rows)
                        print(f"done {name} L={L} block={block} D={D} {dtype_name}",
                              file=sys.stderr, flush=True)
    print_table(rows)
    try:
        plot(rows, os.path.join(args.out, "block_sparse.png"))
    except Exception as e:
        print(f"plot failed: {error_text(e)}", file=sys.stderr)


if __name__ == "__main__":
    main()
