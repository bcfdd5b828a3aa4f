"""
Generated mutants of the core's training-critical functions: every operator, comparison, boolean, constant and
augmented-assignment swap a mutation tool makes (mutmut's operator set), inside the functions listed in TARGETS
only, each run against a quick selection of tests. Not collected by pytest (no test_ prefix). Unlike
tests/mutants.py, nobody chose these mutants: TARGETS chooses where, the AST walk below chooses what.

    python tests/generated_mutants.py --list                     # every generated mutant, nothing run
    python tests/generated_mutants.py --jobs 2 --json mut.json   # run them all (about an hour on 2 shared cores)
    python tests/generated_mutants.py --file lab/probe.py           # one core file's mutants
    python tests/generated_mutants.py --rerun mut.json           # only the survivors of an earlier run

The mutations (per AST node of a target): a binary operator swapped (+ -, * /, // /, % /, ** *, @ *), a comparison
flipped (< <=, > >=, == !=, is / is not, in / not in), and / or swapped, `not` and unary minus dropped, an int or float
constant n replaced by n + 1, True / False swapped, `x += y` made `x -= y` / `x = y`. Skipped: strings (messages),
f-strings, and the arguments of `raise` (a bad input's message is pinned by the one-line-error tests, not here).

Why not mutmut 3 itself: it mutates whole files through trampolines that torch.compile, autograd.Function and
subprocess-launched scripts (train.py, sample.py run as a user runs them) do not see, and its first step runs the
whole suite (11+ min) to map tests to functions; this generator is its operator set applied per function, in a plain
copy of the repo (tests/mutants.py's copy_repo), so every test sees the mutant the way it sees the code.

Result per mutant: killed (a selected test failed, or it ran past its timeout), SURVIVED (all passed: a missing test,
or an equivalent mutant: EQUIVALENT below gives each kept survivor's reason), ERROR (pytest itself broke, or nothing
selected). Exit status 1 if anything survived that EQUIVALENT below does not name.
"""

import argparse
import ast
import concurrent.futures
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import REPO, copy_repo  # noqa: E402

MODEL_TESTS = ('tests/test_model.py', '-k', 'not compiled and not activation and not gpt2')
QUICK = ('learning_rate or same_batches or grad_clip or best_val_loss or gradient_accumulation or batch_targets or '
         'estimate_loss or each_step_uses or evaluations_fall or mean_over_every_step')
TRAIN_QUICK = ('tests/test_train.py', '-k', QUICK)
TRAIN_LOOP = ('tests/test_train.py', '-k', QUICK + ' or resume_logs')    # a resumed run's first evaluation
TRAIN_STEP = ('tests/test_train.py', '-k', QUICK + ' or ddp_two_gloo')   # the DDP gradient sync
TRAIN_RESUME = ('tests/test_train.py', '-k', 'resume_logs or a_resumed_run_uses or saved_on_a_gpu or restore_state_sets')
TRAIN_EVAL = ('tests/test_train.py', '-k', QUICK + ' or fewer_eval_batches')  # a DDP evaluation (2 gloo processes)
# (file, qualified name, (first line's snippet, last line's snippet) or None for the whole function, its tests)
TARGETS = [
    ('model.py', 'laplacian_init', None, MODEL_TESTS),
    ('model.py', 'OPERATORS', None, MODEL_TESTS),
    ('model.py', 'apply_operator', None, MODEL_TESTS),
    ('model.py', 'CausalSelfAttention.forward', None, MODEL_TESTS),
    ('model.py', 'GPT.forward', None, MODEL_TESTS),
    ('model.py', 'GPT.configure_optimizers', None, MODEL_TESTS),
    ('model.py', 'GPT.generate', None, MODEL_TESTS),
    ('model.py', 'next_token', None, MODEL_TESTS),
    ('model.py', 'OperatorCoefficients.__init__', None, MODEL_TESTS),
    ('model.py', 'OperatorCoefficients.forward', None, MODEL_TESTS),
    ('model.py', 'NonNegative.Clamp.backward', None, MODEL_TESTS),
    ('model.py', 'KVCache.__len__', None, MODEL_TESTS),
    ('model.py', 'KVCache.Layer.extend', None, MODEL_TESTS),
    ('sources.py', 'Data.offsets', None, TRAIN_QUICK),
    ('sources.py', 'Data.batch', None, TRAIN_QUICK),
    ('train.py', 'get_lr', None, TRAIN_QUICK),
    ('train.py', 'estimate_loss', None, TRAIN_EVAL),
    # the loop: the learning rate set per group, the evaluation's bookkeeping, one optimizer step
    ('train.py', 'train', ('lr = get_lr(iter_num, cfg)', 'and not (resumed and iter_num == start_iter)'), TRAIN_LOOP),
    ('train.py', 'log_evaluation', ("improved = losses['val'] < progress['best_val_loss']",
                                    "progress['best_val_loss'] = min("), TRAIN_QUICK),
    ('train.py', 'train', ("offsets = data.offsets('train', cfg.gradient_accumulation_steps",
                           "window.loss += optimizer_step("), TRAIN_STEP),
    ('train.py', 'optimizer_step', None, TRAIN_STEP),
    ('run.py', 'checkpoint_state', None, TRAIN_RESUME),
    ('run.py', 'restore_state', None, TRAIN_RESUME),
    ('sample.py', 'main', ("device, device_type = cfg['device']", "print('---------------')"), ('tests/test_sample.py',)),
    ('lab/probe.py', 'sequences', None, ('tests/test_probe.py',)),
    ('lab/probe.py', 'probe', None, ('tests/test_probe.py',)),
    ('lab/probe.py', 'compare', None, ('tests/test_probe.py',)),
    ('lab/probe.py', 'main', ('mean, se = grads.mean(0)', 't = mean / se.clamp_min'), ('tests/test_probe.py',)),
]

