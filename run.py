"""
What train.py's loop stands on, one call each: the run's data (prepared on demand) and init_from's operator, its
processes (DDP; faults in one line), its folder (a lock, config.json, log.jsonl), its checkpoint (all an exact resume
needs), its stops (Ctrl-C, SIGTERM), speed and ETA, its last line.
"""

import ast
import itertools
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from common import (UserError, WriteFailed, atomic_write, check_device, describe_os_error, device_rng_state,
                    set_device_rng_state, synchronize)
from model import OPERATOR_DEFAULTS, OPERATOR_KEYS, OPERATORS
from sources import load_checkpoint, read_log


class TrainingStopped(UserError):
    """The run can't go on (a non-finite loss, a file it can't write, a process gone); the last checkpoint stays."""


@contextmanager
def processes(cfg):
    """(ddp, rank, world, device), torchrun's DDP group joined and, at the end, left by all together. A failed write
    (the atomic writes left the old files whole) or a lost process ends the run in one line."""
    device, cuda = cfg.device, cfg.device.startswith('cuda')
    check_device(device)
    ddp, rank, world = int(os.environ.get('RANK', -1)) != -1, 0, 1  # RANK: launched by torchrun
    if ddp and device == 'mps':
        raise UserError("torchrun on device='mps': PyTorch has no process-group backend for MPS; run one process")
    if ddp:
        if cuda:  # one GPU per process, chosen before the process group binds to it
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
        backend = cfg.backend if cfg.backend != 'auto' else ('nccl' if cuda else 'gloo')
        dist.init_process_group(backend=backend, device_id=torch.device(device) if cuda else None)
        rank, world = dist.get_rank(), dist.get_world_size()
        if cfg.gradient_accumulation_steps % world:
            raise UserError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be divisible by "
                            f"the {world} DDP processes")
    try:
        yield ddp, rank, world, device
    except WriteFailed as e:
        raise TrainingStopped(f"could not write {e.path} ({e.reason}); {resume_advice(cfg, world)}") from None
    except (dist.DistError, RuntimeError) as e:  # another process gone: NCCL's DistError, or gloo's 'by peer'
        if not ddp or not isinstance(e, dist.DistError) and not any(s in str(e) for s in (
                'by peer', 'Broken pipe', 'remote worker', 'Socket Timeout', 'Connection refused')):
            raise
        # gloo's first line without its source location: 'Read error [127.0.0.1]:49824: Connection reset by peer'
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].split('] ', 1)[-1].split('. ')[0].rstrip('.')
        raise TrainingStopped(f"rank {rank} of {world} lost another process of the run ({reason}); "
                              f"{resume_advice(cfg, world)}") from None
    if ddp:  # without the barrier, rank 1 once aborted at exit (gloo's threads) while rank 0 was still saving
        dist.barrier()
        dist.destroy_process_group()


def prepare_if_missing(cfg):
    """`python prepare.py DATASET`, as a user runs it, for a small known dataset (~1 MB of text; OpenWebText's 17 GB
    never) without its meta.json: the quick start is one command."""
    folder = os.path.join(cfg.data_root, cfg.dataset)
    if cfg.dataset not in ('shakespeare_char', 'shakespeare') or os.path.isfile(os.path.join(folder, 'meta.json')):
        return
    print(f"{folder} is missing: preparing it first (python prepare.py {cfg.dataset} --data_root={cfg.data_root})")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'prepare.py')
    result = subprocess.run([sys.executable, script, cfg.dataset, f'--data_root={cfg.data_root}'],
                            stderr=subprocess.PIPE, text=True)
    if result.returncode:  # prepare.py's own one line, which names what to do (offline: its --input PATH)
        reason = (result.stderr.strip().splitlines() or ['no message'])[-1].removeprefix('error: ')
        raise UserError(f"preparing {folder} failed: {reason}")


