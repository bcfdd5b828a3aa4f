"""
GPT-2 (as nanoGPT builds it) where every attention head applies an operator from one family:

    out_h = c_I·V_h + c_P·(P_h V_h)        P_h = causal softmax(Q_h K_hᵀ / √d_head)

Plain attention is (c_I, c_P) = (0, 1). The convex corridor δ(γI + P) is (δγ, δ); for γ ∈ (−1, 0) it is a
scaled convex mix of attention P and the negative Laplacian P − I. `OPERATORS` below is the whole family.

Two attention paths give the same numbers. The math path builds P explicitly, hands it back for analysis
(`GPT.forward_with_probs`) and applies the operator in one plain line of CausalSelfAttention.forward,
`y = c_I * v + c_P * pv`: the place to read the idea, and to change it. The fast path (training, sampling) calls
F.scaled_dot_product_attention (flash / memory-efficient kernels, never a T×T matrix) and adds the c_I·V term in
one fused epilogue (CorridorProjection); the tests hold it to the math path's values and gradients.

Read top to bottom: the config, the operator table, the attention that applies it, then GPT-2 as in nanoGPT.
The machinery a first reading can skip (how the table's scalars become parameters, the γ ≥ 0 constraint, the
fused epilogue, the KV cache, the config checks) sits together at the end of the file.
"""

import math
from dataclasses import dataclass, fields
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.utils.parametrize as parametrize
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257     # the tokenizer's; the embedding is padded to a multiple of 64 (faster matmuls)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True           # biases in Linears and LayerNorms, as GPT-2
    # the attention operator: see OPERATORS
    operator: str = 'attention'
    laplacian_heads: int = 1    # operator='laplacian': the last this-many heads of every layer use I − P
    gamma_init: float = 0.0     # (γ0, δ0) for every learnable form, converted to the form's own scalars
    delta_init: float = 1.0
    init_spread: float = 0.0    # γ0 of each head drawn uniformly from gamma_init ± init_spread
    learn_gamma: bool = True    # False: γ is a fixed buffer (corridor only)
    learn_delta: bool = True    # False: δ is a fixed buffer (corridor only)
    gamma_nonneg: bool = False  # corridor only: γ ≥ 0 always (see NonNegative)
    operator_lr_mult: float = 1.0  # learning-rate multiplier for the operator scalars

    def __post_init__(self):
        check_config(self)  # an impossible combination fails here, not in the middle of a run

    @property
    def padded_vocab_size(self):
        return 64 * math.ceil(self.vocab_size / 64)


# The operator's keys and their defaults: GPTConfig's fields from `operator` on. train.py takes its operator keys
# from here, so a new key is one more field above.
_names = [f.name for f in fields(GPTConfig)]
OPERATOR_DEFAULTS = {f.name: f.default for f in fields(GPTConfig)[_names.index('operator'):]}
OPERATOR_KEYS = tuple(OPERATOR_DEFAULTS)


# ----------------------------------------------------------------------------------------------------------
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
# Every learnable form starts from the user-facing (γ0, δ0) = (gamma_init, delta_init), so by default every form
# starts as plain attention. A sixth form is one more entry (README: "How to add an operator"). Which scalars
# learn, and constraints on them (γ ≥ 0), are properties of the parameters (OperatorCoefficients), never
# branches in forward().

class OperatorForm(NamedTuple):
    params: tuple          # names of the per-head scalars
    learnable: bool        # False: the scalars are fixed buffers, whatever learn_gamma / learn_delta say
    init: Callable         # (gamma0 [n_head], delta0 [n_head], config) -> one [n_head] tensor per scalar
    coefficients: Callable  # (*scalars) -> (c_I, c_P)


def laplacian_init(gamma0, delta0, config):
    """I − P = δ(γI + P) with γ = δ = −1 on the last laplacian_heads heads; the others stay (0, 1), attention."""
    is_laplacian = torch.arange(config.n_head) >= config.n_head - config.laplacian_heads
    return torch.where(is_laplacian, -1.0, 0.0), torch.where(is_laplacian, -1.0, 1.0)


