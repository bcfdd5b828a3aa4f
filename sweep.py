"""
Operator variants × seeds trained with identical data, budget and hyperparameters, compared paired by seed.

    python sweep.py                                    # the default study, 'claims': the paper's four claims
    python sweep.py --study=fixed_gamma                # any study in STUDIES: its runs, report and figures
    python sweep.py --study=scales --gpu=True          # the same study at GPT-2 scale on OpenWebText, one GPU
    python sweep.py --study=scales --report_only=True  # report the runs finished so far, train nothing
    python sweep.py --study=scales --gpu=True --plan=True   # tokens and estimated GPU hours, train nothing
    python sweep.py --variants=attention,fixed_gamma=-0.3 --seeds=2 --out_root=sweeps/quick -- --max_iters=200
    python sweep.py --variants=attention,corridor --gpu=True --plan=True   # ad hoc variants at GPT-2 124M

A study trains every (setting, variant, seed) of its parts. A setting is a corpus, a model size and a token
budget (SETTINGS); a variant is what a run changes in the operator (VARIANTS; `name=value` for a variant that
takes a value). Each run is `train.py BASE <setting keys> <variant keys> --seed=S --out_dir=OUT_ROOT/<setting>/
<variant>-s<S>` plus whatever follows `--`, its output in that folder's train.log. Runs are shared between studies
(the small Tiny Shakespeare runs of attention serve four of them) and never trained twice: finished runs are
skipped and interrupted ones resumed, so the same command continues a study. A changed budget needs a new setting
name. Reports go to OUT_ROOT/<study>/ (report.md, report.json, figures).

Statistics: each variant's final validation loss, and its difference to attention paired by seed (the same seed
gives every variant the same initial weights and the same batches): mean, 95 % CI, p of a two-sided paired t-test,
p Holm-adjusted within a family (one comparison across a study's settings; the fixed-γ grid and the geometry's
cells as larger families, see STATISTICS) and the smallest effect the test detects at 80 % power. A difference
counts as 'lower' or 'higher' only when the adjusted p is below 5 %; otherwise 'inconclusive, no effect larger
than X', X the CI's bound farthest from zero. The t distribution is computed here (no scipy).
"""

import ast
import functools
import inspect
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import torch
from tqdm import tqdm

from common import (PEAK_FLOPS, UserError, atomic_write, check_tokenizer, load_checkpoint, load_run, main_guard, model_config,
                    occupancy_report, parse_config)
from connection import depth_regimes
from model import GPT, in_corridor
from plots import WALK_PANELS, plot_evolution, plot_gamma_delta, plot_occupancy, plot_walk_evolution, plt, save, walk_series
from train import DEFAULTS as TRAIN_DEFAULTS  # train.py's config keys and defaults: every run a study plans is checked against them
import walk_hf  # a pretrained model's parameter count for --plan

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
    """Parameters without the token and position embeddings (the token embedding is the tied output layer too):
    the count that does not depend on the vocabulary, the one a scaling law uses."""
    with torch.device('meta'):  # the count without allocating the weights
        model = GPT(model_config({**config, 'vocab_size': 1}))
    return model.get_num_params(non_embedding=False) - model.transformer.wte.weight.numel() - \
        model.transformer.wpe.weight.numel()


# The scale ladder at equal tokens per parameter: 4 sizes over 21× in non-embedding parameters (55k to 1.18M; depth
# and width grow together, 24–28 dimensions a head), each trained on LADDER_TOKENS_PER_PARAMETER tokens per
# non-embedding parameter, so that size is not confounded with budget. The ratio is set by both ends: the largest
# must fit (4: 4.7M tokens, ~20 min a run on one free core, the whole ladder ~2 h of 2 cores; Chinchilla's 20
# would take 100 min a run), and the smallest must still train (at 4 it gets 300 iterations, 3× its warmup). The
# first version of the ladder (0.10M–2.66M) was planned at ~3 h; its measured time an iteration put it at ~5 h of
# 2 cores (75 min per largest run), too long for a sitting. Up to 5 epochs of Tiny Shakespeare's 1.0M characters:
# dropout 0.1 at every size. Learning rate, batch and context as the base.
LADDER_TOKENS_PER_PARAMETER = 4
LADDER_SIZES = {'ladder-xs': (2, 2, 48), 'ladder-s': (3, 3, 72), 'ladder-m': (4, 4, 96), 'ladder-l': (5, 5, 140)}


def ladder_setting(n_layer, n_head, n_embd):
    """A rung's keys: the size, and max_iters for LADDER_TOKENS_PER_PARAMETER tokens per non-embedding parameter."""
    size = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    config = parse_config(TRAIN_DEFAULTS, [os.path.join(os.path.dirname(os.path.abspath(__file__)), CPU),
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
    'wikitext2/small-1k':           (CPU, dict(dataset='wikitext2', **BPE_1K)),  # GPT-2 BPE
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
    figures: str         # the function below that adds the study's own figures and verdicts to its report


# the pretrained study's fixed γ with δ learned: the best γ of the frozen model's curve (PRETRAINED_GAMMAS below)
PRETRAINED_FIXED_GAMMA = -0.05
CLAIMS = ('attention', 'corridor', 'gamma_nonneg', 'fixed_gamma', 'laplacian', 'alpha', 'alpha_beta',
          'corridor_spread')
FIXED_GAMMAS = (-0.05, -0.1, -0.2, -0.3, -0.5, -0.7, -0.9)
FIXED_GAMMA = ('attention', 'corridor', *(f'fixed_gamma={g}' for g in FIXED_GAMMAS))
DYNAMICS = ('attention', 'corridor', 'corridor_lr', 'corridor_spread', 'corridor_spread_lr')
GEOMETRY = ('attention', 'corridor', 'fixed_gamma=-0.1', 'fixed_gamma')  # the runs carry walk_interval's geometry


STUDIES = {
    'claims': Study(
        "The paper's claims (a)–(d), and whether the forms behave alike",
        parts=tuple(Part(s, CLAIMS, 3) for s in ('shakespeare_char/small', 'wikitext2_char/small')),
        # at 12 heads, a quarter of them Laplacian (3), as 1 of 4 at CPU scale
        gpu_parts=(Part('openwebtext/gpt2_124m', tuple(v if v != 'laplacian' else 'laplacian=3' for v in CLAIMS), 3),),
        figures='claims_figures'),
    'fixed_gamma': Study(
        "Claim (d): does some fixed γ inside the corridor, δ = 1, beat attention?",
        parts=tuple(Part(s, FIXED_GAMMA, 3) for s in ('shakespeare_char/small', 'wikitext2_char/small')),
        gpu_parts=(Part('openwebtext/gpt2_124m', FIXED_GAMMA, 3),),
        figures='fixed_gamma_figures'),
    'scales': Study(
        "Claim (a) across scales: does the learnable corridor's gain hold from 0.1M to 2.7M parameters?",
        # eight seeds where runs are cheap (tiny: 20 s), three where they are not (medium-x2: 7 min on one core)
        parts=tuple(Part(f'{corpus}/{size}', ('attention', 'corridor'), 8 if size == 'tiny' else 3)
                    for corpus in ('shakespeare_char', 'wikitext2_char') for size in ('tiny', 'small', 'medium-x2')),
        gpu_parts=tuple(Part(f'openwebtext/{size}', ('attention', 'corridor'), 3)
                        for size in ('gpt2_30m', 'gpt2_124m', 'gpt2_350m')),
        figures='scales_figures'),
    'gamma_dynamics': Study(
        "Claim (b): where do heads settle, from γ0 = 0 and from γ0 ~ U(−0.5, 0.5), at operator_lr_mult 1 and 10?",
        # three seeds for the corridor from γ0 = 0 and from the spread start, trained first (the claim rests on
        # them), then attention to pair them; one seed for the operator_lr_mult = 10 pair and the BPE pair
        parts=(Part('shakespeare_char/small-long', ('corridor', 'corridor_spread'), 3),
               Part('shakespeare_char/small-long', ('attention',), 3),
               Part('shakespeare_char/small-long', ('corridor_lr', 'corridor_spread_lr'), 1),
               Part('wikitext2/small-1k', ('attention', 'corridor'), 1)),
        gpu_parts=(Part('openwebtext/gpt2_124m-long', DYNAMICS, 1),),
        figures='gamma_dynamics_figures'),
    # Claims (a) and (c) in the one cell where (a) passed (Tiny Shakespeare, base size, p ≈ 0.012 over seeds 0-2),
    # again with 8 seeds that no other study uses (they all start at seed 0 and use at most 8), named before the runs
    # were read: reported as a replication whatever it shows.
    'replication': Study(
        "Replication of claims (a) and (c) at the base size on Tiny Shakespeare, 8 fresh seeds (100-107)",
        parts=(Part('shakespeare_char/small', ('attention', 'corridor', 'gamma_nonneg'), 8, first_seed=100),),
        gpu_parts=(),
        figures='replication_figures'),
    'ladder': Study(
        "Claim (a) on a scale ladder at equal tokens per parameter: does the corridor's gain change with size?",
        # six seeds where runs take minutes, three at the largest (~20 min each on a free core)
        parts=tuple(Part(f'shakespeare_char/{name}', ('attention', 'corridor'), 3 if name == 'ladder-l' else 6)
                    for name in LADDER_SIZES),
        gpu_parts=(),
        figures='scales_figures'),
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
                   Part('wikitext2_qwen2.5-0.5b/full', ('corridor', 'delta_only'), 3)),
        figures='pretrained_figures'),
    'geometry': Study(
        "The two papers joined: does the corridor change the connection walk (drift, δ_orth, ‖A_eff‖_F, Gram "
        "dominance) beyond the seed spread, and does the change track γ during training?",
        parts=tuple(Part(s, GEOMETRY, 3) for s in ('shakespeare_char/small', 'wikitext2_char/small')),
        gpu_parts=(Part('openwebtext/gpt2_124m', GEOMETRY, 3),),
        figures='geometry_figures'),
}