def run_folder_operator(cfg, given):
    """The operator keys to build init_from with: the configured ones; for a run folder, its own (its weights hold
    that operator's scalars), unless a key the user set (`given`, whatever its value) contradicts them: one line. cfg
    takes them, so the saved config tells the truth. operator_lr_mult, a training setting, stays the configured one."""
    path = os.path.join(cfg.init_from, 'ckpt.pt')
    if os.path.isfile(path):
        saved = load_checkpoint(path, mmap=True, purpose='info')['model_args']
        own = [k for k in OPERATOR_KEYS if k != 'operator_lr_mult']
        wrong = [k for k in own if k in given and getattr(cfg, k) != saved[k]]
        if wrong:
            raise UserError(f"{', '.join(f'{k}={getattr(cfg, k)!r}' for k in wrong)} set, but {cfg.init_from} was "
                            f"trained with {', '.join(f'{k}={saved[k]!r}' for k in wrong)}: its weights hold that "
                            f"operator; pass {' '.join(f'--{k}={config_text(saved[k])}' for k in wrong)} or leave "
                            f"{', '.join(wrong)} out of the command line and config files, or start from scratch")
        vars(cfg).update({k: saved[k] for k in own})
    return {k: getattr(cfg, k) for k in OPERATOR_KEYS}


def wrap_ddp(model, device):
    # The only buffers are the fixed operator scalars, equal on every rank from the start (one seed): DDP need not
    # broadcast them before every forward (forward_sync_buffers=False broadcasts them once, at construction)
    return DDP(model, device_ids=[torch.device(device).index] if device.startswith('cuda') else None,
               forward_sync_buffers=False)


def saved_checkpoint(out_dir):
    """(ckpt.pt as an 'info' dict or None, a phrase naming it and its iteration, or why there is none)."""
    path = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.isfile(path):
        return None, f"no checkpoint was saved ({path} is written at the first evaluation after iteration 0)"
    try:  # memory-mapped: its weights are not read
        ckpt = load_checkpoint(path, mmap=True, purpose='info')
    except UserError as e:
        return None, f"no checkpoint can be read ({e})"
    return ckpt, f"{path} from iter {ckpt['iter_num']}"


def last_good_state(out_dir):
    ckpt, named = saved_checkpoint(out_dir)
    return f"{named} holds the last good state" if ckpt else named


def resume_advice(cfg, world):
    """What survives in the run folder and the command that continues it, with the settings changed since it saved."""
    ckpt, named = saved_checkpoint(cfg.out_dir)
    if ckpt is None:
        return f"{named}: start the run again"
    script = sys.argv[0] if sys.argv[0].endswith('train.py') else 'train.py'
    launch = f"torchrun --standalone --nproc_per_node={world} {script}" if world > 1 else f"python {script}"
    changed = [shlex.quote(f"--{key}={config_text(value)}") for key, value in vars(cfg).items()
               if key not in ('init_from', 'out_dir', 'overwrite') and ckpt['config'].get(key, value) != value]
    return f"{named} is intact: continue with `{launch} " + \
        ' '.join(['--init_from=resume', f"--out_dir={shlex.quote(cfg.out_dir)}", *changed]) + '`'


