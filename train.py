"""
Train a GPT whose attention heads use one operator of the family in model.py.

    python train.py configs/shakespeare_char.py --operator=corridor    # CPU, minutes (prepares its data itself)
    python train.py configs/owt_gpt2_124m.py --operator=corridor       # one GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/owt_gpt2_124m.py --operator=corridor   # DDP, one node
    python train.py --init_from=resume --out_dir=out-owt-124m          # continue a stopped run exactly

Every key of DEFAULTS can be set by a config file (plain Python, `key = value`) and by `--key=value`, in that
order. The run folder gets config.json, log.jsonl (one line per evaluation, with every head's γ/δ) and ckpt.pt.
Ctrl-C (or SIGTERM) finishes the current iteration, saves a checkpoint and stops; a second Ctrl-C aborts.
"""

import ast
import inspect
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from common import (UserError, WriteFailed, append_line, atomic_write, check_tokenizer, checkpoint_progress,
                    describe_os_error, load_checkpoint, load_model, main_guard, model_config, model_from_checkpoint,
                    parse_config, peak_flops, resolve_dtype, save_checkpoint, SDPA_BACKENDS, sdpa_backend)
from model import GPT, OPERATOR_DEFAULTS, OPERATOR_KEYS, gamma_delta, in_corridor

# ------------------------------------------------------------------------------------------------------------
# default config: GPT-2 124M on OpenWebText, nanoGPT's key names
DEFAULTS = dict(
    # I/O
    out_dir='out',
    eval_interval=2000,
    log_interval=1,
    eval_iters=200,
    eval_only=False,
    always_save_checkpoint=True,   # False: ckpt.pt only when val loss improves
    snapshot_interval=0,           # also keep ckpt_<iter>.pt at evals every this many iters (0: never)
    init_from='scratch',           # 'scratch', 'resume' (out_dir/ckpt.pt), 'gpt2', 'gpt2-medium', ... or a pretrained
                                   # causal LM: smollm2-135m, gemma3-270m, a .gguf file, a transformers folder
    train_only='all',              # 'operator': freeze every pretrained weight, train the operator's scalars only
    overwrite=False,               # a scratch run into an out_dir that holds a checkpoint needs this
    walk_interval=0,               # evals at multiples of this also log the connection-walk geometry (0: never)
    walk_seqs=32,                  # ... on this many fixed validation sequences of min(64, block_size) tokens
    wandb_log=False,               # also log to Weights & Biases what log.jsonl gets
    wandb_project='corridor-gpt',
    wandb_run_name='run',
    # data: data_root/dataset/{train,val}.bin from prepare.py
    data_root='data',
    dataset='openwebtext',
    gradient_accumulation_steps=40,  # ×12×1024 ≈ 0.5M tokens per iteration (split across DDP ranks)
    batch_size=12,
    block_size=1024,
    # model (the vocabulary comes from the data's meta.json, padded to a multiple of 64 by the model itself)
    n_layer=12,
    n_head=12,
    n_embd=768,
    dropout=0.0,
    bias=False,
    # the attention operator: operator='corridor', gamma_init=..., ... (every key and default: GPTConfig in model.py)
    **OPERATOR_DEFAULTS,
    # AdamW
    learning_rate=6e-4,
    max_iters=600000,
    weight_decay=1e-1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,                 # 0: no clipping
    # learning rate: linear warmup, cosine decay to min_lr at lr_decay_iters
    decay_lr=True,
    warmup_iters=2000,
    lr_decay_iters=600000,
    min_lr=6e-5,
    # system
    device='cuda' if torch.cuda.is_available() else 'cpu',
    dtype='auto',                  # 'auto': bfloat16 where the GPU has it natively, else float16; float32 on CPU
    compile=True,
    sdpa_backend='auto',           # F.scaled_dot_product_attention's kernel: auto (PyTorch's pick), flash, efficient,
                                   # cudnn or math; one that can't run here fails at the start, in one line
    backend='auto',                # DDP: 'auto' = nccl on GPU, gloo on CPU
    seed=1337,
)
# what a resumed run can't change (block_size may shrink: it is checked against the model's positions)
ARCHITECTURE_KEYS = ('n_layer', 'n_head', 'n_embd', 'bias') + tuple(k for k in OPERATOR_KEYS if k != 'operator_lr_mult')


class TrainingStopped(UserError):
    """The run can't go on (a non-finite loss, a file it can't write, a DDP process gone); the last good checkpoint
    is untouched."""


# ------------------------------------------------------------------------------------------------------------
# config, data, model

# keys nanoGPT users set that this script takes from elsewhere
HINTS = dict(vocab_size="vocab_size comes from the data's meta.json, and the model pads its embedding to a multiple "
                        "of 64 by itself (50257 -> 50304): drop vocab_size")


