"""
Speed and memory of the operator family, measured in one run: every timed step alternates between the variants
(attention, corridor, attention, corridor, ...), medians over rounds, ratios paired by round.

    python -m lab.bench                  # CPU-sized: every form eager and compiled, fast vs math path, KV cache, walk
    python -m lab.bench --preset gpu     # one H100/H200 in about 9 minutes: GPT-2 124M in bf16, MFU, short train.py runs
    python -m lab.bench --preset tiny    # seconds, what the tests run
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

from common import PEAK_FLOPS, REPO, UserError, atomic_write, flops_per_token, peak_flops, sdpa_backend
from lab.connection import connection_diagnostics, head_weights
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
                forms=('attention', 'corridor', 'laplacian', 'alpha', 'alpha_beta'), modes=('eager', 'compiled'),
                dtype='float32', path_lengths=(1024, 2048), path_layers=2, new_tokens=256,
                walk=dict(n_embd=768, n_head=12, seq_len=64, edges=6)),
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


def sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize(device)


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
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.startswith('cuda'):
            sync(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.hooks.__exit__(*exc)
            self.bytes = sum(self.storages.values())


def timed(fn, device, repeats=1):
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
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


def median_ratio(times, a, b):
    """b's throughput relative to a's: the median over rounds of time(a) / time(b), paired by round."""
    return statistics.median(ta / tb for ta, tb in zip(times[a], times[b]))


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


def bench_training(p, device, autocast, results, baseline=None):
    """Training-step throughput, memory and (GPU) MFU of every form, eager and compiled, interleaved; with a
    baseline model module (load_baseline), the same variants built from it too, same weights, same rounds.

    The compiled variants are the graphs train.py runs: static shapes. Dynamo marks a dimension dynamic once it
    has seen the same code (GPT.forward, whatever the model object) at two sizes, so an earlier compile in this
    process at another batch size would otherwise make these graphs dynamic in the batch dimension."""
    torch._dynamo.reset()
    variants = {}
    sources = {'': sys.modules[GPT.__module__]} | ({'baseline': baseline} if baseline else {})
    for form in p['forms']:
        for mode in p['modes']:
            for tag, module in sources.items():
                torch.manual_seed(0)
                model = module.GPT(module.GPTConfig(
                    n_layer=p['n_layer'], n_head=p['n_head'], n_embd=p['n_embd'], block_size=p['block_size'],
                    vocab_size=p['vocab_size'], bias=p.get('bias', True), operator=form,
                    **(dict(gamma_init=-0.3, init_spread=0.2) if form in ('corridor', 'alpha', 'alpha_beta') else {}))).to(device)
                optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cuda' if device.startswith('cuda') else 'cpu')
                key = (form, mode) if not tag else (form, mode, tag)
                variants[key] = (model, torch.compile(model, dynamic=False) if mode == 'compiled' else model, optimizer)
    idx = torch.randint(0, p['vocab_size'], (p['batch_size'], p['block_size'] + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]

    def step(variant):
        model, run, optimizer = variant
        with autocast():
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
        print(f"  warm-up {key[0]:>10} {key[1]:>8}{' (baseline)' if len(key) > 2 else ''}: {warm:6.1f} s (first step, "
              f"with compile); SDPA kernel: {', '.join(kernels[key]) or 'none'}")
    times = {key: [] for key in variants}
    for _ in range(p['rounds']):
        for key, variant in variants.items():  # attention, corridor, ... interleaved in every round
            times[key].append(timed(lambda: step(variant), device, p['steps']))
    tokens = p['batch_size'] * p['block_size']
    model = next(iter(variants.values()))[0]
    peak = peak_flops(device, p['dtype'])
    print(f"\ntraining step: {model.get_num_params() / 1e6:.1f}M parameters, batch {p['batch_size']} × {p['block_size']}, "
          f"{p['dtype']}, {p['rounds']} rounds × {p['steps']} steps, medians")
    print(f"  {'form':>10} {'mode':>8} {'tokens/s':>12} {'vs attention':>13} {'memory MB':>10} {'vs attention':>13}"
          + ('  MFU' if peak else ''))
    for key, t in times.items():
        if len(key) > 2:  # the baseline's rows: below
            continue
        form, mode = key
        tps = tokens / statistics.median(t)
        speed = median_ratio(times, ('attention', mode), (form, mode))
        mem = memory[(form, mode)] / memory[('attention', mode)]
        mfu = f"  {flops_per_token(model, p['block_size']) * tps / peak:.1%}" if peak else ''
        print(f"  {form:>10} {mode:>8} {tps:>12,.0f} {speed:>13.3f} {memory[(form, mode)] / 2**20:>10.1f} {mem:>13.3f}{mfu}")
        results['training'][f'{form}/{mode}'] = dict(tokens_per_s=tps, throughput_vs_attention=speed,
                                                    memory_bytes=memory[(form, mode)], memory_vs_attention=mem,
                                                    sdpa_kernels=kernels[(form, mode)],
                                                    mfu=flops_per_token(model, p['block_size']) * tps / peak if peak else None)
    if baseline:
        print("\n  against the baseline model.py (the same variants, interleaved in every round):")
        print(f"  {'form':>10} {'mode':>8} {'throughput vs baseline':>23} {'memory vs baseline':>19}")
        for form, mode in (key for key in times if len(key) == 2):
            speed = median_ratio(times, (form, mode, 'baseline'), (form, mode))
            mem = memory[(form, mode)] / memory[(form, mode, 'baseline')]
            print(f"  {form:>10} {mode:>8} {speed:>23.3f} {mem:>19.3f}")
            results['training'][f'{form}/{mode}'].update(throughput_vs_baseline=speed, memory_vs_baseline=mem)


def headline(results):
    return f"ratio corridor/attention (compiled): {results['training']['corridor/compiled']['throughput_vs_attention']:.3f}"


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
        fast, slow = statistics.median(times['fast']), statistics.median(times['math'])
        print(f"  T={length}: fast {length / fast:,.0f} tokens/s, math {length / slow:,.0f} tokens/s "
              f"(fast ×{slow / fast:.2f}); memory fast {memory['fast'] / 2**20:.1f} MB, "
              f"math {memory['math'] / 2**20:.1f} MB (math ×{memory['math'] / memory['fast']:.2f})")
        results['paths'][str(length)] = dict(fast_tokens_per_s=length / fast, math_tokens_per_s=length / slow,
                                             fast_memory_bytes=memory['fast'], math_memory_bytes=memory['math'])


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
    speedup = median_ratio(times, False, True)
    print(f"\nKV cache: greedy generation of {n_new} tokens, cached ×{speedup:.2f} faster than recomputing "
          f"({n_new / statistics.median(times[True]):,.0f} vs {n_new / statistics.median(times[False]):,.0f} tokens/s)")
    results['kv_cache'] = dict(new_tokens=n_new, speedup=speedup)


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


# ---------------------------------------------------------------------------------------------- the self-check

# `python -m lab.bench --check`: the CUDA path checked part by part, each part in a process of its own under a time
# limit (one hang costs only that part), one PASS / WARN / FAIL / SKIP line each. On CPU the same parts run at tiny
# sizes (the tests run them); the CUDA-only ones SKIP.
CHECK_PARTS = {  # name: seconds it may take on a GPU (the compiles dominate)
    'environment': 60, 'correctness': 240, 'sdpa_kernels': 120, 'walk_and_math_path': 120, 'cached_sampler': 60,
    'fp16_grad_scaler': 120, 'cuda_rng': 60, 'throughput': 420, 'training_run': 420, 'ddp_resume': 420}
TESTED_TORCH = (2, 13)  # the version the test suite runs on (requirements.txt)


def check_model(device, small, form='corridor', **keys):
    torch.manual_seed(0)
    size = dict(n_layer=2, n_head=2, n_embd=32, block_size=64) if small else \
        dict(n_layer=4, n_head=12, n_embd=768, block_size=1024)  # GPT-2 124M's layer shape, head size 64
    keys = (dict(gamma_init=-0.3, init_spread=0.2) if form == 'corridor' else {}) | keys
    return GPT(GPTConfig(**size, vocab_size=512, operator=form, **keys)).to(device)


def relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def check_environment(device, small, dtype):
    version = tuple(int(x) for x in re.findall(r'\d+', torch.__version__)[:2])
    facts = f"torch {torch.__version__}"
    if not device.startswith('cuda'):
        return 'PASS', facts + ', CPU'
    if not torch.cuda.is_available():
        return 'FAIL', facts + ': CUDA is not available (a CPU build of torch?)'
    capability = torch.cuda.get_device_capability(device)
    facts += (f", CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name(device)}"
              f" (sm_{capability[0]}{capability[1]}), {torch.cuda.get_device_properties(device).total_memory / 2**30:.0f} GiB")
    if version < TESTED_TORCH:
        return 'WARN', facts + f": the tests cover torch >= {TESTED_TORCH[0]}.{TESTED_TORCH[1]}"
    return 'PASS', facts


def check_correctness(device, small, dtype):
    """Loss and every gradient of the fast path, eager and compiled (fullgraph: one graph), against the float64 math
    path of the same weights on the CPU; the math path on the device too. bf16 / fp16: within 2 % / 5 %."""
    lines, worst = [], 0.0
    loss_tol, grad_tol = (1e-5, 1e-4) if dtype == torch.float32 else (0.02, 0.05)
    for form in ('attention', 'corridor'):
        model = check_model(device, small, form)
        reference = check_model('cpu', small, form).double()
        reference.load_state_dict(model.state_dict())
        idx = torch.randint(0, 512, (2, model.config.block_size + 1), generator=torch.Generator().manual_seed(0))
        x, y = idx[:, :-1], idx[:, 1:]
        logits, _ = reference.forward_with_probs(x)
        ref_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        ref_loss.backward()
        ref_grads = [p.grad for p in reference.parameters()]
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(model, fullgraph=True)
        for mode, run in (('eager', model), ('compiled', compiled), ('math', None)):
            model.zero_grad(set_to_none=True)
            with torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32):
                if run is None:
                    logits, _ = model.forward_with_probs(x.to(device))
                    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten())
                else:
                    _, loss = run(x.to(device), y.to(device))
            loss.backward()
            loss_err = abs(loss.item() - ref_loss.item()) / ref_loss.item()
            grad_err = max(relative(p.grad.cpu(), g) for p, g in zip(model.parameters(), ref_grads))
            worst = max(worst, loss_err / loss_tol, grad_err / grad_tol)
            lines.append(f"{form} {mode} loss {loss_err:.1e} grads {grad_err:.1e}")
        graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
        lines.append(f"{form} compiled in {graphs} graph(s)")
        worst = max(worst, 2.0 if graphs != 1 else 0.0)
    return ('PASS' if worst <= 1 else 'FAIL'), '; '.join(lines) + f" (relative to float64; tolerance {loss_tol:g} / {grad_tol:g})"


def check_sdpa_kernels(device, small, dtype):
    """Which kernel a training step's SDPA runs by default, and which backends run here, with their times."""
    from common import SDPA_BACKENDS
    model = check_model(device, small)
    idx = torch.randint(0, 512, (4, model.config.block_size + 1), device=device)

    def step():
        with torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32):
            _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
    step()
    default = sdpa_kernels(step)
    timings = []
    autocast = torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32)
    for name in SDPA_BACKENDS[1:]:
        try:  # any failure, the probe's one line or a kernel's RuntimeError in the step, marks this backend only
            with sdpa_backend(name, model, model.config.block_size, device, str(dtype).removeprefix('torch.'),
                              autocast):
                step()
                timings.append(f"{name} {statistics.median(timed(step, device) for _ in range(3)) * 1000:.1f} ms")
        except Exception:
            timings.append(f"{name} -")
    status = 'WARN' if device.startswith('cuda') and default == ['math'] else 'PASS'
    return status, f"auto runs {', '.join(default) or 'none'}; a training step with each: {', '.join(timings)}"