def config_text(value):
    """value as --key=value spells it: a bare string, unless it would read as another type (or is no string)."""
    try:
        if isinstance(value, str):
            ast.literal_eval(value)
        return repr(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def open_run_folder(cfg, defaults, resumed, iter_num, held):
    """Rank 0's run folder, after every check of the input (bad input overwrites nothing, leaves no train.lock): locked
    until the run ends, log.jsonl cut back to the checkpoint (a crash's later lines are written again) or an old run's
    checkpoints removed, config.json written, the changed keys named. Returns lab/wandb_log, started, or None."""
    ckpt_path = os.path.join(cfg.out_dir, 'ckpt.pt')
    if not resumed and os.path.exists(ckpt_path) and not cfg.overwrite:
        raise UserError(f"{ckpt_path} exists: continue it with --init_from=resume, pick another --out_dir, or pass "
                        f"--overwrite=True to start over")
    logger = None
    if cfg.wandb_log:  # imported before the folder is claimed: without the package, one line, no train.lock
        from lab import wandb_log as logger
    # read before the folder is claimed: a bad line is one line, no train.lock (a run holding it is refused below)
    kept = [json.dumps(e) + '\n' for e in read_log(cfg.out_dir) if e.get('iter', math.inf) <= iter_num] if resumed else []
    held.enter_context(claim_run_folder(cfg.out_dir))
    if not resumed:  # a fresh run (maybe --overwrite): an old checkpoint, log or snapshots would mix two runs
        for name in os.listdir(cfg.out_dir):
            if name.startswith('ckpt') and name.endswith('.pt'):
                os.remove(os.path.join(cfg.out_dir, name))
    with atomic_write(os.path.join(cfg.out_dir, 'log.jsonl')) as f:
        f.writelines(kept)
    with atomic_write(os.path.join(cfg.out_dir, 'config.json')) as f:
        json.dump(vars(cfg), f, indent=1)
    changed = ' '.join(f"{k}={config_text(v)}" for k, v in vars(cfg).items() if defaults.get(k) != v)
    print(f"config: {os.path.join(cfg.out_dir, 'config.json')} (every key); changed from train.py's defaults: "
          f"{changed or 'none'}")
    if logger:
        logger.start(cfg, resumed)
    return logger


def claim_run_folder(out_dir):
    """An exclusive lock on out_dir until the returned file closes (two runs in one folder would interleave log.jsonl
    and race for ckpt.pt), or one line; the OS drops it when the process dies, even by kill -9."""
    path = os.path.join(out_dir, 'train.lock')
    try:
        os.makedirs(out_dir, exist_ok=True)
        handle = open(path, 'a+')
    except OSError as e:  # a folder we may not write in
        raise WriteFailed(path, describe_os_error(e)) from None
    try:
        import fcntl
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no fcntl (Windows): no lock
        return handle
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or 'another process'
        raise UserError(f"{out_dir} is in use by a run that is still training ({owner}): wait for it to finish, "
                        f"stop it, or pick another --out_dir") from None
    with suppress(OSError):  # the pid only names the owner in the message above: a full disk shows where it matters
        handle.truncate(0), handle.write(f"pid {os.getpid()}\n"), handle.flush()
    return handle


def checkpoint_state(model, optimizer, scaler, cfg, meta, progress, data_rng, device):
    """Everything a resumed run needs to continue exactly: weights, moments, config, progress, RNGs (bytes changed on
    disk are one line at the next load: torch.save writes each record's CRC-32, lab/file_checks.changed_records)."""
    return dict(model=saved_weights(model, cfg.train_only), weights=cfg.train_only, optimizer=optimizer.state_dict(),
                scaler=scaler.state_dict(), model_args=asdict(model.config), config=vars(cfg), **progress,
                source=model.source,
                meta={k: meta[k] for k in ('tokenizer', 'vocab_size', 'itos', 'tokenizer_source',
                                           'tokenizer_fingerprint') if k in meta},
                rng=dict(torch=torch.get_rng_state(), data=data_rng.get_state(),  # the device's: by its kind
                         **{kind: device_rng_state(device) if device.startswith(kind) else None
                            for kind in ('cuda', 'mps')}))


def saved_weights(model, train_only):
    """The state dict, or with train_only='operator' the scalars alone: the frozen weights are the source's."""
    state = model.state_dict()
    return {k: v for k, v in state.items() if '.coefficients.' in k} if train_only == 'operator' else state


def restore_state(ckpt, optimizer, scaler, data_rng, cfg, device, rank):
    """checkpoint_state's inverse: moments (under the hyperparameters configured now), scaler, RNGs; the progress."""
    check_optimizer_state(ckpt['optimizer'], optimizer, os.path.join(cfg.out_dir, 'ckpt.pt'))
    fresh = [dict(g) for g in optimizer.param_groups]
    optimizer.load_state_dict(ckpt['optimizer'])  # restores the moments, and the old hyperparameters too:
    for group, new in zip(optimizer.param_groups, fresh):  # a resumed run uses the ones configured now
        group.update({k: new[k] for k in ('weight_decay', 'betas', 'lr_mult')})
    if ckpt['scaler']:  # empty from a float32 or bf16 run: a float16 resume starts a fresh scaler
        if not isinstance(ckpt['scaler'].get('scale'), float):
            raise UserError(f"{cfg.out_dir}/ckpt.pt cannot resume the run: its grad scaler's state has no scale")
        scaler.load_state_dict(ckpt['scaler'])
    progress = {k: ckpt[k] for k in ('iter_num', 'tokens_seen', 'best_val_loss')}
    progress['seconds'] = ckpt.get('seconds', 0.0)
    torch.set_rng_state(ckpt['rng']['torch'])
    set_device_rng_state(device, ckpt['rng'].get(device.split(':')[0]))  # a CPU run's: none
    if rank > 0:  # only rank 0's RNG state is saved; the others reseed so their dropout masks stay distinct
        torch.manual_seed(cfg.seed + rank + 7919 * progress['iter_num'])  # (a DDP resume with dropout: not exact)
    data_rng.set_state(ckpt['rng']['data'])
    return progress


def check_optimizer_state(saved, optimizer, path):
    """The saved optimizer state fits this optimizer: its groups' parameter counts, every moment its parameter's shape
    (torch checks the counts only; a wrong moment fails at the first step, or trains on garbage)."""
    counts, ours = [len(g['params']) for g in saved['param_groups']], [len(g['params']) for g in optimizer.param_groups]
    shapes = {i: p.shape for g, s in zip(optimizer.param_groups, saved['param_groups'])
              for i, p in zip(s['params'], g['params'])}
    wrong = [f"its optimizer has groups of {counts} parameters, this model's {ours}"] if counts != ours else [
        f"its optimizer's {k} of parameter {i} does not fit that parameter" for i, moments in saved['state'].items()
        for k, v in moments.items()
        if k != 'step' and (i not in shapes or not isinstance(v, torch.Tensor) or v.shape != shapes[i])]
    if wrong:
        raise UserError(f"{path} cannot resume the run: {wrong[0]}; its weights are intact: start a new run from them "
                        f"with --init_from={os.path.dirname(path) or '.'}")


class StopRequest:
    """Ctrl-C / SIGTERM: save at the end of the iteration (under DDP the same one everywhere); again: abort."""

    def __init__(self, master):
        self.seen, self.master, self.signum = False, master, None
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum, frame):
        if self.seen:
            raise KeyboardInterrupt
        self.seen, self.signum = True, signum
        if self.master:
            tqdm.write("stopping after this iteration and saving a checkpoint (again to abort now)")


