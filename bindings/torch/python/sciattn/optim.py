"""Optimizers for CPU (offloaded) parameters: CPUAdamW, the trainer's C++ AdamW
(include/sciattn/train/adamw.h: DeepSpeedCPUAdam's arithmetic, vectorised for AVX-512 and AVX2,
threaded with OpenMP) behind DeepSpeedCPUAdam's constructor.

    opt = sciattn.optim.CPUAdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss.backward(); opt.step(); opt.zero_grad()

See docs/python.md ("Training utilities") for the bf16/fp16 parameters and the GPU copies."""
import math

import torch

from ._ops import ops

_HALF = (torch.float16, torch.bfloat16)


def _check_hyperparameters(lr, betas, eps, weight_decay, name=str):
    """The rules of the C++ validate_adamw; name(key) is how a message names the argument."""
    if isinstance(lr, torch.Tensor):
        raise TypeError(f"{name('lr')} must be a float; got a tensor (CPUAdamW reads it on the "
                        "host)")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
        raise ValueError(f"{name('lr')} must be a finite number >= 0; got {lr!r}")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"{name('betas')} must be a pair (beta1, beta2); got {betas!r}")
    for i, b in enumerate(betas):
        if not (isinstance(b, (int, float)) and 0.0 <= b < 1.0):
            raise ValueError(f"{name('betas')}[{i}] must be in [0, 1); got {b!r}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"{name('eps')} must be a finite number > 0; got {eps!r}")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay)
            and weight_decay >= 0):
        raise ValueError(f"{name('weight_decay')} must be a finite number >= 0; "
                         f"got {weight_decay!r}")