def check_walk_and_math_path(device, small, dtype):
    """The attention form's math path and the logged walk geometry on the device, against the same on the CPU."""
    from lab.connection import walk_geometry
    worst, lines = 0.0, []
    for form in ('attention', 'corridor'):
        model = check_model(device, small, form).eval()
        on_cpu = check_model('cpu', small, form).eval()
        on_cpu.load_state_dict(model.state_dict())
        idx = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            err = relative(model.forward_with_probs(idx.to(device))[0].cpu(), on_cpu.forward_with_probs(idx)[0])
        walk, walk_cpu = walk_geometry(model, idx.to(device)), walk_geometry(on_cpu, idx)
        walk_err = max(abs(a - b) / max(abs(b), 1e-12) for part in walk for key in walk[part]
                       for a, b in zip(walk[part][key], walk_cpu[part][key]))
        worst = max(worst, err, walk_err)
        lines.append(f"{form}: math-path logits {err:.1e}, walk geometry {walk_err:.1e}")
    return ('PASS' if worst < 1e-4 else 'FAIL'), '; '.join(lines) + ' (relative to the CPU, float32)'


def check_cached_sampler(device, small, dtype):
    """Greedy tokens with the KV cache against recomputing every position: the same in float32; in bf16 a near-tie
    between two logits may round the other way, so a difference there is a warning, not a failure."""
    model = check_model(device, small).eval()
    prompt = torch.randint(0, 512, (2, 8), device=device)
    results = {}
    for name, dt in (('float32', torch.float32), ('low precision', dtype)):
        with torch.autocast(device.split(':')[0], dtype=dt, enabled=dt != torch.float32):
            a = model.generate(prompt, 48, temperature=0, use_cache=True)
            b = model.generate(prompt, 48, temperature=0, use_cache=False)
        results[name] = (a == b).float().mean().item()
    status = 'FAIL' if results['float32'] < 1 else 'PASS' if results['low precision'] == 1 else 'WARN'
    return status, ', '.join(f"{k}: {v:.0%} of tokens identical" for k, v in results.items())