def resolve_config(argv):
    """(cfg, checkpoint or None). A resumed run starts from its saved config, so only what changes needs saying,
    and its architecture can't change under the checkpoint."""
    config = parse_config(DEFAULTS, argv, hints=HINTS)
    ckpt = None
    if config['init_from'] == 'resume':
        ckpt = load_checkpoint(os.path.join(config['out_dir'], 'ckpt.pt'))
        config = parse_config({**DEFAULTS, **ckpt['config']}, argv, hints=HINTS)
        if config['train_only'] != ckpt['config'].get('train_only', 'all'):  # the optimizer holds what trains
            raise UserError(f"resuming with train_only={config['train_only']!r}, but the run trained "
                            f"{ckpt['config'].get('train_only', 'all')!r}: start a new run from its checkpoint's source")
        for key in ARCHITECTURE_KEYS:
            if config[key] != ckpt['model_args'][key]:
                raise UserError(f"resuming with {key}={config[key]!r}, but the checkpoint's model has "
                                f"{key}={ckpt['model_args'][key]!r}")
    cfg = SimpleNamespace(**config)
    for key in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters',
                'log_interval', 'walk_seqs'):
        if getattr(cfg, key) < 1:
            raise UserError(f"{key} must be at least 1, got {getattr(cfg, key)}")
    if cfg.max_iters < 0 or cfg.snapshot_interval < 0 or cfg.warmup_iters < 0 or cfg.walk_interval < 0:
        raise UserError("max_iters, snapshot_interval, warmup_iters and walk_interval must be >= 0")
    if cfg.walk_interval % cfg.eval_interval:
        raise UserError(f"walk_interval={cfg.walk_interval} must be a multiple of eval_interval={cfg.eval_interval} "
                        f"(the geometry is logged at evaluations)")
    if cfg.decay_lr and cfg.lr_decay_iters <= cfg.warmup_iters:
        raise UserError(f"lr_decay_iters={cfg.lr_decay_iters} must exceed warmup_iters={cfg.warmup_iters} "
                        f"(or --decay_lr=False)")
    if cfg.sdpa_backend not in SDPA_BACKENDS:
        raise UserError(f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {cfg.sdpa_backend!r}")
    if cfg.dtype not in ('auto', 'float32', 'bfloat16', 'float16'):
        raise UserError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {cfg.dtype!r}")
    if cfg.train_only not in ('all', 'operator'):
        raise UserError(f"train_only must be 'all' or 'operator', got {cfg.train_only!r}")
    if cfg.train_only == 'operator' and cfg.init_from == 'scratch':
        raise UserError("train_only='operator' freezes pretrained weights: give --init_from=SOURCE (gpt2, "
                        "smollm2-135m, a .gguf file or a transformers folder)")
    kind, _, index = cfg.device.partition(':')
    if kind not in ('cpu', 'cuda') or (index and not (kind == 'cuda' and index.isdigit())):
        raise UserError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {cfg.device!r}")
    return cfg, ckpt


# small known datasets (about 1 MB of text) that train.py prepares itself when their folder is missing, so that the
# quick start is one command; the others (OpenWebText: ~17 GB) need their explicit `python prepare.py NAME`
PREPARED_ON_DEMAND = ('shakespeare_char', 'shakespeare')


def prepare_if_missing(cfg):
    """Run `prepare.py DATASET` (as a user would: a separate process) for a small known dataset with no meta.json."""
    folder = os.path.join(cfg.data_root, cfg.dataset)
    if cfg.dataset not in PREPARED_ON_DEMAND or os.path.isfile(os.path.join(folder, 'meta.json')):
        return
    command = ['prepare.py', cfg.dataset, f'--data_root={cfg.data_root}']
    print(f"{folder} is missing: preparing it first (python {' '.join(command)})", flush=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'prepare.py')
    result = subprocess.run([sys.executable, script, *command[1:]], stderr=subprocess.PIPE, text=True)
    if result.returncode:
        reason = (result.stderr.strip().splitlines() or ['no message'])[-1].removeprefix('error: ')
        reason = reason.replace('pass a local copy with --input PATH',  # train.py takes no --input: prepare.py does
                                f"prepare it from a local copy: python prepare.py {cfg.dataset} --input PATH "
                                f"--data_root={cfg.data_root}")
        raise UserError(f"preparing {folder} failed: {reason}")


class Data:
    """data_root/dataset: meta.json and the token files train.bin and val.bin (uint16, or uint32 for a vocabulary
    beyond 65,536: meta.json's dtype)."""

    def __init__(self, cfg, device):
        self.dir, self.block_size, self.batch_size, self.device = \
            os.path.join(cfg.data_root, cfg.dataset), cfg.block_size, cfg.batch_size, device
        meta_path = os.path.join(self.dir, 'meta.json')
        if not os.path.isfile(meta_path):
            raise UserError(f"no prepared data at {self.dir} (meta.json missing): run `python prepare.py "
                            f"{cfg.dataset}` or set --data_root / --dataset")
        try:
            with open(meta_path) as f:
                self.meta = json.load(f)
            self.meta['vocab_size'], self.meta['tokenizer']
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise UserError(f"{meta_path} is not a meta.json written by prepare.py ({type(e).__name__}): rerun "
                            f"`python prepare.py {cfg.dataset}`") from None
        self.dtype = np.dtype(self.meta.get('dtype', 'uint16'))
        self.n_tokens = {}
        for split in ('train', 'val'):
            path = os.path.join(self.dir, f'{split}.bin')
            size = os.path.getsize(path) if os.path.isfile(path) else 0
            if size % self.dtype.itemsize:
                raise UserError(f"{path} has {size} bytes, not a whole number of {self.dtype} tokens (truncated?): "
                                f"rerun `python prepare.py {cfg.dataset}`")
            if size // self.dtype.itemsize <= cfg.block_size:
                raise UserError(f"block_size={cfg.block_size} needs more tokens than that, but {split}.bin in "
                                f"{self.dir} has {size // self.dtype.itemsize}")
            self.n_tokens[split] = size // self.dtype.itemsize

    def offsets(self, split, count, generator):
        """[count, batch_size] random start positions."""
        return torch.randint(self.n_tokens[split] - self.block_size, (count, self.batch_size), generator=generator)

    def batch(self, split, offsets):
        # reopened per batch: a long-lived np.memmap keeps its pages referenced and memory creeps up
        data = np.memmap(os.path.join(self.dir, f'{split}.bin'), dtype=self.dtype, mode='r')
        x = torch.stack([torch.from_numpy(data[i:i + self.block_size].astype(np.int64)) for i in offsets])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + self.block_size].astype(np.int64)) for i in offsets])
        if self.device.startswith('cuda'):
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x, y


