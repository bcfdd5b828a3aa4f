"""
The operator inside a pretrained transformers causal LM, one job: PretrainedLM (Llama, Qwen2/3, Gemma 3, GPT-2)
whose every attention head applies model.py's operator through model.apply_operator, the line our GPT runs, after
the model's own attention; load_pretrained builds it for train.py and sample.py (through sources.py), and
parameter_count sizes it for lab/sweep.py's plans.
"""

import inspect
import sys

import torch

from common import UserError, model_config
from lab.gguf_files import gguf_folder, gguf_path, is_gguf
from lab.hf_sources import FAMILIES, model_folder, model_type, quiet_transformers
from lab.hf_tokenizer import load_tokenizer, tokenizer_fingerprint
from model import GPT, OperatorCoefficients, apply_operator, lm_loss, next_token


# The operator family inside a transformers causal LM. transformers looks a layer's attention function up by name
# (config._attn_implementation) in its AttentionInterface registry; 'corridor' is ours: the model's own SDPA call
# (its masks, GQA, sliding windows and scaling untouched), then model.py's apply_operator, the line our GPT runs.
OPERATOR_ATTENTION = 'corridor'              # SDPA, then the operator: training, sampling
OPERATOR_ATTENTION_EAGER = 'corridor_eager'  # the model's own eager attention (P returned), then the operator: lab/walk.py
CAUSAL_FAMILIES = ('gpt2', *(name for name, family in FAMILIES.items() if family.causal))


