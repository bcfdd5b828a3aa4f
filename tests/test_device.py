"""Device placement and mixed precision, without a GPU.

A tensor left on the CPU is invisible on a CPU-only machine: every path here runs with the model on a second device,
`meta` (shapes and dtypes, no data), where mixing in a CPU tensor fails exactly as it would next to CUDA tensors.
Where a path brings results back to the host (connection.to_host), a zero host tensor of the same shape stands in,
so everything computed on the device still runs there."""

import math

import pytest
import torch

from lab import connection
from model import OPERATORS, GPT, CorridorProjection, GPTConfig, OperatorSum

META = torch.device('meta')


def tiny(operator, **keys):
    if OPERATORS[operator].learnable:
        keys = dict(gamma_init=-0.3, init_spread=0.2) | keys
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=32, operator=operator, **keys))


def assert_on(device, *tensors):
    for t in tensors:
        assert t.device.type == device.type, f"a tensor on {t.device}, expected {device}"


@pytest.fixture
def fake_host(monkeypatch):
    """Results of the walk come back as zeros of their shape (meta tensors hold no data to copy)."""
    def to_host(t):
        assert_on(META, t)  # what the walk computed, it computed on the model's device
        return torch.zeros(t.shape, dtype=t.dtype)
    monkeypatch.setattr(connection, 'to_host', to_host)


@pytest.mark.parametrize('operator', list(OPERATORS))
def test_every_forms_coefficients_follow_the_model_to_its_device_and_dtype(operator):
    model = tiny(operator).to(META, torch.float64)
    for block in model.transformer.h:
        for c in block.attn.coefficients():
            assert c.device == META and c.dtype == torch.float64 and c.shape == (2,)


@pytest.mark.parametrize('operator', list(OPERATORS))
def test_fast_path_math_path_and_sampling_run_on_the_models_device(operator):
    model = tiny(operator).to(META)
    idx = torch.randint(0, 32, (2, 8), device=META)
    logits, loss = model(idx, idx)                       # the fast path, forward and backward
    loss.backward()
    assert_on(META, logits, loss, *(p.grad for p in model.parameters() if p.grad is not None))
    logits, probs = model.forward_with_probs(idx)        # the math path: (c_I, c_P) beside P·V
    assert_on(META, logits, *probs)
    for use_cache in (True, False):                      # sampling, with and without the KV cache
        assert_on(META, model.generate(idx, 3, top_k=5, use_cache=use_cache))


@pytest.mark.parametrize('operator', ['attention', 'corridor'])
def test_walk_geometry_is_computed_on_the_models_device(operator, fake_host):
    from train import walk_geometry
    model = tiny(operator).to(META)
    geometry = walk_geometry(model, torch.randint(0, 32, (3, 8), device=META))
    assert set(geometry) == ({'attention'} if operator == 'attention' else {'attention', 'operator'})
    gram = connection.connection_diagnostics(model, torch.randint(0, 32, (2, 8), device=META), gram_edges=4)
    assert len(gram['gram_edge_diag_mean']) == 2


def test_the_walk_measures_with_tf32_off_and_restores_the_setting():
    seen = []
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as train.py sets them

        class Spy(connection.GPTWalk):
            def attention_probs(self, idx):
                seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
                return super().attention_probs(idx)
        connection.connection_diagnostics(Spy(tiny('corridor')), torch.randint(0, 32, (2, 8)))
        assert seen == [(False, False)]
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@pytest.mark.parametrize('operator', ['attention', 'corridor'])
def test_a_pretrained_models_operator_runs_on_its_device(operator):
    """PretrainedLM moved to the device: every layer's (c_I, c_P) there, and the operator transformers calls after
    its own attention (hf.apply_operator) computes there, forward and backward. (transformers' own mask code
    reads tensor values, which meta tensors don't have, so the model's whole forward is not run here.)"""
    pytest.importorskip('transformers')
    from lab import hf
    from test_hf import tiny_causal_lm, with_operator
    keys = dict(gamma_init=-0.2) if operator == 'corridor' else {}
    model = with_operator(tiny_causal_lm('llama'), operator=operator, **keys).float().to(META)
    B, H, n_kv, T, d_h = 2, 4, 2, 6, 8  # the tiny Llama's 4 query heads on 2 KV heads
    for attn in hf.attention_modules(model.lm):
        assert_on(META, *attn.coefficients())
        query = torch.randn(B, H, T, d_h, device=META)
        value = torch.randn(B, n_kv, T, d_h, device=META, requires_grad=True)
        pv = torch.randn(B, T, H, d_h, device=META, requires_grad=True)
        out = hf.apply_operator(attn, pv, query, value)
        out.sum().backward()
        assert_on(META, out, value.grad, pv.grad)
    assert_on(META, *(p.grad for p in model.operator_parameters()))


