"""common.py: the accelerator table behind MFU, and checkpoint files that a crash never tears (the configurator and
tokenizers are tested through the scripts that use them)."""

import os

import pytest
import torch

from common import load_checkpoint, peak_flops, peak_flops_of, save_checkpoint


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


# ---------------------------------------------------------------------------------------------- atomic checkpoints

def checkpoint(value):
    return dict(model={'w': torch.full((4,), float(value))}, model_args={}, iter_num=value)


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
    with pytest.raises(OSError):
        save_checkpoint(checkpoint(2), str(saved))
    assert load_checkpoint(str(saved))['iter_num'] == 1


def test_a_save_that_dies_before_the_rename_leaves_the_old_checkpoint(saved, monkeypatch):
    """The new file is complete but a crash comes before it replaces the old one: ckpt.pt is still the old one."""
    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # what a second Ctrl-C at that moment raises
    monkeypatch.setattr(os, 'replace', crash)
    monkeypatch.setattr(os, 'rename', crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(checkpoint(2), str(saved))
    monkeypatch.undo()
    assert load_checkpoint(str(saved))['iter_num'] == 1
    save_checkpoint(checkpoint(3), str(saved))  # and the next save goes through
    assert load_checkpoint(str(saved))['iter_num'] == 3
