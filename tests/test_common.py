"""common.py: the configurator's promises (a value takes its default's type, an int where a float is, a bool is no
number, None only where optional, files in order then overrides, an unknown key named), the 'auto' dtype, the
accelerator table behind MFU, checkpoint files that a crash never tears, and writes that fail part-way (a full disk)
leaving the old file whole and no temporary file (the tokenizers are tested through the scripts that use them)."""

import json
import os
import sys

import pytest
import torch

from model import OPERATOR_DEFAULTS, OPERATOR_KEYS, OPERATORS
from common import (UserError, WriteFailed, append_line, atomic_write, auto_cpu_dtype, model_config, parse_config,
                    peak_flops, peak_flops_of, resolve_dtype, save_checkpoint, saved_config)


@pytest.mark.parametrize('name,bf16,tf32', [
    ('NVIDIA H100 80GB HBM3', 989e12, 494e12),    # SXM
    ('NVIDIA H100 PCIe', 756e12, 378e12),
    ('NVIDIA H100 NVL', 835e12, 418e12),          # not the SXM part whose name it contains
    ('NVIDIA H200', 989e12, 494e12),
    ('NVIDIA H200 NVL', 835e12, 418e12),
    ('NVIDIA A100-SXM4-80GB', 312e12, 156e12),
])
def test_peak_flops_match_the_most_specific_gpu_name(name, bf16, tf32):
    assert peak_flops_of(name, 'bfloat16') == peak_flops_of(name, 'float16') == bf16
    assert peak_flops_of(name, 'float32') == tf32


def test_no_peak_for_unknown_gpus_or_the_cpu():
    assert peak_flops_of('NVIDIA GeForce RTX 4090', 'bfloat16') is None
    assert peak_flops('cpu', 'float32') is None


# ---------------------------------------------------------------------------------------------- the configurator

# one key of each kind a script's DEFAULTS has (train.py's n_layer, learning_rate, compile, operator; sample.py's top_k)
KINDS = dict(n_layer=12, learning_rate=6e-4, compile=True, operator='attention', top_k=200)


def test_a_value_takes_its_defaults_type_and_an_int_where_a_float_is_becomes_a_float(tmp_path):
    config = parse_config(KINDS, ['--n_layer=3', '--learning_rate=1', '--compile=False', '--operator=corridor'])
    assert config == dict(n_layer=3, learning_rate=1.0, compile=False, operator='corridor', top_k=200)
    assert type(config['learning_rate']) is float and type(config['n_layer']) is int  # 1, not True, not 1.0
    (tmp_path / 'c.py').write_text('learning_rate = 2\nn_layer = 4\n')  # a config file's int too
    config = parse_config(KINDS, [str(tmp_path / 'c.py')])
    assert type(config['learning_rate']) is float and config['learning_rate'] == 2.0 and config['n_layer'] == 4


@pytest.mark.parametrize('arg,message', [
    ('--n_layer=True', "n_layer must be int like its default 12, got True"),        # a bool is no number
    ('--n_layer=False', "n_layer must be int like its default 12, got False"),
    ('--learning_rate=True', "learning_rate must be float like its default 0.0006, got True"),
    ('--compile=1', "compile must be bool like its default True, got 1"),            # nor a number a bool
    ('--compile=0.0', "compile must be bool like its default True, got 0.0"),
    ('--n_layer=3.0', "n_layer must be int like its default 12, got 3.0"),           # a float is no int, even whole
    ('--operator=3', "operator must be str like its default 'attention', got 3"),
    ('--learning_rate=[1e-3]', "learning_rate must be float like its default 0.0006, got [0.001]"),
    ('--n_layer=None', "n_layer must be int like its default 12, got None"),         # None: only optional keys
])
def test_a_value_of_another_type_is_one_line_naming_the_key_its_default_and_the_value(arg, message):
    with pytest.raises(UserError) as e:
        parse_config(KINDS, [arg], optional=('top_k',))
    assert str(e.value) == message


def test_none_only_for_the_optional_keys_and_an_optional_key_keeps_its_type_otherwise():
    assert parse_config(KINDS, ['--top_k=None'], optional=('top_k',))['top_k'] is None
    assert parse_config(KINDS, ['--top_k=None', '--top_k=5'], optional=('top_k',))['top_k'] == 5
    with pytest.raises(UserError, match="top_k must be int like its default 200, got None"):
        parse_config(KINDS, ['--top_k=None'])  # not named optional
    with pytest.raises(UserError, match="top_k must be int like its default 200, got 2.5"):
        parse_config(KINDS, ['--top_k=2.5'], optional=('top_k',))