# survivors triaged as equivalent, by key: 'file|the line, stripped|the mutation|its occurrence among equal ones'
# -> why no test can tell it from the code
EQUIVALENT = {
    'model.py|def forward(self, x, cache=None, return_probs=False):|False -> True|0':
        'every caller passes return_probs; the default is never used',
    'model.py|att = (q @ k_all.transpose(-2, -1)) / math.sqrt(k.size(-1))|USub dropped|0':
        'transpose(2, -1) of the 4-D keys is transpose(-2, -1)',
    "model.py|return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == 'cuda')|Eq -> NotEq|0":
        'fused and for-each AdamW compute the same update (speed only); CPU tests pass either way',
    'model.py|def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):|True -> False|0':
        'use_cache changes only the speed: cached = recomputed tokens is tested',
    'model.py|return logits.argmax(dim=-1, keepdim=True)|USub dropped|0':
        'logits are 2-D [B, vocab]: dim 1 is dim -1',
    'model.py|return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)|USub dropped|0':
        'logits are 2-D [B, vocab]: dim 1 is dim -1',
    'model.py|kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]|USub dropped|1':
        'logits are 2-D [B, vocab]: size(1) is size(-1)',
    'model.py|gamma0 = config.gamma_init + config.init_spread * (2 * torch.rand(config.n_head) - 1)|Add -> Sub|0':
        'gamma_init - spread·u for u uniform on [-1, 1] has the same law as gamma_init + spread·u',
    'model.py|return torch.where((raw > 0) | (grad < 0), grad, torch.zeros_like(grad))  # descent moves raw by -grad|Lt -> LtE|0':
        'at grad == 0 both branches give 0',
    'model.py|return 0 if self.layers[0].k is None else self.layers[0].k.size(2)|0 -> 1|1':
        "every layer's cache holds the same positions: layers[1] has layers[0]'s length",
    'model.py|return 0 if self.layers[0].k is None else self.layers[0].k.size(2)|0 -> 1|2':
        "every layer's cache holds the same positions: layers[1] has layers[0]'s length",
    'sources.py|return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)|True -> False|0':
        'non_blocking matters only on CUDA, for overlap, not values',
    'sources.py|return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)|True -> False|1':
        'non_blocking matters only on CUDA, for overlap, not values',
    'train.py|if it < cfg.warmup_iters:|Lt -> LtE|0':
        'at it == warmup_iters warmup and cosine both give learning_rate',
    'train.py|if it > cfg.lr_decay_iters:|Gt -> GtE|0':
        'at it == lr_decay_iters the cosine gives min_lr too',
    'train.py|total += torch.stack([loss.float(), torch.ones((), device=data.device)])|Add= -> Sub=|0':
        'the loss sum and the batch count both negated: their ratio is the same',
    'train.py|offsets = data.offsets(split, cfg.eval_iters, torch.Generator().manual_seed(cfg.seed + 1000 + i))|Add -> Sub|1':
        'another fixed evaluation seed, still one per split and apart from the training stream',
    'train.py|offsets = data.offsets(split, cfg.eval_iters, torch.Generator().manual_seed(cfg.seed + 1000 + i))|1000 -> 1001|0':
        'another fixed evaluation seed, still one per split and apart from the training stream',
    "train.py|improved = losses['val'] < progress['best_val_loss']|Lt -> LtE|0":
        'differs only at an exact tie of val losses, where either model is a best one',
    'train.py|optimizer.zero_grad(set_to_none=True)|True -> False|0':
        'zeroed gradients instead of None: the next backward writes the same values',
    "run.py|torch.manual_seed(cfg.seed + rank + 7919 * progress['iter_num'])  # (a DDP resume with dropout: not exact)|Add -> Sub|0":
        'another reseed, still distinct per rank (a DDP resume with dropout is documented as not exact)',
    "run.py|torch.manual_seed(cfg.seed + rank + 7919 * progress['iter_num'])  # (a DDP resume with dropout: not exact)|Add -> Sub|1":
        'another reseed, still distinct per rank (a DDP resume with dropout is documented as not exact)',
    "run.py|torch.manual_seed(cfg.seed + rank + 7919 * progress['iter_num'])  # (a DDP resume with dropout: not exact)|7919 -> 7920|0":
        'another reseed, still distinct per rank (a DDP resume with dropout is documented as not exact)',
    "model.py|self.register_buffer('anchor', torch.zeros(0), persistent=False)|0 -> 1|0":
        'the anchor carries a device and a dtype, not values: any size does',
    'train.py|offsets = data.offsets(split, cfg.eval_iters, torch.Generator().manual_seed(cfg.seed + 1000 + i))|Add -> Sub|0':
        'another fixed evaluation seed, still one per split and apart from the training stream',
    "lab/probe.py|for window in tqdm(windows, desc='probe', unit='seq', leave=False):|False -> True|0":
        "tqdm's leave= is display only",
    'lab/probe.py|clear = t.flatten().abs() > 2|Gt -> GtE|0':
        'differs only for |t| exactly 2',
}

BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
          ast.Mod: ast.Div, ast.Pow: ast.Mult, ast.MatMult: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
           ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}


def find(tree, qualname):
    """The node of a function (Class.method, Class.Inner.method) or of a module-level assignment."""
    body, node = tree.body, None
    for part in qualname.split('.'):
        matches = [n for n in body if (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
                   or (isinstance(n, ast.Assign) and any(getattr(t, 'id', None) == part for t in n.targets))]
        if len(matches) != 1:
            raise SystemExit(f"error: {qualname} not found once (part {part!r})")
        node = matches[0]
        body = getattr(node, 'body', [])
    return node


def skipped_regions(node):
    """Nodes whose insides are never mutated: docstrings, f-strings, raise statements."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, (ast.JoinedStr, ast.Raise)):
            out.append(n)
        if isinstance(n, ast.FunctionDef) and n.body and isinstance(n.body[0], ast.Expr) \
                and isinstance(n.body[0].value, ast.Constant) and isinstance(n.body[0].value.value, str):
            out.append(n.body[0])
    return out


def mutations(node):
    """(node to replace, its mutated copy, description) for each mutation of this node."""
    def variant(change, description):
        new = copy.deepcopy(node)
        change(new)
        return node, new, description
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        new_op = BINARY[type(node.op)]
        yield variant(lambda n: setattr(n, 'op', new_op()), f"{type(node.op).__name__} -> {new_op.__name__}")
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in COMPARE:
                new_op = COMPARE[type(op)]
                yield variant(lambda n, i=i, new_op=new_op: n.ops.__setitem__(i, new_op()),
                              f"{type(op).__name__} -> {new_op.__name__}")
    elif isinstance(node, ast.BoolOp):
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield variant(lambda n: setattr(n, 'op', other()), f"{type(node.op).__name__} -> {other.__name__}")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield node, node.operand, f"{type(node.op).__name__} dropped"
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        yield variant(lambda n: setattr(n, 'value', n.value + 1), f"{node.value!r} -> {node.value + 1!r}")
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield variant(lambda n: setattr(n, 'value', not n.value), f"{node.value} -> {not node.value}")
    elif isinstance(node, ast.AugAssign) and type(node.op) in BINARY:
        new_op = BINARY[type(node.op)]
        yield variant(lambda n: setattr(n, 'op', new_op()), f"{type(node.op).__name__}= -> {new_op.__name__}=")
        yield node, ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno), \
            f"{type(node.op).__name__}= -> ="


def char_offset(lines, lineno, byte_col):
    """ast's column (UTF-8 bytes) as a character index into the line."""
    return len(lines[lineno - 1].encode()[:byte_col].decode())


def generate():
    """Every mutant of TARGETS: dicts with file, function, line, text (the line), description, source, tests."""
    out = []
    for file, qualname, span, tests in TARGETS:
        source = (REPO / file).read_text()
        lines = source.splitlines(keepends=True)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line))
        tree = ast.parse(source)
        target = find(tree, qualname)
        first, last = target.lineno, target.end_lineno
        if span:
            where = [i + 1 for i in range(first - 1, last) if span[0] in lines[i]], \
                    [i + 1 for i in range(first - 1, last) if span[1] in lines[i]]
            if len(where[0]) != 1 or len(where[1]) != 1:
                raise SystemExit(f"error: {file}:{qualname}: the span's snippets must occur once each: {span}")
            first, last = where[0][0], where[1][0]
        skipped = skipped_regions(target)
        for node in ast.walk(target):
            if not hasattr(node, 'lineno') or node.lineno < first or node.end_lineno > last:
                continue
            if any(s.lineno <= node.lineno and node.end_lineno <= s.end_lineno and
                   (s.lineno, s.col_offset) <= (node.lineno, node.col_offset) and
                   (node.end_lineno, node.end_col_offset) <= (s.end_lineno, s.end_col_offset) for s in skipped):
                continue
            for old, new, description in mutations(node):
                a = starts[old.lineno - 1] + char_offset(lines, old.lineno, old.col_offset)
                b = starts[old.end_lineno - 1] + char_offset(lines, old.end_lineno, old.end_col_offset)
                text = ast.unparse(new)
                if not isinstance(old, (ast.stmt,)):
                    text = f"({text})"
                mutated = source[:a] + text + source[b:]
                try:
                    ast.parse(mutated)
                except SyntaxError:
                    continue
                out.append(dict(file=file, function=qualname, line=old.lineno, text=lines[old.lineno - 1].strip(),
                                description=description, source=mutated, tests=list(tests)))
    seen = {}
    for i, m in enumerate(out):  # the key names a mutant across edits elsewhere in its file (line numbers move)
        base = f"{m['file']}|{m['text']}|{m['description']}"
        m['id'], m['key'] = i, f"{base}|{seen.get(base, 0)}"
        seen[base] = seen.get(base, 0) + 1
    return out