def build_model(cfg, vocab_size, ckpt):
    """The model to train: from the checkpoint, from scratch, or a pretrained one (OpenAI's GPT-2 as our GPT, another
    causal LM as lab.hf.PretrainedLM) with the configured operator; with train_only='operator', every weight but
    the operator's scalars frozen."""
    if ckpt is not None:  # the architecture stays; dropout and operator_lr_mult are training settings it may change
        model = model_from_checkpoint(ckpt, dropout=cfg.dropout, operator_lr_mult=cfg.operator_lr_mult)
        model.source = ckpt.get('source')
    elif cfg.init_from == 'scratch':
        model = GPT(model_config({**vars(cfg), 'vocab_size': vocab_size}))
        model.source = None
    else:
        model, _ = load_model(cfg.init_from, dropout=cfg.dropout, **{k: getattr(cfg, k) for k in OPERATOR_KEYS})
        if cfg.dropout and not isinstance(model, GPT):
            raise UserError(f"dropout: {cfg.init_from} keeps its own (attention_dropout in its config.json); leave "
                            f"--dropout at 0")
        for key in ('n_layer', 'n_head', 'n_embd', 'bias'):
            setattr(cfg, key, getattr(model.config, key))  # the model's own, so the saved config tells the truth
        model.source = cfg.init_from  # where the weights came from: the checkpoint names it
    if cfg.train_only == 'operator':
        if not model.operator_parameters():
            raise UserError(f"train_only='operator', but operator={cfg.operator!r} has no learnable scalars "
                            f"(corridor, alpha, alpha_beta have)")
        freeze_all_but_the_operator(model)
    return model


def freeze_all_but_the_operator(model):
    """train_only='operator': every weight frozen, the operator's scalars trained."""
    for p in model.parameters():
        p.requires_grad_(False)
    for p in model.operator_parameters():
        p.requires_grad_(True)


def saved_weights(model, cfg):
    """What ckpt.pt holds of the model: every weight, or with train_only='operator' the operator's scalars only (the
    frozen weights are the source's, which the checkpoint names: 2 kB of scalars instead of SmolLM2-135M's 540 MB)."""
    state = model.state_dict()
    if cfg.train_only == 'operator':
        return {key: value for key, value in state.items() if '.coefficients.' in key}
    return state


def check_model_and_data(cfg, model, data):
    """What the model and the data must agree on before anything runs: the tokenizer, the context length, and what
    walk_interval can read."""
    check_tokenizer(model, data.meta, data.dir)
    if cfg.walk_interval and not isinstance(model, GPT):
        raise UserError(f"walk_interval logs our GPT's geometry; for {model.source} run python -m lab.walk on the run "
                        f"folder after training (--walk_interval=0)")
    if cfg.block_size > model.config.block_size:
        raise UserError(f"block_size={cfg.block_size} exceeds the model's {model.config.block_size} positions")


# ------------------------------------------------------------------------------------------------------------
# the pieces of the loop: learning rate, evaluation, what an evaluation logs, checkpoints

