"""
Speed and memory of the operator family, measured in one run: every timed step alternates between the variants
(attention, corridor, attention, corridor, ...), each round in the reverse order of the one before. A ratio is the
geometric mean of the rounds' paired ratios with its 95 % CI (a t-interval of the per-round log-ratios); tokens/s
is tokens over a variant's geometric mean round time, so that two rows' tokens/s have exactly their ratio.

    python -m lab.bench                  # CPU-sized: every form eager and compiled, fast vs math path, KV cache, walk
    python -m lab.bench --preset gpu     # one H100/H200 in about 9 minutes: GPT-2 124M in bf16, MFU, short train.py runs
    python -m lab.bench --preset tiny    # seconds, what the tests run
    python -m lab.bench --preset corridor_settled --pairs_csv docs/per_seed/throughput.csv
                                     # the corridor_settled study's model, batch and thread: 8 minutes, ratios ±0.7 %
    python -m lab.bench --baseline HEAD~1 --forms attention,corridor --skip epilogue,train_runs,paths,kv_cache,walk
                                     # what a change to model.py costs, both versions interleaved

The corridor's cost beyond attention, compiled, is also counted rather than timed: the bytes Inductor's kernels
read and write for one layer, forward and backward, and the GPU throughput ratio they predict for GPT-2 124M.

Memory: on a GPU the peak allocated by the step (torch.cuda.max_memory_allocated); on CPU, which has no
allocator statistics, the bytes autograd keeps for backward (deduplicated by storage), the part of a training
step's memory an attention operator can change. Results also go to bench_<preset>.json in --out_dir.
"""

import argparse
import contextlib
import csv
import importlib.util
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from common import PEAK_FLOPS, REPO, UserError, atomic_write, flops_per_token, peak_flops, sdpa_backend, synchronize
from lab.connection import connection_diagnostics, head_weights
from lab.stats import log_ratio_test
from model import GPT, OPERATORS, CausalSelfAttention, GPTConfig

PRESETS = {
    # model, batch and context for the training step; rounds × steps timed per variant; train_runs: train.py itself
    'tiny': dict(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=256, batch_size=2, rounds=2, steps=1,
                 forms=('attention', 'corridor'), modes=('eager', 'compiled'), dtype='float32',
                 path_lengths=(128, 256), path_layers=1, new_tokens=16, walk=dict(n_embd=32, n_head=4, seq_len=16, edges=4),
                 train_runs=dict(config=None, tokens=20_000, args=(
                     '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=64', '--batch_size=2',
                     '--gradient_accumulation_steps=1', '--max_iters=4', '--lr_decay_iters=4', '--warmup_iters=1',
                     '--eval_interval=4', '--eval_iters=1', '--log_interval=2', '--compile=False'))),
    'cpu': dict(n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=512, batch_size=8, rounds=7, steps=3,
                forms=tuple(OPERATORS), modes=('eager', 'compiled'),  # every form of model.py's table
                dtype='float32', path_lengths=(1024, 2048), path_layers=2, new_tokens=256,
                walk=dict(n_embd=768, n_head=12, seq_len=64, edges=6)),
    # the corridor_settled study's runs (configs/_sweep_cpu.py on WikiText-2 (char), whose vocabulary has 409
    # characters): trained two at a time on 2 cores, one thread each (lab/sweep.py --parallel=2), so timed on one.
    # Many rounds of one step: a pair's two timings a tenth of a second apart, so the other core's load, which
    # changes over seconds, falls on both; one step's ratio still scatters by ~11 %, hence the 1,000 rounds
    'corridor_settled': dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=409, bias=False, batch_size=12,
                             rounds=1000, steps=1, threads=1, forms=('attention', 'corridor'),
                             modes=('eager', 'compiled'), dtype='float32',
                             skip=('epilogue', 'train_runs', 'paths', 'kv_cache', 'walk'),  # not the study's question
                             path_lengths=(1024, 2048), path_layers=2, new_tokens=256,
                             walk=dict(n_embd=128, n_head=4, seq_len=64, edges=6)),
    # GPT-2 124M at train.py's micro-batch (configs/owt_gpt2_124m.py: 12 × 1024)
    'gpu': dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, bias=False, batch_size=12, rounds=5,
                steps=10, forms=('attention', 'corridor'), modes=('eager', 'compiled'), dtype='bfloat16',
                path_lengths=(1024, 2048), path_layers=12, new_tokens=256,
                walk=dict(n_embd=768, n_head=12, seq_len=64, edges=20),
                # 60 iterations of 10 micro-steps (123k tokens each), compiled: about 2 minutes per run on an H100
                train_runs=dict(config='configs/owt_gpt2_124m.py', tokens=8_000_000, args=(
                    '--gradient_accumulation_steps=10', '--max_iters=60', '--lr_decay_iters=60', '--warmup_iters=10',
                    '--eval_interval=60', '--eval_iters=5', '--log_interval=10', '--snapshot_interval=0',
                    '--compile=True'))),
}

