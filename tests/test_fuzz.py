"""Corrupted and foreign files, each given to the command that reads it, in-process (main_guard with argv): every case
ends in exit 2 with one `error:` line and no traceback, or in a correct run; a failed resume changes no file of the
run folder. Seeded: the default tier runs a sample of the cases, `-m slow` all of them (count: docs/tests.md)."""

import hashlib
import json
import random
import shutil
import signal

import pytest
import torch

import analyze
import sample
import train
from common import main_guard

SEED = 49


def flipped(data, offset):
    return data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1:]


def checkpoint_edits(ckpt):
    """(name, edit of the loaded dict): each top-level key removed and retyped, each model_args field removed and
    retyped, every weight reshaped, a key added, the model a tensor."""
    edits = []
    for key in ckpt:
        edits += [(f'ckpt-drop-{key}', lambda c, k=key: c.pop(k)),
                  (f'ckpt-retype-{key}', lambda c, k=key: c.__setitem__(k, '20'))]
    for key in ckpt['model_args']:
        edits += [(f'args-drop-{key}', lambda c, k=key: c['model_args'].pop(k)),
                  (f'args-retype-{key}', lambda c, k=key: c['model_args'].__setitem__(k, str(c['model_args'][k])))]
    for key in ckpt['model']:
        edits += [(f'weight-reshape-{key}', lambda c, k=key: c['model'].__setitem__(k, torch.zeros(3, 5)))]
    edits += [('args-extra', lambda c: c['model_args'].__setitem__('rope', True)),
              ('model-is-a-tensor', lambda c: c.__setitem__('model', torch.zeros(4))),
              ('meta-dtype', lambda c: c['meta'].__setitem__('tokenizer', 'bytes')),
              ('optimizer-groups', lambda c: c['optimizer']['param_groups'].pop()),
              ('nanogpt', lambda c: [c.pop('meta')] + [c['model_args'].pop(k) for k in list(c['model_args'])
                                                       if k not in ('n_layer', 'n_head', 'n_embd', 'block_size',
                                                                    'bias', 'vocab_size', 'dropout')])]
    return edits


def cases(run_dir):
    """(name, file in the run folder or data, how to corrupt its bytes) for every case."""
    rng = random.Random(SEED)
    ckpt_bytes = (run_dir / 'ckpt.pt').read_bytes()
    ckpt = torch.load(run_dir / 'ckpt.pt', weights_only=True)
    out = []
    for fraction in (0.0, 0.1, 0.5, 0.9, 0.999):
        out.append((f'ckpt-truncate-{fraction}', 'ckpt.pt', lambda b, f=fraction: b[:int(len(b) * f)]))
    for offset in sorted(rng.sample(range(len(ckpt_bytes)), 40)):
        out.append((f'ckpt-flip-{offset}', 'ckpt.pt', lambda b, o=offset: flipped(b, o)))
    for name, edit in checkpoint_edits(ckpt):
        def rewrite(_, edit=edit):
            c = torch.load(run_dir / 'ckpt.pt', weights_only=True)
            edit(c)
            path = run_dir.parent / 'edited.pt'
            torch.save(c, path)
            return path.read_bytes()
        out.append((name, 'ckpt.pt', rewrite))
    log = (run_dir / 'log.jsonl').read_bytes()
    for name, line in (('log-list', b'[1, 2]\n'), ('log-number', b'3\n'), ('log-latin1', b'{"iter": "\xe9"}\n'),
                       ('log-val-loss-text', b'{"iter": 0, "tokens": 0, "train_loss": 1, "val_loss": "abc"}\n'),
                       ('log-no-iter', b'{"tokens": 0, "train_loss": 1, "val_loss": 1}\n'),
                       ('log-gamma-shape', b'{"iter": 0, "tokens": 0, "train_loss": 1, "val_loss": 1, '
                                           b'"gamma": [[0.1]]}\n')):
        out.append((name, 'log.jsonl', lambda b, line=line: line + b))
    for fraction in (0.3, 0.7):
        out.append((f'log-truncate-{fraction}', 'log.jsonl', lambda b, f=fraction: b[:int(len(b) * f)]))
    del log
    return out


def digest(folder):  # the run's files; train.lock, which a resume takes before it reads log.jsonl, holds no data
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != 'train.lock'}


def run_in_process(main, argv, capsys):
    """(exit status, stderr) of main_guard(main(argv)), as the command line would end."""
    capsys.readouterr()
    try:
        main_guard(lambda: main(argv))
        status = 0
    except SystemExit as e:
        status = e.code or 0
    return status, capsys.readouterr().err


COMMANDS = {
    'sample': lambda d: (sample.main, [f'--out_dir={d}', '--num_samples=1', '--max_new_tokens=4', '--device=cpu']),
    'analyze': lambda d: (analyze.main, [str(d), '--out', str(d.parent / 'analysis')]),
}


def all_cases(trained_run):
    return [(name, target, corrupt, command) for name, target, corrupt in cases(trained_run)
            for command in ('sample', 'analyze', 'resume')
            if not (target == 'log.jsonl' and command == 'sample')]


