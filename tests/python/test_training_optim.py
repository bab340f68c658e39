"""sciattn.optim.CPUAdamW (the trainer's C++ AdamW through the extension): bit for bit equal to a
scalar float32 reference of DeepSpeedCPUAdam's formula, equal to torch.optim.AdamW / Adam within
the tolerance rule, 16-bit parameters and copies, bad arguments, and state_dict round trips."""
import copy
import io
import math

import numpy as np
import pytest
import torch

import sciattn
from sciattn.optim import CPUAdamW
from conftest import assert_close_rule

f32 = np.float32


def reference_step(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay, adamw_mode,
                   bias_correction, grad_scale=1.0):
    """DeepSpeedCPUAdam's Step_1 on numpy float32 arrays, one IEEE float32 rounding per operation
    in DeepSpeed's order (the per-step constants formed in double where DeepSpeed does)."""
    p, m, v = p.copy(), m.copy(), v.copy()
    b1, b2, lr, eps, wd = f32(beta1), f32(beta2), f32(lr), f32(eps), f32(weight_decay)
    bc1, bc2 = f32(1.0), f32(1.0)
    if bias_correction:  # from the float32 betas, in double
        bc1 = f32(1.0 - float(b1) ** step)
        bc2 = f32(1.0 / math.sqrt(1.0 - float(b2) ** step))
    step_size = -lr / bc1
    for i in range(p.size):  # element by element, as the scalar loop of DeepSpeed's kernel
        grad = g[i] * f32(grad_scale)
        param = p[i]
        if not adamw_mode and wd > 0:
            grad = param * wd + grad
        mom = grad * (f32(1.0) - b1) + m[i] * b1
        var = (grad * grad) * (f32(1.0) - b2) + v[i] * b2
        update = mom / (np.sqrt(var) * bc2 + eps)
        if adamw_mode and wd > 0:
            param = param * (-lr * wd) + param
        p[i] = update * step_size + param
        m[i], v[i] = mom, var
    return p, m, v


@pytest.mark.parametrize("n", [1, 17, 300])
@pytest.mark.parametrize("adamw_mode,weight_decay", [(True, 0.0), (True, 0.1), (False, 0.1)])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_equals_the_scalar_reference_bit_for_bit(n, adamw_mode, weight_decay, bias_correction):
    hp = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay,
              adamw_mode=adamw_mode, bias_correction=bias_correction)
    p = torch.nn.Parameter(torch.randn(n))
    opt = CPUAdamW([p], **hp)
    ref_p = p.detach().numpy().copy()
    ref_m = np.zeros(n, f32)
    ref_v = np.zeros(n, f32)
    for step in range(1, 5):
        grad = torch.randn(n) * 10.0 ** (step - 2)
        p.grad = grad.clone()
        scale = 0.5 if step == 3 else 1.0
        opt.step(grad_scale=scale)
        ref_p, ref_m, ref_v = reference_step(
            ref_p, grad.numpy(), ref_m, ref_v, step, hp["lr"], *hp["betas"], hp["eps"],
            weight_decay, adamw_mode, bias_correction, grad_scale=scale)
        state = opt.state[p]
        assert state["step"] == step
        np.testing.assert_array_equal(p.detach().numpy(), ref_p, err_msg=f"params, step {step}")
        np.testing.assert_array_equal(state["exp_avg"].numpy(), ref_m)
        np.testing.assert_array_equal(state["exp_avg_sq"].numpy(), ref_v)


def _run_torch(cls, params64, grads, **kw):
    ps = [torch.nn.Parameter(p.clone()) for p in params64]
    opt = cls(ps, **kw)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.to(p.dtype)
        opt.step()
    return ps


@pytest.mark.parametrize("adamw_mode", [True, False])
def test_equals_torch_adamw_within_rounding(adamw_mode):
    """adamw_mode=True is torch.optim.AdamW, False is torch.optim.Adam with L2 decay: after 10
    steps the parameters match torch's float64 run to the tolerance rule, with torch's float32 run
    as the low-precision reference."""
    shapes = [(64, 33), (33,), (1,)]
    init = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(10)]
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.05)
    torch_cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    ref64 = _run_torch(torch_cls, init, grads, foreach=False, **kw)
    ref32 = _run_torch(torch_cls, [p.float() for p in init], grads, foreach=False, **kw)
    ours = [torch.nn.Parameter(p.float()) for p in init]
    opt = CPUAdamW(ours, adamw_mode=adamw_mode, **kw)
    for gs in grads:
        for p, g in zip(ours, gs):
            p.grad = g.float()
        opt.step()
    for i, (o, r32, r64) in enumerate(zip(ours, ref32, ref64)):
        assert_close_rule(f"param {i}", o, r32, r64, torch.float32)


