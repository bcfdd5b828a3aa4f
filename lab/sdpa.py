"""
--sdpa_backend's check before training: the chosen kernel of F.scaled_dot_product_attention tried on the model's own
forward and backward over a few tokens as it will train (layout, head size, grouped-query heads, dtype, dropout), so
a backend with no kernel for them is one line, not a crash mid-run. common.sdpa_backend reaches it lazily, for any
backend but 'auto', and keeps the run's random numbers as they were.
"""

import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

KERNELS = {'flash': SDPBackend.FLASH_ATTENTION, 'efficient': SDPBackend.EFFICIENT_ATTENTION,
           'cudnn': SDPBackend.CUDNN_ATTENTION, 'math': SDPBackend.MATH}


def refusal(name, model, block_size, device, dtype, autocast):
    """The one line saying why backend `name` cannot run the model's forward and backward (PyTorch's first
    sentence) and what to choose instead, or None; the model's gradients are left as none."""
    try:
        with sdpa_kernel(KERNELS[name]), warnings.catch_warnings(), autocast:
            warnings.simplefilter('ignore')  # PyTorch warns once per reason a kernel was refused; the error says it
            idx = torch.zeros(1, min(16, block_size), dtype=torch.long, device=device)
            model(idx, idx)[1].backward()
    except RuntimeError as e:
        reason = (str(e).strip().splitlines() or ['no kernel'])[0].split('. ')[0].rstrip('.')
        return (f"sdpa_backend={name!r} does not run this model's attention on {device} in {dtype} ({reason}): "
                f"use --sdpa_backend=auto, or one of {', '.join(n for n in KERNELS if n != name)}")
    finally:
        model.zero_grad(set_to_none=True)
    return None
