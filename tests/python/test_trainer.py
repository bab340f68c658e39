"""The C++ trainer (`sciattn train`, CPU path, fp32) against PyTorch: a tiny GPT's loss and every
parameter gradient of one step equal a float64 PyTorch implementation of the same model, built from
the weights and tokens the trainer dumps (--dump-gradients); and the adaptive clipping rule equals
its Python implementation (clip_reference.py) step by step.

The program is found at $SCIATTN_CLI, else build/cpu/tools/sciattn (scripts/test.sh builds the
cpu preset before pytest); the clipping trace at $SCIATTN_CLIP_TRACE, else
build/cpu/tests/train/train_clip_trace. Neither is skipped when missing: the test fails and says
how to build them."""
import json
import math
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from clip_reference import AdaptiveClipper

ROOT = Path(__file__).resolve().parents[2]
# fp32 (the trainer) against fp64 (the reference): the relative bound of CONVENTIONS.md's rule for
# an fp32 result, with room for the sums over a few hundred tokens.
REL_TOL = 1e-4


def built(env, default):
    path = Path(os.environ.get(env, ROOT / default))
    if not path.exists():
        pytest.fail(f"{path} not found: build the cpu preset first (cmake --preset cpu && "
                    f"cmake --build --preset cpu), or set {env}")
    return path


def run(*args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(map(str, args))}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def read_checkpoint(path):
    """The trainer's checkpoint format: magic, header length, JSON header, raw tensors."""
    data = Path(path).read_bytes()
    assert data[:8] == b"SCIACKPT"
    n = int.from_bytes(data[8:16], "little")
    header = json.loads(data[16:16 + n])
    tensors = {}
    for t in header["tensors"]:
        dtype = np.float32 if t["dtype"] == "f32" else np.int32
        count = math.prod(t["shape"])
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=16 + n + t["offset"])
        tensors[t["name"]] = arr.reshape(t["shape"]).copy()
    return header, tensors


# ---- the same GPT in PyTorch, float64 ----

def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rotate(x, base):
    """GPT-NeoX rotary ("rotate half") on [B, L, H, D] by position."""
    B, L, H, D = x.shape
    k = torch.arange(D // 2, dtype=torch.float64)
    angle = torch.arange(L, dtype=torch.float64)[:, None] * base ** (-2.0 * k / D)  # [L, D/2]
    cos, sin = torch.cos(angle)[None, :, None, :], torch.sin(angle)[None, :, None, :]
    a, b = x[..., :D // 2], x[..., D // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def gpt_loss(model, p, inputs, targets, mask):
    """Mean cross-entropy over every token of the batch. p: name -> float64 leaf tensor."""
    C, H = model["d_model"], model["n_heads"]
    D = C // H
    B, L = inputs.shape
    x = p["wte"][inputs]
    if model["positions"] == "learned":
        x = x + p["wpe"][:L][None]
    eps = model["layer_norm_eps"]
    for l in range(model["n_layers"]):
        h = lambda name: p[f"h{l}.{name}"]
        a = torch.nn.functional.layer_norm(x, (C,), h("ln1_w"), h("ln1_b"), eps)
        qkv = a @ h("qkv_w").T + h("qkv_b")
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, L, H, D) for i in range(3))
        if model["positions"] == "rotary":
            q, k = rotate(q, model["rotary_base"]), rotate(k, model["rotary_base"])
        s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        y = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v).reshape(B, L, C)
        x = x + y @ h("proj_w").T + h("proj_b")
        a = torch.nn.functional.layer_norm(x, (C,), h("ln2_w"), h("ln2_b"), eps)
        x = x + gelu_tanh(a @ h("fc_w").T + h("fc_b")) @ h("fcproj_w").T + h("fcproj_b")
    x = torch.nn.functional.layer_norm(x, (C,), p["lnf_w"], p["lnf_b"], eps)
    head = p["wte"] if model["tie_embeddings"] else p["lm_head"]
    logits = x @ head.T
    return torch.nn.functional.cross_entropy(logits.reshape(B * L, -1), targets.reshape(-1))


def causal_mask(L):
    return torch.tril(torch.ones(L, L, dtype=torch.bool))


def bslongformer_mask(L, block):
    """BSLongformer, sliding window of 3 blocks and global block 0, with the blocks above the
    diagonal dropped (the trainer's causal rule), then token-level causal."""
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    I, J = i // block, j // block
    return (j <= i) & (((I - J) <= 1) | (J == 0))


def write_corpus(path):
    rng = random.Random(5)
    words = ["alpha", "beta", "gamma", "delta", "genome", "codon", "protein", "attention"]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(80)]
    path.write_text("\n".join(lines) + "\n")


