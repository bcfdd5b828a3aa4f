"""
Train a GPT whose attention heads use one operator of the family in model.py.

    python train.py configs/shakespeare_char.py --operator=corridor    # CPU, minutes (prepares its data itself)
    python train.py configs/owt_gpt2_124m.py --operator=corridor       # one GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/owt_gpt2_124m.py --operator=corridor   # DDP, one node
    python train.py --init_from=resume --out_dir=out-owt-124m          # continue a stopped run exactly

Every key of DEFAULTS can be set by a config file (plain Python, `key = value`), then by `--key=value`. The run
folder gets config.json, log.jsonl (a line per evaluation, every head's γ/δ) and ckpt.pt. Ctrl-C (or SIGTERM) saves
at the end of the iteration and stops; a second aborts. What the loop stands on is in run.py, one call each from
here: the data (a small known corpus prepared if missing), the processes (DDP; a fault in one line), the run folder
(its lock, config.json, log.jsonl), the checkpoint's state (all an exact resume needs), the stops (Ctrl-C, SIGTERM),
and the speed and ETA of the log line.
"""

import json
import math
import os
import sys
import time
from contextlib import ExitStack, nullcontext
from types import SimpleNamespace

import torch
from tqdm import tqdm

import run
from common import (DTYPES, SDPA_BACKENDS, UserError, append_line, auto_cpu_dtype, flops_per_token, main_guard,
                    model_config, parse_config, peak_flops, resolve_dtype, save_checkpoint, saved_config, sdpa_backend)
from model import CLAIM_B, GPT, OPERATOR_DEFAULTS, OPERATOR_KEYS, OPERATORS, gamma_delta, in_corridor
from sources import Data, check_tokenizer, load_checkpoint, load_model, model_from_checkpoint

# default config: GPT-2 124M on OpenWebText, nanoGPT's key names
DEFAULTS = dict(
    # I/O
    out_dir='out',                 # the run folder: config.json, log.jsonl, ckpt.pt
    eval_interval=2000,            # evaluate (train and val loss), log and checkpoint every this many iterations
    log_interval=1,                # a console line (batch loss, speed, ETA, where the heads are) every this many iterations
    eval_iters=200,                # batches per split in each evaluation (the same batches at every evaluation)
    eval_only=False,               # evaluate the initial or resumed model once, then exit
    always_save_checkpoint=True,   # False: ckpt.pt only when val loss improves
    snapshot_interval=0,           # also keep ckpt_<iter>.pt at evals every this many iters (0: never)
    init_from='scratch',           # 'scratch', 'resume' (out_dir/ckpt.pt), 'gpt2', 'gpt2-medium', ... or a pretrained
                                   # causal LM: smollm2-135m, gemma3-270m, a .gguf file, a transformers folder
    train_only='all',              # 'operator': freeze every pretrained weight, train the operator's scalars only
    overwrite=False,               # a scratch run into an out_dir that holds a checkpoint needs this
    walk_interval=0,               # evals at multiples of this also log the connection-walk geometry (0: never)
    walk_seqs=32,                  # ... on this many fixed validation sequences of min(64, block_size) tokens
    wandb_log=False,               # also log to Weights & Biases what log.jsonl gets
    wandb_project='corridor-gpt',  # Weights & Biases project
    wandb_run_name='run',          # Weights & Biases run name
    # data: data_root/dataset/{train,val}.bin from prepare.py
    data_root='data',              # where prepare.py wrote the datasets
    dataset='openwebtext',         # the folder under data_root (shakespeare_char, wikitext2_char, openwebtext, ...)
    gradient_accumulation_steps=40,  # ×12×1024 ≈ 0.5M tokens per iteration (split across DDP ranks)
    batch_size=12,                 # sequences per micro-batch
    block_size=1024,               # context length in tokens
    # model (the vocabulary comes from the data's meta.json, padded to a multiple of 64 by the model itself)
    n_layer=12,                    # transformer blocks
    n_head=12,                     # attention heads per block
    n_embd=768,                    # width of the residual stream
    dropout=0.0,                   # on attention, residual and embedding outputs
    bias=False,                    # biases in Linears and LayerNorms (GPT-2 has them)
    # the attention operator (model.py: GPTConfig's keys, OPERATORS' entries say which each form reads)
    **OPERATOR_DEFAULTS,
    # AdamW
    learning_rate=6e-4,            # peak learning rate
    max_iters=600000,              # optimizer steps in the run
    weight_decay=1e-1,             # on the ≥2-D weights only (not the operator's scalars: model.configure_optimizers)
    label_smoothing=0.0,           # the training loss's (model.lm_loss); evaluations report plain cross-entropy
    beta1=0.9,                     # AdamW's decay rate of the gradient's mean
    beta2=0.95,                    # ... and of its square
    grad_clip=1.0,                 # 0: no clipping
    # learning rate: linear warmup, cosine decay to min_lr at lr_decay_iters
    decay_lr=True,                 # False: learning_rate throughout
    warmup_iters=2000,             # linear warmup over this many iterations
    lr_decay_iters=600000,         # the cosine reaches min_lr here (nanoGPT: ~max_iters)
    min_lr=6e-5,                   # the cosine's floor (nanoGPT: ~learning_rate / 10)
    # system
    device='cuda' if torch.cuda.is_available() else 'cpu',  # 'cpu', 'cuda', 'cuda:N', or 'mps' (Apple silicon)
    dtype='auto',                  # 'auto': bfloat16 where the GPU has it natively, else float16; on a CPU bfloat16
                                   # where it has bf16 units and n_embd >= 256, else float32 (the header says); MPS float32
    compile=True,                  # torch.compile the model (Inductor; slower to start, faster per step on a GPU)
    sdpa_backend='auto',           # F.scaled_dot_product_attention's kernel: auto (PyTorch's pick), flash, efficient,
                                   # cudnn or math; one that can't run this model here fails at the start, in one line
    backend='auto',                # DDP: 'auto' = nccl on GPU, gloo on CPU
    seed=1337,                     # initial weights, batch order, dropout
)
# what a resumed run can't change (block_size may shrink: it is checked against the model's positions)
ARCHITECTURE_KEYS = ('n_layer', 'n_head', 'n_embd', 'bias') + tuple(k for k in OPERATOR_KEYS if k != 'operator_lr_mult')
# keys nanoGPT users set that this script takes from elsewhere
HINTS = dict(vocab_size="vocab_size comes from the data's meta.json, and the model pads its embedding to a multiple "
                        "of 64 by itself (50257 -> 50304): drop vocab_size")


