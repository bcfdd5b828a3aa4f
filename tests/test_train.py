"""train.py: it learns, it logs every head's γ/δ, it resumes exactly, DDP matches one process, bad input is
one line and overwrites nothing."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common import model_config, parse_config
from conftest import REPO, TINY_TRAIN_ARGS, assert_one_line_error, run_script
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
        torch.testing.assert_close(torch.tensor(entry['c_I']), torch.tensor(entry['gamma']) * torch.tensor(entry['delta']))
    assert log[-1]['tokens'] == 60 * 8 * 32
    ckpt = torch.load(trained_run / 'ckpt.pt', weights_only=True)
    assert ckpt['iter_num'] == 60 and ckpt['best_val_loss'] == min(e['val_loss'] for e in log)
    assert json.loads((trained_run / 'config.json').read_text())['operator'] == 'corridor'


def test_resume_logs_the_same_losses_bit_for_bit(tiny_data_root, tmp_path):
    # dropout > 0, so the restored RNG state matters too
    common = ['--operator=corridor', '--dropout=0.1', '--eval_interval=10', '--lr_decay_iters=40']
    whole, parts = tmp_path / 'whole', tmp_path / 'parts'
    assert train(tiny_data_root, whole, *common, '--max_iters=40').returncode == 0
    assert train(tiny_data_root, parts, *common, '--max_iters=20').returncode == 0
    result = run_script('train.py', '--init_from=resume', f'--out_dir={parts}', '--max_iters=40', cwd=tiny_data_root)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'resuming at iter 20' in result.stdout
    assert read_log(parts) == read_log(whole)  # every loss, every γ and δ, bit for bit
    a, b = (torch.load(p / 'ckpt.pt', weights_only=True)['model'] for p in (whole, parts))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_saves_at_an_iteration_boundary_and_resume_matches_the_uninterrupted_run(tiny_data_root, tmp_path):
    common = ['--operator=corridor', '--eval_interval=50', '--lr_decay_iters=200', '--max_iters=200']
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
    assert process.returncode == 0, stderr[-2000:]
    assert 'stopped at iter' in stdout
    stopped_at = torch.load(stopped / 'ckpt.pt', weights_only=True)['iter_num']
    assert 0 < stopped_at < 200
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


def test_ddp_two_gloo_processes_reach_the_losses_of_one_process(tiny_data_root, tmp_path):
    """Same global batch (gradient_accumulation_steps=4: 4 micro-batches in one process, 2 in each of two).
    Tolerance 1e-5 relative: gloo sums the two gradients in another order than one process accumulates them."""
    common = [*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', '--operator=corridor', '--max_iters=20',
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
    assert one[-1]['val_loss'] < one[0]['val_loss']


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
    (['--operator=alpha', '--gamma_nonneg=True'], "gamma_nonneg constrains the corridor"),
    (['--n_layer'], "expected --key=value"),
    (['--warmup_iters=5', '--lr_decay_iters=5'], "lr_decay_iters=5 must exceed warmup_iters=5"),
    (['--eval_interval=0'], "eval_interval must be at least 1"),
    (['--n_layer={[1]: 2}'], "n_layer must be int"),  # not even a Python literal
])
def test_bad_config_is_one_line_and_writes_nothing(tiny_data_root, tmp_path, args, message):
    result = train(tiny_data_root, tmp_path / 'out', '--max_iters=5', *args)
    assert_one_line_error(result, message)
    assert not (tmp_path / 'out').exists()


def test_scratch_run_refuses_to_overwrite_a_checkpoint(tiny_data_root, finished_run):
    before = digest(finished_run)
    result = train(tiny_data_root, finished_run, '--max_iters=10')
    assert_one_line_error(result, 'ckpt.pt exists', '--init_from=resume')
    assert digest(finished_run) == before


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
def test_every_config_file_is_a_valid_run(path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = parse_config(DEFAULTS, [str(path.relative_to(REPO))])
    assert config['out_dir'] != DEFAULTS['out_dir'], "each config writes its own run folder"
    model_config({**config, 'vocab_size': 50257})  # raises on an impossible operator combination
    form = path.stem.split('_', 2)[-1].replace('124m_', '').replace('350m_', '')
    expected = {'attention': 'attention', 'corridor': 'corridor', 'gamma_nonneg': 'corridor',
                'fixed_gamma': 'corridor', 'laplacian': 'laplacian', 'alpha': 'alpha', 'alpha_beta': 'alpha_beta'}
    assert config['operator'] == expected[form]
    if form == 'fixed_gamma':
        assert (config['gamma_init'], config['learn_gamma'], config['learn_delta']) == (-0.5, False, False)
    if form == 'gamma_nonneg':
        assert config['gamma_nonneg']
    if path.name.startswith('owt'):  # ~0.5M tokens per iteration on one GPU
        tokens = config['batch_size'] * config['block_size'] * config['gradient_accumulation_steps']
        assert 480_000 <= tokens <= 530_000
