"""sciattn.training's DynamicLossScaler and AdaptiveGradClipper (the trainer's C++ rules through
the extension) against plain Python statements of the same rules, step by step: DeepSpeed's
DynamicLossScaler update written out below, and the adaptive clipping rule of
tests/python/clip_reference.py (the specification the C++ trainer is tested against too). Also
the gradient passes, the config objects' errors, state round trips and from_deepspeed_config."""
import json
import math
import random

import pytest
import torch

from clip_reference import AdaptiveClipper
from sciattn.optim import CPUAdamW
from sciattn.training import (AdaptiveGradClipper, DynamicLossScaler, from_deepspeed_config,
                              global_norm)


class ReferenceScaler:
    """DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py) as
    docs/training.md states it, with the skipped-step count."""

    def __init__(self, power=16, window=1000, hysteresis=2, consecutive=False, min_scale=1.0,
                 static=None, raise_at_min=True):
        self.static = static
        self.raise_at_min = raise_at_min
        self.scale = static if static else 2.0 ** power
        self.window, self.hysteresis, self.consecutive = window, hysteresis, consecutive
        self.min_scale = min_scale
        self.cur_hysteresis = hysteresis
        self.cur_iter, self.last_overflow_iter, self.skipped = 0, -1, 0

    def update(self, overflow):
        self.skipped += bool(overflow)
        if self.static:
            return
        if overflow:
            if self.hysteresis == 1 or self.cur_hysteresis == 1:
                if self.scale == self.min_scale and self.raise_at_min:
                    raise RuntimeError("at the minimum")
                self.scale = max(self.scale / 2.0, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive:
                self.cur_hysteresis = self.hysteresis
            if (self.cur_iter - self.last_overflow_iter) % self.window == 0:
                if not self.consecutive:
                    self.cur_hysteresis = self.hysteresis
                self.scale *= 2.0
        self.cur_iter += 1


SCALER_CASES = [
    dict(),
    dict(initial_scale_power=4, loss_scale_window=3, hysteresis=1),
    dict(initial_scale_power=8, loss_scale_window=5, hysteresis=3, consecutive_hysteresis=True),
    dict(initial_scale_power=3, loss_scale_window=2, hysteresis=2, min_loss_scale=0.25),
    dict(loss_scale=128.0),
]


@pytest.mark.parametrize("config", SCALER_CASES)
def test_loss_scaler_equals_deepspeeds_rule_step_by_step(config):
    rng = random.Random(5)
    scaler = DynamicLossScaler({"enabled": True, **config}, raise_error_at_min_scale=False)
    ref = ReferenceScaler(power=config.get("initial_scale_power", 16),
                          window=config.get("loss_scale_window", 1000),
                          hysteresis=config.get("hysteresis", 2),
                          consecutive=config.get("consecutive_hysteresis", False),
                          min_scale=config.get("min_loss_scale", 1.0),
                          static=config.get("loss_scale"), raise_at_min=False)
    # Runs of clean steps and bursts of overflows, long enough to reach the minimum.
    pattern = [rng.random() < 0.3 for _ in range(200)] + [True] * 30 + [False] * 20
    for k, overflow in enumerate(pattern):
        ref.update(overflow)
        scaler.update(overflow)
        assert (scaler.loss_scale, scaler.cur_hysteresis, scaler.skipped_steps) == \
            (ref.scale, ref.cur_hysteresis, ref.skipped), f"step {k} of {config}"


def test_loss_scaler_raises_at_the_minimum_like_deepspeed():
    scaler = DynamicLossScaler({"initial_scale_power": 1, "hysteresis": 1, "min_loss_scale": 1})
    scaler.update(True)  # 2 -> 1
    assert scaler.loss_scale == 1.0
    with pytest.raises(RuntimeError, match="fp16.min_loss_scale"):
        scaler.update(True)


def test_a_disabled_scaler_keeps_scale_one_and_still_counts_overflows():
    scaler = DynamicLossScaler({"enabled": False, "initial_scale_power": 8})
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.tensor([1.0, 2.0, float("inf"), 3.0])
    loss = torch.tensor(2.5)
    assert scaler.scale(loss) == loss and scaler.loss_scale == 1.0
    overflow = scaler.unscale_and_check([p])
    assert overflow
    scaler.update(overflow)
    assert scaler.skipped_steps == 1 and scaler.loss_scale == 1.0 and not scaler.dynamic


def test_loss_scaler_state_round_trip():
    a = DynamicLossScaler({"initial_scale_power": 5, "loss_scale_window": 4})
    for o in [True, False, True, True, False, False]:
        a.update(o)
    b = DynamicLossScaler({"initial_scale_power": 5, "loss_scale_window": 4})
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for o in [False] * 9 + [True, False]:
        a.update(o)
        b.update(o)
        assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="static"):
        DynamicLossScaler({"loss_scale": 8}).load_state_dict(a.state_dict())