def test_param_groups_skip_missing_grads_and_threads_do_not_matter():
    """One call per group splits the concatenated elements between the threads (here inside the
    first tensor); the bits equal those of each tensor stepped alone, for any thread count."""
    sizes = (40_001, 30_000, 7)
    init = [torch.randn(k) for k in sizes]
    grads = [[torch.randn(k) for k in sizes] for _ in range(3)]

    def run(threads, groups):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            ps = [torch.nn.Parameter(x.clone()) for x in init]
            opts = [CPUAdamW(g(ps)) for g in groups]
            for k in range(3):
                for i, p in enumerate(ps):
                    p.grad = None if (k, i) == (1, 1) else grads[k][i]
                for opt in opts:
                    opt.step()
            return ps, opts
        finally:
            torch.set_num_threads(old)

    together = [lambda ps: [{"params": ps[:2], "lr": 1e-2},
                            {"params": ps[2:], "lr": 1e-3, "adamw_mode": False,
                             "weight_decay": 0.1}]]
    alone = [lambda ps: [{"params": [ps[0]], "lr": 1e-2}],
             lambda ps: [{"params": [ps[1]], "lr": 1e-2}],
             lambda ps: [{"params": [ps[2]], "lr": 1e-3, "adamw_mode": False,
                          "weight_decay": 0.1}]]
    one, opts = run(1, together)
    for threads, groups in [(2, together), (2, alone), (1, alone)]:
        other, _ = run(threads, groups)
        for i, (x, y) in enumerate(zip(one, other)):
            assert torch.equal(x, y), f"param {i}, {threads} threads"
    assert opts[0].state[one[0]]["step"] == 3
    assert opts[0].state[one[1]]["step"] == 2  # no gradient at the second step


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_params_keep_an_fp32_master(dtype):
    """A 16-bit parameter is the fp32 master rounded after each step; the master equals the run of
    an fp32 parameter with the same gradients, bit for bit."""
    init = torch.randn(257).to(dtype).float()
    p16 = torch.nn.Parameter(init.to(dtype))
    p32 = torch.nn.Parameter(init.clone())
    o16 = CPUAdamW([p16], lr=1e-2, weight_decay=0.01)
    o32 = CPUAdamW([p32], lr=1e-2, weight_decay=0.01)
    for _ in range(4):
        g = torch.randn(257).to(dtype)
        p16.grad, p32.grad = g, g.float()
        o16.step()
        o32.step()
        master = o16.state[p16]["master_param"]
        assert master.dtype == torch.float32
        assert torch.equal(master, p32.detach())
        assert torch.equal(p16.detach(), p32.detach().to(dtype))
    assert o16.state[p16]["exp_avg"].dtype == torch.float32


def test_fp16_param_groups_receive_the_rounded_update():
    ps = [torch.nn.Parameter(torch.randn(40, 3)), torch.nn.Parameter(torch.randn(7))]
    copies = [torch.empty(120, dtype=torch.float16),  # a flat copy: only the count must match
              torch.empty(7, dtype=torch.bfloat16)]
    strided = torch.empty(14, dtype=torch.float16)[::2]  # a non-contiguous copy: copied after
    opt = CPUAdamW(ps, lr=1e-2)
    for k in range(2):
        for p in ps:
            p.grad = torch.randn_like(p)
        if k == 0:
            opt.step(fp16_param_groups=[copies])
        else:
            opt.step(fp16_param_groups=[copies[0], strided])  # a flat list: the only group
    assert torch.equal(copies[0], ps[0].detach().reshape(-1).half())
    assert torch.equal(strided, ps[1].detach().half())
    assert not torch.equal(copies[1], ps[1].detach().bfloat16())  # written at step 1 only


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp16_param_groups_on_the_gpu():
    p = torch.nn.Parameter(torch.randn(1000))
    gpu = torch.empty(1000, dtype=torch.bfloat16, device="cuda")
    opt = CPUAdamW([p], lr=1e-2)
    p.grad = torch.randn(1000)
    opt.step(fp16_param_groups=[[gpu]])
    torch.cuda.synchronize()
    assert torch.equal(gpu.cpu(), p.detach().bfloat16())


def _train(opt, params, grads):
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone().to(p.dtype)
        opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_continues_bit_for_bit(dtype):
    shapes = [(16, 8), (8,)]
    grads = [[torch.randn(s) for s in shapes] for _ in range(6)]
    params = [torch.nn.Parameter(torch.randn(s).to(dtype)) for s in shapes]
    opt = CPUAdamW([{"params": params[:1]}, {"params": params[1:], "lr": 5e-3}],
                   weight_decay=0.01)
    _train(opt, params, grads[:3])
    buffer = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params],
                "optimizer": copy.deepcopy(opt.state_dict())}, buffer)
    _train(opt, params, grads[3:])

    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = [torch.nn.Parameter(p.clone()) for p in saved["params"]]
    opt2 = CPUAdamW([{"params": resumed[:1]}, {"params": resumed[1:], "lr": 1.0}])
    opt2.load_state_dict(saved["optimizer"])
    assert opt2.param_groups[1]["lr"] == 5e-3 and opt2.param_groups[0]["weight_decay"] == 0.01
    for p in resumed:
        st = opt2.state[p]
        assert st["step"] == 3 and st["exp_avg"].dtype == torch.float32
        if dtype != torch.float32:
            assert st["master_param"].dtype == torch.float32
    _train(opt2, resumed, grads[3:])
    for a, b in zip(params, resumed):
        assert torch.equal(a, b)
        if dtype != torch.float32:
            assert torch.equal(opt.state[a]["master_param"], opt2.state[b]["master_param"])