def run_tests(copy_dir, tests, timeout):
    env = {**os.environ, 'PYTHONDONTWRITEBYTECODE': '1', 'OMP_NUM_THREADS': '1'}
    try:
        result = subprocess.run([sys.executable, '-m', 'pytest', '-x', '-q', '-n', '0', '-p', 'no:cacheprovider',
                                 *tests], cwd=copy_dir, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 'killed', 'timeout'
    tail = (result.stdout + result.stderr).strip().splitlines()[-1:]
    outcome = {0: 'SURVIVED', 1: 'killed'}.get(result.returncode, 'ERROR')
    return outcome, f"exit {result.returncode}: {' '.join(tail)}"


def worker(chosen, timeouts):
    """Run mutants in a repo copy of this worker's own; yields (mutant, outcome, detail, seconds)."""
    with tempfile.TemporaryDirectory(prefix='genmut-') as tmp:
        copy_dir = Path(tmp) / 'repo'
        copy_repo(copy_dir)
        results = []
        for m in chosen:
            path = copy_dir / m['file']
            original = path.read_text()
            path.write_text(m['source'])
            t0 = time.time()
            try:
                outcome, detail = run_tests(copy_dir, m['tests'], timeouts[tuple(m['tests'])])
            finally:
                path.write_text(original)
            results.append((m, outcome, detail, time.time() - t0))
            print(f"{outcome:8s} #{m['id']:<4d} {m['file']}:{m['line']} {m['function']}: {m['description']}  "
                  f"[{m['text'][:70]}]  {time.time() - t0:.0f} s", flush=True)
        return results


def key(m):
    return m['key']


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--list', action='store_true', help="print the mutants, run nothing")
    parser.add_argument('--file', default='', help="comma-separated core files (model.py,train.py,...)")
    parser.add_argument('--rerun', help="a --json file of an earlier run: run only its survivors")
    parser.add_argument('--jobs', type=int, default=1, help="mutants run at once, each in its own repo copy")
    parser.add_argument('--json', help="write every mutant's result here")
    args = parser.parse_args()
    chosen = generate()
    if args.file:
        chosen = [m for m in chosen if m['file'] in args.file.split(',')]
    if args.rerun:
        survivors = {r['key'] for r in json.loads(Path(args.rerun).read_text()) if r['outcome'] == 'SURVIVED'}
        chosen = [m for m in chosen if key(m) in survivors]
    if args.list:
        for m in chosen:
            print(f"#{m['id']:<4d} {m['file']}:{m['line']} {m['function']}: {m['description']}  [{m['text']}]")
        print(f"{len(chosen)} mutants")
        return
    start = time.time()
    # each selection's timeout: 3 × its unmutated time (and at least 60 s); a selection failing unmutated is fatal
    timeouts = {}
    with tempfile.TemporaryDirectory(prefix='genmut-base-') as tmp:
        copy_dir = Path(tmp) / 'repo'
        copy_repo(copy_dir)
        for tests in dict.fromkeys(tuple(m['tests']) for m in chosen):
            t0 = time.time()
            outcome, detail = run_tests(copy_dir, list(tests), 1800)
            if outcome != 'SURVIVED':
                sys.exit(f"error: the unmutated code fails {' '.join(tests)}: {detail}")
            timeouts[tests] = max(60.0, 3 * (time.time() - t0))
            print(f"baseline {time.time() - t0:.0f} s: {' '.join(tests)}", flush=True)
    shares = [chosen[i::args.jobs] for i in range(args.jobs)]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = [r for rs in pool.map(lambda share: worker(share, timeouts), shares) for r in rs]
    results.sort(key=lambda r: r[0]['id'])
    rows = [dict(id=m['id'], file=m['file'], function=m['function'], line=m['line'], text=m['text'],
                 description=m['description'], key=key(m), outcome=o, detail=d, seconds=round(s, 1),
                 equivalent=EQUIVALENT.get(key(m))) for m, o, d, s in results]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print('\nper file: generated, killed, survived (of them triaged equivalent), errors')
    for file in dict.fromkeys(r['file'] for r in rows):
        mine = [r for r in rows if r['file'] == file]
        survived = [r for r in mine if r['outcome'] == 'SURVIVED']
        print(f"  {file:10s} {len(mine):4d} {sum(r['outcome'] == 'killed' for r in mine):4d} {len(survived):4d} "
              f"({sum(bool(r['equivalent']) for r in survived)}) {sum(r['outcome'] == 'ERROR' for r in mine):3d}")
    unexplained = [r for r in rows if r['outcome'] == 'SURVIVED' and not r['equivalent']]
    for r in unexplained:
        print(f"SURVIVED #{r['id']} {r['file']}:{r['line']} {r['function']}: {r['description']}  [{r['text']}]")
    print(f"{len(rows)} mutants, {len(rows) - len(unexplained)} killed or equivalent, {len(unexplained)} unexplained "
          f"survivors, {time.time() - start:.0f} s")
    sys.exit(1 if unexplained else 0)


if __name__ == '__main__':
    main()
