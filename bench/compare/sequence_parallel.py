#!/usr/bin/env python3
"""Sequence parallelism (DeepSpeed-Ulysses) on two GPUs: one attention layer's forward + backward
with P = 1 (one GPU, the whole sequence) and P = 2 (sciattn.distributed.DistributedAttention over
NCCL, each GPU holding half the tokens), the all-to-alls on their own, and memory per GPU.

Each rank holds q, k, v [s/P, b, h, d] (DeepSpeed's sequence-first layout), b = 1, H = 16,
D = 64, bf16, at 65,536, 131,072 and 262,144 tokens. The local attention, on [b, h/P, s, d] views:
  bigbird        sciattn SparseSelfAttention, BigBirdSparsityConfig (DeepSpeed's defaults, seed 0),
                 block 64; at P = 2 each rank builds its heads' layouts (head_slice_config)
  dense_causal   sciattn SparseSelfAttention on the lower-triangular block layout, causal=True
  sdpa_causal    F.scaled_dot_product_attention(is_causal=True) (FlashAttention), for reference
P = 1 runs the same local attention on one GPU without any all-to-all (the other GPU waits).

Columns: 'layer ms' = forward + backward of the layer (median of --reps, CUDA events; at P = 2
the slower rank's); 'a2a ms' = the eight all-to-alls of that layer (q, k, v, out forward; dq, dk,
dv, dout backward) timed alone on tensors of the same shapes; 'a2a %' = a2a ms / layer ms (the
target at 128K tokens: under 10%); 'speedup' = P = 1 layer ms / P = 2 layer ms; 'saved GB' = memory
held from the end of the forward to the backward (the activations: inputs, output, what autograd
saved), 'peak GB' = the most memory the forward + backward holds above the inputs, both per GPU
(the larger rank's); 'mem ratio' = P = 2 saved GB / P = 1 saved GB (the target: about 0.5).

Usage (on the nvidia-h200-x2 machine, after scripts/build_torch_ext.sh --cuda):
  PYTHONPATH=bindings/torch/python python3 bench/compare/sequence_parallel.py --out results/
  ... --tokens 131072 --layouts bigbird        # one cell
  python3 bench/compare/sequence_parallel.py --cpu-smoke   # 2 gloo processes on the CPU, tiny
                                                           # shapes: every code path, no numbers
It starts its two processes itself (torchrun --nproc-per-node 2 works too). Rank 0 prints the
table and writes <out>/sequence_parallel.json.
"""
import argparse
import datetime
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import error_text, gpu_meta, import_sciattn, write_json  # noqa: E402

LAYOUTS = ["bigbird", "dense_causal", "sdpa_causal"]
TOKENS = [65536, 131072, 262144]
HEADS, DIM, BATCH, BLOCK = 16, 64, 1, 64
# A rank that another rank left inside a collective (an error on one side) gives up after this.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


# ---- the local attention of each layout -------------------------------------------------------

def causal_dense_config(sciattn, heads, block):
    """The lower-triangular block layout (dense causal attention at block granularity)."""
    base = sciattn.sparse_attention.SparsityConfig

    class CausalDense(base):
        def make_layout(self, seq_len):
            n = seq_len // self.block
            tril = torch.ones(n, n, dtype=torch.int64).tril_()
            return tril.expand(self.num_heads, n, n).contiguous()

    return CausalDense(heads, block)