def test_unscale_and_check_and_check_overflow():
    scaler = DynamicLossScaler({"initial_scale_power": 4})
    ps = [torch.nn.Parameter(torch.randn(10)), torch.nn.Parameter(torch.randn(3, 3)),
          torch.nn.Parameter(torch.randn(5).bfloat16()), torch.nn.Parameter(torch.randn(2))]
    grads = [torch.randn_like(p) for p in ps]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    ps[3].grad = None  # no gradient: ignored
    assert scaler.check_overflow(ps) is False
    assert all(torch.equal(p.grad, g) for p, g in zip(ps[:3], grads))
    opt = CPUAdamW(ps)
    assert scaler.unscale_and_check(opt) is False
    for p, g in zip(ps[:3], grads):
        assert torch.equal(p.grad, g / 16)  # a power of two: exact
    for bad in (float("inf"), float("nan")):
        ps[2].grad[1] = bad
        assert scaler.unscale_and_check(ps) is True
        assert scaler.check_overflow(iter(ps)) is True
        ps[2].grad[1] = 0.0
    with pytest.raises(TypeError, match="item 1"):
        scaler.check_overflow([ps[0], 3])


def test_a_training_loop_skips_overflowed_steps():
    """Scaled loss, unscale and check, clip, CPUAdamW, update: injected overflows skip the step
    (parameters unchanged) and are counted, and the scale follows the rule."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    scaler = DynamicLossScaler({"initial_scale_power": 10, "loss_scale_window": 3,
                                "hysteresis": 1})
    clipper = AdaptiveGradClipper(type="adaptive", threshold=1.0, history_window=10)
    opt = CPUAdamW(model.parameters(), lr=1e-2)
    scales = []
    for step in range(8):
        x = torch.randn(4, 8)
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        if step in (2, 5):
            model.weight.grad[0, 0] = float("inf")
        before = model.weight.detach().clone()
        overflow = scaler.unscale_and_check(opt)
        if not overflow:
            clipper.clip(model.parameters())
            opt.step()
            assert not torch.equal(before, model.weight)
        else:
            assert torch.equal(before, model.weight)
        scales.append(scaler.loss_scale)
        scaler.update(overflow)
        opt.zero_grad()
    assert scaler.skipped_steps == 2
    assert len(clipper.history) == 6
    assert scales == [1024.0, 1024.0, 1024.0, 512.0, 512.0, 512.0, 256.0, 256.0]


# ---- gradient clipping ----

NORMS = ([1.0 + 0.1 * (k % 7) for k in range(30)] + [1.0 + 0.05 * k for k in range(40)] +
         [50.0, 1.2, 1.3, 300.0, 1.1] + [0.003 * k for k in range(20)] + [2.0] * 12)


@pytest.mark.parametrize("threshold,window,factor",
                         [(1.0, 1000, 0.2), (0.5, 7, 0.5), (3.0, 2, 1.0), (1.0, 1, 0.05)])
def test_adaptive_clipper_equals_the_python_rule_exactly(threshold, window, factor):
    clipper = AdaptiveGradClipper({"type": "adaptive", "threshold": threshold,
                                   "history_window": window, "adjustment_factor": factor})
    ref = AdaptiveClipper(threshold, window, factor)
    for k, norm in enumerate(NORMS):
        got = clipper.step(norm)._asdict()
        want = ref.step(norm)
        assert got == want, f"step {k}: {got} != {want}"
        assert clipper.history == ref.history


def test_clip_is_clip_grad_norm_with_a_moving_threshold():
    ps = [torch.nn.Parameter(torch.randn(20)), torch.nn.Parameter(torch.randn(4, 5))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for p, t in zip(ps, twins):
        p.grad = torch.randn_like(p) * 3
        t.grad = p.grad.clone()
    fixed = AdaptiveGradClipper(0.5)  # DeepSpeed's number form: a fixed threshold
    norm = fixed.clip(ps)
    want = torch.nn.utils.clip_grad_norm_(twins, 0.5)
    assert torch.allclose(norm, want, rtol=1e-6)
    for p, t in zip(ps, twins):
        assert torch.allclose(p.grad, t.grad, rtol=1e-6, atol=0)
    assert math.isclose(float(global_norm([p.grad for p in ps])), 0.5, rel_tol=1e-5)

    adaptive = AdaptiveGradClipper(type="adaptive", threshold=100.0, adjustment_factor=0.5)
    before = [p.grad.clone() for p in ps]
    n = adaptive.clip(ps)  # below the threshold: unchanged, but the threshold moves down
    assert all(torch.equal(p.grad, b) for p, b in zip(ps, before))
    assert adaptive.threshold == 50.0 and adaptive.history == [float(n)]
    ps[0].grad[0] = float("nan")  # an overflowed step: nothing clipped, nothing recorded
    assert not math.isfinite(float(adaptive.clip(ps)))
    assert adaptive.history == [float(n)] and adaptive.last_step is None


def test_clipper_config_and_state():
    assert not AdaptiveGradClipper(0).enabled
    assert not AdaptiveGradClipper({"enabled": False, "type": "adaptive"}).enabled
    assert AdaptiveGradClipper({}).mode == "fixed"  # DeepSpeed's object: type defaults to fixed
    a = AdaptiveGradClipper({"type": "adaptive", "history_window": 5})
    for n in [1.0, 2.0, 0.5, 3.0]:
        a.step(n)
    b = AdaptiveGradClipper({"type": "adaptive", "history_window": 5})
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for n in [4.0, 0.1, 1.0]:
        assert a.step(n) == b.step(n)
    with pytest.raises(ValueError, match="'fixed' clipper"):
        b.load_state_dict(AdaptiveGradClipper(1.0).state_dict())
    with pytest.raises(ValueError, match="more than history_window"):
        b.load_state_dict({"type": "adaptive", "threshold": 1.0, "history": [1.0] * 6})


@pytest.mark.parametrize("config,match", [
    ({"type": "adaptive", "history_window": 0}, "gradient_clipping.history_window must be >= 1"),
    ({"type": "adaptive", "adjustment_factor": 2.0}, "gradient_clipping.adjustment_factor"),
    ({"type": "adaptive", "threshold": 0.0}, "threshold must be a finite number > 0"),
    ({"type": "sometimes"}, r"gradient_clipping.type must be one of \['fixed', 'adaptive'\]"),
    ({"tpye": "adaptive"}, "gradient_clipping.tpye is not a key"),
    ({"threshold": "auto"}, 'gradient_clipping.threshold is "auto"'),
    ({"enabled": 1}, "gradient_clipping.enabled must be true or false"),
    (-1.0, "gradient_clipping must be a finite number >= 0"),
    ("auto", 'gradient_clipping is "auto"'),
])
def test_clipper_config_errors_name_the_key(config, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveGradClipper(config)


@pytest.mark.parametrize("config,match", [
    ({"hysteresis": 0}, "fp16.hysteresis must be in"),
    ({"loss_scale": -1}, "fp16.loss_scale must be 0"),
    ({"initial_scale_power": 200}, "fp16.initial_scale_power must be in"),
    ({"loss_scale_window": 0}, "fp16.loss_scale_window must be >= 1"),
    ({"min_loss_scale": 0}, "fp16.min_loss_scale must be a finite number > 0"),
    ({"type": "enhanced"}, "fp16.type must be one of"),
    ({"hysterisis": 2}, "fp16.hysterisis is not a key"),
    ({"loss_scale_window": "auto"}, 'fp16.loss_scale_window is "auto"'),
])
def test_scaler_config_errors_name_the_key(config, match):
    with pytest.raises(ValueError, match=match):
        DynamicLossScaler(config)


def test_from_deepspeed_config(tmp_path):
    config = {
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 6e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.01}},
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1,
                 "type": "ds_enhanced"},
        "bf16": {"enabled": False},
        "gradient_clipping": {"enabled": True, "type": "adaptive", "threshold": 1.0,
                              "history_window": 1000, "adjustment_factor": 0.2},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "steps_per_print": 10,
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    for source in (config, json.dumps(config), str(path), path):
        t = from_deepspeed_config(source)
        assert t.precision == "fp16"
        assert t.loss_scaler.loss_scale == 65536.0 and t.loss_scaler.ds_enhanced
        assert t.loss_scaler.hysteresis == 2 and t.loss_scaler.dynamic
        assert t.grad_clipper.mode == "adaptive" and t.grad_clipper.history_window == 1000
        assert t.optimizer_kwargs == dict(lr=6e-5, eps=1e-8, weight_decay=0.01, betas=(0.9, 0.95),
                                          bias_correction=True, adamw_mode=True)
    opt = t.optimizer([torch.nn.Parameter(torch.randn(2))])
    assert isinstance(opt, CPUAdamW) and opt.param_groups[0]["betas"] == (0.9, 0.95)

    bf16 = from_deepspeed_config({"bf16": {"enabled": True}, "gradient_clipping": 1.0,
                                  "optimizer": {"type": "Adam",
                                                "params": {"adam_w_mode": False}}})
    assert bf16.precision == "bf16" and bf16.loss_scaler is None
    assert bf16.grad_clipper.mode == "fixed" and bf16.grad_clipper.threshold == 1.0
    assert bf16.optimizer_kwargs["adamw_mode"] is False
    plain = from_deepspeed_config({"gradient_clipping": 0})
    assert (plain.precision, plain.loss_scaler, plain.grad_clipper, plain.optimizer_kwargs) == \
        ("fp32", None, None, None)


@pytest.mark.parametrize("config,match", [
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "both enabled"),
    ({"fp16": {"enabled": False, "hysterisis": 1}}, "fp16.hysterisis is not a key"),
    ({"optimizer": {"type": "Lamb"}}, "optimizer.type 'Lamb' is not supported"),
    ({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": False}}}, "contradicts"),
    ({"optimizer": {"params": {"amsgrad": True}}}, "amsgrad is not supported"),
    ({"optimizer": {"params": {"lr": "auto"}}}, 'optimizer.params.lr is "auto"'),
    ({"optimizer": {"params": {"betas": [0.9]}}}, "betas must be a list of two numbers"),
    ({"optimizer": {"params": {"momentum": 0.9}}}, "optimizer.params.momentum is not a key"),
    ({"bf16": {"enabled": True}, "bfloat16": {"enabled": True}}, "same section"),
])
def test_from_deepspeed_config_errors(config, match):
    with pytest.raises(ValueError, match=match):
        from_deepspeed_config(config)
