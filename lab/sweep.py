"""
Operator variants × seeds trained with identical data, budget and hyperparameters, compared paired by seed.

    python -m lab.sweep                                    # the default study, 'claims': the paper's four claims
    python -m lab.sweep --study=fixed_gamma                # any study in STUDIES: its runs, report and figures
    python -m lab.sweep --study=scales --gpu=True          # the same study at GPT-2 scale on OpenWebText, one GPU
    python -m lab.sweep --study=scales --report_only=True  # report the runs finished so far, train nothing
    python -m lab.sweep --study=scales --gpu=True --plan=True   # tokens and estimated GPU hours, train nothing
    python -m lab.sweep --study=claims --gpu=True --plan=True   # ... and the seeds each pre-registered test needs
    python -m lab.sweep --variants=attention,fixed_gamma=-0.3 --seeds=2 --out_root=sweeps/quick -- --max_iters=200
    python -m lab.sweep --variants=attention,corridor --gpu=True --plan=True   # ad hoc variants at GPT-2 124M

A study trains every (setting, variant, seed) of its parts (the table: lab/studies.py). A setting is a corpus, a
model size and a token budget (SETTINGS); a variant is what a run changes in the operator (VARIANTS; `name=value` for a variant that
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
than X', X the CI's bound farthest from zero (lab/stats.py, through scipy.stats). A GPU study's --plan sizes its
seeds: each pre-registered test's seeds for 80 % power at the CPU's effect and paired SD (lab/studies.py's GPU_POWER),
and a pilot that measures the SD, then the seeds it implies, with the H100 hours of each.
"""

import contextlib
import gc
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import torch
from tqdm import tqdm

from common import PEAK_FLOPS, REPO, UserError, atomic_write, flops_per_token, main_guard, model_config, parse_config, \
    resolve_dtype
from model import GPT
from sources import Data, check_tokenizer, read_run_config
from train import DEFAULTS as TRAIN_DEFAULTS  # train.py's config keys and defaults: every run a study plans is checked against them

from lab import launch, pretrained
from lab.reports import family, report
from lab.stats import sd_upper_bound, seeds_for_power, t_test_power
from lab.study_figures import FIGURES, claims_figures, pretrained_figures
from lab.studies import (CPU, FROZEN_SEED, GPU_POWER, PILOT_SEEDS, PRETRAINED_GAMMAS, Part, SETTINGS, STUDIES, Study,
                         frozen_gamma_path, frozen_settings, millions, non_embedding_params, parse_variant, run_state,
                         setting_config)

# ------------------------------------------------------------------------------------------------ running

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # train.py saves a checkpoint and exits 128 + the signal's number


def plan_runs(parts, out_root, base, train_args, need_data=True):
    """{(setting, variant, seed): (out_dir, train.py arguments for a fresh run)}, every run's config checked."""
    for part in parts:  # every variant name is checked before any setting looks for its data
        for spec in part.variants:
            parse_variant(spec)
    runs = {}
    for part in parts:
        config_file, keys = SETTINGS[part.setting] if part.setting else (base, {})
        if part.setting:  # the settings' base configs sit in this repository, wherever the command runs from
            config_file = os.path.join(REPO, config_file)
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
                if os.path.isfile(os.path.join(out_dir, 'config.json')):  # a run there already: its numbers and
                    trained = read_run_config(out_dir)['dtype']              # these would mix two precisions
                    if trained != config['dtype']:
                        raise UserError(f"{out_dir} trained with dtype={trained!r}, and this study now asks for "
                                        f"{config['dtype']!r}: a study's dtype is part of its setting, so give "
                                        f"another --out_root (or pass -- --dtype={trained!r})")
                meta = os.path.join(config['data_root'], config['dataset'], 'meta.json')
                if need_data and not os.path.isfile(meta):
                    raise UserError(f"setting {part.setting or base} needs {meta}: run `python prepare.py "
                                    f"{config['dataset']}` first (see prepare.py for offline copies)")
                runs[(part.setting, variant, seed)] = (out_dir, args)
    return runs


