"""
Operator variants × seeds trained with identical data, budget and hyperparameters, compared paired by seed.

    python sweep.py                                    # the default study, 'claims': the paper's four claims
    python sweep.py --study=fixed_gamma                # any study in STUDIES: its runs, report and figures
    python sweep.py --study=scales --gpu=True          # the same study at GPT-2 scale on OpenWebText, one GPU
    python sweep.py --study=scales --report_only=True  # report the runs finished so far, train nothing
    python sweep.py --study=scales --gpu=True --plan=True   # tokens and estimated GPU hours, train nothing
    python sweep.py --variants=attention,fixed_gamma=-0.3 --seeds=2 --out_root=sweeps/quick -- --max_iters=200

A study trains every (setting, variant, seed) of its parts. A setting is a corpus, a model size and a token
budget (SETTINGS); a variant is what a run changes in the operator (VARIANTS; `name=value` for a variant that
takes a value). Each run is `train.py BASE <setting keys> <variant keys> --seed=S --out_dir=OUT_ROOT/<setting>/
<variant>-s<S>` plus whatever follows `--`, its output in that folder's train.log. Runs are shared between studies
(the small Tiny Shakespeare runs of attention serve four of them) and never trained twice: finished runs are
skipped and interrupted ones resumed, so the same command continues a study. A changed budget needs a new setting
name. Reports go to OUT_ROOT/<study>/ (report.md, report.json, figures).

Statistics: each variant's final validation loss, and its difference to attention paired by seed (the same seed
gives every variant the same initial weights and the same batches). A difference counts as 'lower' or 'higher'
only when a two-sided paired t-test over the seeds rejects "no difference" at 5 %; otherwise it is 'inconclusive'.
"""

import ast
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import torch
from tqdm import tqdm

from common import PEAK_FLOPS, UserError, load_checkpoint, main_guard, model_config, parse_config
from model import in_corridor

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
        parts=(Part('shakespeare_char/small-long', DYNAMICS, 1),
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
        figures='claims_figures'),
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
    from train import DEFAULTS
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
        for seed in range(part.first_seed, part.first_seed + part.seeds):  # seed-major: every variant of seed 0 first, so pairs finish early
            for spec in part.variants:
                variant, variant_keys = parse_variant(spec)
                out_dir = os.path.join(folder, f"{variant}-s{seed}")
                args = [config_file, *(f'--{k}={v!r}' for k, v in {**keys, **variant_keys}.items()),
                        f'--seed={seed}', f'--out_dir={out_dir}', '--overwrite=True', *train_args]
                config = parse_config(DEFAULTS, args)  # a bad key or value fails here, before any run starts
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


def print_plan(runs):
    """Tokens, FLOPs and estimated H100 hours of the runs still to train, per setting: a GPU budget before the
    GPU is rented. FLOPs per token as train.py's MFU counts them (6N + attention); the vocabulary is GPT-2's."""
    from train import DEFAULTS
    from model import GPT
    rows, total = {}, 0.0
    for (setting, _, _), (out_dir, args) in runs.items():
        config = parse_config(DEFAULTS, args)
        with torch.device('meta'):  # the parameter count without allocating the weights
            model = GPT(model_config({**config, 'vocab_size': 50257}))
        tokens = config['max_iters'] * config['gradient_accumulation_steps'] * config['batch_size'] * config['block_size']
        hours = tokens * model.flops_per_token(config['block_size']) / (PLAN_MFU * PLAN_PEAK) / 3600
        row = rows.setdefault(setting, dict(params=model.get_num_params(), tokens=tokens, hours=hours, runs=0, todo=0))
        row['runs'] += 1
        if run_state(out_dir) != 'done':
            row['todo'] += 1
            total += hours
    print("| setting | parameters | tokens per run | H100 hours per run (est.) | runs | to train |\n"
          "|---|---|---|---|---|---|")
    for setting, r in rows.items():
        print(f"| {setting} | {r['params'] / 1e6:.1f}M | {r['tokens'] / 1e9:.2f}B | {r['hours']:.2f} | {r['runs']} | {r['todo']} |")
    print(f"\ntotal to train: {total:.1f} H100 hours (at {PLAN_MFU:.0%} MFU of {PLAN_PEAK / 1e12:.0f} TFLOP/s bf16)")


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

