"""A pool of P worker processes joined in one torch.distributed process group, for the tests of
sciattn.distributed. Starting P processes that import torch takes seconds on a 2-core machine, so
a pool is started once per (P, backend) and every test runs its case on it: pool.run(case, *args)
calls case(rank, P, *args) on every rank and returns the P results (or raises, with every failing
rank's traceback). A case that fails on some ranks can leave the others inside a collective: the
group's timeout turns that into an error, and a pool with a failure is replaced before the next
test."""
import datetime
import importlib
import os
import queue
import socket
import traceback

import torch
import torch.multiprocessing as mp

# A rank left waiting in a collective by a failed peer gives up after this long.
COLLECTIVE_TIMEOUT_S = 60
START_TIMEOUT_S = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, size, port, backend, commands, results):
    try:
        import torch.distributed as dist
        torch.set_num_threads(1)  # P processes share the machine's cores
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=size,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        # As conftest.py does in the main process: new tensors start as NaN, so that elements an
        # op leaves unwritten show in the comparisons.
        torch.utils.deterministic.fill_uninitialized_memory = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        import sciattn  # noqa: F401
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    results.put((rank, True, "ready"))
    while True:
        command = commands.get()
        if command is None:
            break
        module, name, args = command
        try:
            case = getattr(importlib.import_module(module), name)
            results.put((rank, True, case(rank, size, *args)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class Pool:
    def __init__(self, size, backend="gloo"):
        if backend == "nccl":
            # All-to-all and all-gather do not use NVLink multicast (NVLS); it stays off, as
            # shared multi-GPU hosts require, whatever the environment the tests start from.
            for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                         "NVSHMEM_DISABLE_NVLS"):
                os.environ.setdefault(name, "0" if name == "NCCL_NVLS_ENABLE" else "1")
        ctx = mp.get_context("spawn")
        self.size, self.backend, self.failed = size, backend, False
        self.commands = [ctx.Queue() for _ in range(size)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=_worker, daemon=True,
                                  args=(r, size, port, backend, self.commands[r], self.results))
                      for r in range(size)]
        for p in self.procs:
            p.start()
        self._collect("start the pool", START_TIMEOUT_S)

    def _collect(self, what, timeout):
        got, errors = {}, []
        for _ in range(self.size):
            try:
                rank, ok, value = self.results.get(timeout=timeout)
            except queue.Empty:
                self.failed = True
                missing = sorted(set(range(self.size)) - set(got) - {e[0] for e in errors})
                errors.append((missing, f"no answer within {timeout} s"))
                break
            if ok:
                got[rank] = value
            else:
                errors.append((rank, value))
        if errors:
            self.failed = True
            text = "\n".join(f"--- rank {r} ---\n{v}" for r, v in errors)
            raise AssertionError(f"{what} failed on P = {self.size} ({self.backend}):\n{text}")
        return [got[r] for r in range(self.size)]

    def run(self, case, *args, timeout=2 * COLLECTIVE_TIMEOUT_S):
        """case(rank, P, *args) on every rank (case: a module-level function); its P results."""
        for q in self.commands:
            q.put((case.__module__, case.__name__, args))
        return self._collect(case.__name__, timeout)

    def close(self):
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10 if not self.failed else 1)
            if p.is_alive():
                p.terminate()
                p.join()


class Pools:
    """One live Pool per (P, backend), replaced after a failure; close_all at the session's end."""

    def __init__(self):
        self.pools = {}

    def get(self, size, backend="gloo"):
        key = (size, backend)
        pool = self.pools.get(key)
        if pool is not None and pool.failed:
            pool.close()
            pool = None
        if pool is None:
            pool = self.pools[key] = Pool(size, backend)
        return pool

    def close_all(self):
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