def get_lr(it, cfg):
    """Linear warmup for warmup_iters, cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


@torch.no_grad()
def estimate_loss(model, data, cfg, autocast, rank, world):
    """Mean loss over eval_iters batches per split. The batches are the same at every evaluation, and in every run
    with the same seed and data, so curves and variants compare without sampling noise. Under DDP each process
    evaluates its share; `model` is never the DDP wrapper, so a process without a share has nothing to wait for."""
    model.eval()
    out = {}
    for i, split in enumerate(('train', 'val')):
        offsets = data.offsets(split, cfg.eval_iters, torch.Generator().manual_seed(cfg.seed + 1000 + i))
        total = torch.zeros(2, device=data.device)
        for k in range(rank, cfg.eval_iters, world):
            x, y = data.batch(split, offsets[k])
            with autocast:
                _, loss = model(x, y)
            total += torch.stack([loss.float(), torch.ones((), device=data.device)])
        if world > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def corridor_summary(coefficients):
    """(fraction of heads in the corridor, mean γ, mean δ)."""
    gamma, delta = gamma_delta(coefficients)
    return in_corridor(gamma).float().mean().item(), gamma.mean().item(), delta.mean().item()


def operator_summary(model):
    """The operator for the log line: 'attention' for plain attention (no scalars to report), otherwise the form
    with its heads' corridor occupancy and mean γ, δ."""
    if model.config.operator == 'attention':
        return 'attention'
    occupancy, gamma_mean, delta_mean = corridor_summary(model.operator_coefficients())
    return f"{model.config.operator}: {occupancy:.0%} of heads in the corridor, γ̄ {gamma_mean:+.3f} δ̄ {delta_mean:.3f}"


def log_entry(model, cfg, iter_num, progress, losses, lr, walk_idx):
    """One line of log.jsonl: everything an evaluation records. A new per-evaluation diagnostic is one more key
    here; analyze.py reads the log, wandb_metrics flattens it."""
    coefficients = model.operator_coefficients()  # [layers, heads, (c_I, c_P)]
    gamma, delta = gamma_delta(coefficients)
    entry = dict(iter=iter_num, tokens=progress['tokens_seen'], train_loss=losses['train'], val_loss=losses['val'],
                 best_val_loss=progress['best_val_loss'], lr=lr, gamma=gamma.tolist(), delta=delta.tolist(),
                 c_I=coefficients[..., 0].tolist(), c_P=coefficients[..., 1].tolist())
    if cfg.walk_interval and iter_num % cfg.walk_interval == 0:
        entry['walk'] = walk_geometry(model, walk_idx)
    return entry


def walk_geometry(model, idx):
    """Per-layer connection-walk diagnostics (lab/connection.py) for log.jsonl: of the attention part, and for the
    operator family also of the full operator c_I·I + c_P·P. Never on the training path: the math path, in eval mode,
    on fixed sequences, with no random numbers drawn, so a run's losses are the same with or without it."""
    from lab.connection import PER_LAYER, connection_diagnostics  # only a run with walk_interval > 0 needs the lab
    parts = ['attention'] if model.config.operator == 'attention' else ['attention', 'operator']
    geometry = {}
    for part in parts:
        result = connection_diagnostics(model, idx, full_operator=part == 'operator')
        geometry[part] = {key: result[key] for key in PER_LAYER}
    return geometry


def walk_sequences(cfg, data):
    """The connection walk's fixed validation sequences (walk_interval): the paper's 64 tokens, drawn from a
    generator of their own, so that logging the walk changes no batch of the run."""
    offsets = torch.randint(data.n_tokens['val'] - cfg.block_size, (cfg.walk_seqs,),
                            generator=torch.Generator().manual_seed(cfg.seed + 2000))
    return data.batch('val', offsets)[0][:, :min(64, cfg.block_size)]


def wandb_metrics(entry):
    """A log.jsonl entry as flat wandb metrics: losses, lr, tokens, corridor occupancy, every head's γ/δ/c_I/c_P,
    the walk geometry."""
    occupancy = in_corridor(torch.tensor(entry['gamma'])).float().mean().item()
    metrics = {'train/loss': entry['train_loss'], 'val/loss': entry['val_loss'], 'val/best': entry['best_val_loss'],
               'lr': entry['lr'], 'tokens': entry['tokens'], 'corridor/occupancy': occupancy}
    for key in ('gamma', 'delta', 'c_I', 'c_P'):
        for layer, heads in enumerate(entry[key]):
            metrics.update({f'{key}/L{layer}H{head}': value for head, value in enumerate(heads)})
    for part, diagnostics in entry.get('walk', {}).items():
        for key, values in diagnostics.items():
            metrics.update({f'walk_{part}/{key}/L{layer}': value for layer, value in enumerate(values)})
    return metrics


def checkpoint_state(model, optimizer, scaler, cfg, meta, progress, data_rng, device):
    """Everything a resumed run needs to continue exactly: weights, optimizer moments, config, progress, RNGs; for a
    pretrained model, the source its weights came from."""
    return dict(model=saved_weights(model, cfg), weights=cfg.train_only, optimizer=optimizer.state_dict(),
                scaler=scaler.state_dict(), model_args=asdict(model.config), config=vars(cfg), **progress,
                source=model.source,
                meta={k: meta[k] for k in ('tokenizer', 'vocab_size', 'itos', 'tokenizer_source',
                                           'tokenizer_fingerprint') if k in meta},
                rng=dict(torch=torch.get_rng_state(), data=data_rng.get_state(),
                         cuda=torch.cuda.get_rng_state(device) if device.startswith('cuda') else None))