# ------------------------------------------------------------------------------------------------ running


def run_state(out_dir):
    """'done', 'partial' (a checkpoint short of max_iters) or 'new'."""
    ckpt = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.exists(ckpt):
        return 'new'
    saved = load_checkpoint(ckpt)
    return 'done' if saved['iter_num'] >= saved['config']['max_iters'] else 'partial'


def plan_runs(parts, out_root, base, train_args, need_data=True):
    """{(setting, variant, seed): (out_dir, train.py arguments for a fresh run)}, every run's config checked."""
    for part in parts:  # every variant name is checked before any setting looks for its data
        for spec in part.variants:
            parse_variant(spec)
    runs = {}
    for part in parts:
        config_file, keys = SETTINGS[part.setting] if part.setting else (base, {})
        if part.setting:  # the settings' base configs sit in this repository, wherever the command runs from
            config_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), config_file)
        folder = os.path.join(out_root, part.setting) if part.setting else out_root
        if not os.path.isfile(config_file):
            raise UserError(f"base config {config_file!r} not found")
        # seed-major: every variant of the first seed first, so pairs finish early
        for seed in range(part.first_seed, part.first_seed + part.seeds):
            for spec in part.variants:
                variant, variant_keys = parse_variant(spec)
                out_dir = os.path.join(folder, f"{variant}-s{seed}")
                args = [config_file, *(f'--{k}={v!r}' for k, v in {**keys, **variant_keys}.items()),
                        f'--seed={seed}', f'--out_dir={out_dir}', '--overwrite=True', *train_args]
                config = parse_config(TRAIN_DEFAULTS, args)  # a bad key or value fails here, before any run starts
                if not config['always_save_checkpoint']:  # else a run whose last eval is not its best never ends
                    raise UserError("a study reads every run's final state from its ckpt.pt: leave "
                                    "always_save_checkpoint=True")
                model_config({**config, 'vocab_size': 256})
                meta = os.path.join(config['data_root'], config['dataset'], 'meta.json')
                if need_data and not os.path.isfile(meta):
                    raise UserError(f"setting {part.setting or base} needs {meta}: run `python prepare.py "
                                    f"{config['dataset']}` first (see prepare.py for offline copies)")
                runs[(part.setting, variant, seed)] = (out_dir, args)
    return runs


# the budget estimate's assumptions: H100 SXM dense bf16 peak, and the MFU nanoGPT-style training typically
# reaches there with torch.compile (an assumption, not a measurement of this repo)
PLAN_PEAK, PLAN_MFU = PEAK_FLOPS['H100']['bfloat16'], 0.40


def dataset_vocab(config):
    """The vocabulary a run will train with: its prepared data's meta.json, else GPT-2's for a BPE dataset, else
    None (a character set is only known once prepared)."""
    meta = os.path.join(config['data_root'], config['dataset'], 'meta.json')
    if os.path.isfile(meta):
        with open(meta) as f:
            return json.load(f)['vocab_size']
    return None if config['dataset'].endswith('_char') else 50257


def print_plan(runs):
    """Parameters, tokens, FLOPs and estimated H100 hours of the runs still to train, per setting: a GPU budget before
    the GPU is rented. FLOPs per token as train.py's MFU counts them (6N + attention)."""
    rows, total = {}, 0.0
    for (setting, _, _), (out_dir, args) in runs.items():
        config = parse_config(TRAIN_DEFAULTS, args)
        vocab = dataset_vocab(config)
        tokens = config['max_iters'] * config['gradient_accumulation_steps'] * config['batch_size'] * config['block_size']
        if config['init_from'] in ('scratch', 'resume') or config['init_from'].startswith('gpt2'):
            with torch.device('meta'):  # the parameter count without allocating the weights
                model = GPT(model_config({**config, 'vocab_size': vocab or 50257}))
            flops, params, non_embedding = model.flops_per_token(config['block_size']), model.get_num_params(), \
                non_embedding_params(config)
        else:  # a pretrained transformers model: counted from its config; frozen weights need no weight gradients
            params, non_embedding = walk_hf.parameter_count(config['init_from'])
            flops = (4 if config['train_only'] == 'operator' else 6) * params  # no weight gradients when frozen
            prepared = os.path.isfile(os.path.join(config['data_root'], config['dataset'], 'meta.json'))
            vocab = vocab if prepared else 'its own'  # (not GPT-2's: dataset_vocab's guess for a BPE dataset)
        hours = tokens * flops / (PLAN_MFU * PLAN_PEAK) / 3600
        row = rows.setdefault(setting, dict(non_embedding=non_embedding, vocab=vocab, params=params if vocab else None,
                                            tokens=tokens, hours=hours, runs=0, todo=0))
        row['runs'] += 1
        if run_state(out_dir) != 'done':
            row['todo'] += 1
            total += hours
    print("non-embedding: without the token and position embeddings; as train.py counts: with the token embedding "
          "(tied to the output layer) for the dataset's vocabulary, without the position embeddings, as the README's "
          "tables\n\n| setting | non-embedding parameters | as train.py counts (vocabulary) | tokens per run | "
          "H100 hours per run (est.) | runs | to train |\n|---|---|---|---|---|---|---|")
    for setting, r in rows.items():
        counted = f"{millions(r['params'])} ({r['vocab']:,})" if r['params'] and isinstance(r['vocab'], int) else \
            f"{r['params'] / 1e6:.0f}M" if r['params'] else 'its data not prepared yet'
        tokens = f"{r['tokens'] / 1e9:.2f}B" if r['tokens'] >= 1e9 else f"{r['tokens'] / 1e6:.2f}M"
        print(f"| {setting} | {millions(r['non_embedding'])} | {counted} | {tokens} ({r['tokens'] / r['non_embedding']:.3g} "
              f"per non-embedding parameter) | {r['hours']:.3g} | "
              f"{r['runs']} | {r['todo']} |")
    print(f"\ntotal to train: {total:.3g} H100 hours (at {PLAN_MFU:.0%} MFU of {PLAN_PEAK / 1e12:.0f} TFLOP/s bf16)")


def train_all(runs, parallel):
    """Train every run that is not finished, `parallel` at a time; interrupted ones resume."""
    states = {key: run_state(out_dir) for key, (out_dir, _) in runs.items()}
    todo = [key for key in runs if states[key] != 'done']
    print(f"{len(runs)} runs: {len(runs) - len(todo)} finished, {len(todo)} to train")
    threads = str(max(1, (os.cpu_count() or 1) // parallel))
    running, failed = [], []
    with tqdm(total=len(todo), desc='sweep', unit='run') as bar:
        while todo or running:
            while todo and len(running) < parallel:
                key = todo.pop(0)
                out_dir, args = runs[key]
                if states[key] == 'partial':
                    args = ['--init_from=resume', f'--out_dir={out_dir}']
                os.makedirs(out_dir, exist_ok=True)
                log = open(os.path.join(out_dir, 'train.log'), 'a')
                process = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                         'train.py'), *args],
                                           stdout=log, stderr=subprocess.STDOUT,
                                           env={**os.environ, 'OMP_NUM_THREADS': threads})
                running.append((process, log, out_dir))
            time.sleep(0.5)
            for entry in [r for r in running if r[0].poll() is not None]:
                process, log, out_dir = entry
                log.close()
                running.remove(entry)
                if process.returncode != 0:
                    failed.append(out_dir)
                    tqdm.write(f"failed: {out_dir} (see {out_dir}/train.log)")
                bar.update(1)
    if failed:
        raise UserError(f"{len(failed)} run(s) failed, e.g. {failed[0]}/train.log; rerun to retry them")


# ------------------------------------------------------------------------------------------------ statistics

# The t distribution without scipy: its CDF through the regularized incomplete beta function (continued fraction,
# Numerical Recipes §6.4), quantiles by bisection, and the power of the two-sided paired t-test from the
# noncentral t, integrated over the chi distribution of the sample SD.

def incomplete_beta(a, b, x):
    """The regularized incomplete beta function I_x(a, b), 0 ≤ x ≤ 1."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the continued fraction converges fast only below this point: use the symmetry
        return 1 - incomplete_beta(b, a, 1 - x)
    tiny, c, d = 1e-300, 1.0, 1 - (a + b) * x / (a + 1)  # Lentz's method
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * f / a


def t_two_sided_p(t, df):
    """P(|T| ≥ |t|) for Student's t with df degrees of freedom."""
    return incomplete_beta(df / 2, 0.5, df / (df + t * t)) if math.isfinite(t) else 0.0