# The GPU ratio the corridor's extra memory traffic predicts, for GPT-2 124M as train.py trains it: micro-batch
# 12 × 1024 in bf16. Peak HBM bandwidth from NVIDIA's data sheets; the attention micro-step those bytes are
# weighed against is an assumption until a GPU run measures it: GPT-2 124M's training FLOPs at 35-50 % MFU of the
# dense bf16 peak, the same on both (README, "First GPU run").
GPT2_MICRO_BATCH = dict(batch_size=12, block_size=1024, dtype_bytes=2)
BANDWIDTH = {'H100 SXM': 3.35e12, 'H200': 4.8e12}
ASSUMED_MFU = (0.35, 0.50)


class Memory:
    """Peak memory of what runs inside `with Memory(device) as m:`, in bytes (see the module docstring)."""

    def __init__(self, device):
        self.device, self.storages, self.bytes = device, {}, 0

    def _pack(self, t):
        storage = t.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    def __enter__(self):
        if self.device.startswith('cuda'):
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.startswith('cuda'):
            synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.hooks.__exit__(*exc)
            self.bytes = sum(self.storages.values())


def timed(fn, device, repeats=1):
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / repeats


# the aten ops behind F.scaled_dot_product_attention's backends (their _backward twins count too)
SDPA_KERNEL_OPS = {'_scaled_dot_product_flash_attention': 'flash', '_scaled_dot_product_flash_attention_for_cpu': 'flash',
                   '_scaled_dot_product_efficient_attention': 'efficient',
                   '_scaled_dot_product_cudnn_attention': 'cudnn', '_scaled_dot_product_attention_math': 'math'}


def sdpa_kernels(fn):
    """The SDPA backends fn() runs (sorted names: flash, efficient, cudnn, math), from the aten ops the profiler
    records: what actually ran, whatever the priority list says."""
    from torch.profiler import ProfilerActivity, profile
    sys.stderr.flush()
    saved = os.dup(2)
    try:  # the profiler's C++ side announces its start and stop on stderr: not for the reader
        with open(os.devnull, 'w') as null:
            os.dup2(null.fileno(), 2)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    names = {event.name.removeprefix('aten::') for event in prof.events()}
    return sorted({kernel for op, kernel in SDPA_KERNEL_OPS.items() if op in names or f'{op}_backward' in names})


def throughput_ratio(times_a, times_b):
    """b's throughput relative to a's, rounds paired: (ratio, CI low, CI high), the geometric mean over rounds of
    time(a) / time(b) and its 95 % t-interval from the per-round log-ratios (NaN with one round), over batch means of
    consecutive rounds once there are 40 or more (lab/stats.log_ratio_test: neighbouring rounds share the load). A
    log-ratio, not a ratio: a round twice as slow and one twice as fast cancel."""
    test = log_ratio_test(times_a, times_b)
    return math.exp(test.mean), math.exp(test.low), math.exp(test.high)


def per_second(amount, times):
    """amount over the rounds' geometric mean time: two variants' quotient is their throughput_ratio."""
    return amount / statistics.geometric_mean(times)


def fmt_ratio(ratio):
    return f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]"


# ---------------------------------------------------------------------------------------------- training step

