"""Argument checks of the Python API: each failure is a TypeError (not a tensor, wrong dtype) or a
ValueError (shape, device, value) whose message names the argument and says what is expected.
They read only metadata, so they cost nothing under torch.compile."""
import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_FLOAT_NAMES = "float32, float16, bfloat16 or float64"


def tensor(x, name):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    return x


def optional_tensor(x, name):
    return None if x is None else tensor(x, name)


def float_dtype(x, name):
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; expected {_FLOAT_NAMES}")


def same_dtype(x, name, ref, ref_name):
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but {ref_name} has dtype {ref.dtype}; "
                        "they must be equal")


def dtype_in(x, name, allowed, what):
    if x.dtype not in allowed:
        raise TypeError(f"{name} has dtype {x.dtype}; expected {what}")


def same_device(x, name, ref, ref_name):
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}; every tensor "
                         "must be on the same device")


def supported_device(x, name):
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {x.device}; sciattn runs on cpu and cuda tensors")


def shape(x, name, expected, pattern):
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {pattern} = {list(expected)}; "
                         f"got {list(x.shape)}")


def ndim(x, name, n, pattern):
    if x.dim() != n:
        raise ValueError(f"{name} must have shape {pattern} ({n} dimensions); "
                         f"got {list(x.shape)}")


def not_empty(x, name, pattern):
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty: got shape {list(x.shape)} ({pattern}); every "
                         "size must be at least 1")


def scale(value, name="scale"):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or None; got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    return float(value)


def choice(value, name, options):
    """`value` when it is one of `options` (the accepted strings of an enum argument)."""
    if value not in options:
        raise ValueError(f"{name} must be one of {sorted(options)}; got {value!r}")
    return value