def test_config_files_apply_in_order_then_the_overrides_and_the_defaults_stay_untouched(tmp_path):
    (tmp_path / 'a.py').write_text('n_layer = 2\nlearning_rate = 1e-3\n')
    # what is not a key: private names, imports, functions
    (tmp_path / 'b.py').write_text('import math\n_scratch = 7\ndef helper():\n    pass\nn_layer = 4\n')
    before = dict(KINDS)
    assert parse_config(KINDS, [str(tmp_path / 'a.py'), str(tmp_path / 'b.py')])['n_layer'] == 4
    config = parse_config(KINDS, [str(tmp_path / 'a.py'), str(tmp_path / 'b.py'), '--n_layer=6'])
    assert config == {**KINDS, 'n_layer': 6, 'learning_rate': 1e-3}
    assert KINDS == before and config is not KINDS


def test_an_unknown_key_or_a_wrong_type_in_a_config_file_names_the_file(tmp_path):
    (tmp_path / 'c.py').write_text('n_layr = 3\n')
    with pytest.raises(UserError) as e:
        parse_config(KINDS, [str(tmp_path / 'c.py')])
    assert str(e.value) == f"unknown config key 'n_layr' in {tmp_path / 'c.py'} (did you mean 'n_layer'?)"
    (tmp_path / 'c.py').write_text('compile = 1\n')
    with pytest.raises(UserError) as e:
        parse_config(KINDS, [str(tmp_path / 'c.py')])
    assert str(e.value) == "compile must be bool like its default True, got 1"
    with pytest.raises(UserError) as e:
        parse_config(KINDS, ['--vocab_size=50304'], hints=dict(vocab_size='vocab_size comes from the data'))
    assert str(e.value) == "vocab_size comes from the data (the command line)"


def test_a_saved_config_is_checked_as_the_command_line_is_and_its_unknown_keys_are_left_out():
    config, ignored = saved_config(KINDS, dict(n_layer=4, learning_rate=1, old_key='x', another=1), 'ckpt.pt')
    assert config == {**KINDS, 'n_layer': 4, 'learning_rate': 1.0} and type(config['learning_rate']) is float
    assert ignored == ['another', 'old_key']
    for saved, message in ((dict(n_layer=True), "ckpt.pt: n_layer must be int like its default 12, got True"),
                           (dict(top_k=None), "ckpt.pt: top_k must be int like its default 200, got None"),
                           (dict(compile='yes'), "ckpt.pt: compile must be bool like its default True, got 'yes'")):
        with pytest.raises(UserError) as e:
            saved_config(KINDS, saved, 'ckpt.pt')
        assert str(e.value) == message


SMALL = dict(block_size=8, vocab_size=16, n_layer=1, n_head=4, n_embd=16)


@pytest.mark.parametrize('keys,message', [
    (dict(n_head=0), "n_head must be positive, got 0"),
    (dict(block_size=0), "block_size must be positive, got 0"),
    (dict(n_embd=18), "n_embd=18 must be divisible by n_head=4"),
    (dict(dropout=1.0), "dropout must be in [0, 1), got 1.0"),
    (dict(dropout=-0.1), "dropout must be in [0, 1), got -0.1"),
    (dict(operator='corridor', init_spread=-0.1), "init_spread must be >= 0, got -0.1"),
    (dict(operator='corridor', operator_lr_mult=-1.0), "operator_lr_mult must be >= 0, got -1.0"),
    (dict(operator='corridor', gamma_init=float('inf')), "gamma_init must be finite in float32, got inf"),
    (dict(operator='alpha', delta_init=float('nan')), "delta_init must be finite in float32, got nan"),
    (dict(operator='corridor', gamma_init=4e38), "gamma_init must be finite in float32, got 4e+38"),
    (dict(operator='laplacian', laplacian_heads=0), "laplacian_heads must be in [1, n_head=4], got 0"),
    (dict(operator='laplacian', laplacian_heads=5), "laplacian_heads must be in [1, n_head=4], got 5"),
    (dict(operator='corridor', gamma_nonneg=True, gamma_init=0.1, init_spread=0.2),
     "gamma_nonneg needs gamma_init - init_spread >= 0, got 0.1 - 0.2"),
    (dict(operator='attention', gamma_init=-0.1), "operator='attention' does not read gamma_init"),
])
def test_a_config_no_model_can_have_is_one_line_when_the_config_is_built(keys, message):
    with pytest.raises(UserError) as e:
        model_config({**SMALL, **keys})
    assert message in str(e.value)


