"""train.py: it learns, it logs every head's γ/δ, it resumes exactly, DDP matches one process, bad input is
one line and overwrites nothing."""

import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from common import model_config, parse_config
from conftest import (REPO, TINY_TRAIN_ARGS, assert_one_line_error, run_in_process, run_script, synthetic_text,
                      tiny_llama_and_its_wikitext)
from train import DEFAULTS


def train(data_root, out, *args):
    result = run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={data_root}', f'--out_dir={out}', *args,
                        cwd=data_root)
    return result


def read_log(out):
    return [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir())}


def test_tiny_model_learns_and_logs_every_heads_gamma_delta_at_every_eval(trained_run):
    log = read_log(trained_run)
    assert [entry['iter'] for entry in log] == [0, 20, 40, 60]
    assert log[-1]['val_loss'] < log[0]['val_loss'] - 1.0  # from ln(vocab) ≈ 3.2 to well below
    for entry in log:
        for key in ('gamma', 'delta', 'c_I', 'c_P'):
            values = torch.tensor(entry[key])
            assert values.shape == (2, 2) and torch.isfinite(values).all()
    assert log[-1]['tokens'] == 60 * 8 * 32
    ckpt = torch.load(trained_run / 'ckpt.pt', weights_only=True)
    # the last line logs the saved model's own corridor parameters, and the paper's c_I = δγ, c_P = δ of them
    gamma, delta = (torch.stack([ckpt['model'][f'transformer.h.{l}.attn.coefficients.{name}'] for l in range(2)])
                    for name in ('gamma', 'delta'))
    for key, expected in (('gamma', gamma), ('delta', delta), ('c_I', delta * gamma), ('c_P', delta)):
        torch.testing.assert_close(torch.tensor(log[-1][key]), expected.float())
    assert ckpt['iter_num'] == 60 and ckpt['best_val_loss'] == min(e['val_loss'] for e in log)
    assert json.loads((trained_run / 'config.json').read_text())['operator'] == 'corridor'


def test_resume_logs_the_same_losses_bit_for_bit(tiny_data_root, tmp_path, monkeypatch, capsys):
    """In this process (the quick tier; the Ctrl-C test below resumes through train.py's command line). Dropout > 0,
    so the restored RNG state matters too."""
    import train as train_module
    common = ['--operator=corridor', '--dropout=0.1', '--eval_interval=10', '--lr_decay_iters=40']
    whole, parts = tmp_path / 'whole', tmp_path / 'parts'
    train_in_process(monkeypatch, tiny_data_root, whole, *common, '--max_iters=40')
    train_in_process(monkeypatch, tiny_data_root, parts, *common, '--max_iters=20')
    capsys.readouterr()
    train_module.main(['--init_from=resume', f'--out_dir={parts}', '--max_iters=40'])
    assert 'resuming at iter 20' in capsys.readouterr().out
    assert read_log(parts) == read_log(whole)  # every loss, every γ and δ, bit for bit
    a, b = (torch.load(p / 'ckpt.pt', weights_only=True)['model'] for p in (whole, parts))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_saves_at_an_iteration_boundary_and_resume_matches_the_uninterrupted_run(tiny_data_root, tmp_path):
    # long enough (~2 s of training) that the signal lands in the middle of the run, not after its end
    common = ['--operator=corridor', '--eval_interval=100', '--lr_decay_iters=1000', '--max_iters=1000']
    whole, stopped = tmp_path / 'whole', tmp_path / 'stopped'
    assert train(tiny_data_root, whole, *common).returncode == 0
    process = subprocess.Popen([sys.executable, str(REPO / 'train.py'), *TINY_TRAIN_ARGS, *common,
                                f'--data_root={tiny_data_root}', f'--out_dir={stopped}'],
                               cwd=tiny_data_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):  # wait for the first training iterations
        if (stopped / 'log.jsonl').exists() and (stopped / 'log.jsonl').read_text():
            break
        time.sleep(0.1)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT, stderr[-2000:]  # stopped is not finished
    assert 'stopped at iter' in stdout and '--init_from=resume' in stdout
    stopped_at = torch.load(stopped / 'ckpt.pt', weights_only=True)['iter_num']
    assert 0 < stopped_at < 1000
    result = run_script('train.py', '--init_from=resume', f'--out_dir={stopped}', cwd=tiny_data_root)
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_log(stopped) == read_log(whole)


def test_a_resumed_run_uses_the_optimizer_settings_configured_now(tiny_data_root, tmp_path):
    out = tmp_path / 'out'
    assert train(tiny_data_root, out, '--operator=corridor', '--max_iters=10', '--eval_interval=10',
                 '--lr_decay_iters=40').returncode == 0
    result = run_script('train.py', '--init_from=resume', f'--out_dir={out}', '--max_iters=20',
                        '--operator_lr_mult=0.0', cwd=tiny_data_root)
    assert result.returncode == 0, result.stderr[-2000:]
    log = read_log(out)
    assert log[1]['gamma'] != log[0]['gamma']  # learnt before the resume
    assert log[2]['gamma'] == log[1]['gamma'] and log[2]['delta'] == log[1]['delta']  # frozen after it
    assert log[2]['val_loss'] != log[1]['val_loss']  # while the rest of the model kept training


def test_best_val_loss_only_goes_down(tiny_data_root, tmp_path):
    out = tmp_path / 'out'
    # a large constant learning rate makes the validation loss bounce
    result = train(tiny_data_root, out, '--decay_lr=False', '--learning_rate=0.05', '--max_iters=60',
                   '--eval_interval=5', '--always_save_checkpoint=False')
    assert result.returncode == 0, result.stderr[-2000:]
    log = read_log(out)
    val = [e['val_loss'] for e in log]
    assert any(b > a for a, b in zip(val, val[1:])), "the test needs a run whose val loss goes up at least once"
    assert [e['best_val_loss'] for e in log] == [min(val[:i + 1]) for i in range(len(val))]
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    assert ckpt['best_val_loss'] == min(val)
    assert ckpt['iter_num'] == log[val.index(min(val))]['iter']  # ckpt.pt holds the best model


def test_non_finite_loss_stops_with_one_line_and_keeps_the_last_checkpoint(tiny_data_root, tmp_path):
    out = tmp_path / 'out'
    assert train(tiny_data_root, out, '--max_iters=10', '--eval_interval=10').returncode == 0
    before = digest(out)
    result = run_script('train.py', '--init_from=resume', f'--out_dir={out}', '--max_iters=60',
                        '--learning_rate=1e12', '--decay_lr=False', '--grad_clip=0.0', cwd=tiny_data_root)
    assert_one_line_error(result, 'loss is', 'holds the last good state')
    after = digest(out)
    assert after['ckpt.pt'] == before['ckpt.pt']


@pytest.mark.parametrize('operator', [['--operator=corridor'],
                                      # fixed γ0 drawn per head: buffers, which DDP leaves to each rank to build
                                      ['--operator=corridor', '--init_spread=0.4', '--learn_gamma=False']],
                         ids=['learnable', 'drawn-fixed-gamma'])
def test_ddp_two_gloo_processes_reach_the_losses_of_one_process(tiny_data_root, tmp_path, operator):
    """Same global batch (gradient_accumulation_steps=4: 4 micro-batches in one process, 2 in each of two).
    Tolerance 1e-5 relative: gloo sums the two gradients in another order than one process accumulates them."""
    common = [*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', *operator, '--max_iters=20',
              '--eval_interval=10', '--lr_decay_iters=20', '--gradient_accumulation_steps=4']
    single = run_script('train.py', *common, f'--out_dir={tmp_path / "single"}', cwd=tiny_data_root)
    assert single.returncode == 0, single.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    ddp = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                          str(REPO / 'train.py'), *common, f'--out_dir={tmp_path / "ddp"}'],
                         cwd=tiny_data_root, capture_output=True, text=True, env={**env, 'OMP_NUM_THREADS': '1'},
                         timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one, two = read_log(tmp_path / 'single'), read_log(tmp_path / 'ddp')
    assert [e['iter'] for e in one] == [e['iter'] for e in two] == [0, 10, 20]
    for a, b in zip(one, two):
        assert b['train_loss'] == pytest.approx(a['train_loss'], rel=1e-5)
        assert b['val_loss'] == pytest.approx(a['val_loss'], rel=1e-5)
        torch.testing.assert_close(torch.tensor(b['gamma']), torch.tensor(a['gamma']), rtol=1e-4, atol=1e-5)
        assert b['tokens'] == a['tokens'] == b['iter'] * 4 * 8 * 32  # the global batch's tokens, not a process's
    assert one[-1]['val_loss'] < one[0]['val_loss']
    # rank 0 alone prints: the header names the global batch's tokens per iteration (4 micro-batches of 8 × 32,
    # split 2 + 2 over the processes) and the processes; a log line's loss is the mean over both processes' steps
    headers = [[line for line in r.stdout.splitlines() if 'tokens per iteration' in line] for r in (single, ddp)]
    assert len(headers[0]) == len(headers[1]) == 1, ddp.stdout[-3000:]
    assert re.sub(r' \(auto: [^)]*\)', '', headers[0][0]).endswith(  # auto's reason: this CPU's (tested apart)
        ', 1,024 tokens per iteration, cpu, float32, 1 process(es)')
    assert headers[1][0] == headers[0][0].replace('1 process(es)', '2 process(es)')
    logged = [[line for line in r.stdout.splitlines() if line.startswith('iter ')] for r in (single, ddp)]
    assert [line.split(':')[0] for line in logged[1]] == [line.split(':')[0] for line in logged[0]] == \
        ['iter 10/20', 'iter 20/20']
    for a, b in zip(*logged):
        assert float(b.split('batch loss ')[1].split(',')[0]) == pytest.approx(
            float(a.split('batch loss ')[1].split(',')[0]), abs=2e-4)


# ---------------------------------------------------------------------------------------------- bad input

@pytest.fixture
def finished_run(tiny_data_root, tmp_path):
    out = tmp_path / 'run'
    assert train(tiny_data_root, out, '--max_iters=10', '--eval_interval=10').returncode == 0
    return out


@pytest.mark.parametrize('args,message', [
    (['--n_layr=3'], "unknown config key 'n_layr' in the command line (did you mean 'n_layer'?)"),
    (['--n_layer=four'], "n_layer must be int"),
    (['--learning_rate=fast'], "learning_rate must be float"),
    (['--operator=corridr'], "unknown operator 'corridr'"),
    (['--dataset=nope'], "no prepared data at"),
    (['configs/nope.py'], "config file 'configs/nope.py' not found"),
    (['--block_size=100000'], "block_size=100000 needs more tokens than that"),
    (['--operator=alpha', '--gamma_nonneg=True'], "operator='alpha' does not read gamma_nonneg"),
    (['--operator=attention', '--operator_lr_mult=3'], "operator='attention' does not read operator_lr_mult"),
    (['--operator=corridor', '--laplacian_heads=3'], "laplacian_heads is read by laplacian"),
    (['--label_smoothing=1.0'], "label_smoothing must be in [0, 1), got 1.0"),
    (['--learning_rate=1e999'], "learning_rate must be finite"),
    (['--device=mps'], "device='mps' but MPS is not available here"),  # no Apple GPU on the test machines
    (['--device=mps', '--dtype=float16'], "on mps use float32 (the default) or bfloat16"),
    (['--n_layer'], "expected --key=value"),
    (['--warmup_iters=5', '--lr_decay_iters=5'], "lr_decay_iters=5 must exceed warmup_iters=5"),
    (['--eval_interval=0'], "eval_interval must be at least 1"),
    (['--n_layer={[1]: 2}'], "n_layer must be int"),  # not even a Python literal
    (['--vocab_size=50304'], "pads its embedding to a multiple of 64 by itself"),  # nanoGPT's habit
    (['--device=tpu'], "device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got 'tpu'"),
    (['--device=mps:0'], "device must be"),
    (['--device=cpu:1'], "device must be"),
    (['--eval_interval=10', '--walk_interval=15'], "walk_interval=15 must be a multiple of eval_interval=10"),
])
def test_bad_config_is_one_line_and_writes_nothing(tiny_data_root, tmp_path, args, message):
    result = train(tiny_data_root, tmp_path / 'out', '--max_iters=5', *args)
    assert_one_line_error(result, message)
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('damage,message', [
    ('meta', "is not a meta.json written by prepare.py"),
    ('odd', "not a whole number of uint16 tokens"),
])
def test_damaged_data_is_one_line(tiny_data_root, tmp_path, damage, message):
    data = tmp_path / 'data' / 'tiny'
    data.mkdir(parents=True)
    for name in ('meta.json', 'train.bin', 'val.bin'):
        (data / name).write_bytes((tiny_data_root / 'tiny' / name).read_bytes())
    if damage == 'meta':
        (data / 'meta.json').write_text('{"vocab_size": 30, "tokeni')
    else:
        with open(data / 'train.bin', 'ab') as f:
            f.write(b'\0')  # half a token
    result = run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={tmp_path / "data"}', f'--out_dir={tmp_path / "out"}',
                        cwd=tmp_path)
    assert_one_line_error(result, message)
    assert not (tmp_path / 'out').exists()


