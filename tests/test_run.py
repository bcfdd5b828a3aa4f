"""run.py and what train.py calls of it, and the GPU path tested on the CPU: a resume into another
dtype, compiled training (eager = compiled, one recompile, no graph break, DDP over a compiled model, a compiled
pretrained model), the SDPA probe feeding SDPA what the model feeds it, MFU's FLOPs for frozen weights, and the lines a
run prints (ETA, claim (b)'s occupancy, the next commands, as the README lists them)."""

import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import run
from common import UserError, flops_per_token, sdpa_backend
from conftest import REPO, TINY_TRAIN_ARGS, run_script
from model import GPT, GPTConfig


def train(data_root, out, *args, cwd=None):
    return run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={data_root}', f'--out_dir={out}', *args,
                      cwd=cwd or data_root)


def read_log(out):
    return [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]


# ---------------------------------------------------------------------------------------------- dtypes, FLOPs

def test_a_float32_run_resumes_in_float16_with_a_fresh_grad_scaler(tiny_data_root, tmp_path):
    """A float32 checkpoint stores an empty grad-scaler state: a float16 resume (dtype=auto on a pre-Ampere GPU after a
    start on an H100) starts a fresh scaler instead of failing with "The source state dict is empty"."""
    out = tmp_path / 'run'
    common = ['--operator=corridor', '--eval_interval=5', '--lr_decay_iters=10']
    assert train(tiny_data_root, out, *common, '--max_iters=5', '--dtype=float32').returncode == 0
    assert torch.load(out / 'ckpt.pt', weights_only=True)['scaler'] == {}
    resumed = run_script('train.py', '--init_from=resume', f'--out_dir={out}', '--max_iters=10', '--dtype=float16',
                         cwd=tiny_data_root)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = read_log(out)
    assert [e['iter'] for e in log] == [0, 5, 10] and all(map(lambda e: e['val_loss'] < 10, log))
    assert torch.load(out / 'ckpt.pt', weights_only=True)['scaler']['scale'] > 0  # float16's own scaler, saved


def test_mfu_counts_no_weight_gradients_for_frozen_weights():
    """6N + 12·L·H·d·T when the weights train; 4N + the same attention term with them frozen (train_only='operator'):
    the backward still computes the activations' gradients (to reach every layer's scalars), not the weights'."""
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64, operator='corridor'))
    N, attention = model.get_num_params(), 12 * 2 * 4 * 8 * 16
    assert flops_per_token(model, 16) == 6 * N + attention
    assert flops_per_token(model, 16, weights_train=False) == 4 * N + attention


# ---------------------------------------------------------------------------------------------- the SDPA probe

def sdpa_calls(monkeypatch):
    """Every call of F.scaled_dot_product_attention: its inputs' shapes, strides, dtypes, and its keywords."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        calls.append(tuple((t.shape, t.stride(), t.dtype) for t in (q, k, v)) +
                     (tuple(sorted((key, value) for key, value in kwargs.items() if key != 'attn_mask')),))
        return sdpa(q, k, v, *args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', recording)
    return calls


def test_the_sdpa_probe_feeds_sdpa_what_a_training_step_of_our_gpt_feeds_it(monkeypatch):
    """Our GPT's layout (non-contiguous q, k, v views of c_attn's output), its dtype under autocast, its dropout:
    the probe's SDPA calls are a training step's, at the probe's shorter length; the model's gradients and the
    random numbers the run draws next are untouched."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64, operator='corridor',
                          gamma_init=-0.3, dropout=0.1))
    autocast = torch.autocast('cpu', dtype=torch.bfloat16)
    calls = sdpa_calls(monkeypatch)
    before = torch.get_rng_state()
    with sdpa_backend('math', model, 16, 'cpu', 'bfloat16', autocast):
        assert torch.equal(torch.get_rng_state(), before)  # the probe's dropout drew from a forked generator
        assert all(p.grad is None for p in model.parameters())
        probe = list(calls)
        calls.clear()
        idx = torch.randint(0, 64, (1, 16))
        with autocast:
            model(idx, idx)[1].backward()
    assert probe and probe == calls[:len(probe)]  # the same shapes (batch 1 × 16 both), strides, dtypes, keywords
    assert probe[0][0][1] != torch.empty(probe[0][0][0]).stride()  # q is a strided view, not a contiguous copy