# Student's t at 97.5 % for 1 … 30 degrees of freedom (the two-sided 5 % test below); beyond 30, 30's
T_CRITICAL = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
              2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def paired_verdict(differences):
    """(mean, std, verdict) of paired differences (one per seed): 'lower' / 'higher' when a two-sided paired
    t-test rejects "no difference" at 5 %, |mean| > t(n−1) · std / √n; otherwise 'inconclusive' (the difference is
    inside the seed spread). With 3 seeds that asks for |mean| > 2.48 std, with 8 for |mean| > 0.84 std."""
    n = len(differences)
    if n == 0:
        return float('nan'), float('nan'), 'not measured'
    mean = statistics.fmean(differences)
    if n < 2:
        return mean, float('nan'), 'inconclusive'
    std = statistics.stdev(differences)
    t = T_CRITICAL[min(n - 2, len(T_CRITICAL) - 1)]  # beyond 30 degrees of freedom: 30's (slightly strict)
    if abs(mean) > t * std / math.sqrt(n):
        return mean, std, 'lower' if mean < 0 else 'higher'
    return mean, std, 'inconclusive'


def summarize(loaded, variants):
    """Per variant of one setting: final val losses by seed, their mean/std, the paired difference to attention,
    corridor occupancy (all heads, by layer, layers after the first) and mean γ, δ."""
    from analyze import occupancy_report
    final = {(v, s): run['log'][-1]['val_loss'] for (v, s), run in loaded.items()}
    summary = {}
    for variant in variants:
        seeds = sorted(s for v, s in loaded if v == variant)
        if not seeds:
            continue
        values = [final[(variant, s)] for s in seeds]
        occupancy = [occupancy_report(loaded[(variant, s)]['gamma'], loaded[(variant, s)]['delta']) for s in seeds]
        n_layer = len(occupancy[0]['layers'])
        entry = dict(seeds=seeds, val_loss=values, mean=statistics.fmean(values),
                     std=statistics.stdev(values) if len(values) > 1 else float('nan'),
                     occupancy=statistics.fmean(o['occupancy'] for o in occupancy),
                     occupancy_by_layer=[statistics.fmean(o['layers'][i]['occupancy'] for o in occupancy)
                                         for i in range(n_layer)],
                     occupancy_beyond_first=statistics.fmean(o['occupancy_beyond_first'] or 0 for o in occupancy),
                     gamma_mean=statistics.fmean(loaded[(variant, s)]['gamma'].mean().item() for s in seeds),
                     delta_mean=statistics.fmean(loaded[(variant, s)]['delta'].mean().item() for s in seeds),
                     params=loaded[(variant, seeds[0])]['params'], tokens=loaded[(variant, seeds[0])]['log'][-1]['tokens'],
                     operator_scalars=loaded[(variant, seeds[0])]['config']['operator'] != 'attention')
        if variant != 'attention':
            paired = [s for s in seeds if ('attention', s) in final]
            entry['vs_attention'] = paired_verdict([final[(variant, s)] - final[('attention', s)] for s in paired])
        summary[variant] = entry
    return summary


def paired(loaded, a, b):
    """(mean, std, verdict) of val(a) − val(b) over the seeds both finished."""
    seeds = [s for v, s in loaded if v == a and (b, s) in loaded]
    return paired_verdict([loaded[(a, s)]['log'][-1]['val_loss'] - loaded[(b, s)]['log'][-1]['val_loss']
                           for s in seeds])