def test_scratch_run_refuses_to_overwrite_a_checkpoint(tiny_data_root, finished_run):
    before = digest(finished_run)
    result = train(tiny_data_root, finished_run, '--max_iters=10')
    assert_one_line_error(result, 'ckpt.pt exists', '--init_from=resume')
    assert digest(finished_run) == before


def test_a_run_folder_given_as_a_config_file_is_one_line_naming_the_commands_that_work(tiny_data_root, finished_run):
    """`python train.py out` (the folder where a config file goes): the line names the two keys that take a run folder,
    and the resume it names, run as printed, continues the run."""
    result = run_script('train.py', finished_run.name, cwd=finished_run.parent)
    assert_one_line_error(result, f"'{finished_run.name}' is a folder, not a config file")
    resume = re.search(r'(--init_from=resume --out_dir=\S+) resumes its run', result.stderr)[1].split()
    assert f'--init_from={finished_run.name} starts from its weights' in result.stderr
    resumed = run_script('train.py', *resume, f'--data_root={tiny_data_root}', '--max_iters=12', '--lr_decay_iters=12',
                         cwd=finished_run.parent)
    assert resumed.returncode == 0 and 'resuming at iter 10' in resumed.stdout, resumed.stderr[-2000:]
    from model import OPERATORS  # --help lists the forms from the table itself
    assert f"the forms: {', '.join(OPERATORS)}" in ' '.join(run_script('train.py', '--help', cwd=REPO).stdout.split())