def test_operator_only_training_state_restores_onto_the_device():
    """train_only='operator': the checkpoint's scalars and Adam moments land on the model's device, and a step runs."""
    pytest.importorskip('transformers')
    from types import SimpleNamespace
    from test_hf import tiny_causal_lm, with_operator
    from train import freeze_all_but_the_operator, saved_weights

    def operator_only():
        model = with_operator(tiny_causal_lm('llama'), operator='corridor', gamma_init=-0.2).float()
        freeze_all_but_the_operator(model)
        return model

    def step(model, optimizer):
        for p in model.operator_parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
    model = operator_only()
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    step(model, optimizer)
    state, moments = saved_weights(model, SimpleNamespace(train_only='operator')), optimizer.state_dict()
    assert state and all('.coefficients.' in key for key in state)

    fresh = operator_only()
    fresh.load_state_dict(state, strict=False)
    fresh.to(META)
    optimizer = fresh.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'meta')
    optimizer.load_state_dict(moments)
    step(fresh, optimizer)
    assert_on(META, *fresh.operator_parameters(),
              *(v for s in optimizer.state.values() for k, v in s.items() if k != 'step'))


# ---------------------------------------------------------------------------------------------- mixed precision

def record_ops(fn):
    """(op name, output dtype, output shape) of every op fn runs, forward and backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor):
                    self.ops.append((str(func), t.dtype, tuple(t.shape)))
            return out
    with Record() as r:
        fn()
    return r.ops


@pytest.mark.parametrize('epilogue', ['projection', 'sum'])
def test_the_bf16_epilogue_writes_no_float32_activations_and_sums_dL_dc_in_float32(epilogue):
    """Under bf16 the operator's elementwise work stays in bf16 (no float32 [B, T, C] temporary, forward or
    backward), while dL/dc is still a float32 sum, equal to a float64 reference to float32's accuracy of the sum
    of the same bf16 products."""
    torch.manual_seed(0)
    B, T, H, D = 2, 16, 4, 8
    v, y, grad = (torch.randn(B, T, H, D).bfloat16() for _ in range(3))
    v.requires_grad_(True), y.requires_grad_(True)
    c_I, c_P = (torch.randn(H, 1, requires_grad=True) for _ in range(2))
    weight = torch.randn(H * D, H * D).bfloat16()

    def step():
        if epilogue == 'projection':
            out = CorridorProjection.apply(v, y, c_I, c_P, weight, None)
            out.backward(grad.flatten(2))
        else:
            out = OperatorSum.apply(v, y, c_I, c_P)
            out.backward(grad)
        assert out.dtype == torch.bfloat16
    ops = record_ops(step)
    wide = [op for op in ops if op[1] == torch.float32 and math.prod(op[2]) >= B * T * H * D]  # [B, T, C]-sized
    assert not wide, f"float32 activations: {wide}"
    assert c_I.grad.dtype == c_P.grad.dtype == torch.float32
    g = (grad.flatten(2) @ weight).view(B, T, H, D) if epilogue == 'projection' else grad
    # the reference: the same bf16 products (that is what the epilogue computes), summed in float64
    ref_I = (g * v.detach()).double().sum((0, 1, 3)).view(H, 1)
    ref_P = (g * y.detach()).double().sum((0, 1, 3)).view(H, 1)
    torch.testing.assert_close(c_I.grad.double(), ref_I, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(c_P.grad.double(), ref_P, rtol=1e-5, atol=1e-4)


def test_bf16_fast_path_stays_close_to_the_float64_math_path():
    """The corridor's fast path under bf16 autocast against the float64 math path: the loss and every gradient,
    within bf16's few per cent."""
    model = tiny('corridor')
    idx = torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(1))
    reference = tiny('corridor').double()
    ref_loss = torch.nn.functional.cross_entropy(reference.forward_with_probs(idx)[0].flatten(0, 1), idx.flatten())
    ref_loss.backward()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        _, loss = model(idx, idx)
    loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 0.02 * ref_loss.item()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad.double() - q.grad).norm() <= 0.05 * q.grad.norm() + 1e-6, name


# ---------------------------------------------------------------------------------------------- SDPA backends

@pytest.mark.parametrize('name, expected', [('math', ['math']), ('flash', ['flash'])])
def test_sdpa_backend_runs_only_the_chosen_kernel(name, expected):
    from lab.bench import sdpa_kernels
    from common import sdpa_backend
    model = tiny('corridor')
    idx = torch.randint(0, 32, (2, 8))
    with sdpa_backend(name, 'cpu', 'float32', 8):
        assert sdpa_kernels(lambda: model(idx, idx)[1].backward()) == expected


def test_a_backend_cpu_lacks_is_one_line_in_train_py(tiny_data_root, tmp_path):
    from conftest import TINY_TRAIN_ARGS, assert_one_line_error, run_script
    from common import UserError, sdpa_backend
    with pytest.raises(UserError, match='sdpa_backend must be one of'):
        sdpa_backend('fast', 'cpu', 'float32', 8)
    result = run_script('train.py', '--sdpa_backend=turbo', cwd=tmp_path)
    assert_one_line_error(result, 'sdpa_backend must be one of auto, flash, efficient, cudnn, math')
    result = run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={tmp_path / "out"}',
                        '--sdpa_backend=efficient', cwd=tmp_path)
    assert_one_line_error(result, "sdpa_backend='efficient' does not run on cpu in float32 with head size 16")
    assert not (tmp_path / 'out').exists()  # refused before the run folder is touched