@functools.lru_cache(maxsize=None)  # the power's bisection asks for the same quantile many times
def t_quantile(q, df):
    """The q-quantile of Student's t (0.5 < q < 1), by bisection on the CDF."""
    low, high = 0.0, 1e7
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if 1 - t_two_sided_p(mid, df) / 2 < q else (low, mid)
    return (low + high) / 2


def t_test_power(shift, df, alpha=0.05):
    """Power of the two-sided t-test at level alpha when the true mean is `shift` standard errors from 0: the
    noncentral t (Z + shift) / S, S = sqrt(χ²_df / df), integrated over S (Simpson's rule in u = √χ²_df, whose
    density u^(df−1)·e^(−u²/2) is smooth at 0 for every df ≥ 1)."""
    critical = t_quantile(1 - alpha / 2, df)
    phi = lambda z: 0.5 * math.erfc(-z / math.sqrt(2))
    log_norm = (1 - df / 2) * math.log(2) - math.lgamma(df / 2)
    top, steps = math.sqrt(df) + 12, 400
    total = 0.0
    for i in range(steps + 1):
        u = top * i / steps
        weight = 1 if i in (0, steps) else 4 if i % 2 else 2
        density = math.exp(log_norm + (df - 1) * math.log(u) - u * u / 2) if u > 0 else float(df == 1) * math.exp(log_norm)
        s = u / math.sqrt(df)
        total += weight * density * (phi(shift - critical * s) + phi(-shift - critical * s))
    return total * top / steps / 3


def min_detectable_effect(sd, n, power=0.8, alpha=0.05):
    """The smallest true mean difference a two-sided paired t-test over n pairs with this SD detects with the
    given power (the exact noncentral t; bisection on the shift)."""
    if n < 2 or not sd > 0:
        return float('nan')
    low, high = 0.0, 100.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if t_test_power(mid, n - 1, alpha) < power else (low, mid)
    return (low + high) / 2 * sd / math.sqrt(n)


class PairedTest(NamedTuple):
    n: int
    mean: float
    sd: float
    low: float           # the mean's 95 % confidence interval
    high: float
    p: float             # two-sided paired t-test of "no difference"
    mde: float           # the smallest effect detectable at 80 % power, two-sided 5 %, given this SD and n


def summary_test(mean, sd, n):
    """The paired test from a summary (mean and SD of the n paired differences): what a reader can recompute."""
    if n < 2 or not math.isfinite(sd):
        return PairedTest(n, mean, float('nan'), float('nan'), float('nan'), float('nan'), float('nan'))
    se = sd / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    p = t_two_sided_p(mean / se, n - 1) if se > 0 else float(mean == 0)
    return PairedTest(n, mean, sd, mean - half, mean + half, p, min_detectable_effect(sd, n))


def paired_test(differences):
    """The paired test of a list of differences, one per seed."""
    if not differences:
        return PairedTest(0, float('nan'), float('nan'), float('nan'), float('nan'), float('nan'), float('nan'))
    return summary_test(statistics.fmean(differences),
                        statistics.stdev(differences) if len(differences) > 1 else float('nan'), len(differences))


def holm(p_values):
    """Holm's step-down adjustment: the k-th smallest of m p-values times (m − k + 1), kept monotone, at most 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def verdict(test, p_adjusted):
    """'lower' / 'higher' when the Holm-adjusted p is below 5 %; otherwise 'inconclusive, no effect larger than X',
    X the 95 % CI's bound farthest from zero (the data's own bound, unlike the MDE, which is the design's)."""
    if test.n == 0:
        return 'not measured'
    if not math.isfinite(test.p):
        return 'inconclusive (one seed)'
    if p_adjusted < 0.05:
        return 'lower' if test.mean < 0 else 'higher'
    return f"inconclusive, no effect larger than {max(abs(test.low), abs(test.high)):.2g}"


def fmt_p(p):
    return '–' if not math.isfinite(p) else '<0.001' if p < 0.001 else f'{p:.3f}'


class Tests:
    """Every paired test of one report. A family's Holm adjustment needs all of its p-values, so a cell is written
    as a placeholder when the test is added and filled in once the report is complete."""

    def __init__(self):
        self.tests = []

    def add(self, family, label, differences):
        """A placeholder for the test's cell; a test shown twice (a table and a claim's line) counts once."""
        if not differences:
            return 'not measured'
        for i, t in enumerate(self.tests):
            if (t['family'], t['label']) == (family, label):
                return f'\x00{i}\x00'
        self.tests.append(dict(family=family, label=label, differences=list(differences),
                               **paired_test(list(differences))._asdict()))
        return f'\x00{len(self.tests) - 1}\x00'

    def finish(self):
        for family in dict.fromkeys(t['family'] for t in self.tests):
            members = [t for t in self.tests if t['family'] == family and math.isfinite(t['p'])]
            for t, adjusted in zip(members, holm([t['p'] for t in members])):
                t['p_holm'], t['family_size'] = adjusted, len(members)
        for t in self.tests:
            t.setdefault('p_holm', float('nan'))
            t.setdefault('family_size', 0)
            t['verdict'] = verdict(PairedTest(*(t[k] for k in PairedTest._fields)), t['p_holm'])

    def cell(self, t):
        if t['n'] < 2:
            return f"{t['mean']:+.3g} (n = {t['n']}): {t['verdict']}"
        words = f"**{t['verdict']}**" if t['verdict'] in ('lower', 'higher') else t['verdict']
        return (f"{t['mean']:+.3g} [{t['low']:+.2g}, {t['high']:+.2g}], p {fmt_p(t['p'])}, Holm {fmt_p(t['p_holm'])}, "
                f"MDE {t['mde']:.2g}: {words}")

    def fill(self, text):
        return re.sub('\x00(\\d+)\x00', lambda m: self.cell(self.tests[int(m[1])]), text)


def ci_half_width(differences):
    """Half the 95 % CI of the mean of a list of differences (the figures' error bars); 0 for one value."""
    test = paired_test(list(differences))
    return (test.high - test.low) / 2 if test.n > 1 else 0.0


def family(study, a, b):
    """The Holm family of the loss test a − b in a study: the same comparison across the study's settings (corpora,
    sizes), except the fixed-γ grid, which is one family (picking the best of seven γ is part of claim (d))."""
    if study.startswith('fixed_gamma') and a.startswith('fixed_gamma'):
        return 'every fixed γ − attention, every setting'
    return f'{a} − {b}, every setting'


def paired_differences(loaded, a, b):
    """val(a) − val(b) at the final evaluation, over the seeds both finished, in seed order."""
    seeds = sorted(s for v, s in loaded if v == a and (b, s) in loaded)
    return [loaded[(a, s)]['log'][-1]['val_loss'] - loaded[(b, s)]['log'][-1]['val_loss'] for s in seeds]


def summarize(loaded, variants):
    """Per variant of one setting: final val losses by seed, their mean/SD, the paired differences to attention,
    corridor occupancy (all heads, by layer, layers after the first) and mean γ, δ."""
    summary = {}
    for variant in variants:
        seeds = sorted(s for v, s in loaded if v == variant)
        if not seeds:
            continue
        values = [loaded[(variant, s)]['log'][-1]['val_loss'] for s in seeds]
        occupancy = [occupancy_report(loaded[(variant, s)]['gamma'], loaded[(variant, s)]['delta']) for s in seeds]
        n_layer = len(occupancy[0]['layers'])
        first = loaded[(variant, seeds[0])]
        entry = dict(seeds=seeds, val_loss=values, mean=statistics.fmean(values),
                     std=statistics.stdev(values) if len(values) > 1 else float('nan'),
                     occupancy=statistics.fmean(o['occupancy'] for o in occupancy),
                     occupancy_by_layer=[statistics.fmean(o['layers'][i]['occupancy'] for o in occupancy)
                                         for i in range(n_layer)],
                     occupancy_beyond_first=statistics.fmean(o['occupancy_beyond_first'] or 0 for o in occupancy),
                     gamma_mean=statistics.fmean(loaded[(variant, s)]['gamma'].mean().item() for s in seeds),
                     delta_mean=statistics.fmean(loaded[(variant, s)]['delta'].mean().item() for s in seeds),
                     params=first['params'], non_embedding_params=first.get('non_embedding') or
                     non_embedding_params(first['config']),
                     tokens=first['log'][-1]['tokens'], operator_scalars=first['config']['operator'] != 'attention')
        if variant != 'attention':
            entry['vs_attention_differences'] = paired_differences(loaded, variant, 'attention')
            entry['vs_attention'] = paired_test(entry['vs_attention_differences'])._asdict()
        summary[variant] = entry
    return summary


def table(setting, summary, tests, study):
    """The markdown table of one setting's variants."""
    n_layer = max(len(e['occupancy_by_layer']) for e in summary.values())
    rows = ["| variant | seeds | val loss mean ± SD | − attention, paired: mean [95 % CI], p, Holm p, MDE: verdict | "
            "mean γ, δ | in corridor | " + ' | '.join(f'L{i}' for i in range(n_layer)) + ' |',
            '|---|---|---|---|---|---|' + '---|' * n_layer]
    for variant, e in summary.items():
        diff = tests.add(family(study, variant, 'attention'), f'{setting}: {variant} − attention',
                         e['vs_attention_differences']) if variant != 'attention' else '–'
        cells = [variant, str(len(e['seeds'])), f"{e['mean']:.4f} ± {e['std']:.4f}", diff]
        if e['operator_scalars']:
            cells += [f"{e['gamma_mean']:+.3f}, {e['delta_mean']:.3f}", f"{e['occupancy']:.0%}",
                      *(f'{x:.0%}' for x in e['occupancy_by_layer'])]
        else:
            cells += ['0, 1'] + ['–'] * (n_layer + 1)
        rows.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(rows)


