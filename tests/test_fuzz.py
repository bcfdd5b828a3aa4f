"""Corrupted and foreign files, each given to the command that reads it, in-process (main_guard with argv): every case
ends in exit 2 with one `error:` line and no traceback, or in a correct run; a failed command changes no file and
creates none. Every reader: ckpt.pt and log.jsonl (sample, analyze, a resume), then meta.json, train.bin, val.bin, the
run's config.json, config files, prompt files, prepare.py's inputs, a transformers folder's config.json,
lab.walk's text and a GGUF file. Seeded: the default tier runs a sample of the cases, `-m slow` all of them (counts: docs/tests.md)."""

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
from conftest import run_in_process

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


def digest(folder):  # the run's files (train.lock too: a failed resume must not leave one behind)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def outcome(name, command, status, err):
    """'ran' (exit 0) or 'refused' (exit 2, one `error:` line); a traceback or any other ending fails the case."""
    assert 'Traceback' not in err, (name, command, err[-2000:])
    if status == 0:
        return 'ran'
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith('error: '), (name, command, status, err[-2000:])
    return 'refused'


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
    ended = outcome(name, command, *run_in_process(main, argv, capsys))
    assert ended == 'ran' or digest(run_dir) == before, (name, command, 'a failed run changed the run folder')
    return ended


def test_a_seeded_sample_of_corrupt_files_is_one_line_or_a_correct_run(trained_run, tiny_data_root, tmp_path_factory,
                                                                      capsys, monkeypatch):
    every = all_cases(trained_run)
    chosen = random.Random(SEED).sample(every, 30)
    outcomes = [check_case(case, trained_run, tiny_data_root, tmp_path_factory.mktemp('case'), capsys, monkeypatch)
                for case in chosen]
    # most corruptions are refused, not run on; a model key dropped from model_args that GPTConfig can default (not
    # one that shapes the weights) runs, as a checkpoint saved before that key existed does
    assert outcomes.count('refused') >= 18


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


def test_a_corrupt_config_json_of_a_run_without_a_checkpoint_is_one_line_or_read(unsaved_run, tmp_path, capsys):
    """Without ckpt.pt, config.json is what analyze.py reads a run's operator from (and sample.py its first
    checkpoint's iteration): every corruption of it ends in one line or a run, and the folder stays as it was."""
    saved = json.loads((unsaved_run / 'config.json').read_text())
    read = ('operator', 'eval_interval', 'init_from')  # the keys they read; every other key's edits are alike
    corruptions = [(name, corrupt) for name, corrupt in json_file_corruptions(
        'config.json', saved, dict(operator=('corridr', None, 3)), random.Random(SEED))
        if not any(f'-{edit}-' in name for edit in ('drop', 'retype')) or any(name.endswith(k) for k in read)]
    outcomes = set()
    for name, corrupt in corruptions:
        run_dir = tmp_path / name
        shutil.copytree(unsaved_run, run_dir)
        bad = corrupt((unsaved_run / 'config.json').read_bytes())
        (run_dir / 'config.json').unlink() if bad is None else (run_dir / 'config.json').write_bytes(bad)
        before = digest(run_dir)
        for main, argv in ((analyze.main, [str(run_dir), '--out', str(tmp_path / 'out')]),
                           (sample.main, [f'--out_dir={run_dir}', '--device=cpu'])):
            status, err = run_in_process(main, argv, capsys)
            outcomes.add((main.__module__, outcome(name, main.__module__, status, err)))
        assert digest(run_dir) == before, name
    assert outcomes == {('analyze', 'ran'), ('analyze', 'refused'), ('sample', 'refused')}


# ---------------------------------------------------------------------------------------------------------------
# Every other reader: prepared data (meta.json, train.bin, val.bin), the run folder's config.json, config files,
# prompt files, prepare.py's inputs, a transformers folder's config.json, lab.walk's text. Each case corrupts one file
# of a case folder that holds good copies of all of them; a failed command must leave that folder byte-identical (no
# file changed, none created: not even train.lock or an empty output folder).

CONFIG = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=1,
              learning_rate=3e-3, min_lr=3e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0, max_iters=2,
              lr_decay_iters=2, warmup_iters=0, eval_interval=2, eval_iters=1, dropout=0.0, seed=1337,
              operator='corridor', compile=False, device='cpu')
QUICK_RUN = ['--max_iters=2', '--lr_decay_iters=2', '--warmup_iters=0', '--eval_interval=2', '--eval_iters=1',
             '--batch_size=4']