def local_attention(sciattn, layout, seq_len, heads, block, group, device):
    """A function of seq-first q, k, v [s, b, h_local, d] -> [s, b, h_local, d] for `layout`;
    group None: all `heads` (P = 1), else this rank's slice of them."""
    sa = sciattn.sparse_attention
    if layout == "sdpa_causal":
        def sdpa(q, k, v):
            return F.scaled_dot_product_attention(
                *(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True).permute(2, 0, 1, 3)
        return sdpa
    if layout == "bigbird":
        config, causal = sa.BigBirdSparsityConfig(heads, block=block), False
    else:
        config, causal = causal_dense_config(sciattn, heads, block), True
    if group is not None:
        config = sciattn.distributed.head_slice_config(config, group)
    module = sa.SparseSelfAttention(config, max_seq_length=seq_len, causal=causal).to(device)

    def sparse(q, k, v):
        return module(*(t.permute(1, 2, 0, 3) for t in (q, k, v))).permute(2, 0, 1, 3)
    return sparse


# ---- timing and memory ------------------------------------------------------------------------

def timed_ms(fn, device, warmup, reps):
    """Median ms of reps calls after warmup ones: CUDA events on a GPU, wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def memory_gb(step, device):
    """(saved, peak): GB held from the end of the forward until the backward, and the peak above
    the baseline during forward + backward. None on the CPU."""
    if device.type != "cuda":
        step(None)
        return None, None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    held = []
    step(lambda: held.append(torch.cuda.memory_allocated(device) - base))
    torch.cuda.synchronize(device)
    return held[0] / 1e9, (torch.cuda.max_memory_allocated(device) - base) / 1e9


def measure(sciattn, layout, tokens, size, rank, device, dtype, args):
    """One row's numbers on this rank: layer ms, a2a ms, saved GB, peak GB."""
    sp = sciattn.distributed
    group = dist.group.WORLD if size > 1 else None
    heads, dim, block = args.heads, args.dim, args.block
    s_loc = tokens // size
    torch.manual_seed(1234 + rank)
    q, k, v = (torch.randn(s_loc, BATCH, heads, dim, device=device, dtype=dtype)
               .requires_grad_(True) for _ in range(3))
    dout = torch.randn(s_loc, BATCH, heads, dim, device=device, dtype=dtype)
    local = local_attention(sciattn, layout, tokens, heads, block, group, device)
    attn = sp.DistributedAttention(local, group) if size > 1 else local

    def step(after_forward=None):
        out = attn(q, k, v)
        if after_forward is not None:
            after_forward()
        torch.autograd.backward(out, dout)
        q.grad = k.grad = v.grad = None

    layer = timed_ms(step, device, args.warmup, args.reps)
    saved, peak = memory_gb(step, device)
    a2a = None
    if size > 1:
        # The eight all-to-alls of one layer: q, k, v heads-scattered and the output
        # sequence-scattered in the forward, the reverse of each in the backward.
        x = q.detach()
        y = sp.all_to_all(x, 2, 0, group)

        def all_to_alls():
            for _ in range(4):
                sp.all_to_all(x, 2, 0, group)
                sp.all_to_all(y, 0, 2, group)

        a2a = timed_ms(all_to_alls, device, args.warmup, args.reps)
    return layer, a2a, saved, peak


# ---- one process ------------------------------------------------------------------------------

def worker(rank, size, args, port):
    if port is not None:  # started by main(), not by torchrun
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(size), LOCAL_RANK=str(rank))
    cpu = args.cpu_smoke
    device = torch.device("cpu") if cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    if not cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if cpu else "nccl", timeout=COLLECTIVE_TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    if cpu:
        torch.set_num_threads(1)
    sciattn = import_sciattn()
    dtype = getattr(torch, args.dtype)
    rows = []
    for tokens in args.tokens:
        for layout in args.layouts:
            row = dict(layout=layout, tokens=tokens, heads=args.heads, dim=args.dim,
                       block=args.block, dtype=args.dtype)
            for p in (1, size):
                # P = 1 runs on rank 0 alone; the other ranks wait at the barrier.
                result, error = None, None
                if p > 1 or rank == 0:
                    try:
                        result = measure(sciattn, layout, tokens, p, rank, device, dtype, args)
                    except (RuntimeError, ValueError, NotImplementedError) as e:
                        error = error_text(e)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                gathered = [None] * size
                dist.all_gather_object(gathered, (result, error))
                row[f"P{p}"] = summarize(gathered if p > 1 else gathered[:1])
            if rank == 0:
                rows.append(row)
                print_row(row, size)
                write_json(os.path.join(args.out, "sequence_parallel.json"), meta(args, size),
                           rows)
    dist.destroy_process_group()