def table(summary):
    """The markdown table of one setting's variants."""
    n_layer = max(len(e['occupancy_by_layer']) for e in summary.values())
    rows = ["| variant | seeds | val loss mean ± std | − attention, paired | verdict | mean γ, δ | in corridor | " +
            ' | '.join(f'L{i}' for i in range(n_layer)) + ' |', '|---|---|---|---|---|---|---|' + '---|' * n_layer]
    for variant, e in summary.items():
        diff = e.get('vs_attention')
        cells = [variant, str(len(e['seeds'])), f"{e['mean']:.4f} ± {e['std']:.4f}",
                 f"{diff[0]:+.4f} ± {diff[1]:.4f}" if diff else '–', diff[2] if diff else '–']
        if e['operator_scalars']:
            cells += [f"{e['gamma_mean']:+.3f}, {e['delta_mean']:.3f}", f"{e['occupancy']:.0%}",
                      *(f'{x:.0%}' for x in e['occupancy_by_layer'])]
        else:
            cells += ['0, 1'] + ['–'] * (n_layer + 1)
        rows.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(rows)


def fmt(result):
    mean, std, verdict = result
    return f"{mean:+.4f} ± {std:.4f} → **{verdict}**" if verdict != 'not measured' else 'not measured'


# ------------------------------------------------------------------------------------------------ figures

def plot_sweep_losses(loaded, variants, path, title):
    """Validation loss of every variant (mean over seeds) and, beside it, its difference to attention paired by
    seed (mean ± std): the differences are far smaller than the curves' own fall."""
    from analyze import plt, save
    seeds = sorted({s for v, s in loaded if v == 'attention'})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for i, v in enumerate(variants):
        common = [s for s in seeds if (v, s) in loaded]
        if not common:
            continue
        curves = torch.tensor([[e['val_loss'] for e in loaded[(v, s)]['log']] for s in common])
        tokens = [e['tokens'] / 1e6 for e in loaded[(v, common[0])]['log']]
        skip = 1 if len(tokens) > 2 else 0  # the first evaluation (ln vocab) would flatten the rest of the curves
        axes[0].plot(tokens[skip:], curves.mean(0)[skip:].tolist(), marker='.', color=f'C{i % 10}', label=v)
        if v != 'attention':
            diff = curves - torch.tensor([[e['val_loss'] for e in loaded[('attention', s)]['log']] for s in common])
            spread = diff.std(0) if len(common) > 1 else torch.zeros(len(tokens))
            axes[1].errorbar(tokens[skip:], diff.mean(0)[skip:].tolist(), yerr=spread[skip:].tolist(), marker='.',
                             capsize=2, color=f'C{i % 10}', label=v)
    axes[0].set_title(f'{title}: validation loss, mean over seeds', fontsize=10)
    axes[0].set_ylabel('loss (nats per token)')
    axes[1].axhline(0, color='black', lw=0.8)
    axes[1].set_title('difference to attention, paired by seed (mean ± std)', fontsize=10)
    axes[1].set_ylabel('Δ loss (nats per token)')
    for ax in axes:
        ax.set_xlabel('tokens seen (millions)')
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    return save(fig, path)


def setting_figures(setting, loaded, summary, out):
    """Every setting's own figures: losses, occupancy by layer, γ of every head of the corridor (seed 0)."""
    from analyze import plot_evolution, plot_gamma_delta, plot_occupancy
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


def claims_figures(results, out):
    """The paper's four claims, per setting."""
    lines = []
    for setting, (loaded, summary) in results.items():
        corridor = summary.get('corridor')
        lines += [f"### Claims on {setting}", '',
                  f"- a: learnable δ(γI+P) lowers val loss vs attention: {fmt(paired(loaded, 'corridor', 'attention'))}",
                  "- b: heads beyond the first layer in −1 < γ < 0: " +
                  (f"{corridor['occupancy_beyond_first']:.0%} (mean γ {corridor['gamma_mean']:+.3f})" if corridor else 'not measured'),
                  f"- c: γ ≥ 0 raises val loss vs learnable γ: {fmt(paired(loaded, 'gamma_nonneg', 'corridor'))}",
                  f"- d: fixed γ = −0.5, δ = 1 beats attention: {fmt(paired(loaded, 'fixed_gamma', 'attention'))}",
                  f"- the forms alike: α0·I + α1·P − corridor {fmt(paired(loaded, 'alpha', 'corridor'))}; "
                  f"αP + β(I − P) − corridor {fmt(paired(loaded, 'alpha_beta', 'corridor'))}", '']
    return lines