@pytest.mark.parametrize('damage', ['truncate', 'garbage'])
def test_corrupt_checkpoint_is_one_line_on_resume(tiny_data_root, finished_run, damage):
    ckpt = finished_run / 'ckpt.pt'
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[:len(data) // 2] if damage == 'truncate' else b'not a checkpoint at all')
    before = digest(finished_run)
    result = run_script('train.py', '--init_from=resume', f'--out_dir={finished_run}', cwd=tiny_data_root)
    assert_one_line_error(result, 'is not a readable checkpoint')
    assert digest(finished_run) == before


def test_resume_without_a_checkpoint_is_one_line(tiny_data_root, tmp_path):
    assert_one_line_error(run_script('train.py', '--init_from=resume', f'--out_dir={tmp_path}', cwd=tiny_data_root),
                          'no checkpoint at')


def test_resume_with_a_contradicting_architecture_is_one_line(tiny_data_root, finished_run):
    before = digest(finished_run)
    result = run_script('train.py', '--init_from=resume', f'--out_dir={finished_run}', '--n_layer=3',
                        cwd=tiny_data_root)
    assert_one_line_error(result, "resuming with n_layer=3, but the checkpoint's model has n_layer=2")
    result = run_script('train.py', '--init_from=resume', f'--out_dir={finished_run}', '--operator=corridor',
                        cwd=tiny_data_root)
    assert_one_line_error(result, "resuming with operator='corridor'")
    assert digest(finished_run) == before


def test_vocabulary_mismatch_between_checkpoint_and_data_is_one_line(tiny_data_root, finished_run, tmp_path):
    other = tmp_path / 'other_data'
    (tmp_path / 'abc.txt').write_text('abcabcabc' * 500)
    assert run_script('prepare.py', 'text', '--input', tmp_path / 'abc.txt', '--tokenizer', 'char',
                      '--data_root', other, cwd=tmp_path).returncode == 0
    before = digest(finished_run)
    result = run_script('train.py', '--init_from=resume', f'--out_dir={finished_run}', f'--data_root={other}',
                        '--dataset=abc', cwd=tiny_data_root)
    assert_one_line_error(result, "the model's vocabulary (", "does not match the data's (3")
    assert digest(finished_run) == before


# ---------------------------------------------------------------------------------------------- configs

CONFIGS = sorted(p for p in (REPO / 'configs').glob('*.py') if not p.name.startswith('_'))


@pytest.mark.parametrize('path', CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_file_is_a_valid_run_with_every_sweep_variant(path, monkeypatch):
    from lab.studies import VARIANTS, parse_variant
    monkeypatch.chdir(REPO)
    config = parse_config(DEFAULTS, [str(path.relative_to(REPO))])
    assert config['out_dir'] != DEFAULTS['out_dir'], "each config writes its own run folder"
    # the variants are lab/sweep.py's, one definition each; an operator-only config needs something to train
    assert config['operator'] == ('corridor' if config['train_only'] == 'operator' else 'attention')
    for name in VARIANTS:
        keys = parse_variant(name)[1]
        varied = parse_config(DEFAULTS, [str(path.relative_to(REPO)), *(f'--{k}={v!r}' for k, v in keys.items())])
        model = model_config({**varied, 'vocab_size': 50257})  # raises on an impossible operator combination
        assert all(getattr(model, k) == v for k, v in keys.items())
    if path.name.startswith('owt'):  # ~0.5M tokens per iteration on one GPU
        tokens = config['batch_size'] * config['block_size'] * config['gradient_accumulation_steps']
        assert 480_000 <= tokens <= 530_000


def test_every_operator_default_is_the_models_own():
    from dataclasses import fields
    from model import GPTConfig
    from train import OPERATOR_KEYS
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    assert {k: DEFAULTS[k] for k in OPERATOR_KEYS} == {k: defaults[k] for k in OPERATOR_KEYS}
    assert set(OPERATOR_KEYS) == set(defaults) - {'block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd',
                                                  'dropout', 'bias'}


# ---------------------------------------------------------------------------------------------- two runs, one folder

def test_a_second_run_into_a_live_run_folder_is_refused_and_the_first_run_is_untouched(tiny_data_root, tmp_path):
    out = tmp_path / 'out'
    first = subprocess.Popen([sys.executable, str(REPO / 'train.py'), *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}',
                              f'--out_dir={out}', '--max_iters=3000', '--lr_decay_iters=3000', '--eval_interval=100'],
                             cwd=tiny_data_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # until the first checkpoint (iter 100) exists: then a resume has something to read
            if (out / 'ckpt.pt').exists():
                break
            time.sleep(0.1)
        resume = run_script('train.py', '--init_from=resume', f'--out_dir={out}', cwd=tiny_data_root)
        assert_one_line_error(resume, 'is in use by a run that is still training', f'pid {first.pid}')
        fresh = train(tiny_data_root, out, '--max_iters=10', '--overwrite=True')
        assert_one_line_error(fresh, 'is in use by a run that is still training')
        assert first.poll() is None  # still training
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGINT  # stopped cleanly by the Ctrl-C
    iters = [e['iter'] for e in read_log(out)]
    assert iters == sorted(set(iters)) and iters[0] == 0  # one run's log: no duplicated, interleaved iterations
    result = run_script('train.py', '--init_from=resume', f'--out_dir={out}', '--max_iters=' + str(iters[-1] + 100),
                        cwd=tiny_data_root)  # the lock went with the process
    assert result.returncode == 0, result.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- geometry, wandb

def test_walk_interval_logs_per_layer_geometry_and_changes_nothing_else(tiny_data_root, tmp_path):
    common = ['--operator=corridor', '--init_spread=0.2', '--max_iters=40', '--lr_decay_iters=40', '--eval_interval=10',
              '--dropout=0.1']  # dropout: the geometry must not draw from the training's random numbers
    assert train(tiny_data_root, tmp_path / 'plain', *common).returncode == 0
    result = train(tiny_data_root, tmp_path / 'walk', *common, '--walk_interval=20', '--walk_seqs=4')
    assert result.returncode == 0, result.stderr[-2000:]
    plain, walk = read_log(tmp_path / 'plain'), read_log(tmp_path / 'walk')
    assert [{k: v for k, v in e.items() if k != 'walk'} for e in walk] == plain  # bit for bit
    assert [e['iter'] for e in walk if 'walk' in e] == [0, 20, 40]
    for entry in (e for e in walk if 'walk' in e):
        assert set(entry['walk']) == {'attention', 'operator'}  # a corridor run: both parts
        for part in entry['walk'].values():
            assert len(part['drift']) == 1 and len(part['delta_orth']) == 2  # 2 layers
            assert all(math.isfinite(x) for values in part.values() for x in values)
    assert walk[-1]['walk']['operator'] != walk[-1]['walk']['attention']


def test_logged_walk_geometry_is_the_explicit_per_edge_computation(tiny_data_root, tmp_path, monkeypatch):
    """The walk a log line holds, for both parts, against test_walk's naive reference (every edge's d×d Gram built
    in float64) on the model and sequences of that evaluation."""
    import copy
    from lab import connection
    from test_walk import naive_diagnostics
    geometry = connection.walk_geometry
    seen = []
    monkeypatch.setattr(connection, 'walk_geometry', lambda model, idx: (seen.append((copy.deepcopy(model), idx)),
                                                                           geometry(model, idx))[1])
    out = tmp_path / 'out'
    train_in_process(monkeypatch, tiny_data_root, out, '--operator=corridor', '--init_spread=0.3', '--block_size=8',
                     '--max_iters=3', '--eval_interval=3', '--walk_interval=3', '--walk_seqs=2', '--eval_iters=1',
                     '--lr_decay_iters=10')
    model, idx = seen[-1]
    assert idx.shape == (2, 8)
    logged = read_log(out)[-1]['walk']
    model = model.double().eval()
    for part, full_operator in (('attention', False), ('operator', True)):
        naive = naive_diagnostics(model, idx, full_operator=full_operator)
        for key in ('a_eff_fro', 'drift', 'delta_orth', 'delta_orth_trace', 'gram_rel', 'gram_diag_mean',
                    'gram_offdiag_mean'):
            assert logged[part][key] == pytest.approx(naive[key], rel=1e-4), (part, key)


def read_wandb_history(run_file):
    """The history rows of an offline wandb run file: Record protobufs in LevelDB's log framing (7-byte file
    header; records of crc32, little-endian length, type, then data, in 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2
    data, pos, block, pending, rows = run_file.read_bytes(), 7, 32768, b'', []
    assert data[:4] == b':W&B'
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's trailer is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], 'little'), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST fragment of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b''
            if record.WhichOneof('record_type') == 'history':
                rows.append({item.key or '/'.join(item.nested_key): json.loads(item.value_json)  # 'a/b': nested
                             for item in record.history.item})
    return rows


def test_wandb_log_records_what_log_jsonl_records(tiny_data_root, tmp_path):
    pytest.importorskip('wandb')
    out = tmp_path / 'out'
    result = run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={out}',
                        '--operator=corridor', '--max_iters=20', '--lr_decay_iters=20', '--eval_interval=10',
                        '--walk_interval=10', '--walk_seqs=2', '--wandb_log=True', '--wandb_run_name=tiny',
                        cwd=tiny_data_root, env=dict(WANDB_MODE='offline', WANDB_SILENT='true'))
    assert result.returncode == 0, result.stderr[-2000:]
    run_files = list(out.glob('wandb/offline-run-*/run-*.wandb'))
    assert len(run_files) == 1
    rows = {row['_step']: row for row in read_wandb_history(run_files[0]) if 'val/loss' in row}
    log = read_log(out)
    assert sorted(rows) == [e['iter'] for e in log] == [0, 10, 20]
    for entry in log:
        row = rows[entry['iter']]
        assert row['val/loss'] == entry['val_loss'] and row['train/loss'] == entry['train_loss']
        assert row['tokens'] == entry['tokens'] and row['lr'] == pytest.approx(entry['lr'])
        for layer in range(2):
            for head in range(2):
                assert row[f'gamma/L{layer}H{head}'] == entry['gamma'][layer][head]
                assert row[f'delta/L{layer}H{head}'] == entry['delta'][layer][head]
        assert row['walk_operator/delta_orth/L1'] == entry['walk']['operator']['delta_orth'][1]


def test_wandb_log_without_wandb_is_one_line(tiny_data_root, tmp_path):
    fake = tmp_path / 'fake'  # a wandb that cannot be imported
    (fake / 'wandb').mkdir(parents=True)
    (fake / 'wandb' / '__init__.py').write_text('raise ImportError("no wandb here")')
    result = run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={tmp_path / "out"}',
                        '--max_iters=5', '--wandb_log=True', cwd=tiny_data_root, env=dict(PYTHONPATH=str(fake)))
    assert_one_line_error(result, 'wandb_log=True needs the wandb package: pip install wandb')


# ---------------------------------------------------------------------------------------------- GPU path, on CPU

@pytest.mark.parametrize('capability,expected', [((7, 0), 'float16'), ((7, 5), 'float16'), ((8, 0), 'bfloat16'),
                                                 ((9, 0), 'bfloat16')])
def test_auto_dtype_is_bfloat16_only_where_the_gpu_computes_it_natively(monkeypatch, capability, expected):
    from common import resolve_dtype
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda including_emulation=True: True)  # a V100 says yes
    assert resolve_dtype('auto', 'cuda:0') == expected
    assert resolve_dtype('auto', 'cpu') == 'float32' and resolve_dtype('float16', 'cpu') == 'float16'


def test_ddp_with_fewer_eval_batches_than_processes_finishes(tiny_data_root, tmp_path):
    """eval_iters=1 under 2 processes: one evaluates, the other has no share and must not wait for it."""
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    ddp = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                          str(REPO / 'train.py'), *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}',
                          f'--out_dir={tmp_path / "ddp"}', '--operator=laplacian',  # fixed buffers
                          '--max_iters=6', '--eval_interval=2', '--eval_iters=1', '--lr_decay_iters=6',
                          '--gradient_accumulation_steps=2'],
                         cwd=tiny_data_root, capture_output=True, text=True, env={**env, 'OMP_NUM_THREADS': '1'},
                         timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert [e['iter'] for e in read_log(tmp_path / 'ddp')] == [0, 2, 4, 6]


def test_a_resumed_run_lets_go_of_the_checkpoint_before_training(tiny_data_root, finished_run, monkeypatch):
    """The loaded checkpoint (a host copy of the weights and optimizer moments: GBs at GPT-2 size, per process)
    is no longer referenced once training starts."""
    import gc
    import weakref
    import train as train_module

    class Checkpoint(dict):
        pass
    loaded, alive_at_saves = [], []

    def load(path, map_location='cpu', **kwargs):
        ckpt = Checkpoint(torch.load(path, map_location=map_location, weights_only=True))
        loaded.append(weakref.ref(ckpt))
        return ckpt

    def save(obj, path):
        gc.collect()
        alive_at_saves.append(loaded[0]() is not None)
    monkeypatch.setattr(train_module, 'load_checkpoint', load)
    monkeypatch.setattr(train_module, 'save_checkpoint', save)
    monkeypatch.setattr(signal, 'signal', lambda *args: None)  # in-process: leave pytest's handlers alone
    train_module.main(['--init_from=resume', f'--out_dir={finished_run}', '--max_iters=30'])
    assert len(loaded) == 1 and alive_at_saves and not any(alive_at_saves)


# ---------------------------------------------------------------------------------------------- starts from weights

def in_process(argv, capsys):
    """(exit status, stderr) of train.py with argv, as the command line ends it (conftest.run_in_process)."""
    import train as train_module
    return run_in_process(train_module.main, argv, capsys)


def suggested(err):
    """The flags a refusal suggests passing ('pass --k=v --k2=v2 or ...')."""
    return err.split('; pass ')[1].split(' or ')[0].split()


def test_init_from_a_corridor_run_folder_keeps_its_operator_or_says_what_to_pass(trained_run, tiny_data_root, tmp_path,
                                                                                capsys, monkeypatch):
    monkeypatch.setattr(signal, 'signal', lambda *args: None)
    common = [f'--init_from={trained_run}', f'--data_root={tiny_data_root}', '--dataset=tiny', '--device=cpu',
              '--compile=False', '--block_size=32', '--batch_size=4', '--gradient_accumulation_steps=1',
              '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--warmup_iters=0', '--lr_decay_iters=2']
    status, err = in_process([*common, f'--out_dir={tmp_path / "a"}'], capsys)
    assert status == 0, err[-2000:]
    assert json.loads((tmp_path / 'a' / 'config.json').read_text())['operator'] == 'corridor'
    status, err = in_process([*common, '--operator=alpha', f'--out_dir={tmp_path / "b"}'], capsys)
    assert status == 2 and "operator='corridor'" in err and '--operator' in err, err
    # a key set to its default is set: attention (the default) on a corridor folder's weights is refused too, in a
    # config file as on the command line, and a set key equal to the folder's is honoured
    (tmp_path / 'attention.py').write_text("operator = 'attention'\n")
    for k, args in enumerate((['--operator=attention'], [str(tmp_path / 'attention.py')], ['--init_spread=0.0'])):
        status, err = in_process([*args, *common, f'--out_dir={tmp_path / "c"}'], capsys)
        assert status == 2 and err.count('\n') == 1 and 'set, but' in err and 'was trained with' in err, (args, err)
        assert not (tmp_path / 'c').exists()
        # the flags the line suggests, passed as it says, start the run (a config file's key overridden)
        status, err = in_process([*args, *common, *suggested(err), f'--out_dir={tmp_path / f"s{k}"}'], capsys)
        assert status == 0, (args, err[-2000:])
    status, err = in_process([*common, '--operator=corridor', '--init_spread=0.2', f'--out_dir={tmp_path / "d"}'],
                             capsys)
    assert status == 0, err[-2000:]


def test_init_from_weights_keeps_their_shape_and_refuses_a_set_key_that_differs(trained_run, tiny_data_root, tmp_path,
                                                                               capsys, monkeypatch):
    """The architecture comes from the weights; a key set to the weights' value is honoured, any other value (the
    default included) is one line, not replaced by the weights' value."""
    monkeypatch.setattr(signal, 'signal', lambda *args: None)
    common = [f'--init_from={trained_run}', f'--data_root={tiny_data_root}', '--dataset=tiny', '--device=cpu',
              '--compile=False', '--block_size=32', '--batch_size=4', '--gradient_accumulation_steps=1',
              '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--warmup_iters=0', '--lr_decay_iters=2']
    for wrong, fragment in (('--n_layer=12', 'n_layer=12 set'), ('--n_embd=768', 'n_embd=768 set'),
                            ('--bias=True', 'bias=True set')):
        status, err = in_process([*common, wrong, f'--out_dir={tmp_path / "no"}'], capsys)
        assert status == 2 and fragment in err and "weights have" in err, (wrong, err)
        status, err = in_process([*common, wrong, *suggested(err), f'--out_dir={tmp_path / wrong[2:]}'], capsys)
        assert status == 0, (wrong, err[-2000:])
    status, err = in_process([*common, '--n_layer=2', '--bias=False', f'--out_dir={tmp_path / "a"}'], capsys)
    assert status == 0, err[-2000:]
    assert json.loads((tmp_path / 'a' / 'config.json').read_text())['n_embd'] == 32  # the weights', not the default


def test_a_start_from_a_run_folder_takes_the_configured_operator_lr_mult_not_the_folders(tiny_data_root, tmp_path,
                                                                                          capsys, monkeypatch):
    """operator_lr_mult is a training setting: a folder trained at 3 gives its weights, and the new run trains its
    scalars at the multiplier configured now (1, the default, when unset; 2 when passed), in its optimizer, its
    config.json and its checkpoint's model_args."""
    monkeypatch.setattr(signal, 'signal', lambda *args: None)
    common = [f'--data_root={tiny_data_root}', '--dataset=tiny', '--device=cpu', '--compile=False', '--n_layer=1',
              '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=2', '--gradient_accumulation_steps=1',
              '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--warmup_iters=0', '--lr_decay_iters=2']
    first = tmp_path / 'x3'
    status, err = in_process([*common, '--operator=corridor', '--operator_lr_mult=3.0', f'--out_dir={first}'], capsys)
    assert status == 0, err[-2000:]
    groups = []
    real = torch.optim.AdamW
    monkeypatch.setattr(torch.optim, 'AdamW', lambda params, **kw: groups.append(params) or real(params, **kw))
    for name, args, expected in (('unset', [], 1.0), ('passed', ['--operator_lr_mult=2.0'], 2.0)):
        out = tmp_path / name
        status, err = in_process([*common, f'--init_from={first}', *args, f'--out_dir={out}'], capsys)
        assert status == 0, err[-2000:]
        scalars = groups[-1][-1]  # the last group: the operator's γ and δ of the one layer, [n_head] each
        assert [p.shape for p in scalars['params']] == [(2,), (2,)] and scalars['lr_mult'] == expected, name
        assert json.loads((out / 'config.json').read_text())['operator_lr_mult'] == expected
        assert torch.load(out / 'ckpt.pt', weights_only=True)['model_args']['operator_lr_mult'] == expected


# ---------------------------------------------------------------------------------------------- a sixth operator

def test_a_sixth_operator_is_one_table_entry(tiny_data_root, tmp_path, monkeypatch):
    """The README's "How to add an operator", as written: one OPERATORS entry, then train it, sweep it."""
    import model
    from lab import studies
    import train as train_module
    bounded = model.OperatorForm(  # γ = tanh(θ) stays inside (−1, 1), δ = 1
        params=('theta',), learnable=True,
        init=lambda gamma0, delta0, config: (torch.atanh(gamma0),),
        coefficients=lambda theta: (torch.tanh(theta), torch.ones_like(theta)), keys=model.START)
    name = 'testonly_bounded'  # not docs/operators.md's 'bounded': a user who adds it keeps this test passing
    monkeypatch.setitem(model.OPERATORS, name, bounded)
    monkeypatch.setitem(studies.VARIANTS, name, lambda: dict(operator=name))
    monkeypatch.setattr(signal, 'signal', lambda *args: None)  # in-process: leave pytest's handlers alone
    torch.manual_seed(0)
    net = model.GPT(model.GPTConfig(block_size=8, vocab_size=20, n_layer=2, n_head=2, n_embd=8, operator=name,
                                    gamma_init=-0.3, init_spread=0.2)).eval()
    idx = torch.randint(0, 20, (2, 8))
    torch.testing.assert_close(net(idx)[0], net.forward_with_probs(idx)[0])  # both paths, no other change
    gamma, delta = model.gamma_delta(net.operator_coefficients())
    assert ((gamma > -0.5) & (gamma < -0.1)).all() and (delta == 1).all()
    out = tmp_path / 'bounded'
    args = studies.parse_variant(name)[1]
    train_module.main([*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={out}', '--max_iters=2',
                       '--eval_interval=2', *(f'--{k}={v}' for k, v in args.items()), '--gamma_init=-0.2'])
    log = read_log(out)
    assert [e['iter'] for e in log] == [0, 2]
    assert log[0]['gamma'] != log[1]['gamma']  # θ learnt in two steps
    assert all(-1 < g < 0 for row in log[1]['gamma'] for g in row)


# ---------------------------------------------------------------------------------------------- faults at the edges

@pytest.mark.parametrize('first_save', [True, False], ids=['no-checkpoint-yet', 'after-a-checkpoint'])
def test_a_save_on_a_full_disk_stops_in_one_line_and_lets_go_of_the_run_folder(tiny_data_root, tmp_path, monkeypatch,
                                                                               first_save):
    import fcntl
    import train as train_module
    from test_common import disk_with_room
    out = tmp_path / 'out'
    monkeypatch.setattr(signal, 'signal', lambda *args: None)  # in-process: leave pytest's handlers alone
    fresh = [*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={out}', '--eval_interval=10']
    if not first_save:
        train_module.main([*fresh, '--max_iters=10'])
        before = (out / 'ckpt.pt').read_bytes()
    disk_with_room(monkeypatch, 5000, filling=lambda path: path.endswith('.pt.tmp'))  # fills part-way through
    args = fresh if first_save else ['--init_from=resume', f'--out_dir={out}']
    with pytest.raises(__import__('run').TrainingStopped) as stopped:
        train_module.main([*args, '--max_iters=20'])
    message = str(stopped.value)
    assert '\n' not in message and f"could not write {out / 'ckpt.pt'}" in message and 'No space left' in message
    if first_save:
        assert 'no checkpoint was saved' in message and 'start the run again' in message
        assert not (out / 'ckpt.pt').exists()
    else:
        assert f"{out / 'ckpt.pt'} from iter 10 is intact" in message
        assert f"--init_from=resume --out_dir={out} --max_iters=20`" in message
        assert (out / 'ckpt.pt').read_bytes() == before
    assert not list(out.glob('*.tmp'))
    with open(out / 'train.lock') as lock:  # the failed run let go of the folder (in this same process)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.skipif(sys.platform != 'linux', reason='RLIMIT_FSIZE and SIGXFSZ as on Linux')
def test_a_full_disk_at_a_save_is_one_line_and_the_resumed_run_continues_exactly(tiny_data_root, tmp_path):
    """The kernel refuses the checkpoint's bytes (RLIMIT_FSIZE, a file size limit that needs no root: EFBIG, as a
    full disk gives ENOSPC) at iter 20, after its evaluation was logged; once there is room again, the resume from
    iter 10 logs iter 20 again, the same numbers, once."""
    import resource
    cut = tmp_path / 'cut'
    assert train(tiny_data_root, cut, '--operator=corridor', '--eval_interval=10', '--lr_decay_iters=20',
                 '--max_iters=10').returncode == 0

    def small_files_only():  # the checkpoint is ~400 kB; config.json and log.jsonl still fit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
    full = subprocess.run([sys.executable, str(REPO / 'train.py'), '--init_from=resume', f'--out_dir={cut}',
                           '--max_iters=20'], cwd=tiny_data_root, capture_output=True, text=True,
                          preexec_fn=small_files_only, timeout=300)
    resume = f"python {REPO / 'train.py'} --init_from=resume --out_dir={cut} --max_iters=20"
    assert_one_line_error(full, f"could not write {cut / 'ckpt.pt'} (File too large",
                          f"{cut / 'ckpt.pt'} from iter 10 is intact: continue with `{resume}`")
    assert sorted(p.name for p in cut.iterdir()) == ['ckpt.pt', 'config.json', 'log.jsonl', 'train.lock']
    logged_before_the_failure = read_log(cut)
    assert [e['iter'] for e in logged_before_the_failure] == [0, 10, 20]
    result = run_script(*resume.split()[1:], cwd=tiny_data_root)  # the command the error line gives
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_log(cut) == logged_before_the_failure


def child_with_rank(parent_pid, rank):
    """The pid of torchrun's worker process with RANK=rank, or None (Linux: /proc)."""
    for entry in Path('/proc').iterdir():
        try:
            if entry.name.isdigit() and int((entry / 'stat').read_text().rsplit(')', 1)[1].split()[1]) == parent_pid \
                    and f'RANK={rank}'.encode() in (entry / 'environ').read_bytes().split(b'\0'):
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            pass
    return None


@pytest.mark.skipif(sys.platform != 'linux', reason='finds the worker to kill through /proc')
def test_a_ddp_rank_whose_peer_was_killed_says_so_in_one_line_naming_the_checkpoint(tiny_data_root, tmp_path):
    out = tmp_path / 'ddp'
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    launcher = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                                 str(REPO / 'train.py'), *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}',
                                 f'--out_dir={out}', '--max_iters=100000', '--lr_decay_iters=100000',
                                 '--eval_interval=10', '--eval_iters=1', '--gradient_accumulation_steps=2'],
                                cwd=tiny_data_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**env, 'OMP_NUM_THREADS': '1'}, start_new_session=True)
    try:
        for _ in range(1200):  # the first checkpoint (iter 10) is on disk: training goes on past it
            if (out / 'ckpt.pt').exists() or launcher.poll() is not None:
                break
            time.sleep(0.1)
        rank1 = child_with_rank(launcher.pid, 1)
        assert rank1 is not None and launcher.poll() is None, launcher.stderr.read()[-3000:] if launcher.poll() else ''
        os.kill(rank1, signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0
    ours = [line for line in stderr.splitlines() if line.startswith('error: ') or line.startswith('[rank0]')]
    saved_at = torch.load(out / 'ckpt.pt', weights_only=True)['iter_num']
    assert len(ours) == 1, stderr[-3000:]
    assert ours[0].startswith('error: rank 0 of 2 lost another process of the run (')
    assert f"{out / 'ckpt.pt'} from iter {saved_at} is intact" in ours[0]
    assert f"torchrun --standalone --nproc_per_node=2 {REPO / 'train.py'} --init_from=resume --out_dir={out}`" in ours[0]
    assert 'FutureWarning' not in stderr


def test_ddp_never_syncs_the_fixed_operator_scalars_after_construction(tmp_path, monkeypatch):
    """DDP's per-forward buffer broadcast counted (dist._broadcast_coalesced) in a one-process gloo group: none with
    train.py's setting, while DDP's default broadcasts before every forward (the counter works); and the setting
    warns nothing (broadcast_buffers=False is deprecated in torch 2.13)."""
    import warnings
    import torch.distributed as dist
    import run
    from model import GPT, GPTConfig
    broadcasts, broadcast = [], dist._broadcast_coalesced
    monkeypatch.setattr(dist, '_broadcast_coalesced', lambda *args, **kwargs: (broadcasts.append(1),
                                                                                broadcast(*args, **kwargs))[1])
    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "store"}', rank=0, world_size=1)
    try:
        def steps_broadcast(wrap):
            torch.manual_seed(0)
            net = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, operator='corridor',
                                gamma_init=-0.2, init_spread=0.2, learn_gamma=False))
            fixed = {name: b.clone() for name, b in net.named_buffers()}
            assert fixed, "the test needs fixed operator scalars (buffers)"
            with warnings.catch_warnings():
                warnings.simplefilter('error')
                model = wrap(net)
            before = len(broadcasts)
            for _ in range(3):
                idx = torch.randint(0, 16, (2, 8))
                model(idx, idx)[1].backward()
            assert all(torch.equal(b, fixed[name]) for name, b in net.named_buffers())
            return len(broadcasts) - before
        assert steps_broadcast(lambda net: run.wrap_ddp(net, 'cpu')) == 0
        assert steps_broadcast(lambda net: torch.nn.parallel.DistributedDataParallel(net)) == 3
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- the loop's pieces

