"""
The studies' table: what each variant changes in the operator (VARIANTS), each setting's corpus, size and budget
(SETTINGS), each study's runs and question (STUDIES) and the CPU effects its GPU seeds are sized by (GPU_POWER);
where a run lives and whether it is finished. The command that trains and reports them is lab/sweep.py; their
statistics are lab/stats.py, their reports lab/reports.py, each study's own figures lab/study_figures.py (its FIGURES
names the function of every study here).
"""

import ast
import inspect
import os
from typing import NamedTuple

import torch

from common import REPO, UserError, model_config, parse_config
from model import GPT
from sources import load_checkpoint
from train import DEFAULTS as TRAIN_DEFAULTS  # train.py's config keys and defaults: every run a study plans is checked against them

# ------------------------------------------------------------------------------------------------ variants

# What each variant changes in the base config: the paper's forms and ablations. A variant whose function takes
# an argument can be given a value, `fixed_gamma=-0.3`; the plain name uses the default. The same seed gives every
# variant the same data order and the same initial weights (the operator scalars aside).
VARIANTS = {
    'attention':          lambda: dict(operator='attention'),
    'corridor':           lambda: dict(operator='corridor'),  # learnable δ(γI + P) from γ = 0, δ = 1
    'gamma_nonneg':       lambda: dict(operator='corridor', gamma_nonneg=True),  # γ ≥ 0
    'fixed_gamma':        lambda gamma=-0.5: dict(operator='corridor', gamma_init=gamma, learn_gamma=False,
                                                  learn_delta=False),  # γ fixed, δ = 1
    'laplacian':          lambda heads=1: dict(operator='laplacian', laplacian_heads=heads),  # the last heads: I − P
    'alpha':              lambda: dict(operator='alpha'),  # α0·I + α1·P
    'alpha_beta':         lambda: dict(operator='alpha_beta'),  # αP + β(I − P)
    'corridor_spread':    lambda spread=0.5: dict(operator='corridor', init_spread=spread),  # γ0 ~ U(−s, s)
    'corridor_lr':        lambda mult=10.0: dict(operator='corridor', operator_lr_mult=mult),
    'corridor_spread_lr': lambda mult=10.0: dict(operator='corridor', init_spread=0.5, operator_lr_mult=mult),
    'delta_only':         lambda: dict(operator='corridor', learn_gamma=False),  # γ = 0: a learned scale per head
    'fixed_gamma_delta':  lambda gamma=-0.1: dict(operator='corridor', gamma_init=gamma, learn_gamma=False),  # γ fixed, δ learns
    'corridor_start':     lambda gamma=-0.1: dict(operator='corridor', gamma_init=gamma),  # learnable, from γ0 inside, δ0 = 1
}


def parse_variant(spec):
    """(canonical spec, train.py keys) of a variant spec: 'corridor', or 'fixed_gamma=-0.3' for one with a value.
    A value equal to the default is dropped from the name (fixed_gamma=-0.5 is fixed_gamma), so that the same run
    always has the same folder."""
    name, eq, text = spec.partition('=')
    if name not in VARIANTS:
        raise UserError(f"unknown variant {name!r} (choose from {', '.join(VARIANTS)})")
    defaults = [p.default for p in inspect.signature(VARIANTS[name]).parameters.values()]
    if not eq:
        return name, VARIANTS[name]()
    try:
        value = ast.literal_eval(text)
        keys = VARIANTS[name](value)
    except (ValueError, SyntaxError, TypeError):
        raise UserError(f"variant {spec!r}: {name} takes no value, or {text!r} is not a number") from None
    return (name if [value] == defaults else f"{name}={value}"), keys


# ------------------------------------------------------------------------------------------------ settings

