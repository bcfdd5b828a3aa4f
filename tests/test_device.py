"""Device placement and mixed precision, without a GPU.

A tensor left on the CPU is invisible on a CPU-only machine: every path here runs with the model on a second device,
`meta` (shapes and dtypes, no data), where mixing in a CPU tensor fails exactly as it would next to CUDA tensors.
Where a path brings results back to the host (connection.to_host), a zero host tensor of the same shape stands in,
so everything computed on the device still runs there."""

import contextlib

import pytest
import torch

from lab import connection
from model import OPERATORS, GPT, GPTConfig

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
    from lab.connection import walk_geometry
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
    its own attention (pretrained.operator_output) computes there, forward and backward. (transformers' own mask code
    reads tensor values, which meta tensors don't have, so the model's whole forward is not run here.)"""
    pytest.importorskip('transformers')
    from lab import pretrained
    from test_hf import tiny_causal_lm, with_operator
    keys = dict(gamma_init=-0.2) if operator == 'corridor' else {}
    model = with_operator(tiny_causal_lm('llama'), operator=operator, **keys).float().to(META)
    B, H, n_kv, T, d_h = 2, 4, 2, 6, 8  # the tiny Llama's 4 query heads on 2 KV heads
    for attn in pretrained.attention_modules(model.lm):
        assert_on(META, *attn.coefficients())
        query = torch.randn(B, H, T, d_h, device=META)
        value = torch.randn(B, n_kv, T, d_h, device=META, requires_grad=True)
        pv = torch.randn(B, T, H, d_h, device=META, requires_grad=True)
        out = pretrained.operator_output(attn, pv, query, value)
        out.sum().backward()
        assert_on(META, out, pv.grad, *([value.grad] if operator != 'attention' else []))  # attention: P·V alone
    assert_on(META, *(p.grad for p in model.operator_parameters()))


def test_operator_only_training_state_restores_onto_the_device():
    """train_only='operator': the checkpoint's scalars and Adam moments land on the model's device, and a step runs."""
    pytest.importorskip('transformers')
    from test_hf import tiny_causal_lm, with_operator
    from run import saved_weights

    def operator_only():  # as train.py builds it: every weight frozen but the operator's scalars
        model = with_operator(tiny_causal_lm('llama'), operator='corridor', gamma_init=-0.2).float()
        for p in model.parameters():
            p.requires_grad_(any(p is q for q in model.operator_parameters()))
        return model

    def step(model, optimizer):
        for p in model.operator_parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
    model = operator_only()
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    step(model, optimizer)
    state, moments = saved_weights(model, 'operator'), optimizer.state_dict()
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


@pytest.mark.parametrize('where', ['our GPT', 'a transformers model'])
def test_under_bf16_the_operator_line_sums_dL_dc_in_float32_and_its_output_reads_as_the_model_computes(where):
    """The operator line under bf16 autocast: the scalars stay float32, so c·x promotes (an eager float32 [B, T, C]
    temporary, which a compiled step fuses away), and dL/dc is a float32 sum of the bf16 activations' products,
    equal to a float64 reference to float32's accuracy. A transformers model gets the sum back in its activations'
    dtype, as its own attention would hand it on."""
    torch.manual_seed(0)
    B, T, H, D = 2, 16, 4, 8
    if where == 'our GPT':
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=H, n_embd=H * D, block_size=T, vocab_size=32, operator='corridor',
                              gamma_init=-0.3, init_spread=0.2))
        attn = model.transformer.h[0].attn
        x = torch.randn(B, T, H * D)
        outputs = {}
        attn.c_proj.register_forward_pre_hook(lambda m, args: outputs.update(y=args[0]))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = attn(x)[0]
            q, k, v = attn.c_attn(x).split(H * D, dim=2)
        grad = torch.randn_like(out)
        out.backward(grad)
        assert outputs['y'].dtype == torch.float32 and out.dtype == torch.bfloat16
        v = v.view(B, T, H, D)
        q, k = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k))
        pv = torch.nn.functional.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True).transpose(1, 2)
        g = (grad.to(torch.bfloat16).double() @ attn.c_proj.weight.to(torch.bfloat16).double()).view(B, T, H, D)
        gamma, delta = attn.coefficients.gamma, attn.coefficients.delta
        d_cI, d_cP = ((g * t.double()).sum((0, 1, 3)) for t in (v, pv))
        grads = {'gamma': delta.double() * d_cI, 'delta': gamma.double() * d_cI + d_cP}
        for name, expected in grads.items():
            p = getattr(attn.coefficients, name)
            assert p.grad.dtype == torch.float32
            torch.testing.assert_close(p.grad.double(), expected, rtol=2e-2, atol=1e-3)
    else:
        pytest.importorskip('transformers')
        from lab.pretrained import operator_output
        from model import OperatorCoefficients
        module = torch.nn.Module()
        module.coefficients = OperatorCoefficients(GPTConfig(n_head=H, n_embd=H * D, operator='corridor',
                                                             gamma_init=-0.3))
        value = torch.randn(B, H, T, D).bfloat16()
        pv = torch.randn(B, T, H, D).bfloat16()
        out = operator_output(module, pv, torch.zeros(B, H, T, D), value)
        grad = torch.randn(B, T, H, D).bfloat16()
        out.backward(grad)
        assert out.dtype == torch.bfloat16
        g = grad.double()
        d_cI = (g * value.transpose(1, 2).double()).sum((0, 1, 3))
        d_cP = (g * pv.double()).sum((0, 1, 3))
        c = module.coefficients
        assert c.gamma.grad.dtype == torch.float32
        torch.testing.assert_close(c.gamma.grad.double(), c.delta.double() * d_cI, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(c.delta.grad.double(), c.gamma.double() * d_cI + d_cP, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('top_k', [None, 5])
def test_sampling_never_waits_for_the_host(top_k):
    """generate's ops, recorded: no nonzero or index_put_ (a boolean-mask assignment, which on CUDA copies a count
    back to the host at every token); the tokens are those of a boolean-mask top-k by hand."""
    model = tiny('corridor').eval()
    prompt = torch.randint(0, 32, (2, 3), generator=torch.Generator().manual_seed(0))
    ops = {name for name, *_ in record_ops(lambda: model.generate(prompt, 6, temperature=0.8, top_k=top_k,
                                                                   generator=torch.Generator().manual_seed(1)))}
    assert not {op for op in ops if 'nonzero' in op or 'index_put' in op or 'masked_select' in op}, ops
    # the same draws as the top-k written the old way, a boolean-mask assignment
    generator, idx = torch.Generator().manual_seed(1), prompt
    for _ in range(6):
        logits = model(idx)[0][:, -1] / 0.8
        if top_k:
            v, _ = torch.topk(logits, top_k)
            logits[logits < v[:, [-1]]] = float('-inf')
        idx = torch.cat([idx, torch.multinomial(logits.softmax(-1), 1, generator=generator)], 1)
    assert torch.equal(idx, model.generate(prompt, 6, temperature=0.8, top_k=top_k,
                                           generator=torch.Generator().manual_seed(1)))


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

def test_every_sdpa_backend_train_py_accepts_has_a_kernel_to_try():
    """common.SDPA_BACKENDS checks the key before anything loads; lab/sdpa.KERNELS maps a name to PyTorch's kernel
    when the run starts (the lab may not import common back): the two must name the same backends."""
    from common import SDPA_BACKENDS
    from lab.sdpa import KERNELS
    assert SDPA_BACKENDS == ('auto', *KERNELS)


@pytest.mark.parametrize('name, expected', [('math', ['math']), ('flash', ['flash'])])
def test_sdpa_backend_runs_only_the_chosen_kernel(name, expected):
    from lab.bench import sdpa_kernels
    from common import sdpa_backend
    model = tiny('corridor')
    idx = torch.randint(0, 32, (2, 8))
    with sdpa_backend(name, model, 16, 'cpu', 'float32', contextlib.nullcontext()):
        assert sdpa_kernels(lambda: model(idx, idx)[1].backward()) == expected


def test_a_backend_cpu_lacks_is_one_line_in_train_py(tiny_data_root, tmp_path):
    from conftest import TINY_TRAIN_ARGS, assert_one_line_error, run_script
    from common import UserError, sdpa_backend
    with pytest.raises(UserError, match='sdpa_backend must be one of'):
        sdpa_backend('fast', tiny('corridor'), 16, 'cpu', 'float32', contextlib.nullcontext())
    result = run_script('train.py', '--sdpa_backend=turbo', cwd=tmp_path)
    assert_one_line_error(result, 'sdpa_backend must be one of auto, flash, efficient, cudnn, math')
    result = run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={tmp_path / "out"}',
                        '--sdpa_backend=efficient', cwd=tmp_path)
    assert_one_line_error(result, "sdpa_backend='efficient' does not run this model's attention on cpu in float32")
    assert not (tmp_path / 'out').exists()  # refused before the run folder is touched