def restore_state(ckpt, optimizer, scaler, data_rng, cfg, device, rank):
    """checkpoint_state's inverse for a resumed run: optimizer moments, grad scaler, RNGs; returns the progress.
    The optimizer keeps the hyperparameters configured now, not the checkpoint's."""
    fresh = [dict(g) for g in optimizer.param_groups]
    optimizer.load_state_dict(ckpt['optimizer'])  # restores the moments, and the old hyperparameters too:
    for group, new in zip(optimizer.param_groups, fresh):  # a resumed run uses the ones configured now
        group.update({k: new[k] for k in ('weight_decay', 'betas', 'lr_mult')})
    scaler.load_state_dict(ckpt['scaler'])
    progress = {k: ckpt[k] for k in ('iter_num', 'tokens_seen', 'best_val_loss')}
    progress['seconds'] = ckpt.get('seconds', 0.0)
    torch.set_rng_state(ckpt['rng']['torch'])
    if device.startswith('cuda') and ckpt['rng']['cuda'] is not None:
        torch.cuda.set_rng_state(ckpt['rng']['cuda'], device)
    if rank > 0:  # only rank 0's RNG state is saved; the others reseed so their dropout masks stay distinct
        torch.manual_seed(cfg.seed + rank + 7919 * progress['iter_num'])  # (a DDP resume with dropout: not exact)
    data_rng.set_state(ckpt['rng']['data'])
    return progress


# ------------------------------------------------------------------------------------------------------------
# the run

def main(argv):
    """Exit status 0 when the run finished, 128 + the signal's number when Ctrl-C / SIGTERM stopped it."""
    with ExitStack() as held:  # the run folder's lock and the one-line fault reports: however the run ends
        status = train(argv, held)
    if status:
        sys.exit(status)


