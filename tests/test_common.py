"""common.py: the accelerator table behind MFU, checkpoint files that a crash never tears, and writes that
fail part-way (a full disk) leaving the old file whole and no temporary file (the configurator and tokenizers
are tested through the scripts that use them)."""

import json
import os
import sys

import pytest
import torch

from common import WriteFailed, append_line, atomic_write, peak_flops, peak_flops_of, save_checkpoint


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