CPU = 'configs/_sweep_cpu.py'      # 0.8M-parameter char model (4 layers × 128), 1,200 iterations × 768 tokens
TINY = dict(n_layer=2, n_head=2, n_embd=64)      # 0.10M non-embedding parameters
MEDIUM = dict(n_layer=6, n_head=6, n_embd=192)   # 2.65M
# (the connection-walk geometry is logged at every evaluation: walk_interval = eval_interval)
X2 = dict(max_iters=2400, lr_decay_iters=2400, eval_interval=400, walk_interval=400)                  # 1.8M tokens
# four times the base budget (3.7M tokens, ~3.7 epochs of either corpus): the budget where a learnable γ has had time
# to move; evaluations every 400 iterations, no walk (it is the geometry study's, not this question's)
X4 = dict(max_iters=4800, lr_decay_iters=4800, eval_interval=400, walk_interval=0)
# longer budgets than X4 for attention alone, each its own cosine to its end (warmup and evaluations as X4's): the
# token multiplier, how many more tokens attention needs to reach the corridor's loss at X4 (its fit on log tokens)
X4_LONGER = {f'small-x4-{k}x': dict(X4, max_iters=round(4800 * k), lr_decay_iters=round(4800 * k)) for k in (1.1, 1.2, 1.4)}
LONG = dict(max_iters=12000, lr_decay_iters=12000, eval_interval=500, walk_interval=500, dropout=0.1)  # 10× the base
# GPT-2 BPE: its 50k-token output layer makes an iteration ~15× the char model's (1 s on a shared core), so 1,000
# iterations × 768 tokens ≈ 3.3M characters of text, 3.6× the base's (10× would take 2 × 50 minutes of 2 cores)
BPE_1K = dict(max_iters=1000, lr_decay_iters=1000, eval_interval=250, walk_interval=250, dropout=0.1)

GPU = 'configs/owt_gpt2_124m.py'   # GPT-2 124M on OpenWebText, 491,520 tokens per iteration
GPU_350M = 'configs/owt_gpt2_350m.py'
GPU_SHORT = dict(max_iters=2500, lr_decay_iters=2500, warmup_iters=250, eval_interval=250, walk_interval=250,
                 snapshot_interval=0)


def millions(n):
    """A parameter count in millions: 0.79M, and 0.055M rather than 0.06M for the smallest models."""
    return f"{n / 1e6:.{2 if n >= 1e5 else 3}f}M"


def non_embedding_params(config):
    """GPT.non_embedding_params of a run config's model, counted without allocating its weights."""
    with torch.device('meta'):
        return GPT(model_config({**config, 'vocab_size': 1})).non_embedding_params()


# The scale ladder at equal tokens per parameter: 4 sizes over 21× in non-embedding parameters (55k to 1.18M; depth
# and width grow together, 24–28 dimensions a head), each trained on LADDER_TOKENS_PER_PARAMETER tokens per
# non-embedding parameter, so that size is not confounded with budget. The ratio is set by both ends: the largest
# must fit (4: 4.7M tokens, ~20 min a run on one free core, the whole ladder ~2 h of 2 cores; Chinchilla's 20
# would take 100 min a run), and the smallest must still train (at 4 it gets 300 iterations, 3× its warmup); a
# ladder to 2.66M would take ~5 h of 2 cores (75 min per largest run). Up to 5 epochs of Tiny Shakespeare's 1.0M characters:
# dropout 0.1 at every size. Learning rate, batch and context as the base.
LADDER_TOKENS_PER_PARAMETER = 4
LADDER_SIZES = {'ladder-xs': (2, 2, 48), 'ladder-s': (3, 3, 72), 'ladder-m': (4, 4, 96), 'ladder-l': (5, 5, 140)}


def ladder_setting(n_layer, n_head, n_embd):
    """A rung's keys: the size, and max_iters for LADDER_TOKENS_PER_PARAMETER tokens per non-embedding parameter."""
    size = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    config = parse_config(TRAIN_DEFAULTS, [os.path.join(REPO, CPU),
                                     *(f'--{k}={v}' for k, v in size.items())])
    tokens_per_iter = config['batch_size'] * config['block_size'] * config['gradient_accumulation_steps']
    # a multiple of 60, so that the six evaluations fall on it and the last one is the final model
    iters = 60 * round(LADDER_TOKENS_PER_PARAMETER * non_embedding_params(config) / tokens_per_iter / 60)
    return dict(**size, max_iters=iters, lr_decay_iters=iters, eval_interval=iters // 6, walk_interval=iters // 6,
                dropout=0.1)