def train(argv, held):
    """The run: config, processes, data, model; then the loop. Returns main's exit status."""
    cfg, ckpt = resolve_config(argv)
    resumed = ckpt is not None
    ddp, rank, world, device = setup_processes(cfg)
    held.enter_context(faults_in_one_line(cfg, ddp, rank, world))
    master = rank == 0
    dtype = resolve_dtype(cfg.dtype, device)
    autocast = nullcontext() if dtype == 'float32' else torch.autocast(device.split(':')[0], getattr(torch, dtype))
    torch.manual_seed(cfg.seed)  # the same initial model on every rank (below)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    # data
    if not ddp:  # (under torchrun, prepare first: ranks would race to write the same folder)
        prepare_if_missing(cfg)
    data = Data(cfg, device)
    # Every process draws the same global batch from this generator and takes its own rows of it, so a DDP run
    # sees exactly the batches of one process with the same gradient_accumulation_steps.
    data_rng = torch.Generator().manual_seed(cfg.seed)
    micro_steps = cfg.gradient_accumulation_steps // world  # per process
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size

    # model and optimizer. Built from one seed on every rank: DDP broadcasts rank 0's parameters, not the fixed
    # operator scalars, which are buffers (and may be drawn: init_spread). Then each rank reseeds for its own
    # dropout masks.
    raw_model = build_model(cfg, data.meta['vocab_size'], ckpt)
    if rank > 0:
        torch.manual_seed(cfg.seed + rank)
    check_model_and_data(cfg, raw_model, data)
    raw_model.to(device)
    head_size = getattr(raw_model, 'head_size', raw_model.config.n_embd // raw_model.config.n_head)
    held.enter_context(sdpa_backend(cfg.sdpa_backend, device, dtype, head_size))  # before compiling: it picks the kernel
    scaler = torch.amp.GradScaler(device.split(':')[0], enabled=dtype == 'float16')
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                               device.split(':')[0])
    # seconds: the wall time spent in this run so far, over every sitting (in ckpt.pt, not in log.jsonl, whose lines
    # a resumed run writes exactly as an uninterrupted one)
    progress = dict(iter_num=0, tokens_seen=0, best_val_loss=float('inf'), seconds=0.0)
    if resumed:
        progress = restore_state(ckpt, optimizer, scaler, data_rng, cfg, device, rank)
    ckpt = None  # the checkpoint's host copy of the weights and moments: gone before the run starts
    compiled = torch.compile(raw_model) if cfg.compile else raw_model
    model = wrap_ddp(compiled, device) if ddp else compiled

    if cfg.eval_only:
        losses = estimate_loss(compiled, data, cfg, autocast, rank, world)
        if master:
            print(f"iter {progress['iter_num']}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        leave_processes(ddp)
        return 0

    # the run folder: all the checks above ran first, so bad input never overwrites anything
    ckpt_path, log_path = os.path.join(cfg.out_dir, 'ckpt.pt'), os.path.join(cfg.out_dir, 'log.jsonl')
    if not resumed and os.path.exists(ckpt_path) and not cfg.overwrite:
        raise UserError(f"{ckpt_path} exists: continue it with --init_from=resume, pick another --out_dir, "
                        f"or pass --overwrite=True to start over")
    wandb = open_run_folder(cfg, resumed, progress, held) if master else None
    if master:
        print(f"{raw_model.get_num_params() / 1e6:.2f}M parameters, {tokens_per_iter:,} tokens per iteration, "
              f"operator {raw_model.config.operator}, {device}, {dtype}, {world} process(es)"
              + (f", resuming at iter {progress['iter_num']}" if resumed else ''))
    walk_idx = walk_sequences(cfg, data) if cfg.walk_interval and master else None

    def save(path):
        save_checkpoint(checkpoint_state(raw_model, optimizer, scaler, cfg, data.meta, progress, data_rng, device), path)

    # --- the loop ---------------------------------------------------------------------------------------------
    stop_request, stop = StopRequest(master), False
    iter_num, start_iter = progress['iter_num'], progress['iter_num']
    window, last_step_end = LogWindow(device), time.time()
    bar = tqdm(total=cfg.max_iters, initial=iter_num, disable=not master or not sys.stderr.isatty(),
               dynamic_ncols=True, unit='it')
    while True:
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr * group['lr_mult']

        # evaluate, log, checkpoint (a resumed run's first evaluation is in its log already)
        at_eval = iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters
        if at_eval and not (resumed and iter_num == start_iter):
            losses = estimate_loss(compiled, data, cfg, autocast, rank, world)
            if not all(math.isfinite(v) for v in losses.values()):
                raise TrainingStopped(f"evaluation at iter {iter_num} gave {losses}; stopped without saving, "
                                      f"{ckpt_path} holds the last good state")
            improved = losses['val'] < progress['best_val_loss']
            progress['best_val_loss'] = min(progress['best_val_loss'], losses['val'])  # only ever goes down
            if master:
                entry = log_entry(raw_model, cfg, iter_num, progress, losses, lr, walk_idx)
                tqdm.write(f"eval {iter_num}: train {losses['train']:.4f}, val {losses['val']:.4f} (best "
                           f"{progress['best_val_loss']:.4f}), {operator_summary(raw_model)}")
                append_line(log_path, json.dumps(entry))
                if wandb:
                    wandb.log(wandb_metrics(entry), step=iter_num)
                if iter_num > 0 and (improved or cfg.always_save_checkpoint):
                    save(ckpt_path)
                if cfg.snapshot_interval and iter_num % cfg.snapshot_interval == 0:
                    save(os.path.join(cfg.out_dir, f'ckpt_{iter_num:07d}.pt'))
            window.restart_clock()  # tokens/s and MFU count training steps only
        if iter_num >= cfg.max_iters:
            break
        if stop:
            if master:
                save(ckpt_path)
                tqdm.write(f"stopped at iter {iter_num}; {resume_advice(cfg, world)}")  # torchrun's command under DDP
            break

        # one optimizer step on the global batch, micro_steps micro-batches of it in this process
        offsets = data.offsets('train', cfg.gradient_accumulation_steps, data_rng)[rank * micro_steps:]
        x, y = data.batch('train', offsets[0])
        for micro_step in range(micro_steps):
            if ddp:  # all-reduce gradients on the last micro-step only
                model.require_backward_grad_sync = micro_step == micro_steps - 1
            with autocast:
                _, loss = model(x, y)
                loss = loss / micro_steps
            if micro_step + 1 < micro_steps:
                x, y = data.batch('train', offsets[micro_step + 1])  # loaded while the device computes
            scaler.scale(loss).backward()
            window.loss += loss.detach()
        if cfg.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        progress.update(iter_num=iter_num, tokens_seen=progress['tokens_seen'] + tokens_per_iter,
                        seconds=progress['seconds'] + time.time() - last_step_end)
        last_step_end = time.time()
        window.step_done(first=iter_num == start_iter + 1)
        bar.update(1)

        # The device runs ahead of the host between log lines; here they meet: the loss of the window, averaged
        # over processes, and whether any process was asked to stop (one small all-reduce). Without DDP a stop
        # request is honoured at the next iteration; under DDP at the next log line, the same iteration everywhere.
        at_log_line = iter_num % cfg.log_interval == 0
        if not (at_log_line or (stop_request.seen and not ddp) or iter_num == cfg.max_iters):
            continue
        lossf, stop = window.meet(stop_request.seen, ddp, world)
        if not math.isfinite(lossf):
            raise TrainingStopped(f"loss is {lossf} at iter {iter_num}; stopped, {ckpt_path} holds the last good "
                                  f"state (try a lower learning_rate, or bfloat16 instead of float16)")
        if master and at_log_line:
            speed = window.speed(raw_model.flops_per_token(cfg.block_size) * tokens_per_iter, tokens_per_iter, world,
                                 peak_flops(device, dtype))
            tqdm.write(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}{speed}, {operator_summary(raw_model)}")
            if wandb:
                wandb.log({'train/loss_window': lossf, 'lr': lr}, step=iter_num)
        window.reset()
    bar.close()
    if wandb:
        wandb.finish()
    leave_processes(ddp)
    if stop:  # a stopped run is not a finished one: a script or scheduler around it must be able to tell
        return 128 + (stop_request.signum or signal.SIGTERM)  # another DDP process may have seen the signal
    if master:
        saved = ckpt_path if os.path.exists(ckpt_path) else 'no checkpoint (val loss never improved)'
        print(f"done: {iter_num} iterations, best val loss {progress['best_val_loss']:.4f}; {saved}, log "
              f"{log_path}. Next: `python sample.py --out_dir={shlex.quote(cfg.out_dir)}` or `python analyze.py "
              f"{shlex.quote(cfg.out_dir)}`")
    return 0


# ------------------------------------------------------------------------------------------------------------
# around the loop: DDP processes, faults reported in one line, the run folder and its lock, stop requests,
# the log window. Each keeps the loop above free of its details.

def setup_processes(cfg):
    """(ddp, rank, world, device) for one process, or for each of torchrun's; the DDP process group is joined."""
    device, cuda = cfg.device, cfg.device.startswith('cuda')
    if cuda and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but CUDA is not available here (use --device=cpu)")
    if int(os.environ.get('RANK', -1)) == -1:  # not launched by torchrun
        return False, 0, 1, device
    if cuda:  # one GPU per process, chosen before the process group binds to it
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    backend = cfg.backend if cfg.backend != 'auto' else ('nccl' if cuda else 'gloo')
    dist.init_process_group(backend=backend, device_id=torch.device(device) if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.gradient_accumulation_steps % world:
        raise UserError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be divisible by "
                        f"the {world} DDP processes")
    return True, rank, world, device


def leave_processes(ddp):
    """All ranks leave together. Without the barrier, rank 1 once aborted at exit ('terminate called without an
    active exception', gloo's threads) while rank 0 was still saving its last checkpoint."""
    if ddp:
        dist.barrier()
        dist.destroy_process_group()


# The only buffers are the fixed operator scalars, equal on every rank from the start (one seed), so DDP must not
# broadcast them before every forward. torch 2.13 deprecates broadcast_buffers=False (a FutureWarning) for
# forward_sync_buffers=False, which also stops the per-forward sync but broadcasts the buffers once at construction:
# from rank 0, values every rank already holds, so the meaning is the same. Older torch has only broadcast_buffers.
NO_BUFFER_SYNC = (dict(forward_sync_buffers=False) if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                  else dict(broadcast_buffers=False))


def wrap_ddp(model, device):
    return DDP(model, device_ids=[torch.device(device).index] if device.startswith('cuda') else None, **NO_BUFFER_SYNC)


def lost_a_process(e):
    """Whether e is a collective failing because another process of the run is gone (killed, crashed): gloo's
    'Connection closed by peer' / 'reset by peer', or torch's DistError family (NCCL)."""
    if isinstance(e, getattr(dist, 'DistError', ())):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e) for s in (
        'by peer', 'Broken pipe', 'remote worker', 'Socket Timeout', 'Connection refused'))


