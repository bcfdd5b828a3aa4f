"""lab/selfcheck.py: every part runs in its own process and ends in one line; a failing, raising or hanging part
is a FAIL line and a failing exit."""

import json
import re

import pytest
import torch

from lab import selfcheck
from conftest import run_script


def test_self_check_runs_each_part_in_its_own_process_and_summarises_it(tmp_path):
    """At tiny sizes on CPU: a line per part (the CUDA-only ones SKIP), check_summary.txt beside."""
    parts = 'environment,walk_and_math_path,cached_sampler,cuda_rng'
    result = run_script('lab.selfcheck', '--parts', parts, '--small', '--device', 'cpu', '--out_dir', tmp_path,
                        cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = (tmp_path / 'check_summary.txt').read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [['PASS', 'environment'], ['PASS', 'walk_and_math_path'],
                                                      ['PASS', 'cached_sampler'], ['SKIP', 'cuda_rng']]
    assert 'walk geometry 0.0e+00' in summary[1]  # the same computation on the same device: identical
    bad = run_script('lab.selfcheck', '--parts', 'environment,warp_drive', cwd=tmp_path)
    assert bad.returncode == 1 and 'unknown --parts warp_drive' in bad.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without CUDA')
def test_without_cuda_the_environment_fails_naming_the_fix_and_nothing_else_runs(tmp_path):
    """No --device: the check is of CUDA, so a torch without it is one FAIL line that says what to do, and the parts
    that would run GPT-2's sizes on the CPU SKIP; --device=cpu asks for the CPU path, which passes."""
    result = run_script('lab.selfcheck', '--out_dir', tmp_path, cwd=tmp_path)
    summary = (tmp_path / 'check_summary.txt').read_text().splitlines()
    assert result.returncode == 1 and summary[0].split()[:2] == ['FAIL', 'environment'], result.stdout[-3000:]
    assert 'CUDA is not available: torch ' in summary[0] and 'pass --device=cpu to check the CPU path' in summary[0]
    assert ('is a CPU-only build; install a CUDA build' in summary[0]) is (torch.version.cuda is None)
    assert [line.split()[:2] for line in summary[1:]] == [['SKIP', name] for name in list(selfcheck.CHECK_PARTS)[1:]]
    assert all(line.endswith('not run: the environment part failed') for line in summary[1:])
    assert result.stdout.count('== ') == 1  # one process started: the environment's
    # parts asked for without the environment's: it runs first all the same, and they SKIP
    some = run_script('lab.selfcheck', '--parts=correctness,cuda_rng', '--out_dir', tmp_path, cwd=tmp_path)
    summary = (tmp_path / 'check_summary.txt').read_text().splitlines()
    assert some.returncode == 1 and [line.split()[:2] for line in summary] == [
        ['FAIL', 'environment'], ['SKIP', 'correctness'], ['SKIP', 'cuda_rng']], some.stdout[-3000:]
    cpu = run_script('lab.selfcheck', '--device=cpu', '--parts=environment', '--out_dir', tmp_path, cwd=tmp_path)
    assert cpu.returncode == 0 and (tmp_path / 'check_summary.txt').read_text().startswith('PASS  environment')


def test_a_failing_or_raising_part_is_a_fail_line_and_a_failing_exit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(selfcheck, 'check_environment', lambda *a: (_ for _ in ()).throw(RuntimeError('no GPU\nmore')))
    selfcheck.run_check_part('environment', 'cpu', True, torch.float32)
    line = capsys.readouterr().out.strip()
    assert json.loads(line.removeprefix('CHECK ')) == dict(status='FAIL', message='RuntimeError: no GPU')

    def fake_run(command, **kwargs):  # the part's process: one hangs, one fails
        import subprocess
        if 'cuda_rng' in command:
            raise subprocess.TimeoutExpired(command, kwargs['timeout'])
        return subprocess.CompletedProcess(command, 0, 'CHECK {"status": "FAIL", "message": "grads 3e-1"}\n', '')
    monkeypatch.setattr(selfcheck.subprocess, 'run', fake_run)
    assert selfcheck.self_check('cpu', True, torch.float32, ['correctness', 'cuda_rng'], str(tmp_path)) == 1
    summary = (tmp_path / 'check_summary.txt').read_text()
    assert 'FAIL  correctness' in summary and 'grads 3e-1' in summary
    assert 'FAIL  cuda_rng' in summary and 'did not finish in 300 s' in summary


def test_the_kernel_part_marks_a_backend_that_fails_and_goes_on(monkeypatch):
    """One backend's RuntimeError inside the timed step (not only the probe's one line) is that backend's '-'."""
    real = selfcheck.timed
    monkeypatch.setattr(selfcheck, 'timed', lambda fn, device, *a: (_ for _ in ()).throw(RuntimeError('no kernel'))
                        if torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
                        else real(fn, device, *a))
    status, line = selfcheck.check_sdpa_kernels('cpu', True, torch.float32)
    assert status == 'PASS' and 'math -' in line and re.search(r'flash [\d.]+ ms', line), line