def test_a_torch_adamw_state_dict_loads():
    """Resuming from torch.optim.AdamW: the same state keys (its tensor step becomes an int), and
    the group keys torch lacks take CPUAdamW's defaults."""
    init, grads = torch.randn(50), [torch.randn(50) for _ in range(4)]
    a = torch.nn.Parameter(init.clone())
    ta = torch.optim.AdamW([a], lr=1e-2, weight_decay=0.1, foreach=False)
    _train(ta, [a], [[g] for g in grads[:2]])
    b = torch.nn.Parameter(a.detach().clone())
    ours = CPUAdamW([b], adamw_mode=True)
    ours.load_state_dict(copy.deepcopy(ta.state_dict()))
    assert ours.state[b]["step"] == 2 and ours.param_groups[0]["bias_correction"] is True
    _train(ta, [a], [[g] for g in grads[2:]])
    _train(ours, [b], [[g] for g in grads[2:]])
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_isa_and_deepspeed_name():
    assert torch.ops.sciattn.cpu_adamw_isa() in ("avx512f", "avx2", "baseline")
    assert sciattn.optim.DeepSpeedCPUAdam is CPUAdamW


# ---- bad arguments ----

@pytest.mark.parametrize("kw,match", [
    (dict(lr=-1.0), "lr must be a finite number >= 0"),
    (dict(lr=float("nan")), "lr must be"),
    (dict(betas=(0.9,)), "betas must be a pair"),
    (dict(betas=(1.0, 0.999)), r"betas\[0\] must be in \[0, 1\)"),
    (dict(betas=(0.9, -0.1)), r"betas\[1\] must be in \[0, 1\)"),
    (dict(eps=0.0), "eps must be a finite number > 0"),
    (dict(weight_decay=-0.1), "weight_decay must be a finite number >= 0"),
])
def test_bad_hyperparameters_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        CPUAdamW([torch.nn.Parameter(torch.randn(3))], **kw)


def test_bad_arguments():
    p = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(NotImplementedError, match="amsgrad"):
        CPUAdamW([p], amsgrad=True)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] is on meta.*CPU"):
        CPUAdamW([torch.nn.Parameter(torch.empty(3, device="meta"))])
    with pytest.raises(TypeError, match="torch.float64"):
        CPUAdamW([torch.nn.Parameter(torch.randn(3, dtype=torch.float64))])
    opt = CPUAdamW([p])
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] is on meta"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.empty(2, device="meta"))]})
    opt = CPUAdamW([p])
    p.grad = torch.randn(3)
    opt.param_groups[0]["lr"] = -1e-3  # e.g. a broken schedule
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['lr'\] must be"):
        opt.step()
    assert "step" not in opt.state[p]  # nothing was applied
    opt.param_groups[0]["lr"] = 1e-3
    with pytest.raises(ValueError, match="grad_scale"):
        opt.step(grad_scale=float("inf"))
    with pytest.raises(ValueError, match="fp16_param_groups has 2 groups"):
        opt.step(fp16_param_groups=[[None], [None]])
    with pytest.raises(ValueError, match=r"fp16_param_groups\[0\]\[0\] has 4 elements"):
        opt.step(fp16_param_groups=[[torch.empty(4, dtype=torch.float16)]])
    half = torch.nn.Parameter(torch.randn(3).bfloat16())
    half.grad = torch.randn(3).bfloat16()
    opt = CPUAdamW([half], fp32_optimizer_states=False)
    with pytest.raises(NotImplementedError, match="fp32_optimizer_states=False"):
        opt.step()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_params_are_refused():
    with pytest.raises(ValueError, match="is on cuda:0; CPUAdamW updates CPU parameters"):
        CPUAdamW([torch.nn.Parameter(torch.randn(3, device="cuda"))])


def test_the_op_checks_its_lists():
    p, g, m, v = (torch.zeros(4) for _ in range(4))
    hp = (1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, 1.0)
    with pytest.raises(ValueError, match="same length"):
        torch.ops.sciattn.cpu_adamw_step_([p], [g], [m], [], [1], *hp, [])
    with pytest.raises(ValueError, match=r"grads\[0\] has 3 elements but params\[0\] has 4"):
        torch.ops.sciattn.cpu_adamw_step_([p], [torch.zeros(3)], [m], [v], [1], *hp, [])
    with pytest.raises(TypeError, match=r"exp_avg\[0\] has dtype"):
        torch.ops.sciattn.cpu_adamw_step_([p], [g], [m.double()], [v], [1], *hp, [])
    with pytest.raises(ValueError, match=r"steps\[0\] must be >= 1"):
        torch.ops.sciattn.cpu_adamw_step_([p], [g], [m], [v], [0], *hp, [])
    with pytest.raises(TypeError, match=r"param_copies\[0\] has dtype"):
        torch.ops.sciattn.cpu_adamw_step_([p], [g], [m], [v], [1], *hp, [torch.zeros(4)])