def test_learning_rate_warms_up_linearly_then_follows_a_cosine_to_min_lr():
    """Hand values: learning_rate 1, min_lr 0.1, 10 warmup iterations, decay over iterations 10 … 110."""
    from types import SimpleNamespace
    from train import get_lr
    cfg = SimpleNamespace(decay_lr=True, learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110)
    warmup = [get_lr(it, cfg) for it in range(11)]
    assert warmup[0] == pytest.approx(1 / 11) and warmup[4] == pytest.approx(5 / 11)  # never 0: the first step moves
    assert all(b - a == pytest.approx(1 / 11) for a, b in zip(warmup, warmup[1:]))  # linear, up to the peak
    assert warmup[10] == pytest.approx(1.0)
    # cosine: min_lr + (1 + cos(π·progress)) / 2 · (learning_rate − min_lr)
    assert get_lr(35, cfg) == pytest.approx(0.1 + 0.9 * 0.8535534)   # a quarter: (1 + 1/√2) / 2
    assert get_lr(60, cfg) == pytest.approx(0.55)                   # halfway
    assert get_lr(85, cfg) == pytest.approx(0.1 + 0.9 * 0.1464466)  # three quarters: (1 − 1/√2) / 2
    assert get_lr(110, cfg) == pytest.approx(0.1) and get_lr(5000, cfg) == 0.1
    assert get_lr(35, SimpleNamespace(**{**vars(cfg), 'decay_lr': False})) == 1.0


def train_in_process(monkeypatch, data_root, out, *args):
    import train as train_module
    monkeypatch.setattr(signal, 'signal', lambda *a: None)  # in-process: leave pytest's handlers alone
    train_module.main([*TINY_TRAIN_ARGS, f'--data_root={data_root}', f'--out_dir={out}', *args])


def test_every_variant_sees_the_same_batches_with_the_same_seed(tiny_data_root, tmp_path, monkeypatch):
    """Pairing variants by seed compares operators, not data orders: the batches (training and evaluation) do not
    depend on the operator, nor on how many random numbers building its model drew (init_spread)."""
    import train as train_module
    batch = train_module.Data.batch
    seen = []
    monkeypatch.setattr(train_module.Data, 'batch', lambda self, split, offsets: (seen.append((split, offsets.tolist())),
                                                                                  batch(self, split, offsets))[1])
    runs = {}
    for name, args in (('attention', ['--operator=attention']), ('corridor', ['--operator=corridor', '--init_spread=0.3']),
                       ('other seed', ['--operator=attention', '--seed=7'])):
        seen.clear()
        train_in_process(monkeypatch, tiny_data_root, tmp_path / name, *args, '--max_iters=4', '--eval_interval=4',
                         '--eval_iters=1', '--lr_decay_iters=10', '--dropout=0.1')
        runs[name] = list(seen)
    assert [s for s, _ in runs['attention']].count('train') >= 4 + 2  # 4 steps; 2 evaluations of 1 batch (at least)
    assert runs['corridor'] == runs['attention']
    assert runs['other seed'] != runs['attention']


def test_grad_clip_bounds_the_gradient_norm_of_every_step(tiny_data_root, tmp_path, monkeypatch):
    """The global gradient norm (float64, over every parameter) at the optimizer step is at most grad_clip, and
    exactly grad_clip where it was larger; without clipping it is larger here."""
    step = torch.amp.GradScaler.step
    norms = []

    def measured_step(self, optimizer, *args, **kwargs):
        grads = [p.grad.double() for group in optimizer.param_groups for p in group['params'] if p.grad is not None]
        norms.append(torch.cat([g.flatten() for g in grads]).norm().item())
        return step(self, optimizer, *args, **kwargs)
    monkeypatch.setattr(torch.amp.GradScaler, 'step', measured_step)
    common = ['--operator=corridor', '--max_iters=3', '--eval_interval=3', '--eval_iters=1', '--lr_decay_iters=10']
    train_in_process(monkeypatch, tiny_data_root, tmp_path / 'free', *common, '--grad_clip=0.0')
    free, norms[:] = list(norms), []
    train_in_process(monkeypatch, tiny_data_root, tmp_path / 'clipped', *common, '--grad_clip=0.05')
    assert len(free) == len(norms) == 3
    assert free[0] > 0.2  # so the clip below binds
    assert norms[0] == pytest.approx(0.05, rel=1e-5) and all(n <= 0.05 * (1 + 1e-5) for n in norms)


def start_training(data_root, out, *args):
    process = subprocess.Popen([sys.executable, str(REPO / 'train.py'), *TINY_TRAIN_ARGS, f'--data_root={data_root}',
                                f'--out_dir={out}', '--max_iters=100000', '--lr_decay_iters=100000', *args],
                               cwd=data_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):  # until the first evaluation is logged: the loop, and its signal handlers, are running
        if (out / 'log.jsonl').exists() and (out / 'log.jsonl').read_text():
            break
        time.sleep(0.05)
    time.sleep(0.3)
    return process


def test_sigterm_saves_at_an_iteration_boundary_and_stops(tiny_data_root, tmp_path):
    """What a cluster's scheduler sends before it kills a job."""
    out = tmp_path / 'out'
    process = start_training(tiny_data_root, out, '--eval_interval=100000')
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]  # a scheduler can tell it did not finish
    stopped_at = int(stdout.split('stopped at iter ')[1].split(';')[0])
    assert 0 < stopped_at < 100000
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == stopped_at


def test_a_second_signal_aborts_at_once_without_saving(tiny_data_root, tmp_path):
    """Ctrl-C then another (here SIGINT then SIGTERM, which the kernel cannot merge into one): no graceful stop."""
    out = tmp_path / 'out'
    process = start_training(tiny_data_root, out, '--eval_interval=100000')
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode != 0 and 'KeyboardInterrupt' in stderr
    assert 'stopped at iter' not in stdout and not (out / 'ckpt.pt').exists()