def resolve_config(argv):
    """(cfg, checkpoint or None, the keys the user set): a resume starts from its saved config, its architecture
    fixed; a key a config file or the command line set is honoured or refused, whatever its value."""
    config, ckpt = parse_config(DEFAULTS, argv, hints=HINTS), None
    if config['init_from'] == 'resume':
        path = os.path.join(config['out_dir'], 'ckpt.pt')
        ckpt = load_checkpoint(path, purpose='resume')
        saved, ignored = saved_config(DEFAULTS, ckpt['config'], f"{path}'s config")
        if ignored:
            print(f"{path}'s config has keys this train.py does not know, left out: {', '.join(ignored)}")
        config = parse_config(saved, argv, hints=HINTS)
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
    kind, _, index = cfg.device.partition(':')
    non_finite = [k for k, v in config.items() if isinstance(v, float) and not math.isfinite(v)]
    for wrong, message in (
            (non_finite, f"{', '.join(non_finite)} must be finite, got "
                         f"{', '.join(repr(config[k]) for k in non_finite)}"),
            (not 0 <= cfg.label_smoothing < 1, f"label_smoothing must be in [0, 1), got {cfg.label_smoothing}"),
            (min(cfg.max_iters, cfg.snapshot_interval, cfg.warmup_iters, cfg.walk_interval) < 0,
             "max_iters, snapshot_interval, warmup_iters and walk_interval must be >= 0"),
            (min(cfg.learning_rate, cfg.min_lr, cfg.weight_decay, cfg.grad_clip) < 0,  # a negative grad_clip flips
             "learning_rate, min_lr, weight_decay and grad_clip must be >= 0"),      # the gradients, silently
            (not (0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1),
             f"beta1 and beta2 must be in [0, 1), got {cfg.beta1} and {cfg.beta2}"),
            (cfg.walk_interval % cfg.eval_interval, f"walk_interval={cfg.walk_interval} must be a multiple of "
             f"eval_interval={cfg.eval_interval} (the geometry is logged at evaluations)"),
            (cfg.decay_lr and cfg.lr_decay_iters <= cfg.warmup_iters, f"lr_decay_iters={cfg.lr_decay_iters} must "
             f"exceed warmup_iters={cfg.warmup_iters} (or --decay_lr=False)"),
            (cfg.sdpa_backend not in SDPA_BACKENDS,
             f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {cfg.sdpa_backend!r}"),
            (cfg.dtype not in DTYPES, f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {cfg.dtype!r}"),
            (cfg.train_only not in ('all', 'operator'),
             f"train_only must be 'all' or 'operator', got {cfg.train_only!r}"),
            (cfg.train_only == 'operator' and cfg.init_from == 'scratch',
             "train_only='operator' freezes pretrained weights: give --init_from=SOURCE (gpt2, smollm2-135m, a .gguf "
             "file or a transformers folder)"),
            (kind not in ('cpu', 'cuda', 'mps') or (index and not (kind == 'cuda' and index.isdigit())),
             f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {cfg.device!r}"),
            (kind == 'mps' and cfg.dtype == 'float16', "dtype='float16' needs a grad scaler, which this code runs on "
             "CUDA only: on mps use float32 (the default) or bfloat16")):
        if wrong:
            raise UserError(message)
    return cfg, ckpt, config.given


def build_model(cfg, data, ckpt, given):
    """From the checkpoint, from scratch, or from weights: a run folder's, or pretrained (GPT-2 as our GPT, another
    causal LM as lab.pretrained's) with the configured operator and train_only; it must read the data as tokenized and
    fit its context. Keys the weights fix take the weights' values; one the user set to another value is refused."""
    if ckpt is not None:  # the architecture stays; dropout and operator_lr_mult are training settings it may change
        model = model_from_checkpoint(ckpt, dropout=cfg.dropout, operator_lr_mult=cfg.operator_lr_mult)
        model.source = ckpt.get('source')
    elif cfg.init_from == 'scratch':
        model = GPT(model_config({**vars(cfg), 'vocab_size': data.meta['vocab_size']}))
        model.source = None
    else:
        model, _ = load_model(cfg.init_from, dropout=cfg.dropout, **run.run_folder_operator(cfg, given))
        if cfg.dropout and not isinstance(model, GPT):
            raise UserError(f"dropout: {cfg.init_from} keeps its own (attention_dropout in its config.json); leave "
                            f"--dropout at 0")
        shape = {key: getattr(model.config, key) for key in ('n_layer', 'n_head', 'n_embd', 'bias')}
        wrong = [key for key, value in shape.items() if key in given and getattr(cfg, key) != value]
        if wrong:
            raise UserError(f"{', '.join(f'{k}={getattr(cfg, k)!r}' for k in wrong)} set, but {cfg.init_from}'s weights "
                            f"have {', '.join(f'{k}={shape[k]!r}' for k in wrong)}: a start from weights keeps their "
                            f"shape; pass {' '.join(f'--{k}={run.config_text(shape[k])}' for k in wrong)} or leave "
                            f"{', '.join(wrong)} out of the command line and config files")
        vars(cfg).update(shape)  # the model's own, so the saved config tells the truth
        model.source = cfg.init_from  # where the weights came from: the checkpoint names it
    if cfg.train_only == 'operator':
        if not model.operator_parameters():
            raise UserError(f"train_only='operator', but operator={cfg.operator!r} has no learnable scalars "
                            f"({', '.join(name for name, form in OPERATORS.items() if form.learnable)} have)")
        for p in model.parameters():
            p.requires_grad_(any(p is q for q in model.operator_parameters()))
    check_tokenizer(model, data.meta, data.dir)
    if cfg.walk_interval and not isinstance(model, GPT):
        raise UserError(f"walk_interval logs our GPT's geometry; for {model.source} run python -m lab.walk on the run "
                        f"folder after training (--walk_interval=0)")
    if cfg.block_size > model.config.block_size:
        raise UserError(f"block_size={cfg.block_size} exceeds the model's {model.config.block_size} positions")
    return model


# ------------------------------------------------------------------------------------------------------------
# the pieces of the loop: learning rate, evaluation, what an evaluation logs

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
    """Mean loss over eval_iters batches per split, the same batches at every evaluation and in every run of a seed
    (curves and variants compare without sampling noise). Under DDP each process evaluates its share."""
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
            torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def operator_summary(model):
    """Where the heads are, for the log lines: '' for plain attention (no scalars), else mean γ and δ, and the share
    of heads claim (b) counts in the corridor (−1 < γ < −0.05), beside the corridor's (−1 < γ < 0), over every head."""
    if model.config.operator == 'attention':
        return ''
    gamma, delta = gamma_delta(model.operator_coefficients())
    deep, corridor = (in_corridor(gamma, below).float().mean().item() for below in (CLAIM_B, 0.0))
    return f" | γ̄ {gamma.mean():+.3f} δ̄ {delta.mean():.3f}, heads at −1 < γ < −{-CLAIM_B:g}: {deep:.0%} " \
           f"(−1 < γ < 0: {corridor:.0%})"


def log_evaluation(cfg, iter_num, lr, losses, model, progress, data, logger, save):
    """Rank 0's record of an evaluation: its line on the console, its entry in log.jsonl (everything an evaluation
    records: a new per-evaluation diagnostic is one more key here, analyze.py reads them), W&B, the checkpoint."""
    improved = losses['val'] < progress['best_val_loss']
    progress['best_val_loss'] = min(progress['best_val_loss'], losses['val'])  # only ever goes down
    coefficients = model.operator_coefficients()  # [layers, heads, (c_I, c_P)]
    gamma, delta = gamma_delta(coefficients)
    entry = dict(iter=iter_num, tokens=progress['tokens_seen'], train_loss=losses['train'], val_loss=losses['val'],
                 best_val_loss=progress['best_val_loss'], lr=lr, gamma=gamma.tolist(), delta=delta.tolist(),
                 c_I=coefficients[..., 0].tolist(), c_P=coefficients[..., 1].tolist())
    if cfg.walk_interval and iter_num % cfg.walk_interval == 0:
        from lab.connection import walk_geometry, walk_sequences  # only a run with walk_interval > 0 needs the lab
        entry['walk'] = walk_geometry(model, walk_sequences(data, cfg.walk_seqs, cfg.seed))
    tqdm.write(f"eval {iter_num}/{cfg.max_iters}: train {losses['train']:.4f}, val {losses['val']:.4f} (best "
               f"{progress['best_val_loss']:.4f}){operator_summary(model)}")
    append_line(os.path.join(cfg.out_dir, 'log.jsonl'), json.dumps(entry))
    if logger:
        logger.evaluation(entry)
    if iter_num > 0 and (improved or cfg.always_save_checkpoint):
        save(os.path.join(cfg.out_dir, 'ckpt.pt'))
    if cfg.snapshot_interval and iter_num % cfg.snapshot_interval == 0:
        save(os.path.join(cfg.out_dir, f'ckpt_{iter_num:07d}.pt'))


# ------------------------------------------------------------------------------------------------------------
# the run

def optimizer_step(model, optimizer, scaler, data, offsets, autocast, cfg, ddp):
    """One optimizer step: the gradients of the micro-batches at offsets accumulated (under DDP all-reduced on the
    last one only), clipped, applied. Returns their summed loss, on the device (read only at a log line)."""
    total, x, y = 0.0, *data.batch('train', offsets[0])
    for micro_step in range(len(offsets)):
        if ddp:
            model.require_backward_grad_sync = micro_step == len(offsets) - 1
        with autocast:  # the training loss: label_smoothing reaches it, never estimate_loss's
            _, loss = model(x, y, **({'label_smoothing': cfg.label_smoothing} if cfg.label_smoothing else {}))
            loss = loss / len(offsets)
        if micro_step + 1 < len(offsets):
            x, y = data.batch('train', offsets[micro_step + 1])  # loaded while the device computes
        scaler.scale(loss).backward()
        total = total + loss.detach()
    if cfg.grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


def main(argv):
    """Exit status 0 when the run finished, 128 + the signal's number when Ctrl-C / SIGTERM stopped it."""
    with ExitStack() as held:  # the processes, the run folder's lock, the SDPA kernel: however the run ends
        status = train(argv, held)
    if status:
        sys.exit(status)


def train(argv, held):
    """Config, processes, data, model and optimizer; then the loop. Returns main's exit status."""
    cfg, ckpt, given = resolve_config(argv)
    ddp, rank, world, device = held.enter_context(run.processes(cfg))
    torch.manual_seed(cfg.seed)  # the same initial model on every rank: DDP does not broadcast the fixed scalars
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if not ddp:  # (under torchrun, prepare first: ranks would race to write the same folder)
        run.prepare_if_missing(cfg)
    data = Data(cfg.data_root, cfg.dataset, cfg.block_size, cfg.batch_size, device)
    # Every process draws the same global batch from this generator and takes its own rows of it, so a DDP run
    # sees exactly the batches of one process with the same gradient_accumulation_steps.
    data_rng = torch.Generator().manual_seed(cfg.seed)
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    raw_model, resumed = build_model(cfg, data, ckpt, given).to(device), ckpt is not None
    dtype, device_type = resolve_dtype(cfg.dtype, device, raw_model.config.n_embd), device.split(':')[0]
    why = f" (auto: {auto_cpu_dtype(raw_model.config.n_embd)[1]})" if cfg.dtype == 'auto' and device == 'cpu' else ''
    autocast = nullcontext() if dtype == 'float32' else torch.autocast(device_type, getattr(torch, dtype))
    if rank > 0:  # built from one seed on every rank; each its own dropout masks from here
        torch.manual_seed(cfg.seed + rank)
    held.enter_context(sdpa_backend(cfg.sdpa_backend, raw_model, cfg.block_size, device, dtype, autocast))
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
    # seconds: this run's wall time over every resume (in ckpt.pt; log.jsonl's lines are an uninterrupted run's)
    progress = run.restore_state(ckpt, optimizer, scaler, data_rng, cfg, device, rank) if resumed else \
        dict(iter_num=0, tokens_seen=0, best_val_loss=float('inf'), seconds=0.0)
    ckpt = None  # the checkpoint's host copy of the weights and moments: gone now
    compiled = torch.compile(raw_model) if cfg.compile else raw_model
    model = run.wrap_ddp(compiled, device) if ddp else compiled
    if cfg.eval_only:
        losses = estimate_loss(compiled, data, cfg, autocast, rank, world)
        if rank == 0:
            print(f"iter {progress['iter_num']}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        return 0
    iter_num = start_iter = progress['iter_num']
    logger = run.open_run_folder(cfg, DEFAULTS, resumed, start_iter, held) if rank == 0 else None
    if rank == 0:
        print(f"{raw_model.get_num_params() / 1e6:.2f}M parameters, operator {cfg.operator}, {tokens_per_iter:,} tokens"
              f" per iteration, {device}, {dtype}{why}, {world} process(es)" + f", resuming at iter {start_iter}" * resumed)
    window = run.LogWindow(device, cfg.max_iters, flops_per_token(raw_model, cfg.block_size, cfg.train_only == 'all')
                           * tokens_per_iter, tokens_per_iter, world, peak_flops(device, dtype))

    def save(path):
        save_checkpoint(run.checkpoint_state(raw_model, optimizer, scaler, cfg, data.meta, progress, data_rng, device),
                        path)

    # --- the loop ---------------------------------------------------------------------------------------------
    stop_request, stop, started = run.StopRequest(rank == 0), False, time.time()
    bar = tqdm(total=cfg.max_iters, initial=iter_num, disable=rank > 0 or not sys.stderr.isatty(), dynamic_ncols=True)
    while True:
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr * group['lr_mult']
        # evaluate, log, checkpoint (a resumed run's first evaluation is in its log already)
        if (iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters) and not (resumed and iter_num == start_iter):
            losses = estimate_loss(compiled, data, cfg, autocast, rank, world)
            if not all(math.isfinite(v) for v in losses.values()):
                raise run.TrainingStopped(f"evaluation at iter {iter_num} gave {losses}; stopped without saving: "
                                          f"{run.last_good_state(cfg.out_dir)}")
            if rank == 0:
                log_evaluation(cfg, iter_num, lr, losses, raw_model, progress, data, logger, save)
            window.restart_clock()  # tokens/s and MFU count training steps only
        if iter_num >= cfg.max_iters or stop:
            break

        # one optimizer step on the global batch, this process's micro-batches of it
        offsets = data.offsets('train', cfg.gradient_accumulation_steps, data_rng).chunk(world)[rank]
        window.loss += optimizer_step(model, optimizer, scaler, data, offsets, autocast, cfg, ddp)
        iter_num += 1
        progress.update(iter_num=iter_num, tokens_seen=progress['tokens_seen'] + tokens_per_iter,
                        seconds=progress['seconds'] + window.step_done(iter_num))
        bar.update(1)

        # The device runs ahead of the host between log lines, where they meet: the window's loss over processes,
        # and whether any was asked to stop (one all-reduce; under DDP every process stops at the same iteration).
        at_log_line = iter_num % cfg.log_interval == 0
        if at_log_line or (stop_request.seen and not ddp) or iter_num == cfg.max_iters:
            lossf, stop = window.meet(stop_request.seen, ddp)
            if not math.isfinite(lossf):
                raise run.TrainingStopped(f"loss is {lossf} at iter {iter_num}; stopped: {run.last_good_state(cfg.out_dir)}"
                                          f" (try a lower learning_rate, or bfloat16, not float16)")
            if rank == 0 and at_log_line:
                tqdm.write(f"iter {iter_num}/{cfg.max_iters}: batch loss {lossf:.4f}, lr {lr:.2e}"
                           f"{window.speed(iter_num)}{operator_summary(raw_model)}")
                if logger:
                    logger.log_line(iter_num, lossf, lr)
            window.reset()  # after the line: its speed reads this window's clock
    bar.close()
    return run.finish(cfg, rank, world, stop_request if stop else None, save, logger, progress, resumed, started)


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
