"""Host (CPU) time of the pieces of one Evoformer forward + backward call, on the GPU machine.

Each piece runs with the GPU kept busy by a sleep kernel queued just before it, so the time is
what the host spends issuing the call, not the kernels' time; median of 40 calls, in us:

    python3 bench/compare/evoformer_host_time.py --lib build/gpu/bindings/capi/libsciattn_capi.so

(with the Python package built with CUDA, scripts/build_torch_ext.sh --cuda). For small shapes
the compare script's times through autograd are bound by this host time, not by the kernels.
"""
import argparse
import math
import statistics
import time

import torch

import evoformer as E
from common import import_sciattn


def host_us(fn, reps=40):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(6_000_000)  # a few ms of GPU work queued ahead of the call
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="libsciattn_capi.so (the ctypes path)")
    args = ap.parse_args()
    sciattn = import_sciattn()
    ops = sciattn._ops.ops
    sci = E.Sciattn(args.lib)
    for name, shape, has_bias2 in E.SHAPES:
        q, k, v, b1, b2, dout = E.make_inputs(shape, has_bias2, torch.bfloat16, 1)
        scale = 1 / math.sqrt(shape[-1])
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        b2g = None if b2 is None else b2.detach().clone().requires_grad_(True)
        leaves = [x for x in (qg, kg, vg, b2g) if x is not None]
        out, lse = ops.evoformer_fwd(q, k, v, b1, b2, scale, "tiled")
        out_g = sciattn.evoformer_attention(qg, kg, vg, b1, b2g, scale)
        c_out, c_lse = sci.forward(q, k, v, b1, b2)
        out_sdpa = E.sdpa_efficient(qg, kg, vg, b1, b2g, scale)  # a peer's graph, for comparison
        pieces = {
            "fwd op": lambda: ops.evoformer_fwd(q, k, v, b1, b2, scale, "tiled"),
            "bwd op": lambda: ops.evoformer_bwd(dout, q, k, v, b1, b2, out, lse, scale, False,
                                                b2 is not None, "tiled"),
            "package fwd (autograd)": lambda: sciattn.evoformer_attention(qg, kg, vg, b1, b2g,
                                                                          scale),
            "autograd.grad": lambda: torch.autograd.grad(out_g, leaves, dout, retain_graph=True),
            "SDPA's autograd.grad": lambda: torch.autograd.grad(out_sdpa, leaves, dout,
                                                                retain_graph=True),
            "ctypes fwd": lambda: sci.forward(q, k, v, b1, b2),
            "ctypes bwd": lambda: sci.backward(q, k, v, b1, b2, c_out, c_lse, dout, True),
            "5 tiny kernels": lambda: [q.add_(0) for _ in range(5)],
        }
        print(f"{name}: " + ", ".join(f"{p} {host_us(fn):.0f}" for p, fn in pieces.items()),
              flush=True)


if __name__ == "__main__":
    main()