def test_eval_only_changes_nothing_and_a_resume_drops_log_lines_past_the_checkpoint(finished_run, monkeypatch,
                                                                                      capsys):
    """One finished run (iters 0 and 10 logged, checkpoint at 10), two behaviours. eval_only prints the losses the
    log holds and touches no file. Then a crash between a log line and its checkpoint, faked: the resumed run
    repeats that evaluation, and the stale line (and one torn by the crash) must not stay beside the new one."""
    import train as train_module
    monkeypatch.setattr(signal, 'signal', lambda *a: None)  # in-process: leave pytest's handlers alone
    before = digest(finished_run)
    train_module.main(['--init_from=resume', f'--out_dir={finished_run}', '--eval_only=True'])
    last = read_log(finished_run)[-1]
    assert f"iter 10: train loss {last['train_loss']:.4f}, val loss {last['val_loss']:.4f}" in capsys.readouterr().out
    assert digest(finished_run) == before

    with open(finished_run / 'log.jsonl', 'a') as f:
        f.write(json.dumps({**last, 'iter': 20, 'val_loss': 99.0}) + '\n' + '{"iter": 25, "val_lo')  # as train.py writes
    train_module.main(['--init_from=resume', f'--out_dir={finished_run}', '--max_iters=20'])
    log = read_log(finished_run)
    assert [e['iter'] for e in log] == [0, 10, 20] and log[-1]['val_loss'] < 99


def test_snapshots_at_their_interval_and_overwrite_removes_an_old_runs_checkpoints(tiny_data_root, tmp_path,
                                                                                    monkeypatch):
    out = tmp_path / 'out'
    train_in_process(monkeypatch, tiny_data_root, out, '--max_iters=10', '--eval_interval=5', '--snapshot_interval=10',
                     '--eval_iters=1')
    snapshots = sorted(p.name for p in out.glob('ckpt_*.pt'))
    assert 'ckpt_0000010.pt' in snapshots and 'ckpt_0000005.pt' not in snapshots
    snapshot, last = (torch.load(out / name, weights_only=True) for name in ('ckpt_0000010.pt', 'ckpt.pt'))
    assert snapshot['iter_num'] == last['iter_num'] == 10
    assert all(torch.equal(snapshot['model'][k], v) for k, v in last['model'].items())
    train_in_process(monkeypatch, tiny_data_root, out, '--max_iters=5', '--eval_interval=5', '--eval_iters=1',
                     '--overwrite=True')
    assert sorted(p.name for p in out.glob('ckpt*.pt')) == ['ckpt.pt']  # the old run's snapshots are gone too
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 5
    assert [e['iter'] for e in read_log(out)] == [0, 5]


# ---------------------------------------------------------------------------------------------- the quick start

