"""sciattn.training.tiled_lm_head_cross_entropy against F.cross_entropy(hidden @ weight.T, targets)
and its gradients, with the tolerance rule (float64 reference; the untiled torch computation in
the tested dtype as the low-precision reference): tile counts that do and do not divide the
tokens, every reduction, ignore_index, bf16 inputs and autocast, torch.compile; the peak memory
against the untiled computation; bad input. The device is SCIATTN_TEST_DEVICE's (cpu by default)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from sciattn.training import tiled_lm_head_cross_entropy
from sciattn.training.lm_head import default_tile_tokens
from conftest import DEVICE, assert_close_rule, rand


def make(n, c, v, device, dtype=torch.float32, ignore=0):
    hidden = rand(n, c, dtype=dtype, device=device)
    weight = rand(v, c, dtype=dtype, device=device, scale=0.5)
    targets = torch.randint(0, v, (n,), device=device)
    if ignore:
        targets[torch.randperm(n, device=device)[:ignore]] = -100
    return hidden, weight, targets


def loss_and_grads(fn, hidden, weight, targets, dtype=None, reduction="mean", autocast=False,
                   **kw):
    """fn's loss and its gradients for hidden and weight (cast to dtype first), with a random
    upstream gradient for reduction="none"."""
    h = hidden.detach().to(dtype or hidden.dtype).requires_grad_()
    w = weight.detach().to(dtype or weight.dtype).requires_grad_()
    with torch.autocast(h.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = fn(h, w, targets, reduction=reduction, **kw)
    up = torch.linspace(-1, 1, loss.numel(), dtype=loss.dtype, device=loss.device)
    (loss * up.reshape(loss.shape)).sum().backward() if reduction == "none" else loss.backward()
    return loss.detach(), h.grad, w.grad


def untiled(h, w, t, reduction="mean", ignore_index=-100):
    return F.cross_entropy(h @ w.T, t, reduction=reduction, ignore_index=ignore_index)


@pytest.mark.parametrize("n,tile", [(1, 1), (37, 8), (37, 37), (64, 16), (64, 100), (50, 7)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_equals_cross_entropy_and_its_gradients(device, n, tile, reduction):
    hidden, weight, targets = make(n, 24, 97, device, ignore=n // 5)
    got = loss_and_grads(tiled_lm_head_cross_entropy, hidden, weight, targets,
                         reduction=reduction, tile_tokens=tile)
    lowp = loss_and_grads(untiled, hidden, weight, targets, reduction=reduction)
    ref = loss_and_grads(untiled, hidden, weight, targets, dtype=torch.float64,
                         reduction=reduction)
    for name, g, lo, r in zip(("loss", "dhidden", "dweight"), got, lowp, ref):
        assert g.dtype == lo.dtype
        assert_close_rule(f"{name} (n {n}, tile {tile}, {reduction})", g, lo, r, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_inputs(device, dtype):
    hidden, weight, targets = make(45, 32, 300, device, ignore=3)
    got = loss_and_grads(tiled_lm_head_cross_entropy, hidden, weight, targets, dtype=dtype,
                         tile_tokens=16)
    lowp = loss_and_grads(untiled, hidden, weight, targets, dtype=dtype)
    ref = loss_and_grads(untiled, hidden, weight, targets, dtype=torch.float64)
    for name, g, lo, r in zip(("loss", "dhidden", "dweight"), got, lowp, ref):
        assert g.dtype == dtype
        assert_close_rule(name, g, lo, r, dtype)


def test_autocast_bf16(device):
    """Under autocast the op casts hidden and weight to bf16, as the product would be; the loss is
    float32 and the gradients reach the float32 leaves."""
    hidden, weight, targets = make(70, 32, 257, device)
    got = loss_and_grads(tiled_lm_head_cross_entropy, hidden, weight, targets, autocast=True,
                         tile_tokens=32)
    lowp = loss_and_grads(untiled, hidden, weight, targets, autocast=True)
    ref = loss_and_grads(untiled, hidden, weight, targets, dtype=torch.float64)
    assert got[0].dtype == lowp[0].dtype == torch.float32
    for name, g, lo, r in zip(("loss", "dhidden", "dweight"), got, lowp, ref):
        assert g.dtype == torch.float32
        assert_close_rule(name, g, lo, r, torch.bfloat16)


def test_batched_shape_tied_weight_and_one_sided_gradients(device):
    """hidden [B, L, C] with targets [B, L]; a transposed (column-major) hidden; gradients for
    only one input; all-ignored mean is NaN like F.cross_entropy's."""
    emb = torch.nn.Embedding(50, 16).to(device)
    tokens = torch.randint(0, 50, (3, 11), device=device)
    hidden = emb(tokens).detach()
    loss = tiled_lm_head_cross_entropy(hidden, emb.weight, tokens, tile_tokens=4,
                                       reduction="none")
    assert loss.shape == (3, 11)
    ref = F.cross_entropy(hidden.reshape(-1, 16) @ emb.weight.T, tokens.reshape(-1),
                          reduction="none").reshape(3, 11)
    assert_close_rule("loss", loss, ref, ref.double(), torch.float32)
    loss.sum().backward()  # only weight requires grad
    assert emb.weight.grad is not None
    transposed = torch.randn(16, 33, device=device).T.requires_grad_()  # [33, 16], column-major
    t = tokens.reshape(-1)
    tiled_lm_head_cross_entropy(transposed, emb.weight.detach(), t, tile_tokens=5).backward()
    want = torch.autograd.grad(untiled(transposed, emb.weight.detach(), t), transposed)[0]
    assert_close_rule("dhidden (transposed)", transposed.grad, want, want.double(), torch.float32)
    ignored = torch.full((5,), -100, device=device)
    h = torch.randn(5, 16, device=device)
    assert torch.isnan(tiled_lm_head_cross_entropy(h, emb.weight, ignored))
    assert torch.isnan(F.cross_entropy(h @ emb.weight.T, ignored))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile(device, backend):
    """The two custom ops are opaque to the compiler: the graph has them whole (fullgraph, no
    break), and the results equal eager's."""
    torch._dynamo.reset()
    hidden, weight, targets = make(40, 16, 64, device)

    def fn(h, w, t, reduction="mean"):
        return tiled_lm_head_cross_entropy(torch.tanh(h), w, t, tile_tokens=16,
                                           reduction=reduction)

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    eager = loss_and_grads(fn, hidden, weight, targets)
    got = loss_and_grads(compiled, hidden, weight, targets)
    for name, g, e in zip(("loss", "dhidden", "dweight"), got, eager):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6, msg=name)