def first_sentence(e):
    """'Read error [127.0.0.1]:49824: Connection reset by peer' from gloo's multi-line message with its source
    location in front."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if text.startswith('[') and '] ' in text:
        text = text.split('] ', 1)[1]
    return text.split('. ')[0].rstrip('.')


@contextmanager
def faults_in_one_line(cfg, ddp, rank, world):
    """A failed write (a full disk, a lost permission: the atomic writes left the old files whole) or a lost DDP
    process ends the run in one line that names what survives and how to continue."""
    try:
        yield
    except WriteFailed as e:
        raise TrainingStopped(f"could not write {e.path} ({e.reason}); {resume_advice(cfg, world)}") from None
    except Exception as e:
        if not (ddp and lost_a_process(e)):
            raise
        raise TrainingStopped(f"rank {rank} of {world} lost another process of the run ({first_sentence(e)}); "
                              f"{resume_advice(cfg, world)}") from None


def resume_advice(cfg, world):
    """What survives in the run folder and the command that continues from it: with the settings this run changed
    from the checkpoint's (a resume with a new --max_iters that fails before its first save)."""
    ckpt_path = os.path.join(cfg.out_dir, 'ckpt.pt')
    iter_num, saved = checkpoint_progress(ckpt_path)
    if iter_num is None:
        return "no checkpoint was saved yet: start the run again"
    script = sys.argv[0] if sys.argv[0].endswith('train.py') else 'train.py'
    launch = f"torchrun --standalone --nproc_per_node={world} {script}" if world > 1 else f"python {script}"
    changed = [shlex.quote(f"--{key}={config_text(value)}") for key, value in vars(cfg).items()
               if key not in ('init_from', 'out_dir', 'overwrite') and saved.get(key, value) != value]
    return f"{ckpt_path} from iter {iter_num} is intact: continue with `{launch} " + \
        ' '.join(['--init_from=resume', f"--out_dir={shlex.quote(cfg.out_dir)}", *changed]) + '`'


