"""What the peer-comparison scripts share: CUDA-event timing, peak extra memory, the H200's
measured ceilings (as recorded in docs/perf/), error text of a peer that cannot run a shape,
torch.compile limits, writing the JSON results, and importing the sciattn Python package. Runs on
the GPU machine; importing it needs only torch."""
import gc
import json
import os
import statistics
import sys

import torch

MATMUL_CEILING = 790e12  # FLOP/s, dense bf16/fp16 tensor-core matmul, measured (PERFORMANCE.md)
EXP_CEILING = 3.9e12     # exp/s (MUFU), from the FlashAttention-3 paper (PERFORMANCE.md)
COPY_CEILING = 4.3e12    # bytes/s, device-to-device copy, measured (PERFORMANCE.md)


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_sciattn():
    """The sciattn package: the installed one, else the checkout's bindings/torch/python."""
    try:
        import sciattn  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(_REPO, "bindings", "torch", "python"))
        import sciattn  # noqa: F401
    return sys.modules["sciattn"]


def time_ms(fn, warmup=5, reps=20, inner=1):
    """Median of `reps` timed samples (CUDA events) after `warmup` untimed calls, in ms per call.

    A sample is `inner` calls back to back divided by `inner`: with 1, a call from an idle GPU
    (its host-side launch latency included, as a lone synchronous call sees it); with more, the
    GPU's time per call once the host runs ahead of it, as in a training loop."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / inner)
    return statistics.median(times)


def peak_extra_bytes(fn):
    """The most memory fn() holds above what was allocated before it (torch's allocator).

    Garbage from earlier calls (tensors in reference cycles, e.g. through a compiled peer's
    closures) is collected first: left in the baseline and freed by a collection during fn(), it
    would be subtracted from fn()'s own need (FlexAttention read 34.5 MB at triangle 256 once,
    below its own outputs and gradients)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def error_text(e):
    """One line (at most 200 characters) saying why a call failed."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def raise_compile_limits(limit=64):
    """FlexAttention compiles once per mask or score function; past dynamo's recompile limit it
    silently falls back to an unfused path, so the scripts raise the limit (and reset dynamo
    between shapes)."""
    torch._dynamo.config.cache_size_limit = limit
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = limit


def gpu_meta():
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda}


def write_json(path, meta, rows):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
