"""
Train a GPT whose attention heads use one operator of the family in model.py.

    python train.py configs/shakespeare_char_corridor.py                 # CPU, minutes
    python train.py configs/owt_gpt2_124m_corridor.py                    # one GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/owt_gpt2_124m_corridor.py   # DDP, one node
    python train.py --init_from=resume --out_dir=out-owt-corridor       # continue a stopped run exactly

Every key below can be set by a config file (plain Python, `key = value`) and by `--key=value`, in that order.
The run folder gets config.json, log.jsonl (one line per evaluation, with every head's γ/δ) and ckpt.pt.
Ctrl-C (or SIGTERM) finishes the current iteration, saves a checkpoint and stops; a second Ctrl-C aborts.
"""

import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from common import (UserError, load_checkpoint, main_guard, model_config, model_from_checkpoint, parse_config,
                    peak_flops, save_checkpoint)
from model import GPT, GPTConfig, gamma_delta, in_corridor

OPERATOR_KEYS = ('operator', 'laplacian_heads', 'gamma_init', 'delta_init', 'init_spread', 'learn_gamma',
                 'learn_delta', 'gamma_nonneg', 'operator_lr_mult')
# what a resumed run can't change (block_size may shrink: it is checked against the model's positions)
ARCHITECTURE_KEYS = ('n_layer', 'n_head', 'n_embd', 'bias') + tuple(k for k in OPERATOR_KEYS if k != 'operator_lr_mult')

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
    init_from='scratch',           # 'scratch', 'resume' (out_dir/ckpt.pt) or 'gpt2', 'gpt2-medium', ...
    overwrite=False,               # a scratch run into an out_dir that holds a checkpoint needs this
    # data: data_root/dataset/{train,val}.bin from prepare.py
    data_root='data',
    dataset='openwebtext',
    gradient_accumulation_steps=40,  # ×12×1024 ≈ 0.5M tokens per iteration (split across DDP ranks)
    batch_size=12,
    block_size=1024,
    # model (vocab_size comes from the data's meta.json)
    n_layer=12,
    n_head=12,
    n_embd=768,
    dropout=0.0,
    bias=False,
    # the attention operator: see GPTConfig and OPERATORS in model.py
    **{f.name: f.default for f in fields(GPTConfig) if f.name in OPERATOR_KEYS},
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
    dtype='auto',                  # 'auto': bfloat16 where supported, else float16 on GPU; float32 on CPU
    compile=True,
    backend='auto',                # DDP: 'auto' = nccl on GPU, gloo on CPU
    seed=1337,
)


class TrainingStopped(UserError):
    """The run can't go on (a non-finite loss); the last good checkpoint is untouched."""


# ------------------------------------------------------------------------------------------------------------

def resolve_config(argv):
    """(config, checkpoint or None). A resumed run starts from its saved config, so only what changes needs
    saying, and its architecture can't change under the checkpoint."""
    config = parse_config(DEFAULTS, argv)
    if config['init_from'] != 'resume':
        return config, None
    ckpt = load_checkpoint(os.path.join(config['out_dir'], 'ckpt.pt'))
    config = parse_config({**DEFAULTS, **ckpt['config']}, argv)
    for key in ARCHITECTURE_KEYS:
        if config[key] != ckpt['model_args'][key]:
            raise UserError(f"resuming with {key}={config[key]!r}, but the checkpoint's model has "
                            f"{key}={ckpt['model_args'][key]!r}")
    return config, ckpt


def load_meta(cfg):
    data_dir = os.path.join(cfg.data_root, cfg.dataset)
    meta_path = os.path.join(data_dir, 'meta.json')
    if not os.path.isfile(meta_path):
        raise UserError(f"no prepared data at {data_dir} (meta.json missing): run `python prepare.py "
                        f"{cfg.dataset}` or set --data_root / --dataset")
    with open(meta_path) as f:
        meta = json.load(f)
    for split in ('train', 'val'):
        n = os.path.getsize(os.path.join(data_dir, f'{split}.bin')) // 2
        if n <= cfg.block_size:
            raise UserError(f"block_size={cfg.block_size} needs more tokens than that, but {split}.bin in "
                            f"{data_dir} has {n}")
    return data_dir, meta


def check_loop_config(cfg):
    """The loop's numbers make sense (the model's own are checked by GPTConfig)."""
    for key in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters',
                'log_interval'):
        if getattr(cfg, key) < 1:
            raise UserError(f"{key} must be at least 1, got {getattr(cfg, key)}")
    if cfg.max_iters < 0 or cfg.snapshot_interval < 0 or cfg.warmup_iters < 0:
        raise UserError("max_iters, snapshot_interval and warmup_iters must be >= 0")
    if cfg.decay_lr and cfg.lr_decay_iters <= cfg.warmup_iters:
        raise UserError(f"lr_decay_iters={cfg.lr_decay_iters} must exceed warmup_iters={cfg.warmup_iters} "
                        f"(or --decay_lr=False)")


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