SETTINGS = {  # name (the runs' folder under OUT_ROOT): (base config, what it changes)
    'shakespeare_char/small':       (CPU, dict()),
    'wikitext2_char/small':         (CPU, dict(dataset='wikitext2_char')),
    'shakespeare_char/tiny':        (CPU, TINY),
    'wikitext2_char/tiny':          (CPU, dict(dataset='wikitext2_char', **TINY)),
    'shakespeare_char/medium-x2':   (CPU, dict(**MEDIUM, **X2)),
    'wikitext2_char/medium-x2':     (CPU, dict(dataset='wikitext2_char', **MEDIUM, **X2)),
    'shakespeare_char/small-long':  (CPU, LONG),
    'shakespeare_char/small-x4':    (CPU, X4),
    'wikitext2_char/small-x4':      (CPU, dict(dataset='wikitext2_char', **X4)),
    'wikitext2/small-1k':           (CPU, dict(dataset='wikitext2', **BPE_1K)),  # GPT-2 BPE
    **{f'wikitext2_char/{name}': (CPU, dict(dataset='wikitext2_char', **keys)) for name, keys in X4_LONGER.items()},
    # one GPU: OpenWebText; 1.2B tokens per run, or the config's own 4.9B for the long runs
    'openwebtext/gpt2_30m':         (GPU, dict(n_layer=6, n_head=6, n_embd=384, **GPU_SHORT)),
    'openwebtext/gpt2_124m':        (GPU, GPU_SHORT),
    'openwebtext/gpt2_350m':        (GPU_350M, GPU_SHORT),
    'openwebtext/gpt2_124m-long':   (GPU, dict(walk_interval=500)),
}
SETTINGS.update({f'shakespeare_char/{name}': (CPU, ladder_setting(*size)) for name, size in LADDER_SIZES.items()})
# pretrained models, every weight frozen but the operator's scalars (configs/*_operator.py)
SETTINGS.update({
    'wikitext2_smollm2-135m/operator':  ('configs/smollm2_operator.py', dict()),
    'wikitext2_qwen2.5-0.5b/operator':  ('configs/gpu_pretrained.py', dict()),
    'wikitext2_qwen2.5-0.5b/full':      ('configs/gpu_pretrained.py', dict(train_only='all', learning_rate=2e-5,
                                                                           min_lr=2e-6, max_iters=60,
                                                                           lr_decay_iters=60, eval_interval=10)),
})


def setting_config(setting, *args):
    """A setting's train.py config: its base file with its keys, as a study's runs get it (their variant aside), then
    any further `--key=value` args."""
    base, keys = SETTINGS[setting]
    return parse_config(TRAIN_DEFAULTS, [os.path.join(REPO, base), *(f'--{k}={v!r}' for k, v in keys.items()), *args])


# ------------------------------------------------------------------------------------------------ studies


class Part(NamedTuple):
    setting: str         # a SETTINGS key
    variants: tuple      # variant specs
    seeds: int           # how many seeds: first_seed .. first_seed + seeds - 1
    first_seed: int = 0  # a replication starts at seeds no other study has used


class Study(NamedTuple):
    question: str
    parts: tuple         # at CPU scale
    gpu_parts: tuple     # the same study on one GPU (--gpu=True)


# the pretrained study's fixed γ with δ learned: the best γ of the frozen model's curve (PRETRAINED_GAMMAS below)
PRETRAINED_FIXED_GAMMA = -0.05
CLAIMS = ('attention', 'corridor', 'gamma_nonneg', 'fixed_gamma', 'laplacian', 'alpha', 'alpha_beta',
          'corridor_spread')
FIXED_GAMMAS = (-0.05, -0.1, -0.2, -0.3, -0.5, -0.7, -0.9)
FIXED_GAMMA = ('attention', 'corridor', *(f'fixed_gamma={g}' for g in FIXED_GAMMAS))
DYNAMICS = ('attention', 'corridor', 'corridor_lr', 'corridor_spread', 'corridor_spread_lr')
SETTLED = ('attention', 'corridor', 'corridor_lr=3.0', 'fixed_gamma=-0.1')  # corridor_lr's multiplier: the pilot's
GEOMETRY = ('attention', 'corridor', 'fixed_gamma=-0.1', 'fixed_gamma')  # the runs carry walk_interval's geometry