def test_train_prepares_shakespeare_char_itself_when_its_folder_is_missing(tmp_path):
    """The quick start's one command: data/shakespeare_char missing -> one line, prepare.py runs on the shipped text,
    training starts, with no network (a download attempted would fail here: urlopen is made to raise)."""
    hook = tmp_path / 'offline'
    hook.mkdir()
    (hook / 'sitecustomize.py').write_text(
        "import urllib.request\n"
        "def refuse(*a, **k):\n    raise OSError('no network in this test')\n"
        "urllib.request.urlopen = refuse\n")
    result = run_script('train.py', REPO / 'configs' / 'shakespeare_char.py',
                        '--data_root=data', '--out_dir=out', '--max_iters=2', '--eval_interval=2', '--eval_iters=1',
                        '--n_layer=1', '--n_embd=16', '--n_head=2', cwd=tmp_path, env={'PYTHONPATH': str(hook)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "data/shakespeare_char is missing: preparing it first (python prepare.py shakespeare_char" in result.stdout
    meta = json.loads((tmp_path / 'data' / 'shakespeare_char' / 'meta.json').read_text())
    assert meta['vocab_size'] == 65 and meta['train_tokens'] == 1_003_854  # nanoGPT's split of the real text
    assert [e['iter'] for e in read_log(tmp_path / 'out')] == [0, 2]
    again = run_script('train.py', str(REPO / 'configs' / 'shakespeare_char.py'), '--data_root=data', '--out_dir=out2',
                       '--max_iters=0', '--n_layer=1', '--n_embd=16', '--n_head=2', cwd=tmp_path)
    assert again.returncode == 0 and 'preparing' not in again.stdout  # prepared once


# ------------------------------------------------------------------------------------------------------------
# a pretrained transformers model (lab/pretrained.py's PretrainedLM): operator-only fine-tuning

@pytest.fixture(scope='module')
def tiny_pretrained(tmp_path_factory):
    """(root, model folder, dataset name): a random tiny Llama (4 query heads on 2 KV heads) saved as a transformers
    folder with a word-level tokenizer, and WikiText-2-shaped files prepared with that tokenizer by prepare.py."""
    root = tmp_path_factory.mktemp('pretrained')
    return (root, *tiny_llama_and_its_wikitext(root, train_sentences=600, test_sentences=300))


def train_pretrained(tiny_pretrained, out, *args):
    root, model_dir, dataset = tiny_pretrained
    return run_script('train.py', '--device=cpu', '--compile=False', f'--init_from={model_dir}', f'--dataset={dataset}',
                      f'--data_root={root}', f'--out_dir={out}', '--block_size=16', '--batch_size=4',
                      '--gradient_accumulation_steps=1', '--learning_rate=2e-2', '--warmup_iters=2', '--eval_iters=2',
                      '--log_interval=5', '--eval_interval=5', '--dtype=float32', *args, cwd=root)


def test_operator_only_fine_tuning_trains_the_scalars_saves_only_them_and_resumes_exactly(tiny_pretrained, tmp_path):
    root, model_dir, dataset = tiny_pretrained
    meta = json.loads((root / dataset / 'meta.json').read_text())
    assert meta['tokenizer'] == 'hf' and meta['tokenizer_source'] == str(model_dir)
    common = ['--operator=corridor', '--train_only=operator', '--lr_decay_iters=20']
    whole, parts = tmp_path / 'whole', tmp_path / 'parts'
    result = train_pretrained(tiny_pretrained, whole, *common, '--max_iters=20')
    assert result.returncode == 0, result.stderr[-3000:]
    assert train_pretrained(tiny_pretrained, parts, *common, '--max_iters=10').returncode == 0
    resumed = run_script('train.py', '--init_from=resume', f'--out_dir={parts}', '--max_iters=20', cwd=root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (whole / 'log.jsonl').read_text() == (parts / 'log.jsonl').read_text()

    log = read_log(whole)
    assert log[0]['gamma'] == [[0.0] * 4] * 2 and log[-1]['gamma'] != log[0]['gamma']  # γ moved from 0
    ckpt = torch.load(whole / 'ckpt.pt', weights_only=True)
    assert (ckpt['source'], ckpt['weights']) == (str(model_dir), 'operator')
    assert sorted(ckpt['model']) == [f'lm.model.layers.{l}.self_attn.coefficients.{n}' for l in (0, 1)
                                     for n in ('delta', 'gamma')]  # the scalars only: the frozen weights stay out
    # the frozen weights are the source's: the model rebuilt from the checkpoint has them and the trained scalars
    import transformers
    from sources import load_model
    model, _ = load_model(str(whole))
    source = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    for name, p in source.named_parameters():
        assert torch.equal(dict(model.lm.named_parameters())[name], p), name
    torch.testing.assert_close(model.operator_coefficients()[..., 1], torch.tensor(log[-1]['c_P']))

    sample = run_script('sample.py', f'--out_dir={whole}', '--start=the cat', '--num_samples=1', '--max_new_tokens=5',
                        '--device=cpu', cwd=root)
    assert sample.returncode == 0 and sample.stdout.startswith('the cat'), sample.stderr[-2000:]


def test_bad_pretrained_setups_are_one_line(tiny_pretrained, tiny_data_root, tmp_path):
    root, model_dir, dataset = tiny_pretrained
    # data tokenized with another tokenizer (characters), even of another size
    result = train_pretrained(tiny_pretrained, tmp_path / 'a', '--max_iters=2', f'--data_root={tiny_data_root}',
                              '--dataset=tiny')
    assert_one_line_error(result, "was tokenized with char's tokenizer", f'--tokenizer={model_dir}')
    result = train_pretrained(tiny_pretrained, tmp_path / 'b', '--max_iters=2', '--train_only=operator')
    assert_one_line_error(result, "operator='attention' has no learnable scalars")
    result = run_script('train.py', *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={tmp_path / "c"}',
                        '--train_only=operator', cwd=tiny_data_root)
    assert_one_line_error(result, "train_only='operator' freezes pretrained weights: give --init_from=SOURCE")
    result = train_pretrained(tiny_pretrained, tmp_path / 'd', '--max_iters=2', '--vocab_size=64')
    assert_one_line_error(result, 'vocab_size comes from the data')
    (tmp_path / 'encoder').mkdir()
    (tmp_path / 'encoder' / 'config.json').write_text('{"model_type": "bert"}')
    result = train_pretrained(tiny_pretrained, tmp_path / 'e', '--max_iters=2', f'--init_from={tmp_path / "encoder"}')
    assert_one_line_error(result, 'is a bert model, not a causal LM')


def test_uint32_token_files_train_exactly_as_uint16_ones(tiny_data_root, tmp_path):
    """meta.json's dtype: the same tokens stored as uint32 (prepare.py's format past 65,536 tokens) give the same run."""
    import shutil
    import numpy as np
    wide = tmp_path / 'data'
    shutil.copytree(tiny_data_root / 'tiny', wide / 'tiny')
    for split in ('train', 'val'):
        tokens = np.fromfile(tiny_data_root / 'tiny' / f'{split}.bin', dtype=np.uint16)
        (wide / 'tiny' / f'{split}.bin').write_bytes(tokens.astype(np.uint32).tobytes())
    meta = json.loads((wide / 'tiny' / 'meta.json').read_text())
    (wide / 'tiny' / 'meta.json').write_text(json.dumps({**meta, 'dtype': 'uint32'}))
    args = ['--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--eval_iters=2']
    assert train(tiny_data_root, tmp_path / 'narrow', *args).returncode == 0
    result = train(wide, tmp_path / 'wide', *args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_log(tmp_path / 'narrow') == read_log(tmp_path / 'wide')


# ---------------------------------------------------------------------------------------------- batches, accumulation

def tiny_data(data_root, **overrides):
    """train.Data on the tiny dataset, as train.py builds it."""
    from types import SimpleNamespace
    from train import Data
    cfg = SimpleNamespace(**{**dict(data_root=str(data_root), dataset='tiny', block_size=32, batch_size=8), **overrides})
    return Data(cfg.data_root, cfg.dataset, cfg.block_size, cfg.batch_size, 'cpu'), cfg


def test_batch_targets_are_the_inputs_shifted_by_one_token(tiny_data_root):
    """y is x one position on, read from the token file by hand: y[:, :-1] = x[:, 1:] and y[:, -1] is the token
    just after the window; every offset leaves room for that token."""
    import numpy as np
    data, cfg = tiny_data(tiny_data_root)
    tokens = np.fromfile(tiny_data_root / 'tiny' / 'train.bin', dtype=np.uint16).astype(np.int64)
    offsets = data.offsets('train', 500, torch.Generator().manual_seed(0))
    assert offsets.shape == (500, 8)
    assert offsets.min() >= 0 and offsets.max() + cfg.block_size + 1 <= len(tokens)
    x, y = data.batch('train', offsets[3])
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    for row, start in enumerate(offsets[3].tolist()):
        assert x[row].tolist() == tokens[start:start + 32].tolist()
        assert y[row].tolist() == tokens[start + 1:start + 33].tolist()
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert y[:, -1].tolist() == [tokens[start + 32] for start in offsets[3].tolist()]


def write_tokens(folder, train, val):
    """A char dataset of 4 letters with these token ids in train.bin and val.bin (uint16, as prepare.py writes)."""
    import numpy as np
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'meta.json').write_text(json.dumps(dict(tokenizer='char', vocab_size=4, itos=list('abcd'))))
    for split, ids in (('train', train), ('val', val)):
        np.array(ids, dtype=np.uint16).tofile(folder / f'{split}.bin')


@pytest.mark.parametrize('block_size', [1, 8])
def test_each_split_needs_one_token_more_than_block_size_whatever_the_batch_size(tmp_path, block_size):
    """A window is block_size inputs and, one on, their targets: block_size + 1 tokens are exactly enough (one offset,
    0, drawn batch_size times), block_size tokens are one line naming the split, in train.bin and in val.bin."""
    from common import UserError
    from train import Data
    enough = [i % 4 for i in range(block_size + 1)]
    write_tokens(tmp_path / 'exact', enough, enough)
    data = Data(str(tmp_path), 'exact', block_size, 16, 'cpu')  # batch_size 16 > the tokens: drawn with replacement
    for split in ('train', 'val'):
        offsets = data.offsets(split, 3, torch.Generator().manual_seed(0))
        assert offsets.shape == (3, 16) and (offsets == 0).all()
        x, y = data.batch(split, offsets[0])
        assert x[0].tolist() == enough[:-1] and y[0].tolist() == enough[1:]
    short, plenty = enough[:-1], [i % 4 for i in range(100)]
    for split, train, val in (('train', short, plenty), ('val', plenty, short)):
        write_tokens(tmp_path / split, train, val)
        with pytest.raises(UserError) as e:
            Data(str(tmp_path), split, block_size, 1, 'cpu')
        assert str(e.value) == (f"block_size={block_size} needs more tokens than that, but "
                                f"{tmp_path / split / f'{split}.bin'} has {block_size} tokens")


def record_steps(capsys, data_root, out, *args):
    """Train in this process; returns (the gradient of every parameter at each optimizer step, in float64, the
    training batches drawn (offsets), the window losses the log lines print, each step's (lr, lr_mult, size) per group).
    A training batch is one an optimizer step reads: whatever else reads batches (an evaluation, a diagnostic) is not
    counted, so a new one changes nothing here."""
    import train as train_module
    batch, step, optimizer_step = train_module.Data.batch, torch.amp.GradScaler.step, train_module.optimizer_step
    grads, batches, in_step, lrs = [], [], [], []

    def recording_step(self, optimizer, *a, **kw):
        grads.append([p.grad.double().clone() for g in optimizer.param_groups for p in g['params']])
        lrs.append([(g['lr'], g['lr_mult'], len(g['params'])) for g in optimizer.param_groups])
        return step(self, optimizer, *a, **kw)

    def training_step(*a, **kw):
        in_step.append(1)
        try:
            return optimizer_step(*a, **kw)
        finally:
            in_step.pop()

    def recording_batch(self, split, offsets):
        if in_step and split == 'train':
            batches.append(offsets.tolist())
        return batch(self, split, offsets)
    with pytest.MonkeyPatch.context() as m:  # undone before the next run records its own
        m.setattr(train_module, 'optimizer_step', training_step)
        m.setattr(train_module.Data, 'batch', recording_batch)
        m.setattr(torch.amp.GradScaler, 'step', recording_step)
        capsys.readouterr()
        train_in_process(m, data_root, out, *args)
    printed = [float(line.split('loss ')[1].split(',')[0]) for line in capsys.readouterr().out.splitlines()
               if line.startswith('iter ') and ': batch loss ' in line]
    return grads, batches, printed, lrs


def test_gradient_accumulation_averages_micro_batches(tiny_data_root, tmp_path, capsys):
    """4 micro-batches of 8 sequences give the gradient (and the logged loss) of one batch of the same 32
    sequences: the mean loss over them, not the sum. Clipping off, so nothing rescales the gradient."""
    common = ['--operator=corridor', '--max_iters=2', '--eval_interval=100', '--eval_iters=1', '--lr_decay_iters=10',
              '--grad_clip=0.0', '--log_interval=1']
    accumulated = record_steps(capsys, tiny_data_root, tmp_path / 'gas4', *common,
                               '--gradient_accumulation_steps=4', '--batch_size=8')
    whole = record_steps(capsys, tiny_data_root, tmp_path / 'gas1', *common,
                         '--gradient_accumulation_steps=1', '--batch_size=32')
    (grads_4, batches_4, printed_4, _), (grads_1, batches_1, printed_1, _) = accumulated, whole
    # the reference is an equivalent run: the same 32 sequences per step, in one batch
    assert len(batches_4) == 8 and len(batches_1) == 2
    assert [sum(batches_4[4 * s:4 * s + 4], []) for s in range(2)] == batches_1
    assert len(grads_4) == len(grads_1) == 2
    for step_4, step_1 in zip(grads_4, grads_1):
        assert len(step_4) == len(step_1)
        for g4, g1 in zip(step_4, step_1):
            torch.testing.assert_close(g4, g1, rtol=1e-4, atol=1e-7)
    assert len(printed_4) == len(printed_1) == 2
    assert printed_4 == pytest.approx(printed_1, abs=2e-4)  # printed with 4 decimals
    # and it is the loss itself: an untrained model's (logits near 0) is about ln(vocabulary) at the first step
    vocab = json.loads((tiny_data_root / 'tiny' / 'meta.json').read_text())['vocab_size']
    assert printed_1[0] == pytest.approx(math.log(vocab), abs=0.1)


def test_a_log_lines_loss_is_the_mean_over_every_step_of_its_window(tiny_data_root, tmp_path, capsys, monkeypatch):
    """log_interval=3: each printed batch loss is the mean of the three steps' losses since the last line, not the
    last step's; every line after the first (compiling) step gives the window's speed and the ETA."""
    import train as train_module
    losses, step = [], train_module.optimizer_step

    def recorded_step(*args):
        loss = step(*args)
        losses.append(loss.item())
        return loss
    monkeypatch.setattr(train_module, 'optimizer_step', recorded_step)
    capsys.readouterr()
    train_in_process(monkeypatch, tiny_data_root, tmp_path / 'run', '--operator=corridor', '--max_iters=6',
                     '--eval_interval=100', '--eval_iters=1', '--lr_decay_iters=10', '--log_interval=3')
    out = capsys.readouterr().out.splitlines()
    printed = [float(line.split('batch loss ')[1].split(',')[0]) for line in out if line.startswith('iter ')]
    assert len(losses) == 6 and losses[0] != losses[2]
    assert printed == pytest.approx([sum(losses[:3]) / 3, sum(losses[3:]) / 3], abs=2e-4)  # printed with 4 decimals
    lines = [line for line in out if line.startswith('iter ')]
    assert all(re.search(r', [\d,]+ tok/s, \d+ ms/iter, ETA \d', line) for line in lines), lines


def test_a_checkpoint_saved_on_a_gpu_resumes_on_the_cpu(tiny_data_root, tmp_path):
    """A checkpoint with a CUDA RNG state (saved on a GPU) resumes with --device=cpu: that state is skipped, not fed
    to a CUDA that is not there."""
    out = tmp_path / 'run'
    assert train(tiny_data_root, out, '--max_iters=5', '--eval_interval=5', '--lr_decay_iters=10').returncode == 0
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    ckpt['rng']['cuda'] = torch.zeros(16, dtype=torch.uint8)  # what torch.cuda.get_rng_state() returns there
    torch.save(ckpt, out / 'ckpt.pt')
    resumed = run_script('train.py', '--init_from=resume', f'--out_dir={out}', '--max_iters=10', '--device=cpu',
                         cwd=tiny_data_root)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_log(out)[-1]['iter'] == 10


def test_restore_state_sets_the_cuda_rng_only_on_cuda_from_a_cuda_checkpoint_and_reseeds_every_other_rank(
        monkeypatch):
    """restore_state's branches that a CPU run never takes, called directly: the CUDA RNG state is restored only when
    the checkpoint has one and the run is on CUDA (a CPU checkpoint resumed on a GPU must not feed None to CUDA; a
    CUDA one resumed there must get its state back); a rank > 0 reseeds, also from iteration 0, away from rank 0's
    stream; a checkpoint from before `seconds` was saved resumes at 0 s."""
    from types import SimpleNamespace
    import run
    calls = []
    monkeypatch.setattr(torch.cuda, 'set_rng_state', lambda state, device: calls.append((state, device)))
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([dict(params=[weight], lr_mult=1.0)])
    scaler, data_rng, cfg = torch.amp.GradScaler('cpu', enabled=False), torch.Generator(), SimpleNamespace(seed=3, out_dir='run')

    def restore(device, rank=0, cuda=None, iter_num=5):
        ckpt = dict(optimizer=optimizer.state_dict(), scaler={}, iter_num=iter_num, tokens_seen=0, best_val_loss=1.0,
                    rng=dict(torch=torch.manual_seed(0).get_state(), data=data_rng.get_state(), cuda=cuda))
        progress = run.restore_state(ckpt, optimizer, scaler, data_rng, cfg, device, rank)
        return progress, torch.get_rng_state()

    state = torch.zeros(16, dtype=torch.uint8)
    for device, cuda in (('cuda', None), ('cpu', state), ('cpu', None)):
        restore(device, cuda=cuda)
    assert calls == []
    restore('cuda:1', cuda=state)
    assert len(calls) == 1 and calls[0][0] is state and calls[0][1] == 'cuda:1'
    progress, rank_0 = restore('cpu')
    assert progress['seconds'] == 0.0 and progress['iter_num'] == 5
    rank_1, rank_2 = (restore('cpu', rank=r, iter_num=0)[1] for r in (1, 2))
    assert not torch.equal(rank_1, rank_0) and not torch.equal(rank_2, rank_0) and not torch.equal(rank_1, rank_2)


def test_estimate_loss_is_the_mean_loss_over_fixed_eval_batches_in_eval_mode(tiny_data_root, monkeypatch):
    """Each split's loss is the mean of the model's losses, in eval mode (dropout off), over eval_iters batches
    of that split that are the same at every evaluation; the model goes back to training mode."""
    from contextlib import nullcontext
    import train as train_module
    from model import GPT
    data, cfg = tiny_data(tiny_data_root, eval_iters=3, seed=5)
    torch.manual_seed(0)
    model = GPT(model_config({**DEFAULTS, 'n_layer': 1, 'n_head': 2, 'n_embd': 16, 'block_size': 32,
                              'dropout': 0.5, 'vocab_size': data.meta['vocab_size']}))
    seen = []
    batch = train_module.Data.batch
    monkeypatch.setattr(train_module.Data, 'batch', lambda self, split, offsets: (seen.append((split, offsets.clone())),
                                                                                  batch(self, split, offsets))[1])
    first = train_module.estimate_loss(model, data, cfg, nullcontext(), 0, 1)
    assert model.training
    batches, seen[:] = list(seen), []
    assert train_module.estimate_loss(model, data, cfg, nullcontext(), 0, 1) == first
    assert [s for s, _ in batches] == ['train'] * 3 + ['val'] * 3
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(batches, seen))  # the same batches at every evaluation
    model.eval()
    with torch.no_grad():
        for split in ('train', 'val'):
            losses = [model(*batch(data, split, offsets))[1].item() for s, offsets in batches if s == split]
            assert first[split] == pytest.approx(sum(losses) / 3, rel=1e-6)


# ---------------------------------------------------------------------------------------------- the newcomer's path

def test_an_attention_run_reads_as_attention_and_ends_naming_its_checkpoint_and_the_next_command(tiny_data_root,
                                                                                                   tmp_path):
    out = tmp_path / 'out'
    result = train(tiny_data_root, out, '--operator=attention', '--max_iters=10', '--eval_interval=10',
                   '--lr_decay_iters=10')
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    progress = [line for line in lines if line.startswith(('iter ', 'eval '))]
    assert progress and not any('γ' in line or '|' in line for line in progress)  # no "0 % of heads, γ̄ +0.000"
    done = lines.index(next(line for line in lines if line.startswith('done: 10 iterations in ')))
    assert 'best val loss ' in lines[done] and str(out / 'ckpt.pt') in lines[done]
    assert lines[done + 1] == f'python sample.py --out_dir={out} --num_samples=3'
    corridor = train(tiny_data_root, tmp_path / 'c', '--operator=corridor', '--gamma_init=-0.5', '--max_iters=2',
                     '--eval_interval=2', '--decay_lr=False', '--log_interval=1')
    assert corridor.returncode == 0, corridor.stderr[-2000:]
    iters = [line for line in corridor.stdout.splitlines() if line.startswith('iter ')]
    # claim (b)'s threshold, labelled, beside the corridor; the operator named once, in the header, not on every line
    assert iters and all(' | γ̄ -0.5' in line and 'heads at −1 < γ < −0.05: 100% (−1 < γ < 0: 100%)' in line
                         and 'corridor' not in line for line in iters)


def test_the_log_lines_shares_count_the_heads_strictly_inside_each_interval_over_every_head():
    """The log line's "where the heads are": mean γ and δ over every head of every layer, the share of all heads with
    −1 < γ < −0.05 (claim (b)) and with −1 < γ < 0 (the corridor), both open intervals as model.in_corridor reads
    them: a Laplacian head (γ = −1), one beyond it, attention (γ = 0) and a head at −0.05 itself are not counted."""
    from model import CLAIM_B, GPT, GPTConfig
    from train import operator_summary
    model = GPT(GPTConfig(n_layer=2, n_head=5, n_embd=20, block_size=8, vocab_size=8, operator='corridor'))
    gammas = [[-1.0, -0.5, CLAIM_B, 0.0, 0.3],            # claim (b): −0.5;  corridor: −0.5, −0.05
              [-1.5, -0.0499, -0.0501, -0.7, -0.2]]        # claim (b): −0.0501, −0.7, −0.2;  corridor: those, −0.0499
    with torch.no_grad():
        for block, row in zip(model.transformer.h, gammas):
            block.attn.coefficients.gamma.copy_(torch.tensor(row))  # δ stays 1: γ = c_I / c_P exactly
    # 4 of 10 heads, 6 of 10; mean γ −3.75 / 10 (by layer it would be 1 of 5 and 2 of 5 in layer 0)
    assert operator_summary(model) == " | γ̄ -0.375 δ̄ 1.000, heads at −1 < γ < −0.05: 40% (−1 < γ < 0: 60%)"
    attention = GPT(GPTConfig(n_layer=2, n_head=5, n_embd=20, block_size=8, vocab_size=8, operator='attention'))
    assert operator_summary(attention) == ''  # no scalars, no "0 % of heads"


def test_a_failed_prepare_on_demand_is_prepare_pys_own_one_line(monkeypatch, tmp_path):
    import run as run_module
    from common import UserError
    from types import SimpleNamespace
    failed = subprocess.CompletedProcess([], 2, '', 'error: data/tinyshakespeare.txt is missing: restore it with '
                                                    '`git checkout -- data/tinyshakespeare.txt`, or pass a copy with '
                                                    f'--input PATH --data_root={tmp_path}\n')
    monkeypatch.setattr(run_module.subprocess, 'run', lambda *a, **k: failed)
    cfg = SimpleNamespace(dataset='shakespeare_char', data_root=str(tmp_path))
    with pytest.raises(UserError) as e:
        run_module.prepare_if_missing(cfg)
    assert str(e.value).endswith(f"or pass a copy with --input PATH --data_root={tmp_path}")


def test_each_step_uses_the_schedules_lr_times_its_groups_multiplier(tiny_data_root, tmp_path, capsys):
    """At every optimizer step, the operator scalars' group has get_lr(iter) × operator_lr_mult, the others get_lr."""
    from types import SimpleNamespace
    from train import get_lr
    args = dict(learning_rate=3e-3, min_lr=3e-4, warmup_iters=5, lr_decay_iters=10, decay_lr=True)
    *_, lrs = record_steps(capsys, tiny_data_root, tmp_path / 'run', '--operator=corridor', '--operator_lr_mult=4.0',
                           '--max_iters=8', '--eval_interval=100', '--eval_iters=1', '--lr_decay_iters=10')
    assert len(lrs) == 8
    for it, groups in enumerate(lrs):
        expected = get_lr(it, SimpleNamespace(**args))
        assert [(mult, size) for _, mult, size in groups] == [(1.0, 10), (1.0, 5), (4.0, 4)]  # γ, δ of 2 layers
        assert [lr for lr, _, _ in groups] == pytest.approx([expected, expected, 4 * expected], rel=1e-12)


def test_evaluations_fall_on_multiples_of_eval_interval_and_at_the_last_iteration(tiny_data_root, tmp_path,
                                                                                 monkeypatch):
    train_in_process(monkeypatch, tiny_data_root, tmp_path / 'run', '--max_iters=7', '--eval_interval=3',
                     '--eval_iters=1', '--lr_decay_iters=10')
    log = read_log(tmp_path / 'run')
    assert [e['iter'] for e in log] == [0, 3, 6, 7]
    assert [e['tokens'] for e in log] == [i * 8 * 32 for i in (0, 3, 6, 7)]


# ------------------------------------------------------------------------------------------------------------
# what a run's last line promises, and what older checkpoints and the training loss's options keep

def test_a_run_that_saved_nothing_says_so_and_names_no_checkpoint(tiny_data_root, tmp_path):
    """max_iters=0 evaluates once and saves nothing (a checkpoint is written after iteration 0): the last line says
    so and suggests no sample of a file that does not exist. A loss that goes non-finite before the first save: the
    same, in its one line."""
    out = tmp_path / 'out'
    result = train(tiny_data_root, out, '--max_iters=0')
    assert result.returncode == 0, result.stderr[-2000:]
    done = next(line for line in result.stdout.splitlines() if line.startswith('done: 0 iterations'))
    assert 'no checkpoint was saved' in done and not (out / 'ckpt.pt').exists()
    assert 'sample.py' not in result.stdout
    blown = train(tiny_data_root, tmp_path / 'blown', '--max_iters=20', '--eval_interval=10', '--learning_rate=1e12',
                  '--decay_lr=False', '--grad_clip=0.0', '--log_interval=1')
    assert_one_line_error(blown, 'loss is', 'no checkpoint was saved')
    assert 'holds the last good state' not in blown.stderr and not (tmp_path / 'blown' / 'ckpt.pt').exists()


def test_a_stopped_run_names_the_checkpoint_it_kept_and_its_iteration(tiny_data_root, tmp_path):
    out = tmp_path / 'out'
    assert train(tiny_data_root, out, '--max_iters=10', '--eval_interval=5').returncode == 0
    result = run_script('train.py', '--init_from=resume', f'--out_dir={out}', '--max_iters=60',
                        '--learning_rate=1e12', '--decay_lr=False', '--grad_clip=0.0', cwd=tiny_data_root)
    assert_one_line_error(result, f"{out / 'ckpt.pt'} from iter 10 holds the last good state")


@pytest.mark.parametrize('key', ['gamma_init', 'delta_init'])
def test_an_operator_init_no_float32_scalar_holds_is_refused_before_training(tiny_data_root, tmp_path, key):
    for value in ('1e39', '1e999', '-1e999'):
        result = train(tiny_data_root, tmp_path / value, '--operator=corridor', f'--{key}={value}', '--max_iters=2')
        assert_one_line_error(result, f"{key} must be finite")
        assert not (tmp_path / value).exists()


def test_label_smoothing_changes_the_training_loss_and_never_the_reported_one(tiny_data_root, monkeypatch):
    """One loss function (model.lm_loss): the training step passes label_smoothing, evaluation passes nothing, so
    the same model evaluates to the same loss whatever the training option."""
    import train as train_module
    from model import GPT, lm_loss
    from sources import Data
    torch.manual_seed(0)
    cfg = train_module.SimpleNamespace(**{**DEFAULTS, 'eval_iters': 2, 'seed': 0, 'batch_size': 4, 'block_size': 16})
    data = Data(tiny_data_root, 'tiny', 16, 4, 'cpu')
    model = GPT(train_module.model_config({**vars(cfg), 'n_layer': 1, 'n_head': 2, 'n_embd': 16,
                                            'vocab_size': data.meta['vocab_size']}))
    x, y = data.batch('train', torch.arange(4) * 10)
    plain, smoothed = model(x, y)[1], model(x, y, label_smoothing=0.1)[1]
    logits = model(x)[0]
    log_p = logits.log_softmax(-1).flatten(0, 1)
    expected = 0.9 * -log_p.gather(1, y.flatten()[:, None]).mean() + 0.1 * -log_p.mean()  # its definition
    assert torch.allclose(smoothed, expected) and not torch.allclose(smoothed, plain)
    assert torch.equal(lm_loss(logits, y), plain)
    losses = [train_module.estimate_loss(model, data, train_module.SimpleNamespace(**{**vars(cfg), 'label_smoothing': s}),
                                         nullcontext(), 0, 1) for s in (0.0, 0.3)]
    assert losses[0] == losses[1]


def test_label_smoothing_reaches_every_training_step(tiny_data_root, tmp_path, monkeypatch):
    import model as model_module
    seen = []
    loss = model_module.lm_loss
    monkeypatch.setattr(model_module, 'lm_loss', lambda logits, targets, **o: (seen.append(o), loss(logits, targets, **o))[1])
    train_in_process(monkeypatch, tiny_data_root, tmp_path / 'out', '--max_iters=3', '--eval_interval=3',
                     '--eval_iters=1', '--label_smoothing=0.1')
    assert seen.count({'label_smoothing': 0.1}) == 3 and seen.count({}) == 2 * 2 * 1  # 3 steps; 2 evals × 2 splits


def test_a_resume_carries_the_elapsed_seconds_over(tiny_data_root, tmp_path, monkeypatch):
    """The checkpoint's seconds (the per-seed files' seconds column) count every part of a run: a resume adds to
    them, it does not start again from zero. Each step here takes one second of a fake clock."""
    import run as run_module
    clock = iter(range(10 ** 6))
    monkeypatch.setattr(run_module.time, 'time', lambda: float(next(clock)))
    out = tmp_path / 'out'
    train_in_process(monkeypatch, tiny_data_root, out, '--max_iters=6', '--eval_interval=3', '--lr_decay_iters=8')
    first = torch.load(out / 'ckpt.pt', weights_only=True)['seconds']
    import train as train_module
    train_module.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=8'])
    second = torch.load(out / 'ckpt.pt', weights_only=True)['seconds']
    assert first >= 6 and second >= first + 2


def test_a_checkpoint_saved_before_a_model_key_existed_samples_analyses_and_resumes(tiny_data_root, finished_run):
    """A key added to GPTConfig after a run was saved: its checkpoint lacks it in model_args and config. Every
    reader takes the key's default (the behaviour the run had), says so in one line, and goes on."""
    path = finished_run / 'ckpt.pt'
    ckpt = torch.load(path, weights_only=True)
    del ckpt['model_args']['init_spread'], ckpt['config']['init_spread']
    torch.save(ckpt, path)
    note = f"{path} predates model_args init_spread (read as 0.0)"  # GPTConfig's default: the config lacks it too
    sampled = run_script('sample.py', f'--out_dir={finished_run}', '--num_samples=1', '--max_new_tokens=5',
                         '--device=cpu', cwd=tiny_data_root)
    assert sampled.returncode == 0 and note in sampled.stderr, sampled.stderr[-2000:]
    analysed = run_script('analyze.py', finished_run, cwd=tiny_data_root)
    assert analysed.returncode == 0 and (finished_run / 'analysis' / 'summary.md').is_file(), analysed.stderr[-2000:]
    resumed = run_script('train.py', '--init_from=resume', f'--out_dir={finished_run}', '--max_iters=12',
                         '--lr_decay_iters=12', cwd=tiny_data_root)
    assert resumed.returncode == 0 and note in resumed.stderr, resumed.stderr[-2000:]
    assert torch.load(path, weights_only=True)['model_args']['init_spread'] == 0.0  # saved whole again


def test_a_checkpoint_from_a_newer_version_with_a_key_this_one_lacks_stays_refused(tiny_data_root, finished_run):
    path = finished_run / 'ckpt.pt'
    ckpt = torch.load(path, weights_only=True)
    ckpt['model_args']['testonly_newer_key'] = 0.5  # a name no user gives a key: a real one must not break this test
    torch.save(ckpt, path)
    result = run_script('sample.py', f'--out_dir={finished_run}', '--num_samples=1', '--device=cpu', cwd=tiny_data_root)
    assert_one_line_error(result, "model_args has unknown keys 'testonly_newer_key'")


@pytest.mark.parametrize('split', ['train', 'val'])
def test_a_token_id_equal_to_vocab_size_is_refused_and_the_largest_valid_one_accepted(tmp_path, split):
    """The id check at its boundary: vocab_size 4 holds ids 0–3, so 3 reads and 4 (one past) is one line."""
    from common import UserError
    from train import Data
    plenty = [i % 4 for i in range(100)]
    write_tokens(tmp_path / 'edge', plenty, plenty)  # the largest id, 3, is in both splits
    assert Data(str(tmp_path), 'edge', 8, 2, 'cpu').n_tokens == {'train': 100, 'val': 100}
    past = list(plenty)
    past[50] = 4
    write_tokens(tmp_path / 'past', *((past, plenty) if split == 'train' else (plenty, past)))
    with pytest.raises(UserError) as e:
        Data(str(tmp_path), 'past', 8, 2, 'cpu')
    assert f"{split}.bin holds token id 4, but meta.json's vocab_size is 4" in str(e.value)


def test_batches_reach_a_non_cuda_device_unpinned(tiny_data_root, monkeypatch):
    """Pinned memory is CUDA's (the copy overlaps the step); on any other device (MPS, here the meta stand-in) a batch
    is moved plainly, and on the CPU it stays as it was read."""
    from sources import Data
    monkeypatch.setattr(torch.Tensor, 'pin_memory', lambda self: pytest.fail('pinned off CUDA'))
    for device in ('meta', 'cpu'):
        x, y = Data(tiny_data_root, 'tiny', 8, 2, device).batch('train', torch.tensor([0, 5]))
        assert x.device.type == y.device.type == device


# ---------------------------------------------------------------------------------------------- a form with a key

# A gated corridor, named as no user would name a form or a key (a user who adds a `gated` form with a `gate_init`
# must not break this test)
FORM, KEY = 'testonly_gated', 'testonly_gate_init'
GATE_FIELD = f"    {KEY}: float = 0.0      # {FORM}: the gate's start; c_I = 2σ(gate)·δγ (0: the corridor)\n"
GATED_FORM = f"""    '{FORM}': OperatorForm(('gamma', 'delta', 'gate'), learnable=True,
                               init=lambda g0, d0, config: (g0, d0, torch.full_like(g0, config.{KEY})),
                               coefficients=lambda gamma, delta, gate: (2 * torch.sigmoid(gate) * delta * gamma, delta),
                               keys=START + ('{KEY}',)),
"""


@pytest.mark.slow
def test_a_form_with_a_key_of_its_own_is_one_entry_and_one_field_and_older_runs_stay_readable(
        tiny_data_root, finished_run, tmp_path):
    """A copy of the repo with exactly two edits to model.py: a GPTConfig field and an OPERATORS entry that names it.
    In it the form trains, --help explains its key, another form refuses the key in one line, the table-driven model
    tests pass over every form (the new one included), and a run saved before the field existed (here, by the
    unedited repo) samples, analyses and resumes."""
    import shutil
    copy = tmp_path / 'repo'
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns('.git', '.venv', '__pycache__', 'data', 'out*', 'sweeps*'))
    source = (copy / 'model.py').read_text()
    anchor = "    operator_lr_mult: float = 1.0"
    field_line = next(line for line in source.splitlines(keepends=True) if line.startswith(anchor))
    source = source.replace(field_line, field_line + GATE_FIELD)
    table_end = source.index('\n}\n', source.index('OPERATORS = {')) + 1
    (copy / 'model.py').write_text(source[:table_end] + GATED_FORM + source[table_end:])

    def run(*args):
        return subprocess.run([sys.executable, *map(str, args)], cwd=copy, capture_output=True, text=True,
                              env={**os.environ, 'PYTHONPATH': str(copy)}, timeout=600)

    tiny = [*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', '--max_iters=4', '--eval_interval=4']
    gated = run('train.py', *tiny, f'--out_dir={tmp_path / "gated"}', f'--operator={FORM}', f'--{KEY}=0.5',
                '--gamma_init=-0.2')
    assert gated.returncode == 0, gated.stderr[-2000:]
    start = read_log(tmp_path / 'gated')[0]['gamma']
    assert all(g == pytest.approx(2 * torch.sigmoid(torch.tensor(0.5)).item() * -0.2, rel=1e-5) for row in start
               for g in row)  # the gate starts where its key says
    assert_one_line_error(run('train.py', *tiny, f'--out_dir={tmp_path / "c"}', '--operator=corridor',
                              f'--{KEY}=0.5'), f"operator='corridor' does not read {KEY}", f'read by {FORM}')
    assert f"{KEY}=0.0" in run('train.py', '--help').stdout and f"{FORM}: the gate's start" in \
        run('train.py', '--help').stdout
    note = f"predates model_args {KEY} (read as 0.0)"
    for args in (('sample.py', f'--out_dir={finished_run}', '--num_samples=1', '--max_new_tokens=4', '--device=cpu'),
                 ('analyze.py', finished_run),
                 ('train.py', '--init_from=resume', f'--out_dir={finished_run}', '--max_iters=12',
                  '--lr_decay_iters=12')):
        result = run(*args)
        assert result.returncode == 0 and note in result.stderr, (args, result.stderr[-2000:])
    tests = run('-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-n', '0', 'tests/test_model.py', '-k',
                'follow_the_table or fast_path_equals_math_path or future_tokens or scalar_gradients_match or '
                'kv_cached_generation_equals or weight_decay_never')
    assert tests.returncode == 0 and FORM in tests.stdout + run('-m', 'pytest', '--collect-only', '-q',
                                                                   'tests/test_model.py').stdout, tests.stdout[-3000:]


# ---------------------------------------------------------------------------------------------- bfloat16 on a CPU

def fake_cpu_bf16_units(monkeypatch, present):
    """This CPU with (AVX512-BF16 and AMX) or without bf16 units, as torch reports them."""
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: present)
    monkeypatch.setattr(torch.cpu, '_is_amx_tile_supported', lambda: present)


def recorded_autocasts(monkeypatch):
    """The dtypes of every torch.autocast train.py opens, in order."""
    opened, autocast = [], torch.autocast

    def recording(device_type, dtype=None, *args, **kwargs):
        opened.append(dtype)
        return autocast(device_type, dtype, *args, **kwargs)
    monkeypatch.setattr(torch, 'autocast', recording)
    return opened


@pytest.mark.parametrize('units,n_embd,expected,why', [
    (True, 256, 'bfloat16', 'this CPU has bfloat16 units and n_embd 256 is at least 256'),
    (True, 128, 'float32', 'n_embd 128 is under 256, too narrow'),
    (False, 256, 'float32', 'this CPU has no bfloat16 units, AVX512-BF16 or AMX')])
def test_auto_dtype_on_a_cpu_trains_in_bfloat16_only_with_bf16_units_and_a_wide_model_and_says_why(
        tiny_data_root, tmp_path, monkeypatch, capsys, units, n_embd, expected, why):
    fake_cpu_bf16_units(monkeypatch, units)
    opened = recorded_autocasts(monkeypatch)
    capsys.readouterr()
    train_in_process(monkeypatch, tiny_data_root, tmp_path / 'out', f'--n_embd={n_embd}', '--n_layer=1',
                     '--batch_size=2', '--block_size=8', '--max_iters=2', '--eval_interval=2', '--dtype=auto')
    header = next(line for line in capsys.readouterr().out.splitlines() if 'parameters, operator' in line)
    assert f"cpu, {expected} (auto: {why}" in header, header
    assert opened == ([torch.bfloat16] if expected == 'bfloat16' else [])
    # a configured dtype always wins, and says no reason
    capsys.readouterr()
    train_in_process(monkeypatch, tiny_data_root, tmp_path / 'fp32', f'--n_embd={n_embd}', '--n_layer=1',
                     '--batch_size=2', '--block_size=8', '--max_iters=2', '--eval_interval=2', '--dtype=float32')
    assert 'cpu, float32, 1 process(es)' in capsys.readouterr().out


def test_a_bfloat16_run_learns_keeps_its_scalars_float32_resumes_exactly_and_every_reader_reads_it(
        tiny_data_root, tmp_path, monkeypatch, capsys):
    """--dtype=bfloat16 on a CPU (emulated where it has no bf16 units: the same numbers, slower)."""
    import model as model_module
    import train as train_module
    seen, apply_operator = set(), model_module.apply_operator

    def recording(c_I, c_P, v, pv):
        out = apply_operator(c_I, c_P, v, pv)
        seen.add((c_I.dtype, c_P.dtype, pv.dtype, out.dtype))
        return out
    monkeypatch.setattr(model_module, 'apply_operator', recording)
    common = ['--operator=corridor', '--dtype=bfloat16', '--dropout=0.1', '--eval_interval=10', '--lr_decay_iters=40']
    whole, parts = tmp_path / 'whole', tmp_path / 'parts'
    train_in_process(monkeypatch, tiny_data_root, whole, *common, '--max_iters=40')
    # the operator's scalars and its line in float32, as on a GPU: P·V arrives in bf16, the sum is float32
    assert seen == {(torch.float32, torch.float32, torch.bfloat16, torch.float32)}
    log = read_log(whole)
    assert log[-1]['val_loss'] < log[0]['val_loss'] - 0.5
    saved = torch.load(whole / 'ckpt.pt', weights_only=True)
    assert {t.dtype for t in saved['model'].values()} == {torch.float32}  # autocast's master weights
    assert saved['config']['dtype'] == 'bfloat16'
    train_in_process(monkeypatch, tiny_data_root, parts, *common, '--max_iters=20')
    capsys.readouterr()
    train_module.main(['--init_from=resume', f'--out_dir={parts}', '--max_iters=40'])
    assert 'cpu, bfloat16, 1 process(es), resuming at iter 20' in capsys.readouterr().out
    assert read_log(parts) == log
    a, b = (torch.load(p / 'ckpt.pt', weights_only=True)['model'] for p in (whole, parts))
    assert all(torch.equal(a[k], b[k]) for k in a)
    (tmp_path / 'text.txt').write_text(synthetic_text(200, seed=5))
    for script, *args in (('sample.py', f'--out_dir={whole}', '--num_samples=1', '--max_new_tokens=8', '--device=cpu',
                           '--dtype=bfloat16'),
                          ('analyze.py', whole, '--out', tmp_path / 'analysis'),
                          ('lab.walk', whole, '--text', tmp_path / 'text.txt', '--n_seqs', '4', '--seq_len', '16',
                           '--out', tmp_path / 'walk')):
        result = run_script(script, *args, cwd=tmp_path)
        assert result.returncode == 0, (script, result.stderr[-2000:])
    assert json.loads((tmp_path / 'walk' / 'diagnostics.json').read_text())[whole.name]['sequences'] == 4
    report = json.loads((tmp_path / 'analysis' / 'whole' / 'corridor.json').read_text())
    assert report['layers'][0]['gamma'] == pytest.approx(log[-1]['gamma'][0])


# ---------------------------------------------------------------------------------------------- --help

def help_entry(text, key):
    """A key's meaning in --help's key list, its wrapped lines joined."""
    lines = text.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith(f'  {key}='))
    last = next(n for n in range(first + 1, len(lines) + 1) if n == len(lines) or not lines[n].startswith(' ' * 33))
    return ' '.join(' '.join(lines[first:last]).split()[1:])  # without `key=default`


