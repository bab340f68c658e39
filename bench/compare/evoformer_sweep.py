#!/usr/bin/env python3
"""Evoformer attention over a dense grid of lengths and head dims: does any shape fall off a cliff?

For every measured shape the sweep also times its "friendly" neighbour with the same B, N and H:
L rounded up to a multiple of 64 (the kernels' tile) and D up to the next instantiated head dim
(8, 16, 32, 64, 128). A shape with no cliff takes at most about the friendly one's time (it does
at most the same work); the summary prints, for the forward and for forward + backward, the worst
ratio time(shape) / time(friendly shape) and where it is.

Length sweep: triangle-attention shapes [1, N = L, L, 4, 32] with a mask (bias1) and a pair bias
(bias2), L in 250..260, 296..304, 380..390, 496..516 and the multiples of 32 up to 1024; the
friendly shape keeps N = L and rounds L. Head-dim sweep: [1, 256, 256, H, D] with the same biases
for every D in 1..128, H 4 unless --heads says otherwise (the head count decides how rows that
are not whole 16-byte chunks can be read: an odd D's forward reads them in place only when H is
even). bf16.

sciattn is called through libsciattn_capi.so (bench/compare/evoformer.py's ctypes wrapper: each
call's workspace from torch's allocator). Each time is the median of 20 samples, a sample
`--inner` calls back to back (default 10: the GPU's time per call; with single calls from an
idle GPU the host's launch latency, about 30 us through ctypes, is part of every sample, and its
jitter made single points up to 1.5x their neighbours). Peers beside it, on the same inputs: FlexAttention
(torch.compile, a score_mod bias; one compile per shape, so by default only at --peer-lengths and
--peer-dims) and SDPA's memory-efficient backend with a materialised bias.

Usage (on the GPU machine):
  python3 bench/compare/evoformer_sweep.py --lib build/gpu/bindings/capi/libsciattn_capi.so \\
      --out results/ [--peers flex,sdpa] [--quick]
Writes results/evoformer_sweep.json and results/evoformer_sweep.png (ms against L and against D,
one line per implementation, forward + backward).
"""
import argparse
import math
import os
import sys

import torch

from common import error_text, gpu_meta, raise_compile_limits, time_ms, write_json
import evoformer as evo

LENGTHS = (list(range(250, 261)) + list(range(296, 305)) + list(range(380, 391)) +
           list(range(496, 517)) + list(range(32, 1025, 32)))
PEER_LENGTHS = [64, 128, 256, 257, 288, 300, 320, 321, 383, 384, 500, 512, 768, 1000, 1024]
QUICK_LENGTHS = [64, 96, 250, 256, 257, 260, 288, 300, 304, 320, 321, 383, 384, 385, 500, 511, 512,
                 513, 640, 768, 1000, 1024]
DIMS = list(range(1, 129))
PEER_DIMS = [8, 16, 24, 32, 40, 48, 64, 96, 128]
QUICK_DIMS = [1, 4, 7, 8, 12, 16, 20, 24, 31, 32, 33, 40, 48, 56, 63, 64, 72, 80, 96, 100, 120,
              127, 128]
INSTANTIATED = (8, 16, 32, 64, 128)


def round_up(x, m):
    return (x + m - 1) // m * m


def friendly_dim(d):
    return next(h for h in INSTANTIATED if h >= d)


def length_shape(L):
    return (1, L, L, 4, 32)


def dim_shape(D, heads=4):
    return (1, 256, 256, heads, D)