# the budget estimate's assumptions: H100 SXM dense bf16 peak, and the MFU nanoGPT-style training typically
# reaches there with torch.compile (an assumption, not a measurement of this repo)
PLAN_PEAK, PLAN_MFU = PEAK_FLOPS['H100']['bfloat16'], 0.40
# ... and a floor per micro-step: a small model is bound by kernel launches and the host, not by FLOPs (a forward,
# backward and AdamW step is some hundreds of kernels of ~10 µs each, compiled or not); 5 ms is an estimate too
PLAN_MICRO_STEP_FLOOR = 0.005


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
            flops, params, non_embedding = flops_per_token(model, config['block_size'], config['train_only'] == 'all'), model.get_num_params(), \
                non_embedding_params(config)
        else:  # a pretrained transformers model: counted from its config; frozen weights need no weight gradients
            params, non_embedding = pretrained.parameter_count(config['init_from'])
            flops = (4 if config['train_only'] == 'operator' else 6) * params  # no weight gradients when frozen
            prepared = os.path.isfile(os.path.join(config['data_root'], config['dataset'], 'meta.json'))
            vocab = vocab if prepared else 'its own'  # (not GPT-2's: dataset_vocab's guess for a BPE dataset)
        floor = config['max_iters'] * config['gradient_accumulation_steps'] * PLAN_MICRO_STEP_FLOOR / 3600
        hours = max(tokens * flops / (PLAN_MFU * PLAN_PEAK) / 3600, floor)
        row = rows.setdefault(setting, dict(non_embedding=non_embedding, vocab=vocab, params=params if vocab else None,
                                            tokens=tokens, hours=hours, runs=0, todo=0, floor=hours == floor))
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
    floored = [setting for setting, r in rows.items() if r['floor']]
    if floored:
        print(f"\nat the step-latency floor, not FLOPs: {', '.join(floored)}")
    print(f"\ntotal to train: {total:.3g} H100 hours, estimated: at {PLAN_MFU:.0%} MFU of {PLAN_PEAK / 1e12:.0f} "
          f"TFLOP/s bf16, and at least {PLAN_MICRO_STEP_FLOOR * 1000:.0f} ms a micro-step (a small model waits on its "
          f"kernel launches, not its FLOPs)")
    return {setting: r['hours'] for setting, r in rows.items()}


# beyond this many seeds a test is not worth a GPU study: its effect is too small for its spread to decide it
DECIDABLE_SEEDS = 100


def holm_family_size(name, parts, a, b):
    """How many tests the report puts in a − b's Holm family (lab/reports.py's family): every variant − attention and
    every registered test, on each of the parts' settings."""
    tests = set()
    for part in parts:
        names = {parse_variant(v)[0] for v in part.variants}
        tests |= {(part.setting, v, 'attention') for v in names if v != 'attention'}
        tests |= {(part.setting, t.a, t.b) for t in GPU_POWER[name] if {t.a, t.b} <= names}
    return sum(family(name, x, y) == family(name, a, b) for _, x, y in tests)


