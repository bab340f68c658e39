"""from_deepspeed_config: the loss scaler, the gradient clipper and CPUAdamW's arguments from a
DeepSpeed config (a dict, JSON text or a path), read with the trainer's keys and defaults."""
import dataclasses
import json
import os

from ._config_keys import Section
from .grad_clip import AdaptiveGradClipper
from .loss_scaler import DynamicLossScaler

_OPTIMIZER_PARAMS = "lr, betas, eps, weight_decay, bias_correction, adam_w_mode (Adam)"
# Optimizer params that choose a PyTorch implementation inside DeepSpeed: accepted and ignored.
_OPTIMIZER_IGNORED = ("torch_adam", "fused", "foreach", "capturable", "differentiable")


@dataclasses.dataclass
class DeepSpeedTraining:
    """What from_deepspeed_config builds.

    precision: "fp16", "bf16" or "fp32" (the fp16 / bf16 sections' ``enabled``).
    loss_scaler: a DynamicLossScaler from the fp16 section when fp16 is enabled, else None.
    grad_clipper: an AdaptiveGradClipper from ``gradient_clipping`` when it is set and not off,
        else None.
    optimizer_kwargs: CPUAdamW's keyword arguments from the ``optimizer`` section (AdamW, or Adam
        with adam_w_mode), or None without one; ``optimizer(params)`` builds it.
    """
    precision: str
    loss_scaler: object
    grad_clipper: object
    optimizer_kwargs: dict

    def optimizer(self, params):
        """A sciattn.optim.CPUAdamW over ``params`` with the config's arguments (its defaults
        when the config has no optimizer section)."""
        from ..optim import CPUAdamW
        return CPUAdamW(params, **(self.optimizer_kwargs or {}))


def _load(config):
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)):
        text = str(config)
        if not text.lstrip().startswith("{"):
            with open(text) as f:
                text = f.read()
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("a DeepSpeed config must be a JSON object")
        return value
    raise TypeError(f"config must be a dict, JSON text or a path; got {type(config).__name__}")


def _enabled(config, key):
    if key not in config:
        return False
    s = Section(config[key], key)
    return s.boolean("enabled", False)


def _optimizer_kwargs(config):
    opt = Section(config["optimizer"], "optimizer")
    kind = opt.value.get("type", "AdamW")
    opt.read.add("type")
    if not isinstance(kind, str) or kind.lower() not in ("adamw", "adam"):
        raise ValueError(f'optimizer.type {kind!r} is not supported; CPUAdamW runs AdamW (type '
                         '"AdamW", or "Adam" with adam_w_mode)')
    params = opt.value.get("params", {})
    opt.read.add("params")
    opt.finish("type, params")
    p = Section(params, "optimizer.params")
    kwargs = {}
    for key in ("lr", "eps", "weight_decay"):
        value = p.number(key, None)
        if value is not None:
            kwargs[key] = value
    if "betas" in params:
        p.read.add("betas")
        betas = params["betas"]
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2
                and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)):
            raise ValueError(f"optimizer.params.betas must be a list of two numbers; got {betas!r}")
        kwargs["betas"] = (float(betas[0]), float(betas[1]))
    kwargs["bias_correction"] = p.boolean("bias_correction", True)
    adamw = p.boolean("adam_w_mode", True)
    if kind.lower() == "adamw" and not adamw:
        raise ValueError('optimizer.params.adam_w_mode is false, which contradicts type "AdamW"; '
                         'use type "Adam" for L2 weight decay')
    kwargs["adamw_mode"] = adamw
    if p.boolean("amsgrad", False):
        raise ValueError("optimizer.params.amsgrad is not supported (DeepSpeed's Adam refuses it "
                         "too)")
    p.finish(_OPTIMIZER_PARAMS, _OPTIMIZER_IGNORED)
    return kwargs


def from_deepspeed_config(config, *, raise_error_at_min_scale=True):
    """Reads the ``fp16``, ``bf16`` (or ``bfloat16``), ``gradient_clipping`` and ``optimizer``
    sections of a DeepSpeed config (a dict, JSON text, or the path of a JSON file; other sections
    are not read) with the keys, defaults and rules of ``sciattn train``, and returns a
    DeepSpeedTraining with the loss scaler, the clipper and CPUAdamW's arguments. Errors are
    ValueErrors naming the key ("fp16.hysteresis must be >= 1", "gradient_clipping.tpye is not a
    key ...")."""
    config = _load(config)
    if "bf16" in config and "bfloat16" in config:
        raise ValueError("bfloat16 and bf16 are the same section; keep one")
    bf16_key = "bfloat16" if "bfloat16" in config else "bf16"
    fp16 = _enabled(config, "fp16")
    bf16 = _enabled(config, bf16_key)
    if fp16 and bf16:
        raise ValueError("fp16 and bf16 are both enabled; enable at most one (DeepSpeed refuses "
                         "this too)")
    scaler = None
    if fp16:
        scaler = DynamicLossScaler(config["fp16"],
                                   raise_error_at_min_scale=raise_error_at_min_scale)
    elif "fp16" in config:
        DynamicLossScaler(config["fp16"])  # a disabled section is still checked for typos
    clipper = None
    if "gradient_clipping" in config:
        clipper = AdaptiveGradClipper(config["gradient_clipping"])
        if not clipper.enabled:
            clipper = None
    kwargs = _optimizer_kwargs(config) if "optimizer" in config else None
    precision = "fp16" if fp16 else "bf16" if bf16 else "fp32"
    return DeepSpeedTraining(precision, scaler, clipper, kwargs)
