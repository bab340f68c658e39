"""The LM head and its cross-entropy in tiles over tokens, as an autograd op that never holds the
[tokens, vocabulary] logits: the forward computes each tile's logits, keeps only their
log-sum-exp, and drops them; the backward recomputes each tile's logits and forms the tile's
hidden-state gradient and its share of the weight gradient. The two halves are torch.library custom
ops (sciattn::lm_head_ce_fwd, sciattn::lm_head_ce_bwd) with fake kernels, so torch.compile keeps
them whole (the tiles are not traced into the graph) and the memory bound holds under compile."""
import torch

from .. import _checks

_REDUCTIONS = ("mean", "sum", "none")
# The default tile holds at most this many logits (256 MiB in fp32).
_DEFAULT_TILE_LOGITS = 1 << 26


def default_tile_tokens(vocab_size):
    """Tokens per tile when tile_tokens is None: as many as keep a tile's logits at 2^26
    elements (256 MiB in fp32)."""
    return max(1, _DEFAULT_TILE_LOGITS // max(1, vocab_size))


def _tiles(n, tile):
    return ((t0, min(n, t0 + tile)) for t0 in range(0, n, tile))


def _check_targets(targets, vocab, ignore_index):
    """Out-of-range targets are an error on the CPU; on a GPU the gather's device-side assert
    catches them (as in F.cross_entropy), since a check here would synchronise."""
    if targets.device.type != "cpu" or targets.numel() == 0:
        return
    valid = targets[targets != ignore_index]
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= vocab):
        raise ValueError(f"targets must be in [0, {vocab}) or ignore_index ({ignore_index}); got "
                         f"values in [{int(valid.min())}, {int(valid.max())}]")