def line_fit(xs, ys):
    """Least squares y = a + b·x: (b, its 95 % CI low, high, p of b = 0, n), from the t distribution on n − 2
    degrees of freedom; NaNs when fewer than 3 points or one x."""
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 3 or sxx == 0:
        return (float('nan'),) * 4 + (n,)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys)) / (n - 2)
    se = math.sqrt(residual / sxx)
    half = t_quantile(0.975, n - 2) * se
    return slope, slope - half, slope + half, t_two_sided_p(slope / se, n - 2) if se > 0 else 0.0, n


# ------------------------------------------------------------------------------------------------ figures

def plot_sweep_losses(loaded, variants, path, title):
    """Validation loss of every variant (mean over seeds) and, beside it, its difference to attention paired by
    seed (mean and its 95 % CI): the differences are far smaller than the curves' own fall."""
    seeds = sorted({s for v, s in loaded if v == 'attention'})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for i, v in enumerate(variants):
        common = [s for s in seeds if (v, s) in loaded]
        if not common:
            continue
        curves = torch.tensor([[e['val_loss'] for e in loaded[(v, s)]['log']] for s in common], dtype=torch.float64)
        tokens = [e['tokens'] / 1e6 for e in loaded[(v, common[0])]['log']]
        skip = 1 if len(tokens) > 2 else 0  # the first evaluation (ln vocab) would flatten the rest of the curves
        axes[0].plot(tokens[skip:], curves.mean(0)[skip:].tolist(), marker='.', color=f'C{i % 10}', label=v)
        if v != 'attention':
            diff = curves - torch.tensor([[e['val_loss'] for e in loaded[('attention', s)]['log']] for s in common],
                                         dtype=torch.float64)
            ci = [ci_half_width(diff[:, j].tolist()) for j in range(len(tokens))]
            axes[1].errorbar(tokens[skip:], diff.mean(0)[skip:].tolist(), yerr=ci[skip:], marker='.',
                             capsize=2, color=f'C{i % 10}', label=v)
    axes[0].set_title(f'{title}: validation loss, mean over seeds', fontsize=10)
    axes[0].set_ylabel('loss (nats per token)')
    axes[1].axhline(0, color='black', lw=0.8)
    axes[1].set_title('difference to attention, paired by seed (mean, 95 % CI)', fontsize=10)
    axes[1].set_ylabel('Δ loss (nats per token)')
    for ax in axes:
        ax.set_xlabel('tokens seen (millions)')
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    return save(fig, path)


def setting_figures(setting, loaded, summary, out):
    """Every setting's own figures: losses, occupancy by layer, γ of every head of the corridor (seed 0)."""
    folder = out if setting == 'sweep' else os.path.join(out, setting.replace('/', '_'))
    os.makedirs(folder, exist_ok=True)
    variants = list(summary)
    plot_sweep_losses(loaded, variants, os.path.join(folder, 'val_loss.png'), setting)
    learnable = {v: dict(layers=[dict(layer=i, occupancy=x) for i, x in enumerate(e['occupancy_by_layer'])])
                 for v, e in summary.items() if e['operator_scalars']}
    if learnable:
        plot_occupancy(learnable, os.path.join(folder, 'occupancy.png'))
    for v in variants:
        if v.startswith('corridor') and loaded[(v, summary[v]['seeds'][0])]['log']:
            seed = summary[v]['seeds'][0]
            plot_evolution(loaded[(v, seed)]['log'], os.path.join(folder, f'gamma_{v}.png'), f"{setting}, {v}, seed {seed}")
    if 'corridor' in summary:  # every head of every seed's corridor run in the (γ, δ) plane
        seeds = summary['corridor']['seeds']
        plot_gamma_delta({f'corridor, {len(seeds)} seeds': tuple(torch.cat([loaded[('corridor', s)][k] for s in seeds], 1)
                                                                for k in ('gamma', 'delta'))},
                         os.path.join(folder, 'gamma_delta.png'))


def claims_figures(results, out, tests, study):
    """The paper's four claims, per setting."""
    lines = []
    for setting, (loaded, summary) in results.items():
        corridor = summary.get('corridor')

        def test(a, b):
            return tests.add(family(study, a, b), f'{setting}: {a} − {b}', paired_differences(loaded, a, b))
        lines += [f"### Claims on {setting}", '',
                  f"- a: learnable δ(γI+P) lowers val loss vs attention: {test('corridor', 'attention')}",
                  "- b: heads beyond the first layer in −1 < γ < 0: " +
                  (f"{corridor['occupancy_beyond_first']:.0%} (mean γ {corridor['gamma_mean']:+.3f})" if corridor else 'not measured'),
                  f"- c: γ ≥ 0 raises val loss vs learnable γ: {test('gamma_nonneg', 'corridor')}",
                  f"- d: fixed γ = −0.5, δ = 1 beats attention: {test('fixed_gamma', 'attention')}",
                  f"- the forms alike: α0·I + α1·P − corridor {test('alpha', 'corridor')}; "
                  f"αP + β(I − P) − corridor {test('alpha_beta', 'corridor')}", '']
    return lines


# the cells the replication repeats, as the claims study measured them (seeds 0-2; README, commit a7c0eb5)
REPLICATED = {'corridor − attention': (-0.0031, 0.0006, 3), 'gamma_nonneg − corridor': (+0.0036, 0.0003, 3)}


def replication_figures(results, out, tests, study):
    """Each primary test beside the cell it replicates. Named before the runs were read; reported whatever it shows."""
    lines = ["### The replication's primary tests (each alone in its family)", '',
             "| claim | test | original, seeds 0-2 (mean [95 % CI], p) | replication, fresh seeds: mean [95 % CI], p, "
             "Holm p, MDE: verdict |", '|---|---|---|---|']
    for setting, (loaded, summary) in results.items():
        for claim, (a, b) in (('(a)', ('corridor', 'attention')), ('(c)', ('gamma_nonneg', 'corridor'))):
            label = f'{a} − {b}'
            original = summary_test(*REPLICATED[label])
            cell = tests.add(family(study, a, b), f'{setting}: {label}', paired_differences(loaded, a, b))
            lines.append(f"| {claim} | {setting}: {label} | {original.mean:+.4f} [{original.low:+.4f}, "
                         f"{original.high:+.4f}], p {fmt_p(original.p)} | {cell} |")
    return lines + ['']


def fixed_gamma_figures(results, out, tests, study):
    """Δ val loss against the fixed γ, one panel per setting, the learnable corridor's mean γ marked."""
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
    lines = ["### Fixed γ (δ = 1) against attention, paired by seed", '',
             "| setting | " + ' | '.join(f'γ = {g}' for g in FIXED_GAMMAS) + ' | learnable corridor |',
             '|---|' + '---|' * (len(FIXED_GAMMAS) + 1)]
    for ax, (setting, (loaded, summary)) in zip(axes[0], results.items()):
        names = {g: parse_variant(f'fixed_gamma={g}')[0] for g in FIXED_GAMMAS}
        points = [(g, summary[names[g]]) for g in FIXED_GAMMAS if names[g] in summary]
        ax.axhline(0, color='black', lw=0.8)
        ax.axvspan(-1, 0, color='tab:green', alpha=0.08)
        if points:
            ax.errorbar([g for g, _ in points], [e['vs_attention']['mean'] for _, e in points],
                        yerr=[ci_half_width(e['vs_attention_differences']) for _, e in points], marker='o',
                        capsize=3, label='fixed γ, δ = 1 (mean, 95 % CI over seeds)')
        corridor = summary.get('corridor')
        if corridor:
            ax.errorbar([corridor['gamma_mean']], [corridor['vs_attention']['mean']],
                        yerr=[ci_half_width(corridor['vs_attention_differences'])], marker='*', markersize=12,
                        color='tab:red', capsize=3, ls='none',
                        label=f"learnable corridor (final mean γ {corridor['gamma_mean']:+.2f})")
        ax.set_xlabel('γ')
        ax.set_ylabel('val loss − attention (nats per token)')
        ax.set_title(setting, fontsize=10)
        ax.legend(fontsize=7)
        cells = [tests.add(family(study, names[g], 'attention'), f'{setting}: {names[g]} − attention',
                           summary[names[g]]['vs_attention_differences']) if names[g] in summary else '–'
                 for g in FIXED_GAMMAS]
        cells.append(tests.add(family(study, 'corridor', 'attention'), f'{setting}: corridor − attention',
                               corridor['vs_attention_differences']) + f" (γ̄ {corridor['gamma_mean']:+.3f})"
                     if corridor else '–')
        lines.append(f"| {setting} | " + ' | '.join(cells) + ' |')
    fig.suptitle('Claim (d): does some fixed γ inside the corridor beat attention? (95 % CIs)', fontsize=11)
    save(fig, os.path.join(out, 'fixed_gamma.png'))
    return lines + ['', '![fixed γ](fixed_gamma.png)', '']