def test_help_says_what_operator_and_gamma_nonneg_do_and_the_command_line_does_it(tiny_data_root, tmp_path, capsys):
    """`python train.py --help`: operator names a form of model.py's OPERATORS, a wrong name lists every form, and a
    form refuses another form's key; gamma_nonneg is the corridor's γ ≥ 0 (claim (c)), which another form refuses."""
    from model import OPERATORS
    text = run_script('train.py', '--help', cwd=tmp_path).stdout
    operator, nonneg = help_entry(text, 'operator'), help_entry(text, 'gamma_nonneg')
    assert "a form of model.py's OPERATORS table (a wrong name lists them)" in operator
    assert 'each form reads only the keys its entry names' in operator
    assert nonneg.startswith('corridor: keep every head') and 'γ ≥ 0' in nonneg and 'claim (c)' in nonneg
    common = [*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={tmp_path / "out"}', '--max_iters=5']
    status, err = in_process([*common, '--operator=nope'], capsys)
    assert status == 2 and err.strip().endswith(f"(choose from {', '.join(OPERATORS)})"), err
    status, err = in_process([*common, '--operator=alpha', '--gamma_nonneg=True'], capsys)
    assert status == 2 and 'gamma_nonneg is read by corridor' in err, err
    assert not (tmp_path / 'out').exists()