def config_text(value):
    """value as --key=value spells it: bare strings unless they would read as another type."""
    if not isinstance(value, str):
        return repr(value)
    try:
        ast.literal_eval(value)
        return repr(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def open_run_folder(cfg, resumed, progress, held):
    """Rank 0's run folder: locked for this run (held until it ends), log and config brought to the checkpoint's
    iteration, the config printed; wandb started if asked (returned, or None)."""
    held.enter_context(claim_run_folder(cfg.out_dir))
    prepare_run_folder(cfg, resumed, progress['iter_num'], os.path.join(cfg.out_dir, 'log.jsonl'))
    print('\n'.join(f"{k} = {v!r}" for k, v in vars(cfg).items()))
    return start_wandb(cfg, resumed) if cfg.wandb_log else None


def claim_run_folder(out_dir):
    """Hold an exclusive lock on out_dir until the returned file is closed (main closes it however the run ends), or
    fail with one line: two runs in one folder would interleave log.jsonl and race for ckpt.pt. The OS drops the lock
    when the process dies (even by kill -9), so a crashed run never leaves the folder locked."""
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
    try:
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
    except OSError:
        pass  # the pid only names the owner in the message above: a full disk is reported where it matters
    return handle


def prepare_run_folder(cfg, resumed, iter_num, log_path):
    """The run folder as this run continues it: log lines past the checkpoint dropped (a crash between log and
    save; they are written again), or for a fresh run an old run's checkpoints removed; config.json written."""
    kept = []
    if resumed:
        for line in open(log_path) if os.path.exists(log_path) else []:
            try:
                if json.loads(line)['iter'] <= iter_num:
                    kept.append(line)
            except (json.JSONDecodeError, KeyError):
                pass  # a line torn by a crash
    else:  # a fresh run (maybe --overwrite): an old checkpoint, log or snapshots would mix two runs
        for name in os.listdir(cfg.out_dir):
            if name.startswith('ckpt') and name.endswith('.pt'):
                os.remove(os.path.join(cfg.out_dir, name))
    with atomic_write(log_path) as f:
        f.writelines(kept)
    with atomic_write(os.path.join(cfg.out_dir, 'config.json')) as f:
        json.dump(vars(cfg), f, indent=1)


def start_wandb(cfg, resumed):
    """wandb, imported only when wandb_log is on."""
    try:
        import wandb
    except ImportError:
        raise UserError("wandb_log=True needs the wandb package: pip install wandb (or --wandb_log=False)") from None
    wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=vars(cfg), dir=cfg.out_dir,
               resume='allow' if resumed else None)
    return wandb


class StopRequest:
    """Ctrl-C / SIGTERM: finish this iteration, save, stop; a second signal aborts. The handler only records the
    signal; the loop decides when to stop, so that under DDP every process stops at the same iteration."""

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


def synchronized_time(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize(device)
    return time.time()


class LogWindow:
    """The training steps since the last log line: their summed loss, kept on the device and read only at a log
    line (so the host never waits for the device in between), and their wall time, which leaves out the first,
    compiling step and every evaluation."""

    def __init__(self, device):
        self.device = device
        self.reset()

    def reset(self):
        self.loss, self.iters, self.timed, self.t0 = torch.zeros((), device=self.device), 0, 0, time.time()

    def restart_clock(self):
        self.t0, self.timed = time.time(), 0

    def step_done(self, first):
        self.iters += 1
        if first:  # the first step compiles: the timing starts after it
            self.t0, self.timed = synchronized_time(self.device), 0
        else:
            self.timed += 1

    def meet(self, stop_seen, ddp, world):
        """(the window's mean loss over every process, whether any process was asked to stop): one all-reduce."""
        shared = torch.stack([self.loss.float(), torch.tensor(float(stop_seen), device=self.device)])
        if ddp:
            dist.all_reduce(shared, op=dist.ReduceOp.SUM)
        return shared[0].item() / world / self.iters, shared[1].item() > 0

    def speed(self, flops_per_iter, tokens_per_iter, world, peak):
        """', N tok/s, mfu M%, T ms/iter' of the timed steps ('' before any). MFU per device: each process computes
        1/world of the tokens against one device's peak."""
        if not self.timed:
            return ''
        dt = (time.time() - self.t0) / self.timed
        mfu = flops_per_iter / dt / world / peak if peak else None
        return f", {tokens_per_iter / dt:,.0f} tok/s" + (f", mfu {mfu:.1%}" if mfu else '') + f", {dt * 1000:.0f} ms/iter"


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