def check_fp16_grad_scaler(device, small, dtype):
    """float16 autocast with the grad scaler and fused AdamW (train.py on GPUs without bf16): 30 steps on one batch."""
    if not device.startswith('cuda'):
        return 'SKIP', 'CUDA only (fused AdamW, float16 autocast)'
    model = check_model(device, small)
    optimizer = model.configure_optimizers(0.1, 3e-4, (0.9, 0.95), 'cuda')
    scaler = torch.amp.GradScaler('cuda')
    idx = torch.randint(0, 512, (4, model.config.block_size + 1), device=device)
    losses = []
    for _ in range(30):
        with torch.autocast('cuda', dtype=torch.float16):
            _, loss = model(idx[:, :-1], idx[:, 1:])
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    ok = all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    return ('PASS' if ok else 'FAIL'), f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, scale {scaler.get_scale():g}"


def check_cuda_rng(device, small, dtype):
    """The CUDA generator's state saved and restored (as ckpt.pt does) gives the same dropout masks again."""
    if not device.startswith('cuda'):
        return 'SKIP', 'CUDA only'
    state = torch.cuda.get_rng_state(device)
    a = torch.nn.functional.dropout(torch.ones(4096, device=device), 0.5)
    torch.cuda.set_rng_state(state, device)
    b = torch.nn.functional.dropout(torch.ones(4096, device=device), 0.5)
    return ('PASS' if torch.equal(a, b) else 'FAIL'), 'dropout masks after a restore ' + \
        ('identical' if torch.equal(a, b) else 'differ')


