"""lab/bench.py runs end to end at a tiny size and reports every measurement (no timing assertions)."""

import json
import math
from contextlib import nullcontext

import torch

from lab import bench
from conftest import REPO, run_script


def test_bench_tiny_preset_runs_end_to_end(tmp_path):
    result = run_script('lab.bench', '--preset', 'tiny', '--device', 'cpu', '--out_dir', tmp_path / 'out', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    # the headline comes right after the training table (a run cut short keeps it), and again as the last line
    headline = [i for i, line in enumerate(lines) if line.startswith('ratio corridor/attention (compiled): ')]
    assert len(headline) == 2 and headline[1] == len(lines) - 1
    assert lines[headline[0] - 1].lstrip().startswith('corridor') and 'compiled' in lines[headline[0] - 1]
    float(lines[-1].split(': ')[1])
    results = json.loads((tmp_path / 'out' / 'bench_tiny.json').read_text())
    assert set(results['training']) == {'attention/eager', 'attention/compiled', 'corridor/eager', 'corridor/compiled'}
    for entry in results['training'].values():
        assert entry['tokens_per_s'] > 0 and entry['memory_bytes'] > 0 and entry['mfu'] is None  # no MFU on CPU
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
