"""common.py: the accelerator table behind MFU (the configurator, checkpoints and tokenizers are tested through
the scripts that use them)."""

import pytest

from common import peak_flops, peak_flops_of


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