@pytest.mark.parametrize('operator', OPERATORS)
def test_a_key_the_chosen_form_does_not_read_is_one_line_naming_the_forms_that_do(operator):
    """Each form's entry says which keys it reads; every other operator key, set away from its default, is refused
    (at its default it is accepted: a config that never mentions it)."""
    form = OPERATORS[operator]
    for key in OPERATOR_KEYS[1:]:
        default = OPERATOR_DEFAULTS[key]
        other = (not default) if isinstance(default, bool) else default + (2 if key == 'laplacian_heads' else 0.25)
        config = {**SMALL, 'operator': operator, key: other}
        if key in form.keys:
            assert getattr(model_config(config), key) == other
            continue
        with pytest.raises(UserError) as e:
            model_config(config)
        readers = ', '.join(name for name, f in OPERATORS.items() if key in f.keys)
        assert f"operator={operator!r} does not read {key}" in str(e.value) and f"{key} is read by {readers}" in \
            str(e.value)
        assert getattr(model_config({**config, key: default}), key) == default
        assert getattr(model_config(config, saved=True), key) == other  # a saved model is read as it trained


@pytest.mark.parametrize('keys', [dict(dropout=0.0), dict(dropout=0.999), dict(operator='corridor', operator_lr_mult=0.0),
                                  dict(operator='laplacian', laplacian_heads=1),
                                  dict(operator='laplacian', laplacian_heads=4),
                                  dict(operator='corridor', gamma_nonneg=True, gamma_init=0.25, init_spread=0.25),
                                  dict(operator='corridor', init_spread=0.0), dict(n_head=1, n_embd=1)])
def test_every_boundary_a_model_can_have_is_accepted(keys):
    config = model_config({**SMALL, **keys})
    assert all(getattr(config, k) == v for k, v in keys.items())


# ---------------------------------------------------------------------------------------------- dtype='auto'

def fake_gpus(monkeypatch, capabilities):
    """GPUs of these compute capabilities, one per index (cuda without an index: the current one, 0)."""
    asked = []

    def capability(device=None):
        index = torch.device(device).index if device is not None else None
        asked.append(index)
        return capabilities[index or 0]
    monkeypatch.setattr(torch.cuda, 'get_device_capability', capability)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda including_emulation=True: True)  # a V100 says yes
    return asked


def test_auto_dtype_follows_the_capability_of_the_runs_own_gpu(monkeypatch):
    """A node with a V100 (7.0) as cuda:0 and an H100 (9.0) as cuda:1: each run's dtype is its own GPU's."""
    asked = fake_gpus(monkeypatch, {0: (7, 0), 1: (9, 0)})
    assert resolve_dtype('auto', 'cuda:1') == 'bfloat16'
    assert resolve_dtype('auto', 'cuda:0') == 'float16'
    assert resolve_dtype('auto', 'cuda') == 'float16'
    assert asked[:2] == [1, 0]
    fake_gpus(monkeypatch, {0: (8, 0)})  # an A100, the first with native bf16
    assert resolve_dtype('auto', 'cuda') == 'bfloat16'


@pytest.mark.parametrize('capability', [(7, 5), (9, 0)])
def test_an_explicit_dtype_is_kept_on_any_gpu_and_on_the_cpu_and_auto_on_the_cpu_is_float32(monkeypatch, capability):
    fake_gpus(monkeypatch, {0: capability})
    for dtype in ('float32', 'bfloat16', 'float16'):
        assert resolve_dtype(dtype, 'cuda:0') == dtype and resolve_dtype(dtype, 'cpu') == dtype
    assert resolve_dtype('auto', 'cpu') == 'float32'


@pytest.mark.parametrize('avx512_bf16,amx,n_embd,expected', [
    (True, True, 256, 'bfloat16'), (True, False, 768, 'bfloat16'), (False, True, 256, 'bfloat16'),
    (True, True, 255, 'float32'), (True, True, None, 'float32'), (False, False, 4096, 'float32')])