def operator_output(module, pv, query, value):
    """out_h = c_I·V_h + c_P·(P_h V_h) for P·V [B, T, H, d_h] from one of transformers' attention functions, with this
    layer's (c_I, c_P) from module.coefficients (model.OperatorCoefficients). query [B, H, T, d_h]; value
    [B, n_kv, S, d_h], S ≥ T with a KV cache (the query positions are the last T)."""
    if module.coefficients.is_plain_attention:
        return pv  # (c_I, c_P) = (0, 1), as model.py's attention
    H, T = query.shape[1], query.shape[2]
    # the identity term reads each query head's own value head: with GQA, query head h reads KV head h // (H / n_kv)
    v = value[:, :, -T:].repeat_interleave(H // value.shape[1], dim=1).transpose(1, 2)  # [B, T, H, d_h]
    c_I, c_P = (c.view(-1, 1) for c in module.coefficients())   # one (c_I, c_P) per head, [H, 1]
    return apply_operator(c_I, c_P, v, pv).to(pv.dtype)  # model.py's own line, in the model's dtype


def operator_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention (its masks, GQA, sliding windows and scaling untouched), then the operator."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    pv, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return operator_output(module, pv, query, value), None


def operator_attention_eager(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention (its modeling file's eager_attention_forward, which returns P), then the
    operator."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    pv, probs = eager(module, query, key, value, attention_mask, **kwargs)
    return operator_output(module, pv, query, value), probs


def register_operator_attention():
    """Make the two names transformers attention functions, with SDPA's and eager attention's masks (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
    AttentionInterface.register(OPERATOR_ATTENTION, operator_attention)
    AttentionInterface.register(OPERATOR_ATTENTION_EAGER, operator_attention_eager)
    AttentionMaskInterface.register(OPERATOR_ATTENTION, sdpa_mask)
    AttentionMaskInterface.register(OPERATOR_ATTENTION_EAGER, eager_mask)


def attention_modules(lm):
    """A causal LM's attention modules, first layer first."""
    kind = lm.config.model_type
    if kind == 'gpt2':
        return [block.attn for block in lm.base_model.h]
    family = FAMILIES[kind]
    return family.attention(family.text_model(lm.base_model))


def text_config(lm):
    config = lm.config
    return config.get_text_config() if hasattr(config, 'get_text_config') else config


class PretrainedLM(torch.nn.Module):
    """A transformers causal LM (Llama, Qwen2/3, Gemma 3, GPT-2) whose every attention head applies one operator of
    model.py's family: each attention module gets an OperatorCoefficients, exactly as our GPT's, and the model runs
    operator_attention. At γ0 = 0, δ0 = 1 (the default) it computes the pretrained model's logits.

    It answers what train.py, sample.py and analyze.py ask of model.GPT: forward(idx, targets) -> (logits, loss),
    operator_coefficients(), operator_parameters(), configure_optimizers(), get_num_params(), non_embedding_params(),
    head_size, generate(), and `config`: a GPTConfig with the model's sizes and the operator keys."""

    def __init__(self, lm, config, source, tokenizer_fingerprint=None):
        super().__init__()
        self.lm, self.config, self.source = lm, config, source
        self.tokenizer_fingerprint = tokenizer_fingerprint  # its tokenizer's (load_pretrained), for sources.check_tokenizer
        for attn in attention_modules(lm):
            attn.coefficients = OperatorCoefficients(config)
        register_operator_attention()
        lm.set_attn_implementation(OPERATOR_ATTENTION)

    def forward(self, idx, targets=None, **loss_options):
        logits = self.lm(input_ids=idx, use_cache=False).logits
        return logits, None if targets is None else lm_loss(logits, targets, **loss_options)  # model.py's, as GPT

    @property
    def head_size(self):
        c = text_config(self.lm)
        return getattr(c, 'head_dim', None) or c.hidden_size // c.num_attention_heads

    def operator_coefficients(self):
        """(c_I, c_P) of every head: [n_layer, n_head, 2], detached, on CPU (as GPT's)."""
        with torch.no_grad():
            return torch.stack([torch.stack(attn.coefficients(), dim=-1).float().cpu()
                                for attn in attention_modules(self.lm)])

    def operator_parameters(self):
        return [p for attn in attention_modules(self.lm) for p in attn.coefficients.parameters()]

    configure_optimizers = GPT.configure_optimizers  # the same groups: it only asks for the two methods above

    def get_num_params(self, non_embedding=True):
        """Parameters, as GPT counts them: position embeddings excluded (RoPE models have none), the token embedding
        counted when it is the output layer too (tied), not when it is only a lookup."""
        n = sum(p.numel() for p in self.parameters())
        embedding, output = self.lm.get_input_embeddings().weight, self.lm.get_output_embeddings()
        tied = output is not None and output.weight is embedding
        return n - embedding.numel() if non_embedding and not tied else n

    def non_embedding_params(self):
        """Parameters without the token embedding (nor an output layer tied to it): a scaling law's count."""
        return sum(p.numel() for p in self.parameters()) - self.lm.get_input_embeddings().weight.numel()

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """As GPT.generate, through the model's own KV cache (the operator's identity term reads the new token's
        value, the cache only feeds P·V)."""
        past = None
        cache_key = 'cache' if 'cache' in inspect.signature(self.lm.forward).parameters else 'past_key_values'  # 5.24+
        for _ in range(max_new_tokens):
            if past is None:
                out = self.lm(input_ids=idx, use_cache=use_cache)
            else:
                out = self.lm(input_ids=idx[:, -1:], use_cache=True, **{cache_key: past})
            past = getattr(out, cache_key) if use_cache else None
            logits = out.logits[:, -1, :]
            idx = torch.cat((idx, next_token(logits.to(torch.promote_types(logits.dtype, torch.float32)), temperature,
                                             top_k, generator)), dim=1)
        return idx


def load_pretrained(source, **operator_keys):
    """(PretrainedLM, meta) for a causal LM source (a transformers folder, hub name, .gguf file or packaged model)
    with the operator of operator_keys (model.OPERATOR_KEYS; dropout is the model's own). meta names the tokenizer as
    a dataset's meta.json does, so sample.py decodes with it."""
    kind = model_type(source)
    if kind not in CAUSAL_FAMILIES:
        raise UserError(f"{source} is a {kind} model, not a causal LM: train.py and sample.py take "
                        f"{', '.join(CAUSAL_FAMILIES)}")
    import transformers
    quiet_transformers()
    with model_folder(source) as folder:
        try:  # float32 weights: train.py's autocast picks the compute dtype, as for our GPT
            lm = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        except Exception as e:
            raise UserError(f"cannot load {source!r}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        fingerprint = tokenizer_fingerprint(load_tokenizer(source, folder))
    config = text_config(lm)
    gpt_config = model_config(dict(block_size=config.max_position_embeddings, vocab_size=config.vocab_size,
                                   n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
                                   n_embd=config.hidden_size, bias=False, **operator_keys))
    meta = dict(tokenizer='hf', tokenizer_source=source, tokenizer_fingerprint=fingerprint,
                vocab_size=config.vocab_size)
    return PretrainedLM(lm, gpt_config, source, fingerprint), meta


def parameter_count(source):
    """(parameters as PretrainedLM.get_num_params counts them, the count 6N uses; without the token embedding) of a
    causal LM source, from its config alone (meta tensors, no weights read): lab/sweep.py's --plan, before a GPU is
    rented."""
    import transformers
    try:
        if is_gguf(source):
            config = transformers.AutoConfig.from_pretrained(gguf_folder(gguf_path(source)))
        else:
            config = transformers.AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {source}'s config for the estimate ({type(e).__name__}): no network? pass a "
                        f"local folder with --init_from") from None
    with torch.device('meta'):
        lm = transformers.AutoModelForCausalLM.from_config(config)
    total, embedding = sum(p.numel() for p in lm.parameters()), lm.get_input_embeddings().weight.numel()
    tied = lm.get_output_embeddings() is not None and lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    return (total if tied else total - embedding), total - embedding