def summarize(per_rank):
    errors = [e for _, e in per_rank if e]
    if errors:
        return {"error": errors[0]}
    results = [r for r, _ in per_rank]
    worst = [max((r[i] for r in results if r[i] is not None), default=None) for i in range(4)]
    return dict(layer_ms=worst[0], a2a_ms=worst[1], saved_gb=worst[2], peak_gb=worst[3],
                per_rank=[dict(layer_ms=r[0], a2a_ms=r[1], saved_gb=r[2], peak_gb=r[3])
                          for r in results])


def meta(args, size):
    info = {"device": "cpu (smoke run, gloo)"} if args.cpu_smoke else gpu_meta()
    return dict(info, world_size=size, batch=BATCH, reps=args.reps, warmup=args.warmup,
                layouts=args.layouts, tokens=args.tokens, command=" ".join(sys.argv))


def _fmt(value, spec):
    width = int(spec.split(".")[0])
    return format("-", f">{width}") if value is None else format(value, spec)


def print_row(row, size):
    one, many = row["P1"], row[f"P{size}"]
    if not getattr(print_row, "header", False):
        print(f"{'layout':<13} {'tokens':>7} {'P':>2} {'layer ms':>9} {'a2a ms':>8} "
              f"{'a2a %':>6} {'speedup':>7} {'saved GB':>8} {'peak GB':>8} {'mem ratio':>9}")
        print_row.header = True
    for p, cell in ((1, one), (size, many)):
        if "error" in cell:
            print(f"{row['layout']:<13} {row['tokens']:>7} {p:>2}  error: {cell['error']}")
            continue
        share = (100 * cell["a2a_ms"] / cell["layer_ms"]) if cell["a2a_ms"] is not None else None
        speedup = ratio = None
        if p > 1 and "error" not in one:
            speedup = one["layer_ms"] / cell["layer_ms"]
            if cell["saved_gb"] is not None and one["saved_gb"]:
                ratio = cell["saved_gb"] / one["saved_gb"]
        print(f"{row['layout']:<13} {row['tokens']:>7} {p:>2} {_fmt(cell['layer_ms'], '9.2f')} "
              f"{_fmt(cell['a2a_ms'], '8.2f')} {_fmt(share, '6.1f')} {_fmt(speedup, '7.2f')} "
              f"{_fmt(cell['saved_gb'], '8.2f')} {_fmt(cell['peak_gb'], '8.2f')} "
              f"{_fmt(ratio, '9.2f')}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results", help="folder for sequence_parallel.json")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--heads", type=int, default=HEADS)
    ap.add_argument("--dim", type=int, default=DIM)
    ap.add_argument("--block", type=int, default=BLOCK)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per measurement (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2, help="processes (GPUs) at P > 1")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="gloo on the CPU with tiny shapes (tokens 128,256, H 4, D 16, block 16, "
                         "float32, 1 rep): runs every code path; the numbers mean nothing")
    args = ap.parse_args()
    if args.cpu_smoke:
        args.tokens, args.heads, args.dim, args.block = "128,256", 4, 16, 16
        args.dtype, args.reps, args.warmup = "float32", 1, 1
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.layouts = args.layouts.split(",")
    unknown = set(args.layouts) - set(LAYOUTS)
    if unknown:
        sys.exit(f"unknown --layouts {sorted(unknown)}; choose from {LAYOUTS}")
    if not args.cpu_smoke and torch.cuda.device_count() < args.nproc:
        sys.exit(f"needs {args.nproc} CUDA devices (found {torch.cuda.device_count()}); "
                 "--cpu-smoke runs the code paths on the CPU")
    os.makedirs(args.out, exist_ok=True)
    # All-to-all does not use NVLink multicast (NVLS); it stays off, as shared multi-GPU hosts
    # require (NCCL reads these when the process group starts, after this).
    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(name, value)
    if "RANK" in os.environ:  # under torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, None)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.nproc, args, port), nprocs=args.nproc)


if __name__ == "__main__":
    main()