def scales_figures(results, out, tests, study):
    """Δ val loss (corridor − attention) against non-embedding parameters per corpus, with a line fitted to every
    seed's difference against log10(parameters); occupancy by layer against size."""
    corpora = list(dict.fromkeys(s.split('/')[0] for s in results))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    lines = ["### The learnable corridor against attention by model size", '',
             "| setting | non-embedding parameters | tokens | tokens per parameter | corridor − attention: mean "
             "[95 % CI], p, Holm p, MDE: verdict | in corridor (layers ≥ 1) | mean γ |", '|---|---|---|---|---|---|---|']
    fits = []
    for i, corpus in enumerate(corpora):
        points = sorted((summary['corridor']['non_embedding_params'], setting, summary['corridor'])
                        for setting, (_, summary) in results.items()
                        if setting.split('/')[0] == corpus and 'corridor' in summary)
        axes[0].errorbar([p for p, _, _ in points], [c['vs_attention']['mean'] for _, _, c in points],
                         yerr=[ci_half_width(c['vs_attention_differences']) for _, _, c in points],
                         marker='o', capsize=3, color=f'C{i}', label=f'{corpus} (mean, 95 % CI)')
        for n, (params, setting, c) in enumerate(points):
            axes[1].plot(range(len(c['occupancy_by_layer'])), c['occupancy_by_layer'], marker='o', color=f'C{i}',
                         alpha=0.4 + 0.6 * (n + 1) / len(points), label=f"{corpus}, {millions(params)}")
            cell = tests.add(family(study, 'corridor', 'attention'), f'{setting}: corridor − attention',
                             c['vs_attention_differences'])
            lines.append(f"| {setting} | {millions(params)} | {c['tokens'] / 1e6:.2f}M | {c['tokens'] / params:.1f} | "
                         f"{cell} | {c['occupancy_beyond_first']:.0%} | {c['gamma_mean']:+.3f} |")
        xs = [math.log10(p) for p, _, c in points for _ in c['vs_attention_differences']]
        ys = [d for _, _, c in points for d in c['vs_attention_differences']]
        slope, low, high, p, n = line_fit(xs, ys)
        if math.isfinite(slope):
            fits.append(f"- {corpus}: corridor − attention changes by {slope:+.4f} per tenfold parameters, 95 % CI "
                        f"[{low:+.4f}, {high:+.4f}], p {fmt_p(p)} (least squares over {n} seed pairs at "
                        f"{len(points)} sizes; a negative slope: the gain grows with size)")
            grid = torch.linspace(min(xs), max(xs), 20, dtype=torch.float64)
            axes[0].plot((10 ** grid).tolist(), (statistics.fmean(ys) + slope * (grid - statistics.fmean(xs))).tolist(),
                         ls='--', color=f'C{i}', lw=0.8)
    axes[0].axhline(0, color='black', lw=0.8)
    axes[0].set_xscale('log')
    axes[0].set_xlabel('non-embedding parameters')
    axes[0].set_ylabel('corridor − attention val loss')
    axes[0].set_title('Claim (a) across model sizes (dashed: least-squares fit)', fontsize=10)
    axes[0].legend(fontsize=8)
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].set_xlabel('layer')
    axes[1].set_ylabel('fraction of heads with −1 < γ < 0')
    axes[1].set_title('Corridor occupancy by layer, by size', fontsize=10)
    axes[1].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    save(fig, os.path.join(out, 'scales.png'))
    fits = ["The gain against size: " if fits else "The gain against size: fewer than two sizes finished.", *fits]
    return lines + ['', *fits, '', '![scales](scales.png)', '']


DEEP = -0.05  # claim (b)'s "inside the corridor", read strictly: a head at γ = −0.01 is hardly off attention


def last_quarter_range(gamma):
    """How far γ still moves at the end: over the evaluations of the last quarter, the largest range of one head's γ
    (the head that moves most). gamma: [evaluations, layers, heads]."""
    tail = gamma[int(0.75 * (len(gamma) - 1)):]
    return (tail.max(0).values - tail.min(0).values).max().item()


def gamma_dynamics_figures(results, out, tests, study):
    """Where γ settles: every head's γ against tokens (per variant), occupancy over time, and per seed and layer the
    fraction of heads with −1 < γ < −0.05 at the end, and how far the heads still move in the last quarter."""
    lines = ["### Where γ settles", '',
             f"Per seed: the fraction of heads with −1 < γ < {DEEP} at the end of training, by layer; the mean γ of "
             "layer 0 and of the later layers; settling: the largest range of γ over the last quarter's evaluations, "
             "over all heads (the head that moves most); the loss gap to attention with the same seed.", '',
             f"| setting | variant | seed | −1 < γ < {DEEP}, by layer | γ̄ layer 0 | γ̄ layers ≥ 1 | γ range | "
             "largest γ range in the last quarter | val − attention |", '|---|---|---|---|---|---|---|---|---|']
    summaries, images = [], []
    for setting, (loaded, summary) in results.items():
        learnable = [v for v in summary if summary[v]['operator_scalars']]
        fig, axes = plt.subplots(2, max(1, len(learnable)), figsize=(4 * max(1, len(learnable)), 6.4), squeeze=False)
        for col, v in enumerate(learnable):
            deep_beyond_first, layer0_minus_rest = [], []
            n_layer = loaded[(v, summary[v]['seeds'][0])]['config']['n_layer']
            for s in summary[v]['seeds']:
                log = loaded[(v, s)]['log']
                tokens = [e['tokens'] / 1e6 for e in log]
                gamma = torch.tensor([e['gamma'] for e in log])  # [evals, layers, heads]
                top = axes[0][col]
                top.axhspan(-1, 0, color='tab:green', alpha=0.08)
                for layer in range(gamma.shape[1]):
                    for head in range(gamma.shape[2]):
                        top.plot(tokens, gamma[:, layer, head].tolist(), lw=0.8, alpha=0.7, color=f'C{layer}',
                                 label=f'layer {layer}' if head == 0 and s == summary[v]['seeds'][0] else None)
                axes[1][col].plot(tokens, in_corridor(gamma[:, 1:]).float().mean((1, 2)).tolist(), label=f'layers ≥ 1, seed {s}')
                axes[1][col].plot(tokens, in_corridor(gamma[:, 0]).float().mean(1).tolist(), ls='--', label=f'layer 0, seed {s}')
                last = gamma[-1]
                deep = ((last > -1) & (last < DEEP)).float()
                deep_beyond_first.append(deep[1:].mean().item())
                layer0_minus_rest.append((last[0].mean() - last[1:].mean()).item())
                settling = last_quarter_range(gamma)
                seed_gap = f"{loaded[(v, s)]['log'][-1]['val_loss'] - loaded[('attention', s)]['log'][-1]['val_loss']:+.4f}" \
                    if ('attention', s) in loaded else '– (its attention run not finished)'
                lines.append(f"| {setting} | {v} | {s} | {' / '.join(f'{x:.0%}' for x in deep.mean(1).tolist())} | "
                             f"{last[0].mean():+.3f} | {last[1:].mean():+.3f} | [{last.min():+.2f}, {last.max():+.2f}] | "
                             f"{settling:.3f} | {seed_gap} |")
            fraction = paired_test(deep_beyond_first)
            # "layer 0 is the exception" as a number: its mean γ minus the later layers', one value per seed
            contrast, layer0_text = paired_test(layer0_minus_rest), ''
            if n_layer > 1:
                layer0_text = f"; γ̄ layer 0 − γ̄ layers ≥ 1: {contrast.mean:+.3f}"
                if contrast.n > 1:
                    layer0_text += f" [{contrast.low:+.3f}, {contrast.high:+.3f}], p {fmt_p(contrast.p)}"
            gap = tests.add(family(study, v, 'attention'), f'{setting}: {v} − attention',
                            paired_differences(loaded, v, 'attention'))
            summaries.append(
                f"- {setting}, {v}: heads beyond layer 0 with −1 < γ < {DEEP}: {fraction.mean:.0%} over "
                f"{fraction.n} seed(s)" + (f", 95 % CI [{fraction.low:.0%}, {fraction.high:.0%}]"
                                           if fraction.n > 1 and fraction.sd > 0 else
                                           ' (no spread between seeds)' if fraction.n > 1 else '') +
                (f"; val − attention {gap}" if 'attention' in summary else '') + layer0_text)
            axes[0][col].set_title(f'{v}: γ of every head', fontsize=9)
            axes[1][col].set_ylim(-0.05, 1.05)
            axes[1][col].set_title('fraction in the corridor', fontsize=9)
            axes[1][col].set_xlabel('tokens seen (millions)')
        if learnable:
            axes[0][0].legend(fontsize=6)
            axes[1][0].legend(fontsize=6)
        fig.suptitle(f'Claim (b): where γ settles, {setting}', fontsize=11)
        name = f"gamma_dynamics_{setting.replace('/', '_')}.png"
        save(fig, os.path.join(out, name))
        images += [f'![γ dynamics, {setting}]({name})', '']
    return lines + ['', 'Across seeds:', '', *summaries, '', *images]


# the pretrained study's cells, each a difference of final val losses paired by seed ('frozen': the run's own
# evaluation at iteration 0, where γ = 0, δ = 1 computes the pretrained model on the same batches): (claim, a, b)
PRETRAINED_CELLS = (('(a)', 'corridor', 'delta_only'), ('(a)', 'corridor', 'frozen'), ('–', 'delta_only', 'frozen'),
                    ('(c)', 'gamma_nonneg', 'corridor'), ('(d), δ learned', 'fixed_gamma_delta', 'delta_only'),
                    ('forms', 'alpha', 'corridor'), ('forms', 'alpha_beta', 'corridor'))
