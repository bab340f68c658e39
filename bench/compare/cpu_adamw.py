"""CPU AdamW: sciattn.optim.CPUAdamW (the trainer's C++ step called from Python) and the C++ step
alone (bench_train_cpu's BM_CpuAdamW, run as a subprocess when built) against torch.optim.AdamW on
the CPU (for-loop, foreach and fused implementations), on the same fp32 parameters in one process.
Prints a table with ratios and writes JSON.

    python bench/compare/cpu_adamw.py [--params flat,gpt] [--bench build/cpu/bench/bench_train_cpu]
                                      [--out results]

Parameter sets: "flat" is one tensor of 16.8M parameters (the C++ benchmark's large size); "gpt"
is the 100 tensors of a GPT with d_model 512, 8 layers and a vocabulary of 32,768 (42.5M
parameters), where the per-tensor cost of a Python optimizer shows. Every implementation runs
with torch.get_num_threads() threads (OpenMP's default: all cores). Times are the median of the
timed steps after a warm-up; the machine may be shared, so compare ratios from one run."""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch

from common import import_sciattn

N_FLAT = 1 << 24  # 16.8M parameters: 270 MB of params, grads, m and v
HP = dict(lr=1e-3, weight_decay=0.01)


def parameter_shapes(name):
    if name == "flat":
        return [(N_FLAT,)]
    d, layers, vocab = 512, 8, 32768
    shapes = [(vocab, d), (1024, d)]  # token and position embeddings
    for _ in range(layers):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,),   # ln1, qkv, proj
                   (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]  # ln2, fc, fcproj
    return shapes + [(d,), (d,)]  # final LayerNorm; the LM head is tied


def make_params(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params


def step_ms(make_optimizer, shapes, steps, warmup=3):
    params = make_params(shapes)
    opt = make_optimizer(params)
    for _ in range(warmup):
        opt.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cpp_step_ms(bench):
    out = subprocess.run([bench, f"--benchmark_filter=BM_CpuAdamW/{N_FLAT}/",
                          "--benchmark_min_time=1", "--benchmark_repetitions=5",
                          "--benchmark_format=json"],
                         capture_output=True, text=True, check=True).stdout
    runs = json.loads(out)["benchmarks"]
    times = [r["real_time"] for r in runs if r.get("run_type") == "iteration"]
    return statistics.median(times), runs[0].get("label", "")


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="flat,gpt", help="comma-separated: flat, gpt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bench", default=os.path.join(root, "build/cpu/bench/bench_train_cpu"))
    ap.add_argument("--out", default=None, help="folder for cpu_adamw.json")
    args = ap.parse_args()
    sciattn = import_sciattn()
    threads = torch.get_num_threads()
    isa = torch.ops.sciattn.cpu_adamw_isa()
    impls = [
        (f"sciattn.optim.CPUAdamW ({isa})", lambda ps: sciattn.optim.CPUAdamW(ps, **HP)),
        ("torch.optim.AdamW for-loop", lambda ps: torch.optim.AdamW(ps, foreach=False, **HP)),
        ("torch.optim.AdamW foreach (default)",
         lambda ps: torch.optim.AdamW(ps, foreach=True, **HP)),
        ("torch.optim.AdamW fused", lambda ps: torch.optim.AdamW(ps, fused=True, **HP)),
    ]
    results = {}
    print(f"CPU AdamW, ms per step (median of {args.steps}); torch {torch.__version__}, "
          f"{threads} threads")
    for name in args.params.split(","):
        shapes = parameter_shapes(name)
        count = sum(torch.Size(s).numel() for s in shapes)
        rows = [(label, step_ms(make, shapes, args.steps)) for label, make in impls]
        if name == "flat" and os.path.exists(args.bench):
            ms, label = cpp_step_ms(args.bench)
            rows.insert(1, (f"C++ cpu_adamw_step alone ({label})", ms))
        ours = rows[0][1]
        print(f"\n{name}: {count:,} parameters in {len(shapes)} tensors")
        print(f"{'implementation':55s} {'ms':>9s} {'GB/s':>6s} {'vs CPUAdamW':>12s}")
        for label, ms in rows:
            # Bytes moved per step: read params, grads, m, v; write params, m, v (fp32).
            gbs = 7 * 4 * count / (ms * 1e-3) / 1e9
            print(f"{label:55s} {ms:9.2f} {gbs:6.1f} {ms / ours:11.2f}x")
        results[name] = {"parameters": count, "tensors": len(shapes), "ms_per_step": dict(rows)}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cpu_adamw.json"), "w") as f:
            json.dump({"torch": torch.__version__, "threads": threads, "isa": isa,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
