"""CPU AdamW: the trainer's C++ step (bench_train_cpu's BM_CpuAdamW, run here as a subprocess)
against torch.optim.AdamW on the CPU (for-loop, foreach and fused implementations) on the same
number of fp32 parameters, on this machine. Prints a table with ratios and writes JSON.

    python bench/compare/cpu_adamw.py [--bench build/cpu/bench/bench_train_cpu] [--out results]

Both sides use all the machine's threads (torch.get_num_threads(), OpenMP's default). Times are the
median of the timed steps after a warm-up; the machine may be shared, so compare ratios from one
run."""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch

N = 1 << 24  # 16.8M parameters: 470 MB of params, grads, m and v (the benchmark's large size)


def torch_step_ms(impl, steps=20, warmup=3):
    p = torch.nn.Parameter(torch.randn(N))
    p.grad = torch.randn(N)
    kwargs = {"for_loop": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}[impl]
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kwargs)
    for _ in range(warmup):
        opt.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def sciattn_step_ms(bench):
    out = subprocess.run([bench, f"--benchmark_filter=BM_CpuAdamW/{N}/", "--benchmark_min_time=1",
                          "--benchmark_repetitions=5", "--benchmark_format=json"],
                         capture_output=True, text=True, check=True).stdout
    runs = json.loads(out)["benchmarks"]
    times = [r["real_time"] for r in runs if r.get("run_type") == "iteration"]
    return statistics.median(times), runs[0].get("label", "")


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=os.path.join(root, "build/cpu/bench/bench_train_cpu"))
    ap.add_argument("--out", default=None, help="folder for cpu_adamw.json")
    args = ap.parse_args()
    ours, label = sciattn_step_ms(args.bench)
    rows = [("sciattn cpu_adamw_step (" + label + ")", ours)]
    for impl in ("for_loop", "foreach", "fused"):
        rows.append((f"torch.optim.AdamW {impl} ({torch.get_num_threads()} threads)",
                     torch_step_ms(impl)))
    print(f"CPU AdamW, {N:,} fp32 parameters, ms per step (median); torch {torch.__version__}")
    print(f"{'implementation':60s} {'ms':>9s} {'vs sciattn':>11s}")
    for name, ms in rows:
        print(f"{name:60s} {ms:9.2f} {ms / ours:10.2f}x")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cpu_adamw.json"), "w") as f:
            json.dump({"parameters": N, "torch": torch.__version__,
                       "ms_per_step": dict(rows)}, f, indent=1)


if __name__ == "__main__":
    main()
