"""sample.py: the requested number of tokens, deterministic under a seed, one-line errors."""

import pytest
import torch

from conftest import assert_one_line_error, run_script

SEPARATOR = '---------------'


def samples(result):
    assert result.returncode == 0, result.stderr[-2000:]
    parts = result.stdout.split(SEPARATOR + '\n')
    assert parts[-1] == ''
    return [p[:-1] for p in parts[:-1]]  # each sample is followed by a newline, then the separator


def test_prints_the_requested_number_of_tokens_deterministically(trained_run, tmp_path):
    args = [f'--out_dir={trained_run}', '--start=the cat', '--num_samples=3', '--max_new_tokens=37', '--device=cpu']
    first = samples(run_script('sample.py', *args, '--seed=1', cwd=tmp_path))
    assert len(first) == 3
    for text in first:  # character-level: one token, one character
        assert text.startswith('the cat') and len(text) == len('the cat') + 37
    assert samples(run_script('sample.py', *args, '--seed=1', cwd=tmp_path)) == first
    assert samples(run_script('sample.py', *args, '--seed=2', cwd=tmp_path)) != first
    uncached = samples(run_script('sample.py', *args, '--seed=1', '--use_cache=False', cwd=tmp_path))
    assert uncached == first  # the KV cache changes nothing but the speed


def test_top_k_none_samples_from_every_token(trained_run, tmp_path):
    out = samples(run_script('sample.py', f'--out_dir={trained_run}', '--top_k=None', '--num_samples=1',
                             '--max_new_tokens=9', '--device=cpu', cwd=tmp_path))
    assert len(out[0]) == 1 + 9  # the default prompt is one newline


def test_prompt_from_a_file(trained_run, tmp_path):
    (tmp_path / 'prompt.txt').write_text('a dog sees')
    out = samples(run_script('sample.py', f'--out_dir={trained_run}', '--start=FILE:prompt.txt', '--num_samples=1',
                             '--max_new_tokens=5', '--temperature=0', '--device=cpu', cwd=tmp_path))
    assert len(out) == 1 and out[0].startswith('a dog sees') and len(out[0]) == len('a dog sees') + 5


def test_bad_input_is_one_line(trained_run, tmp_path):
    def sample(*args):
        return run_script('sample.py', '--device=cpu', *args, cwd=tmp_path)
    assert_one_line_error(sample('--out_dir=nowhere'), "'nowhere' is not a run folder")
    assert_one_line_error(sample(f'--out_dir={trained_run}', '--start=Zebra!'), "not in the model's vocabulary")
    assert_one_line_error(sample(f'--out_dir={trained_run}', '--start=FILE:missing.txt'), "prompt file")
    assert_one_line_error(sample(f'--out_dir={trained_run}', '--max_new_tokens=0'), "max_new_tokens must be")
    assert_one_line_error(sample(f'--out_dir={trained_run}', '--top_kk=5'), "(did you mean 'top_k'?)")
    assert_one_line_error(sample(f'--out_dir={trained_run}', '--top_k=0'), "top_k must be at least 1")
    assert_one_line_error(sample(f'--out_dir={trained_run}', '--dtype=float8'), "dtype must be")
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'ckpt.pt').write_bytes((trained_run / 'ckpt.pt').read_bytes()[:1000])
    assert_one_line_error(sample(f'--out_dir={broken}'), 'is not a readable checkpoint')
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert_one_line_error(sample(f'--out_dir={empty}'), 'is neither a run folder with ckpt.pt nor')


def test_a_run_folder_that_saved_no_checkpoint_is_named_so_with_when_it_saves_one(unsaved_run, tmp_path):
    """Its config.json is a run's, not a transformers model's: the line says the run saved no ckpt.pt yet, when it
    writes one (its first evaluation after iteration 0) and what to run."""
    assert_one_line_error(run_script('sample.py', f'--out_dir={unsaved_run}', cwd=tmp_path),
                          f"{unsaved_run} holds a train.py run with no ckpt.pt yet", "(iter 10)",
                          "run its train.py command again")


