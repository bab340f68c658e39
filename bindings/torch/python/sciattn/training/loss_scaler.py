"""DynamicLossScaler: fp16 loss scaling with DeepSpeed's fp16 config section and update rule. The
rule itself is the trainer's C++ (include/sciattn/train/loss_scaler.h), called through the
extension (torch.ops.sciattn.loss_scaler_update), so `sciattn train` and this class move the scale
identically."""
import torch

from .._ops import ops
from ._config_keys import Section

_FP16_KEYS = ("enabled, loss_scale, initial_scale_power, loss_scale_window, hysteresis, "
              "consecutive_hysteresis, min_loss_scale, type")
# Keys of DeepSpeed's fp16 section that tune DeepSpeed's own fp16 optimizer or casting: accepted
# and ignored, as the trainer does (it warns).
_FP16_IGNORED = ("auto_cast", "fp16_master_weights_and_grads", "fp16_optimizer_states")


def _gradients(target):
    """The gradient tensors of an optimizer's parameters, or of an iterable of parameters."""
    if isinstance(target, torch.optim.Optimizer):
        params = [p for g in target.param_groups for p in g["params"]]
    elif isinstance(target, torch.Tensor):
        params = [target]
    else:
        params = list(target)
    grads = []
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"the parameters must be tensors; item {i} is {type(p).__name__}")
        if p.grad is not None:
            grads.append(p.grad)
    return grads


def _check_and_unscale(grads, inv_scale):
    """True when any gradient holds an Inf or a NaN; every gradient is multiplied by inv_scale
    (1.0: a check only). One pass per tensor with torch's AMP kernel (the one GradScaler uses),
    grouped by device, and one flag read back per device."""
    by_device = {}
    for i, g in enumerate(grads):
        if g.layout != torch.strided:
            raise ValueError(f"gradient {i} has layout {g.layout}; DynamicLossScaler takes dense "
                             "gradients")
        by_device.setdefault(g.device, []).append(g)
    flags = []
    for device, tensors in by_device.items():
        flag = torch.zeros(1, dtype=torch.float32, device=device)
        inv = torch.full((1,), inv_scale, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, flag, inv)
        flags.append(flag)
    return any(bool(f.item()) for f in flags)


