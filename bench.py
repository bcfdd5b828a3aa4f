"""
Speed and memory of the operator family, measured in one run: every timed step alternates between the variants
(attention, corridor, attention, corridor, ...), medians over rounds, ratios paired by round.

    python bench.py                  # CPU-sized: every form eager and compiled, fast vs math path, KV cache, walk
    python bench.py --preset gpu     # one H100/H200 in under 8 minutes: GPT-2 124M in bf16, compile check, MFU
    python bench.py --preset tiny    # seconds, what the tests run

Memory: on a GPU the peak allocated by the step (torch.cuda.max_memory_allocated); on CPU, which has no
allocator statistics, the bytes autograd keeps for backward (deduplicated by storage), the part of a training
step's memory an attention operator can change. Results also go to a JSON file (--json).
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch

from common import peak_flops
from model import GPT, GPTConfig
from walk import connection_diagnostics, head_weights

PRESETS = {
    # model, batch and context for the training step; rounds × steps timed per variant
    'tiny': dict(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=256, batch_size=2, rounds=2, steps=1,
                 forms=('attention', 'corridor'), modes=('eager', 'compiled'), dtype='float32',
                 path_lengths=(128, 256), path_layers=1, new_tokens=16, walk=dict(n_embd=32, n_head=4, seq_len=16, edges=4)),
    'cpu': dict(n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=512, batch_size=8, rounds=7, steps=3,
                forms=('attention', 'corridor', 'laplacian', 'alpha', 'alpha_beta'), modes=('eager', 'compiled'),
                dtype='float32', path_lengths=(1024, 2048), path_layers=2, new_tokens=256,
                walk=dict(n_embd=768, n_head=12, seq_len=64, edges=6)),
    'gpu': dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, batch_size=16, rounds=5,
                steps=10, forms=('attention', 'corridor'), modes=('eager', 'compiled'), dtype='bfloat16',
                path_lengths=(1024, 2048), path_layers=12, new_tokens=256,
                walk=dict(n_embd=768, n_head=12, seq_len=64, edges=20)),
}


def sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize()


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
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.startswith('cuda'):
            sync(self.device)
            self.bytes = torch.cuda.max_memory_allocated() - self.base
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


def median_ratio(times, a, b):
    """b's throughput relative to a's: the median over rounds of time(a) / time(b), paired by round."""
    return statistics.median(ta / tb for ta, tb in zip(times[a], times[b]))


# ---------------------------------------------------------------------------------------------- training step

def bench_training(p, device, autocast, results):
    """Training-step throughput, memory and (GPU) MFU of every form, eager and compiled, interleaved."""
    variants = {}
    for form in p['forms']:
        for mode in p['modes']:
            torch.manual_seed(0)
            model = GPT(GPTConfig(n_layer=p['n_layer'], n_head=p['n_head'], n_embd=p['n_embd'],
                                  block_size=p['block_size'], vocab_size=p['vocab_size'], operator=form,
                                  **(dict(gamma_init=-0.3, init_spread=0.2) if form in ('corridor', 'alpha', 'alpha_beta') else {}))).to(device)
            optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cuda' if device.startswith('cuda') else 'cpu')
            variants[(form, mode)] = (model, torch.compile(model) if mode == 'compiled' else model, optimizer)
    idx = torch.randint(0, p['vocab_size'], (p['batch_size'], p['block_size'] + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]

    def step(variant):
        model, run, optimizer = variant
        with autocast():
            _, loss = run(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    memory = {}
    for key, variant in variants.items():  # warm-up (compiles) and memory, one variant at a time
        t0 = time.perf_counter()
        step(variant)
        warm = time.perf_counter() - t0
        with Memory(device) as m:
            step(variant)
        memory[key] = m.bytes
        print(f"  warm-up {key[0]:>10} {key[1]:>8}: {warm:6.1f} s (first step, with compile)")
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
    for (form, mode), t in times.items():
        tps = tokens / statistics.median(t)
        speed = median_ratio(times, ('attention', mode), (form, mode))
        mem = memory[(form, mode)] / memory[('attention', mode)]
        mfu = f"  {model.flops_per_token(p['block_size']) * tps / peak:.1%}" if peak else ''
        print(f"  {form:>10} {mode:>8} {tps:>12,.0f} {speed:>13.3f} {memory[(form, mode)] / 2**20:>10.1f} {mem:>13.3f}{mfu}")
        results['training'][f'{form}/{mode}'] = dict(tokens_per_s=tps, throughput_vs_attention=speed,
                                                    memory_bytes=memory[(form, mode)], memory_vs_attention=mem,
                                                    mfu=model.flops_per_token(p['block_size']) * tps / peak if peak else None)


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
    probs = model.attention_probs(idx)[0][0]          # [H, T, T]
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
    """torch.compile of the corridor model: no graph break, and the same logits as eager."""
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--preset', choices=list(PRESETS), default='cpu')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--json', default=None, help='write the results here (default: bench_<preset>.json)')
    parser.add_argument('--skip', default='', help='comma-separated parts to skip: training,paths,kv_cache,walk')
    args = parser.parse_args(argv)
    p = PRESETS[args.preset]
    device = args.device
    if device.startswith('cuda'):
        torch.backends.cuda.matmul.allow_tf32 = True
        name = torch.cuda.get_device_name()
    else:
        name = f"CPU, {torch.get_num_threads()} threads"
    dtype = getattr(torch, p['dtype']) if device.startswith('cuda') else torch.float32

    def autocast():
        return torch.autocast(device.split(':')[0], dtype=dtype, enabled=dtype != torch.float32)
    p = {**p, 'dtype': str(dtype).removeprefix('torch.')}
    print(f"bench.py --preset {args.preset} on {name}, torch {torch.__version__}")
    results = dict(preset=args.preset, device=name, torch=torch.__version__, training={}, paths={})
    skip = set(args.skip.split(','))
    if device.startswith('cuda'):
        compile_check(p, device, autocast, results)
    if 'training' not in skip:
        bench_training(p, device, autocast, results)
    if 'paths' not in skip:
        bench_paths(p, device, autocast, results)
    if 'kv_cache' not in skip:
        bench_kv_cache(p, device, autocast, results)
    if 'walk' not in skip:
        bench_walk(p, device, results)
    path = args.json or f'bench_{args.preset}.json'
    with open(path, 'w') as f:
        json.dump(results, f, indent=1)
    print(f"\nresults -> {path}")
    if 'training' not in skip and 'compiled' in p['modes']:
        ratio = results['training']['corridor/compiled']['throughput_vs_attention']
        print(f"ratio corridor/attention (compiled): {ratio:.3f}")


if __name__ == '__main__':
    main(sys.argv[1:])