def test_a_run_folder_given_where_a_config_file_goes_suggests_out_dir_and_the_suggestion_samples(trained_run,
                                                                                                   unsaved_run, tmp_path):
    """`python sample.py out-shakespeare-char`: the folder is named a run folder, with the --out_dir flag that samples
    it (quoted for the shell where the name needs it), which then does; any other folder gets both ways to name one."""
    result = run_script('sample.py', trained_run.name, '--device=cpu', cwd=trained_run.parent)
    assert_one_line_error(result, f"'{trained_run.name}' is a run folder, not a config file "
                                  f"(did you mean --out_dir={trained_run.name}?)")
    suggested = result.stderr.split('did you mean ')[1].split('?)')[0]
    assert samples(run_script('sample.py', suggested, '--num_samples=1', '--max_new_tokens=3', '--device=cpu',
                              cwd=trained_run.parent))
    spaced = tmp_path / 'my run'
    spaced.mkdir()
    (spaced / 'log.jsonl').write_bytes((unsaved_run / 'log.jsonl').read_bytes())  # a run's first moment
    assert_one_line_error(run_script('sample.py', 'my run', cwd=tmp_path), "(did you mean '--out_dir=my run'?)")
    (tmp_path / 'weights').mkdir()
    assert_one_line_error(run_script('sample.py', 'weights', cwd=tmp_path), "'weights' is a folder, not a config file",
                          '--out_dir=FOLDER', '--init_from=FOLDER')
    assert_one_line_error(run_script('sample.py', 'nowhere.py', cwd=tmp_path), "config file 'nowhere.py' not found")


def test_out_dir_is_refused_where_init_from_does_not_read_it(trained_run, tmp_path):
    """--out_dir names the run to sample only with init_from='resume' (the default): set beside another source it
    would be ignored, so it is one line, even when set to its default."""
    for out_dir in (trained_run, 'out'):
        assert_one_line_error(run_script('sample.py', '--init_from=gpt2', f'--out_dir={out_dir}', cwd=tmp_path),
                              "out_dir names the run folder to sample with init_from='resume'")


def test_the_samples_of_one_call_differ_and_continue_one_random_stream(trained_run, tmp_path):
    """num_samples draws from one seeded generator, one after another: the samples differ from each other, and
    are what model.generate gives called that many times in a row with that generator (float32 on the CPU, as the
    script runs here)."""
    from sources import load_model, tokenizer_from_meta
    n, new = 4, 30
    out = samples(run_script('sample.py', f'--out_dir={trained_run}', '--start=the cat', f'--num_samples={n}',
                             f'--max_new_tokens={new}', '--temperature=1.0', '--top_k=None', '--seed=3',
                             '--device=cpu', cwd=tmp_path))
    assert len(out) == n and len(set(out)) == n
    model, meta = load_model(str(trained_run))
    encode, decode = tokenizer_from_meta(meta)
    generator = torch.Generator().manual_seed(3)
    prompt = torch.tensor(encode('the cat'))[None]
    with torch.no_grad():
        expected = [decode(model.eval().generate(prompt, new, temperature=1.0, top_k=None,
                                                 generator=generator)[0].tolist()) for _ in range(n)]
    assert out == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason='CUDA is available here: the device is not missing')
def test_a_cuda_device_without_cuda_is_one_line(trained_run, tmp_path):
    assert_one_line_error(run_script('sample.py', f'--out_dir={trained_run}', '--device=cuda', cwd=tmp_path),
                          "device='cuda' but CUDA is not available here (use --device=cpu)")


def test_the_dtype_is_the_autocast_the_samples_are_drawn_under(trained_run, monkeypatch, capsys):
    """--dtype=bfloat16 samples under bf16 autocast, float32 under none (in this process, autocast recorded)."""
    import sample
    entered, real = {}, torch.autocast

    def recorded(device, dtype=None, *args, **kwargs):
        if kwargs.get('enabled', True):  # an autocast that is off computes in float32: not one entered
            entered.setdefault(run_dtype, set()).add((device, dtype))
        return real(device, dtype, *args, **kwargs)
    monkeypatch.setattr(torch, 'autocast', recorded)
    for run_dtype in ('float32', 'bfloat16'):
        sample.main([f'--out_dir={trained_run}', '--num_samples=1', '--max_new_tokens=3', '--device=cpu',
                     f'--dtype={run_dtype}'])
    assert entered == {'bfloat16': {('cpu', torch.bfloat16)}} and capsys.readouterr().out.count(SEPARATOR) == 2