@torch.library.custom_op("sciattn::lm_head_ce_fwd", mutates_args=())
def _lm_head_ce_fwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    tile_tokens: int, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and log-sum-exp, both float32 [N]; 0 loss where targets == ignore_index.
    hidden [N, C] and weight [V, C] of one dtype; the logits of a tile are in that dtype, the
    log-sum-exp and the loss in float32 (as F.cross_entropy does under autocast)."""
    n = hidden.shape[0]
    _check_targets(targets, weight.shape[0], ignore_index)
    loss = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        for t0, t1 in _tiles(n, tile_tokens):
            logits = (hidden[t0:t1] @ weight.T).float()  # [T, V]
            tile_lse = torch.logsumexp(logits, dim=-1)
            tgt = targets[t0:t1]
            valid = tgt != ignore_index
            picked = logits.gather(1, torch.where(valid, tgt, 0)[:, None]).squeeze(1)
            loss[t0:t1] = torch.where(valid, tile_lse - picked, 0.0)
            lse[t0:t1] = tile_lse
            del logits
    return loss, lse


@_lm_head_ce_fwd.register_fake
def _lm_head_ce_fwd_fake(hidden, weight, targets, tile_tokens, ignore_index):
    n = hidden.shape[0]
    return (hidden.new_empty((n,), dtype=torch.float32),
            hidden.new_empty((n,), dtype=torch.float32))


@torch.library.custom_op("sciattn::lm_head_ce_bwd", mutates_args=())
def _lm_head_ce_bwd(dloss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                    targets: torch.Tensor, lse: torch.Tensor, tile_tokens: int, ignore_index: int,
                    need_dhidden: bool, need_dweight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """dhidden [N, C] and dweight [V, C] (empty when not needed) from dloss [N]: per tile,
    dlogits = (softmax(logits) - onehot(target)) * dloss, dhidden = dlogits @ weight and
    dweight += dlogits^T @ hidden. dweight accumulates in float32 across tiles."""
    n = hidden.shape[0]
    # Row-major whatever hidden's strides, so that each tile's rows are one contiguous block.
    dhidden = hidden.new_empty(hidden.shape) if need_dhidden else hidden.new_empty((0,))
    dweight32 = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                 if need_dweight else None)
    with torch.autocast(hidden.device.type, enabled=False):
        for t0, t1 in _tiles(n, tile_tokens):
            h = hidden[t0:t1]
            # The softmax, formed in place in the tile's float32 logits.
            p = (h @ weight.T).float()
            p.sub_(lse[t0:t1, None]).exp_()
            tgt = targets[t0:t1]
            valid = tgt != ignore_index
            p.scatter_add_(1, torch.where(valid, tgt, 0)[:, None],
                           -valid.to(torch.float32)[:, None])
            p.mul_(torch.where(valid, dloss[t0:t1].to(torch.float32), 0.0)[:, None])
            g = p.to(hidden.dtype)
            del p
            if need_dhidden:
                torch.mm(g, weight, out=dhidden[t0:t1])
            if need_dweight:
                if g.dtype == torch.float32:
                    dweight32.addmm_(g.T, h)
                else:
                    dweight32.add_(g.T @ h)
            del g
    dweight = (dweight32.to(weight.dtype) if need_dweight else weight.new_empty((0,)))
    return dhidden, dweight


@_lm_head_ce_bwd.register_fake
def _lm_head_ce_bwd_fake(dloss, hidden, weight, targets, lse, tile_tokens, ignore_index,
                         need_dhidden, need_dweight):
    return (hidden.new_empty(hidden.shape) if need_dhidden else hidden.new_empty((0,)),
            weight.new_empty(weight.shape) if need_dweight else weight.new_empty((0,)))


def _setup_context(ctx, inputs, output):
    hidden, weight, targets, tile_tokens, ignore_index = inputs
    ctx.save_for_backward(hidden, weight, targets, output[1])
    ctx.args = (tile_tokens, ignore_index)


def _backward(ctx, dloss, dlse):
    hidden, weight, targets, lse = ctx.saved_tensors
    need_dh, need_dw = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need_dh or need_dw):
        return None, None, None, None, None
    # lm_head_ce_bwd has no autograd formula: under create_graph=True, torch refuses to
    # backpropagate through it (a RuntimeError) rather than leaving a second-derivative term out.
    dh, dw = torch.ops.sciattn.lm_head_ce_bwd(dloss, hidden, weight, targets, lse, *ctx.args,
                                              need_dh, need_dw)
    return (dh if need_dh else None), (dw if need_dw else None), None, None, None


_lm_head_ce_fwd.register_autograd(_backward, setup_context=_setup_context)


def tiled_lm_head_cross_entropy(hidden, weight, targets, tile_tokens=None, reduction="mean",
                                ignore_index=-100):
    """``F.cross_entropy(hidden @ weight.T, targets, reduction=..., ignore_index=...)`` without
    the [N, V] logits: at most ``tile_tokens`` rows of them exist at a time, in the forward and in
    the backward (which recomputes them).

    Args:
        hidden: [*, C] final hidden states (float32, bfloat16 or float16).
        weight: [V, C] the LM head (or the tied embedding), hidden's dtype and device.
        targets: [*] integer class indices in [0, V), or ignore_index.
        tile_tokens: tokens per tile (default: as many as keep a tile at 2^26 logits).
        reduction: "mean" (over the targets that are not ignored), "sum" or "none" (shape [*]).
        ignore_index: targets with this value contribute no loss and no gradient.

    Under ``torch.autocast`` hidden and weight are cast to the autocast dtype (as the matrix
    product would be) and the loss is float32; otherwise the loss has hidden's dtype, as
    F.cross_entropy's would. The logits are formed in the inputs' dtype and reduced in float32.
    Works on CPU and CUDA tensors and under torch.compile (the op is opaque to the compiler).
    """
    _checks.tensor(hidden, "hidden")
    _checks.tensor(weight, "weight")
    _checks.tensor(targets, "targets")
    _checks.dtype_in(hidden, "hidden", (torch.float32, torch.bfloat16, torch.float16),
                     "float32, bfloat16 or float16")
    _checks.supported_device(hidden, "hidden")
    _checks.same_device(weight, "weight", hidden, "hidden")
    _checks.same_device(targets, "targets", hidden, "hidden")
    if hidden.dim() < 1:
        raise ValueError("hidden must have shape [*, C]; got a 0-dim tensor")
    _checks.ndim(weight, "weight", 2, "[V, C]")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must have shape [V, C] with C = hidden's last dimension "
                         f"({hidden.shape[-1]}); got {list(weight.shape)}")
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"targets has dtype {targets.dtype}; expected an integer dtype (class "
                        "indices)")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"targets must have shape hidden.shape[:-1] = {list(hidden.shape[:-1])}; "
                         f"got {list(targets.shape)}")
    _checks.choice(reduction, "reduction", _REDUCTIONS)
    if tile_tokens is None:
        tile_tokens = default_tile_tokens(weight.shape[0])
    if isinstance(tile_tokens, bool) or not isinstance(tile_tokens, int) or tile_tokens < 1:
        raise ValueError(f"tile_tokens must be an int >= 1 or None; got {tile_tokens!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int; got {type(ignore_index).__name__}")

    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        out_dtype = torch.float32
    else:
        _checks.same_dtype(weight, "weight", hidden, "hidden")
        out_dtype = hidden.dtype
    batch_shape = targets.shape
    flat_targets = targets.reshape(-1).to(torch.int64)
    loss, _ = torch.ops.sciattn.lm_head_ce_fwd(hidden.reshape(-1, hidden.shape[-1]), weight,
                                               flat_targets, tile_tokens, ignore_index)
    if reduction == "none":
        return loss.reshape(batch_shape).to(out_dtype)
    total = loss.sum()
    if reduction == "mean":
        total = total / (flat_targets != ignore_index).sum()
    return total.to(out_dtype)