def print_power(name, parts, hours, out_root, train_args=()):
    """The seeds each registered test of a GPU study needs (GPU_POWER: the CPU's effect and paired SD, assumed the
    same in nats at 124M), and a design that measures the SD rather than assuming it: a pilot of PILOT_SEEDS seeds,
    then the seeds its SD implies, each stage's H100 hours from `hours`, print_plan's per run and setting. Once the
    pilot's report is in OUT_ROOT/<study>-gpu/report.json, the second stage is sized by each test's measured SD."""
    if name not in GPU_POWER:
        return print(f"\nno test of {name} is registered with a CPU effect to size its seeds by (lab/studies.py's "
                     f"GPU_POWER)" if name else "\nan ad hoc sweep registers no test: its seeds are not sized by power")
    k, tests = PILOT_SEEDS, []
    for part in parts:
        names = {parse_variant(v)[0] for v in part.variants}
        tests += [(part, t, 0.05 / holm_family_size(name, parts, t.a, t.b)) for t in GPU_POWER[name]
                  if {t.a, t.b} <= names]
    print("\nseeds for 80 % power, estimated. Assumed at 124M: each test's effect and paired SD are the CPU's in nats "
          "(per character there, per token here); the seeds depend on effect ÷ SD alone, so the SD's ×0.5 and ×2 "
          "columns also stand for an effect twice or half as large. Two-sided paired t-test at 5 % ÷ its Holm family's "
          "size (its family's first step: the strictest), the exact noncentral t\n\n| test | CPU effect (nats) | "
          "CPU paired SD | measured on (docs/per_seed/) | level | seeds at SD ×0.5 | ×1 | ×2 | power with the planned "
          "seeds |\n|---|---|---|---|---|---|---|---|---|")
    short, absurd = [], []
    for part, t, alpha in tests:
        n = [seeds_for_power(t.effect, m * t.sd, alpha=alpha) for m in (0.5, 1, 2)]
        power = t_test_power(abs(t.effect) / t.sd * math.sqrt(part.seeds), part.seeds - 1, alpha) if part.seeds > 1 else 0
        print(f"| {part.setting}: {t.a} − {t.b} | {t.effect:+.4f} | {t.sd:.4f} | {t.source}, {t.setting}, "
              f"{t.seeds} seeds | {alpha:.3g} | {' | '.join(map(str, n))} | {power:.0%} ({part.seeds} seeds) |")
        if n[1] > part.seeds:
            short.append(f"{t.a} − {t.b} ({n[1]} needed)")
        if n[1] > DECIDABLE_SEEDS:
            absurd.append(f"{t.a} − {t.b}")
    if short:
        print(f"\nunder 80 % power with the planned seeds ({parts[0].seeds}), at the CPU's SD: {', '.join(short)}")
    if absurd:
        print(f"over {DECIDABLE_SEEDS} seeds at the CPU's SD: the study as planned ({parts[0].seeds} seeds) cannot decide "
              f"{', '.join(absurd)}")

    # stage 2 sizes at the SD's upper 80 % bound: a pilot of a few seeds measures the SD so loosely that seeds sized at
    # its point estimate fall short of 80 % power about half the time
    report = os.path.join(out_root, f'{name}-gpu', 'report.json')
    measured = {}  # label: (sd, pairs) of the pilot's tests
    if os.path.isfile(report):
        with open(report) as f:
            measured = {t['label']: (t['sd'], t['n']) for t in json.load(f)['tests'] if t.get('n', 0) > 1}
    where = '' if out_root == DEFAULTS['out_root'] else f" --out_root={shlex.quote(out_root)}"
    extra = f" -- {shlex.join(train_args)}" if train_args else ''
    stage1 = sum(k * len(p.variants) * hours[p.setting] for p in parts)
    print(f"\ntwo stages, H100 hours estimated as above:\n1. pilot: python -m lab.sweep --study={name} --gpu=True "
          f"--seeds={k}{where}{extra}: {sum(k * len(p.variants) for p in parts)} runs, {stage1:.3g} h; its "
          f"{report} gives each test's paired SD s\n2. each test to the seeds N of 80 % power at s's upper 80 % "
          f"confidence bound, s·√((n − 1) / χ²₀.₂(n − 1)) for n pilot pairs ({sd_upper_bound(1.0, k):.2f}·s at n = {k}: "
          f"80 % power then in at least 4 pilots of 5; at s itself in about half), the pilot's seeds among them: each "
          f"row's command trains its two variants to N. s: " + (f"measured, from {report}" if measured else
                                                                "the CPU's SD until that report exists")
          + "\n\n| test | s | N | N at s itself | runs beyond the pilot | H100 hours | command |\n"
            "|---|---|---|---|---|---|---|")
    seeds = {}  # (setting, variant): the most seeds a decidable test asks of it
    for part, t, alpha in tests:
        label = f"{part.setting}: {t.a} − {t.b}"
        sd, pairs = measured.get(label, (t.sd, k))
        n = seeds_for_power(t.effect, sd_upper_bound(sd, pairs), alpha=alpha)
        runs = 2 * max(0, n - k)
        cost = f"{runs} | {runs * hours[part.setting]:.3g} | python -m lab.sweep --variants={t.a},{t.b} --gpu=True " \
            f"--seeds={n}{where}{extra}" if n <= DECIDABLE_SEEDS else \
            f"– | – (over {DECIDABLE_SEEDS} seeds: not a test a GPU study can afford to decide) | –"
        missing = ' (the CPU\'s: not in the report)' if measured and label not in measured else ''
        print(f"| {label} | {sd:.4f}{missing} | {n} | {seeds_for_power(t.effect, sd, alpha=alpha)} | {cost} |")
        if n <= DECIDABLE_SEEDS:
            for variant in (t.a, t.b):
                seeds[(part.setting, variant)] = max(n, seeds.get((part.setting, variant), 0))
    runs = {key: max(0, n - k) for key, n in seeds.items()}
    stage2 = sum(r * hours[setting] for (setting, _), r in runs.items())
    print(f"| every test up to {DECIDABLE_SEEDS} seeds (a variant shared by tests trained once) | | | | "
          f"{sum(runs.values())} | {stage2:.3g} | |\n\npilot and stage 2: {stage1 + stage2:.3g} H100 hours, estimated")