def test_double_backward_is_refused(device):
    hidden, weight, targets = make(6, 4, 10, device)
    h = hidden.requires_grad_()
    (dh,) = torch.autograd.grad(tiled_lm_head_cross_entropy(h, weight, targets, tile_tokens=4), h,
                                create_graph=True)
    ref = torch.autograd.grad(untiled(h, weight, targets), h)[0]
    assert_close_rule("dhidden", dh, ref, ref.double(), torch.float32)
    with pytest.raises(RuntimeError, match="lm_head_ce_bwd.* no autograd formula"):
        dh.sum().backward()


def test_opcheck(device):
    hidden, weight, targets = make(9, 8, 20, device, ignore=2)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    torch.library.opcheck(torch.ops.sciattn.lm_head_ce_fwd.default, (h, w, targets, 4, -100))
    lse = torch.logsumexp(h @ w.T, -1).detach()
    torch.library.opcheck(torch.ops.sciattn.lm_head_ce_bwd.default,
                          (torch.ones(9, device=device), h.detach(), w.detach(), targets, lse, 4,
                           -100, True, True))


# ---- peak memory ----

_MEMORY_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.nn.functional as F
    from sciattn.training import tiled_lm_head_cross_entropy
    torch.manual_seed(0)
    mode, n, c, v = sys.argv[1], *map(int, sys.argv[2:5])
    h = torch.randn(n, c, requires_grad=True)
    w = torch.randn(v, c, requires_grad=True)
    t = torch.randint(0, v, (n,))
    def run(h, w, t):
        if mode == "tiled":
            return tiled_lm_head_cross_entropy(h, w, t, tile_tokens=128)
        return F.cross_entropy(h @ w.T, t)
    run(h[:8], w, t[:8]).backward()  # load every kernel; allocates the weight's gradient too
    h.grad = None
    def status(key):  # kB
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))
    try:  # resets the peak resident size (VmHWM) to the current one
        open("/proc/self/clear_refs", "w").write("5")
    except OSError:
        print("unsupported")
        sys.exit()
    before = status("VmRSS:")
    run(h, w, t).backward()
    print((status("VmHWM:") - before) * 1024)