def test_auto_dtype_on_a_cpu_is_bfloat16_only_with_bf16_units_and_n_embd_from_256(monkeypatch, avx512_bf16, amx,
                                                                                   n_embd, expected):
    """Either unit is enough (AMX without AVX512-BF16 exists); the width is the measured crossover; MPS stays float32
    and a named dtype is kept."""
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, '_is_amx_tile_supported', lambda: amx)
    assert resolve_dtype('auto', 'cpu', n_embd) == auto_cpu_dtype(n_embd)[0] == expected
    assert resolve_dtype('auto', 'mps', n_embd) == 'float32' and resolve_dtype('float16', 'cpu', n_embd) == 'float16'


# ---------------------------------------------------------------------------------------------- writes that fail

def disk_with_room(monkeypatch, room, filling=lambda path: True):
    """common's open() writes the files `filling` picks to a disk with `room` bytes left: the write that crosses it
    is cut short, the next raises ENOSPC (as a full disk does)."""
    import errno
    import io
    import common
    left = [room]

    class FillingFile(io.FileIO):
        def write(self, b):
            if left[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = super().write(bytes(memoryview(b).cast('B')[:left[0]]))
            left[0] -= n
            return n

    def open_on_full_disk(path, mode='r', **kwargs):
        if not filling(str(path)):
            return open(path, mode, **kwargs)
        raw = FillingFile(path, mode.replace('b', '').replace('t', ''))
        buffered = io.BufferedWriter(raw)
        return buffered if 'b' in mode else io.TextIOWrapper(buffered, **kwargs)
    monkeypatch.setattr(common, 'open', open_on_full_disk, raising=False)


def test_a_checkpoint_save_that_fills_the_disk_keeps_the_old_checkpoint_and_leaves_no_temporary_file(tmp_path,
                                                                                                    monkeypatch):
    path = tmp_path / 'ckpt.pt'
    save_checkpoint({'iter_num': 10, 'w': torch.arange(4.0)}, str(path))
    disk_with_room(monkeypatch, 5000)  # the new checkpoint is ~400 kB: torch's serializer fails part-way
    with pytest.raises(WriteFailed) as failed:
        save_checkpoint({'iter_num': 20, 'w': torch.randn(100_000)}, str(path))
    assert failed.value.path == str(path) and 'No space left on device' in failed.value.reason
    assert '\n' not in str(failed.value)
    old = torch.load(path, weights_only=True)
    assert old['iter_num'] == 10 and torch.equal(old['w'], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt.pt']
    assert torch.load(path, weights_only=True, mmap=True)['iter_num'] == 10  # readable, memory-mapped


def test_a_first_save_that_fills_the_disk_leaves_nothing(tmp_path, monkeypatch):
    disk_with_room(monkeypatch, 100)
    with pytest.raises(WriteFailed):
        save_checkpoint({'iter_num': 10, 'w': torch.randn(1000)}, str(tmp_path / 'ckpt.pt'))
    assert list(tmp_path.iterdir()) == []


def test_a_text_file_written_on_a_full_disk_stays_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / 'report.json'
    path.write_text('{"old": true}\n')
    disk_with_room(monkeypatch, 10)
    with pytest.raises(WriteFailed):
        with atomic_write(str(path)) as f:
            json.dump({'new': list(range(1000))}, f)
    assert path.read_text() == '{"old": true}\n' and [p.name for p in tmp_path.iterdir()] == ['report.json']


def test_an_error_that_is_not_the_disks_passes_through_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / 'summary.md'
    path.write_text('old\n')
    with pytest.raises(ZeroDivisionError):
        with atomic_write(str(path)) as f:
            f.write('half a table')
            1 / 0
    assert path.read_text() == 'old\n' and [p.name for p in tmp_path.iterdir()] == ['summary.md']


@pytest.mark.skipif(sys.platform != 'linux', reason='RLIMIT_FSIZE and SIGXFSZ as on Linux')
def test_a_log_line_that_does_not_fit_is_cut_back_off(tmp_path):
    """A real short write: the kernel's file size limit (RLIMIT_FSIZE, no root needed) stops the line part-way."""
    import resource
    import signal
    log = tmp_path / 'log.jsonl'
    log.write_text('{"iter": 0}\n')
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, limits[1]))
    try:
        with pytest.raises(WriteFailed) as failed:
            append_line(str(log), json.dumps({'iter': 10, 'loss': [1.0] * 50}))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert 'File too large' in failed.value.reason
    assert log.read_text() == '{"iter": 0}\n'
    append_line(str(log), '{"iter": 10}')
    assert log.read_text() == '{"iter": 0}\n{"iter": 10}\n'