STUDIES = {
    'claims': Study(
        "The paper's claims (a)–(d), and whether the forms behave alike",
        parts=tuple(Part(s, CLAIMS, 3) for s in ('shakespeare_char/small', 'wikitext2_char/small')),
        # at 12 heads, a quarter of them Laplacian (3), as 1 of 4 at CPU scale
        gpu_parts=(Part('openwebtext/gpt2_124m', tuple(v if v != 'laplacian' else 'laplacian=3' for v in CLAIMS), 3),)),
    'fixed_gamma': Study(
        "Claim (d): does some fixed γ inside the corridor, δ = 1, beat attention?",
        parts=tuple(Part(s, FIXED_GAMMA, 3) for s in ('shakespeare_char/small', 'wikitext2_char/small')),
        gpu_parts=(Part('openwebtext/gpt2_124m', FIXED_GAMMA, 3),)),
    'scales': Study(
        "Claim (a) across scales: does the learnable corridor's gain hold from 0.1M to 2.7M parameters?",
        # eight seeds where runs are cheap (tiny: 20 s), three where they are not (medium-x2: 7 min on one core)
        parts=tuple(Part(f'{corpus}/{size}', ('attention', 'corridor'), 8 if size == 'tiny' else 3)
                    for corpus in ('shakespeare_char', 'wikitext2_char') for size in ('tiny', 'small', 'medium-x2')),
        gpu_parts=tuple(Part(f'openwebtext/{size}', ('attention', 'corridor'), 3)
                        for size in ('gpt2_30m', 'gpt2_124m', 'gpt2_350m'))),
    'gamma_dynamics': Study(
        "Claim (b): where do heads settle, from γ0 = 0 and from γ0 ~ U(−0.5, 0.5), at operator_lr_mult 1 and 10?",
        # three seeds for the corridor from γ0 = 0 and from the spread start, trained first (the claim rests on
        # them), then attention to pair them; one seed for the operator_lr_mult = 10 pair and the BPE pair
        parts=(Part('shakespeare_char/small-long', ('corridor', 'corridor_spread'), 3),
               Part('shakespeare_char/small-long', ('attention',), 3),
               Part('shakespeare_char/small-long', ('corridor_lr', 'corridor_spread_lr'), 1),
               Part('wikitext2/small-1k', ('attention', 'corridor'), 1)),
        gpu_parts=(Part('openwebtext/gpt2_124m-long', DYNAMICS, 1),)),
    # Claims (a) and (c) in the one cell where (a) passed (Tiny Shakespeare, base size, p ≈ 0.012 over seeds 0-2),
    # again with 8 seeds that no other study uses (they all start at seed 0 and use at most 8), named before the runs
    # were read: reported as a replication whatever it shows.
    'replication': Study(
        "Replication of claims (a) and (c) at the base size on Tiny Shakespeare, 8 fresh seeds (100-107)",
        parts=(Part('shakespeare_char/small', ('attention', 'corridor', 'gamma_nonneg'), 8, first_seed=100),),
        gpu_parts=()),
    # Claim (d) given the power to decide it: the fixed-γ grid's 3 seeds detect 0.0075–0.095 nats, while the effect to
    # expect is the learnable corridor's (0.002–0.003). WikiText-2 (char), where the fixed-γ pairs spread least (SD
    # ~0.0035 at γ = −0.1), 48 seeds no other study uses (200–247). Primary tests, named before any run was read:
    # fixed γ − attention at −0.1 and at −0.2, Holm over the two; secondary: corridor − attention (claim (a)).
    'fixed_gamma_powered': Study(
        "Claim (d) with the seeds to decide it: does a fixed γ = −0.1 or −0.2 (δ = 1) beat attention on WikiText-2?",
        parts=(Part('wikitext2_char/small', ('attention', 'fixed_gamma=-0.1', 'fixed_gamma=-0.2', 'corridor'), 48,
                    first_seed=200),),
        gpu_parts=()),
    # Claim (a) where γ has had time to move: 4× the base budget on both corpora, 24 fresh seeds (300-323), the
    # learnable corridor from γ0 = 0 at the operator's base learning rate and at a higher one (its multiplier chosen
    # by the pilot below, before any of these runs), and fixed γ = −0.1 (δ = 1) as the positive control. Primary:
    # corridor − attention on each corpus, Holm over the two; secondary: the rest (docs/studies.md, named first).
    'corridor_settled': Study(
        "Claim (a) where γ has settled: at 4× the base budget, does the learnable corridor beat attention?",
        # one part per seed and corpus, so that the corpora advance together: a study stopped part-way (it takes
        # many hours of 2 cores) has the same seeds on both
        parts=tuple(Part(f'{corpus}/small-x4', SETTLED, 1, first_seed=seed)
                    for seed in range(300, 324) for corpus in ('wikitext2_char', 'shakespeare_char')),
        gpu_parts=()),
    # its pilot: the learnable corridor at operator_lr_mult 1, 3, 10 and 30, one seed (900, no other study's), on
    # each corpus at the same budget; the rule that picks the multiplier from it is in docs/studies.md
    'corridor_settled_pilot': Study(
        "Pilot of corridor_settled: which operator learning-rate multiplier lets γ settle within 4× the base budget?",
        parts=tuple(Part(f'{corpus}/small-x4', ('corridor', 'corridor_lr=3.0', 'corridor_lr', 'corridor_lr=30.0'), 1,
                         first_seed=900) for corpus in ('wikitext2_char', 'shakespeare_char')),
        gpu_parts=()),
    # How many tokens is the settled corridor's gain worth? Attention on WikiText-2 (char) at 1.1, 1.2 and 1.4 times
    # X4's budget, seeds 300-307 (their 1× runs: corridor_settled's), fitted on log tokens and solved for the budget
    # where it reaches corridor_settled's learnable corridor and fixed γ = −0.1 (the primary estimate); and the
    # learnable corridor started inside it, γ0 = −0.1, at X4 on seeds 300-323, against those two (docs/studies.md
    # names the tests). Attention's budgets first, seed-major, so that a study stopped part-way is paired.
    'token_multiplier': Study(
        "How many more tokens does attention need to match the settled corridor, and does a corridor started at "
        "γ0 = −0.1 beat fixed γ = −0.1 or the corridor from γ0 = 0?",
        parts=tuple(Part(f'wikitext2_char/{name}', ('attention',), 1, first_seed=seed)
                    for seed in range(300, 308) for name in X4_LONGER)
              + tuple(Part('wikitext2_char/small-x4', ('corridor_start',), 1, first_seed=seed) for seed in range(300, 324)),
        gpu_parts=()),
    'ladder': Study(
        "Claim (a) on a scale ladder at equal tokens per parameter: does the corridor's gain change with size?",
        # six seeds where runs take minutes, three at the largest (~20 min each on a free core)
        parts=tuple(Part(f'shakespeare_char/{name}', ('attention', 'corridor'), 3 if name == 'ladder-l' else 6)
                    for name in LADDER_SIZES),
        gpu_parts=()),
    'pretrained': Study(
        "A pretrained LM's heads given the corridor, every other weight frozen: does learning γ and δ lower held-out "
        "loss beyond learning δ alone (γ = 0), and beyond the frozen model? Where does γ settle?",
        # 4 data-order seeds a cell (3 df). Claim (c)'s pair first, seed-major, then δ only, then the best fixed γ
        # of the frozen curve with δ learned and the other two forms; the frozen curve itself is an evaluation
        parts=(Part('wikitext2_smollm2-135m/operator', ('gamma_nonneg', 'corridor'), 4),
               Part('wikitext2_smollm2-135m/operator', ('delta_only',), 4),
               Part('wikitext2_smollm2-135m/operator', (f'fixed_gamma_delta={PRETRAINED_FIXED_GAMMA}', 'alpha',
                                                         'alpha_beta'), 4)),
        gpu_parts=(Part('wikitext2_qwen2.5-0.5b/operator', ('corridor', 'delta_only'), 3),
                   Part('wikitext2_qwen2.5-0.5b/full', ('corridor', 'delta_only'), 3))),
    'geometry': Study(
        "The two papers joined: does the corridor change the connection walk (drift, δ_orth, ‖A_eff‖_F, Gram "
        "dominance) beyond the seed spread, and does the change track γ during training?",
        parts=tuple(Part(s, GEOMETRY, 3) for s in ('shakespeare_char/small', 'wikitext2_char/small')),
        gpu_parts=(Part('openwebtext/gpt2_124m', GEOMETRY, 3),)),
}


