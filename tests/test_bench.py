"""bench.py runs end to end at a tiny size and reports every measurement (no timing assertions)."""

import json

from conftest import run_script


def test_bench_tiny_preset_runs_end_to_end(tmp_path):
    result = run_script('bench.py', '--preset', 'tiny', '--device', 'cpu', '--json', tmp_path / 'bench.json',
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith('ratio corridor/attention (compiled): ')
    float(lines[-1].split(': ')[1])
    results = json.loads((tmp_path / 'bench.json').read_text())
    assert set(results['training']) == {'attention/eager', 'attention/compiled', 'corridor/eager', 'corridor/compiled'}
    for entry in results['training'].values():
        assert entry['tokens_per_s'] > 0 and entry['memory_bytes'] > 0 and entry['mfu'] is None  # no MFU on CPU
    # the corridor keeps no more activations than attention, eager and compiled
    assert results['training']['corridor/compiled']['memory_vs_attention'] < 1.001
    assert results['training']['corridor/eager']['memory_vs_attention'] < 1.001
    # the math path holds the T×T matrices, the fast path does not
    for length, entry in results['paths'].items():
        assert entry['math_memory_bytes'] > entry['fast_memory_bytes']
    assert results['kv_cache']['speedup'] > 0 and results['walk']['speedup'] > 0
