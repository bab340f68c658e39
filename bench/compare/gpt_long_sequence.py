"""Long-sequence GPT training: `sciattn train` against a plain PyTorch GPT of the same
configuration, in the same call, at the same lengths and settings (GPU machine).

    python bench/compare/gpt_long_sequence.py --sciattn .carry/train/sciattn \\
        --tokens 32768,131072 --layers 24 --out results

PyTorch side: pre-LayerNorm GPT-2 blocks (GELU tanh, rotary positions over the whole head dim,
tied LM head), fp32 parameters under bf16 autocast, SDPA causal attention (is_causal=True: the
flash backend), fused AdamW, clipping at 1.0. Its recipes, each in its own process (clean peaks,
and an out-of-memory fails only that row):
  plain        the model as is
  ckpt         per-layer activation checkpointing (torch.utils.checkpoint, non-reentrant)
  ckpt_tiles   + the MLP in checkpointed tiles of --tile tokens + the LM head and cross-entropy
               in checkpointed chunks of --tile tokens (never the [T, V] logits)
  offload      ckpt_tiles with the saved tensors in pinned host memory
               (torch.autograd.graph.save_on_cpu(pin_memory=True))
  ckpt_tiles_keep, offload_keep
               the two with the attention's outputs kept: the layers' checkpoints select SDPA
               to be saved (torch.utils.checkpoint.create_selective_checkpoint_contexts, the
               policy MUST_SAVE for the aten op whose name holds "scaled_dot_product", recorded
               in the result as sdpa_ops), so the backward's recomputation skips the attention
sciattn side: `sciattn train --device cuda` with bf16 and the matching switches (plain; the
activation_checkpointing flag; + --mlp-tile-tokens and --lm-head-tile-tokens; + offloaded
checkpoints; + --keep-attention-outputs, or --keep-attention-layers N|auto with --keep-layers;
offload_keep + --offload-attention-outputs with --offload-outputs),
and `opt_offload` (everything but the kept attention outputs, the optimizer offloaded too, no
PyTorch peer). The default runs every recipe but the two *_keep ones.
Each run trains --warmup + --steps steps of batch 1; the timed steps' mean is reported.

Columns: step time, tokens/s, MFU (6 x matrix parameters x tokens + the causal attention's
forward and backward, 14 x H x blocks x 64^2 x D per layer: the trainer's count, used for both
sides; against --peak-tflops, default 989.4, the H100/H200's dense bf16), peak GPU memory (torch:
max_memory_allocated; sciattn: its back end's peak allocation, the attention index's device copy
excluded, as torch excludes its context), peak host memory (each process's VmHWM) and the ratio
of tokens/s to PyTorch's same recipe. Writes gpt_long_sequence.json and prints a table.
"""
import argparse
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import time

RECIPES = ["plain", "ckpt", "ckpt_tiles", "offload", "opt_offload", "ckpt_tiles_keep",
           "offload_keep"]
DEFAULT_RECIPES = ["plain", "ckpt", "ckpt_tiles", "offload", "opt_offload"]
TORCH_RECIPES = ["plain", "ckpt", "ckpt_tiles", "offload", "ckpt_tiles_keep", "offload_keep"]
KEEP = ["--keep-attention-outputs"]
SCIATTN_FLAGS = {
    "plain": [],
    "ckpt": ["--checkpoint-layers"],
    "ckpt_tiles": ["--checkpoint-layers", "--mlp-tile-tokens", "{tile}",
                   "--lm-head-tile-tokens", "{tile}"],
    "offload": ["--offload-checkpoints", "--mlp-tile-tokens", "{tile}",
                "--lm-head-tile-tokens", "{tile}"],
    "opt_offload": ["--offload-checkpoints", "--offload-optimizer", "--mlp-tile-tokens", "{tile}",
                    "--lm-head-tile-tokens", "{tile}"],
}
SCIATTN_FLAGS["ckpt_tiles_keep"] = SCIATTN_FLAGS["ckpt_tiles"] + KEEP
SCIATTN_FLAGS["offload_keep"] = SCIATTN_FLAGS["offload"] + KEEP