# ---------------------------------------------------------------------------------------------- atomic checkpoints

def checkpoint(value):
    return dict(model={'w': torch.full((4,), float(value))}, model_args={}, iter_num=value)


def read(path):  # the file as torch reads it: these checkpoints test the writes, not load_checkpoint's schema
    return torch.load(path, weights_only=True)


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / 'ckpt.pt'
    save_checkpoint(checkpoint(1), str(path))
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt']  # no temporary file left behind
    return path


def test_a_save_that_dies_while_writing_leaves_the_old_checkpoint(saved, monkeypatch):
    """A crash in the middle of torch.save (disk full, out of memory, killed): half a new file was written
    somewhere, but ckpt.pt is still the old, readable checkpoint."""
    def torn_save(obj, f, *args, **kwargs):
        torn = b'PK\x03\x04 half a zip archive'
        if isinstance(f, (str, os.PathLike)):
            with open(f, 'wb') as handle:
                handle.write(torn)
        else:
            f.write(torn)
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(torch, 'save', torn_save)
    with pytest.raises(WriteFailed):  # the disk's error, as one line for the user
        save_checkpoint(checkpoint(2), str(saved))
    assert read(saved)['iter_num'] == 1


def test_a_save_that_dies_before_the_rename_leaves_the_old_checkpoint(saved, monkeypatch):
    """The new file is complete but a crash comes before it replaces the old one: ckpt.pt is still the old one."""
    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # what a second Ctrl-C at that moment raises
    monkeypatch.setattr(os, 'replace', crash)
    monkeypatch.setattr(os, 'rename', crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(checkpoint(2), str(saved))
    monkeypatch.undo()
    assert read(saved)['iter_num'] == 1
    save_checkpoint(checkpoint(3), str(saved))  # and the next save goes through
    assert read(saved)['iter_num'] == 3


# ---------------------------------------------------------------------------------------------- --device=mps
# No Apple GPU here: each decision that depends on the device is checked on the string 'mps', with torch.mps's
# functions recorded in place of the real ones.

@pytest.fixture
def fake_mps(monkeypatch):
    """torch.mps as an available device whose calls are recorded: (calls, the generator state it holds)."""
    calls, state = [], {'rng': torch.arange(4, dtype=torch.uint8)}
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: True)
    monkeypatch.setattr(torch.mps, 'synchronize', lambda: calls.append('synchronize'))
    monkeypatch.setattr(torch.mps, 'get_rng_state', lambda *a: (calls.append('get_rng_state'), state['rng'].clone())[1])
    monkeypatch.setattr(torch.mps, 'set_rng_state', lambda s, *a: (calls.append('set_rng_state'), state.update(rng=s)))
    for name in ('synchronize', 'get_rng_state', 'set_rng_state'):  # never CUDA's on mps
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name: pytest.fail(f'torch.cuda.{name} on mps'))
    return calls, state


def test_mps_unavailable_is_one_line_naming_the_cpu_instead(monkeypatch):
    from common import check_device
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: False)
    with pytest.raises(UserError) as e:
        check_device('mps')
    assert str(e.value) == ("device='mps' but MPS is not available here (it needs Apple silicon and a PyTorch built "
                            "with MPS): use --device=cpu")
    check_device('cpu')  # nothing to check


def test_on_mps_auto_is_float32_timing_synchronises_mps_and_its_generator_is_saved_and_restored(fake_mps):
    from common import check_device, device_rng_state, rng_untouched, set_device_rng_state, synchronize
    calls, state = fake_mps
    check_device('mps')
    assert resolve_dtype('auto', 'mps') == 'float32' and resolve_dtype('bfloat16', 'mps') == 'bfloat16'
    synchronize('mps')
    synchronize('cpu')
    assert calls == ['synchronize']
    saved = device_rng_state('mps')
    assert torch.equal(saved, state['rng']) and device_rng_state('cpu') is None
    set_device_rng_state('mps', torch.zeros(4, dtype=torch.uint8))
    assert torch.equal(state['rng'], torch.zeros(4, dtype=torch.uint8))
    host = torch.get_rng_state()
    with rng_untouched('mps'):  # the SDPA probe's: what it draws leaves no trace on either generator
        state['rng'] = torch.ones(4, dtype=torch.uint8)
        torch.rand(3)
    assert torch.equal(state['rng'], torch.zeros(4, dtype=torch.uint8)) and torch.equal(torch.get_rng_state(), host)


