"""
The GPU self-check: the CUDA path checked part by part before a GPU run is trusted, each part in a process of its
own under a time limit (one hang costs only that part), one PASS / WARN / FAIL / SKIP line each, and
check_summary.txt in --out_dir. It checks CUDA unless --device=cpu is asked for: without CUDA (a CPU-only build of
torch, the commonest first mistake, or no GPU in sight) the environment part FAILs in one line naming the fix and the
parts after it SKIP. With --device=cpu the same parts run on the CPU, at tiny sizes with --small (what the tests
run); the CUDA-only ones SKIP.

    python -m lab.selfcheck --out_dir=gpu-check                    # every part (docs/gpu.md)
    python -m lab.selfcheck --parts=environment,correctness        # these parts
    python -m lab.selfcheck --small --device=cpu                   # tiny sizes, on CPU
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from common import REPO, atomic_write, sdpa_backend
from lab.bench import PRESETS, bench_training, sdpa_kernels, timed, write_synthetic_tokens
from model import GPT, GPTConfig, lm_loss

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
        cause = (f"{facts} is a CPU-only build; install a CUDA build (`pip install torch` from PyPI on Linux, not the "
                 f"/whl/cpu index)" if torch.version.cuda is None else
                 f"{facts} (CUDA {torch.version.cuda}) sees no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES")
        return 'FAIL', f"CUDA is not available: {cause}, or pass --device=cpu to check the CPU path"
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
        ref_loss = lm_loss(logits, y)
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
                    loss = lm_loss(logits, y.to(device))
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


def check_in_process(name, device, small, dtype):
    """One part in a process of its own, under its time limit: {status, message}."""
    limit = CHECK_PARTS[name] if not small else 300
    print(f"== {name} (at most {limit} s)", flush=True)
    try:
        result = subprocess.run([sys.executable, '-m', 'lab.selfcheck', '--part', name, '--device', device,
                                 '--dtype', str(dtype).removeprefix('torch.'), *(['--small'] if small else [])],
                                cwd=REPO, capture_output=True, text=True, timeout=limit)
        found = [line for line in result.stdout.splitlines() if line.startswith('CHECK ')]
        return json.loads(found[-1][6:]) if found else dict(
            status='FAIL', message=f"exit {result.returncode}: {(result.stderr.strip().splitlines() or [''])[-1]}")
    except subprocess.TimeoutExpired:
        return dict(status='FAIL', message=f"did not finish in {limit} s")


def self_check(device, small, dtype, parts, out_dir):
    """Every part in a process of its own, under its time limit; a summary line each, in check_summary.txt too."""
    rows, environment_failed = [], False
    for name in parts:
        t0 = time.time()
        if environment_failed:  # the parts stand on it: without CUDA they would fail again, or time GPT-2 on the CPU
            outcome = dict(status='SKIP', message='not run: the environment part failed')
        else:
            outcome = check_in_process(name, device, small, dtype)
            environment_failed = name == 'environment' and outcome['status'] == 'FAIL'
        rows.append(f"{outcome['status']:<4}  {name:<18} {time.time() - t0:5.0f} s  {outcome['message']}")
        print(rows[-1], flush=True)
    summary = '\n'.join(rows) + '\n'
    with atomic_write(os.path.join(out_dir, 'check_summary.txt')) as f:
        f.write(summary)
    print(f"\nself-check on {device} ({'tiny' if small else 'GPT-2 124M'} sizes):\n{summary}"
          f"-> {os.path.join(out_dir, 'check_summary.txt')}")
    return 1 if any(row.startswith('FAIL') for row in rows) else 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--parts', default=','.join(CHECK_PARTS),
                        help=f"comma-separated parts (default: every one: {', '.join(CHECK_PARTS)})")
    parser.add_argument('--device', default='cuda',
                        help="default cuda: it is what the check is for, so a torch without CUDA fails rather than "
                             "falling back; --device=cpu checks the CPU path")
    parser.add_argument('--dtype', choices=['float32', 'bfloat16', 'float16'],
                        help="autocast dtype (default: bfloat16 on a GPU, float32 on CPU)")
    parser.add_argument('--small', action='store_true', help='tiny sizes (what the tests run on CPU)')
    parser.add_argument('--out_dir', default='.', help='where check_summary.txt goes')
    parser.add_argument('--part', help=argparse.SUPPRESS)  # one part, in the process self_check starts
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype or ('bfloat16' if args.device.startswith('cuda') else 'float32'))
    if args.part:
        return run_check_part(args.part, args.device, args.small, dtype)
    unknown = set(args.parts.split(',')) - set(CHECK_PARTS)
    if unknown:
        sys.exit(f"error: unknown --parts {', '.join(sorted(unknown))} (choose from {', '.join(CHECK_PARTS)})")
    parts = args.parts.split(',')
    if args.device.startswith('cuda') and not torch.cuda.is_available() and 'environment' not in parts:
        parts.insert(0, 'environment')  # its one line names the fix; every part asked for then SKIPs
    os.makedirs(args.out_dir, exist_ok=True)
    sys.exit(self_check(args.device, args.small, dtype, parts, args.out_dir))


if __name__ == '__main__':
    main(sys.argv[1:])