def load_baseline(spec):
    """model.py of another revision (`--baseline HEAD~1`) or file (`--baseline old/model.py`), as a module: the
    training step of both is timed in one run, interleaved, to show what a change to model.py costs."""
    path = spec
    if not os.path.isfile(spec):
        try:
            source = subprocess.run(['git', 'show', f'{spec}:model.py'], capture_output=True, text=True, check=True,
                                    cwd=REPO).stdout
        except (OSError, subprocess.CalledProcessError):
            sys.exit(f"error: --baseline {spec!r} is neither a file nor a git revision with a model.py")
        path = os.path.join(tempfile.mkdtemp(), 'model_baseline.py')
        with open(path, 'w') as f:
            f.write(source)
    module_spec = importlib.util.spec_from_file_location('model_baseline', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def bench_training(p, device, autocast, results, baseline=None, versus=None):
    """Training-step throughput, memory and (GPU) MFU of every form, eager and compiled, interleaved; with a
    baseline model module (load_baseline), the same variants built from it too, same weights, same rounds; with
    versus (an autocast for another dtype, p['versus_dtype']), the same variants in that dtype too, likewise.

    The compiled variants are the graphs train.py runs: static shapes. Dynamo marks a dimension dynamic once it
    has seen the same code (GPT.forward, whatever the model object) at two sizes, so an earlier compile in this
    process at another batch size would otherwise make these graphs dynamic in the batch dimension."""
    torch._dynamo.reset()
    variants = {}
    sources = {'': sys.modules[GPT.__module__]} | ({'baseline': baseline} if baseline else {}) | \
        ({p.get('versus_dtype'): sys.modules[GPT.__module__]} if versus else {})
    autocasts = {'': autocast, 'baseline': autocast, p.get('versus_dtype'): versus}
    for mode in p['modes']:  # a mode's forms side by side: the two timings of a ratio are neighbours in every round
        for form in p['forms']:
            for tag, module in sources.items():
                torch.manual_seed(0)
                model = module.GPT(module.GPTConfig(
                    n_layer=p['n_layer'], n_head=p['n_head'], n_embd=p['n_embd'], block_size=p['block_size'],
                    vocab_size=p['vocab_size'], bias=p.get('bias', True), operator=form,
                    **(dict(gamma_init=-0.3, init_spread=0.2) if module.OPERATORS[form].learnable else {}))).to(device)
                optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cuda' if device.startswith('cuda') else 'cpu')
                key = (form, mode) if not tag else (form, mode, tag)
                variants[key] = (model, torch.compile(model, dynamic=False) if mode == 'compiled' else model, optimizer,
                                 tag)
    idx = torch.randint(0, p['vocab_size'], (p['batch_size'], p['block_size'] + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]

    def step(variant):
        model, run, optimizer, tag = variant
        with autocasts[tag]():
            _, loss = run(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    memory, kernels = {}, {}
    for key, variant in variants.items():  # warm-up (compiles) and memory, one variant at a time
        t0 = time.perf_counter()
        step(variant)
        warm = time.perf_counter() - t0
        with Memory(device) as m:
            step(variant)
        memory[key] = m.bytes
        kernels[key] = sdpa_kernels(lambda: step(variant))
        print(f"  warm-up {key[0]:>10} {key[1]:>8}{f' ({key[2]})' if len(key) > 2 else ''}: {warm:6.1f} s (first step, "
              f"with compile); SDPA kernel: {', '.join(kernels[key]) or 'none'}")
    times, order = {key: [] for key in variants}, list(variants.items())
    for r in range(p['rounds']):
        # attention, corridor, ... interleaved in every round, every other round reversed: a variant's place in the
        # round (which variant ran before it, what it left in the caches) cancels over two rounds
        for key, variant in order if r % 2 == 0 else order[::-1]:
            times[key].append(timed(lambda: step(variant), device, p['steps']))
    tokens = p['batch_size'] * p['block_size']
    model = next(iter(variants.values()))[0]
    peak = peak_flops(device, p['dtype'])
    print(f"\ntraining step: {model.get_num_params() / 1e6:.1f}M parameters, batch {p['batch_size']} × {p['block_size']}, "
          f"{p['dtype']}, {p['rounds']} rounds × {p['steps']} steps, {torch.get_num_threads()} threads; geometric "
          f"means, [95 % CI]")
    print(f"  {'form':>10} {'mode':>8} {'tokens/s':>12} {'vs attention':>21} {'memory MB':>10} {'vs attention':>13}"
          + ('  MFU' if peak else ''))
    for key, t in times.items():
        if len(key) > 2:  # the baseline's and the other dtype's rows: below
            continue
        form, mode = key
        tps = per_second(tokens, t)  # t: seconds a step
        speed = throughput_ratio(times[('attention', mode)], t)
        mem = memory[(form, mode)] / memory[('attention', mode)]
        mfu = f"  {flops_per_token(model, p['block_size']) * tps / peak:.1%}" if peak else ''
        print(f"  {form:>10} {mode:>8} {tps:>12,.0f} {fmt_ratio(speed):>21} {memory[(form, mode)] / 2**20:>10.1f} "
              f"{mem:>13.3f}{mfu}")
        results['training'][f'{form}/{mode}'] = dict(tokens_per_s=tps, throughput_vs_attention=speed[0],
                                                    throughput_vs_attention_ci=list(speed[1:]),
                                                    round_seconds=[s * p['steps'] for s in t],  # each round's steps
                                                    memory_bytes=memory[(form, mode)], memory_vs_attention=mem,
                                                    sdpa_kernels=kernels[(form, mode)],
                                                    mfu=flops_per_token(model, p['block_size']) * tps / peak if peak else None)
    if baseline:
        print("\n  against the baseline model.py (the same variants, interleaved in every round):")
        print(f"  {'form':>10} {'mode':>8} {'throughput vs baseline':>23} {'memory vs baseline':>19}")
        for form, mode in (key for key in times if len(key) == 2):
            speed = throughput_ratio(times[(form, mode, 'baseline')], times[(form, mode)])
            mem = memory[(form, mode)] / memory[(form, mode, 'baseline')]
            print(f"  {form:>10} {mode:>8} {fmt_ratio(speed):>23} {mem:>19.3f}")
            results['training'][f'{form}/{mode}'].update(throughput_vs_baseline=speed[0],
                                                         throughput_vs_baseline_ci=list(speed[1:]), memory_vs_baseline=mem)
    if versus:
        other = p['versus_dtype']
        print(f"\n  {p['dtype']} against {other} (the same variants in {other}, interleaved in every round):")
        print(f"  {'form':>10} {'mode':>8} {other + ' tokens/s':>17} {'throughput vs ' + other:>23} "
              f"{'memory vs ' + other:>19}")
        for form, mode in (key for key in times if len(key) == 2):
            speed = throughput_ratio(times[(form, mode, other)], times[(form, mode)])
            mem = memory[(form, mode)] / memory[(form, mode, other)]
            print(f"  {form:>10} {mode:>8} {per_second(tokens, times[(form, mode, other)]):>17,.0f} "
                  f"{fmt_ratio(speed):>23} {mem:>19.3f}")
            results['training'][f'{form}/{mode}'].update(versus_dtype=other, throughput_vs_dtype=speed[0],
                                                         throughput_vs_dtype_ci=list(speed[1:]),
                                                         memory_vs_dtype=mem)


def headline(results):
    r = results['training']['corridor/compiled']
    return f"ratio corridor/attention (compiled): {fmt_ratio([r['throughput_vs_attention'], *r['throughput_vs_attention_ci']])}"


PAIRS_COLUMNS = ('mode', 'pair', 'attention_seconds', 'corridor_seconds', 'steps', 'tokens_per_step', 'threads',
                 'torch', 'device')


def write_pairs(path, p, results):
    """The training step's round times, attention and corridor, one row per (mode, round): *_seconds is the wall
    time of `steps` training steps (forward, backward, AdamW step), so that anyone can recompute the ratios."""
    rows = [dict(mode=mode, pair=i, attention_seconds=f'{ta:.6f}', corridor_seconds=f'{tc:.6f}', steps=p['steps'],
                 tokens_per_step=p['batch_size'] * p['block_size'], threads=results['threads'], torch=results['torch'],
                 device=results['device'])
            for mode in p['modes']
            for i, (ta, tc) in enumerate(zip(results['training'][f'attention/{mode}']['round_seconds'],
                                             results['training'][f'corridor/{mode}']['round_seconds']))]
    with atomic_write(path) as f:
        writer = csv.DictWriter(f, PAIRS_COLUMNS, lineterminator='\n')
        writer.writeheader()
        writer.writerows(rows)


# ---------------------------------------------------------------------------------------------- epilogue traffic

class InductorBytes:
    """`with InductorBytes() as count:` Inductor's own estimate of the bytes its generated kernels read and write
    (each buffer once per fused kernel, the whole buffer or the part the kernel indexes: what
    TORCH_LOGS=inductor_metrics prints), summed over the graphs compiled inside, in count.bytes; count.kernels:
    how many kernels Inductor generated itself (matmuls and attention are library calls: their bytes count, they
    don't)."""

    def __enter__(self):
        from torch._functorch import config as aot_config
        from torch._inductor import config, metrics
        self.metrics, self.stack = metrics, contextlib.ExitStack()
        # a cached graph is not generated again, and so not counted
        self.stack.enter_context(config.patch(fx_graph_cache=False))
        self.stack.enter_context(aot_config.patch(enable_autograd_cache=False))
        log = logging.getLogger('torch._inductor.compile_fx.__inductor_metrics')  # at INFO, Inductor counts
        handler, level, propagate = logging.NullHandler(), log.level, log.propagate
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
        self.stack.callback(lambda: (log.removeHandler(handler), log.setLevel(level),
                                     setattr(log, 'propagate', propagate)))
        metrics.reset()
        return self

    def __exit__(self, *exc):
        from torch._inductor.scheduler import ExternKernelSchedulerNode, NopKernelSchedulerNode
        self.bytes = self.metrics.num_bytes_accessed
        self.kernels = sum(not isinstance(node, (ExternKernelSchedulerNode, NopKernelSchedulerNode))
                           for node, _ in self.metrics.nodes_num_elem)
        self.stack.close()


def epilogue_traffic(p, device, autocast, results):
    """The corridor's memory traffic beyond attention's, compiled, counted from Inductor's kernels for one layer
    (the preset's width, batch 1 × block_size) forward and backward, in [B, T, C] activations; then the GPU
    throughput ratio that traffic predicts for GPT-2 124M (the constants above)."""
    B, T, C = 1, p['block_size'], p['n_embd']
    counts = {}
    for form in ('attention', 'corridor'):
        torch.manual_seed(0)
        torch._dynamo.reset()
        layer = CausalSelfAttention(GPTConfig(n_layer=1, n_head=p['n_head'], n_embd=C, block_size=T, operator=form,
                                              **(dict(gamma_init=-0.3) if form == 'corridor' else {}))).to(device)
        x = torch.randn(B, T, C, device=device, requires_grad=True)  # a block's attention input needs a gradient
        compiled = torch.compile(layer, dynamic=False)
        with InductorBytes() as forward, autocast():
            out = compiled(x)[0]
        with InductorBytes() as backward:
            out.backward(torch.randn_like(out))
        counts[form] = forward, backward
        unit = B * T * C * out.element_size()  # one [B, T, C] activation in the dtype autocast gives
    torch._dynamo.reset()
    (fa, ba), (fc, bc) = counts['attention'], counts['corridor']
    forward, backward = (fc.bytes - fa.bytes) / unit, (bc.bytes - ba.bytes) / unit
    backend = 'Triton' if device.startswith('cuda') else f"{torch._inductor.config.cpu_backend} (CPU)"
    print(f"\ncorridor epilogue, compiled: bytes read and written by Inductor's {backend} kernels, one layer "
          f"(width {C}, {p['n_head']} heads, {B} × {T}, {p['dtype']}), beyond attention's:")
    print(f"  forward  +{forward:.2f} [B, T, C] activations, {fc.kernels - fa.kernels:+d} kernels\n"
          f"  backward +{backward:.2f} [B, T, C] activations, {bc.kernels - ba.kernels:+d} kernels")
    # the prediction: those bytes at GPT-2 124M's micro-batch, at peak bandwidth, against an attention micro-step
    with torch.device('meta'):
        gpt2 = GPT(GPTConfig())  # GPT-2 124M; on 'meta', nothing is allocated
    m = GPT2_MICRO_BATCH
    tokens = m['batch_size'] * m['block_size']
    extra_bytes = (forward + backward) * tokens * gpt2.config.n_embd * m['dtype_bytes'] * gpt2.config.n_layer
    peak = PEAK_FLOPS['H100']['bfloat16']  # = H200's
    step = [flops_per_token(gpt2, m['block_size']) * tokens / (peak * mfu) for mfu in ASSUMED_MFU]
    predicted = {gpu: [t / (t + extra_bytes / bandwidth) for t in step] for gpu, bandwidth in BANDWIDTH.items()}
    print(f"  GPT-2 124M, micro-batch {m['batch_size']} × {m['block_size']} in bf16, {gpt2.config.n_layer} layers: "
          f"+{extra_bytes / 1e9:.2f} GB per micro-step; against an attention micro-step of "
          f"{step[0] * 1e3:.1f}-{step[1] * 1e3:.1f} ms ({ASSUMED_MFU[0]:.0%}-{ASSUMED_MFU[1]:.0%} MFU), at peak "
          f"bandwidth:\n  predicted ratio corridor/attention (compiled): "
          + ', '.join(f"{gpu} ({BANDWIDTH[gpu] / 1e12:.2f} TB/s) {r[0]:.3f}-{r[1]:.3f}" for gpu, r in predicted.items()))
    results['epilogue'] = dict(backend=backend, shape=[B, T, C], dtype=p['dtype'], forward_activations=forward,
                               backward_activations=backward, forward_kernels=fc.kernels - fa.kernels,
                               backward_kernels=bc.kernels - ba.kernels, gpt2_extra_bytes=extra_bytes,
                               assumed_step_s=step, assumed_mfu=list(ASSUMED_MFU), predicted_ratio=predicted)


# ---------------------------------------------------------------------------------------------- train.py runs

# train.py's main in a fresh process, then the peak GPU memory it allocated (train.py doesn't report it)
TRAIN_CHILD = """
import sys, torch, common, train
common.main_guard(lambda: train.main(sys.argv[2:]))
if sys.argv[1].startswith('cuda'):
    print('peak memory', torch.cuda.max_memory_allocated(sys.argv[1]))
"""
LOG_LINE = re.compile(r"iter (\d+)/\d+: batch loss ([\d.]+), .*?([\d,]+) tok/s(?:, mfu ([\d.]+)%)?, (\d+) ms/iter")


def write_synthetic_tokens(folder, vocab_size, n_tokens, seed=0, n_phrases=1000):
    """A dataset as prepare.py writes one: 64-token phrases drawn from a fixed set of n_phrases, so that the loss
    falls from ln(vocab_size) as a model learns them; a loss that stays flat means a broken training step. (A tiny
    model learns a few phrases in a hundred steps, a GPT-2-sized one a thousand.)"""
    rng = np.random.default_rng(seed)
    phrases = rng.integers(0, vocab_size, (n_phrases, 64), dtype=np.uint16)
    os.makedirs(folder)
    for split, n in (('train', n_tokens), ('val', max(n_tokens // 10, 4096))):
        phrases[rng.integers(0, n_phrases, n // 64 + 1)].ravel()[:n].tofile(os.path.join(folder, f'{split}.bin'))
    with open(os.path.join(folder, 'meta.json'), 'w') as f:
        json.dump(dict(vocab_size=vocab_size, tokenizer='synthetic'), f)


def bench_train_runs(p, device, results, out_dir, preset):
    """train.py itself, briefly, for attention and then corridor: its compile, autocast, loop and log lines, on
    synthetic tokens. tok/s, MFU and ms/iter are the medians of its log windows (which leave out the first,
    compiling step); the runs are sequential, not interleaved, so their ratio carries the machine's drift."""
    r = p['train_runs']
    print(f"\ntrain.py runs: {r['config'] or 'the preset model'} {' '.join(r['args'])}, {p['dtype']}, "
          f"synthetic tokens")
    with tempfile.TemporaryDirectory() as root:
        write_synthetic_tokens(os.path.join(root, 'synthetic'), p['vocab_size'], r['tokens'])
        for form in ('attention', 'corridor'):
            args = [*([os.path.join(REPO, r['config'])] if r['config'] else []), *r['args'], f'--device={device}',
                    f"--dtype={p['dtype']}", f'--data_root={root}', '--dataset=synthetic', f'--operator={form}',
                    f'--out_dir={os.path.join(root, "out-" + form)}']
            log_path = os.path.join(out_dir, f'bench_{preset}_train_{form}.log')
            t0 = time.time()
            with open(log_path, 'w') as log:
                child = subprocess.Popen([sys.executable, '-c', TRAIN_CHILD, device, *args], cwd=REPO, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                lines = []
                for line in child.stdout:  # shown as it comes: a GPU run takes minutes
                    log.write(line)
                    lines.append(line)
                    if line.startswith(('iter ', 'eval ', 'error')):
                        print(f"  {form:>9}: {line.rstrip()}")
            if child.wait():
                raise RuntimeError(f"train.py --operator={form} failed (exit {child.returncode}): see {log_path}")
            windows = [m.groups() for m in map(LOG_LINE.match, lines) if m]
            memory = [int(line.split()[-1]) for line in lines if line.startswith('peak memory')]
            results['train_runs'][form] = dict(
                tokens_per_s=statistics.median(float(w[2].replace(',', '')) for w in windows),
                mfu=statistics.median(float(w[3]) / 100 for w in windows) if windows[0][3] else None,
                ms_per_iter=statistics.median(float(w[4]) for w in windows),
                first_loss=float(windows[0][1]), last_loss=float(windows[-1][1]),
                peak_memory_bytes=memory[0] if memory else None, wall_s=time.time() - t0, log=log_path)
    runs = results['train_runs']
    print(f"  {'form':>10} {'tokens/s':>12} {'vs attention':>13} {'MFU':>6} {'ms/iter':>8} {'peak memory MB':>15} "
          f"{'loss first → last':>18} {'wall s':>7}")
    for form, run in runs.items():
        print(f"  {form:>10} {run['tokens_per_s']:>12,.0f} "
              f"{run['tokens_per_s'] / runs['attention']['tokens_per_s']:>13.3f} "
              f"{format(run['mfu'], '.1%') if run['mfu'] else '-':>6} {run['ms_per_iter']:>8.0f} "
              f"{format(run['peak_memory_bytes'] / 2**20, ',.0f') if run['peak_memory_bytes'] else '-':>15} "
              f"{run['first_loss']:>8.3f} → {run['last_loss']:<7.3f} {run['wall_s']:>7.0f}")


# ---------------------------------------------------------------------------------------------- paths, cache, walk

def bench_paths(p, device, autocast, results):
    """Forward throughput and memory at long contexts: the fast path never holds a T×T matrix."""
    print(f"\nfast path vs math path, forward at long context (corridor, {p['path_layers']} layers, batch 1):")
    for length in p['path_lengths']:
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=p['path_layers'], n_head=p['n_head'], n_embd=p['n_embd'], block_size=length,
                              vocab_size=p['vocab_size'], operator='corridor', gamma_init=-0.3)).to(device)
        idx = torch.randint(0, p['vocab_size'], (1, length), device=device)
        paths = {'fast': lambda: model(idx), 'math': lambda: model.forward_with_probs(idx)}
        memory, times = {}, {k: [] for k in paths}
        for name, fn in paths.items():
            with autocast():
                fn()  # warm-up
                with Memory(device) as m:
                    fn()  # with grad: the memory kept for backward shows the T×T matrices
            memory[name] = m.bytes
        with torch.no_grad(), autocast():
            for _ in range(p['rounds']):
                for name, fn in paths.items():
                    times[name].append(timed(fn, device))
        fast, slow = per_second(length, times['fast']), per_second(length, times['math'])
        speed = throughput_ratio(times['math'], times['fast'])
        print(f"  T={length}: fast {fast:,.0f} tokens/s, math {slow:,.0f} tokens/s (fast ×{fmt_ratio(speed)}); "
              f"memory fast {memory['fast'] / 2**20:.1f} MB, "
              f"math {memory['math'] / 2**20:.1f} MB (math ×{memory['math'] / memory['fast']:.2f})")
        results['paths'][str(length)] = dict(fast_tokens_per_s=fast, math_tokens_per_s=slow, fast_vs_math=speed[0],
                                             fast_vs_math_ci=list(speed[1:]), fast_memory_bytes=memory['fast'],
                                             math_memory_bytes=memory['math'])


def bench_kv_cache(p, device, autocast, results):
    n_new = p['new_tokens']
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=p['n_layer'], n_head=p['n_head'], n_embd=p['n_embd'], block_size=16 + n_new,
                          vocab_size=p['vocab_size'], operator='corridor', gamma_init=-0.3)).to(device).eval()
    prompt = torch.randint(0, p['vocab_size'], (1, 16), device=device)
    times = {True: [], False: []}
    with autocast():
        for _ in range(max(2, p['rounds'] // 2)):
            for use_cache in (True, False):
                times[use_cache].append(timed(lambda: model.generate(prompt, n_new, temperature=0, use_cache=use_cache), device))
    speedup = throughput_ratio(times[False], times[True])
    print(f"\nKV cache: greedy generation of {n_new} tokens, cached ×{fmt_ratio(speedup)} faster than recomputing "
          f"({per_second(n_new, times[True]):,.0f} vs {per_second(n_new, times[False]):,.0f} tokens/s)")
    results['kv_cache'] = dict(new_tokens=n_new, speedup=speedup[0], speedup_ci=list(speedup[1:]))


def bench_walk(p, device, results):
    """The fast connection-walk diagnostics against building O_ij and G_ij = O_ijᵀO_ij for every edge."""
    w = p['walk']
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=w['n_head'], n_embd=w['n_embd'], block_size=w['seq_len'],
                          vocab_size=p['vocab_size'])).to(device).double()
    idx = torch.randint(0, p['vocab_size'], (1, w['seq_len']), device=device)
    n_edges = w['seq_len'] * (w['seq_len'] + 1) // 2
    fast = statistics.median(timed(lambda: connection_diagnostics(model, idx), device) for _ in range(3))
    probs = model.forward_with_probs(idx)[1][0][0]          # [H, T, T]
    W_V, W_O = head_weights(model.transformer.h[0].attn)
    M = torch.stack([W_V[h] @ W_O[h] for h in range(w['n_head'])])
    d = w['n_embd']

    def naive_edges():
        for e in range(w['edges']):
            i, j = w['seq_len'] - 1 - e, e
            weights = probs[:, i, j] / probs[:, i, j].sum()
            O = torch.einsum('h,hab->ab', weights, M)
            G = O.T @ O
            mu = torch.trace(G) / d
            (G - mu * torch.eye(d, dtype=G.dtype, device=device)).norm() / (mu * math.sqrt(d))
    naive = statistics.median(timed(naive_edges, device) for _ in range(3)) / w['edges'] * n_edges
    print(f"\nconnection walk, d={d}, {w['n_head']} heads, T={w['seq_len']} ({n_edges} edges, one layer): fast "
          f"{fast * 1000:.1f} ms, naive {naive:.2f} s (timed on {w['edges']} edges, scaled): ×{naive / fast:,.0f}")
    results['walk'] = dict(d=d, heads=w['n_head'], seq_len=w['seq_len'], fast_s=fast, naive_s=naive,
                           speedup=naive / fast)


def compile_check(p, device, autocast, results):
    """torch.compile of the corridor model: no graph break, and the same logits as eager. At batch 2: it runs
    after the timed steps, and starts from a fresh Dynamo, so it can't turn their graphs dynamic."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=p['n_layer'], n_head=p['n_head'], n_embd=p['n_embd'], block_size=p['block_size'],
                          vocab_size=p['vocab_size'], operator='corridor', gamma_init=-0.3, init_spread=0.2)).to(device)
    idx = torch.randint(0, p['vocab_size'], (2, p['block_size']), device=device)
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break is an error
    with torch.no_grad(), autocast():
        diff = (compiled(idx)[0].float() - model(idx)[0].float()).abs().max().item()
    print(f"\ncompile check: fullgraph compile OK, max |compiled − eager| logit difference {diff:.2e}")
    results['compile_check'] = dict(fullgraph=True, max_abs_logit_diff=diff)


def main(argv):
    with contextlib.ExitStack() as stack:  # what the whole run holds (the SDPA backend)
        run(argv, stack)


def run(argv, stack):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--preset', choices=list(PRESETS), default='cpu')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out_dir', default='.', help="where bench_<preset>.json and the train.py runs' logs go")
    parser.add_argument('--json', default=None, help='write the results here (default: OUT_DIR/bench_<preset>.json)')
    parser.add_argument('--baseline', help="a git revision (e.g. HEAD~1) or a file whose model.py the training step "
                        "is also timed with, interleaved: what a change to model.py costs")
    parser.add_argument('--forms', help="comma-separated operator forms of the training step (default: the preset's)")
    parser.add_argument('--modes', help="comma-separated: eager, compiled (default: both)")
    parser.add_argument('--dtype', choices=['float32', 'bfloat16', 'float16'],
                        help="autocast dtype (default: the preset's on a GPU, float32 on CPU)")
    parser.add_argument('--versus_dtype', choices=['float32', 'bfloat16', 'float16'],
                        help="also time the training step in this dtype, interleaved, and print --dtype's throughput "
                        "over it (e.g. --dtype=bfloat16 --versus_dtype=float32: what bf16 gains on this CPU)")
    parser.add_argument('--sdpa_backend', default='auto', help="SDPA kernel: auto, flash, efficient, cudnn, math")
    parser.add_argument('--skip', help='comma-separated parts to skip: '
                        "training,epilogue,train_runs,compile_check,paths,kv_cache,walk (default: the preset's, if any)")
    parser.add_argument('--rounds', type=int, help="rounds of the timed steps (default: the preset's); the CI "
                        "narrows as one over the square root of the rounds")
    parser.add_argument('--steps', type=int, help="training steps a variant is timed for in each round (default: the "
                        "preset's)")
    parser.add_argument('--threads', type=int, help="torch's CPU threads (default: the preset's, else torch's choice)")
    parser.add_argument('--pairs_csv', help="write the training step's round times here, attention and corridor, one "
                        f"row per mode and round: {','.join(PAIRS_COLUMNS)}")
    args = parser.parse_args(argv)
    p = PRESETS[args.preset]
    for key in ('rounds', 'steps'):
        if getattr(args, key) is not None:
            if getattr(args, key) < 1:
                sys.exit(f"error: --{key} must be at least 1, got {getattr(args, key)}")
            p = {**p, key: getattr(args, key)}
    skip = set(args.skip.split(',') if args.skip is not None else p.get('skip', ()))
    threads = args.threads if args.threads is not None else p.get('threads')
    if threads is not None:
        if threads < 1:
            sys.exit(f"error: --threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)  # before any model: Inductor's C++ kernels are generated for this count
    if args.modes:
        p = {**p, 'modes': tuple(args.modes.split(','))}
        if not set(p['modes']) <= {'eager', 'compiled'}:
            sys.exit(f"error: --modes takes eager and/or compiled, got {args.modes!r}")
    if args.forms:
        p = {**p, 'forms': tuple(args.forms.split(','))}
        if 'attention' not in p['forms'] or not set(p['forms']) <= set(OPERATORS):  # every ratio is against attention
            sys.exit(f"error: --forms takes attention and others of {', '.join(OPERATORS)}, got {args.forms!r}")
    if args.pairs_csv and ('training' in skip or 'corridor' not in p['forms']):
        sys.exit("error: --pairs_csv needs the training step of attention and corridor (not skipped, in --forms)")
    device = args.device
    if device.startswith('cuda'):
        device = str(torch.device(device, torch.cuda.current_device()) if device == 'cuda' else device)
        torch.cuda.set_device(device)  # what runs without an explicit device (Inductor's autotuning too) goes there
        torch.backends.cuda.matmul.allow_tf32 = True
        name = torch.cuda.get_device_name(device)
    else:
        name = 'CPU'
    dtype = getattr(torch, args.dtype or (p['dtype'] if device.startswith('cuda') else 'float32'))
    try:  # for the whole run; a backend this device lacks is one line, tried on the preset's attention layer
        probe = GPT(GPTConfig(n_layer=1, n_head=p['n_head'], n_embd=p['n_embd'], block_size=16, vocab_size=64,
                              operator='corridor', gamma_init=-0.3)).to(device) if args.sdpa_backend != 'auto' else None
        stack.enter_context(sdpa_backend(args.sdpa_backend, probe, 16, device, str(dtype).removeprefix('torch.'),
                                         torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32)))
    except UserError as e:
        sys.exit(f"error: {e}")

    def autocast(dtype=dtype):
        return torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32)
    p = {**p, 'dtype': str(dtype).removeprefix('torch.'), 'versus_dtype': args.versus_dtype}
    if args.versus_dtype == p['dtype']:
        sys.exit(f"error: --versus_dtype={args.versus_dtype} is --dtype itself: name another")
    versus = (lambda: autocast(getattr(torch, args.versus_dtype))) if args.versus_dtype else None
    os.makedirs(args.out_dir, exist_ok=True)
    path = args.json or os.path.join(args.out_dir, f'bench_{args.preset}.json')
    print(f"lab/bench.py --preset {args.preset} on {name}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    results = dict(preset=args.preset, device=name, threads=torch.get_num_threads(), torch=torch.__version__,
                   training={}, train_runs={}, paths={})

    def save():  # after every part: a run cut short keeps what it measured
        with atomic_write(path) as f:
            json.dump(results, f, indent=1)
    if 'training' not in skip:
        bench_training(p, device, autocast, results, load_baseline(args.baseline) if args.baseline else None, versus)
        if 'corridor/compiled' in results['training']:
            print(headline(results))  # here, not only at the end: a run cut short keeps it
        save()
        if args.pairs_csv:
            write_pairs(args.pairs_csv, p, results)
            print(f"round times -> {args.pairs_csv}")
    if 'epilogue' not in skip:
        epilogue_traffic(p, device, autocast, results)
        save()
    if 'train_runs' not in skip and 'train_runs' in p:
        bench_train_runs(p, device, results, args.out_dir, args.preset)
        save()
    if 'compile_check' not in skip and device.startswith('cuda'):
        compile_check(p, device, autocast, results)
        save()
    if 'paths' not in skip:
        bench_paths(p, device, autocast, results)
        save()
    if 'kv_cache' not in skip:
        bench_kv_cache(p, device, autocast, results)
        save()
    if 'walk' not in skip:
        bench_walk(p, device, results)
        save()
    print(f"\nresults -> {path}")
    if 'corridor/compiled' in results['training']:
        print(headline(results))


if __name__ == '__main__':
    main(sys.argv[1:])
