"""Offline by default: the shared tiktoken cache when it exists, and no Hugging Face network calls."""

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / 'shared'  # ../shared beside the checkout, in CI and sessions
TIKTOKEN_CACHE = SHARED / 'tiktoken_cache'
WIKITEXT_TEST = SHARED / 'data' / 'wikitext-2-raw' / 'wiki.test.raw'

# pytest.ini's -n auto runs one worker process per core: each worker's torch, and every script it starts, gets its
# share of the cores (set before anything imports torch), not all of them, which would oversubscribe them
WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
if WORKERS > 1:
    os.environ.setdefault('OMP_NUM_THREADS', str(max(1, (os.cpu_count() or 1) // WORKERS)))

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
if TIKTOKEN_CACHE.is_dir():
    os.environ.setdefault('TIKTOKEN_CACHE_DIR', str(TIKTOKEN_CACHE))

needs_tokenizer = pytest.mark.skipif(not TIKTOKEN_CACHE.is_dir(),
                                     reason=f"GPT-2 BPE needs the offline tiktoken cache {TIKTOKEN_CACHE}")
needs_wikitext = pytest.mark.skipif(not WIKITEXT_TEST.is_file(), reason=f"no local copy at {WIKITEXT_TEST.parent}")

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO / 'data' / 'tinyshakespeare.txt'  # ships with the repo: no test skips for want of it

# The quick tier (`python -m pytest -m quick`, about 10 s on 2 idle cores as README says; its train tests train in
# this process, since a train.py process spends most of its time starting): what an edit to the model or the loop
# most likely breaks. The operator's identities, the fast path against the math path (values and
# gradients), causality, the KV cache, finite-difference gradients, the optimizer's groups, a tiny run that learns,
# gradient accumulation, and resume = uninterrupted. The whole suite is what CI runs.
QUICK = {
    'test_model.py': ('test_corridor_at_gamma0_delta1_is_attention', 'test_laplacian_heads_are_identity_minus_P',
                      'test_operator_is_cI_V_plus_cP_PV_with_P_built_by_hand', 'test_operator_coefficients_follow_the_table',
                      'test_fast_path_equals_math_path', 'test_future_tokens_never_change_the_past',
                      'test_fast_path_and_math_path_give_the_same_gradients',
                      'test_operator_scalar_gradients_match_finite_differences',
                      'test_kv_cached_generation_equals_recomputing_every_position',
                      'test_weight_decay_reaches_exactly_the_matrices_and_every_parameter_is_in_one_group'),
    'test_device.py': ('test_fast_path_math_path_and_sampling_run_on_the_models_device',),
    'test_train.py': ('test_tiny_model_learns_and_logs_every_heads_gamma_delta_at_every_eval',
                      'test_resume_logs_the_same_losses_bit_for_bit', 'test_gradient_accumulation_averages_micro_batches'),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.originalname in QUICK.get(item.path.name, ()):
            item.add_marker(pytest.mark.quick)


def run_script(script, *args, cwd, env=None):
    """Run one of the repo's commands as a user would: a top-level script by its file ('train.py'), a lab tool by its
    module ('lab.walk': `python -m lab.walk`, the checkout on the path as running it from the root puts it there);
    returns the CompletedProcess (text, not raising)."""
    import subprocess
    import sys
    env = {**os.environ, **(env or {})}
    if script.endswith('.py'):
        command = [str(REPO / script)]
    else:
        command = ['-m', script]
        env['PYTHONPATH'] = os.pathsep.join(filter(None, (str(REPO), env.get('PYTHONPATH'))))
    return subprocess.run([sys.executable, *command, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def run_in_process(main, argv, capsys):
    """(exit status, stderr) of a script's main(argv) under common.main_guard, as the command line would end: what a
    subprocess would give, without a process's start-up."""
    from common import main_guard
    capsys.readouterr()
    try:
        main_guard(lambda: main(argv))
        status = 0
    except SystemExit as e:
        status = e.code or 0
    return status, capsys.readouterr().err


def assert_one_line_error(result, *fragments):
    """A bad input: exit status 2, one `error: ...` line on stderr, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def tiny_llama_and_its_wikitext(root, train_sentences, test_sentences):
    """(model folder, dataset name): a random tiny Llama (4 query heads on 2 KV heads, seed 0) saved as a
    transformers folder with a word-level tokenizer, and WikiText-2-shaped files of synthetic_text prepared with
    that tokenizer by prepare.py, all under root."""
    import torch
    import transformers
    from test_walk import save_word_tokenizer
    text = synthetic_text(train_sentences)
    model_dir = root / 'tiny-llama'
    save_word_tokenizer(model_dir, text, bert=False)
    vocab = len(transformers.AutoTokenizer.from_pretrained(model_dir))
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)).save_pretrained(model_dir)
    (root / 'wiki').mkdir()
    (root / 'wiki' / 'wiki.valid.raw').write_text(text)
    (root / 'wiki' / 'wiki.test.raw').write_text(synthetic_text(test_sentences, seed=1))
    result = run_script('prepare.py', 'wikitext2', '--input', root / 'wiki', f'--tokenizer={model_dir}',
                        '--data_root', root, cwd=root)
    assert result.returncode == 0, result.stderr[-2000:]
    return model_dir, 'wikitext2_tiny-llama'


def synthetic_text(n_sentences=1500, seed=0):
    """Deterministic pseudo-English with real structure (a small grammar), so a tiny model's loss can fall."""
    import random
    rng = random.Random(seed)
    subjects = ['the cat', 'a dog', 'my friend', 'the old king', 'her brother', 'a bird']
    verbs = ['sees', 'likes', 'follows', 'calls', 'finds', 'hears']
    objects = ['the moon', 'a red ball', 'the river', 'his horse', 'the queen', 'a small boat']
    return ''.join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}.\n"
                   for _ in range(n_sentences))


# a tiny model that trains in seconds on CPU; tests add --out_dir, --max_iters, ...
TINY_TRAIN_ARGS = ['--dataset=tiny', '--device=cpu', '--compile=False', '--n_layer=2', '--n_head=2', '--n_embd=32',
                   '--block_size=32', '--batch_size=8', '--gradient_accumulation_steps=1', '--learning_rate=3e-3',
                   '--warmup_iters=5', '--min_lr=3e-4', '--eval_iters=5', '--log_interval=10']


@pytest.fixture(scope='session')
def tiny_data_root(tmp_path_factory):
    """data_root with a char-level dataset 'tiny' made by prepare.py from synthetic text."""
    root = tmp_path_factory.mktemp('data')
    (root / 'tiny.txt').write_text(synthetic_text())
    result = run_script('prepare.py', 'text', '--input', root / 'tiny.txt', '--tokenizer', 'char',
                        '--data_root', root, cwd=root)
    assert result.returncode == 0, result.stderr
    return root


@pytest.fixture(scope='session')
def trained_run(tiny_data_root, tmp_path_factory):
    """A finished tiny corridor run (out_dir with ckpt.pt, log.jsonl with the walk geometry, config.json), trained
    in this process: a train.py process would spend most of its time starting (the quick tier's cost)."""
    import signal
    import train
    out = tmp_path_factory.mktemp('run') / 'out'
    with pytest.MonkeyPatch.context() as m:
        m.setattr(signal, 'signal', lambda *a: None)  # in-process: leave pytest's handlers alone
        train.main([*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={out}', '--operator=corridor',
                    '--init_spread=0.2', '--max_iters=60', '--lr_decay_iters=60', '--eval_interval=20',
                    '--walk_interval=20', '--walk_seqs=4'])
    return out


@pytest.fixture(scope='session')
def unsaved_run(tiny_data_root, tmp_path_factory):
    """A run folder that saved no checkpoint (config.json, and log.jsonl with its iteration-0 evaluation), as a run
    stopped before its first evaluation after iteration 0 leaves it; here max_iters=0 ends it there."""
    import signal
    import train
    out = tmp_path_factory.mktemp('unsaved') / 'out'
    with pytest.MonkeyPatch.context() as m:
        m.setattr(signal, 'signal', lambda *a: None)
        train.main([*TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', f'--out_dir={out}', '--operator=corridor',
                    '--gamma_init=-0.2', '--max_iters=0', '--lr_decay_iters=10', '--warmup_iters=1',
                    '--eval_interval=10'])
    assert sorted(p.name for p in out.iterdir()) == ['config.json', 'log.jsonl', 'train.lock']
    return out