OPERATORS = {
    'attention':  OperatorForm(params=(), learnable=False,
                               init=lambda gamma0, delta0, config: (),
                               coefficients=lambda: (0.0, 1.0)),
    'laplacian':  OperatorForm(params=('gamma', 'delta'), learnable=False,
                               init=laplacian_init,
                               coefficients=lambda gamma, delta: (delta * gamma, delta)),
    'corridor':   OperatorForm(params=('gamma', 'delta'), learnable=True,
                               init=lambda gamma0, delta0, config: (gamma0, delta0),
                               coefficients=lambda gamma, delta: (delta * gamma, delta)),
    'alpha':      OperatorForm(params=('alpha0', 'alpha1'), learnable=True,
                               init=lambda gamma0, delta0, config: (delta0 * gamma0, delta0),
                               coefficients=lambda alpha0, alpha1: (alpha0, alpha1)),
    'alpha_beta': OperatorForm(params=('alpha', 'beta'), learnable=True,
                               init=lambda gamma0, delta0, config: (delta0 * (1 + gamma0), delta0 * gamma0),
                               coefficients=lambda alpha, beta: (beta, alpha - beta)),
}


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q | k | v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.coefficients = OperatorCoefficients(config)  # this layer's (c_I, c_P) per head, from OPERATORS

    def forward(self, x, cache=None, return_probs=False):
        """x [B, T, C] -> (y [B, T, C], P [B, n_head, T, T] if return_probs, else None).

        return_probs: the math path, P built explicitly and handed back (analysis); otherwise the fast path, the
        same numbers through fused kernels. cache: a KVCache layer slot for generation (earlier keys/values)."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # [B, nh, T, hs]
        # P·V reads every position so far; the identity term c_I·V only the query positions' own values, v
        k_all, v_all = cache.extend(k, v) if cache is not None else (k, v)
        # after a cached prefix, one new token attends to every position so far: no causal mask
        causal = cache is None or k_all.size(2) == T
        assert causal or T == 1, "after the first forward, a cached forward takes one token at a time"
        if not return_probs:
            return self.resid_dropout(self.fused_operator(q, k_all, v, v_all, causal)), None

        # the math path: P explicitly, then the operator exactly as the paper writes it
        att = (q @ k_all.transpose(-2, -1)) / math.sqrt(k.size(-1))
        if causal:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float('-inf'))
        probs = F.softmax(att, dim=-1)
        pv = self.attn_dropout(probs) @ v_all
        c_I, c_P = (c.view(-1, 1, 1) for c in self.coefficients())  # this layer's operator: one (c_I, c_P) per head
        y = c_I * v + c_P * pv                                       # out_h = c_I·V_h + c_P·(P_h V_h)
        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side
        return self.resid_dropout(self.c_proj(y)), probs

    def fused_operator(self, q, k, v, v_all, causal):
        """c_proj(c_I·V + c_P·(P·V)) without a T×T matrix: SDPA's flash / memory-efficient kernels, then the
        operator and c_proj in one fused step (CorridorProjection). The same numbers and gradients as the math
        path's lines above, which the tests check for every form; to try a new operator, edit those lines first."""
        B, _, T, hs = q.shape
        if self.coefficients.is_plain_attention:  # (0, 1): attention pays nothing for the family
            pv = F.scaled_dot_product_attention(q, k, v_all, dropout_p=self.dropout if self.training else 0.0,
                                                is_causal=causal)
            # SDPA writes its output in the [B, T, n_head, hs] layout c_proj reads: the merge is a free view
            return self.c_proj(pv.transpose(1, 2).reshape(B, T, self.n_embd))
        c_I, c_P = self.coefficients()  # float32 even under autocast (see CorridorProjection)
        pv = F.scaled_dot_product_attention(*scaled_gradient(c_P, q, k, v_all),
                                            dropout_p=self.dropout if self.training else 0.0, is_causal=causal)
        return CorridorProjection.apply(v.transpose(1, 2), pv.transpose(1, 2), c_I.view(-1, 1), c_P.view(-1, 1),
                                        self.c_proj.weight, self.c_proj.bias)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's only offers both or neither before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate='tanh')  # GPT-2's own GELU, so imported weights give GPT-2's logits
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, return_probs=False):
        """(x after the block, the attention's P or None), as CausalSelfAttention."""
        a, probs = self.attn(self.ln_1(x), cache=cache, return_probs=return_probs)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, probs


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding=True):
        """Parameter count; position embeddings excluded by default (token embeddings count: tied to lm_head)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def _trunk(self, idx, cache=None, return_probs=False):
        """Embeddings and blocks: (final hidden states [B, T, C], [every layer's P, or None on the fast path])."""
        B, T = idx.size()
        start = len(cache) if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size={self.config.block_size}")
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        probs = []
        for i, block in enumerate(self.transformer.h):
            x, p = block(x, cache=cache.layers[i] if cache is not None else None, return_probs=return_probs)
            probs.append(p)
        return self.transformer.ln_f(x), probs

    def _logits(self, x):
        # the matmul runs over the padded vocabulary (aligned, faster); the padding rows are not tokens, so the
        # logits are a view of the real ones: no probability and no gradient ever reaches the padding
        return self.lm_head(x)[..., :self.config.vocab_size]

    def forward(self, idx, targets=None):
        """idx [B, T] -> (logits [B, T, vocab_size], mean cross-entropy or None). Targets of -1 are ignored."""
        logits = self._logits(self._trunk(idx)[0])
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def forward_with_probs(self, idx):
        """The math path: (logits, [P of every layer, each [B, n_head, T, T]])."""
        x, probs = self._trunk(idx, return_probs=True)
        return self._logits(x), probs

    def attention_probs(self, idx):
        """[P of every layer, each [B, n_head, T, T]], without computing logits (the math path)."""
        return self._trunk(idx, return_probs=True)[1]

    def operator_coefficients(self):
        """(c_I, c_P) of every head, whatever the form: a float tensor [n_layer, n_head, 2], detached, on CPU."""
        with torch.no_grad():
            return torch.stack([torch.stack(block.attn.coefficients(), dim=-1).float().cpu()
                                for block in self.transformer.h])

    def operator_parameters(self):
        """The learnable operator scalars (raw values under any constraint), for the optimizer."""
        return [p for block in self.transformer.h for p in block.attn.coefficients.parameters()]

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW: weight decay on ≥2-D weights only. The operator scalars get none, because decay would pull
        every form toward c = 0 (a dead head), not toward attention, and they get their own learning-rate
        multiplier, kept in each group as 'lr_mult' for the schedule."""
        operator = {id(p) for p in self.operator_parameters()}
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            dict(params=[p for p in params if p.dim() >= 2], weight_decay=weight_decay, lr_mult=1.0),
            dict(params=[p for p in params if p.dim() < 2 and id(p) not in operator], weight_decay=0.0,
                 lr_mult=1.0),
            dict(params=[p for p in params if id(p) in operator], weight_decay=0.0,
                 lr_mult=self.config.operator_lr_mult),
        ]
        groups = [g for g in groups if g['params']]
        for g in groups:
            g['lr'] = learning_rate * g['lr_mult']
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == 'cuda')

    def flops_per_token(self, seq_len):
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12·L·H·Q·T."""
        L, H, Q = self.config.n_layer, self.config.n_head, self.config.n_embd // self.config.n_head
        return 6 * self.get_num_params() + 12 * L * H * Q * seq_len

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """Sample max_new_tokens after idx [B, T]; temperature 0 is greedy. The KV cache gives the same tokens
        as recomputing every position (tests check it); past block_size the context is cropped and, since
        positions shift, the cache is rebuilt from the cropped context."""
        cache = None
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size:]
            if not use_cache:
                x, _ = self._trunk(context)
            elif cache is None or len(cache) == self.config.block_size:
                cache = KVCache(self.config.n_layer)
                x, _ = self._trunk(context, cache=cache)
            else:
                x, _ = self._trunk(idx[:, -1:], cache=cache)
            idx = torch.cat((idx, next_token(self._logits(x[:, -1, :]), temperature, top_k, generator)), dim=1)
        return idx

    @classmethod
    def from_pretrained(cls, model_type, **overrides):
        """OpenAI GPT-2 weights ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl', or a local transformers
        folder) through `transformers`. overrides: dropout and the operator keys, e.g. operator='corridor'
        (at γ0 = 0, δ0 = 1 the model computes exactly GPT-2)."""
        architecture = {'block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'bias'} & set(overrides)
        if architecture:
            raise ValueError(f"GPT-2's architecture is fixed by its weights: cannot override {sorted(architecture)}")
        from transformers import GPT2LMHeadModel  # only needed here
        try:
            hf = GPT2LMHeadModel.from_pretrained(model_type)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"cannot load GPT-2 weights {model_type!r}: {str(e).splitlines()[0]} (no network? "
                               f"pass a local folder saved with save_pretrained)") from None
        c = hf.config
        config = GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                           n_embd=c.n_embd, bias=True, **overrides)
        model = cls(config)
        ours = model.state_dict()
        # GPT-2 stores these as Conv1D, [in, out]: transposed relative to nn.Linear
        transposed = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
        copied = set()
        with torch.no_grad():
            for key, value in hf.state_dict().items():
                if key.endswith(('.attn.masked_bias', '.attn.bias')) or key == 'lm_head.weight':
                    continue  # causal-mask buffers; lm_head is tied to wte
                if key.endswith(transposed):
                    value = value.t()
                target = ours[key][:value.size(0)] if key == 'transformer.wte.weight' else ours[key]
                assert target.shape == value.shape, f"{key}: ours {tuple(target.shape)}, GPT-2 {tuple(value.shape)}"
                target.copy_(value)
                copied.add(key)
        missing = [k for k in ours if k not in copied and '.coefficients.' not in k and k != 'lm_head.weight']
        assert not missing, f"not in the GPT-2 checkpoint: {missing}"
        return model