class Timer:
    """Times one shape per implementation, caching sciattn's times (the friendly shapes repeat)."""

    def __init__(self, sci, peers, inner):
        self.sci = sci
        self.peers = peers
        self.inner = inner
        self.cache = {}

    def sciattn(self, shape):
        if shape not in self.cache:
            q, k, v, b1, b2, dout = evo.make_inputs(shape, True, torch.bfloat16, seed=sum(shape))

            def fwd():
                self.sci.forward(q, k, v, b1, b2)

            def fwd_bwd():
                o, lse = self.sci.forward(q, k, v, b1, b2)
                self.sci.backward(q, k, v, b1, b2, o, lse, dout, True)
            try:
                self.cache[shape] = {"fwd_ms": time_ms(fwd, inner=self.inner),
                                     "fwd_bwd_ms": time_ms(fwd_bwd, inner=self.inner)}
            except Exception as e:  # a shape sciattn refuses is a finding, not a crash
                self.cache[shape] = {"error": error_text(e)}
            del q, k, v, b1, b2, dout
        return self.cache[shape]

    def peer(self, name, shape):
        fn = {"flex": evo.flex, "sdpa": evo.sdpa_efficient}[name]
        if name == "flex":  # a fresh compile per shape (see evoformer.py's run_shape)
            torch._dynamo.reset()
            evo._flex = None
        B, N, L, H, D = shape
        scale = 1.0 / math.sqrt(D)
        q, k, v, b1, b2, dout = evo.make_inputs(shape, True, torch.bfloat16, seed=sum(shape))
        qg, kg, vg, b2g = (x.detach().clone().requires_grad_(True) for x in (q, k, v, b2))

        def fwd():
            with torch.no_grad():
                fn(q, k, v, b1, b2, scale)

        def fwd_bwd():
            o = fn(qg, kg, vg, b1, b2g, scale)
            torch.autograd.grad(o, [qg, kg, vg, b2g], dout)
        try:
            return {"fwd_ms": time_ms(fwd, inner=self.inner),
                    "fwd_bwd_ms": time_ms(fwd_bwd, inner=self.inner)}
        except Exception as e:
            torch.cuda.empty_cache()
            return {"error": error_text(e)}


def sweep(timer, axis, values, shape_of, friendly_of, peer_values, peers):
    rows = []
    for x in values:
        shape, friendly = shape_of(x), friendly_of(x)
        row = {"axis": axis, "value": x, "shape": list(shape), "friendly_shape": list(friendly),
               "sciattn": timer.sciattn(shape), "sciattn_friendly": timer.sciattn(friendly)}
        for key in ("fwd_ms", "fwd_bwd_ms"):
            t, f = row["sciattn"].get(key), row["sciattn_friendly"].get(key)
            if t is not None and f is not None:
                row[key.replace("_ms", "_ratio")] = t / f
        if x in peer_values:
            for p in peers:
                row[p] = timer.peer(p, shape)
        rows.append(row)
        r = row["sciattn"]
        line = f"{axis} {x:>5}  sciattn "
        line += (f"{r['fwd_ms']:.3f} / {r['fwd_bwd_ms']:.3f} ms  friendly ratio "
                 f"{row.get('fwd_ratio', float('nan')):.2f} / {row.get('fwd_bwd_ratio', float('nan')):.2f}"
                 if "error" not in r else f"failed: {r['error']}")
        for p in peers:
            if p in row:
                pr = row[p]
                line += (f"  {p} {pr['fwd_ms']:.3f} / {pr['fwd_bwd_ms']:.3f}" if "error" not in pr
                         else f"  {p} failed")
        print(line, flush=True)
    return rows


def summary(rows):
    lines = []
    for axis in ("L", "D"):
        for key, what in (("fwd_ratio", "forward"), ("fwd_bwd_ratio", "forward + backward")):
            rs = [r for r in rows if r["axis"] == axis and key in r]
            if not rs:
                continue
            worst = max(rs, key=lambda r: r[key])
            over = sum(1 for r in rs if r[key] > 1.1)
            lines.append(f"{axis} sweep, {what}: worst ratio to the friendly shape "
                         f"{worst[key]:.2f} at {tuple(worst['shape'])} (friendly "
                         f"{tuple(worst['friendly_shape'])}); {over} of {len(rs)} shapes above 1.1")
    return lines