def test_the_sdpa_probe_runs_a_pretrained_models_own_grouped_query_attention(monkeypatch):
    """A tiny GQA Llama (4 query heads on 2 KV heads) through transformers' SDPA attention: the probe's calls carry
    enable_gqa=True, as the run's will, so a backend without a GQA kernel (memory-efficient) fails at the probe, in
    one line; a backend that runs is kept."""
    pytest.importorskip('transformers')
    from test_hf import tiny_causal_lm, with_operator
    model = with_operator(tiny_causal_lm('llama'), operator='corridor', gamma_init=-0.2).float()
    calls = sdpa_calls(monkeypatch)
    with sdpa_backend('math', model, 16, 'cpu', 'float32', torch.autocast('cpu', enabled=False)):
        pass
    assert calls and all(dict(call[-1]).get('enable_gqa') for call in calls), calls[:1]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def no_gqa_kernel(*args, enable_gqa=False, **kwargs):  # as the memory-efficient kernel, on a GPU
        if enable_gqa:
            raise RuntimeError("No available kernel. Aborting execution.")
        return sdpa(*args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', no_gqa_kernel)
    with pytest.raises(UserError, match=r"sdpa_backend='math' does not run this model's attention on cpu in float32 "
                                        r"\(No available kernel\): use --sdpa_backend=auto"):
        sdpa_backend('math', model, 16, 'cpu', 'float32', torch.autocast('cpu', enabled=False))
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------------------------------- compiled training

def dynamo_counters():
    from torch._dynamo.utils import counters
    return counters


@pytest.mark.slow
def test_compiled_training_equals_eager_with_one_recompile_and_no_graph_break(tiny_data_root, tmp_path, monkeypatch):
    """train.py with --compile=True against --compile=False over a few iterations with evaluations: every logged
    loss and scalar within float tolerance; Dynamo compiles the training step and the evaluation (one recompile,
    eval mode and no_grad) and breaks no graph."""
    import train as train_module
    monkeypatch.setattr(signal, 'signal', lambda *a: None)  # in-process: leave pytest's handlers alone
    common = [*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', '--operator=corridor', '--gamma_init=-0.2',
              '--max_iters=6', '--eval_interval=3', '--lr_decay_iters=6', '--log_interval=3', '--eval_iters=2']
    train_module.main([*common, f'--out_dir={tmp_path / "eager"}'])
    torch._dynamo.reset()
    counters = dynamo_counters()
    counters.clear()
    train_module.main([*[a for a in common if a != '--compile=False'], '--compile=True',
                       f'--out_dir={tmp_path / "compiled"}'])
    eager, compiled = read_log(tmp_path / 'eager'), read_log(tmp_path / 'compiled')
    assert [e['iter'] for e in eager] == [e['iter'] for e in compiled] == [0, 3, 6]
    for a, b in zip(eager, compiled):
        assert b['train_loss'] == pytest.approx(a['train_loss'], rel=1e-4)
        assert b['val_loss'] == pytest.approx(a['val_loss'], rel=1e-4)
        torch.testing.assert_close(torch.tensor(b['gamma']), torch.tensor(a['gamma']), rtol=1e-3, atol=1e-5)
    assert sum(counters['graph_break'].values()) == 0, dict(counters['graph_break'])
    assert counters['stats']['unique_graphs'] <= 2  # the training step, and the evaluation: one recompile at most
    torch._dynamo.reset()


@pytest.mark.slow
def test_ddp_over_a_compiled_model_reaches_the_losses_of_one_process(tiny_data_root, tmp_path):
    """Two gloo processes, each with a compiled model under DDP, against one compiled process on the same global
    batch (gradient_accumulation_steps=4), within the reduction order's tolerance."""
    common = [*(a for a in TINY_TRAIN_ARGS if a != '--compile=False'), '--compile=True',
              f'--data_root={tiny_data_root}', '--operator=corridor', '--max_iters=4', '--eval_interval=2',
              '--warmup_iters=1', '--lr_decay_iters=4', '--gradient_accumulation_steps=4', '--eval_iters=2']
    single = run_script('train.py', *common, f'--out_dir={tmp_path / "single"}', cwd=tiny_data_root)
    assert single.returncode == 0, single.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    ddp = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                          str(REPO / 'train.py'), *common, f'--out_dir={tmp_path / "ddp"}'], cwd=tiny_data_root,
                         capture_output=True, text=True, env={**env, 'OMP_NUM_THREADS': '1'}, timeout=900)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    for a, b in zip(read_log(tmp_path / 'single'), read_log(tmp_path / 'ddp')):
        assert b['iter'] == a['iter'] and b['val_loss'] == pytest.approx(a['val_loss'], rel=1e-4)
        torch.testing.assert_close(torch.tensor(b['gamma']), torch.tensor(a['gamma']), rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_a_compiled_pretrained_model_with_the_operator_equals_eager():
    """A tiny GQA Llama with the corridor, compiled (transformers' SDPA attention, then the operator line): the loss
    and the scalars' gradients of the eager model."""
    pytest.importorskip('transformers')
    from test_hf import tiny_causal_lm, with_operator
    model = with_operator(tiny_causal_lm('llama'), operator='corridor', gamma_init=-0.2, init_spread=0.1).float()
    idx = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    eager = model(idx, idx)[1]
    eager_grads = torch.autograd.grad(eager, model.operator_parameters())
    torch._dynamo.reset()
    compiled = torch.compile(model)(idx, idx)[1]
    grads = torch.autograd.grad(compiled, model.operator_parameters())
    assert compiled.item() == pytest.approx(eager.item(), rel=1e-5)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------- what a run prints

def test_the_eta_is_the_iterations_left_at_this_process_pace(monkeypatch):
    """After the first (compiling) step the clock starts; ETA = iterations left × seconds per iteration since then,
    evaluations included; tok/s and ms/iter count the timed steps only."""
    now = [100.0]
    monkeypatch.setattr(run.time, 'time', lambda: now[0])
    window = run.LogWindow('cpu', max_iters=110, flops_per_iter=1.0, tokens_per_iter=1000, world=1, peak=None)
    now[0] = 130.0
    window.step_done(1)  # compiled: 30 s, left out
    for it in range(2, 11):  # 9 steps of 2 s
        now[0] += 2.0
        window.step_done(it)
    now[0] += 9.0  # an evaluation: in the pace, not in the steps' speed
    window.restart_clock()
    now[0] += 2.0
    window.step_done(11)
    # the pace: 29 s over the 10 iterations since the first (18 s of steps, 9 s of evaluation, 2 s of step 11)
    assert window.speed(11) == ", 500 tok/s, 2000 ms/iter, ETA " + run.duration(99 * 2.9) == \
        ", 500 tok/s, 2000 ms/iter, ETA 4m47s"
    assert run.duration(45) == '45s' and run.duration(245) == '4m05s' and run.duration(7800) == '2h10m'


def test_under_ddp_a_log_line_gives_the_runs_tokens_per_second_mfu_per_device_and_the_mean_loss_of_every_process(
        monkeypatch):
    """Two processes (world 2) of one global step of 1,000 tokens, 4,000 FLOPs, every 2 s: 500 tok/s is the run's
    (each process computes its half in the same 2 s), MFU is each device's, 4,000 / 2 / 2 of a 2,000 FLOP/s peak;
    the window's loss is the mean over both processes and both steps, and a stop seen by the other process is seen."""
    now = [0.0]
    monkeypatch.setattr(run.time, 'time', lambda: now[0])
    window = run.LogWindow('cpu', max_iters=12, flops_per_iter=4000.0, tokens_per_iter=1000, world=2, peak=2000.0)
    for it in (1, 2, 3):  # the first, compiling step is left out
        now[0] += 2.0
        window.step_done(it)
    assert window.speed(3) == ", 500 tok/s, mfu 50.0%, 2000 ms/iter, ETA 18s"
    window.reset()
    window.loss += 1.0  # this process's two steps: losses 1.0 and 2.0
    window.loss += 2.0
    window.iters = 2

    def the_other_process(shared, op):  # its two steps summed to 5.0, and Ctrl-C reached it
        assert op == run.dist.ReduceOp.SUM
        shared += torch.tensor([5.0, 1.0])
    monkeypatch.setattr(run.dist, 'all_reduce', the_other_process)
    assert window.meet(False, ddp=True) == (2.0, True)  # (1 + 2 + 5) / 2 processes / 2 steps


def fake_torchrun(monkeypatch, world):
    """This process as rank 0 of `world` under torchrun (its environment), the process group's calls recorded."""
    calls = []
    monkeypatch.setenv('RANK', '0')
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setattr(run.dist, 'init_process_group', lambda **kw: calls.append(('init', kw['backend'])))
    monkeypatch.setattr(run.dist, 'get_rank', lambda: 0)
    monkeypatch.setattr(run.dist, 'get_world_size', lambda: world)
    monkeypatch.setattr(run.dist, 'barrier', lambda: calls.append('barrier'))
    monkeypatch.setattr(run.dist, 'destroy_process_group', lambda: calls.append('destroy'))
    return calls


def test_under_torchrun_the_micro_batches_must_divide_among_the_processes_which_leave_together(monkeypatch, tmp_path):
    """backend 'auto' is gloo on the CPU; gradient_accumulation_steps split over the processes (6 over 3: 2 each; 4
    over 3: one line naming both); at the end every process waits for the others, then leaves the group."""
    calls = fake_torchrun(monkeypatch, world=3)
    cfg = SimpleNamespace(device='cpu', backend='auto', gradient_accumulation_steps=6, out_dir=str(tmp_path))
    with run.processes(cfg) as (ddp, rank, world, device):
        assert (ddp, rank, world, device) == (True, 0, 3, 'cpu') and calls == [('init', 'gloo')]
    assert calls == [('init', 'gloo'), 'barrier', 'destroy']
    with pytest.raises(UserError) as e:
        with run.processes(SimpleNamespace(**{**vars(cfg), 'gradient_accumulation_steps': 4})):
            pass
    assert str(e.value) == "gradient_accumulation_steps=4 must be divisible by the 3 DDP processes"


def run_config(**keys):
    from train import DEFAULTS
    return SimpleNamespace(**{**DEFAULTS, 'dataset': 'shakespeare_char', **keys})


def test_the_next_commands_of_the_quick_start_are_the_readmes(monkeypatch, tmp_path):
    """The quick start's run ends with exactly the README's next commands; a corridor run's other run is attention
    with its own out_dir, an attention run's the corridor; a resumed run's command line holds no config to repeat."""
    monkeypatch.chdir(tmp_path)  # no run folders here
    monkeypatch.setattr(sys, 'argv', ['train.py', 'configs/shakespeare_char.py', '--operator=corridor'])
    cfg = run_config(out_dir='out-shakespeare-char', operator='corridor')
    readme = (REPO / 'README.md').read_text()
    block = readme.split('It ends by naming its checkpoint and the next commands')[1].split('```bash\n')[1]
    printed = run.next_commands(cfg, resumed=False)
    assert block.split('```')[0].strip().splitlines() == printed
    monkeypatch.setattr(sys, 'argv', ['train.py', 'configs/shakespeare_char.py', '--operator=attention',
                                      '--out_dir=base', '--overwrite=True'])
    other = run.next_commands(run_config(out_dir='base', operator='attention'), resumed=False)
    assert other[1] == 'python train.py configs/shakespeare_char.py --operator=corridor --out_dir=base-corridor'
    assert run.next_commands(cfg, resumed=True) == printed[:1]


def test_the_next_commands_see_the_other_run_and_never_print_one_that_would_be_refused(trained_run, monkeypatch,
                                                                                        tmp_path):
    """After the quick start's attention run (OUT-attention beside the corridor run in OUT): the comparison alone.
    After a start from a run folder (its weights fix the operator) or of the scalars alone: the sample alone. A config
    file's operator keys the other form does not read are reset; a folder another run holds is not reused."""
    import shutil
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained_run, 'base', ignore=shutil.ignore_patterns('analysis', 'train.lock'))  # corridor, 'tiny'
    monkeypatch.setattr(sys, 'argv', ['train.py', 'tiny.py', '--operator=attention', '--out_dir=base-attention'])
    after = run.next_commands(run_config(out_dir='base-attention', operator='attention', dataset='tiny'), False)
    assert after == ['python sample.py --out_dir=base-attention --num_samples=3',
                     'python analyze.py base base-attention --out comparison']
    other_data = run.next_commands(run_config(out_dir='base-attention', operator='attention'), False)
    assert other_data[1].endswith('--operator=corridor --out_dir=base-corridor')  # a run on other data: no partner
    # the GPU path's folders (docs/gpu.md): OUT-corridor, then OUT-attention beside it
    after_corridor = run.next_commands(run_config(out_dir='owt-corridor', operator='corridor', dataset='tiny'), False)
    assert after_corridor[1:] == ['python train.py tiny.py --operator=attention --out_dir=owt-attention',
                                  'python analyze.py owt-corridor owt-attention --out comparison']
    shutil.copytree('base', 'owt-corridor')
    assert run.next_commands(run_config(out_dir='owt-attention', operator='attention', dataset='tiny'), False)[1:] == \
        ['python analyze.py owt-corridor owt-attention --out comparison']
    for start in (dict(init_from='base'), dict(init_from='smollm2-135m', train_only='operator')):
        assert run.next_commands(run_config(out_dir='next', operator='corridor', **start), False) == \
            ['python sample.py --out_dir=next --num_samples=3']
    # a laplacian run from a config file that sets its keys: attention is told to drop them
    monkeypatch.setattr(sys, 'argv', ['train.py', 'lap.py', '--out_dir=lap'])
    lap = run.next_commands(run_config(out_dir='lap', operator='laplacian', laplacian_heads=2), False)
    assert lap[1] == 'python train.py lap.py --operator=attention --laplacian_heads=1 --out_dir=lap-attention'
    # base-attention holds no run, but a corridor run's partner folder taken by another corridor run is not reused
    shutil.copytree('base', 'c-attention')
    shutil.copytree('base', 'c-attention-2')
    monkeypatch.setattr(sys, 'argv', ['train.py', 'tiny.py', '--out_dir=c'])
    taken = run.next_commands(run_config(out_dir='c', operator='corridor', dataset='tiny'), False)
    assert taken[1:] == ['python train.py tiny.py --operator=attention --out_dir=c-attention-3',
                         'python analyze.py c c-attention-3 --out comparison']