def train_all(runs, parallel, gpus_per_run=1):
    """Train every run that is not finished, `parallel` at a time; interrupted ones resume. On a machine with GPUs
    each run gets gpus_per_run of its own (CUDA_VISIBLE_DEVICES, under torchrun when more than one), so at most
    visible GPUs // gpus_per_run run at once and the others wait.

    Stopping: Ctrl-C or SIGTERM to the sweep starts nothing more and passes one SIGTERM to every running run (each
    in its own session, so that no run gets a signal twice and aborts before saving); each saves a checkpoint and
    stops, a second signal aborts them, and the sweep exits 128 + the signal's number, as train.py does. A run
    stopped by a signal of its own (`kill PID`) starts nothing more either; the other runs finish. The same
    command resumes the sweep."""
    states = {key: run_state(out_dir) for key, (out_dir, _) in runs.items()}
    todo = [key for key in runs if states[key] != 'done']
    print(f"{len(runs)} runs: {len(runs) - len(todo)} finished, {len(todo)} to train")
    gpus = launch.visible_gpus()
    free = launch.gpu_slots(gpus, gpus_per_run) if gpus else [None] * parallel  # None: a CPU-only machine
    free = free[:parallel]
    if gpus:
        print(f"GPUs {','.join(gpus)}: {len(free)} run(s) at a time on {', '.join(','.join(s) for s in free)}")
    threads = max(1, (os.cpu_count() or 1) // (len(free) * (gpus_per_run if gpus else 1)))
    running, failed, signalled = [], [], set()
    stopped_by, pass_on = None, False  # the signal that stopped the sweep; whether the runs are to get a SIGTERM

    def on_signal(signum, frame):  # records the request; the loop below passes it on
        nonlocal stopped_by, pass_on
        todo.clear()
        if pass_on:  # the second signal: abort the runs and the sweep now
            for process, *_ in running:
                process.send_signal(signal.SIGTERM)
            tqdm.write("aborted")
            sys.exit(128 + signum)
        stopped_by, pass_on = signum, True
        tqdm.write("stopping: the running runs save a checkpoint and stop (again to abort now)")

    previous = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        with tqdm(total=len(todo), desc='sweep', unit='run') as bar:
            while todo or running:
                while todo and free:
                    key, slot = todo.pop(0), free.pop(0)
                    out_dir, args = runs[key]
                    os.makedirs(out_dir, exist_ok=True)
                    log = open(os.path.join(out_dir, 'train.log'), 'a')
                    command, env = launch.local_process(launch.run_args(out_dir, args, states[key]), slot, threads,
                                                        gpus_per_run)
                    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True)  # signals reach it through the sweep only
                    running.append((process, log, out_dir, slot))
                if pass_on:  # here, not in the handler: a run started just as the signal came gets it too
                    for process, *_ in running:
                        if process.pid not in signalled:
                            signalled.add(process.pid)
                            process.send_signal(signal.SIGTERM)
                time.sleep(0.5)
                for entry in [r for r in running if r[0].poll() is not None]:
                    process, log, out_dir, slot = entry
                    log.close()
                    running.remove(entry)
                    free.append(slot)  # its GPUs go to the next run in the queue
                    code = process.returncode
                    signum = code - 128 if code > 128 else -code  # train.py's exit, or killed before its handler
                    # a run the sweep stopped is not a failure, whatever it exits (torchrun: 1 once its workers stop)
                    if code != 0 and (process.pid in signalled or signum in STOP_SIGNALS):
                        if stopped_by is None:
                            todo.clear()
                            stopped_by = signum  # a signal to this run alone: the others finish
                            tqdm.write(f"stopped: {out_dir} (signal {signum}); no new run starts")
                        continue  # not trained yet: the bar counts finished and failed runs
                    if code != 0:
                        failed.append(out_dir)
                        tqdm.write(f"failed: {out_dir} (see {out_dir}/train.log)")
                    bar.update(1)
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, previous[signum])
    failures = f"{len(failed)} run(s) failed, e.g. {failed[0]}/train.log; " if failed else ""
    if stopped_by is not None:
        print(f"{failures}stopped; the same command resumes the sweep", file=sys.stderr)
        sys.exit(128 + stopped_by)
    if failed:
        raise UserError(f"{failures}rerun to retry them")


