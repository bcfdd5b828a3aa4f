"""sources.load_checkpoint against bytes changed on disk: torch.save writes a CRC-32 of each record of its zip, and every
load checks those it uses, saying what still works (the corrupt-file fuzz over every reader: tests/test_fuzz.py)."""

import shutil
import struct
import zipfile
import zlib

import pytest
import torch

from common import UserError
from lab.file_checks import changed_records, check_tensors
from sources import load_checkpoint, read_log


def record_of(path, tensor=None):
    """(offset, length) in the file of the zip record that stores this tensor's storage (found by its CRC-32), or
    without a tensor of the pickle."""
    crc = tensor is not None and zlib.crc32(torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage()).numpy())
    with zipfile.ZipFile(path) as archive:
        info = next(info for info in archive.infolist()
                    if info.CRC == crc or tensor is None and info.filename.endswith('/data.pkl'))
    with open(path, 'rb') as f:
        f.seek(info.header_offset + 26)  # the local header's name and extra-field lengths: the data follows them
        name_length, extra_length = struct.unpack('<HH', f.read(4))
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def ckpt_path(trained_run, tmp_path):
    path = tmp_path / 'run' / 'ckpt.pt'
    shutil.copytree(trained_run, path.parent, ignore=shutil.ignore_patterns('analysis', 'train.lock'))
    return path


def test_an_intact_checkpoint_has_no_changed_record_and_loads_for_every_purpose(ckpt_path):
    assert changed_records(ckpt_path) == []
    for purpose in ('info', 'model', 'resume'):
        load_checkpoint(str(ckpt_path), purpose=purpose)