# What a GPU study's seeds are sized by (`--plan=True`): each pre-registered loss test a − b with the effect and
# paired SD the CPU measured, nats per character, recomputed from docs/per_seed/<source>.csv (tests/test_sweep.py
# checks every entry against its file). The plan assumes both in nats per token at 124M; seeds depend on their ratio.
class CpuEffect(NamedTuple):
    a: str          # the test a − b, canonical variant names, as the report names it
    b: str
    effect: float   # the mean paired difference over the CPU's seeds
    sd: float       # their SD
    seeds: int
    source: str     # docs/per_seed/<source>.csv
    setting: str    # the CPU setting in it


# claim (a) where γ has settled (4× the base budget), on the corpus with the smaller spread of the two (Tiny
# Shakespeare's −0.0026 ± 0.0059 needs about 4× the seeds); at the base budget, where γ has not settled,
# fixed_gamma_powered measured +0.0004 ± 0.0016 (48 seeds): no gain to size seeds by
CORRIDOR_VS_ATTENTION = CpuEffect('corridor', 'attention', -0.0039, 0.0039, 24, 'corridor_settled', 'wikitext2_char/small-x4')
GPU_POWER = {
    'claims': (
        CORRIDOR_VS_ATTENTION,
        # claim (c): the replication's fresh seeds (the claims study's 3 seeds per corpus agree: +0.0036, +0.0031)
        CpuEffect('gamma_nonneg', 'corridor', +0.0032, 0.0012, 8, 'replication', 'shakespeare_char/small'),
        # claim (d) as this study tests it, γ = −0.5: 3 seeds only, WikiText-2 (Tiny Shakespeare: +0.027 ± 0.016)
        CpuEffect('fixed_gamma', 'attention', +0.0049, 0.0054, 3, 'claims', 'wikitext2_char/small'),
        # the forms alike (α0·I + α1·P, αP + β(I − P) − corridor) have no CPU effect to size seeds by: read by their CI
    ),
    'fixed_gamma': (  # the grid, WikiText-2 (char): −0.1 and −0.2 from the powered study's 48 seeds, the rest 3 seeds
        CpuEffect('fixed_gamma=-0.05', 'attention', -0.0012, 0.0023, 3, 'fixed_gamma', 'wikitext2_char/small'),
        CpuEffect('fixed_gamma=-0.1', 'attention', -0.0038, 0.0051, 48, 'fixed_gamma_powered', 'wikitext2_char/small'),
        CpuEffect('fixed_gamma=-0.2', 'attention', -0.0053, 0.0070, 48, 'fixed_gamma_powered', 'wikitext2_char/small'),
        CpuEffect('fixed_gamma=-0.3', 'attention', -0.0044, 0.0063, 3, 'fixed_gamma', 'wikitext2_char/small'),
        CpuEffect('fixed_gamma', 'attention', +0.0049, 0.0054, 3, 'fixed_gamma', 'wikitext2_char/small'),
        CpuEffect('fixed_gamma=-0.7', 'attention', +0.0296, 0.0039, 3, 'fixed_gamma', 'wikitext2_char/small'),
        CpuEffect('fixed_gamma=-0.9', 'attention', +0.0563, 0.0109, 3, 'fixed_gamma', 'wikitext2_char/small'),
        CORRIDOR_VS_ATTENTION,
    ),
}
# the two-stage design --plan offers: a pilot of this many seeds of every variant measures each test's paired SD
PILOT_SEEDS = 4