def fixed_gamma_figures(results, out):
    """Δ val loss against the fixed γ, one panel per setting, the learnable corridor's mean γ marked."""
    from analyze import plt, save
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
    lines = ["### Fixed γ (δ = 1) against attention, paired by seed", '',
             "| setting | " + ' | '.join(f'γ = {g}' for g in FIXED_GAMMAS) + ' | learnable corridor |',
             '|---|' + '---|' * (len(FIXED_GAMMAS) + 1)]
    for ax, (setting, (loaded, summary)) in zip(axes[0], results.items()):
        names = {g: parse_variant(f'fixed_gamma={g}')[0] for g in FIXED_GAMMAS}
        points = [(g, summary[names[g]]['vs_attention']) for g in FIXED_GAMMAS if names[g] in summary]
        ax.axhline(0, color='black', lw=0.8)
        ax.axvspan(-1, 0, color='tab:green', alpha=0.08)
        if points:
            ax.errorbar([g for g, _ in points], [d[0] for _, d in points], yerr=[d[1] for _, d in points], marker='o',
                        capsize=3, label='fixed γ, δ = 1 (mean ± std over seeds)')
        corridor = summary.get('corridor')
        if corridor:
            d = corridor['vs_attention']
            ax.errorbar([corridor['gamma_mean']], [d[0]], yerr=[d[1]], marker='*', markersize=12, color='tab:red',
                        capsize=3, ls='none', label=f"learnable corridor (final mean γ {corridor['gamma_mean']:+.2f})")
        ax.set_xlabel('γ')
        ax.set_ylabel('val loss − attention (nats per token)')
        ax.set_title(setting, fontsize=10)
        ax.legend(fontsize=7)
        done = dict(points)
        cells = [f"{done[g][0]:+.4f} ± {done[g][1]:.4f} {done[g][2]}" if g in done else '–' for g in FIXED_GAMMAS]
        lines.append(f"| {setting} | " + ' | '.join(cells) +
                     (f" | {fmt(corridor['vs_attention'])} (γ̄ {corridor['gamma_mean']:+.3f})" if corridor else ' | –') + ' |')
    fig.suptitle('Claim (d): does some fixed γ inside the corridor beat attention?', fontsize=11)
    save(fig, os.path.join(out, 'fixed_gamma.png'))
    return lines + ['', '![fixed γ](fixed_gamma.png)', '']


def scales_figures(results, out):
    """Δ val loss (corridor − attention) against parameters per corpus; occupancy by layer against size."""
    from analyze import plt, save
    corpora = list(dict.fromkeys(s.split('/')[0] for s in results))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    lines = ["### The learnable corridor against attention by model size", '',
             "| setting | parameters | tokens | − attention, paired | verdict | in corridor (layers ≥ 1) | mean γ |",
             '|---|---|---|---|---|---|---|']
    for i, corpus in enumerate(corpora):
        points = []
        for setting, (loaded, summary) in results.items():
            if setting.split('/')[0] != corpus or 'corridor' not in summary:
                continue
            c = summary['corridor']
            points.append((c['params'], c['vs_attention'], c, setting))
        points.sort(key=lambda p: p[0])
        axes[0].errorbar([p[0] for p in points], [p[1][0] for p in points], yerr=[p[1][1] for p in points],
                         marker='o', capsize=3, color=f'C{i}', label=corpus)
        for n, (params, d, c, setting) in enumerate(points):
            axes[1].plot(range(len(c['occupancy_by_layer'])), c['occupancy_by_layer'], marker='o', color=f'C{i}',
                         alpha=0.4 + 0.6 * (n + 1) / len(points), label=f"{corpus}, {params / 1e6:.2f}M")
            lines.append(f"| {setting} | {params / 1e6:.2f}M | {c['tokens'] / 1e6:.2f}M | {d[0]:+.4f} ± {d[1]:.4f} | "
                         f"{d[2]} | {c['occupancy_beyond_first']:.0%} | {c['gamma_mean']:+.3f} |")
    axes[0].axhline(0, color='black', lw=0.8)
    axes[0].set_xscale('log')
    axes[0].set_xlabel('parameters (as train.py counts them)')
    axes[0].set_ylabel('corridor − attention val loss (mean ± std)')
    axes[0].set_title('Claim (a) across model sizes', fontsize=10)
    axes[0].legend(fontsize=8)
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].set_xlabel('layer')
    axes[1].set_ylabel('fraction of heads with −1 < γ < 0')
    axes[1].set_title('Corridor occupancy by layer, by size', fontsize=10)
    axes[1].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    save(fig, os.path.join(out, 'scales.png'))
    return lines + ['', '![scales](scales.png)', '']


