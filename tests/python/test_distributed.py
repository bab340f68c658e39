"""sciattn.distributed on the CPU: P = 2 and 4 processes joined by gloo (a pool of workers started
once per P, tests/python/distributed_pool.py) run the cases of distributed_cases.py: for random
shapes, each rank's shard of the output and of every gradient equals the single-process call on
the whole tensors (tolerance rule, float32); the all-to-all round trip is the identity bit for
bit; the documented errors; bitwise reruns; torch.compile(fullgraph=True) and activation
checkpointing."""
import pytest
import torch

import distributed_cases as cases
from distributed_pool import Pools
from sciattn import distributed as sp

SIZES = [2, 4]


@pytest.fixture(scope="module")
def pools():
    p = Pools()
    yield p
    p.close_all()


@pytest.mark.parametrize("P", SIZES)
def test_all_to_all_round_trip(pools, P, poison_and_seed):
    pools.get(P).run(cases.all_to_all_round_trip, poison_and_seed, "cpu")


@pytest.mark.parametrize("P", SIZES)
@pytest.mark.parametrize("causal,uneven,flat,gqa", [
    (False, False, False, False), (True, False, True, False), (True, True, False, False),
    (False, False, False, True)])
def test_ulysses_sdpa(pools, P, causal, uneven, flat, gqa, poison_and_seed):
    pools.get(P).run(cases.ulysses_sdpa, poison_and_seed, "cpu", "float32", causal, uneven, flat,
                     gqa)


@pytest.mark.parametrize("P", SIZES)
@pytest.mark.parametrize("uneven", [False, True])
def test_ulysses_sparse_self_attention(pools, P, uneven, poison_and_seed):
    pools.get(P).run(cases.ulysses_sparse, poison_and_seed, "cpu", "float32", uneven)


@pytest.mark.parametrize("P", SIZES)
@pytest.mark.parametrize("uneven_n,bias1,bias2", [(False, "float", True), (True, "float", True),
                                                  (True, "bool", True), (False, None, False)])
def test_evoformer_sharded(pools, P, uneven_n, bias1, bias2, poison_and_seed):
    dbias2 = pools.get(P).run(cases.evoformer_sharded, poison_and_seed, "cpu", "float32",
                              uneven_n, bias1, bias2)
    if bias2:  # the full gradient, the same bits on every rank
        for r in range(1, P):
            assert torch.equal(dbias2[r].view(torch.uint8), dbias2[0].view(torch.uint8)), r


@pytest.mark.parametrize("P", SIZES)
def test_deterministic(pools, P, poison_and_seed):
    pools.get(P).run(cases.deterministic, poison_and_seed, "cpu", "float32")


@pytest.mark.parametrize("P", SIZES)
def test_errors(pools, P, poison_and_seed):
    pools.get(P).run(cases.errors, poison_and_seed)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile(pools, backend, poison_and_seed):
    pools.get(2).run(cases.compiled, poison_and_seed, "cpu", "float32", backend, timeout=600)


def test_checkpoint(pools, poison_and_seed):
    pools.get(2).run(cases.checkpointed, poison_and_seed, "cpu", "float32")


def test_needs_an_initialized_process_group():
    x = torch.randn(4, 1, 2, 8)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        sp.DistributedAttention(cases.sdpa_seq_first, None)(x, x, x)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        sp.evoformer_attention(x[None], x[None], x[None])