def run_state(out_dir):
    """'done', 'partial' (a checkpoint short of max_iters) or 'new'."""
    ckpt = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.exists(ckpt):
        return 'new'
    saved = load_checkpoint(ckpt, mmap=True, purpose='info')  # two scalars wanted: the weights and moments stay on disk
    return 'done' if saved['iter_num'] >= saved['config']['max_iters'] else 'partial'


# The pretrained study's frozen cell: with every weight frozen, a fixed γ at δ = 1 has nothing to learn, so claim (d)
# at 135M is an evaluation, one per γ, of the pretrained model on the evaluation batches train.py draws for a seed
# (estimate_loss's val batches: the very batches that seed's trained runs are evaluated on, so γ = 0 is their
# iteration-0 loss). Each batch's loss is kept: the SE over batches, and each γ's difference to γ = 0 paired by batch.
PRETRAINED_GAMMAS = (-0.3, -0.2, -0.1, -0.05, 0.0, 0.05)
FROZEN_SEED = 0


def frozen_gamma_path(out_root, setting):
    return os.path.join(out_root, setting, 'frozen_gamma.json')


def frozen_settings(parts):
    """The settings of a study's parts whose runs freeze every pretrained weight: those get the fixed-γ curve."""
    return [setting for setting in dict.fromkeys(p.setting for p in parts if p.setting)
            if setting_config(setting)['train_only'] == 'operator']