class CPUAdamW(torch.optim.Optimizer):
    """AdamW (or Adam with L2 decay) on CPU tensors with DeepSpeedCPUAdam's arguments and
    arithmetic (``deepspeed.ops.adam.DeepSpeedCPUAdam``), running the C++ step of
    ``sciattn train``::

        g = grad * grad_scale;  g += weight_decay * p              (adamw_mode=False)
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p -= lr * weight_decay * p                                  (adamw_mode=True)
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    Parameters must be CPU tensors (the optimizer of ZeRO-Offload: the master weights live in host
    memory). float32 parameters are updated in place. bfloat16 and float16 parameters get an fp32
    master copy in the optimizer state (``state['master_param']``), which is what the update
    reads and writes; the parameter receives the master rounded to its dtype after each step
    (DeepSpeed updates 16-bit parameters in place instead, so updates smaller than their rounding
    step are lost there). To keep fp32 masters on the CPU and 16-bit copies elsewhere (a GPU),
    pass the copies to :meth:`step` as ``fp16_param_groups`` (DeepSpeed's older argument).

    Optimizer states (``exp_avg``, ``exp_avg_sq``) are always float32; ``state['step']`` is an
    int, DeepSpeed's per-parameter count of applied steps.

    Args:
        model_params: parameters or parameter-group dicts.
        lr, betas, eps, weight_decay: as DeepSpeedCPUAdam (defaults 1e-3, (0.9, 0.999), 1e-8, 0).
        bias_correction: divide by 1 - beta^t (default True).
        amsgrad: must be False (DeepSpeed ignores it silently; here True raises
            NotImplementedError).
        adamw_mode: True (default): decoupled weight decay (AdamW); False: L2 decay (Adam).
            Stored in each parameter group, so groups may differ.
        fp32_optimizer_states: True (default). False asks DeepSpeed for 16-bit states for 16-bit
            parameters, which the C++ step does not have: such a parameter raises
            NotImplementedError at its first step (float32 parameters are unaffected).
    """

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if amsgrad:
            raise NotImplementedError(
                "sciattn.optim.CPUAdamW: amsgrad=True is not implemented (DeepSpeedCPUAdam does "
                "not implement it either and ignores the flag); use amsgrad=False")
        _check_hyperparameters(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bool(bias_correction), amsgrad=False,
                        adamw_mode=bool(adamw_mode))
        super().__init__(model_params, defaults)
        self.adam_w_mode = bool(adamw_mode)  # DeepSpeedCPUAdam's attribute
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                self._check_param(p, gi, pi)

    @staticmethod
    def _check_param(p, gi, pi):
        where = f"sciattn.optim.CPUAdamW: param_groups[{gi}]['params'][{pi}]"
        if p.device.type != "cpu":
            raise ValueError(
                f"{where} is on {p.device}; CPUAdamW updates CPU parameters (ZeRO-Offload's "
                "layout: fp32 master weights and optimizer states in host memory). Keep an fp32 "
                "copy of the parameters on the CPU and pass the GPU tensors to step() as "
                "fp16_param_groups, or use torch.optim.AdamW(fused=True) on the GPU")
        if p.dtype not in (torch.float32,) + _HALF:
            raise TypeError(f"{where} has dtype {p.dtype}; CPUAdamW updates float32, bfloat16 "
                            "and float16 parameters")

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        group = self.param_groups[gi]
        if group.get("amsgrad"):
            raise NotImplementedError(
                f"sciattn.optim.CPUAdamW: param_groups[{gi}] sets amsgrad=True, which is not "
                "implemented")
        for pi, p in enumerate(group["params"]):
            self._check_param(p, gi, pi)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("adamw_mode", getattr(self, "adam_w_mode", True))

    def load_state_dict(self, state_dict):
        """torch's load_state_dict casts floating-point state to each parameter's dtype; the
        states (and the fp32 master of a 16-bit parameter) stay float32 here."""
        super().load_state_dict(state_dict)
        # A state dict of DeepSpeedCPUAdam (adamw_mode is optimizer-wide there) or of
        # torch.optim.AdamW (no bias_correction) lacks some of the group keys.
        for group in self.param_groups:
            group.setdefault("adamw_mode", self.adam_w_mode)
            group.setdefault("bias_correction", True)
            group.setdefault("amsgrad", False)
        saved = (p for g in state_dict["param_groups"] for p in g["params"])
        current = (p for g in self.param_groups for p in g["params"])
        for key, p in zip(saved, current):
            loaded = state_dict["state"].get(key)
            if loaded is None:
                continue
            for name in ("exp_avg", "exp_avg_sq", "master_param"):
                if name in loaded:
                    self.state[p][name] = loaded[name].to(
                        device="cpu", dtype=torch.float32).contiguous()
            if "step" in loaded:
                self.state[p]["step"] = int(loaded["step"])

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None, *, grad_scale=1.0):
        """One AdamW step for every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (optional).
            fp16_param_groups: copies to refresh with the updated parameters, in the layout of
                ``param_groups`` (a list per group of one tensor, or None, per parameter; a
                single flat list when there is one group). A CPU float16/bfloat16 copy is written
                by the C++ step in the same pass; other copies (a GPU tensor, another dtype) get
                the update through a 16-bit staging tensor (pinned memory when CUDA is available)
                or ``copy_``.
            grad_scale: multiplies every gradient inside the step (for example 1 / loss_scale
                times a clipping coefficient), which saves a pass over the gradients.

        Returns the closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not (isinstance(grad_scale, (int, float)) and math.isfinite(grad_scale)):
            raise ValueError(f"sciattn.optim.CPUAdamW.step: grad_scale must be a finite float; "
                             f"got {grad_scale!r}")
        copies = self._copy_groups(fp16_param_groups)
        for gi, group in enumerate(self.param_groups):
            where = f"sciattn.optim.CPUAdamW: param_groups[{gi}]"
            _check_hyperparameters(group["lr"], group["betas"], group["eps"],
                                   group["weight_decay"], lambda key: f"{where}['{key}']")
            if group.get("amsgrad"):
                raise NotImplementedError(f"{where}['amsgrad'] is True, which is not implemented")
            # Two calls per group at most: the tensors whose update also writes a 16-bit copy,
            # and the others.
            plain = ([], [], [], [], [])
            fused = ([], [], [], [], [], [])
            after = []  # (destination, source) copies once the step has run
            stepped = []  # the states whose count the step advances
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                self._check_param(p, gi, pi)
                if p.grad.is_sparse:
                    raise ValueError(f"{where}['params'][{pi}] has a sparse gradient; CPUAdamW "
                                     "takes dense gradients")
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state, gi, pi)
                stepped.append(state)
                master = state.get("master_param", p)
                targets = []  # tensors that receive the updated master
                if not master.is_contiguous():  # a strided fp32 parameter: update a copy
                    targets.append(master)
                    master = master.contiguous()
                elif master is not p:
                    targets.append(p)  # a 16-bit parameter
                if copies is not None and copies[gi][pi] is not None:
                    targets.append(copies[gi][pi])
                copy_into = self._plan_copies(master, targets, after)
                grad = p.grad.to(dtype=torch.float32).contiguous()
                entry = (master, grad, state["exp_avg"], state["exp_avg_sq"], state["step"] + 1)
                if copy_into is None:
                    for lst, x in zip(plain, entry):
                        lst.append(x)
                else:
                    for lst, x in zip(fused, entry + (copy_into,)):
                        lst.append(x)
            hyper = (float(group["lr"]), float(group["betas"][0]), float(group["betas"][1]),
                     float(group["eps"]), float(group["weight_decay"]),
                     bool(group.get("adamw_mode", self.adam_w_mode)),
                     bool(group.get("bias_correction", True)),
                     float(grad_scale))
            if plain[0]:
                ops.cpu_adamw_step_(*plain, *hyper, [])
            if fused[0]:
                ops.cpu_adamw_step_(*fused[:5], *hyper, fused[5])
            for state in stepped:
                state["step"] += 1
            for dst, src in after:
                dst.copy_(src.reshape(dst.shape), non_blocking=src.is_pinned())
        return loss

    def _init_state(self, p, state, gi, pi):
        if p.dtype != torch.float32 and not self.fp32_optimizer_states:
            raise NotImplementedError(
                f"sciattn.optim.CPUAdamW: param_groups[{gi}]['params'][{pi}] is {p.dtype} and "
                "fp32_optimizer_states=False asks for 16-bit optimizer states, which the C++ "
                "AdamW does not have; use fp32_optimizer_states=True (the default)")
        state["step"] = 0
        state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32)
        state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32)
        if p.dtype != torch.float32:
            state["master_param"] = p.detach().to(torch.float32, copy=True).contiguous()

    @staticmethod
    def _plan_copies(master, targets, after):
        """Returns the 16-bit tensor the C++ step writes in the same pass (or None) and appends
        to `after` the (destination, source) copies that follow the step. The first target is
        written by the step when it is a contiguous CPU float16/bfloat16 tensor; a 16-bit target
        elsewhere (a GPU) gets a CPU staging tensor of its dtype (pinned memory when CUDA is
        available), written by the step and then copied; every other target copies the fp32
        master (one rounding, whatever its dtype)."""
        if not targets:
            return None
        first, rest = targets[0], targets[1:]
        copy_into = None
        if first.dtype in _HALF:
            if first.device.type == "cpu" and first.is_contiguous():
                copy_into = first
            else:
                pin = first.device.type == "cuda" and torch.cuda.is_available()
                copy_into = torch.empty(first.shape, dtype=first.dtype, pin_memory=pin)
                after.append((first, copy_into))
        else:
            rest = targets
        after.extend((t, master) for t in rest)
        return copy_into

    def _copy_groups(self, fp16_param_groups):
        """fp16_param_groups in the layout of param_groups, checked, or None."""
        if fp16_param_groups is None:
            return None
        groups = list(fp16_param_groups)
        if groups and isinstance(groups[0], torch.Tensor):
            groups = [groups]  # one flat list: the only group
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"sciattn.optim.CPUAdamW.step: fp16_param_groups has {len(groups)} groups; the "
                f"optimizer has {len(self.param_groups)} parameter groups")
        out = []
        for gi, (copies, group) in enumerate(zip(groups, self.param_groups)):
            copies = list(copies)
            if len(copies) != len(group["params"]):
                raise ValueError(
                    f"sciattn.optim.CPUAdamW.step: fp16_param_groups[{gi}] has {len(copies)} "
                    f"tensors; param_groups[{gi}] has {len(group['params'])} parameters")
            for pi, (c, p) in enumerate(zip(copies, group["params"])):
                if c is None:
                    continue
                if not isinstance(c, torch.Tensor):
                    raise TypeError(f"sciattn.optim.CPUAdamW.step: fp16_param_groups[{gi}][{pi}] "
                                    f"must be a tensor or None; got {type(c).__name__}")
                if c.numel() != p.numel():
                    raise ValueError(
                        f"sciattn.optim.CPUAdamW.step: fp16_param_groups[{gi}][{pi}] has "
                        f"{c.numel()} elements; its parameter has {p.numel()}")
                if not c.is_floating_point():
                    raise TypeError(f"sciattn.optim.CPUAdamW.step: fp16_param_groups[{gi}][{pi}] "
                                    f"has dtype {c.dtype}; expected a floating-point dtype")
            out.append(copies)
        return out


# The name DeepSpeed code imports (deepspeed.ops.adam.DeepSpeedCPUAdam).
DeepSpeedCPUAdam = CPUAdamW

__all__ = ["CPUAdamW", "DeepSpeedCPUAdam"]
