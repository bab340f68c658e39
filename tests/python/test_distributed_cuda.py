"""sciattn.distributed on two GPUs: two processes joined by NCCL, each on its own GPU, run the
cases of distributed_cases.py on CUDA tensors with sciattn's CUDA kernels, in bf16 and fp16 (the
output and every gradient of each rank equal the single-process call on the whole tensors by the
tolerance rule; bitwise reruns; torch.compile; checkpointing). Skipped unless this machine has at
least two CUDA devices and sciattn was built with its CUDA kernels (the nvidia-h200-x2 machine:
docs/distributed.md gives the command)."""
import pytest
import torch

import distributed_cases as cases
import sciattn
from distributed_pool import Pools

P = 2
DTYPES = ["bfloat16", "float16"]

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < P or not sciattn.built_with_cuda(),
    reason=f"needs {P} CUDA devices and a CUDA build of sciattn")


@pytest.fixture(scope="module")
def pool():
    p = Pools()
    yield lambda: p.get(P, "nccl")
    p.close_all()


def test_all_to_all_round_trip(pool, poison_and_seed):
    pool().run(cases.all_to_all_round_trip, poison_and_seed, "cuda")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,uneven,flat,gqa", [
    (False, False, False, False), (True, False, True, False), (True, True, False, False),
    (False, False, False, True)])
def test_ulysses_sdpa(pool, dtype, causal, uneven, flat, gqa, poison_and_seed):
    pool().run(cases.ulysses_sdpa, poison_and_seed, "cuda", dtype, causal, uneven, flat, gqa)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("uneven", [False, True])
def test_ulysses_sparse_self_attention(pool, dtype, uneven, poison_and_seed):
    pool().run(cases.ulysses_sparse, poison_and_seed, "cuda", dtype, uneven)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("uneven_n,bias1,bias2", [(False, "float", True), (True, "float", True),
                                                  (True, "bool", True), (False, None, False)])
def test_evoformer_sharded(pool, dtype, uneven_n, bias1, bias2, poison_and_seed):
    dbias2 = pool().run(cases.evoformer_sharded, poison_and_seed, "cuda", dtype, uneven_n, bias1,
                        bias2)
    if bias2:
        assert torch.equal(dbias2[1].view(torch.uint8), dbias2[0].view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic(pool, dtype, poison_and_seed):
    pool().run(cases.deterministic, poison_and_seed, "cuda", dtype)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile(pool, backend, poison_and_seed):
    pool().run(cases.compiled, poison_and_seed, "cuda", "bfloat16", backend, timeout=600)


def test_checkpoint(pool, poison_and_seed):
    pool().run(cases.checkpointed, poison_and_seed, "cuda", "bfloat16")