def gamma_dynamics_figures(results, out):
    """Where γ settles: every head's γ against tokens (per variant), occupancy over time, the loss gap to
    attention over time, and a table of where γ ends, layer 0 against the later layers."""
    from analyze import plt, save
    lines = ["### Where γ settles", '',
             "| setting | variant | seed | γ̄ layer 0 | γ̄ layers ≥ 1 | γ range | in corridor, layer 0 | layers ≥ 1 | "
             "mean |Δγ| over the last quarter | val − attention |", '|---|---|---|---|---|---|---|---|---|---|']
    for setting, (loaded, summary) in results.items():
        learnable = [v for v in summary if summary[v]['operator_scalars']]
        fig, axes = plt.subplots(2, max(1, len(learnable)), figsize=(4 * max(1, len(learnable)), 6.4), squeeze=False)
        for col, v in enumerate(learnable):
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
                quarter = gamma[int(0.75 * (len(log) - 1))]
                gap = loaded[(v, s)]['log'][-1]['val_loss'] - loaded[('attention', s)]['log'][-1]['val_loss'] \
                    if ('attention', s) in loaded else float('nan')
                lines.append(f"| {setting} | {v} | {s} | {last[0].mean():+.3f} | {last[1:].mean():+.3f} | "
                             f"[{last.min():+.2f}, {last.max():+.2f}] | {in_corridor(last[0]).float().mean():.0%} | "
                             f"{in_corridor(last[1:]).float().mean():.0%} | {(last - quarter).abs().mean():.4f} | {gap:+.4f} |")
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
        lines += ['', f'![γ dynamics, {setting}]({name})', '']
    return lines


def geometry_figures(results, out):
    """The connection walk of every variant against attention's, paired by seed: per depth regime at the end of
    training (the attention part, and the full operator c_I·I + c_P·P), during training, and against γ."""
    from analyze import WALK_PANELS, plot_walk_evolution, plt, save, walk_series
    from walk import depth_regimes
    lines = ["### The connection walk against attention's", '',
             "Final evaluation, per depth regime (initial 20 % of layers, middle, final 20 %): attention's value "
             "(mean over seeds) and each variant's difference to it, paired by seed, for the attention part P of "
             "the variant and for its full operator c_I·I + c_P·P. r: correlation over evaluations and seeds "
             "between the learnable corridor's difference (full operator, all layers) and its mean γ.", '']
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
                        mean, std, verdict = paired_verdict(diffs)
                        cells.append(f"{mean:+.3g} ± {std:.2g} {verdict}")
                lines.append(f"| {name} | {regime} | " + ' | '.join(cells) + ' |')
        lines.append('')

        # the learnable corridor's difference to attention, evaluation by evaluation, against its mean γ
        fig, axes = plt.subplots(1, len(WALK_PANELS), figsize=(4 * len(WALK_PANELS), 3.4), squeeze=False)
        correlations = []
        fixed_first = next(((v, seeds[v][0]) for v in variants if v.startswith('fixed_gamma')), None)  # one legend entry
        for col, (key, name) in enumerate(WALK_PANELS):
            ax, pooled = axes[0][col], []
            for v in variants:
                for s in seeds[v]:
                    _, ours = walk_series(loaded[(v, s)]['log'], 'operator' if summary[v]['operator_scalars'] else 'attention', key)
                    _, theirs = walk_series(loaded[('attention', s)]['log'], 'attention', key)
                    gamma = torch.tensor([e['gamma'] for e in loaded[(v, s)]['log'] if 'walk' in e]).mean((1, 2))
                    if ours.shape != theirs.shape:  # evaluated at other iterations: not comparable step by step
                        continue
                    diff = (ours - theirs).mean(1)  # all layers
                    if v == 'corridor':
                        pooled += list(zip(gamma.tolist(), diff.tolist()))
                        ax.plot(gamma.tolist(), diff.tolist(), '.-', color='tab:red', lw=0.8,
                                label='learnable corridor, every evaluation' if s == seeds[v][0] else None)
                    elif v.startswith('fixed_gamma'):
                        ax.plot([gamma[-1].item()], [diff[-1].item()], 'o', color='tab:blue',
                                label='fixed γ, end of training' if (v, s) == fixed_first else None)
            if len(pooled) > 2:
                r = torch.corrcoef(torch.tensor(pooled, dtype=torch.float64).T)[0, 1].item()
                correlations.append(f"{name}: r = {r:+.2f}")
            ax.axhline(0, color='black', lw=0.6)
            ax.set_xlabel('mean γ')
            ax.set_title(f'{name}\n(full operator) − attention', fontsize=9)
        axes[0][0].legend(fontsize=7)
        name = setting.replace('/', '_')
        save(fig, os.path.join(out, f'geometry_vs_gamma_{name}.png'))
        plot_walk_evolution({v: [loaded[(v, s)]['log'] for s in seeds[v]] for v in ('attention', *variants)},
                            os.path.join(out, f'geometry_{name}.png'), setting)
        lines += [f"Does the difference track γ? {'; '.join(correlations) or 'too few evaluations'}.", '',
                  f"![geometry during training, {setting}](geometry_{name}.png)", '',
                  f"![geometry against γ, {setting}](geometry_vs_gamma_{name}.png)", '']
    return lines