class LogWindow:
    """The steps since the last log line: their summed loss, on the device until a log line reads it (the host never
    waits in between), and their time without the first, compiling step and evaluations; the ETA's pace with them."""

    def __init__(self, device, max_iters, flops_per_iter, tokens_per_iter, world, peak):
        self.device, self.max_iters, self.world, self.peak = device, max_iters, world, peak
        self.flops_per_iter, self.tokens_per_iter = flops_per_iter, tokens_per_iter
        self.since, self.last_step_end = None, time.time()
        self.reset()

    def reset(self):
        self.loss, self.iters, self.timed, self.t0 = torch.zeros((), device=self.device), 0, 0, time.time()

    def restart_clock(self):
        self.t0, self.timed = time.time(), 0

    def step_done(self, iter_num):
        """Count a finished step; the wall seconds since the previous one ended (evaluations included)."""
        self.iters += 1
        if self.since is None:  # this process's first step compiles: the clocks start after it
            synchronize(self.device)
            self.t0 = time.time()
            self.timed, self.since = 0, (self.t0, iter_num)
        else:
            self.timed += 1
        now = time.time()
        elapsed, self.last_step_end = now - self.last_step_end, now
        return elapsed

    def meet(self, stop_seen, ddp):
        """(the window's mean loss over every process, whether any process was asked to stop): one all-reduce."""
        shared = torch.stack([self.loss.float(), torch.tensor(float(stop_seen), device=self.device)])
        if ddp:
            dist.all_reduce(shared, op=dist.ReduceOp.SUM)
        return shared[0].item() / self.world / self.iters, shared[1].item() > 0

    def speed(self, iter_num):
        """', N tok/s, mfu M%, T ms/iter, ETA E' ('' before a timed step): MFU per device, ETA at this pace."""
        if not self.timed:
            return ''
        now = time.time()
        dt = (now - self.t0) / self.timed
        mfu = self.flops_per_iter / dt / self.world / self.peak if self.peak else None
        pace = (now - self.since[0]) / max(1, iter_num - self.since[1])
        return f", {self.tokens_per_iter / dt:,.0f} tok/s" + (f", mfu {mfu:.1%}" if mfu else '') + \
            f", {dt * 1000:.0f} ms/iter, ETA {duration((self.max_iters - iter_num) * pace)}"