def config_text(config):
    return ''.join(f"{key} = {value!r}\n" for key, value in config.items()).encode()


def good_files(env):
    """The good files a case folder holds beside the run folder and the prepared data (tiny's own characters)."""
    from conftest import synthetic_text
    (env / 'config.py').write_bytes(b'# a tiny corridor run\n' + config_text(CONFIG))
    (env / 'prompt.txt').write_text('the cat sees')
    (env / 'walk.txt').write_text(synthetic_text(60, seed=2))
    (env / 'docs').mkdir()
    (env / 'docs' / 'docs.txt').write_text(synthetic_text(200, seed=3))
    (env / 'docs' / 'docs.jsonl').write_text(''.join(json.dumps({'text': line}) + '\n'
                                                     for line in synthetic_text(200, seed=4).splitlines()))


TARGETS = {'meta.json': 'data/tiny/meta.json', 'train.bin': 'data/tiny/train.bin', 'val.bin': 'data/tiny/val.bin',
           'config.json': 'run/config.json', 'config.py': 'config.py', 'prompt': 'prompt.txt', 'walk.txt': 'walk.txt',
           'docs.txt': 'docs/docs.txt', 'docs.jsonl': 'docs/docs.jsonl', 'hf-config': 'hf/config.json'}


def train_scratch(env, *args):
    return train.main, [*args, '--dataset=tiny', '--device=cpu', '--compile=False', f'--data_root={env / "data"}',
                        f'--out_dir={env / "run"}', '--overwrite=True']


def walk(env, source):
    from lab import walk
    return walk.main, [str(source), '--text', str(env / 'walk.txt'), '--n_seqs=2', '--seq_len=8', '--no-null_model',
                       '--gram_edges=0', '--out', str(env / 'walk-out')]


def prepare_text(env, path, tokenizer='char'):  # over the good data folder: a failure must leave it as it was
    import prepare
    argv = ['prepare.py', 'text', '--input', str(path), f'--tokenizer={tokenizer}', f'--data_root={env / "data"}',
            '--name=tiny']
    return lambda _: prepare.main(), argv


def probe(env):
    from lab import probe
    return probe.main, [str(env / 'run'), '--dataset=tiny', f'--data_root={env / "data"}', '--n_seqs=2',
                        '--seq_len=8', '--device=cpu', f'--out={env / "probe-out"}']


TINY_ARGS = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--gradient_accumulation_steps=1']
RUN_ITERS = 60  # the trained_run fixture's max_iters: a resume that has nothing left to train, after every check
READERS = {  # command -> (main, argv) in a case folder
    'train': lambda env: train_scratch(env, *TINY_ARGS, *QUICK_RUN),  # a fresh run over the good run (--overwrite)
    # the tiny run first: a config file cut short, emptied or removed leaves it that, not GPT-2 124M (the defaults)
    'train-config': lambda env: train_scratch(env, *TINY_ARGS, *QUICK_RUN, str(env / 'config.py')),
    'resume': lambda env: (train.main, ['--init_from=resume', f'--out_dir={env / "run"}',
                                        f'--data_root={env / "data"}', f'--max_iters={RUN_ITERS}']),
    'probe': probe,
    'sample': lambda env: COMMANDS['sample'](env / 'run'),
    'sample-prompt': lambda env: (sample.main, [f'--out_dir={env / "run"}', f'--start=FILE:{env / "prompt.txt"}',
                                                '--num_samples=1', '--max_new_tokens=4', '--device=cpu']),
    'walk': lambda env: walk(env, env / 'run'),
    'prepare-txt': lambda env: prepare_text(env, env / 'docs' / 'docs.txt'),
    'prepare-jsonl': lambda env: prepare_text(env, env / 'docs' / 'docs.jsonl'),
    'hf-sample': lambda env: (sample.main, [f'--init_from={env / "hf"}', '--start=the cat', '--num_samples=1',
                                            '--max_new_tokens=2', '--device=cpu']),
    'hf-walk': lambda env: walk(env, env / 'hf'),
    'hf-prepare': lambda env: prepare_text(env, env / 'docs' / 'docs.txt', tokenizer=env / 'hf'),
}