def test_on_mps_the_optimizer_is_not_cudas_fused_one():
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=4, vocab_size=8, operator='corridor'))
    for device_type, fused in (('mps', False), ('cpu', False)):
        optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), device_type)
        assert bool(optimizer.defaults['fused']) == fused


def test_a_checkpoint_keeps_the_mps_generator_and_a_resume_on_mps_restores_it(fake_mps, tmp_path):
    import run
    from types import SimpleNamespace
    from model import GPT, GPTConfig
    calls, state = fake_mps
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=4, vocab_size=8))
    model.source = None
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'mps')
    scaler = torch.amp.GradScaler('cpu', enabled=False)
    cfg = SimpleNamespace(train_only='all', out_dir=str(tmp_path), seed=0)
    progress = dict(iter_num=3, tokens_seen=12, best_val_loss=1.0, seconds=2.0)
    ckpt = run.checkpoint_state(model, optimizer, scaler, cfg, dict(tokenizer='char'), progress, torch.Generator(),
                                'mps')
    assert torch.equal(ckpt['rng']['mps'], state['rng']) and ckpt['rng']['cuda'] is None
    state['rng'] = torch.zeros(4, dtype=torch.uint8)
    restored = run.restore_state(ckpt, optimizer, scaler, torch.Generator(), cfg, 'mps', 0)
    assert torch.equal(state['rng'], torch.arange(4, dtype=torch.uint8)) and restored['seconds'] == 2.0


def test_torchrun_on_mps_is_one_line(fake_mps, monkeypatch):
    import run
    from types import SimpleNamespace
    monkeypatch.setenv('RANK', '0')
    with pytest.raises(UserError) as e:
        with run.processes(SimpleNamespace(device='mps', backend='auto', gradient_accumulation_steps=1)):
            pass
    assert 'no process-group backend for MPS' in str(e.value)


# ---------------------------------------------------------------------------------------------- --help

@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'lab/sweep.py'])
def test_help_gives_every_key_its_default_and_a_meaning_grouped_as_the_defaults_are(script):
    """--help's list is read from the comments beside the defaults (the model's keys from GPTConfig's): every key has
    one, so a key added without a comment fails here, not silently in --help."""
    import importlib
    from common import REPO
    from lab.key_help import key_help
    defaults = importlib.import_module(script[:-3].replace('/', '.')).DEFAULTS
    text = key_help(defaults, os.path.join(REPO, script))
    lines = text.splitlines()
    for key, value in defaults.items():
        line = next(line for line in lines if line.startswith(f"  {key}={value!r}"))
        assert len(line.split(maxsplit=1)) == 2, f"{script}: --help gives {key} no meaning"
    if script == 'train.py':  # the groups, in the defaults' order, the operator's keys under their own heading
        headings = [line for line in lines if line and not line.startswith(' ')][1:]
        assert headings[0] == 'I/O' and headings[-1] == 'system' and any('attention operator' in h for h in headings)
        operator = lines.index(next(h for h in headings if 'attention operator' in h))
        assert lines[operator + 1].startswith("  operator='attention'") and 'OPERATORS' in lines[operator + 1]


def test_key_meanings_reads_headings_entries_and_continued_comments(tmp_path):
    from lab.key_help import key_meanings
    (tmp_path / 'script.py').write_text(
        "X = 1\nDEFAULTS = dict(\n    # first group\n    a=1,          # the a\n    b='x',\n"
        "                  # b's meaning, continued\n    # second group\n    **OTHER,\n    c=2,  # the c\n)\n"
        "y = 3  # not a key\n")
    found = key_meanings(tmp_path / 'script.py', r'^DEFAULTS = dict\(')
    assert found == {'a': ('first group', 'the a'), 'b': ('first group', "b's meaning, continued"),
                     '**': ('second group', ''), 'c': ('second group', 'the c')}