def plot(rows, peers, path, heads=4):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    for ax, axis, label in ((axes[0], "L", "L (triangle [1, L, L, 4, 32])"),
                            (axes[1], "D", f"D ([1, 256, 256, {heads}, D])")):
        rs = [r for r in rows if r["axis"] == axis]
        for impl in ["sciattn"] + peers:
            pts = [(r["value"], r[impl]["fwd_bwd_ms"]) for r in rs
                   if impl in r and "fwd_bwd_ms" in r[impl]]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "o-" if impl != "sciattn" else ".-", label=impl, markersize=3)
        pts = [(r["value"], r["sciattn_friendly"]["fwd_bwd_ms"]) for r in rs
               if "fwd_bwd_ms" in r["sciattn_friendly"]]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, ":", color="gray", label="sciattn at the friendly shape")
        ax.set_xlabel(label)
        ax.set_ylabel("forward + backward, ms (bf16)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_sizes(flag, text, low, high):
    """The comma-separated positive integers of `text` (each within [low, high]), or exit naming
    the flag and the first bad entry."""
    sizes = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if not item.isdigit() or int(item) < low or (high is not None and int(item) > high):
            bound = f"{low}..{high}" if high is not None else f"integers >= {low}"
            sys.exit(f"{flag}: {item!r} is not a size; give comma-separated {bound}")
        sizes.append(int(item))
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path of libsciattn_capi.so")
    ap.add_argument("--out", default="results", help="folder for the JSON and the PNG")
    ap.add_argument("--peers", default="flex,sdpa",
                    help="comma-separated peers among flex, sdpa (empty: sciattn only)")
    ap.add_argument("--peer-lengths", default=",".join(map(str, PEER_LENGTHS)),
                    help="lengths at which the peers run ('all': every swept length)")
    ap.add_argument("--peer-dims", default=",".join(map(str, PEER_DIMS)),
                    help="head dims at which the peers run ('all': every swept head dim)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a coarser grid: L in {QUICK_LENGTHS}, D in {QUICK_DIMS}")
    ap.add_argument("--lengths", default=None,
                    help="comma-separated lengths replacing the length grid ('' skips it)")
    ap.add_argument("--inner", type=int, default=10,
                    help="calls per timed sample, back to back (default 10: the GPU's time per "
                         "call; 1: single calls from an idle GPU, host launch latency included)")
    ap.add_argument("--dims", default=None,
                    help="comma-separated head dims (1..128) replacing the head-dim grid ('' skips it)")
    ap.add_argument("--heads", type=int, default=4,
                    help="H of the head-dim sweep's shapes (default 4)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("evoformer_sweep.py needs a CUDA GPU (it times kernels)")
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in ("flex", "sdpa"):
            sys.exit(f"--peers: unknown peer {p!r}; choose among flex, sdpa")
    raise_compile_limits()
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    dims = QUICK_DIMS if args.quick else DIMS
    if args.lengths is not None:
        lengths = parse_sizes("--lengths", args.lengths, 1, None)
    if args.dims is not None:
        dims = parse_sizes("--dims", args.dims, 1, 128)
    peer_lengths = set(lengths) if args.peer_lengths == "all" else {int(x) for x in args.peer_lengths.split(",") if x}
    peer_dims = set(dims) if args.peer_dims == "all" else {int(x) for x in args.peer_dims.split(",") if x}

    if args.inner < 1:
        sys.exit(f"--inner: {args.inner} is not a count; give 1 or more")
    if args.heads < 1:
        sys.exit(f"--heads: {args.heads} is not a head count; give 1 or more")
    timer = Timer(evo.Sciattn(args.lib), peers, args.inner)
    rows = sweep(timer, "L", sorted(set(lengths)), length_shape,
                 lambda L: (1, L, round_up(L, 64), 4, 32), peer_lengths, peers)
    heads = args.heads
    rows += sweep(timer, "D", dims, lambda D: dim_shape(D, heads),
                  lambda D: dim_shape(friendly_dim(D), heads), peer_dims, peers)
    lines = summary(rows)
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    meta = gpu_meta()
    meta["summary"] = lines
    meta["calls_per_sample"] = args.inner
    write_json(os.path.join(args.out, "evoformer_sweep.json"), meta, rows)
    plot(rows, peers, os.path.join(args.out, "evoformer_sweep.png"), heads)


if __name__ == "__main__":
    main()