def check_case(case, trained_run, tiny_data_root, tmp_path, capsys, monkeypatch):
    name, target, corrupt, command = case
    run_dir = tmp_path / 'run'
    shutil.copytree(trained_run, run_dir, ignore=shutil.ignore_patterns('analysis', 'train.lock'))
    (run_dir / target).write_bytes(corrupt((trained_run / target).read_bytes()))
    before = digest(run_dir)
    if command == 'resume':
        monkeypatch.setattr(signal, 'signal', lambda *args: None)  # in-process: leave pytest's handlers alone
        iters = json.loads((trained_run / 'config.json').read_text())['max_iters']
        main, argv = train.main, ['--init_from=resume', f'--out_dir={run_dir}', f'--data_root={tiny_data_root}',
                                  f'--max_iters={iters}']
    else:
        main, argv = COMMANDS[command](run_dir)
    status, err = run_in_process(main, argv, capsys)
    lines = err.strip().splitlines()
    assert 'Traceback' not in err, (name, command, err[-2000:])
    if status == 0:
        return 'ran'
    assert status == 2 and len(lines) == 1 and lines[0].startswith('error: '), (name, command, status, err[-2000:])
    assert digest(run_dir) == before, (name, command, 'a failed run changed the run folder')
    return 'refused'


def test_a_seeded_sample_of_corrupt_files_is_one_line_or_a_correct_run(trained_run, tiny_data_root, tmp_path_factory,
                                                                      capsys, monkeypatch):
    every = all_cases(trained_run)
    chosen = random.Random(SEED).sample(every, 30)
    outcomes = [check_case(case, trained_run, tiny_data_root, tmp_path_factory.mktemp('case'), capsys, monkeypatch)
                for case in chosen]
    assert outcomes.count('refused') >= 20  # most corruptions are refused, not run on


@pytest.mark.slow
def test_every_corrupt_file_is_one_line_or_a_correct_run(trained_run, tiny_data_root, tmp_path_factory, capsys,
                                                         monkeypatch):
    every = all_cases(trained_run)
    assert len(every) >= 300
    for case in every:
        check_case(case, trained_run, tiny_data_root, tmp_path_factory.mktemp('case'), capsys, monkeypatch)


def test_a_resume_on_token_ids_past_the_vocabulary_refuses_and_leaves_the_run_folder_byte_identical(
        trained_run, tiny_data_root, tmp_path, capsys, monkeypatch):
    data_root, run_dir = tmp_path / 'data', tmp_path / 'run'
    shutil.copytree(tiny_data_root / 'tiny', data_root / 'tiny')
    shutil.copytree(trained_run, run_dir, ignore=shutil.ignore_patterns('analysis', 'train.lock'))
    tokens = bytearray((data_root / 'tiny' / 'train.bin').read_bytes())
    tokens[100:102] = (60000).to_bytes(2, 'little')  # one uint16 id far past the 25 characters
    (data_root / 'tiny' / 'train.bin').write_bytes(bytes(tokens))
    before = digest(run_dir)
    monkeypatch.setattr(signal, 'signal', lambda *args: None)
    status, err = run_in_process(train.main, ['--init_from=resume', f'--out_dir={run_dir}', f'--data_root={data_root}',
                                              '--max_iters=200'], capsys)
    assert status == 2 and err.strip().splitlines() == [err.strip()] and 'holds token id 60000' in err, err
    assert digest(run_dir) == before  # ckpt.pt, log.jsonl and config.json untouched


def test_an_unknown_key_in_a_checkpoints_config_is_not_copied_into_config_json(trained_run, tiny_data_root, tmp_path,
                                                                               capsys, monkeypatch):
    run_dir = tmp_path / 'run'
    shutil.copytree(trained_run, run_dir, ignore=shutil.ignore_patterns('analysis', 'train.lock'))
    ckpt = torch.load(run_dir / 'ckpt.pt', weights_only=True)
    ckpt['config']['n_layr'] = 3
    torch.save(ckpt, run_dir / 'ckpt.pt')
    monkeypatch.setattr(signal, 'signal', lambda *args: None)
    status, _ = run_in_process(train.main, ['--init_from=resume', f'--out_dir={run_dir}',
                                            f'--data_root={tiny_data_root}', f"--max_iters={ckpt['iter_num']}"], capsys)
    assert status == 0
    assert 'n_layr' not in json.loads((run_dir / 'config.json').read_text())


def test_init_from_a_corridor_run_folder_keeps_its_operator_or_says_what_to_pass(trained_run, tiny_data_root, tmp_path,
                                                                                capsys, monkeypatch):
    monkeypatch.setattr(signal, 'signal', lambda *args: None)
    common = [f'--init_from={trained_run}', f'--data_root={tiny_data_root}', '--dataset=tiny', '--device=cpu',
              '--compile=False', '--block_size=32', '--batch_size=4', '--gradient_accumulation_steps=1',
              '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--warmup_iters=0', '--lr_decay_iters=2']
    status, err = run_in_process(train.main, [*common, f'--out_dir={tmp_path / "a"}'], capsys)
    assert status == 0, err[-2000:]
    assert json.loads((tmp_path / 'a' / 'config.json').read_text())['operator'] == 'corridor'
    status, err = run_in_process(train.main, [*common, '--operator=alpha', f'--out_dir={tmp_path / "b"}'], capsys)
    assert status == 2 and "operator='corridor'" in err and '--operator' in err, err