# ------------------------------------------------------------------------------------------------ reports

def report(name, study, runs, out):
    """Load every finished run, write OUT/report.md, report.json and the figures; print the report."""
    from analyze import load_run
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
    if not results:
        raise UserError(f"no finished run to report yet ({len(runs)} planned)")
    lines = [f"# {name}: {study.question}", '',
             f"{len(runs) - len(skipped)} of {len(runs)} runs finished. Final validation loss (nats per token); "
             "differences to attention paired by seed (mean ± std over seeds); verdict 'lower'/'higher' only when "
             "a two-sided paired t-test over the seeds rejects no difference at 5 %, else 'inconclusive'.", '']
    for setting, (loaded, summary) in results.items():
        first = next(iter(summary.values()))
        lines += [f"## {setting}: {first['params'] / 1e6:.2f}M parameters, {first['tokens'] / 1e6:.2f}M tokens per run",
                  '', table(summary), '']
        setting_figures(setting, loaded, summary, out)
    lines += globals()[study.figures](results, out)
    text = '\n'.join(lines)
    with open(os.path.join(out, 'report.md'), 'w') as f:
        f.write(text + '\n')
    with open(os.path.join(out, 'report.json'), 'w') as f:
        json.dump({setting: summary for setting, (_, summary) in results.items()}, f, indent=1)
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
    if cfg['variants']:  # ad hoc: one part, trained from base into out_root
        name, out = 'sweep', cfg['out_root']
        variants = tuple(v for v in cfg['variants'].split(',') if v)
        study = Study(f"{', '.join(variants)} from {cfg['base']}", (Part(None, variants, cfg['seeds'] or 3),), (),
                      'claims_figures')
        parts = study.parts
    else:
        if cfg['study'] not in STUDIES:
            raise UserError(f"unknown study {cfg['study']!r} (choose from {', '.join(STUDIES)})")
        name = cfg['study'] + ('-gpu' if cfg['gpu'] else '')
        study, out = STUDIES[cfg['study']], os.path.join(cfg['out_root'], name)
        parts = [p._replace(seeds=cfg['seeds'] or p.seeds) for p in (study.gpu_parts if cfg['gpu'] else study.parts)]
    runs = plan_runs(parts, cfg['out_root'], cfg['base'], train_args, need_data=not cfg['plan'])
    if cfg['plan']:
        return print_plan(runs)
    if not cfg['report_only']:
        train_all(runs, cfg['parallel'])
    report(name, study, runs, out)


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
