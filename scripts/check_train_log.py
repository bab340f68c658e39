#!/usr/bin/env python3
"""Checks a `sciattn train --log` file (one JSON record per step): counts the steps whose loss is
NaN or infinite (written as null), the skipped (overflowed) steps and the loss scale's range, and
exits non-zero when more losses are not finite than --max-nonfinite (default 0) or when the log
is empty.

    scripts/check_train_log.py run.jsonl [--max-nonfinite 0] [--name "fp16, lr x1.3, adaptive"]
"""
import argparse
import json
import math
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--max-nonfinite", type=int, default=0)
    ap.add_argument("--name", default="")
    args = ap.parse_args()
    records = []
    with open(args.log) as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
    if not records:
        print(f"{args.log}: no steps logged")
        return 1
    def finite(x):
        return x is not None and math.isfinite(x)
    bad = [r["step"] for r in records if not finite(r.get("loss"))]
    skipped = sum(1 for r in records if r.get("skipped"))
    scales = [r["loss_scale"] for r in records]
    losses = [r["loss"] for r in records if finite(r.get("loss"))]
    head = losses[:10]
    tail = losses[-10:]
    first = sum(head) / len(head) if head else float("nan")
    last = sum(tail) / len(tail) if tail else float("nan")
    clipped = sum(1 for r in records if r.get("clip_coefficient", 1.0) < 1.0)
    print(f"{args.name or args.log}: {len(records)} steps, {len(bad)} with a NaN or infinite loss"
          f"{' (steps ' + ', '.join(map(str, bad[:10])) + ')' if bad else ''}, {skipped} skipped "
          f"(overflow), {clipped} clipped, loss scale {min(scales):g}..{max(scales):g}, loss "
          f"{first:.4f} (first 10) -> {last:.4f} (last 10)")
    return 1 if len(bad) > args.max_nonfinite else 0


if __name__ == "__main__":
    sys.exit(main())