CASES = {
    # name: (model file, DeepSpeed config, extra flags, mask builder)
    "learned_tied": (
        {"vocab_size": 257, "d_model": 32, "n_layers": 2, "n_heads": 4, "sequence_length": 16,
         "positions": "learned", "seed": 11},
        {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2},
        [], causal_mask),
    "rotary_untied_padded_all_memory_techniques": (
        {"vocab_size": 260, "d_model": 48, "n_layers": 2, "n_heads": 2, "sequence_length": 13,
         "positions": "rotary", "tie_embeddings": False, "seed": 12, "mlp_ratio": 2.5},
        {"train_batch_size": 6, "train_micro_batch_size_per_gpu": 3,
         "activation_checkpointing": {},
         "fp16": {"enabled": True, "initial_scale_power": 14, "type": "ds_enhanced"}},
        ["--mlp-tile-tokens", "16", "--lm-head-tile-tokens", "24"], causal_mask),
    "bslongformer_sparse": (
        {"vocab_size": 257, "d_model": 32, "n_layers": 1, "n_heads": 2, "sequence_length": 64,
         "positions": "learned", "max_position_embeddings": 80, "seed": 13},
        {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
         "sparse_attention": {"mode": "bslongformer", "block": 16,
                              "num_sliding_window_blocks": 3, "global_block_indices": [0]}},
        [], lambda L: bslongformer_mask(L, 16)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_every_gradient_equal_pytorch(case, tmp_path):
    cli = built("SCIATTN_CLI", "build/cpu/tools/sciattn")
    model, config, flags, mask_of = CASES[case]
    corpus, tokens = tmp_path / "corpus.txt", tmp_path / "tokens.bin"
    write_corpus(corpus)
    run(cli, "data", "--text", corpus, "--lines", "--out", tokens)
    (tmp_path / "gpt.json").write_text(json.dumps(model))
    (tmp_path / "ds.json").write_text(json.dumps(config))
    dump = tmp_path / "step1.bin"
    run(cli, "train", "--config", tmp_path / "ds.json", "--model", tmp_path / "gpt.json",
        "--data", tokens, "--steps", "1", "--threads", "2", "--token-chunk", "8",
        "--dump-gradients", dump, *flags)

    header, t = read_checkpoint(dump)
    full = header["model"]
    params = {name[len("params/"):]: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for name, v in t.items() if name.startswith("params/")}
    inputs = torch.tensor(t["batch/inputs"], dtype=torch.long)
    targets = torch.tensor(t["batch/targets"], dtype=torch.long)
    loss = gpt_loss(full, params, inputs, targets, mask_of(full["sequence_length"]))
    loss.backward()

    assert abs(header["loss"] - loss.item()) <= 1e-5 * loss.item(), (header["loss"], loss.item())
    worst = (0.0, "")
    for name, p in params.items():
        got = torch.tensor(t[f"grads/{name}"], dtype=torch.float64)
        ref = p.grad
        err = (got - ref).abs().max().item()
        scale = ref.abs().max().item()
        assert err <= REL_TOL * scale + 1e-10, \
            f"{name}: max error {err:.3e}, max |ref| {scale:.3e} ({err / max(scale, 1e-30):.2e})"
        worst = max(worst, (err / max(scale, 1e-30), name))
    print(f"{case}: loss {loss.item():.6f} (trainer {header['loss']:.6f}); worst gradient "
          f"relative error {worst[0]:.2e} ({worst[1]}) over {len(params)} tensors")


def test_adaptive_clipping_equals_the_python_rule():
    trace = built("SCIATTN_CLIP_TRACE", "build/cpu/tests/train/train_clip_trace")
    rng = random.Random(17)
    # Quiet stretches, a drift upwards, spikes, a collapse, repeated values (even-count medians).
    norms = [1.0 + 0.1 * rng.random() for _ in range(30)]
    norms += [1.0 + 0.05 * i for i in range(40)]
    norms += [50.0, 1.2, 1.3, 300.0, 1.1] + [0.01 * rng.random() for _ in range(20)]
    norms += [2.0] * 12 + [rng.lognormvariate(0.0, 1.0) for _ in range(60)]
    for threshold, window, factor in [(1.0, 1000, 0.2), (0.5, 7, 0.5), (3.0, 2, 1.0), (1.0, 1, 0.05)]:
        text = "\n".join(repr(n) for n in norms) + "\n"
        r = subprocess.run([str(trace), repr(threshold), str(window), repr(factor)], input=text,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got = [json.loads(line) for line in r.stdout.splitlines()]
        ref = AdaptiveClipper(threshold, window, factor)
        want = [ref.step(n) for n in norms]
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            # Both sides are IEEE double with the same operations in the same order: exact.
            assert g == w, f"step {k} (threshold {threshold}, window {window}, factor {factor}): " \
                           f"C++ {g} != Python {w}"
