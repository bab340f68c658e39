"""The collectives of sciattn.distributed (Python package layer): the sequence all-to-all and the
rank-ordered sum of a replicated tensor's gradient, as autograd functions over torch.distributed's
functional collectives (the c10d ops that torch.compile traces into its graph)."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def group_size_rank(group, who):
    """(P, rank in group) of this process; a RuntimeError naming `who` when torch.distributed is
    not initialized or this process is not in the group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{who}: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first (launch with torchrun, "
                           "docs/distributed.md)")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise RuntimeError(f"{who}: this process (global rank {dist.get_rank()}) is not a member "
                           "of the given process group")
    return dist.get_world_size(group), rank


def shares(n, parts):
    """n items cut into `parts` contiguous shares that differ by at most one, the larger ones
    first: the split of an uneven head count (each rank's share of the heads)."""
    return [n // parts + (1 if r < n % parts else 0) for r in range(parts)]


def _wait(t):
    # Eager calls get an AsyncCollectiveTensor that would wait at its first use; waiting here
    # gives the callers a plain tensor. Under tracing the collectives already return one.
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _all_to_all(x, scatter_dim, gather_dim, group, rank, scatter_sizes, gather_sizes):
    """Rank r cuts x along scatter_dim into P pieces of scatter_sizes[j] (piece j goes to rank j)
    and concatenates along gather_dim the P pieces it receives, rank i's piece having
    gather_sizes[i] along that dim. Both lists are the same on every rank."""
    # Plain loops, not generator expressions: dynamo cannot trace a generator inside an
    # autograd.Function's forward.
    other = 1
    for d, n in enumerate(x.shape):
        if d != scatter_dim and d != gather_dim:
            other *= n
    # With the scattered dim leading, each rank's piece is one contiguous run of the buffer. The
    # buffer is flat so that pieces of different widths along gather_dim (uneven heads on the
    # way back) fit the one-dimensional splits of all_to_all_single.
    send = x.movedim(scatter_dim, 0).contiguous().view(-1)
    in_splits = [n * x.shape[gather_dim] * other for n in scatter_sizes]
    mine = scatter_sizes[rank]
    out_splits = [mine * n * other for n in gather_sizes]
    recv = _wait(funcol.all_to_all_single(send, out_splits, in_splits, group))
    moved = [x.shape[scatter_dim]] + [n for d, n in enumerate(x.shape) if d != scatter_dim]
    gather_pos = gather_dim + 1 if gather_dim < scatter_dim else gather_dim
    pieces = []
    for piece, n in zip(recv.split(out_splits), gather_sizes):
        shape = list(moved)
        shape[0], shape[gather_pos] = mine, n
        pieces.append(piece.view(shape).movedim(0, scatter_dim))
    # cat writes the pieces in x's dim order: one copy, and the result is contiguous.
    return torch.cat(pieces, dim=gather_dim)


class SeqAllToAll(torch.autograd.Function):
    """The all-to-all of _all_to_all as an autograd function. Its adjoint is the all-to-all that
    scatters gather_dim with gather_sizes and gathers scatter_dim with scatter_sizes (each rank
    sends every received piece's gradient back to where the piece came from), applied through
    this same function, so the backward is differentiable too."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group, rank, scatter_sizes, gather_sizes):
        ctx.inverse = (gather_dim, scatter_dim, group, rank, gather_sizes, scatter_sizes)
        return _all_to_all(x, scatter_dim, gather_dim, group, rank, scatter_sizes, gather_sizes)

    @staticmethod
    def backward(ctx, dy):
        return (SeqAllToAll.apply(dy, *ctx.inverse),) + (None,) * 6


def ordered_sum(partial, group, size):
    """The sum over the group's ranks of each rank's `partial` (same shape everywhere), added in
    rank order 0, 1, ..., P-1 in float32 (float64 stays float64) and rounded once to partial's
    dtype. Every rank computes the same additions on the same gathered bits, so the result is
    the same on every rank and the same from run to run, which an all_reduce (whose reduction
    order the backends do not specify) does not promise."""
    gathered = _wait(funcol.all_gather_tensor(partial.contiguous(), 0, group))
    parts = gathered.view((size,) + tuple(partial.shape))
    acc_dtype = torch.float64 if partial.dtype == torch.float64 else torch.float32
    total = parts[0].to(acc_dtype)
    for i in range(1, size):
        total = total + parts[i].to(acc_dtype)
    return total.to(partial.dtype)


class SumGradOverRanks(torch.autograd.Function):
    """Identity in the forward; in the backward, the gradient becomes ordered_sum of the ranks'
    gradients. Put in front of a tensor that every rank holds whole (replicated) while each rank
    computes with its own shard of the other inputs: each rank's gradient is then a partial sum,
    and the replicated tensor's true gradient is their sum."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ordered_sum(grad, ctx.group, ctx.size), None, None
