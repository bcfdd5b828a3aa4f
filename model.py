"""
GPT-2 (as nanoGPT builds it) where every attention head applies an operator from one family:

    out_h = c_I·V_h + c_P·(P_h V_h)        P_h = causal softmax(Q_h K_hᵀ / √d_head)

Plain attention is (c_I, c_P) = (0, 1); the convex corridor δ(γI + P) is (δγ, δ), for −1 < γ < 0 a
scaled convex mix of attention P and the negative Laplacian P − I. OPERATORS is the whole family;
apply_operator is its one line, `c_I * v + c_P * pv`, which CausalSelfAttention applies after P·V
from F.scaled_dot_product_attention (training, sampling: the fast path, torch.compile fuses the
line) or from P built explicitly (analysis: the math path), and a pretrained model's attention
applies it too (lab/pretrained.py): edit it, and what every model trains changes.
"""

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    """The model's keys. A new key needs a default giving the behaviour models had before it: a
    checkpoint saved without the key is read with that default (sources.py says so in one line)."""
    block_size: int = 1024
    vocab_size: int = 50257     # the tokenizer's; the embedding is padded to a multiple of 64 (faster matmuls)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True           # biases in Linears and LayerNorms, as GPT-2
    operator: str = 'attention'  # the attention operator: a form of model.py's OPERATORS table (a wrong name lists
                                 # them); each form reads only the keys its entry names, and refuses another key
                                 # set to anything but its default
    laplacian_heads: int = 1    # laplacian: the last this-many heads of every layer use I − P
    gamma_init: float = 0.0     # γ0 of every head, converted to the form's own scalars (0: start as attention)
    delta_init: float = 1.0     # δ0 of every head
    init_spread: float = 0.0    # γ0 of each head drawn uniformly from gamma_init ± init_spread
    learn_gamma: bool = True    # corridor: False makes γ a fixed buffer
    learn_delta: bool = True    # corridor: False makes δ a fixed buffer
    gamma_nonneg: bool = False  # corridor: keep every head's γ ≥ 0 while training (clamped at 0): claim (c)'s ablation
    operator_lr_mult: float = 1.0  # learning-rate multiplier of the operator's scalars (a training setting)


# The operator family: every form is out_h = c_I·V_h + c_P·(P_h V_h) with its own per-head (c_I, c_P).
#
#   operator    per-head scalars   from (γ0, δ0)            c_I     c_P      γ = c_I/c_P    δ = c_P
#   attention   –                  –                        0       1        0              1
#   laplacian   γ, δ fixed         (−1, −1) on the last     δγ      δ        −1 (I − P)     −1
#               laplacian_heads heads, (0, 1) elsewhere
#   corridor    γ, δ               (γ0, δ0)                 δγ      δ        γ              δ
#   alpha       α0, α1             (δ0γ0, δ0)               α0      α1       α0/α1          α1
#   alpha_beta  α, β               (δ0(1+γ0), δ0γ0)         β       α − β    β/(α − β)      α − β
#
# Every learnable form starts from (γ0, δ0) = (gamma_init, delta_init): by default, as attention. A sixth form is one
# more entry; one with a scalar of its own (a gate) is that entry, naming its key, plus the key's GPTConfig field.
# Which scalars learn, and γ ≥ 0, are properties of the parameters, never branches in forward().
# What the table can hold: scalars per head that give (c_I, c_P), so that a head's output is its own V and P·V mixed.
# The KV cache, the walk and the logs rely on that; a form with another term (c_2·P²V, a mix across heads) is not
# an entry but an edit of apply_operator and of what feeds it (tests/test_model.py's cache check runs on every form).

class OperatorForm(NamedTuple):
    params: tuple           # names of the per-head scalars
    learnable: bool         # False: the scalars are fixed buffers, whatever learn_gamma / learn_delta say
    init: Callable          # (gamma0 [n_head], delta0 [n_head], config) -> one [n_head] tensor per scalar
    coefficients: Callable  # (*scalars) -> (c_I, c_P)
    keys: tuple = ()        # the GPTConfig keys it reads besides `operator`; another one set is an error