def check_throughput(device, small, dtype):
    """lab/bench.py's training step, attention vs corridor, eager and compiled, interleaved (GPT-2 124M on a GPU)."""
    p = {**PRESETS['tiny' if small else 'gpu'], 'dtype': str(dtype).removeprefix('torch.')}
    results = dict(training={})
    bench_training(p, device, lambda: torch.autocast(device.split(':')[0], dtype=dtype,
                                                     enabled=dtype != torch.float32), results)
    r = results['training']['corridor/compiled']
    mfu = f", MFU corridor {r['mfu']:.1%} attention {results['training']['attention/compiled']['mfu']:.1%}" \
        if r['mfu'] else ''
    slow = r['throughput_vs_attention'] < 0.97 or r['memory_vs_attention'] > 1.02
    return ('WARN' if slow and device.startswith('cuda') else 'PASS'), \
        (f"corridor/attention compiled: throughput {r['throughput_vs_attention']:.3f}, memory "
         f"{r['memory_vs_attention']:.3f}, eager {results['training']['corridor/eager']['throughput_vs_attention']:.3f}"
         f"{mfu}; kernels {', '.join(r['sdpa_kernels'])}")


def check_train_py(device, small, dtype, args=(), nproc=0, out=None, root=None, compiled=None):
    """Run train.py (under torchrun with nproc > 0) on the synthetic tokens in root; its log.jsonl lines. compiled:
    torch.compile (default: on a GPU's sizes, not at the tiny ones)."""
    size = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=64', '--batch_size=4'] if small else \
        ['--n_layer=12', '--n_head=12', '--n_embd=768', '--block_size=1024', '--batch_size=12', '--bias=False']
    launch = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}'] if nproc \
        else [sys.executable]
    command = [*launch, os.path.join(REPO, 'train.py'), *size, f'--device={device}',
               f"--dtype={str(dtype).removeprefix('torch.')}", f'--data_root={root}', '--dataset=synthetic',
               '--operator=corridor', '--gamma_init=-0.3', '--init_spread=0.2', '--gradient_accumulation_steps=2',
               f"--learning_rate={1e-2 if small else 1e-3}", '--warmup_iters=5', '--eval_iters=2', '--log_interval=10',
               f'--compile={not small if compiled is None else compiled}', f'--out_dir={out}', *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"train.py exited {result.returncode}: "
                           f"{(result.stderr.strip().splitlines() or ['no message'])[-1]}")
    with open(os.path.join(out, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def check_training_run(device, small, dtype):
    """A short compiled run of train.py in the run's dtype (bf16 on a GPU): its validation loss must fall."""
    with tempfile.TemporaryDirectory() as root:
        write_synthetic_tokens(os.path.join(root, 'synthetic'), 512, 400_000, n_phrases=16 if small else 1000)
        iters = 150 if small else 200
        log = check_train_py(device, small, dtype, [f'--max_iters={iters}', f'--lr_decay_iters={iters}',
                                                    f'--eval_interval={iters // 2}'], out=os.path.join(root, 'run'),
                             root=root)
    first, last = log[0]['val_loss'], log[-1]['val_loss']
    return ('PASS' if last < first - 0.1 else 'FAIL'), f"val loss {first:.3f} -> {last:.3f} in {iters} iterations"


def check_ddp_resume(device, small, dtype):
    """torchrun (NCCL on a GPU, gloo on CPU) over train.py: a run stopped halfway and resumed ends where the
    uninterrupted run ends. Bit-exact on CPU; on a GPU non-deterministic kernels (SDPA backward's atomics) may move
    the last digits, so a difference below 1e-3 is a warning."""
    cuda = device.startswith('cuda')
    nproc = min(2, torch.cuda.device_count()) if cuda else 2
    device_arg = 'cuda' if cuda else 'cpu'  # torchrun gives each process its own GPU
    # the tiny model, compiled on a GPU: DDP over torch.compile and the state a resume restores, not GPT-2's compile
    # three times over
    def run(args, out):
        return check_train_py(device_arg, True, dtype, args, nproc, os.path.join(root, out), root, compiled=cuda)
    with tempfile.TemporaryDirectory() as root:
        write_synthetic_tokens(os.path.join(root, 'synthetic'), 512, 400_000)
        common_args = ['--max_iters=20', '--lr_decay_iters=20', '--eval_interval=10']
        whole = run(common_args, 'whole')
        run(['--max_iters=10', '--lr_decay_iters=20', '--eval_interval=10'], 'resumed')
        resumed = run(['--init_from=resume', *common_args], 'resumed')
    a, b = whole[-1]['val_loss'], resumed[-1]['val_loss']
    status = 'PASS' if a == b else 'WARN' if abs(a - b) < 1e-3 else 'FAIL'
    return status, f"{nproc} process(es): val loss at iter 20 {a:.6f} uninterrupted, {b:.6f} resumed"


def run_check_part(name, device, small, dtype):
    """One part, in this process: prints one JSON line {status, message} (an exception is a FAIL with its line)."""
    try:
        status, message = globals()[f'check_{name}'](device, small, dtype)
    except Exception as e:
        status, message = 'FAIL', f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
    print('CHECK ' + json.dumps(dict(status=status, message=message)), flush=True)


def self_check(device, small, dtype, parts, out_dir):
    """Every part in a process of its own, under its time limit; a summary line each, in check_summary.txt too."""
    rows = []
    for name in parts:
        limit = CHECK_PARTS[name] if not small else 300
        print(f"== {name} (at most {limit} s)", flush=True)
        t0 = time.time()
        try:
            result = subprocess.run([sys.executable, '-m', 'lab.bench', '--check_part', name, '--device', device,
                                     '--dtype', str(dtype).removeprefix('torch.'), *(['--small'] if small else [])],
                                    cwd=REPO, capture_output=True, text=True, timeout=limit)
            found = [line for line in result.stdout.splitlines() if line.startswith('CHECK ')]
            outcome = json.loads(found[-1][6:]) if found else dict(
                status='FAIL', message=f"exit {result.returncode}: {(result.stderr.strip().splitlines() or [''])[-1]}")
        except subprocess.TimeoutExpired:
            outcome = dict(status='FAIL', message=f"did not finish in {limit} s")
        rows.append(f"{outcome['status']:<4}  {name:<18} {time.time() - t0:5.0f} s  {outcome['message']}")
        print(rows[-1], flush=True)
    summary = '\n'.join(rows) + '\n'
    with atomic_write(os.path.join(out_dir, 'check_summary.txt')) as f:
        f.write(summary)
    print(f"\nself-check on {device} ({'tiny' if small else 'GPT-2 124M'} sizes):\n{summary}"
          f"-> {os.path.join(out_dir, 'check_summary.txt')}")
    return 1 if any(row.startswith('FAIL') for row in rows) else 0


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
    parser.add_argument('--sdpa_backend', default='auto', help="SDPA kernel: auto, flash, efficient, cudnn, math")
    parser.add_argument('--skip', default='', help='comma-separated parts to skip: '
                        'training,epilogue,train_runs,compile_check,paths,kv_cache,walk')
    parser.add_argument('--check', nargs='?', const=','.join(CHECK_PARTS), metavar='PARTS',
                        help=f"the self-check of the CUDA path instead of the benchmark: every part, or these "
                             f"(comma-separated: {', '.join(CHECK_PARTS)}); PASS / WARN / FAIL / SKIP per part")
    parser.add_argument('--small', action='store_true', help='--check at tiny sizes (what the tests run on CPU)')
    parser.add_argument('--check_part', help=argparse.SUPPRESS)  # one part, in the process self_check starts
    args = parser.parse_args(argv)
    if args.check or args.check_part:
        device = args.device
        dtype = getattr(torch, args.dtype or ('bfloat16' if device.startswith('cuda') else 'float32'))
        if args.check_part:
            return run_check_part(args.check_part, device, args.small, dtype)
        unknown = set(args.check.split(',')) - set(CHECK_PARTS)
        if unknown:
            sys.exit(f"error: unknown --check part(s) {', '.join(sorted(unknown))} (choose from {', '.join(CHECK_PARTS)})")
        os.makedirs(args.out_dir, exist_ok=True)
        sys.exit(self_check(device, args.small, dtype, args.check.split(','), args.out_dir))
    p = PRESETS[args.preset]
    if args.modes:
        p = {**p, 'modes': tuple(args.modes.split(','))}
        if not set(p['modes']) <= {'eager', 'compiled'}:
            sys.exit(f"error: --modes takes eager and/or compiled, got {args.modes!r}")
    if args.forms:
        p = {**p, 'forms': tuple(args.forms.split(','))}
        if 'attention' not in p['forms'] or not set(p['forms']) <= set(OPERATORS):  # every ratio is against attention
            sys.exit(f"error: --forms takes attention and others of {', '.join(OPERATORS)}, got {args.forms!r}")
    device = args.device
    if device.startswith('cuda'):
        device = str(torch.device(device, torch.cuda.current_device()) if device == 'cuda' else device)
        torch.cuda.set_device(device)  # what runs without an explicit device (Inductor's autotuning too) goes there
        torch.backends.cuda.matmul.allow_tf32 = True
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU, {torch.get_num_threads()} threads"
    dtype = getattr(torch, args.dtype or (p['dtype'] if device.startswith('cuda') else 'float32'))
    try:  # for the whole run; a backend this device lacks is one line, tried on the preset's attention layer
        probe = GPT(GPTConfig(n_layer=1, n_head=p['n_head'], n_embd=p['n_embd'], block_size=16, vocab_size=64,
                              operator='corridor', gamma_init=-0.3)).to(device) if args.sdpa_backend != 'auto' else None
        stack.enter_context(sdpa_backend(args.sdpa_backend, probe, 16, device, str(dtype).removeprefix('torch.'),
                                         torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32)))
    except UserError as e:
        sys.exit(f"error: {e}")

    def autocast():
        return torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32)
    p = {**p, 'dtype': str(dtype).removeprefix('torch.')}
    os.makedirs(args.out_dir, exist_ok=True)
    path = args.json or os.path.join(args.out_dir, f'bench_{args.preset}.json')
    print(f"lab/bench.py --preset {args.preset} on {name}, torch {torch.__version__}")
    results = dict(preset=args.preset, device=name, torch=torch.__version__, training={}, train_runs={}, paths={})

    def save():  # after every part: a run cut short keeps what it measured
        with atomic_write(path) as f:
            json.dump(results, f, indent=1)
    skip = set(args.skip.split(','))
    if 'training' not in skip:
        bench_training(p, device, autocast, results, load_baseline(args.baseline) if args.baseline else None)
        if 'corridor/compiled' in results['training']:
            print(headline(results))  # here, not only at the end: a run cut short keeps it
        save()
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