def next_token(logits, temperature, top_k, generator):
    """[B, 1] tokens drawn from logits [B, vocab] at this temperature (0: greedy) among the top_k likeliest (None:
    all); GPT.generate and a pretrained model's (lab.hf.PretrainedLM) share it."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = float('-inf')
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)


# ----------------------------------------------------------------------------------------------------------
# Reading the operator back: (γ, δ) of a head and the corridor test, used by the training log and analyze.py.

def gamma_delta(coefficients):
    """(γ, δ) from a [..., 2] tensor of (c_I, c_P): γ = c_I / c_P, δ = c_P."""
    c_I, c_P = coefficients.unbind(-1)
    return c_I / c_P, c_P


def in_corridor(gamma):
    """The convex corridor is the open interval −1 < γ < 0: at γ = 0 a head is plain (scaled) attention, at
    γ = −1 a pure (scaled) Laplacian, so neither boundary counts."""
    return (gamma > -1) & (gamma < 0)


# ----------------------------------------------------------------------------------------------------------
# Machinery a first reading can skip.

class OperatorCoefficients(nn.Module):
    """One layer's per-head (c_I, c_P), computed from its form's scalars (see OPERATORS). The scalars are
    parameters, or buffers where they are fixed; the γ ≥ 0 constraint is a parametrization of γ itself."""

    def __init__(self, config):
        super().__init__()
        self.form = OPERATORS[config.operator]
        self.n_head = config.n_head
        gamma0 = config.gamma_init + config.init_spread * (2 * torch.rand(config.n_head) - 1)
        delta0 = torch.full((config.n_head,), config.delta_init)
        for name, value in zip(self.form.params, self.form.init(gamma0, delta0, config)):
            value = torch.as_tensor(value, dtype=torch.float32).expand(config.n_head).clone()
            if self.form.learnable and getattr(config, f'learn_{name}', True):
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)
        if config.gamma_nonneg:
            parametrize.register_parametrization(self, 'gamma', NonNegative())
        # A form's constants (attention's 0 and 1) are numbers, not tensors, so model.to() would never move them:
        # this empty buffer moves instead and gives them its device and dtype (not persistent: no checkpoint changes)
        self.register_buffer('anchor', torch.zeros(0), persistent=False)

    @property
    def is_plain_attention(self):
        return not self.form.params

    def forward(self):
        """(c_I, c_P), each a [n_head] tensor on the module's device."""
        c_I, c_P = self.form.coefficients(*(getattr(self, name) for name in self.form.params))
        return self._per_head(c_I), self._per_head(c_P)

    def _per_head(self, c):
        if not torch.is_tensor(c):
            c = torch.full((self.n_head,), c, dtype=self.anchor.dtype, device=self.anchor.device)
        return c.expand(self.n_head)