def laplacian_init(gamma0, delta0, config):
    """I − P = δ(γI + P) at γ = δ = −1, on the last laplacian_heads heads; the others: attention."""
    is_laplacian = torch.arange(config.n_head) >= config.n_head - config.laplacian_heads
    return torch.where(is_laplacian, -1.0, 0.0), torch.where(is_laplacian, -1.0, 1.0)


START = ('gamma_init', 'delta_init', 'init_spread', 'operator_lr_mult')  # what learnable forms read
OPERATORS = {
    'attention':  OperatorForm((), learnable=False, init=lambda g0, d0, config: (),
                               coefficients=lambda: (0.0, 1.0)),
    'laplacian':  OperatorForm(('gamma', 'delta'), learnable=False, init=laplacian_init,
                               coefficients=lambda gamma, delta: (delta * gamma, delta), keys=('laplacian_heads',)),
    'corridor':   OperatorForm(('gamma', 'delta'), learnable=True, init=lambda g0, d0, config: (g0, d0),
                               coefficients=lambda gamma, delta: (delta * gamma, delta),
                               keys=START + ('learn_gamma', 'learn_delta', 'gamma_nonneg')),
    'alpha':      OperatorForm(('alpha0', 'alpha1'), learnable=True, init=lambda g0, d0, config: (d0 * g0, d0),
                               coefficients=lambda alpha0, alpha1: (alpha0, alpha1), keys=START),
    'alpha_beta': OperatorForm(('alpha', 'beta'), learnable=True,
                               init=lambda g0, d0, config: (d0 * (1 + g0), d0 * g0),
                               coefficients=lambda alpha, beta: (beta, alpha - beta), keys=START),
}
# the operator's keys, from the table: train.py takes them over (with defaults), a resume keeps them
OPERATOR_KEYS = ('operator', *dict.fromkeys(k for form in OPERATORS.values() for k in form.keys))
OPERATOR_DEFAULTS = {key: GPTConfig.__dataclass_fields__[key].default for key in OPERATOR_KEYS}


def apply_operator(c_I, c_P, v, pv):
    """out_h = c_I·V_h + c_P·(P_h V_h): the line every model here trains through, pretrained too."""
    return c_I * v + c_P * pv