PRETRAINED_FAMILY = 'every cell of the pretrained study (trained cells paired by seed, frozen cells by batch)'


def pretrained_variant(summary, name):
    """The study's variant spec for a cell's name: fixed_gamma_delta stands for whichever fixed γ the study trains."""
    if name == 'fixed_gamma_delta':
        return next((v for v in summary if v.split('=')[0] == name),
                    parse_variant(f'{name}={PRETRAINED_FIXED_GAMMA}')[0])
    return name


def study_settings(study):
    """The settings of a study's parts, by its report name ('pretrained', 'pretrained-gpu')."""
    base, gpu = study.removesuffix('-gpu'), study.endswith('-gpu')
    if base not in STUDIES:
        return []
    return list(dict.fromkeys(p.setting for p in (STUDIES[base].gpu_parts if gpu else STUDIES[base].parts)))


def frozen_gamma_cells(losses, tests, setting):
    """Each fixed γ of the frozen model: (γ, mean val loss over the batches, its SE, the cell of γ − (γ = 0) paired
    by batch); γ = 0's cell is '–'."""
    rows = []
    for gamma, values in sorted(losses.items()):
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float('nan')
        cell = '–' if gamma == 0 else tests.add(
            PRETRAINED_FAMILY, f'{setting}: frozen, γ = {gamma:+g} − γ = 0 (δ = 1)',
            [a - b for a, b in zip(values, losses[0.0])])
        rows.append((gamma, statistics.fmean(values), se, cell))
    return rows


def pretrained_figures(results, out, tests, study):
    """A frozen pretrained model given the operator, the paper's four claims as cells (PRETRAINED_CELLS, paired by
    seed at the final evaluation), and the frozen model's fixed-γ curve at δ = 1 (frozen_gamma_losses: per batch,
    paired with γ = 0 by batch), all in one Holm family; per run where γ ends, how far it still moves in the last
    quarter, and the wall time; a figure of every cell and the curve, and one of γ per layer and over training."""
    lines = ["### The claims at this scale: one Holm family", '',
             "Trained cells: final val loss, paired by seed ('frozen': the run's own evaluation at iteration 0, where "
             "γ = 0, δ = 1 computes the pretrained model on the same batches). Frozen cells: the pretrained model with "
             "every head at a fixed γ, δ = 1 (nothing to train), on the evaluation batches of seed "
             f"{FROZEN_SEED}, paired with γ = 0 by batch: their CI is over batches, not seeds. Claim (b) is the "
             "per-run table below.", '',
             "| setting | claim | cell | seeds | mean [95 % CI], p, Holm p, MDE: verdict |", '|---|---|---|---|---|']
    rows = ["### Where γ ends, per run", '',
            f"| setting | variant | seed | frozen → final val loss | γ̄ [min, max] | −1 < γ < 0 | −1 < γ < {DEEP} | "
            "largest γ range in the last quarter | wall time |", '|---|---|---|---|---|---|---|---|---|']
    curves, images, out_root = [], [], os.path.dirname(os.path.normpath(out))
    settings = list(dict.fromkeys([*study_settings(study), *results]))
    for setting in settings:
        loaded, summary = results.get(setting, ({}, {}))
        path = frozen_gamma_path(out_root, setting)
        if os.path.isfile(path):
            with open(path) as f:
                saved = json.load(f)
            losses = {float(g): v for g, v in saved['losses'].items()}
            if 0.0 in losses:
                curves.append((setting, saved, frozen_gamma_cells(losses, tests, setting)))
        for claim, a, b in PRETRAINED_CELLS:
            a, b = pretrained_variant(summary, a), pretrained_variant(summary, b)
            if a not in summary or (b != 'frozen' and b not in summary):
                lines.append(f"| {setting} | {claim} | {a} − {b} | 0 | not trained yet |")
                continue
            differences = [loaded[(a, s)]['log'][-1]['val_loss'] - loaded[(a, s)]['log'][0]['val_loss']
                           for s in summary[a]['seeds']] if b == 'frozen' else paired_differences(loaded, a, b)
            cell = tests.add(PRETRAINED_FAMILY, f'{setting}: {a} − {b}', differences)
            lines.append(f"| {setting} | {claim} | {a} − {b} | {len(differences)} | {cell} |")
        if not loaded:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
        extremes = [0.0]
        for (variant, seed), run in sorted(loaded.items()):
            log = run['log']
            gamma = torch.tensor([e['gamma'] for e in log])  # [evals, layers, heads]
            last = gamma[-1]
            settling = last_quarter_range(gamma)
            wall = f"{run['seconds'] / 60:.0f} min" if run['seconds'] else '–'
            rows.append(f"| {setting} | {variant} | {seed} | {log[0]['val_loss']:.4f} → {log[-1]['val_loss']:.4f} | "
                        f"{last.mean():+.3f} [{last.min():+.2f}, {last.max():+.2f}] | {in_corridor(last).float().mean():.0%} | "
                        f"{((last > -1) & (last < DEEP)).float().mean():.0%} | {settling:.3f} | {wall} |")
            if variant != 'corridor':
                continue
            layers = range(last.shape[0])
            extremes += [last.min().item(), last.max().item()]
            axes[0].plot(layers, last.mean(1).tolist(), marker='o', ms=3, label=f'mean over heads, seed {seed}')
            axes[0].fill_between(layers, last.min(1).values.tolist(), last.max(1).values.tolist(), alpha=0.15)
            axes[1].plot(layers, in_corridor(last).float().mean(1).tolist(), marker='o', ms=3, label=f'seed {seed}')
            tokens = [e['tokens'] / 1e3 for e in log]
            for layer in layers:
                axes[2].plot(tokens, gamma[:, layer].mean(1).tolist(), lw=0.8,
                             color=plt.cm.viridis(layer / max(1, len(layers) - 1)), alpha=0.8)
        axes[0].axhspan(-1, 0, color='tab:green', alpha=0.08)
        margin = 0.1 * (max(extremes) - min(extremes)) or 0.01
        axes[0].set_ylim(min(extremes) - margin, max(extremes) + margin)  # the heads' values, not the whole corridor
        axes[0].set(xlabel='layer', ylabel='final γ (shaded: the corridor)',
                    title='corridor: γ by layer (band: min–max over heads)')
        axes[1].set(xlabel='layer', ylabel='fraction of heads', title='corridor: −1 < γ < 0 by layer', ylim=(-0.05, 1.05))
        axes[2].set(xlabel='tokens seen (thousands)', ylabel='mean γ of the layer',
                    title='corridor: γ over training (dark: first layers)')
        for ax in axes[:2]:
            ax.legend(fontsize=7)
        name = f"pretrained_{setting.replace('/', '_')}.png"
        save(fig, os.path.join(out, name))
        images += [f'![γ by layer, {setting}]({name})', '']
        plot_pretrained_cells(setting, loaded, next((c for c in curves if c[0] == setting), None),
                              os.path.join(out, f"pretrained_claims_{setting.replace('/', '_')}.png"))
        images += [f"![the cells and the frozen fixed-γ curve, {setting}](pretrained_claims_{setting.replace('/', '_')}.png)", '']
    for setting, saved, frozen in curves:
        if setting not in results:  # no trained run yet: the curve alone
            plot_pretrained_cells(setting, {}, (setting, saved, frozen),
                                  os.path.join(out, f"pretrained_claims_{setting.replace('/', '_')}.png"))
            images += [f"![the frozen fixed-γ curve, {setting}](pretrained_claims_{setting.replace('/', '_')}.png)", '']
    frozen_lines = []
    for setting, saved, frozen in curves:
        identity = saved['identity']
        frozen_lines += [f"### {setting}: the frozen model at fixed γ, δ = 1 (claim (d), no training)", '',
                         f"{identity['init_from']} with every head at γ, δ = 1, on the {identity['eval_iters']} "
                         f"evaluation batches of seed {identity['seed']} ({identity['batch_size']} × "
                         f"{identity['block_size']} tokens each, {identity['dataset']}'s val split); SE over "
                         "batches; the difference to γ = 0 (the pretrained model) paired by batch.", '',
                         "| γ | val loss | SE | − γ = 0, paired by batch: mean [95 % CI], p, Holm p, MDE: verdict | "
                         "wall time |", '|---|---|---|---|---|']
        for gamma, mean, se, cell in frozen:
            frozen_lines.append(f"| {gamma:+g} | {mean:.4f} | {se:.4f} | {cell} | "
                                f"{saved['seconds'][f'{gamma:+g}'] / 60:.1f} min |")
        frozen_lines.append('')
    if not curves:
        frozen_lines = ["The frozen model's fixed-γ curve: not evaluated yet (`python sweep.py --study=pretrained` "
                        "evaluates it before any run)", '']
    return lines + [''] + frozen_lines + rows + [''] + images