class DynamicLossScaler:
    """Loss scaling with DeepSpeed's ``fp16`` config section and its DynamicLossScaler rule.

    ``config`` is the ``fp16`` dict of a DeepSpeed config (keyword arguments with the same names
    override it): ``loss_scale`` 0 = dynamic (the default) or a static scale > 0,
    ``initial_scale_power`` (16: the scale starts at 2^16), ``loss_scale_window`` (1000),
    ``hysteresis`` (2), ``consecutive_hysteresis`` (False), ``min_loss_scale`` (1), ``type``
    ("standard" or "ds_enhanced"; the same on one process) and ``enabled`` (True; False keeps the
    scale at 1 and still detects and counts overflowed steps, which is what bf16 and fp32 training
    want). Unknown keys and "auto" values are ValueErrors naming the key.

    A step::

        scaler.scale(loss).backward()
        overflow = scaler.unscale_and_check(optimizer)   # grads /= scale; Inf or NaN anywhere?
        if not overflow:
            clipper.clip(model.parameters())             # optional
            optimizer.step()
        scaler.update(overflow)                          # moves the scale, counts skipped steps
        optimizer.zero_grad()

    The update rule (one call per step with its overflow flag) is DeepSpeed's: an overflow halves
    the scale (never below min_loss_scale) once the hysteresis is used up, otherwise uses one unit
    of it; loss_scale_window steps after the last overflow the scale doubles and the hysteresis is
    restored. An overflow with the scale at min_loss_scale and no hysteresis left raises
    RuntimeError (DeepSpeed stops the run there too) unless raise_error_at_min_scale=False.
    """

    def __init__(self, config=None, *, raise_error_at_min_scale=True, **keys):
        merged = dict(config or {})
        merged.update(keys)
        s = Section(merged, "fp16")
        self.enabled = s.boolean("enabled", True)
        loss_scale = s.number("loss_scale", 0.0)
        if loss_scale < 0:
            raise ValueError(f"fp16.loss_scale must be 0 (dynamic) or > 0 (static); "
                             f"got {loss_scale}")
        self.dynamic = self.enabled and loss_scale == 0.0
        self.static_scale = loss_scale if loss_scale > 0 and self.enabled else 1.0
        self.initial_scale_power = s.integer("initial_scale_power", 16)
        self.loss_scale_window = s.integer("loss_scale_window", 1000)
        self.hysteresis = s.integer("hysteresis", 2)
        self.consecutive_hysteresis = s.boolean("consecutive_hysteresis", False)
        self.min_loss_scale = s.number("min_loss_scale", 1.0)
        self.type = s.string("type", "standard", ("standard", "ds_enhanced"))
        s.finish(_FP16_KEYS, _FP16_IGNORED)
        self.raise_error_at_min_scale = bool(raise_error_at_min_scale)
        # The C++ validates the values (ValueError naming the fp16 key) and gives the state.
        state = ops.loss_scaler_init(*self._config_args())
        self._set(state)
        self.skipped_steps = 0

    def _config_args(self):
        return (self.dynamic, float(self.static_scale), int(self.initial_scale_power),
                int(self.loss_scale_window), int(self.hysteresis),
                bool(self.consecutive_hysteresis), float(self.min_loss_scale))

    def _set(self, state):
        self.cur_scale, self.cur_iter, self.last_overflow_iter, self.cur_hysteresis = state

    @property
    def loss_scale(self):
        """The current scale (a float; DeepSpeed's ``loss_scale`` / ``cur_scale``)."""
        return self.cur_scale

    @property
    def ds_enhanced(self):
        """fp16.type == "ds_enhanced": scaling per rank before the reduction (the same as
        "standard" in one process)."""
        return self.type == "ds_enhanced"

    def scale(self, loss):
        """loss * the current scale."""
        return loss * self.cur_scale

    def unscale_and_check(self, target):
        """Divides the gradients of ``target`` (an optimizer, or an iterable of parameters) by the
        scale and returns True when any of them holds an Inf or a NaN (the step must then be
        skipped: call update(True) and zero the gradients). Reads one flag back from each device,
        so it synchronises with the GPU."""
        grads = _gradients(target)
        return _check_and_unscale(grads, 1.0 / self.cur_scale)

    def check_overflow(self, target):
        """True when a gradient of ``target`` holds an Inf or a NaN; the gradients are left
        scaled (for a step that folds 1 / loss_scale into the optimizer, e.g.
        ``CPUAdamW.step(grad_scale=...)``)."""
        return _check_and_unscale(_gradients(target), 1.0)

    def update(self, overflow):
        """Applies the update rule for one step (``overflow``: that step's gradients held an Inf
        or a NaN) and counts skipped steps."""
        state = ops.loss_scaler_update(*self._config_args(), self.raise_error_at_min_scale,
                                       float(self.cur_scale), int(self.cur_iter),
                                       int(self.last_overflow_iter), int(self.cur_hysteresis),
                                       bool(overflow))
        self._set(state)
        if overflow:
            self.skipped_steps += 1

    def state_dict(self):
        return {"cur_scale": self.cur_scale, "cur_iter": self.cur_iter,
                "last_overflow_iter": self.last_overflow_iter,
                "cur_hysteresis": self.cur_hysteresis, "skipped_steps": self.skipped_steps,
                "dynamic": self.dynamic}

    def load_state_dict(self, state):
        if bool(state.get("dynamic", self.dynamic)) != self.dynamic:
            raise ValueError("DynamicLossScaler.load_state_dict: the state is of a "
                             f"{'dynamic' if state['dynamic'] else 'static'} scaler; this one is "
                             f"{'dynamic' if self.dynamic else 'static'}")
        self._set((float(state["cur_scale"]), int(state["cur_iter"]),
                   int(state["last_overflow_iter"]), int(state["cur_hysteresis"])))
        self.skipped_steps = int(state.get("skipped_steps", 0))

    def __repr__(self):
        kind = "dynamic" if self.dynamic else "static"
        return (f"DynamicLossScaler({kind}, scale={self.cur_scale:g}, "
                f"skipped_steps={self.skipped_steps})")