def host_peak_bytes():
    """This process's peak resident memory (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def model_flops(args, tokens):
    """The trainer's count (GptModel::flops_per_micro_batch) for batch 1, dense causal, block 64
    (tokens a multiple of 64): 6 x matrix parameters x tokens + 14 x H x n(n+1)/2 x 64^2 x D per
    layer."""
    d, layers, vocab, heads = args.d_model, args.layers, args.vocab, args.heads
    matmul = layers * 12 * d * d + vocab * d  # qkv, proj, fc, fcproj; the tied head
    n = tokens // 64
    attention = 14.0 * heads * (n * (n + 1) / 2) * 64 * 64 * (d // heads) * layers
    return 6.0 * matmul * tokens + attention


# ---------------------------------------------------------------- the PyTorch side (a worker)

def torch_worker(args):
    import functools
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                        create_selective_checkpoint_contexts)

    torch.manual_seed(0)
    dev = torch.device("cuda")
    d, heads, layers, vocab, tile = args.d_model, args.heads, args.layers, args.vocab, args.tile
    hd = d // heads
    T = args.tokens_one
    recipe = args.recipe
    keep = recipe.endswith("_keep")
    tiled = recipe in ("ckpt_tiles", "offload", "ckpt_tiles_keep", "offload_keep")
    offload = recipe in ("offload", "offload_keep")
    sdpa_ops = set()

    def keep_sdpa(ctx, op, *a, **k):  # selective checkpointing: save SDPA, recompute the rest
        if "scaled_dot_product" in str(op):
            sdpa_ops.add(str(op))
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    layer_checkpoint = functools.partial(checkpoint, use_reentrant=False)
    if keep:
        layer_checkpoint = functools.partial(
            checkpoint, use_reentrant=False,
            context_fn=functools.partial(create_selective_checkpoint_contexts, keep_sdpa))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = torch.nn.LayerNorm(d)
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.proj = torch.nn.Linear(d, d)
            self.ln2 = torch.nn.LayerNorm(d)
            self.fc = torch.nn.Linear(d, 4 * d)
            self.fcproj = torch.nn.Linear(4 * d, d)

        def mlp(self, x):
            return self.fcproj(F.gelu(self.fc(x), approximate="tanh"))

        def forward(self, x, cos, sin):
            B = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, heads, hd).unbind(2)

            def rotate(t):  # GPT-NeoX rotate-half over the whole head dim, in t's dtype
                c, s = cos.to(t.dtype), sin.to(t.dtype)
                a, b = t[..., : hd // 2], t[..., hd // 2:]
                return torch.cat((a * c - b * s, b * c + a * s), dim=-1)

            q, k = rotate(q), rotate(k)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
            h = self.ln2(x)
            if tiled:
                parts = [checkpoint(self.mlp, h[:, i:i + tile], use_reentrant=False)
                         for i in range(0, T, tile)]
                return x + torch.cat(parts, dim=1)
            return x + self.mlp(h)

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(vocab, d)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(layers)])
            self.lnf = torch.nn.LayerNorm(d)
            pos = torch.arange(T, dtype=torch.float64)
            inv = 10000.0 ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
            ang = pos[:, None] * inv[None, :]
            self.register_buffer("cos", ang.cos().float()[None, :, None, :], persistent=False)
            self.register_buffer("sin", ang.sin().float()[None, :, None, :], persistent=False)

        def chunk_loss(self, h, t):
            logits = F.linear(h, self.wte.weight)
            return F.cross_entropy(logits.float().flatten(0, 1), t.flatten(), reduction="sum")

        def forward(self, idx, targets):
            x = self.wte(idx)
            cos, sin = self.cos, self.sin
            for blk in self.blocks:
                if recipe == "plain":
                    x = blk(x, cos, sin)
                else:
                    x = layer_checkpoint(blk, x, cos, sin)
            h = self.lnf(x)
            if tiled:
                total = sum(checkpoint(self.chunk_loss, h[:, i:i + tile], targets[:, i:i + tile],
                                       use_reentrant=False) for i in range(0, T, tile))
            else:
                total = self.chunk_loss(h, targets)
            return total / targets.numel()

    result = {"side": "pytorch", "recipe": recipe, "tokens": T, "layers": layers}
    try:
        model = GPT().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                weight_decay=0.1, fused=True)
        g = torch.Generator(device="cpu").manual_seed(1)
        times, losses = [], []
        for step in range(args.warmup + args.steps):
            data = torch.randint(0, vocab, (1, T + 1), generator=g).to(dev)
            idx, tgt = data[:, :-1], data[:, 1:]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if offload:
                    with torch.autograd.graph.save_on_cpu(pin_memory=True):
                        loss = model(idx, tgt)
                else:
                    loss = model(idx, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
            losses.append(float(loss))
        result.update(seconds=sum(times) / len(times), losses=losses,
                      peak_gpu_bytes=torch.cuda.max_memory_allocated())
        if keep:
            result.update(sdpa_ops=sorted(sdpa_ops))
    except torch.cuda.OutOfMemoryError as e:
        result.update(error="out of GPU memory: " + str(e).splitlines()[0][:160])
    except RuntimeError as e:
        result.update(error=str(e).splitlines()[0][:200])
    result["peak_host_bytes"] = host_peak_bytes()
    print("RESULT " + json.dumps(result), flush=True)


def run_torch(args, recipe, tokens):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--recipe", recipe,
           "--tokens-one", str(tokens)] + common_args(args)
    return run_worker(cmd, args.timeout, {"side": "pytorch", "recipe": recipe, "tokens": tokens,
                                          "layers": args.layers})


def common_args(args):
    return ["--layers", str(args.layers), "--d-model", str(args.d_model), "--heads",
            str(args.heads), "--vocab", str(args.vocab), "--tile", str(args.tile), "--steps",
            str(args.steps), "--warmup", str(args.warmup)]


def run_worker(cmd, timeout, base):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(base, error=f"timed out after {timeout} s")
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return dict(base, error=f"exit {p.returncode}: " + " | ".join(tail)[:300])


# ---------------------------------------------------------------- the sciattn side

def write_tokens(path, vocab, count, seed):
    """A token file (docs/training.md: 64-byte header, u16 tokens) of `count` random tokens."""
    rng = random.Random(seed)
    header = b"SCIATOKN" + struct.pack("<IIQQQII", 1, 2, vocab, count, 1, 0xFFFFFFFF, 0)
    header += bytes(64 - len(header))
    with open(path, "wb") as f:
        f.write(header)
        chunk = 1 << 16
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            f.write(struct.pack(f"<{n}H", *[rng.randrange(vocab) for _ in range(n)]))


def run_sciattn(args, recipe, tokens, work):
    base = {"side": "sciattn", "recipe": recipe, "tokens": tokens, "layers": args.layers}
    steps = args.warmup + args.steps
    data = os.path.join(work, f"tokens_{tokens}.bin")
    if not os.path.exists(data):
        write_tokens(data, args.vocab, tokens * steps + 1, tokens)
    model = os.path.join(work, f"gpt_{tokens}.json")
    with open(model, "w") as f:
        json.dump({"vocab_size": args.vocab, "d_model": args.d_model, "n_layers": args.layers,
                   "n_heads": args.heads, "sequence_length": tokens, "positions": "rotary",
                   "tie_embeddings": True, "seed": 1}, f)
    config = os.path.join(work, "ds.json")
    with open(config, "w") as f:
        json.dump({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95],
                                                             "weight_decay": 0.1}},
                   "bf16": {"enabled": True}, "gradient_clipping": 1.0,
                   "steps_per_print": 1}, f)
    log = os.path.join(work, f"log_{recipe}_{tokens}.jsonl")
    flags = [x.format(tile=args.tile) for x in SCIATTN_FLAGS[recipe]]
    if recipe.endswith("_keep") and args.keep_layers != "all":
        flags = [x for x in flags if x not in KEEP] + ["--keep-attention-layers", args.keep_layers]
    if recipe == "offload_keep" and args.offload_outputs:
        flags.append("--offload-attention-outputs")
    cmd = [args.sciattn, "train", "--device", args.device, "--config", config, "--model", model,
           "--data", data, "--steps", str(steps), "--log", log, "--no-shuffle",
           "--peak-tflops", str(args.peak_tflops)] + flags
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(base, error=f"timed out after {args.timeout} s")
    base["wall_seconds"] = time.perf_counter() - t0
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return dict(base, error=f"exit {p.returncode}: " + " | ".join(tail)[:300])
    with open(log) as f:
        records = [json.loads(line) for line in f if line.strip()]
    timed = records[args.warmup:]
    kept = re.findall(r"attention outputs kept \((\d+ of \d+ layers)", p.stdout)
    if kept:  # the run's summary: "attention outputs kept (k of n layers; why)"
        base["kept_attention"] = kept[-1]
    return dict(base, seconds=sum(r["seconds"] for r in timed) / len(timed),
                losses=[r["loss"] for r in records],
                peak_gpu_bytes=max(r.get("peak_device_bytes", 0) for r in records),
                peak_host_bytes=max(r["peak_rss_bytes"] for r in records),
                command=" ".join(cmd))


# ---------------------------------------------------------------- the table

def gib(x):
    return f"{x / 2**30:.1f}" if x else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sciattn", default=os.path.join(".carry", "train", "sciattn"),
                    help="the sciattn program (built with the gpu preset)")
    ap.add_argument("--tokens", default="32768", help="comma-separated sequence lengths")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--tile", type=int, default=16384, help="MLP and LM-head tile tokens")
    ap.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                    help="comma-separated, of " + ", ".join(RECIPES))
    ap.add_argument("--sides", default="pytorch,sciattn")
    ap.add_argument("--keep-layers", default="all",
                    help="sciattn's *_keep recipes: all layers, a count N or auto "
                         "(--keep-attention-layers; PyTorch's keep every layer)")
    ap.add_argument("--offload-outputs", action="store_true",
                    help="sciattn's offload_keep: the kept outputs go to host memory with the "
                         "checkpoints (--offload-attention-outputs)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first steps")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--device", default="cuda",
                    help="sciattn's device (cpu: a dry run of the script's sciattn side)")
    ap.add_argument("--out", default="results")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", default="plain", help=argparse.SUPPRESS)
    ap.add_argument("--tokens-one", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        torch_worker(args)
        return
    lengths = [int(x) for x in args.tokens.split(",") if x]
    recipes = [r for r in args.recipes.split(",") if r]
    sides = [s for s in args.sides.split(",") if s]
    for r in recipes:
        if r not in RECIPES:
            ap.error(f"unknown recipe {r!r}; choose from {', '.join(RECIPES)}")
    for t in lengths:
        if t % 64 != 0:
            ap.error(f"--tokens {t}: use multiples of 64 (the attention block)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpt_long_") as work:
        for tokens in lengths:
            for recipe in recipes:
                for side in sides:
                    if side == "pytorch" and recipe not in TORCH_RECIPES:
                        continue
                    print(f"-- {side} {recipe} {tokens} tokens, {args.layers} layers", flush=True)
                    r = (run_torch(args, recipe, tokens) if side == "pytorch"
                         else run_sciattn(args, recipe, tokens, work))
                    if "seconds" in r:
                        r["tokens_per_second"] = tokens / r["seconds"]
                        r["mfu"] = model_flops(args, tokens) / r["seconds"] / (
                            args.peak_tflops * 1e12)
                    print("   " + (r.get("error") or
                                   f"{r['seconds']:.2f} s/step, {r['tokens_per_second']:.0f} "
                                   f"tok/s, gpu {gib(r['peak_gpu_bytes'])} GiB, host "
                                   f"{gib(r['peak_host_bytes'])} GiB"), flush=True)
                    rows.append(r)
    meta = {"d_model": args.d_model, "layers": args.layers, "heads": args.heads,
            "vocab": args.vocab, "tile": args.tile, "steps": args.steps, "warmup": args.warmup,
            "peak_tflops": args.peak_tflops, "date": time.strftime("%Y-%m-%d"),
            "sciattn": args.sciattn, "keep_layers": args.keep_layers,
            "offload_outputs": args.offload_outputs}
    try:
        import torch
        meta.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    except Exception as e:  # the table stands without the names
        meta.update(gpu="unknown (" + str(e)[:80] + ")")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpt_long_sequence.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)

    print(f"\nGPT d {args.d_model}, {args.layers} layers, {args.heads} heads, vocab {args.vocab}, "
          f"batch 1, bf16; tiles {args.tile}; mean of {args.steps} steps after {args.warmup}; "
          f"MFU vs {args.peak_tflops} TFLOP/s")
    print(f"{'tokens':>8} {'recipe':15} {'side':8} {'s/step':>8} {'tok/s':>9} {'MFU':>6} "
          f"{'GPU GiB':>8} {'host GiB':>9} {'vs torch':>9}")
    for r in rows:
        peer = next((p for p in rows if p["side"] == "pytorch" and p["tokens"] == r["tokens"]
                     and p["recipe"] == r["recipe"] and "seconds" in p), None)
        if "seconds" not in r:
            print(f"{r['tokens']:>8} {r['recipe']:15} {r['side']:8} {r.get('error', '')[:70]}")
            continue
        ratio = f"{r['tokens_per_second'] / peer['tokens_per_second']:.2f}x" if (
            peer and r["side"] == "sciattn") else ""
        print(f"{r['tokens']:>8} {r['recipe']:15} {r['side']:8} {r['seconds']:8.2f} "
              f"{r['tokens_per_second']:9.0f} {100 * r['mfu']:5.1f}% {gib(r['peak_gpu_bytes']):>8} "
              f"{gib(r['peak_host_bytes']):>9} {ratio:>9}")
    for r in rows:
        if r.get("kept_attention"):
            print(f"sciattn {r['recipe']} at {r['tokens']} tokens kept the attention outputs of "
                  f"{r['kept_attention']}")
    for ops in sorted({", ".join(r["sdpa_ops"]) for r in rows if r.get("sdpa_ops")}):
        print(f"PyTorch's *_keep recipes saved the outputs of {ops}")
    failed = [r for r in rows if r["side"] == "sciattn" and "error" in r]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