def duration(seconds):
    """'45s', '4m05s', '2h10m'."""
    s = max(0, round(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s // 60 % 60:02d}m"


def finish(cfg, rank, world, stopped, save, logger, progress, resumed, started):
    """After the loop: W&B finished; a stopped run saved, its resume named (exit 128 + signal), or the next commands."""
    if logger:
        logger.finish()
    if rank == 0 and stopped:
        save(os.path.join(cfg.out_dir, 'ckpt.pt'))
        tqdm.write(f"stopped at iter {progress['iter_num']}; {resume_advice(cfg, world)}")  # torchrun's under DDP
    elif rank == 0:
        ckpt, named = saved_checkpoint(cfg.out_dir)
        print(f"done: {progress['iter_num']} iterations in {duration(time.time() - started)}, best val loss "
              f"{progress['best_val_loss']:.4f}; {named}, log {os.path.join(cfg.out_dir, 'log.jsonl')}"
              + ('. Next:\n' + '\n'.join(next_commands(cfg, resumed)) if ckpt else ''))
    # 128 + the signal's number, as a shell reports a process a signal ended (another DDP process may have seen it)
    return 128 + (stopped.signum or signal.SIGTERM) if stopped else 0


def next_commands(cfg, resumed):
    """What to run next, each command doing what it says: a sample; after a fresh run whose operator the user chose
    (from scratch, or all of a pretrained model's weights), the other of attention / corridor trained the same way and
    the two compared, or only the comparison where that run is there already. Its folder: OUT-<other> beside OUT, and
    beside OUT-<operator> also OUT itself (the quick start's corridor run in OUT, then attention in OUT-attention; the
    GPU path's OUT-corridor and OUT-attention). Nothing more after a resume (its command line holds no config to
    repeat), a start from a run folder (its weights fix the operator) or train_only='operator' (attention has no
    scalars to train)."""
    commands = [f"python sample.py --out_dir={shlex.quote(cfg.out_dir)} --num_samples=3"]
    if resumed or cfg.train_only != 'all' or os.path.isfile(os.path.join(cfg.init_from, 'ckpt.pt')):
        return commands
    other = 'corridor' if cfg.operator == 'attention' else 'attention'
    base = cfg.out_dir.rstrip('/')
    stem = base.removesuffix(f'-{cfg.operator}')
    folders = [f"{stem}-{other}", *([stem] if stem != base else [])]
    partner = next((f for f in folders if operator_held(f, cfg.dataset) not in (None, cfg.operator)), None)
    if partner is None:  # train it, into a folder no other run holds
        names = itertools.chain([folders[0]], (f"{folders[0]}-{k}" for k in itertools.count(2)))
        partner = next(f for f in names if not os.path.exists(os.path.join(f, 'ckpt.pt')))
        commands.append(other_run_command(cfg, other, partner))
    compared = (partner, cfg.out_dir) if cfg.operator == 'attention' else (cfg.out_dir, partner)  # attention last
    return commands + [f"python analyze.py {' '.join(map(shlex.quote, compared))} --out comparison"]


def operator_held(folder, dataset):
    """The operator of the run whose checkpoint the folder holds, if it trained on dataset; else None."""
    config = (saved_checkpoint(folder)[0] or {}).get('config', {})
    return config.get('operator') if config.get('dataset') == dataset else None


def other_run_command(cfg, other, out_dir):
    """This run's command line with --operator={other} and --out_dir, without this form's operator keys; a config
    file's operator keys that the other form does not read are set back to their defaults (it would refuse them)."""
    def key(arg):
        return arg.partition('=')[0].removeprefix('--')
    typed = {key(a) for a in sys.argv[1:]}
    kept = [shlex.quote(a) for a in sys.argv[1:] if key(a) not in (*OPERATOR_KEYS, 'out_dir', 'overwrite')]
    resets = [f"--{k}={config_text(OPERATOR_DEFAULTS[k])}" for k in OPERATOR_KEYS
              if k != 'operator' and k not in typed and k not in OPERATORS[other].keys
              and getattr(cfg, k) != OPERATOR_DEFAULTS[k]]
    return ' '.join(['python train.py', *kept, f"--operator={other}", *map(shlex.quote, resets),
                     f"--out_dir={shlex.quote(out_dir)}"])
