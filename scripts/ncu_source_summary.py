#!/usr/bin/env python3
"""Summarises Nsight Compute's per-instruction (SASS) source counters for kernel work: per kernel,
the instructions executed per loop step (by opcode), the stall reasons, and the instructions
with the most stall samples. Developer tool (scripts/gpu_suite.sh stalls runs it).

Collect on the GPU machine, then export to CSV:
  ncu --clock-control none --section SourceCounters --section WarpStateStats \\
      -k regex:'fused|dbias2_wgmma' --launch-count 2 -o rep PROGRAM ARGS...
  ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv

Run anywhere:
  scripts/ncu_source_summary.py rep.csv [--kernel SUBSTRING] [--steps N] [--top K] [--list]

--steps N divides the counts by N (e.g. the number of (tile step, warp) pairs of the launch, so
that the numbers read as instructions per warp per step); --list prints every executed
instruction with its per-step count and stall samples, in program order. A kernel profiled in
several launches is summarised once (its first launch).
"""
import argparse
import collections
import csv
import sys


def read_kernels(path):
    """[(kernel name, header, rows)] in file order; the export repeats the header per kernel."""
    kernels = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append([row[1], None, []])
            elif row[0] == "Address" and kernels:
                kernels[-1][1] = row
            elif kernels and kernels[-1][1] is not None:
                kernels[-1][2].append(row)
    return kernels


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source):
    words = source.split()
    if not words:
        return "?"
    return (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]


def summarise(name, header, rows, steps, top, listing):
    col = {k: i for i, k in enumerate(header)}
    executed = "Instructions Executed"
    samples = "Warp Stall Sampling (All Samples)"
    stalls = [k for k in header if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(number(r[col[executed]]) for r in rows)
    print(f"===== {name}")
    print(f"warp instructions {total / 1e6:.3g} M" + (f", {total / steps:.1f} per step" if steps else ""))
    per_op = collections.Counter()
    for r in rows:
        per_op[opcode(r[col["Source"]])] += number(r[col[executed]])
    scale = steps if steps else total / 100.0
    unit = "per step" if steps else "%"
    print(f"by opcode ({unit}): " + ", ".join(f"{op} {n / scale:.1f}" for op, n in per_op.most_common(20)))
    by_reason = {k: sum(number(r[col[k]]) for r in rows) for k in stalls}
    all_stalls = sum(by_reason.values()) or 1.0
    print("stalls: " + ", ".join(f"{k[6:]} {100 * v / all_stalls:.1f}%"
                                 for k, v in sorted(by_reason.items(), key=lambda x: -x[1])[:10]))
    print(f"top {top} instructions by stall samples:")
    for r in sorted(rows, key=lambda r: -number(r[col[samples]]))[:top]:
        reasons = sorted(((number(r[col[k]]), k[6:]) for k in stalls), reverse=True)[:2]
        print(f"  {r[col['Address']][-6:]} {r[col['Source']].strip()[:64]:<64} samples "
              f"{number(r[col[samples]]):6.0f} executed {number(r[col[executed]]):9.0f} "
              + ", ".join(f"{why} {n:.0f}" for n, why in reasons))
    if listing:
        for r in rows:
            n = number(r[col[executed]])
            if n > 0:
                count = f"{n / steps:7.2f}" if steps else f"{n:9.0f}"
                print(f"{count} {number(r[col[samples]]):6.0f}  {r[col['Source']].strip()[:96]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("--steps", type=float, default=0.0, help="divide counts by this many steps")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--list", action="store_true", help="print every executed instruction")
    args = ap.parse_args()
    seen = set()
    for name, header, rows in read_kernels(args.csv):
        short = name[:name.rfind("(")] if name.endswith(")") else name  # without the parameters
        if args.kernel not in name or short in seen or header is None:
            continue
        seen.add(short)
        summarise(short, header, rows, args.steps, args.top, args.list)
    if not seen:
        sys.exit(f"no kernel matching '{args.kernel}' in {args.csv}")


if __name__ == "__main__":
    main()