def json_edits(obj, prefix, absurd):
    """(name, new object) for each top-level field of a JSON object removed, retyped (a number as text, text as a
    number) and set to each of its absurd values."""
    out = []
    for key, value in obj.items():
        retyped = 7 if isinstance(value, str) else str(value)
        out += [(f'{prefix}-drop-{key}', {k: v for k, v in obj.items() if k != key}),
                (f'{prefix}-retype-{key}', {**obj, key: retyped})]
        out += [(f'{prefix}-{key}={bad!r:.20}', {**obj, key: bad}) for bad in absurd.get(key, ())]
    return out


def text_corruptions(prefix, rng):
    """(name, corrupt) of a text file: cut at 30 % and 97 %, ending inside a multi-byte character, bytes that are no
    UTF-8 (Latin-1, a surrogate), a BOM, NULs, CRLF lines, foreign characters, emptied, removed, a byte flipped at a
    seeded offset."""
    out = [(f'{prefix}-cut-{f}', lambda b, f=f: b[:int(len(b) * f)]) for f in (0.3, 0.97)]
    out += [(f'{prefix}-latin1', lambda b: b[:len(b) // 2] + b'\xe9' + b[len(b) // 2:]),
            (f'{prefix}-cut-utf8', lambda b: b + 'é'.encode()[:1]),
            (f'{prefix}-surrogate', lambda b: b'\xed\xa0\x80' + b),
            (f'{prefix}-bom', lambda b: b'\xef\xbb\xbf' + b),
            (f'{prefix}-nul', lambda b: b.replace(b' ', b'\0', 3)),
            (f'{prefix}-crlf', lambda b: b.replace(b'\n', b'\r\n')),
            (f'{prefix}-foreign', lambda b: 'Ωμέγα ∂ 漢字\n'.encode() + b),
            (f'{prefix}-empty', lambda b: b''),
            (f'{prefix}-missing', lambda b: None)]
    out += [(f'{prefix}-flip-{o}', lambda b, o=o: flipped(b, int(len(b) * o))) for o in (rng.random(),)]
    return out


def json_file_corruptions(prefix, obj, absurd, rng):
    """A JSON object file: text_corruptions, not JSON, other JSON values, deep nesting, and every json_edits."""
    out = [(name, corrupt) for name, corrupt in text_corruptions(prefix, rng) if 'crlf' not in name]
    out += [(f'{prefix}-{what}', lambda b, text=text: text) for what, text in (
        ('not-json', b'vocab_size: 65\n'), ('list', b'[1, 2]'), ('null', b'null'), ('number', b'3'),
        ('string', b'"meta"'), ('deep', b'[' * 100000 + b']' * 100000), ('two-objects', b'{} {}'))]
    out += [(name, lambda b, o=o: json.dumps(o).encode()) for name, o in json_edits(obj, prefix, absurd)]
    return out


def bin_corruptions(split, data, vocab_size, rng):
    """A token file: cut to an odd and to a short length, emptied, removed, a byte more, a token more, ids past the
    vocabulary at seeded places, bytes flipped at seeded offsets."""
    def set_id(b, at, token):
        return b[:2 * at] + token.to_bytes(2, 'little') + b[2 * at + 2:]
    out = [(f'{split}-cut-odd', lambda b: b[:len(b) // 2 * 2 - 1]), (f'{split}-cut-short', lambda b: b[:20]),
           (f'{split}-empty', lambda b: b''), (f'{split}-missing', lambda b: None),
           (f'{split}-byte-more', lambda b: b + b'\0'), (f'{split}-token-more', lambda b: b + b'\0\0')]
    for at in sorted(rng.sample(range(len(data) // 2), 4)):
        token = rng.choice((vocab_size, vocab_size + 1, 65535, rng.randrange(vocab_size, 65536)))
        out.append((f'{split}-id-{token}-at-{at}', lambda b, at=at, token=token: set_id(b, at, token)))
    for offset in sorted(rng.sample(range(len(data)), 4)):
        out.append((f'{split}-flip-{offset}', lambda b, o=offset: flipped(b, o)))
    return out


META_ABSURD = dict(vocab_size=(0, -1, 1, 2.5, True, 10 ** 9, 65537, None), tokenizer=('bytes', None, ['char']),
                   dtype=('float32', 'uint8', 'uint32', 'int64'), itos=('abc', [], None, [1, 2]),
                   train_tokens=(-1,), val_tokens=(10 ** 12,))
CONFIG_JSON_ABSURD = dict(n_layer=(-1,), out_dir=(None,))
HF_ABSURD = dict(vocab_size=(0, -1, 10), hidden_size=(0, -32, 31), num_hidden_layers=(0, -1, 1.5),
                 num_attention_heads=(0, 3), num_key_value_heads=(0, 3), max_position_embeddings=(0, -1, 4),
                 model_type=('bert', 'gpt2', 'mamba', None), intermediate_size=(0,), rms_norm_eps=(-1,),
                 tie_word_embeddings=('yes',))


def config_py_cases(rng):
    """A config file: text_corruptions; code that fails, exits, interrupts; an unknown key; each key retyped and set
    to an absurd value."""
    out = [(name, corrupt) for name, corrupt in text_corruptions('config.py', rng) if 'foreign' not in name]
    out += [(f'config.py-{what}', lambda b, code=code: b + code) for what, code in (
        ('syntax', b'n_layer = = 2\n'), ('indent', b'  n_head = 2\n'), ('exit-0', b'import sys; sys.exit(0)\n'),
        ('exit-3', b'import sys; sys.exit(3)\n'), ('exit-text', b'raise SystemExit("stop")\n'),
        ('interrupt', b'raise KeyboardInterrupt\n'), ('zero-division', b'x = 1 / 0\n'),
        ('import-missing', b'import no_such_module\n'), ('unknown-key', b'n_layr = 2\n'),
        ('vocab-size', b'vocab_size = 50257\n'), ('helper', b'import math\ndef half(x):\n    return x / 2\n'),
        ('private', b'_scratch = [1, 2]\n'), ('set', b'n_layer = {2}\n'), ('none', b'n_layer = None\n'))]
    for key, value in CONFIG.items():
        retyped = 1 if isinstance(value, str) else str(value) if not isinstance(value, bool) else 'False'
        bad = {str: 'nonsense', bool: 2, int: -1, float: -1.0}[type(value)]
        out += [(f'config.py-retype-{key}', lambda b, k=key, v=retyped: b + f'{k} = {v!r}\n'.encode()),
                (f'config.py-{key}={bad!r}', lambda b, k=key, v=bad: b + f'{k} = {v!r}\n'.encode())]
    return out


def jsonl_cases():
    """A .jsonl input of prepare.py: a line whose text is no string or missing, a line that is no object or no JSON."""
    return [(f'docs.jsonl-{what}', lambda b, line=line: b[:len(b) // 2].rsplit(b'\n', 1)[0] + b'\n' + line + b'\n'
             + b[len(b) // 2:].split(b'\n', 1)[1]) for what, line in (
        ('text-number', b'{"text": 3}'), ('text-list', b'{"text": ["a"]}'), ('text-null', b'{"text": null}'),
        ('text-object', b'{"text": {"a": 1}}'), ('text-bool', b'{"text": true}'), ('no-text', b'{"body": "a"}'),
        ('a-list', b'["text"]'), ('a-number', b'3'), ('a-string', b'"text"'), ('torn', b'{"text": "the ca'),
        ('not-json', b'text: the cat'), ('deep', b'[' * 100000 + b']' * 100000), ('blank', b'   '),
        ('extra-field', b'{"text": "a cat", "id": 3}'), ('line-latin1', b'{"text": "caf\xe9"}'))]


def reader_cases(trained_run, tiny_data_root, hf_folder):
    """(name, target, corrupt, command) of every reader's case, generated from the real files, seeded."""
    rng = random.Random(SEED)
    meta = json.loads((tiny_data_root / 'tiny' / 'meta.json').read_text())
    out = [(name, 'meta.json', corrupt, command)
           for name, corrupt in json_file_corruptions('meta', meta, META_ABSURD, rng)
           for command in ('train', 'resume', 'probe')]
    for split in ('train', 'val'):
        data = (tiny_data_root / 'tiny' / f'{split}.bin').read_bytes()
        out += [(name, f'{split}.bin', corrupt, command) for name, corrupt in
                bin_corruptions(split, data, meta['vocab_size'], rng) for command in ('train', 'resume', 'probe')
                if not (command == 'probe' and split == 'train')]  # the probe reads val.bin
    saved = json.loads((trained_run / 'config.json').read_text())
    out += [(name, 'config.json', corrupt, command)  # nothing reads it (ckpt.pt holds the config): each must run
            for name, corrupt in json_file_corruptions('config.json', saved, CONFIG_JSON_ABSURD, rng)
            if 'drop' not in name and 'retype' not in name or name.endswith(('n_layer', 'out_dir'))
            for command in ('sample', 'resume')]
    out += [(name, 'config.py', corrupt, 'train-config') for name, corrupt in config_py_cases(rng)]
    out += [(name, 'prompt', corrupt, 'sample-prompt') for name, corrupt in text_corruptions('prompt', rng)]
    out.append(('prompt-long', 'prompt', lambda b: b * 100, 'sample-prompt'))
    out += [(name, 'docs.txt', corrupt, 'prepare-txt') for name, corrupt in text_corruptions('docs.txt', rng)]
    out += [(name, 'docs.jsonl', corrupt, 'prepare-jsonl') for name, corrupt in
            [*text_corruptions('docs.jsonl', rng), *jsonl_cases()]]
    out += [(name, 'walk.txt', corrupt, command) for name, corrupt in text_corruptions('walk.txt', rng)
            for command in ('walk', 'hf-walk')]
    if hf_folder is not None:
        hf_config = json.loads((hf_folder / 'config.json').read_text())
        out += [(name, 'hf-config', corrupt, command)
                for name, corrupt in json_file_corruptions('hf-config', hf_config, HF_ABSURD, rng)
                for command in ('hf-sample', 'hf-walk', 'hf-prepare')]
    return [case for case in out if hf_folder is not None or not case[3].startswith('hf-')]


def tree(folder):  # every file's digest and every folder under folder
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else 'folder'
            for p in sorted(folder.rglob('*'))}


def check_reader_case(case, trained_run, tiny_data_root, hf_folder, env, capsys, monkeypatch):
    name, target, corrupt, command = case
    shutil.copytree(trained_run, env / 'run', ignore=shutil.ignore_patterns('analysis', 'train.lock'))
    shutil.copytree(tiny_data_root / 'tiny', env / 'data' / 'tiny')
    if hf_folder is not None and (target == 'hf-config' or command.startswith('hf-')):
        shutil.copytree(hf_folder, env / 'hf')
    good_files(env)
    path = env / TARGETS[target]
    corrupted = corrupt(path.read_bytes())
    if corrupted is None:
        path.unlink()
    else:
        path.write_bytes(corrupted)
    before = tree(env)
    monkeypatch.setattr(signal, 'signal', lambda *args: None)  # in-process: leave pytest's handlers alone
    main, argv = READERS[command](env)
    if command.startswith(('prepare', 'hf-prepare')):
        monkeypatch.setattr('sys.argv', argv)
    ended = outcome(name, command, *run_in_process(main, argv, capsys))
    assert ended == 'ran' or tree(env) == before, (name, command, 'a failed run changed or created files', {
        k for k in before.keys() | tree(env).keys() if before.get(k) != tree(env).get(k)})
    return ended


@pytest.fixture(scope='module')
def hf_folder(tmp_path_factory):
    """A random tiny Llama saved by transformers with a word-level tokenizer (None without transformers)."""
    try:
        import transformers
    except ImportError:
        return None
    from conftest import synthetic_text
    from test_walk import save_word_tokenizer
    folder = tmp_path_factory.mktemp('hf') / 'tiny-llama'
    save_word_tokenizer(folder, synthetic_text(200), bert=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(transformers.AutoTokenizer.from_pretrained(folder)), hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True)).save_pretrained(folder)
    return folder


def test_a_seeded_sample_of_every_readers_corrupt_files_is_one_line_or_a_correct_run(
        trained_run, tiny_data_root, hf_folder, tmp_path_factory, capsys, monkeypatch):
    every = reader_cases(trained_run, tiny_data_root, hf_folder)
    for case in random.Random(SEED).sample(every, 20):
        with monkeypatch.context() as m:
            check_reader_case(case, trained_run, tiny_data_root, hf_folder, tmp_path_factory.mktemp('case'), capsys, m)


def test_every_reader_has_its_cases_and_together_they_are_over_300_files(trained_run, tiny_data_root, hf_folder):
    files = {(name, target) for name, target, _, _ in reader_cases(trained_run, tiny_data_root, hf_folder)}
    assert {target for _, target in files} == set(TARGETS) - ({'hf-config'} if hf_folder is None else set())
    assert len(files) >= (300 if hf_folder is not None else 200)


@pytest.mark.slow
@pytest.mark.parametrize('target', TARGETS)  # one test a file: pytest-xdist spreads them over the cores
def test_every_readers_corrupt_file_is_one_line_or_a_correct_run(target, trained_run, tiny_data_root, hf_folder,
                                                                 tmp_path_factory, capsys, monkeypatch):
    if target == 'hf-config' and hf_folder is None:
        pytest.skip('a transformers folder needs transformers')
    every = [case for case in reader_cases(trained_run, tiny_data_root, hf_folder) if case[1] == target]
    failures = []
    for case in every:
        with monkeypatch.context() as m:
            try:
                check_reader_case(case, trained_run, tiny_data_root, hf_folder, tmp_path_factory.mktemp('case'),
                                  capsys, m)
            except AssertionError as e:
                failures.append(str(e)[:600])
    assert not failures, f"{len(failures)} of {len(every)} cases failed:\n" + '\n'.join(failures)


# ---------------------------------------------------------------------------------------------------------------
# GGUF files: a tiny Llama written as llama.cpp's converter writes it (tests/test_hf.py), corrupted and given to
# lab.walk and to sample.py --init_from=FILE, which dequantise it through transformers into a cached folder. GGUF
# holds no checksum: a byte flipped inside a tensor's data loads as another weight (a run that exits 0).

@pytest.fixture(scope='module')
def gguf_file(tmp_path_factory):
    pytest.importorskip('gguf', reason='GGUF files need the gguf package')
    pytest.importorskip('transformers', reason='GGUF files are read through transformers')
    from test_hf import tiny_model, write_gguf
    path = tmp_path_factory.mktemp('gguf') / 'tiny.gguf'
    write_gguf(tiny_model('llama'), path)
    return path


def gguf_cases(path):
    """(name, corrupt): truncated at 6 points, bytes flipped at seeded offsets of the header (metadata and tensor
    table) and of the tensor data, the magic, version and tensor count rewritten, garbage appended."""
    from gguf import GGUFReader
    data = path.read_bytes()
    header = min(int(t.data_offset) for t in GGUFReader(path).tensors)  # where the tensor data begins
    rng = random.Random(SEED)
    out = [(f'gguf-cut-{f}', lambda b, f=f: b[:int(len(b) * f)]) for f in (0.0, 0.01, 0.1, 0.5, 0.9, 0.999)]
    out += [(f'gguf-flip-{o}', lambda b, o=o: flipped(b, o)) for o in sorted(rng.sample(range(header), 24))]
    out += [(f'gguf-flip-data-{o}', lambda b, o=o: flipped(b, o)) for o in sorted(rng.sample(range(header, len(data)), 6))]
    out += [('gguf-magic', lambda b: b'GGUX' + b[4:]), ('gguf-version-99', lambda b: b[:4] + (99).to_bytes(4, 'little') + b[8:]),
            ('gguf-tensor-count-huge', lambda b: b[:8] + (2 ** 40).to_bytes(8, 'little') + b[16:]),
            ('gguf-garbage-appended', lambda b: b + bytes(range(256)) * 4)]
    return out


def gguf_reader(command, path, tmp):
    if command == 'walk':
        from lab import walk
        text = tmp / 'walk.txt'
        text.write_text('the cat sees the dog and the dog sees the cat ' * 20)
        return walk.main, [str(path), '--text', str(text), '--n_seqs=2', '--seq_len=8', '--no-null_model',
                           '--gram_edges=0', '--out', str(tmp / 'walk-out')]
    return sample.main, [f'--init_from={path}', '--start=the', '--num_samples=1', '--max_new_tokens=2', '--device=cpu']


@pytest.mark.slow
def test_every_corrupt_gguf_file_is_one_line_or_a_correct_run(gguf_file, tmp_path_factory, capsys, monkeypatch):
    good, failures, outcomes = gguf_file.read_bytes(), [], []
    cases = gguf_cases(gguf_file)
    assert len(cases) >= 40
    for name, corrupt in cases:
        for command in ('walk', 'sample'):
            tmp = tmp_path_factory.mktemp('case')
            (tmp / 'files').mkdir()
            path = tmp / 'files' / 'tiny.gguf'
            path.write_bytes(corrupt(good))
            monkeypatch.setenv('XDG_CACHE_HOME', str(tmp / 'cache'))  # each case dequantised afresh
            before = tree(tmp / 'files')
            try:
                outcomes.append(outcome(name, command, *run_in_process(*gguf_reader(command, path, tmp), capsys)))
                assert outcomes[-1] == 'ran' or tree(tmp / 'files') == before and not (tmp / 'walk-out').exists(), \
                    (name, command, 'a failed run changed or created files')
            except AssertionError as e:
                failures.append(str(e)[:600])
    assert not failures, f"{len(failures)} of {2 * len(cases)} cases failed:\n" + '\n'.join(failures)
    assert outcomes.count('refused') >= len(cases)  # most corruptions are refused, not run on