class NonNegative(nn.Module):
    """γ = max(raw, 0): the forward can never see γ < 0, however the optimizer moves raw.

    Why not a plain clamp: its gradient is zero once raw < 0, so a γ that touches 0 would stay there for good.
    Why not pass the gradient straight through: raw would keep sinking while the loss pushes γ down, and γ
    could only leave 0 after raw climbed all the way back. Here the push further down is blocked and the pull
    back up is not, so raw overshoots 0 only by what Adam's momentum carries (about 10 steps' worth)."""

    def forward(self, raw):
        return _ClampAtZero.apply(raw)

    def right_inverse(self, gamma):
        return gamma


class _ClampAtZero(torch.autograd.Function):
    """max(raw, 0), whose gradient is blocked only where it would push an already-clamped value further down."""

    @staticmethod
    def forward(ctx, raw):
        ctx.save_for_backward(raw)
        return raw.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        raw, = ctx.saved_tensors
        return torch.where((raw > 0) | (grad < 0), grad, torch.zeros_like(grad))  # descent moves raw by -grad


class CorridorProjection(torch.autograd.Function):
    """c_proj(c_I·V + c_P·Y) for V, Y = P·V in the merged [B, T, n_head, head_size] layout and c [n_head, 1]:
    the per-head operator out_h = c_I·V_h + c_P·(P_h V_h), then the output projection.

    Why a Function: autograd would keep the merged sum for c_proj's backward, one more [B, T, C] activation per
    layer than plain attention. SDPA keeps V and Y anyway, so the backward recomputes the sum from them and the
    corridor's activation memory equals attention's, eager and compiled.

    dL/dY is returned without its factor c_P: scaled_gradient() applies it to the gradients of P·V's inputs
    instead, and the two always go together. That is exact (SDPA's backward is linear in dL/dY) and cheaper:
    scaling dL/dY would be a pass of its own, writing [B, T, C] before SDPA's backward can start, while dQ, dK, dV
    get scaled in the pass that copies them into c_attn's gradient anyway, where Inductor (Triton) also adds the
    c_I term, recomputes the sum and sums dL/dc. Compiled on a GPU, the corridor then costs two passes over
    [B, T, C] tensors more than attention: forward, read V, Y and write the sum; backward, read dL/dsum, V, Y and
    write the sum again. lab/bench.py counts it from Inductor's kernels.

    The coefficients stay float32 under autocast: in bf16, δ near 1 moves in steps of 0.4 %, and dL/dc sums
    B·T·head_size products (786k per head at GPT-2 size), the largest gradients of the model, which float16
    under a grad scaler would overflow. The elementwise work runs in the activations' dtype all the same (a copy
    of the c's rounded to it, see in_dtype): float32 [B, T, C] temporaries would cost an eager bf16 step several
    per cent; only the sums that make dL/dc accumulate in the c's own precision."""

    @staticmethod
    def forward(ctx, v, y, c_I, c_P, weight, bias):
        ctx.save_for_backward(v, y, c_I, c_P, weight)
        ctx.has_bias = bias is not None
        return F.linear((in_dtype(c_I, v) * v + in_dtype(c_P, y) * y).flatten(2), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        v, y, c_I, c_P, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_merged = (grad @ weight.to(grad.dtype)).view_as(v)
        # The sum recomputed, in the dtype autocast gave the output. Written in the other order than in forward on
        # purpose: under torch.compile, common-subexpression elimination would otherwise merge the two, and
        # Inductor's partitioner would go back to saving the sum (it won't recompute a value the backward
        # materialises anyway)
        merged = (in_dtype(c_P, y) * y + in_dtype(c_I, v) * v).flatten(2).to(grad.dtype)
        rows = grad.flatten(0, -2)
        return ((in_dtype(c_I, grad_merged) * grad_merged).to(v.dtype) if needs[0] else None,
                grad_merged if needs[1] else None,  # times c_P: see scaled_gradient
                coefficient_grad(grad_merged, v, c_I) if needs[2] else None,
                coefficient_grad(grad_merged, y, c_P) if needs[3] else None,
                rows.T @ merged.flatten(0, -2) if needs[4] else None,
                rows.sum(0) if ctx.has_bias and needs[5] else None)


def in_dtype(c, x):
    """The coefficients c rounded to the activations' dtype when that is narrower (bf16 / fp16 under autocast), so
    that c·x is computed and written in x's dtype, not promoted to a float32 [B, T, C] temporary."""
    return c.to(x.dtype) if x.dtype.itemsize < c.dtype.itemsize else c


def coefficient_grad(grad, x, c):
    """dL/dc of out = c·x for grad, x [B, T, n_head, head_size] and c [n_head, 1]: the products in the activations'
    dtype, their sums accumulated in c's (float32, or float64 in a float64 model), never autocast's. Summed over
    head_size first: that sum has the shape of the elementwise pass, so Inductor computes it in that pass instead
    of reading the tensors again (a single sum over (0, 1, 3) becomes a split reduction of its own)."""
    dtype = torch.promote_types(grad.dtype, c.dtype)
    return (grad * x.to(grad.dtype)).sum(-1, dtype=dtype).sum((0, 1)).view_as(c)


class OperatorSum(torch.autograd.Function):
    """c_I·V + c_P·Y, the operator alone (no projection after it), for V, Y [B, T, n_head, head_size] and c
    [n_head, 1]: in the activations' dtype, dL/dc accumulated in the c's, as in CorridorProjection. A pretrained
    model's attention (lab.hf.apply_operator) applies its operator through it."""

    @staticmethod
    def forward(ctx, v, y, c_I, c_P):
        ctx.save_for_backward(v, y, c_I, c_P)
        dtype = torch.promote_types(v.dtype, y.dtype)
        v, y = v.to(dtype), y.to(dtype)
        return in_dtype(c_I, v) * v + in_dtype(c_P, y) * y

    @staticmethod
    def backward(ctx, grad):
        v, y, c_I, c_P = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return ((in_dtype(c_I, grad) * grad).to(v.dtype) if needs[0] else None,
                (in_dtype(c_P, grad) * grad).to(y.dtype) if needs[1] else None,
                coefficient_grad(grad, v, c_I) if needs[2] else None,
                coefficient_grad(grad, y, c_P) if needs[3] else None)


def scaled_gradient(c_P, *tensors):
    """The inputs of SDPA (Q, K, V), each [B, n_head, ...], unchanged, but with their gradients multiplied by
    c_P [n_head]: the factor CorridorProjection leaves out of dL/dY (the fast path only)."""
    return ScaleGradient.apply(c_P, *tensors)


class ScaleGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient of every tensor [B, n_head, ...] by c [n_head]."""

    @staticmethod
    def forward(ctx, c, *tensors):
        ctx.save_for_backward(c)
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        c, = ctx.saved_tensors
        c = c.view(-1, 1, 1)
        return None, *(in_dtype(c, g) * g if g is not None else None for g in grads)


class KVCache:
    """Keys and values of every layer for the positions generated so far."""

    def __init__(self, n_layer):
        self.layers = [KVCache.Layer() for _ in range(n_layer)]

    def __len__(self):
        return 0 if self.layers[0].k is None else self.layers[0].k.size(2)

    class Layer:
        def __init__(self):
            self.k = self.v = None

        def extend(self, k, v):
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
            return self.k, self.v


def check_config(config):
    """Raise ValueError for a config no model can have (unknown operator, keys that don't apply to it, ...)."""
    def need(ok, message):
        if not ok:
            raise ValueError(message)
    for key in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd'):
        need(getattr(config, key) > 0, f"{key} must be positive, got {getattr(config, key)}")
    need(config.n_embd % config.n_head == 0,
         f"n_embd={config.n_embd} must be divisible by n_head={config.n_head}")
    need(0.0 <= config.dropout < 1.0, f"dropout must be in [0, 1), got {config.dropout}")
    need(config.operator in OPERATORS,
         f"unknown operator {config.operator!r} (choose from {', '.join(OPERATORS)})")
    need(config.init_spread >= 0, f"init_spread must be >= 0, got {config.init_spread}")
    need(config.operator_lr_mult >= 0, f"operator_lr_mult must be >= 0, got {config.operator_lr_mult}")
    if config.operator == 'laplacian':
        need(1 <= config.laplacian_heads <= config.n_head,
             f"laplacian_heads must be in [1, n_head={config.n_head}], got {config.laplacian_heads}")
    if not OPERATORS[config.operator].learnable:
        learnable_only = ('gamma_init', 'delta_init', 'init_spread', 'learn_gamma', 'learn_delta', 'gamma_nonneg')
        changed = [key for key in learnable_only if getattr(config, key) != OPERATOR_DEFAULTS[key]]
        learnable = ', '.join(name for name, form in OPERATORS.items() if form.learnable)
        need(not changed, f"{', '.join(changed)} only apply to a learnable operator ({learnable}), "
                          f"not operator={config.operator!r}")
    if config.operator != 'corridor':
        need(config.learn_gamma and config.learn_delta,
             f"learn_gamma/learn_delta=False fix the corridor's γ/δ: use operator='corridor' "
             f"(operator={config.operator!r} has no γ/δ scalars of its own)")
        need(not config.gamma_nonneg, "gamma_nonneg constrains the corridor's γ: use operator='corridor'")
    if config.gamma_nonneg:
        need(config.gamma_init - config.init_spread >= 0,
             f"gamma_nonneg needs gamma_init - init_spread >= 0, got {config.gamma_init} - {config.init_spread}")