def frozen_gamma_losses(setting, out_root, gammas=PRETRAINED_GAMMAS, seed=FROZEN_SEED, train_args=()):
    """{γ: [val loss per evaluation batch]} of the setting's frozen pretrained model with every head at fixed γ,
    δ = 1, on the val batches train.py's evaluation draws for `seed`, evaluated as a run evaluates (its device and
    dtype, autocast, compiled if it compiles: γ = 0 is the runs' iteration-0 loss); kept in
    OUT_ROOT/<setting>/frozen_gamma.json after each γ, so that a rerun continues (and recomputes all if the
    setting's data or batches changed). Its memory is released before any run starts (the runs are processes of
    their own, which need the GPU's memory)."""
    cfg = SimpleNamespace(**setting_config(setting, f'--seed={seed}', *train_args))
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
        data = Data(cfg.data_root, cfg.dataset, cfg.block_size, cfg.batch_size, cfg.device)
        model, _ = pretrained.load_pretrained(cfg.init_from, operator='corridor', learn_gamma=False, learn_delta=False)
        check_tokenizer(model, data.meta, data.dir)
        dtype = resolve_dtype(cfg.dtype, cfg.device, model.config.n_embd)  # as train.py: its autocast, compiled model
        autocast = contextlib.nullcontext() if dtype == 'float32' else \
            torch.autocast(cfg.device.split(':')[0], getattr(torch, dtype))
        model = model.to(cfg.device).eval()
        evaluate = torch.compile(model) if cfg.compile else model
        offsets = data.offsets('val', cfg.eval_iters, torch.Generator().manual_seed(cfg.seed + 1000 + 1))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        for gamma in todo:
            for attn in pretrained.attention_modules(model.lm):
                attn.coefficients.gamma.fill_(gamma)
            start, losses = time.time(), []
            with torch.no_grad(), autocast:
                for k in tqdm(range(cfg.eval_iters), desc=f'frozen model, γ = {gamma:+g}', unit='batch'):
                    x, y = data.batch('val', offsets[k])
                    losses.append(evaluate(x, y)[1].float().item())
            saved['losses'][f'{gamma:+g}'], saved['seconds'][f'{gamma:+g}'] = losses, time.time() - start
            with atomic_write(path) as f:
                json.dump(saved, f, indent=1)
        del model, evaluate
        torch._dynamo.reset()  # compiled graphs hold on to the model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {g: saved['losses'][f'{g:+g}'] for g in gammas}, {g: saved['seconds'][f'{g:+g}'] for g in gammas}


# ------------------------------------------------------------------------------------------------ command line

# --help: the docstring, then the studies from STUDIES, the table an unknown --study is checked against, then the keys
__doc__ += "\nStudies, --study=NAME (the table: lab/studies.py's STUDIES; [GPU too]: it has --gpu=True parts):\n" + \
    '\n'.join(textwrap.fill(study.question + (' [GPU too]' if study.gpu_parts else ''), 118,
                             initial_indent=f'  {name:<24} ', subsequent_indent=' ' * 27) for name, study in STUDIES.items())

DEFAULTS = dict(
    study='claims',                # one of the studies listed above (STUDIES); ignored when variants is given (ad hoc)
    gpu=False,                     # the study's one-GPU parts (OpenWebText) instead of its CPU parts
    variants='',                   # ad hoc: comma-separated variant specs, trained from base into out_root
    base=CPU,                      # ad hoc: the train.py config every run starts from
    seeds=0,                       # seeds 0 .. seeds-1; 0: the study's own (3 for an ad hoc sweep)
    out_root='sweeps',             # runs in OUT_ROOT/<setting>/<variant>-s<seed>, reports in OUT_ROOT/<study>
    parallel=1,                    # runs at a time; each gets cpu_count / parallel threads
    report_only=False,             # train nothing; report the finished runs
    frozen_only=False,             # the pretrained study: evaluate the frozen model's fixed-γ curve here, train nothing
                                   # (--launcher=slurm leaves the curve to this: run it once on a GPU node)
    plan=False,                    # train nothing; print the runs' tokens and estimated GPU hours (with --gpu: the
                                   # seeds each registered test needs, and a pilot-then-the-rest design)
    launcher='local',              # local: train here (each run on GPUs of its own when there are any); slurm:
                                   # one SLURM job per run through submitit, and return; commands: print one
                                   # train.py command per unfinished run (for any other scheduler), train nothing
    gpus_per_run=1,                # GPUs per run (local and slurm); above 1 a run is DDP under torchrun
    slurm_partition='',            # slurm: sbatch --partition ('' : the cluster's default)
    slurm_time=24 * 60,            # slurm: each job's time limit in minutes; a longer run is requeued and resumes
    slurm_account='',              # slurm: sbatch --account ('' : none)
    slurm_extra='',                # slurm: more sbatch flags, '--qos=high --constraint=h100'
)