""")


def _extra_peak_bytes(mode, n, c, v):
    # A fixed mmap threshold: glibc then serves every block of 64 KiB or more with mmap and
    # returns it on free. With its default, adaptive threshold, freed tiles stay in the heap
    # arenas of the OpenMP threads, and the resident size drifts by tens of MiB from run to run.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    r = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, mode, str(n), str(c), str(v)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    if r.stdout.split()[-1] == "unsupported":
        pytest.skip("/proc/self/clear_refs cannot reset the peak resident size here")
    return int(r.stdout.split()[-1])


def test_peak_memory_is_below_the_untiled_computation_on_cpu():
    """The peak resident memory above the inputs during forward + backward, each in a fresh
    process with the peak reset just before: F.cross_entropy over [2048, 16384] logits (128 MiB
    each in fp32, several of them alive) against 128-token tiles (8 MiB of logits each)."""
    n, c, v = 2048, 16, 16384
    logits_bytes = n * v * 4
    plain = _extra_peak_bytes("untiled", n, c, v)
    tiled = _extra_peak_bytes("tiled", n, c, v)
    print(f"extra peak: untiled {plain / 2**20:.1f} MiB, tiled {tiled / 2**20:.1f} MiB "
          f"(logits {logits_bytes / 2**20:.0f} MiB)")
    assert plain >= logits_bytes  # the measurement sees the logits
    assert tiled < logits_bytes / 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_peak_memory_is_below_the_untiled_computation_on_cuda():
    n, c, v = 8192, 64, 32768
    h = torch.randn(n, c, device="cuda", requires_grad=True)
    w = torch.randn(v, c, device="cuda", requires_grad=True)
    t = torch.randint(0, v, (n,), device="cuda")

    def peak(fn):
        h.grad = w.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    plain = peak(lambda: F.cross_entropy(h @ w.T, t))
    tiled = peak(lambda: tiled_lm_head_cross_entropy(h, w, t, tile_tokens=512))
    assert plain >= n * v * 4 and tiled < n * v * 4 / 4, (plain, tiled)


# ---- bad input ----

def test_bad_input_is_named():
    h, w, t = torch.randn(6, 4), torch.randn(10, 4), torch.randint(0, 10, (6,))
    with pytest.raises(ValueError, match=r"weight must have shape \[V, C\] with C"):
        tiled_lm_head_cross_entropy(h, torch.randn(10, 5), t)
    with pytest.raises(ValueError, match=r"weight must have shape \[V, C\] \(2 dimensions\)"):
        tiled_lm_head_cross_entropy(h, torch.randn(10), t)
    with pytest.raises(ValueError, match=r"targets must have shape hidden.shape\[:-1\]"):
        tiled_lm_head_cross_entropy(h, w, t[:5])
    with pytest.raises(TypeError, match="targets has dtype torch.float32"):
        tiled_lm_head_cross_entropy(h, w, t.float())
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16 but hidden"):
        tiled_lm_head_cross_entropy(h, w.bfloat16(), t)
    with pytest.raises(TypeError, match="hidden has dtype torch.float64"):
        tiled_lm_head_cross_entropy(h.double(), w.double(), t)
    with pytest.raises(ValueError, match="tile_tokens must be an int >= 1"):
        tiled_lm_head_cross_entropy(h, w, t, tile_tokens=0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        tiled_lm_head_cross_entropy(h, w, t, reduction="avg")
    with pytest.raises(ValueError, match=r"targets must be in \[0, 10\) or ignore_index"):
        tiled_lm_head_cross_entropy(h, w, torch.tensor([0, 1, 2, 3, 4, 10]))
    with pytest.raises(TypeError, match="hidden must be a torch.Tensor"):
        tiled_lm_head_cross_entropy(h.tolist(), w, t)
    assert default_tile_tokens(50304) == 1334 and default_tile_tokens(2) == 1 << 25


@pytest.mark.skipif(DEVICE != "cpu" or not torch.cuda.is_available(), reason="needs CUDA")
def test_devices_must_match():
    with pytest.raises(ValueError, match="weight is on cuda"):
        tiled_lm_head_cross_entropy(torch.randn(2, 3), torch.randn(4, 3, device="cuda"),
                                    torch.zeros(2, dtype=torch.int64))
