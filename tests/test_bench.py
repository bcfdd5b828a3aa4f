"""lab/bench.py runs end to end at a tiny size and reports every measurement (no timing assertions)."""

import csv
import inspect
import json
import math
import re
from contextlib import nullcontext

import pytest
import torch

from lab import bench
from conftest import REPO, run_script


def test_bench_tiny_preset_runs_end_to_end(tmp_path):
    result = run_script('lab.bench', '--preset', 'tiny', '--device', 'cpu', '--out_dir', tmp_path / 'out',
                        '--pairs_csv', tmp_path / 'pairs.csv', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    # the headline comes right after the training table (a run cut short keeps it; then the CSV's line), and again
    # as the last line: the ratio and its CI
    headline = [i for i, line in enumerate(lines) if line.startswith('ratio corridor/attention (compiled): ')]
    assert len(headline) == 2 and headline[1] == len(lines) - 1
    assert lines[headline[0] - 1].lstrip().startswith('corridor') and 'compiled' in lines[headline[0] - 1]
    ratio, low, high = map(float, re.fullmatch(r'(\S+) \[(\S+), (\S+)\]', lines[-1].split(': ')[1]).groups())
    results = json.loads((tmp_path / 'out' / 'bench_tiny.json').read_text())
    assert set(results['training']) == {'attention/eager', 'attention/compiled', 'corridor/eager', 'corridor/compiled'}
    corridor = results['training']['corridor/compiled']
    assert [round(ratio, 3), round(low, 3), round(high, 3)] == \
        [round(x, 3) for x in [corridor['throughput_vs_attention'], *corridor['throughput_vs_attention_ci']]]
    for entry in results['training'].values():
        assert entry['tokens_per_s'] > 0 and entry['memory_bytes'] > 0 and entry['mfu'] is None  # no MFU on CPU
    # the round times: one row per mode and round, the columns docs/per_seed/throughput.csv has
    with open(tmp_path / 'pairs.csv') as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(bench.PAIRS_COLUMNS)
    p = bench.PRESETS['tiny']
    assert [(r['mode'], int(r['pair'])) for r in rows] == [(m, i) for m in p['modes'] for i in range(p['rounds'])]
    assert all(int(r['steps']) == p['steps'] and int(r['threads']) == results['threads'] for r in rows)
    # the plain operator line's cost: one [B, T, C] float32 activation per layer kept beyond attention's (its sum,
    # for c_proj's backward), and the scalars; eager and compiled
    p = bench.PRESETS['tiny']
    activation = p['batch_size'] * p['block_size'] * p['n_embd'] * 4
    for mode in ('eager', 'compiled'):
        extra = results['training'][f'corridor/{mode}']['memory_bytes'] - \
            results['training'][f'attention/{mode}']['memory_bytes']
        assert 0 <= extra <= p['n_layer'] * (activation + 8 * 4 * p['n_head']), (mode, extra)
    # The operator line's traffic as counted from Inductor's C++ kernels, in [B, T, C] activations: forward, one
    # fused pass (read V, P·V, write the sum); backward, no more than the old fused epilogue's 8 + 4·n_head / n_embd
    # on this backend (measured: 6.0)
    epilogue = results['epilogue']
    assert epilogue['backend'].startswith('cpp')
    assert math.isclose(epilogue['forward_activations'], 3, abs_tol=0.01) and epilogue['forward_kernels'] == 1
    assert 4 <= epilogue['backward_activations'] <= 6.1
    h100, h200 = epilogue['predicted_ratio']['H100 SXM'], epilogue['predicted_ratio']['H200']
    assert 0.9 < h100[0] < h200[0] < 1 and h100[1] < h100[0]  # more bandwidth, or a slower step: closer to 1
    # the two short train.py runs: their own log lines, parsed
    for form in ('attention', 'corridor'):
        run = results['train_runs'][form]
        assert run['tokens_per_s'] > 0 and run['ms_per_iter'] > 0 and math.isfinite(run['last_loss'])
        assert run['mfu'] is None and run['peak_memory_bytes'] is None  # CPU
        assert (tmp_path / 'out' / f'bench_tiny_train_{form}.log').read_text().count('iter ') >= 2
    # the math path holds the T×T matrices, the fast path does not
    for length, entry in results['paths'].items():
        assert entry['math_memory_bytes'] > entry['fast_memory_bytes']
    assert results['kv_cache']['speedup'] > 0 and results['walk']['speedup'] > 0


def test_ratio_is_the_geometric_mean_of_paired_ratios_with_a_t_interval_of_their_logs():
    """Per-round log-ratios 0.1, 0.3, 0.2: mean 0.2, SD 0.1, t(0.975, 2 df) = 4.302653 (a printed t table), so the
    ratio is e^0.2 with the 95 % CI e^(0.2 ± 4.302653 · 0.1 / √3); the rounds' own lengths (2, 1, 3 s) drop out."""
    corridor = [2.0, 1.0, 3.0]
    attention = [t * math.exp(d) for t, d in zip(corridor, (0.1, 0.3, 0.2))]
    ratio, low, high = bench.throughput_ratio(attention, corridor)
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert math.isclose(ratio, math.exp(0.2), rel_tol=1e-12)
    assert math.isclose(low, math.exp(0.2 - half), rel_tol=1e-6) and math.isclose(high, math.exp(0.2 + half), rel_tol=1e-6)
    assert bench.fmt_ratio((ratio, low, high)) == '1.221 [0.953, 1.566]'
    # the tokens/s column's quotient is the ratio: with medians, tokens/s (2 s against 2.2 s: corridor 0.909) and the
    # median of paired ratios (2, 0.909, 1.034: corridor 1.034) can point in opposite directions
    attention, corridor = [1.0, 2.0, 3.0], [0.5, 2.2, 2.9]
    assert math.isclose(bench.per_second(768, corridor) / bench.per_second(768, attention),
                        bench.throughput_ratio(attention, corridor)[0], rel_tol=1e-12)
    assert all(math.isnan(x) for x in bench.throughput_ratio([1.0], [0.9])[1:])  # one round: no interval


def test_from_forty_rounds_the_interval_is_over_batch_means_of_neighbouring_rounds():
    """60 rounds whose log-ratios drift together in runs of three (a load that lasts a few rounds): the interval is
    the t-interval of the 20 means of three consecutive rounds, 19 df, wider than one over the 60 rounds alone."""
    from scipy import stats
    logs = [0.05 * ((k // 3) % 4 - 1.5) + 0.001 * (k % 3) for k in range(60)]
    ratio, low, high = bench.throughput_ratio([math.exp(x) for x in logs], [1.0] * 60)
    means = [sum(logs[3 * k:3 * k + 3]) / 3 for k in range(20)]
    mean = sum(means) / 20
    half = stats.t.ppf(0.975, 19) * math.sqrt(sum((m - mean) ** 2 for m in means) / 19 / 20)
    assert ratio == pytest.approx(math.exp(sum(logs) / 60)) and (low, high) == pytest.approx(
        (math.exp(mean - half), math.exp(mean + half)))
    naive = stats.t.ppf(0.975, 59) * math.sqrt(sum((x - mean) ** 2 for x in logs) / 59 / 60)
    assert half > naive  # the rounds' own spread would understate it


def test_a_faster_corridor_has_a_ratio_above_1_in_the_table_and_the_csv(monkeypatch, tmp_path):
    """bench_training with its timer replaced: round k's attention step takes 1 + 0.1k s, the corridor's 1.25 times
    less, then × 1.05 and ÷ 1.05 by turns; so the corridor's ratio is 1.25 exactly, and its CI (from the ±log 1.05
    spread, t on 3 df) lies above 1. The CSV holds those times × steps, and recomputes the same ratio."""
    rounds = {'attention': 0, 'corridor': 0}

    def fake_timed(fn, device, repeats=1):
        form = inspect.getclosurevars(fn).nonlocals['variant'][0].config.operator  # the model this timing runs
        k, rounds[form] = rounds[form], rounds[form] + 1
        return (1 + 0.1 * k) / (1 if form == 'attention' else 1.25 * 1.05 ** (-1) ** k)
    monkeypatch.setattr(bench, 'timed', fake_timed)
    p = {**bench.PRESETS['tiny'], 'modes': ('eager',), 'rounds': 4, 'steps': 3}
    results = dict(device='CPU', threads=1, torch=torch.__version__, training={})
    bench.bench_training(p, 'cpu', nullcontext, results)
    corridor, attention = results['training']['corridor/eager'], results['training']['attention/eager']
    assert math.isclose(corridor['throughput_vs_attention'], 1.25, rel_tol=1e-12)
    assert math.isclose(corridor['tokens_per_s'] / attention['tokens_per_s'], 1.25, rel_tol=1e-12)
    assert 1 < corridor['throughput_vs_attention_ci'][0] < 1.25 < corridor['throughput_vs_attention_ci'][1]
    bench.write_pairs(tmp_path / 'pairs.csv', p, results)
    with open(tmp_path / 'pairs.csv') as f:
        rows = list(csv.DictReader(f))
    assert [r['pair'] for r in rows] == ['0', '1', '2', '3'] and {r['mode'] for r in rows} == {'eager'}
    assert [float(r['attention_seconds']) for r in rows] == [3.0, 3.3, 3.6, 3.9]
    assert bench.throughput_ratio([float(r['attention_seconds']) for r in rows],
                                  [float(r['corridor_seconds']) for r in rows])[0] == pytest.approx(1.25, rel=1e-6)


def test_versus_dtype_times_the_same_variants_in_another_dtype_each_under_its_own_autocast(monkeypatch):
    """--dtype=bfloat16 --versus_dtype=float32: each form also built and stepped in float32, interleaved; here a
    float32 step is timed at twice a bf16 one, so bf16's throughput over float32's is 2 exactly. The warm-up steps
    run for real, so the memory ratio is bf16's own: its saved activations take half float32's bytes."""
    def fake_timed(fn, device, repeats=1):
        return 2.0 if inspect.getclosurevars(fn).nonlocals['variant'][3] == 'float32' else 1.0
    monkeypatch.setattr(bench, 'timed', fake_timed)
    p = {**bench.PRESETS['tiny'], 'modes': ('eager',), 'rounds': 2, 'steps': 1, 'dtype': 'bfloat16',
         'versus_dtype': 'float32'}
    results = dict(device='CPU', threads=1, torch=torch.__version__, training={})
    bench.bench_training(p, 'cpu', lambda: torch.autocast('cpu', dtype=torch.bfloat16), results,
                         versus=lambda: torch.autocast('cpu', dtype=torch.float32, enabled=False))
    for form in p['forms']:
        entry = results['training'][f'{form}/eager']
        assert entry['versus_dtype'] == 'float32' and entry['throughput_vs_dtype'] == pytest.approx(2.0, rel=1e-12)
        assert 0.5 <= entry['memory_vs_dtype'] < 0.8


def test_corridor_settled_preset_is_the_studys_model_batch_and_thread():
    """The preset times what configs/_sweep_cpu.py trained in the corridor_settled study (on WikiText-2 (char), 409
    characters) at lab/sweep.py --parallel=2's one thread a run; a bad --pairs_csv or --threads is one line."""
    from common import parse_config
    from train import DEFAULTS
    config = parse_config(DEFAULTS, [str(REPO / 'configs' / '_sweep_cpu.py')])
    p = bench.PRESETS['corridor_settled']
    for key in ('n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'batch_size', 'dtype'):
        assert p[key] == config[key], key
    assert config['gradient_accumulation_steps'] == 1 and p['threads'] == 1 and p['rounds'] >= 20
    assert p['vocab_size'] == 409 and set(p['forms']) == {'attention', 'corridor'}
    with pytest.raises(SystemExit, match=r'^error: --pairs_csv needs the training step of attention and corridor'):
        bench.main(['--preset', 'tiny', '--forms', 'attention', '--pairs_csv', 'x.csv'])
    with pytest.raises(SystemExit, match=r'^error: --threads must be at least 1, got 0$'):
        bench.main(['--preset', 'tiny', '--threads', '0'])


def test_timed_compiled_models_are_the_static_shape_graphs_train_py_runs(monkeypatch):
    """Even after a compile of the same model code at another batch size (the GPU preset's compile check), the
    timed graphs see fixed sizes, not a dynamic batch dimension."""
    shapes, real_compile = [], torch.compile

    def recording_compile(model, **kwargs):
        def backend(graph, example_inputs):  # the graph Dynamo hands the compiler, run eagerly: only shapes matter
            shapes.extend(tuple(node.meta['example_value'].shape) for node in graph.graph.find_nodes(op='placeholder')
                          if isinstance(node.meta.get('example_value'), torch.Tensor))
            return graph.forward
        return real_compile(model, backend=backend, **kwargs)
    monkeypatch.setattr(torch, 'compile', recording_compile)
    p = {**bench.PRESETS['tiny'], 'modes': ('compiled',), 'rounds': 1, 'batch_size': 3}
    bench.compile_check(p, 'cpu', nullcontext, {})  # batch 2
    shapes.clear()
    bench.bench_training(p, 'cpu', nullcontext, {'training': {}})  # batch 3
    assert (3, 64) in shapes and all(isinstance(size, int) for shape in shapes for size in shape)


def test_device_synchronization_and_memory_statistics_use_the_given_device(monkeypatch, tmp_path):
    """--device, not the current device, everywhere; a bare 'cuda' becomes the current device's index. (CUDA's
    functions are stand-ins that record what they were asked: no GPU here.)"""
    calls = []
    for name in ('synchronize', 'reset_peak_memory_stats', 'memory_allocated', 'max_memory_allocated',
                 'set_device', 'get_device_name'):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, name=name: calls.append((name, device)) or 0)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 1)
    with bench.Memory('cuda:1'):
        pass
    bench.timed(lambda: None, 'cuda:1')
    assert len(calls) == 7 and all(device == 'cuda:1' for _, device in calls)
    calls.clear()
    everything = 'training,epilogue,train_runs,compile_check,paths,kv_cache,walk'
    bench.main(['--preset', 'tiny', '--device', 'cuda', '--skip', everything, '--out_dir', str(tmp_path)])
    assert calls == [('set_device', 'cuda:1'), ('get_device_name', 'cuda:1')]


def test_baseline_times_another_model_py_beside_this_one(tmp_path):
    """--baseline: the same variants built from another model.py (here a copy of this one), interleaved; identical
    code keeps identical activations, and a revision that is neither a file nor in git is one line."""
    copy = tmp_path / 'model_copy.py'
    copy.write_text((REPO / 'model.py').read_text())
    result = run_script('lab.bench', '--preset', 'tiny', '--device', 'cpu', '--out_dir', tmp_path, '--baseline', copy,
                        '--skip', 'epilogue,train_runs,paths,kv_cache,walk', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'against the baseline model.py' in result.stdout
    for entry in json.loads((tmp_path / 'bench_tiny.json').read_text())['training'].values():
        assert entry['memory_vs_baseline'] == 1.0 and entry['throughput_vs_baseline'] > 0
    bad = run_script('lab.bench', '--preset', 'tiny', '--baseline', 'no-such-revision', cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: --baseline 'no-such-revision' is neither a file nor a git revision with a model.py"]
