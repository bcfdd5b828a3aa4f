"""
OpenAI's GPT-2 weights in our own GPT, one job: sources.load_model reads GPT-2 (a name in common.GPT2_NAMES or a
local transformers folder) this way, so GPT-2 trains, samples and walks as model.py's model.
"""

import os

import torch

from common import UserError
from model import GPT, GPTConfig


def gpt2(model_type, **overrides):
    """OpenAI's GPT-2 weights (a name in common.GPT2_NAMES or a local transformers folder) in our GPT, model.py's own
    (sources.load_model reads GPT-2 this way). overrides: dropout and the operator keys (at γ0 = 0, δ0 = 1 every form
    computes exactly GPT-2)."""
    architecture = {'block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'bias'} & set(overrides)
    if architecture:
        raise UserError(f"GPT-2's architecture is fixed by its weights: cannot override {sorted(architecture)}")
    from transformers import GPT2LMHeadModel  # only needed here
    from lab.hf_sources import quiet_transformers, read_config
    if os.path.isdir(model_type):
        read_config(os.path.join(model_type, 'config.json'))  # or one line
    quiet_transformers()
    try:
        hf, loading = GPT2LMHeadModel.from_pretrained(model_type, output_loading_info=True)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load GPT-2 weights {model_type!r}: {str(e).splitlines()[0]} (no network? pass a "
                        f"local folder saved with save_pretrained)") from None
    if loading['missing_keys']:  # transformers fills them in at random, silently: another model's weights
        raise UserError(f"{model_type} holds no GPT-2 weights for {sorted(loading['missing_keys'])[0]} (and "
                        f"{len(loading['missing_keys']) - 1} more): its config.json says model_type 'gpt2' for "
                        f"another model's weights?") from None
    c = hf.config
    model = GPT(GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                          n_embd=c.n_embd, bias=True, **overrides))
    ours, copied = model.state_dict(), set()
    transposed = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')  # Conv1D
    with torch.no_grad():
        for key, value in hf.state_dict().items():
            if key.endswith(('.attn.masked_bias', '.attn.bias')) or key == 'lm_head.weight':
                continue  # causal-mask buffers; lm_head is tied to wte
            value = value.t() if key.endswith(transposed) else value
            target = ours[key][:value.size(0)] if key == 'transformer.wte.weight' else ours[key]  # padded vocabulary
            assert target.shape == value.shape, f"{key}: ours {tuple(target.shape)}, GPT-2 {tuple(value.shape)}"
            target.copy_(value)
            copied.add(key)
    missing = [k for k in ours if k not in copied and '.coefficients.' not in k and k != 'lm_head.weight']
    assert not missing, f"not in the GPT-2 checkpoint: {missing}"
    return model