@pytest.mark.slow
def test_the_printed_next_commands_run_as_printed(tiny_data_root, tmp_path):
    """A finished run's last lines, each run as it stands (from the run's own folder): the sample, the other run, the
    comparison; each exits 0 and writes what it says."""
    result = train(tiny_data_root, 'first', '--operator=corridor', '--max_iters=4', '--eval_interval=2',
                   '--warmup_iters=1', '--lr_decay_iters=4', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    commands = lines[lines.index(next(line for line in lines if line.startswith('done: '))) + 1:]
    assert len(commands) == 3 and commands[1].endswith('--operator=attention --out_dir=first-attention')
    outputs = [run_printed(command, tmp_path) for command in commands]
    assert (tmp_path / 'first-attention' / 'ckpt.pt').exists() and (tmp_path / 'comparison' / 'val_loss.png').exists()
    assert json.loads((tmp_path / 'first-attention' / 'config.json').read_text())['operator'] == 'attention'
    # the attention run's own block sees the corridor run beside it: its comparison, nothing to train
    lines = outputs[1].splitlines()
    assert lines[lines.index(next(line for line in lines if line.startswith('done: '))) + 1:] == [
        'python sample.py --out_dir=first-attention --num_samples=3',
        'python analyze.py first first-attention --out comparison']
    # a run started from the corridor run's folder: its weights fix the operator, so no other run is offered
    started = train(tiny_data_root, 'second', '--init_from=first', '--max_iters=2', '--eval_interval=2',
                    '--warmup_iters=1', '--lr_decay_iters=4', cwd=tmp_path)
    assert started.returncode == 0, started.stderr[-2000:]
    assert started.stdout.splitlines()[-1] == 'python sample.py --out_dir=second --num_samples=3'


def run_printed(command, cwd):
    """A printed command run as it stands (its quotes as a shell reads them); its stdout."""
    import shlex
    script, *args = shlex.split(command.removeprefix('python '))
    done = run_script(script, *args, cwd=cwd)
    assert done.returncode == 0, (command, done.stderr[-2000:])
    return done.stdout