class OperatorCoefficients(nn.Module):
    """One layer's per-head (c_I, c_P) from its form's scalars: parameters, or buffers where fixed.
    float32 under autocast: dL/dc sums B·T·head_size products a head; bf16 steps δ ≈ 1 by 0.4 %."""

    def __init__(self, config):
        super().__init__()
        self.form, self.n_head = OPERATORS[config.operator], config.n_head
        gamma0 = config.gamma_init + config.init_spread * (2 * torch.rand(config.n_head) - 1)
        delta0 = torch.full((config.n_head,), config.delta_init)
        for name, value in zip(self.form.params, self.form.init(gamma0, delta0, config)):
            value = torch.as_tensor(value, dtype=torch.float32).expand(config.n_head).clone()
            if self.form.learnable and getattr(config, f'learn_{name}', True):
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)
        if config.gamma_nonneg:
            nn.utils.parametrize.register_parametrization(self, 'gamma', NonNegative())
        # model.to() moves no number: this empty buffer gives attention's 0, 1 a device and a dtype
        self.register_buffer('anchor', torch.zeros(0), persistent=False)
        self.is_plain_attention = not self.form.params

    def forward(self):  # (c_I, c_P), each [n_head] on the module's device
        coefficients = self.form.coefficients(*(getattr(self, name) for name in self.form.params))
        return tuple(c.expand(self.n_head) if torch.is_tensor(c) else
                     self.anchor.new_full((self.n_head,), c) for c in coefficients)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q | k | v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.coefficients = OperatorCoefficients(config)  # (c_I, c_P) per head, from OPERATORS

    def forward(self, x, cache=None, return_probs=False):
        """x [B, T, C] -> (y [B, T, C], the math path's P [B, n_head, T, T] (return_probs) or None).
        cache: a KVCache layer slot for generation (the earlier positions' keys and values)."""
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, H, T, hs]
                   for t in self.c_attn(x).split(self.n_embd, dim=2))
        k_all, v_all = cache.extend(k, v) if cache is not None else (k, v)  # every position so far
        causal = cache is None or k_all.size(2) == T  # a token after a cached prefix sees all
        assert causal or T == 1, "after the first forward, a cached forward takes one token at a time"
        probs = None
        if return_probs:  # the math path
            att = (q @ k_all.transpose(-2, -1)) / math.sqrt(k.size(-1))
            att = att.masked_fill(~x.new_ones(T, T, dtype=torch.bool).tril(), -math.inf) if causal else att
            probs = F.softmax(att, dim=-1)
            pv = self.attn_dropout(probs) @ v_all
        else:  # the fast path: flash / memory-efficient kernels, never a T×T matrix
            pv = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=causal,
                                                dropout_p=self.dropout if self.training else 0.0)
        # [B, T, H, hs], SDPA's output layout: heads merge in a free view (a copy ran 11 % slower)
        v, pv = v.transpose(1, 2), pv.transpose(1, 2)
        if self.coefficients.is_plain_attention:
            y = pv  # (c_I, c_P) = (0, 1): nanoGPT's attention, whatever apply_operator becomes
        else:
            c_I, c_P = (c.view(-1, 1) for c in self.coefficients())  # [H, 1] each
            y = apply_operator(c_I, c_P, v, pv)  # out_h = c_I·V_h + c_P·(P_h V_h)
        return self.resid_dropout(self.c_proj(y.reshape(B, T, C))), probs