def corridor_summary(coefficients):
    """(fraction of heads in the corridor, mean γ, mean δ)."""
    gamma, delta = gamma_delta(coefficients)
    return in_corridor(gamma).float().mean().item(), gamma.mean().item(), delta.mean().item()


def main(argv):
    config, ckpt = resolve_config(argv)
    cfg = SimpleNamespace(**config)
    check_loop_config(cfg)
    resumed = ckpt is not None

    # --- processes and devices -----------------------------------------------------------------------------
    ddp = int(os.environ.get('RANK', -1)) != -1  # launched by torchrun?
    device = cfg.device
    if ddp:
        backend = cfg.backend if cfg.backend != 'auto' else ('nccl' if device.startswith('cuda') else 'gloo')
        dist.init_process_group(backend=backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        if device.startswith('cuda'):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
        if cfg.gradient_accumulation_steps % world:
            raise UserError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be divisible by "
                            f"the {world} DDP processes")
    else:
        rank, world = 0, 1
    master = rank == 0
    device_type = 'cuda' if device.startswith('cuda') else 'cpu'
    if device_type == 'cuda' and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but CUDA is not available here (use --device=cpu)")
    if cfg.dtype == 'auto':
        cfg.dtype = ('bfloat16' if torch.cuda.is_bf16_supported() else 'float16') if device_type == 'cuda' \
            else 'float32'
    if cfg.dtype not in ('float32', 'bfloat16', 'float16'):
        raise UserError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {cfg.dtype!r}")
    autocast = nullcontext() if cfg.dtype == 'float32' else torch.autocast(device_type, getattr(torch, cfg.dtype))
    torch.manual_seed(cfg.seed + rank)  # dropout differs per rank; the weights are rank 0's (DDP broadcasts)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    micro_steps = cfg.gradient_accumulation_steps // world  # per process
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size

    # --- data ------------------------------------------------------------------------------------------------
    data_dir, meta = load_meta(cfg)
    n_tokens = {split: os.path.getsize(os.path.join(data_dir, f'{split}.bin')) // 2 for split in ('train', 'val')}

    def get_batch(split, offsets):
        # reopened per batch: a long-lived np.memmap keeps its pages referenced and memory creeps up
        data = np.memmap(os.path.join(data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')
        x = torch.stack([torch.from_numpy(data[i:i + cfg.block_size].astype(np.int64)) for i in offsets])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + cfg.block_size].astype(np.int64)) for i in offsets])
        if device_type == 'cuda':
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    def draw_offsets(split, count, generator):
        """[count, batch_size] random start positions."""
        return torch.randint(n_tokens[split] - cfg.block_size, (count, cfg.batch_size), generator=generator)

    # Every process draws the same global batch from this generator and takes its own rows of it, so a DDP
    # run sees exactly the batches of one process with the same gradient_accumulation_steps.
    data_rng = torch.Generator().manual_seed(cfg.seed)

    # --- model -------------------------------------------------------------------------------------------------
    if resumed:  # the architecture stays; dropout and operator_lr_mult are training settings it may change
        model = model_from_checkpoint(ckpt, dropout=cfg.dropout, operator_lr_mult=cfg.operator_lr_mult)
    elif cfg.init_from == 'scratch':
        model = GPT(model_config({**vars(cfg), 'vocab_size': meta['vocab_size']}))
    elif cfg.init_from.startswith('gpt2'):
        try:
            model = GPT.from_pretrained(cfg.init_from, dropout=cfg.dropout, **{k: config[k] for k in OPERATOR_KEYS})
        except (RuntimeError, ValueError) as e:
            raise UserError(str(e)) from None
        for key in ('n_layer', 'n_head', 'n_embd', 'bias'):
            setattr(cfg, key, getattr(model.config, key))  # GPT-2's own, so the saved config tells the truth
    else:
        raise UserError(f"init_from must be 'scratch', 'resume' or a GPT-2 name like 'gpt2', got {cfg.init_from!r}")
    if model.config.vocab_size != meta['vocab_size']:
        raise UserError(f"the model's vocabulary ({model.config.vocab_size}) does not match the data's "
                        f"({meta['vocab_size']}, {meta['tokenizer']} tokenizer in {data_dir})")
    if cfg.block_size > model.config.block_size:
        raise UserError(f"block_size={cfg.block_size} exceeds the model's {model.config.block_size} positions")
    model.to(device)

    scaler = torch.amp.GradScaler(device_type, enabled=cfg.dtype == 'float16')
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
    iter_num, tokens_seen, best_val_loss = 0, 0, float('inf')
    if resumed:
        fresh = [dict(g) for g in optimizer.param_groups]
        optimizer.load_state_dict(ckpt['optimizer'])  # restores the moments, and the old hyperparameters too:
        for group, new in zip(optimizer.param_groups, fresh):  # a resumed run uses the ones configured now
            group.update({k: new[k] for k in ('weight_decay', 'betas', 'lr_mult')})
        scaler.load_state_dict(ckpt['scaler'])
        iter_num, tokens_seen, best_val_loss = ckpt['iter_num'], ckpt['tokens_seen'], ckpt['best_val_loss']
        torch.set_rng_state(ckpt['rng']['torch'])
        if device_type == 'cuda' and ckpt['rng']['cuda'] is not None:
            torch.cuda.set_rng_state(ckpt['rng']['cuda'], device)
        if rank > 0:  # only rank 0's RNG state is saved; the others reseed so their dropout masks stay distinct
            torch.manual_seed(cfg.seed + rank + 7919 * iter_num)  # (so a DDP resume with dropout is not bit-exact)
        data_rng.set_state(ckpt['rng']['data'])
    raw_model = model
    if cfg.compile:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[torch.device(device).index] if device_type == 'cuda' else None)

    def all_reduce_sum(tensor):
        if ddp:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    @torch.no_grad()
    def estimate_loss():
        """Mean loss over eval_iters batches per split. The batches are the same at every evaluation, and in
        every run with the same seed and data, so curves and variants compare without sampling noise."""
        model.eval()
        out = {}
        for i, split in enumerate(('train', 'val')):
            offsets = draw_offsets(split, cfg.eval_iters, torch.Generator().manual_seed(cfg.seed + 1000 + i))
            total = torch.zeros(2, device=device)
            for k in range(rank, cfg.eval_iters, world):  # DDP: each process evaluates its share
                x, y = get_batch(split, offsets[k])
                with autocast:
                    _, loss = model(x, y)
                total += torch.stack([loss.float(), torch.ones((), device=device)])
            total = all_reduce_sum(total)
            out[split] = (total[0] / total[1]).item()
        model.train()
        return out

    if cfg.eval_only:
        losses = estimate_loss()
        if master:
            print(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        return

    # --- the run folder: all the checks above ran first, so bad input never overwrites anything -------------
    ckpt_path = os.path.join(cfg.out_dir, 'ckpt.pt')
    log_path = os.path.join(cfg.out_dir, 'log.jsonl')
    if not resumed and os.path.exists(ckpt_path) and not cfg.overwrite:
        raise UserError(f"{ckpt_path} exists: continue it with --init_from=resume, pick another --out_dir, "
                        f"or pass --overwrite=True to start over")
    if master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        kept = []
        if resumed:  # lines past the checkpoint (a crash between log and save) are written again below
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
        with open(log_path + '.tmp', 'w') as f:
            f.writelines(kept)
        os.replace(log_path + '.tmp', log_path)
        with open(os.path.join(cfg.out_dir, 'config.json.tmp'), 'w') as f:
            json.dump(vars(cfg), f, indent=1)
        os.replace(os.path.join(cfg.out_dir, 'config.json.tmp'), os.path.join(cfg.out_dir, 'config.json'))
        print('\n'.join(f"{k} = {v!r}" for k, v in vars(cfg).items()))
        print(f"{raw_model.get_num_params() / 1e6:.2f}M parameters, {tokens_per_iter:,} tokens per iteration, "
              f"operator {raw_model.config.operator}, {device}, {cfg.dtype}, {world} process(es)"
              + (f", resuming at iter {iter_num}" if resumed else ''))

    def checkpoint():
        return dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                    model_args=asdict(raw_model.config), config=vars(cfg), iter_num=iter_num,
                    tokens_seen=tokens_seen, best_val_loss=best_val_loss,
                    meta={k: meta[k] for k in ('tokenizer', 'vocab_size', 'itos') if k in meta},
                    rng=dict(torch=torch.get_rng_state(), data=data_rng.get_state(),
                             cuda=torch.cuda.get_rng_state(device) if device_type == 'cuda' else None))

    # Ctrl-C / SIGTERM: finish this iteration, save, stop. The handler only records the signal; whether to
    # stop is decided from the per-iteration all-reduce below, so every process stops at the same iteration and
    # a signal that lands in the middle of that all-reduce is seen at the next one, never lost.
    signal_seen, stop = False, False

    def request_stop(signum, frame):
        nonlocal signal_seen
        if signal_seen:
            raise KeyboardInterrupt
        signal_seen = True
        if master:
            tqdm.write("stopping after this iteration and saving a checkpoint (again to abort now)")
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    # --- the loop ---------------------------------------------------------------------------------------------
    start_iter = iter_num
    peak = peak_flops(device, cfg.dtype)
    bar = tqdm(total=cfg.max_iters, initial=iter_num, disable=not master or not sys.stderr.isatty(),
               dynamic_ncols=True, unit='it')
    time_since_log, iters_since_log, loss_since_log = 0.0, 0, 0.0  # training steps only, evaluations excluded
    while True:
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr * group['lr_mult']

        due = iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters
        if due and not (resumed and iter_num == start_iter):  # a resumed run's first eval is already logged
            losses = estimate_loss()
            if not all(math.isfinite(v) for v in losses.values()):
                raise TrainingStopped(f"evaluation at iter {iter_num} gave {losses}; stopped without saving, "
                                      f"{ckpt_path} holds the last good state")
            improved = losses['val'] < best_val_loss
            best_val_loss = min(best_val_loss, losses['val'])  # only ever goes down
            if master:
                coefficients = raw_model.operator_coefficients()
                gamma, delta = gamma_delta(coefficients)
                occupancy, gamma_mean, delta_mean = corridor_summary(coefficients)
                tqdm.write(f"eval {iter_num}: train {losses['train']:.4f}, val {losses['val']:.4f} "
                           f"(best {best_val_loss:.4f}), corridor {occupancy:.0%} γ̄ {gamma_mean:+.3f} δ̄ {delta_mean:.3f}")
                with open(log_path, 'a') as f:
                    f.write(json.dumps(dict(
                        iter=iter_num, tokens=tokens_seen, train_loss=losses['train'], val_loss=losses['val'],
                        best_val_loss=best_val_loss, lr=lr, gamma=gamma.tolist(), delta=delta.tolist(),
                        c_I=coefficients[..., 0].tolist(), c_P=coefficients[..., 1].tolist())) + '\n')
                if iter_num > 0 and (improved or cfg.always_save_checkpoint):
                    save_checkpoint(checkpoint(), ckpt_path)
                if cfg.snapshot_interval and iter_num % cfg.snapshot_interval == 0:
                    save_checkpoint(checkpoint(), os.path.join(cfg.out_dir, f'ckpt_{iter_num:07d}.pt'))
        if iter_num >= cfg.max_iters:
            break
        if stop:
            if master:
                save_checkpoint(checkpoint(), ckpt_path)
                tqdm.write(f"stopped at iter {iter_num}; continue with --init_from=resume --out_dir={cfg.out_dir}")
            break

        # one optimizer step on the global batch, micro_steps micro-batches of it in this process
        t0 = time.time()
        offsets = draw_offsets('train', cfg.gradient_accumulation_steps, data_rng)[rank * micro_steps:]
        loss_sum = torch.zeros((), device=device)
        x, y = get_batch('train', offsets[0])
        for micro_step in range(micro_steps):
            if ddp:  # all-reduce gradients on the last micro-step only
                model.require_backward_grad_sync = micro_step == micro_steps - 1
            with autocast:
                _, loss = model(x, y)
                loss = loss / micro_steps
            if micro_step + 1 < micro_steps:
                x, y = get_batch('train', offsets[micro_step + 1])  # loaded while the device computes
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if cfg.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        tokens_seen += tokens_per_iter

        # the loss averaged over processes, and whether any was asked to stop: one small all-reduce
        shared = all_reduce_sum(torch.stack([loss_sum.float(), torch.tensor(float(signal_seen), device=device)]))
        lossf, stop = shared[0].item() / world, shared[1].item() > 0  # .item() waits for the device: t0 is fair
        time_since_log += time.time() - t0
        if not math.isfinite(lossf):
            raise TrainingStopped(f"loss is {lossf} at iter {iter_num}; stopped, {ckpt_path} holds the last good "
                                  f"state (try a lower learning_rate, or bfloat16 instead of float16)")
        bar.update(1)
        iters_since_log += 1
        loss_since_log += lossf
        if iter_num % cfg.log_interval == 0 and master:
            dt = time_since_log / iters_since_log
            tokens_per_sec = tokens_per_iter / dt
            # MFU per device: each process computes 1/world of the tokens against one device's peak
            mfu = f", mfu {raw_model.flops_per_token(cfg.block_size) * tokens_per_sec / world / peak:.1%}" if peak else ''
            occupancy, gamma_mean, delta_mean = corridor_summary(raw_model.operator_coefficients())
            tqdm.write(f"iter {iter_num}: loss {loss_since_log / iters_since_log:.4f}, lr {lr:.2e}, "
                       f"{tokens_per_sec:,.0f} tok/s{mfu}, {dt * 1000:.0f} ms/iter, "
                       f"corridor {occupancy:.0%} γ̄ {gamma_mean:+.3f} δ̄ {delta_mean:.3f}")
            time_since_log, iters_since_log, loss_since_log = 0.0, 0, 0.0
    bar.close()
    if ddp:
        dist.destroy_process_group()


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