def test_one_bit_flipped_in_a_weight_is_refused_naming_that_weight(ckpt_path):
    ckpt = torch.load(ckpt_path, weights_only=True)
    name = next(key for key in ckpt['model'] if key.endswith('mlp.c_fc.weight'))
    offset, length = record_of(ckpt_path, ckpt['model'][name])
    flip_byte(ckpt_path, offset + length // 2)
    assert len(changed_records(ckpt_path)) == 1
    load_checkpoint(str(ckpt_path), purpose='info')  # config and progress are still readable
    for purpose in ('model', 'resume'):
        with pytest.raises(UserError, match=f"model/{name} does not match the CRC-32 saved with it"):
            load_checkpoint(str(ckpt_path), purpose=purpose)


def test_one_bit_flipped_in_an_optimizer_moment_still_samples_but_cannot_resume(ckpt_path):
    ckpt = torch.load(ckpt_path, weights_only=True)
    moment = ckpt['optimizer']['state'][0]['exp_avg_sq']
    offset, length = record_of(ckpt_path, moment)
    flip_byte(ckpt_path, offset + length - 1)
    assert load_checkpoint(str(ckpt_path), purpose='model')['iter_num'] == ckpt['iter_num']
    with pytest.raises(UserError, match=r"cannot resume the run: optimizer/state/0/exp_avg_sq does not match .*"
                                        r"its weights are intact"):
        load_checkpoint(str(ckpt_path), purpose='resume')


def test_one_bit_flipped_in_the_pickle_is_refused_for_every_purpose(ckpt_path):
    offset, length = record_of(ckpt_path)
    flip_byte(ckpt_path, offset + length // 2)
    for purpose in ('info', 'model', 'resume'):
        with pytest.raises(UserError, match="its bytes changed on disk"):
            load_checkpoint(str(ckpt_path), purpose=purpose)


def test_a_legacy_checkpoint_has_no_crcs_to_check_and_loads(ckpt_path):
    ckpt = torch.load(ckpt_path, weights_only=True)
    torch.save(ckpt, ckpt_path, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(ckpt_path) and changed_records(ckpt_path) == []
    assert load_checkpoint(str(ckpt_path), purpose='resume')['iter_num'] == ckpt['iter_num']


def test_non_finite_values_are_found_in_any_tensor_and_an_overflowing_sum_is_no_false_alarm():
    for bad in (torch.tensor([1.0, float('nan')]), torch.tensor([1.0, float('inf'), -float('inf')])):
        with pytest.raises(ValueError, match="optimizer/state/0/exp_avg holds non-finite values"):
            check_tensors({'optimizer': {'state': {0: {'exp_avg': bad}}}}, ('optimizer',))
    check_tensors({'model': {'w': torch.tensor([6e4, 6e4], dtype=torch.float16)}}, ('model',))  # its sum is inf
    check_tensors({'model': {'w': torch.tensor([1.0, float('nan')])}, 'rng': {}}, ('rng',))  # only the parts asked


def test_a_checkpoint_saved_without_crcs_loads_unchecked(ckpt_path):
    import torch.utils.serialization.config as serialization
    ckpt = torch.load(ckpt_path, weights_only=True)
    # torch then writes 0 in every CRC field; its own patch, not pytest's monkeypatch, whose undo (pytest 9.2) deletes
    # the setting for every later save of the process
    with serialization.patch({'save.compute_crc32': False}):
        torch.save(ckpt, ckpt_path)
    assert changed_records(ckpt_path) == []
    assert load_checkpoint(str(ckpt_path), purpose='resume')['iter_num'] == ckpt['iter_num']


def test_a_byte_flipped_anywhere_in_the_zips_directory_is_one_line_or_a_checkpoint_as_saved(ckpt_path):
    """The central directory and its end record (the file's last bytes) say where each record is: a damaged one is
    a UserError, or, where the flip left every record readable as saved (a timestamp, say), the checkpoint loads."""
    good, saved = ckpt_path.read_bytes(), torch.load(ckpt_path, weights_only=True)
    with zipfile.ZipFile(ckpt_path) as archive:
        directory = archive.start_dir  # the central directory's offset
    for offset in range(directory, len(good), max(1, (len(good) - directory) // 50)):  # about 50 of its bytes
        ckpt_path.write_bytes(good[:offset] + bytes([good[offset] ^ 0xFF]) + good[offset + 1:])
        try:
            ckpt = load_checkpoint(str(ckpt_path), purpose='resume')
        except UserError:
            continue
        assert ckpt['iter_num'] == saved['iter_num'] and changed_records(ckpt_path) == [], offset


def test_a_malformed_last_log_line_is_skipped_only_when_a_crash_tore_it(trained_run, tmp_path):
    """log.jsonl's last line without its newline is an append a crash cut short: skipped, the lines before it read.
    The same bytes ended by a newline were written whole, so they are wrong, not torn: one line naming the line."""
    shutil.copytree(trained_run, tmp_path / 'run', ignore=shutil.ignore_patterns('analysis', 'train.lock'))
    path = tmp_path / 'run' / 'log.jsonl'
    good = path.read_bytes()
    entries = read_log(path.parent)
    path.write_bytes(good + b'{"iter": 80, "tokens": 5')
    assert read_log(path.parent) == entries
    path.write_bytes(good + b'{"iter": 80, "tokens": 5\n')
    with pytest.raises(UserError) as e:
        read_log(path.parent)
    assert str(e.value).startswith(f"{path}:{len(entries) + 1}: not a log line train.py writes")


def test_a_model_key_newer_than_the_checkpoint_takes_the_run_configs_value_when_it_has_one(ckpt_path, capsys):
    """A checkpoint whose model_args lack a key reads it from its run config (here init_spread=0.2, not GPTConfig's
    0.0), and says so once; without it in the config either, the default (test_train.py checks that branch)."""
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt['config']['init_spread'] == 0.2
    del ckpt['model_args']['init_spread']
    torch.save(ckpt, ckpt_path)
    for _ in range(2):
        assert load_checkpoint(ckpt_path)['model_args']['init_spread'] == 0.2
    assert capsys.readouterr().err == f"{ckpt_path} predates model_args init_spread (read as 0.2)\n"
