"""Layout tensors as the ops take them: [H, R, C] int64 0/1 on the CPU, and their nnz."""
import torch


def prepare_layout(layout, name="layout", count=True):
    """layout as [H, R, C] int64 on the CPU (no copy when it already is one), checked to hold
    only 0s and 1s, and its nnz (None when count is False)."""
    if not isinstance(layout, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of 0s and 1s; got {type(layout).__name__}")
    if layout.is_floating_point() or layout.is_complex():
        raise TypeError(f"{name} must be an integer or bool tensor; got dtype {layout.dtype}")
    if layout.dim() == 2:
        layout = layout.unsqueeze(0)
    if layout.dim() != 3:
        raise ValueError(f"{name} must have shape [H, R, C] or [R, C]; got {list(layout.shape)}")
    is_bool = layout.dtype == torch.bool
    layout = layout.detach().to("cpu", torch.int64).contiguous()
    # One pass over the layout for the check (a make_layout at 65,536 tokens and block 16 is
    # 2.1 GB of int64): the smallest and largest entry, instead of comparisons with temporaries.
    if not is_bool and layout.numel() > 0:
        low, high = torch.aminmax(layout)
        if int(low) < 0 or int(high) > 1:
            raise ValueError(f"{name} must hold only 0s and 1s")
    return layout, (int(layout.sum()) if count else None)


def block_size(block, name="block"):
    if isinstance(block, bool) or not isinstance(block, int):
        raise TypeError(f"{name} must be an int; got {type(block).__name__}")
    if block not in (16, 32, 64, 128):
        raise ValueError(f"{name} must be 16, 32, 64 or 128; got {block}")
    return block
