"""Shared fixtures and helpers of the Python tests: the device under test, seeded inputs, NaN
poisoning of every tensor the ops allocate, and the tolerance rule of docs/conventions.md.

SCIATTN_TEST_DEVICE=cuda runs the suite on CUDA tensors (the GPU machine); ops this build cannot
run there (NotImplementedError from the library) are skipped with the library's message."""
import os
import random

import pytest
import torch

DEVICE = os.environ.get("SCIATTN_TEST_DEVICE", "cpu")


def pytest_report_header(config):
    import sciattn
    return (f"sciattn: device {DEVICE}, torch {torch.__version__}, "
            f"built_with_cuda={sciattn.built_with_cuda()}")


@pytest.fixture
def device():
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("SCIATTN_TEST_DEVICE=cuda but no CUDA device")
    return torch.device(DEVICE)


@pytest.fixture(autouse=True)
def poison_and_seed(request):
    """Seeds every test (the seed is printed on failure) and makes torch fill the memory of every
    new tensor with NaN, the ops' outputs included, so that unwritten elements show."""
    seed = 1234 + sum(map(ord, request.node.name)) % 10000
    torch.manual_seed(seed)
    random.seed(seed)
    print(f"seed {seed}")
    old_fill = torch.utils.deterministic.fill_uninitialized_memory
    old_det = torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.utils.deterministic.fill_uninitialized_memory = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield seed
    torch.use_deterministic_algorithms(old_det, warn_only=old_warn)
    torch.utils.deterministic.fill_uninitialized_memory = old_fill


def run_or_skip(fn, *args, **kwargs):
    """Calls fn; on CUDA, a NotImplementedError (a path this build lacks) becomes a skip."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        if DEVICE == "cuda":
            pytest.skip(f"not supported on CUDA in this build: {e}")
        raise


# ---- the tolerance rule ----

_REL_ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float64: 1e-12}


def assert_close_rule(name, got, lowp_ref, ref64, dtype):
    """max|got - ref64| <= 2 * max|lowp_ref - ref64| + atol, atol relative to max(1, max|ref64|)
    (docs/conventions.md; atol values as tests/cpu/evoformer_test_util.h). lowp_ref is the reference
    run with inputs and outputs in the tested dtype."""
    got = got.detach().double().cpu()
    lowp = lowp_ref.detach().double().cpu()
    ref = ref64.detach().double().cpu()
    assert got.shape == ref.shape, f"{name}: shape {list(got.shape)} != {list(ref.shape)}"
    assert torch.isfinite(got).all() == torch.isfinite(ref).all(), \
        f"{name}: non-finite values where the reference has none (unwritten output?)"
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), finite), f"{name}: non-finite pattern differs"
    err = (got - ref)[finite].abs()
    lerr = (lowp - ref)[finite].abs()
    max_ref = ref[finite].abs().max().item() if finite.any() else 0.0
    atol = _REL_ATOL[dtype] * max(1.0, max_ref)
    bound = 2 * (lerr.max().item() if lerr.numel() else 0.0) + atol
    max_err = err.max().item() if err.numel() else 0.0
    mean_err = err.mean().item() if err.numel() else 0.0
    assert max_err <= bound, (f"{name} ({dtype}): max err {max_err:.3g}, mean err {mean_err:.3g}, "
                              f"bound {bound:.3g} (lowp err {lerr.max().item():.3g}, "
                              f"atol {atol:.3g}), max|ref| {max_ref:.3g}")


def rand(*shape, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(device=device, dtype=dtype)
