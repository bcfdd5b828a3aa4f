"""
Train operator variants × seeds with identical data, token budget and hyperparameters, then compare them.

    python sweep.py                      # the paper's four claims at CPU scale: 8 variants × 3 seeds, ~1 hour
    python sweep.py --variants=attention,corridor --seeds=2 --out_root=sweeps/quick -- --max_iters=200

Each run is `train.py BASE <variant keys> --seed=S --out_dir=OUT_ROOT/<variant>-s<S>` plus whatever follows
`--`. Finished runs (a checkpoint at their own max_iters) are skipped and interrupted ones resumed, so the same
command continues a sweep; to change the budget or the base, start a new OUT_ROOT. The
report (OUT_ROOT/report.md, report.json and plots) comes from analyze.py's run comparison. A run's own output
goes to its out_dir/train.log.
"""

import os
import subprocess
import sys
import time

from tqdm import tqdm

from common import UserError, load_checkpoint, main_guard, parse_config

# What each variant changes in the base config. Same seed, same data order and same initial weights
# (the operator scalars aside) for every variant, so differences to attention pair up by seed.
VARIANTS = {
    'attention':       dict(operator='attention'),
    'corridor':        dict(operator='corridor'),                     # learnable δ(γI + P) from γ = 0, δ = 1
    'gamma_nonneg':    dict(operator='corridor', gamma_nonneg=True),  # γ ≥ 0
    'fixed_gamma':     dict(operator='corridor', gamma_init=-0.5, learn_gamma=False, learn_delta=False),
    'laplacian':       dict(operator='laplacian', laplacian_heads=1),  # the last head of every layer is I − P
    'alpha':           dict(operator='alpha'),                         # α0·I + α1·P
    'alpha_beta':      dict(operator='alpha_beta'),                    # αP + β(I − P)
    'corridor_spread': dict(operator='corridor', init_spread=0.5),     # γ0 ~ U(−0.5, 0.5) per head
}

DEFAULTS = dict(
    base='configs/_sweep_shakespeare_char.py',  # the train.py config every run starts from
    variants=','.join(VARIANTS),
    seeds=3,                                   # seeds 0 .. seeds-1
    out_root='sweeps/shakespeare-char',
    parallel=1,                                # runs at a time; each gets cores / parallel threads
)


def run_state(out_dir):
    """'done', 'partial' (a checkpoint short of max_iters) or 'new'."""
    ckpt = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.exists(ckpt):
        return 'new'
    saved = load_checkpoint(ckpt)
    return 'done' if saved['iter_num'] >= saved['config']['max_iters'] else 'partial'


def main(argv):
    sweep_args, train_args = (argv[:argv.index('--')], argv[argv.index('--') + 1:]) if '--' in argv else (argv, [])
    cfg = parse_config(DEFAULTS, sweep_args)
    variants = [v for v in cfg['variants'].split(',') if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant(s) {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    if not os.path.isfile(cfg['base']):
        raise UserError(f"base config {cfg['base']!r} not found")
    if cfg['seeds'] < 1 or cfg['parallel'] < 1:
        raise UserError("seeds and parallel must be at least 1")

    runs = {(variant, seed): os.path.join(cfg['out_root'], f"{variant}-s{seed}")
            for seed in range(cfg['seeds']) for variant in variants}
    states = {key: run_state(out_dir) for key, out_dir in runs.items()}
    todo = [(key, out_dir) for key, out_dir in runs.items() if states[key] != 'done']
    print(f"{len(runs)} runs in {cfg['out_root']}: {len(runs) - len(todo)} finished, {len(todo)} to train")
    threads = str(max(1, (os.cpu_count() or 1) // cfg['parallel']))
    running, failed = [], []
    with tqdm(total=len(todo), desc='sweep', unit='run') as bar:
        while todo or running:
            while todo and len(running) < cfg['parallel']:
                (variant, seed), out_dir = todo.pop(0)
                os.makedirs(out_dir, exist_ok=True)
                if states[(variant, seed)] == 'partial':
                    args = ['--init_from=resume', f'--out_dir={out_dir}']
                else:  # new, or a folder left by a run that died before its first checkpoint
                    args = [cfg['base'], *(f'--{k}={v!r}' for k, v in VARIANTS[variant].items()), f'--seed={seed}',
                            f'--out_dir={out_dir}', '--overwrite=True', *train_args]
                log = open(os.path.join(out_dir, 'train.log'), 'a')
                process = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), 'train.py'), *args],
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

    from analyze import compare_sweep  # only needed once the runs exist
    compare_sweep({key: out_dir for key, out_dir in runs.items()}, cfg['out_root'])


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