def main(argv):
    sweep_args, train_args = (argv[:argv.index('--')], argv[argv.index('--') + 1:]) if '--' in argv else (argv, [])
    cfg = parse_config(DEFAULTS, sweep_args)
    if cfg['parallel'] < 1 or cfg['seeds'] < 0 or cfg['gpus_per_run'] < 1:
        raise UserError("parallel and gpus_per_run must be at least 1 and seeds at least 0")
    if cfg['launcher'] not in ('local', 'slurm', 'commands'):
        raise UserError(f"launcher must be 'local', 'slurm' or 'commands', got {cfg['launcher']!r}")
    if cfg['variants']:  # ad hoc: one part, trained from base into out_root (with --gpu: the GPT-2 124M setting)
        if cfg['gpu'] and cfg['base'] != CPU:
            raise UserError("--gpu=True trains the variants in the openwebtext/gpt2_124m setting: drop --base, or "
                            "drop --gpu to train them from --base")
        name, out = 'sweep', cfg['out_root']
        variants = tuple(v for v in cfg['variants'].split(',') if v)
        setting = 'openwebtext/gpt2_124m' if cfg['gpu'] else None
        study = Study(f"{', '.join(variants)} from {setting or cfg['base']}",
                      (Part(setting, variants, cfg['seeds'] or 3),), ())
        parts, figures = study.parts, claims_figures
    else:
        if cfg['study'] not in STUDIES:
            raise UserError(f"unknown study {cfg['study']!r} (choose from {', '.join(STUDIES)})")
        name = cfg['study'] + ('-gpu' if cfg['gpu'] else '')
        study, out, figures = STUDIES[cfg['study']], os.path.join(cfg['out_root'], name), FIGURES[cfg['study']]
        parts = [p._replace(seeds=cfg['seeds'] or p.seeds) for p in (study.gpu_parts if cfg['gpu'] else study.parts)]
        if not parts:
            raise UserError(f"study {cfg['study']!r} has no {'GPU' if cfg['gpu'] else 'CPU'} runs; drop --gpu=True")
    runs = plan_runs(parts, cfg['out_root'], cfg['base'], train_args, need_data=not cfg['plan'])
    if cfg['plan']:
        hours = print_plan(runs)
        if cfg['gpu']:
            print_power(None if cfg['variants'] else cfg['study'], parts, hours, cfg['out_root'], train_args)
        return
    if not cfg['report_only']:
        if figures is pretrained_figures:  # the frozen model's fixed-γ curve: evaluations, before any run
            if cfg['launcher'] == 'local' or cfg['frozen_only']:  # on the runs' device, as they evaluate
                for setting in frozen_settings(parts):
                    frozen_gamma_losses(setting, cfg['out_root'], train_args=train_args)
            else:  # not on a login node's CPU, for hours
                command = shlex.join([*sweep_args, '--frozen_only=True', *(['--', *train_args] if train_args else [])])
                print(f"the report's frozen fixed-γ curve is an evaluation on the runs' device: compute it on one, "
                      f"e.g. in a job: python -m lab.sweep {command}", file=sys.stderr)
        if cfg['frozen_only']:
            return
        if cfg['launcher'] == 'commands':  # stdout: the commands alone
            return launch.print_commands(runs, cfg['gpus_per_run'])
        if cfg['launcher'] == 'slurm':
            folder = os.path.join(cfg['out_root'], 'slurm_logs')
            if not launch.submit(runs, cfg['out_root'], launch.slurm_executor(cfg, folder), cfg['gpus_per_run']):
                return  # jobs submitted or still queued: the report comes once every run is done
        else:
            train_all(runs, cfg['parallel'], cfg['gpus_per_run'])
    report(name, study, runs, out, figures, without_runs=figures is pretrained_figures)


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