class NonNegative(nn.Module):
    """γ = max(raw, 0), its gradient blocked only where it pushes a clamped γ lower: a plain clamp
    would keep a γ that touched 0 for good, a straight-through one let raw sink far while pushed."""

    class Clamp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, raw):
            ctx.save_for_backward(raw)
            return raw.clamp(min=0)

        @staticmethod
        def backward(ctx, grad):
            raw, = ctx.saved_tensors
            return torch.where((raw > 0) | (grad < 0), grad, torch.zeros_like(grad))  # descent moves raw by -grad

    def forward(self, raw):
        return NonNegative.Clamp.apply(raw)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate='tanh')  # GPT-2's own: imported weights give its logits
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, return_probs=False):
        a, probs = self.attn(self.ln_1(x), cache=cache, return_probs=return_probs)
        x = x + a
        return x + self.mlp(self.ln_2(x)), probs


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.head_size = config, config.n_embd // config.n_head
        padded_vocab_size = 64 * math.ceil(config.vocab_size / 64)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(padded_vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        for module in self.modules():  # GPT-2's initialisation
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):  # residual projections scaled by 1/sqrt(2 * n_layer)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def get_num_params(self, non_embedding=True):  # without wpe by default (wte is lm_head too)
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def non_embedding_params(self):  # without wte too: scaling laws' count
        return self.get_num_params() - self.transformer.wte.weight.numel()

    def _trunk(self, idx, cache=None, return_probs=False):
        """(hidden states [B, T, C], [each layer's P, or None on the fast path]) of idx [B, T]."""
        B, T = idx.size()
        start = len(cache) if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size={self.config.block_size}")
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        probs = []
        for i, block in enumerate(self.transformer.h):
            x, p = block(x, cache.layers[i] if cache is not None else None, return_probs)
            probs.append(p)
        return self.transformer.ln_f(x), probs

    def _logits(self, x):  # the padded rows are no tokens: no probability, no gradient reaches them
        return self.lm_head(x)[..., :self.config.vocab_size]

    def forward(self, idx, targets=None, **loss_options):
        """idx [B, T] -> (logits [B, T, vocab_size], lm_loss or None); loss_options: training's."""
        logits = self._logits(self._trunk(idx)[0])
        return logits, None if targets is None else lm_loss(logits, targets, **loss_options)

    def forward_with_probs(self, idx):
        """The math path: (logits, [P of every layer, each [B, n_head, T, T]])."""
        x, probs = self._trunk(idx, return_probs=True)
        return self._logits(x), probs

    def operator_coefficients(self):
        """(c_I, c_P) of every head, any form: float [n_layer, n_head, 2], detached, on CPU."""
        with torch.no_grad():
            return torch.stack([torch.stack(block.attn.coefficients(), dim=-1).float().cpu()
                                for block in self.transformer.h])

    def operator_parameters(self):  # the learnable scalars (raw values under a constraint)
        return [p for block in self.transformer.h for p in block.attn.coefficients.parameters()]

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW, decay on ≥2-D weights only: on the operator's scalars it would pull each form to
        c = 0 (a dead head), not to attention. Each group keeps its 'lr_mult' for the schedule."""
        operator = {id(p) for p in self.operator_parameters()}
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [([p for p in params if p.dim() >= 2], weight_decay, 1.0),
                  ([p for p in params if p.dim() < 2 and id(p) not in operator], 0.0, 1.0),
                  ([p for p in params if id(p) in operator], 0.0, self.config.operator_lr_mult)]
        groups = [dict(params=ps, weight_decay=decay, lr_mult=mult, lr=learning_rate * mult)
                  for ps, decay, mult in groups if ps]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == 'cuda')

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """Sample max_new_tokens after idx [B, T] (temperature 0: greedy); the KV cache changes no
        token. Past block_size the context is cropped and, as positions shift, the cache rebuilt."""
        cache = None
        for _ in range(max_new_tokens):
            if cache is not None and len(cache) < self.config.block_size:
                x, _ = self._trunk(idx[:, -1:], cache=cache)  # the new token after the cached ones
            else:
                cache = KVCache(self.config.n_layer) if use_cache else None
                x, _ = self._trunk(idx[:, -self.config.block_size:], cache=cache)
            token = next_token(self._logits(x[:, -1, :]), temperature, top_k, generator)
            idx = torch.cat((idx, token), dim=1)
        return idx


def lm_loss(logits, targets, **options):
    """Mean next-token cross-entropy over targets ≠ -1, in at least float32: every model's training
    and reported loss. options (label_smoothing, ...) are training's; evaluation passes none."""
    logits = logits.flatten(0, -2).to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, targets.flatten(), ignore_index=-1, **options)


class KVCache:  # keys and values of every layer for the positions generated so far
    def __init__(self, n_layer):
        self.layers = [KVCache.Layer() for _ in range(n_layer)]

    def __len__(self):
        return 0 if self.layers[0].k is None else self.layers[0].k.size(2)

    class Layer:
        k = v = None

        def extend(self, k, v):
            self.k, self.v = (new if old is None else torch.cat([old, new], dim=2)
                              for old, new in ((self.k, k), (self.v, v)))
            return self.k, self.v


def next_token(logits, temperature, top_k, generator):
    """[B, 1] tokens from logits [B, vocab] at this temperature (0: greedy), of the top_k likeliest
    (None: all). masked_fill: a boolean-mask assignment (index_put_) waits for the host on CUDA."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)


# what the scripts read
CLAIM_B = -0.05  # claim (b)'s "settled in the corridor", strictly: γ = −0.01 is all but attention


def gamma_delta(coefficients):  # (γ, δ) = (c_I / c_P, c_P) from a [..., 2] tensor of (c_I, c_P)
    return coefficients[..., 0] / coefficients[..., 1], coefficients[..., 1]


def in_corridor(gamma, below=0.0):  # −1 < γ < 0 (or < below): the convex corridor, P − I to P
    return (gamma > -1) & (gamma < below)