def plot_pretrained_cells(setting, loaded, curve, path):
    """One scale, the frozen model's loss on the same batches subtracted. Left: every variant's final val loss minus
    its run's iteration-0 loss (the frozen model on that seed's batches), mean and 95 % CI over seeds; right: the
    frozen model's val loss at fixed γ, δ = 1, minus γ = 0's, paired by batch (mean, 95 % CI over batches)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw=dict(width_ratios=(1.2, 1)))
    by_variant = {}
    for (variant, seed), run in sorted(loaded.items()):
        by_variant.setdefault(variant, []).append(run['log'][-1]['val_loss'] - run['log'][0]['val_loss'])
    cells = [(v, d, None) for v, d in by_variant.items()]
    measured = [(label, d) for label, d, _ in cells if d]
    for i, (label, differences) in enumerate(measured):
        axes[0].errorbar([statistics.fmean(differences)], [i], xerr=[ci_half_width(differences)], marker='o',
                         capsize=3, color='C0')
        axes[0].plot(differences, [i] * len(differences), 'x', color='gray', ms=4)
    if measured:
        axes[0].set_yticks(range(len(measured)), [f'{label} (n = {len(d)})' for label, d in measured], fontsize=8)
        axes[0].set_ylim(-0.5, len(measured) - 0.5)
        axes[0].axvline(0, color='black', lw=0.8)
        axes[0].set_xlabel('final val loss − frozen model, same batches (nats per token)')
        axes[0].set_title(f'{setting}: by variant (mean, 95 % CI over seeds; ×: seeds)', fontsize=9)
    else:
        axes[0].set_axis_off()
        axes[0].text(0.5, 0.5, f'{setting}:\nno trained run finished yet', ha='center', va='center', fontsize=10)
    if curve:
        _, saved, frozen = curve
        losses = {float(g): v for g, v in saved['losses'].items()}
        gammas = [g for g, *_ in frozen]
        diffs = [[a - b for a, b in zip(losses[g], losses[0.0])] for g in gammas]
        axes[1].errorbar(gammas, [statistics.fmean(d) for d in diffs], yerr=[ci_half_width(d) for d in diffs],
                         marker='o', capsize=3, color='tab:blue')
        axes[1].axvspan(min(gammas + [-1e-9]), 0, color='tab:green', alpha=0.08)
        axes[1].axhline(0, color='black', lw=0.8)
        axes[1].set_yscale('symlog', linthresh=0.02)  # the small differences near γ = 0 beside the large ones
        for g, d in zip(gammas, diffs):
            axes[1].annotate(f'{statistics.fmean(d):+.3f}', (g, statistics.fmean(d)), textcoords='offset points',
                             xytext=(4, 6), fontsize=7)
        axes[1].set_xlabel('fixed γ of every head (δ = 1)')
        axes[1].set_ylabel('val loss − γ = 0 (nats per token)')
        base = next(mean for g, mean, *_ in frozen if g == 0)
        axes[1].set_title(f'frozen model at fixed γ, δ = 1 (γ = 0: {base:.4f}):\npaired by batch, 95 % CI over '
                          f'{len(losses[0.0])} batches', fontsize=9)
    else:
        axes[1].set_axis_off()
    return save(fig, path)


# The pretrained study's frozen cell: with every weight frozen, a fixed γ at δ = 1 has nothing to learn, so claim (d)
# at 135M is an evaluation, one per γ, of the pretrained model on the evaluation batches train.py draws for a seed
# (estimate_loss's val batches: the very batches that seed's trained runs are evaluated on, so γ = 0 is their
# iteration-0 loss). Each batch's loss is kept: the SE over batches, and each γ's difference to γ = 0 paired by batch.
PRETRAINED_GAMMAS = (-0.3, -0.2, -0.1, -0.05, 0.0, 0.05)
FROZEN_SEED = 0


def frozen_gamma_path(out_root, setting):
    return os.path.join(out_root, setting, 'frozen_gamma.json')


def frozen_gamma_losses(setting, out_root, gammas=PRETRAINED_GAMMAS, seed=FROZEN_SEED, train_args=()):
    """{γ: [val loss per evaluation batch]} of the setting's frozen pretrained model with every head at fixed γ,
    δ = 1, on the val batches train.py's evaluation draws for `seed`; kept in OUT_ROOT/<setting>/frozen_gamma.json
    after each γ, so that a rerun continues (and recomputes all if the setting's data or batches changed)."""
    import train  # its Data, for the very batches a run's estimate_loss draws
    from types import SimpleNamespace
    config_file, keys = SETTINGS[setting]
    args = [os.path.join(os.path.dirname(os.path.abspath(__file__)), config_file),
            *(f'--{k}={v!r}' for k, v in keys.items()), f'--seed={seed}', *train_args]
    cfg = SimpleNamespace(**parse_config(TRAIN_DEFAULTS, args))
    identity = dict(init_from=cfg.init_from, dataset=cfg.dataset, seed=seed, eval_iters=cfg.eval_iters,
                    batch_size=cfg.batch_size, block_size=cfg.block_size, dtype=cfg.dtype)
    path = frozen_gamma_path(out_root, setting)
    saved = dict(identity=identity, losses={}, seconds={})
    if os.path.isfile(path):
        with open(path) as f:
            previous = json.load(f)
        if previous.get('identity') == identity:
            saved = previous
    todo = [g for g in gammas if f'{g:+g}' not in saved['losses']]
    if todo:
        data = train.Data(cfg, cfg.device)
        model, _ = walk_hf.load_pretrained(cfg.init_from, operator='corridor', learn_gamma=False, learn_delta=False)
        check_tokenizer(model, data.meta, data.dir)
        model.to(cfg.device).eval()
        offsets = data.offsets('val', cfg.eval_iters, torch.Generator().manual_seed(cfg.seed + 1000 + 1))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        for gamma in todo:
            for attn in walk_hf.attention_modules(model.lm):
                attn.coefficients.gamma.fill_(gamma)
            start, losses = time.time(), []
            with torch.no_grad():
                for k in tqdm(range(cfg.eval_iters), desc=f'frozen model, γ = {gamma:+g}', unit='batch'):
                    x, y = data.batch('val', offsets[k])
                    losses.append(model(x, y)[1].item())
            saved['losses'][f'{gamma:+g}'], saved['seconds'][f'{gamma:+g}'] = losses, time.time() - start
            with atomic_write(path) as f:
                json.dump(saved, f, indent=1)
    return {g: saved['losses'][f'{g:+g}'] for g in gammas}, {g: saved['seconds'][f'{g:+g}'] for g in gammas}


def frozen_settings(parts):
    """The settings of a study's parts whose runs freeze every pretrained weight: those get the fixed-γ curve."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [setting for setting in dict.fromkeys(p.setting for p in parts if p.setting)
            if parse_config(TRAIN_DEFAULTS, [os.path.join(here, SETTINGS[setting][0]),
                                             *(f'--{k}={v!r}' for k, v in SETTINGS[setting][1].items())])
            ['train_only'] == 'operator']


def geometry_figures(results, out, tests, study):
    """The connection walk of every variant against attention's, paired by seed: per depth regime at the end of
    training (the attention part, and the full operator c_I·I + c_P·P), during training, and against γ."""
    lines = ["### The connection walk against attention's", '',
             "Final evaluation, per depth regime (initial 20 % of layers, middle, final 20 %): attention's value "
             "(mean over seeds) and each variant's difference to it, paired by seed, for the attention part P of "
             "the variant and for its full operator c_I·I + c_P·P. Holm families: one per variant and part, over "
             "every diagnostic × regime × setting. Does the difference track γ? Per learnable-corridor run, the "
             "least-squares slope of the full operator's difference (all layers) on the layer-mean γ over the "
             "evaluations after the first (the shared start at γ = 0 left out), tested across seeds; and one point "
             "per run (final evaluation) for the correlation across the corridor and fixed-γ runs.", '']
    for setting, (loaded, summary) in results.items():
        # pair by seed the finished runs that logged their walk (a study may be partway, a run may lack walk_interval)
        logged = {key for key, run in loaded.items() if walk_series(run['log'], 'attention', 'drift') is not None}
        seeds = {v: [s for s in summary[v]['seeds'] if (v, s) in logged and ('attention', s) in logged]
                 for v in summary}
        variants = [v for v in summary if v != 'attention' and seeds[v]]
        if not seeds.get('attention'):
            lines += [f"{setting}: no walk geometry logged (train with walk_interval)", '']
            continue

        def final(v, s, part, key):  # regime means of one run's last logged walk
            series = walk_series(loaded[(v, s)]['log'], part if summary[v]['operator_scalars'] else 'attention', key)
            return depth_regimes(series[1][-1].tolist())

        header = "| diagnostic | regime | attention | " + ' | '.join(f"{v}: P | {v}: operator" for v in variants) + ' |'
        lines += [f"#### {setting}", '', header, '|---|---|---|' + '---|---|' * len(variants)]
        for key, name in WALK_PANELS:
            for regime in ('initial', 'middle', 'final'):
                base = {s: final('attention', s, 'attention', key)[regime] for s in seeds['attention']}
                if any(b is None for b in base.values()):
                    continue
                cells = [f"{statistics.fmean(base.values()):.4g}"]
                for v in variants:
                    for part in ('attention', 'operator'):
                        diffs = [final(v, s, part, key)[regime] - base[s] for s in seeds[v]]
                        part_name = 'P' if part == 'attention' else 'operator'
                        cells.append(tests.add(f'geometry, {v}: {part_name}, every diagnostic × regime × setting',
                                               f'{setting}: {name}, {regime}, {v}: {part_name} − attention', diffs))
                lines.append(f"| {name} | {regime} | " + ' | '.join(cells) + ' |')
        lines.append('')

        # the full operator's difference to attention against γ: per-run slopes (corridor), one point per run (all)
        fig, axes = plt.subplots(1, len(WALK_PANELS), figsize=(4 * len(WALK_PANELS), 3.4), squeeze=False)
        tracking = []
        fixed_first = next(((v, seeds[v][0]) for v in variants if v.startswith('fixed_gamma')), None)  # one legend entry
        for col, (key, name) in enumerate(WALK_PANELS):
            ax, slopes, finals = axes[0][col], [], []
            for v in variants:
                for s in seeds[v]:
                    _, ours = walk_series(loaded[(v, s)]['log'], 'operator' if summary[v]['operator_scalars'] else 'attention', key)
                    _, theirs = walk_series(loaded[('attention', s)]['log'], 'attention', key)
                    gamma = torch.tensor([e['gamma'] for e in loaded[(v, s)]['log'] if 'walk' in e]).mean((1, 2))
                    if ours.shape != theirs.shape:  # evaluated at other iterations: not comparable step by step
                        continue
                    diff = (ours - theirs).mean(1)  # all layers
                    finals.append((gamma[-1].item(), diff[-1].item()))
                    if v == 'corridor':
                        slopes.append(line_fit(gamma[1:].tolist(), diff[1:].tolist())[0])
                        ax.plot(gamma.tolist(), diff.tolist(), '.-', color='tab:red', lw=0.8,
                                label='learnable corridor, every evaluation' if s == seeds[v][0] else None)
                    elif v.startswith('fixed_gamma'):
                        ax.plot([gamma[-1].item()], [diff[-1].item()], 'o', color='tab:blue',
                                label='fixed γ, end of training' if (v, s) == fixed_first else None)
            slopes = [b for b in slopes if math.isfinite(b)]
            cell = tests.add('geometry: slope of the operator − attention on γ̄, per corridor run',
                             f'{setting}: {name}', slopes) if slopes else 'too few evaluations'
            r = (torch.corrcoef(torch.tensor(finals, dtype=torch.float64).T)[0, 1].item()
                 if len(finals) > 2 and len({g for g, _ in finals}) > 1 else float('nan'))
            tracking.append(f"- {name}: slope per unit γ̄ {cell}; across runs (final evaluation, one point per run, "
                            f"n = {len(finals)}) r = {r:+.2f}")
            ax.axhline(0, color='black', lw=0.6)
            ax.set_xlabel('mean γ')
            ax.set_title(f'{name}\n(full operator) − attention', fontsize=9)
        axes[0][0].legend(fontsize=7)
        name = setting.replace('/', '_')
        save(fig, os.path.join(out, f'geometry_vs_gamma_{name}.png'))
        plot_walk_evolution({v: [loaded[(v, s)]['log'] for s in seeds[v]] for v in ('attention', *variants)},
                            os.path.join(out, f'geometry_{name}.png'), setting)
        lines += ["Does the difference track γ?", '', *tracking, '',
                  f"![geometry during training, {setting}](geometry_{name}.png)", '',
                  f"![geometry against γ, {setting}](geometry_vs_gamma_{name}.png)", '']
    return lines


# ------------------------------------------------------------------------------------------------ reports

STATISTICS = ("Final validation loss (nats per token). Every difference is paired by seed and reported as: mean "
              "[95 % CI], p of a two-sided paired t-test, that p Holm-adjusted within its family (families below), "
              "and MDE, the smallest true difference the test detects with 80 % power at 5 % two-sided given the "
              "observed SD and seeds (the exact noncentral t). Verdict 'lower' / 'higher' when the adjusted p is "
              "below 0.05; otherwise 'inconclusive, no effect larger than X', X the CI's bound farthest from zero. "
              "A family is one comparison across the study's settings (the fixed-γ grid: every γ and setting "
              "together; the geometry: one per variant and part over every diagnostic, regime and setting).")


def report(name, study, runs, out):
    """Load every finished run, write OUT/report.md, report.json and the figures; print the report."""
    os.makedirs(out, exist_ok=True)
    results, skipped = {}, []
    for setting in dict.fromkeys(key[0] for key in runs):
        loaded = {}
        for (s, variant, seed), (out_dir, _) in runs.items():
            if s != setting:
                continue
            if run_state(out_dir) == 'done':
                loaded[(variant, seed)] = load_run(out_dir)
            else:
                skipped.append(out_dir)
        if loaded:
            variants = list(dict.fromkeys(v for (s, v, _) in runs if s == setting))  # canonical specs
            results[setting or 'sweep'] = (loaded, summarize(loaded, variants))
    if not results and study.figures != 'pretrained_figures':  # (whose frozen curve needs no run)
        raise UserError(f"no finished run to report yet ({len(runs)} planned)")
    tests = Tests()
    lines = [f"# {name}: {study.question}", '', f"{len(runs) - len(skipped)} of {len(runs)} runs finished. "
             + STATISTICS, '']
    for setting, (loaded, summary) in results.items():
        first = next(iter(summary.values()))
        lines += [f"## {setting}: {millions(first['non_embedding_params'])} non-embedding parameters "
                  f"({millions(first['params'])} with the token embeddings), {first['tokens'] / 1e6:.2f}M tokens per run",
                  '', table(setting, summary, tests, name), '']
        setting_figures(setting, loaded, summary, out)
    lines += globals()[study.figures](results, out, tests, name)
    tests.finish()
    sizes = {}
    for t in tests.tests:
        sizes[t['family']] = t['family_size']
    lines += ['### Holm families', '', *(f"- {family}: {m} test(s)" if m else f"- {family}: no test yet (one seed)"
                                        for family, m in sizes.items()), '']
    text = tests.fill('\n'.join(lines))
    with atomic_write(os.path.join(out, 'report.md')) as f:
        f.write(text + '\n')
    with atomic_write(os.path.join(out, 'report.json')) as f:
        json.dump(dict(settings={setting: summary for setting, (_, summary) in results.items()}, tests=tests.tests),
                  f, indent=1)
    print(text + f"\n-> {out}/report.md")
    return results


# ------------------------------------------------------------------------------------------------ command line

DEFAULTS = dict(
    study='claims',                # a STUDIES key; ignored when variants is given (an ad hoc sweep)
    gpu=False,                     # the study's one-GPU parts (OpenWebText) instead of its CPU parts
    variants='',                   # ad hoc: comma-separated variant specs, trained from base into out_root
    base=CPU,                      # ad hoc: the train.py config every run starts from
    seeds=0,                       # seeds 0 .. seeds-1; 0: the study's own (3 for an ad hoc sweep)
    out_root='sweeps',             # runs in OUT_ROOT/<setting>/<variant>-s<seed>, reports in OUT_ROOT/<study>
    parallel=1,                    # runs at a time; each gets cpu_count / parallel threads
    report_only=False,             # train nothing; report the finished runs
    plan=False,                    # train nothing; print the runs' tokens and estimated GPU hours
)


def main(argv):
    sweep_args, train_args = (argv[:argv.index('--')], argv[argv.index('--') + 1:]) if '--' in argv else (argv, [])
    cfg = parse_config(DEFAULTS, sweep_args)
    if cfg['parallel'] < 1 or cfg['seeds'] < 0:
        raise UserError("parallel must be at least 1 and seeds at least 0")
    if cfg['variants']:  # ad hoc: one part, trained from base into out_root (with --gpu: the GPT-2 124M setting)
        if cfg['gpu'] and cfg['base'] != CPU:
            raise UserError("--gpu=True trains the variants in the openwebtext/gpt2_124m setting: drop --base, or "
                            "drop --gpu to train them from --base")
        name, out = 'sweep', cfg['out_root']
        variants = tuple(v for v in cfg['variants'].split(',') if v)
        setting = 'openwebtext/gpt2_124m' if cfg['gpu'] else None
        study = Study(f"{', '.join(variants)} from {setting or cfg['base']}",
                      (Part(setting, variants, cfg['seeds'] or 3),), (), 'claims_figures')
        parts = study.parts
    else:
        if cfg['study'] not in STUDIES:
            raise UserError(f"unknown study {cfg['study']!r} (choose from {', '.join(STUDIES)})")
        name = cfg['study'] + ('-gpu' if cfg['gpu'] else '')
        study, out = STUDIES[cfg['study']], os.path.join(cfg['out_root'], name)
        parts = [p._replace(seeds=cfg['seeds'] or p.seeds) for p in (study.gpu_parts if cfg['gpu'] else study.parts)]
        if not parts:
            raise UserError(f"study {cfg['study']!r} has no {'GPU' if cfg['gpu'] else 'CPU'} runs; drop --gpu=True")
    runs = plan_runs(parts, cfg['out_root'], cfg['base'], train_args, need_data=not cfg['plan'])
    if cfg['plan']:
        return print_plan(runs)
    if not cfg['report_only']:
        if study.figures == 'pretrained_figures':  # the frozen model's fixed-γ curve: evaluations, before any run
            for setting in frozen_settings(parts):
                frozen_gamma_losses(setting, cfg['out_root'], train_args=train_args)
        train_all(runs, cfg['parallel'])
    report(name, study, runs, out)


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
