"""AdaptiveGradClipper: global-norm gradient clipping with DeepSpeed's ``gradient_clipping`` config
value (a number, or the object {enabled, type: fixed | adaptive, threshold, history_window,
adjustment_factor}). The rule is the trainer's C++ (include/sciattn/train/grad_clip.h), called
through the extension (torch.ops.sciattn.grad_clip_step); docs/training.md writes it as a
formula."""
import collections
import math

import torch

from .._ops import ops
from ._config_keys import Section

_CLIP_KEYS = "enabled, type, threshold, history_window, adjustment_factor"

ClipStep = collections.namedtuple("ClipStep", "norm threshold coefficient next_threshold")
ClipStep.__doc__ = """What one clipping step did: the global norm g, the threshold tau it was
clipped to, the coefficient c = min(1, tau / (g + 1e-6)) the gradients were multiplied by, and the
threshold of the next step."""


def _parse(config):
    """(mode, threshold, history_window, adjustment_factor) from DeepSpeed's gradient_clipping
    value, with the trainer's defaults and rules."""
    if isinstance(config, bool):
        raise ValueError(f"gradient_clipping must be a number or an object; got {config!r}")
    if isinstance(config, (int, float)):
        if not math.isfinite(config) or config < 0:
            raise ValueError(f"gradient_clipping must be a finite number >= 0 (0 = off); "
                             f"got {config!r}")
        return ("fixed" if config > 0 else "none"), (float(config) if config > 0 else 1.0), \
            1000, 0.2
    if config == "auto":
        raise ValueError('gradient_clipping is "auto", which only a trainer can fill; give a '
                         "value")
    s = Section(config, "gradient_clipping")
    enabled = s.boolean("enabled", True)
    mode = s.string("type", "fixed", ("fixed", "adaptive"))
    threshold = s.number("threshold", 1.0)
    window = s.integer("history_window", 1000, minimum=1)
    factor = s.number("adjustment_factor", 0.2)
    s.finish(_CLIP_KEYS)
    return (mode if enabled else "none"), threshold, window, factor


def _grads(parameters):
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = []
    for i, p in enumerate(parameters):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"parameters must be tensors; item {i} is {type(p).__name__}")
        if p.grad is not None:
            if p.grad.layout != torch.strided:
                raise ValueError(f"parameter {i} has a {p.grad.layout} gradient; "
                                 "AdaptiveGradClipper takes dense gradients")
            grads.append(p.grad)
    return grads


def global_norm(grads):
    """The L2 norm of all the tensors together, accumulated in float32 (on the first tensor's
    device), as a 0-dim tensor."""
    if not grads:
        return torch.zeros(())
    device = grads[0].device
    norms = [torch.linalg.vector_norm(g.detach(), 2.0, dtype=torch.float32).to(device)
             for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


class AdaptiveGradClipper:
    """Clips the global L2 norm of the gradients to a threshold that is fixed or follows the
    recent norms (``sciattn train``'s rule, docs/training.md):

        c_t     = min(1, tau_t / (g_t + 1e-6))              gradients *= c_t
        H      <- (H + [g_t])[-history_window:]
        m       = median(H);   s = 1.4826 * median(|h - m| for h in H)
        tau_t+1 = min(max(m + 3 s, (1 - a) tau_t), (1 + a) tau_t),   tau_0 = threshold

    ``config`` is DeepSpeed's ``gradient_clipping`` value: a number (a fixed threshold; 0 = off)
    or the object ``{"enabled": True, "type": "fixed" | "adaptive", "threshold": 1.0,
    "history_window": 1000, "adjustment_factor": 0.2}`` (these are the defaults; as in the
    trainer, the object's type defaults to "fixed"). Keyword arguments with the same names
    override the object: ``AdaptiveGradClipper(type="adaptive", threshold=1.0)``.

    ``clip(parameters)`` is the drop-in for ``torch.nn.utils.clip_grad_norm_``: it returns the
    norm (before clipping) as a tensor. A non-finite norm (an overflowed step, which should be
    skipped) clips nothing and leaves the history alone. The threshold is computed on the host,
    so ``clip`` reads the norm back from the GPU (one synchronisation per step).
    """

    def __init__(self, config=None, **keys):
        if keys:
            if config is not None and not isinstance(config, dict):
                raise ValueError("keyword arguments override the gradient_clipping object; "
                                 f"config is {config!r}")
            config = {**(config or {}), **keys}
        self.mode, self.threshold_init, self.history_window, self.adjustment_factor = \
            _parse({} if config is None else config)
        # The C++ validates the values (ValueError naming the gradient_clipping key).
        self.tau = ops.grad_clip_init(*self._config_args())
        self.history = []
        self.last_step = None

    def _config_args(self):
        return (self.mode, float(self.threshold_init), int(self.history_window),
                float(self.adjustment_factor))

    @property
    def enabled(self):
        return self.mode != "none"

    @property
    def threshold(self):
        """The threshold the next step clips to (+inf when clipping is off)."""
        return self.tau

    def step(self, norm):
        """Applies the rule to the global norm of an applied step (a finite float >= 0) and
        returns a ClipStep; the caller multiplies the gradients by its coefficient."""
        norm = float(norm)
        coefficient, next_tau, history = ops.grad_clip_step(
            *self._config_args(), float(self.tau), self.history, norm)
        self.last_step = ClipStep(norm, self.tau, coefficient, next_tau)
        self.tau, self.history = next_tau, list(history)
        return self.last_step

    @torch.no_grad()
    def clip(self, parameters, norm=None):
        """Clips the gradients of ``parameters`` (an iterable of tensors, or one tensor) in place
        and returns their global norm before clipping, as a float32 tensor. ``norm``: the global
        norm when the caller has it already (a float or tensor)."""
        grads = _grads(parameters)
        total = global_norm(grads) if norm is None else torch.as_tensor(norm, dtype=torch.float32)
        value = float(total)
        if not self.enabled or not math.isfinite(value):
            self.last_step = None
            return total
        c = self.step(value).coefficient
        if c < 1.0:
            for g in grads:
                g.mul_(c)
        return total

    def state_dict(self):
        return {"type": self.mode, "threshold": self.tau, "history": list(self.history)}

    def load_state_dict(self, state):
        if state.get("type", self.mode) != self.mode:
            raise ValueError(f"AdaptiveGradClipper.load_state_dict: the state is of a "
                             f"{state['type']!r} clipper; this one is {self.mode!r}")
        history = [float(h) for h in state["history"]]
        if len(history) > self.history_window:
            raise ValueError(f"AdaptiveGradClipper.load_state_dict: the history holds "
                             f"{len(history)} norms, more than history_window "
                             f"({self.history_window})")
        self.tau = float(state["threshold"])
        self.history = history

    def __repr__(self):
        return (f"AdaptiveGradClipper(type={self.mode!r}, threshold={self.tau:g}, "
                f"history={len(self.history)}/{self.history_window})")
