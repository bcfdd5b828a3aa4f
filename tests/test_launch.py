"""lab/launch.py: a run's GPUs on one node, the commands for any scheduler, submitit's local executor and a real
one-node SLURM (tests/slurm_local.sh), each interrupted run resumed to the same bits as one trained straight through."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from common import UserError
from sources import load_checkpoint
from conftest import REPO, TINY_TRAIN_ARGS, run_script
from lab import launch, sweep
from lab.studies import Part, run_state

# long enough to be stopped part way (400 iterations, 2-5 s of training on 2 cores), evaluated every 100
RUN = [*TINY_TRAIN_ARGS, '--max_iters=400', '--lr_decay_iters=400', '--eval_interval=100', '--eval_iters=2']
# under SLURM a signal travels through slurmctld and slurmd: runs 4x longer, so that on a loaded machine a cancel
# sent after the first evaluation still lands mid-run
SLURM_RUN = [*TINY_TRAIN_ARGS, '--max_iters=1600', '--lr_decay_iters=1600', '--eval_interval=200', '--eval_iters=2']
ONE_THREAD = {'OMP_NUM_THREADS': '1'}  # two runs at once on 2 cores, without oversubscribing them
VARIANTS = ('attention', 'corridor')
BASE = str(REPO / 'configs' / '_sweep_cpu.py')


def wait_for(condition, timeout, what):
    """Poll until condition() is true; fail (never hang) after timeout seconds."""
    end = time.time() + timeout
    while not condition():
        if time.time() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def evaluated(out_dir):
    """True once train.py logged its first evaluation (iteration 0): its stop handler is in place, training began."""
    path = os.path.join(out_dir, 'log.jsonl')
    return os.path.isfile(path) and open(path).read().endswith('\n')


def val_losses(out_dir):
    return [(r['iter'], r['val_loss']) for r in map(json.loads, open(os.path.join(out_dir, 'log.jsonl')))]


def assert_same_as_straight(out_dir, straight_dir):
    """The same evaluations, bit for bit, and the same final weights as the run trained without a stop."""
    assert val_losses(out_dir) == val_losses(straight_dir)
    got, want = (load_checkpoint(os.path.join(d, 'ckpt.pt')) for d in (out_dir, straight_dir))
    assert got['iter_num'] == want['iter_num'] == want['config']['max_iters']
    assert got['model'].keys() == want['model'].keys()
    assert all(torch.equal(got['model'][k], want['model'][k]) for k in want['model'])


def study_runs(out_root, data_root, run=RUN):
    return sweep.plan_runs([Part(None, VARIANTS, 1)], str(out_root), BASE, [*run, f'--data_root={data_root}'])


def train_straight(out_root, data_root, run):
    """{variant: out_dir} of the study's two runs, trained without interruption (both at once)."""
    runs = study_runs(out_root, data_root, run)
    processes = [subprocess.Popen([sys.executable, str(REPO / 'train.py'), *args], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env={**os.environ, **ONE_THREAD}) for _, args in runs.values()]
    for p in processes:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
    return {variant: out_dir for (_, variant, _), (out_dir, _) in runs.items()}


@pytest.fixture(scope='module')
def straight(tiny_data_root, tmp_path_factory):
    return train_straight(tmp_path_factory.mktemp('straight'), tiny_data_root, RUN)


@pytest.fixture(scope='module')
def straight_slurm(tiny_data_root, tmp_path_factory):
    return train_straight(tmp_path_factory.mktemp('straight_slurm'), tiny_data_root, SLURM_RUN)


# ------------------------------------------------------------------------------------------------ one node's GPUs

def test_gpu_slots_and_each_runs_command_and_env():
    assert launch.gpu_slots(['0', '1', '2', '3', '4'], 2) == [['0', '1'], ['2', '3']]  # GPU 4 stays free
    command, env = launch.local_process(['cfg.py', '--seed=0'], ['2', '3'], threads=4, gpus_per_run=2)
    assert command == [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                       str(REPO / 'train.py'), 'cfg.py', '--seed=0']
    assert env['CUDA_VISIBLE_DEVICES'] == '2,3' and env['OMP_NUM_THREADS'] == '4'
    command, env = launch.local_process(['cfg.py'], ['5'], threads=2)
    assert command == [sys.executable, str(REPO / 'train.py'), 'cfg.py'] and env['CUDA_VISIBLE_DEVICES'] == '5'
    command, env = launch.local_process(['cfg.py'], None, threads=2, gpus_per_run=2)  # no GPUs: plain train.py
    assert command[1] == str(REPO / 'train.py') and env.get('CUDA_VISIBLE_DEVICES') == os.environ.get(
        'CUDA_VISIBLE_DEVICES')


@pytest.mark.parametrize('gpus_per_run, slots', [(1, {'3', '5', '6'}), (2, {'3,5'})])
def test_train_all_gives_each_run_gpus_of_its_own_and_queues_the_rest(tmp_path, monkeypatch, gpus_per_run, slots):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '3,5,6')
    started, running = [], set()

    class FakeProcess:  # a run that ends at its third poll; no GPU, no train.py
        def __init__(self, command, stdout, stderr, env, start_new_session):
            gpus = env['CUDA_VISIBLE_DEVICES']
            assert gpus not in running, f"GPUs {gpus} given to two runs at once"
            running.add(gpus)
            started.append((command, gpus))
            self.gpus, self.polls, self.returncode = gpus, 0, None

        def poll(self):
            self.polls += 1
            if self.polls >= 3 and self.returncode is None:
                self.returncode = 0
                running.discard(self.gpus)
            return self.returncode

    monkeypatch.setattr(sweep.subprocess, 'Popen', FakeProcess)
    monkeypatch.setattr(sweep.time, 'sleep', lambda s: None)
    runs = {('s', 'v', seed): (str(tmp_path / f'v-s{seed}'), [f'--seed={seed}']) for seed in range(7)}
    sweep.train_all(runs, parallel=8, gpus_per_run=gpus_per_run)
    assert len(started) == 7 and {gpus for _, gpus in started} == slots
    assert [gpus for _, gpus in started[:len(slots)]] == sorted(slots)  # the first runs: round robin over the GPUs
    torchrun = [c for c, _ in started if 'torch.distributed.run' in c]
    assert len(torchrun) == (7 if gpus_per_run == 2 else 0)
    assert all('--nproc_per_node=2' in c for c in torchrun)


class ScriptedProcess:
    """A fake train.py for sweep.train_all, n its start order: exits with `returncodes[n]` (0 unless listed) at its
    `lifetimes[n]`-th poll (3 unless listed), or `term_polls` polls after a SIGTERM with `term_code` (train.py:
    128 + 15, once it saved; torchrun: 1). `events[(n, k)]` runs at its k-th poll, e.g. a signal to the sweep."""
    started, returncodes, lifetimes, events, term_code, term_polls = [], {}, {}, {}, 128 + signal.SIGTERM, 1

    def __init__(self, command, stdout, stderr, env, start_new_session=False):
        assert start_new_session, "a run shares the sweep's process group: Ctrl-C would reach it twice"
        self.n, self.polls, self.returncode, self.signals = len(self.started), 0, None, 0
        self.pid = 1000 + self.n
        self.started.append(self)

    def send_signal(self, signum):
        assert signum == signal.SIGTERM
        self.signals += 1
        if self.signals == 1:  # saving takes term_polls from the first signal on (a later one would abort it)
            self.term_at = self.polls + self.term_polls

    def poll(self):
        self.polls += 1
        if (self.n, self.polls) in self.events:
            self.events[(self.n, self.polls)]()
        if self.returncode is None and self.signals and self.polls >= self.term_at:
            self.returncode = self.term_code
        elif self.returncode is None and not self.signals and self.polls >= self.lifetimes.get(self.n, 3):
            self.returncode = self.returncodes.get(self.n, 0)
        return self.returncode


def signal_the_sweep(signum):
    return lambda: os.kill(os.getpid(), signum)


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """Four runs for sweep.train_all, two at a time, through ScriptedProcess; yields (runs, the class). SIGINT and
    SIGTERM fail the test unless the sweep handles them, and must be handed back to that handler afterwards."""
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.setattr(launch, 'visible_gpus', lambda: [])
    for attr, value in dict(started=[], returncodes={}, lifetimes={}, events={}).items():
        monkeypatch.setattr(ScriptedProcess, attr, value)
    monkeypatch.setattr(sweep.subprocess, 'Popen', ScriptedProcess)
    monkeypatch.setattr(sweep.time, 'sleep', lambda s: None)

    def unhandled(signum, frame):
        pytest.fail(f"signal {signum} reached the test, not the sweep's handler")

    originals = {s: signal.signal(s, unhandled) for s in sweep.STOP_SIGNALS}
    try:
        runs = {('s', 'v', seed): (str(tmp_path / f'v-s{seed}'), [f'--seed={seed}']) for seed in range(4)}
        yield runs, ScriptedProcess
        assert all(signal.getsignal(s) is unhandled for s in sweep.STOP_SIGNALS), "the sweep kept its handlers"
    finally:
        for s, handler in originals.items():
            signal.signal(s, handler)


def test_train_all_trains_the_rest_when_a_run_fails_and_says_which(scripted, monkeypatch):
    runs, process = scripted
    monkeypatch.setattr(process, 'returncodes', {1: 1})
    with pytest.raises(UserError, match=r"1 run\(s\) failed, e.g. .*v-s1/train.log; rerun"):
        sweep.train_all(runs, parallel=2)
    assert len(process.started) == 4 and all(p.signals == 0 for p in process.started)


@pytest.mark.parametrize('code', [128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGTERM])
def test_a_run_stopped_by_its_own_signal_starts_nothing_more(scripted, monkeypatch, capsys, code):
    """`kill PID` of one train.py: it saves and exits 128 + the signal (or, before its handler is in place, dies of
    it): a stop, not a failure; nothing more starts, the other running run finishes unsignalled."""
    runs, process = scripted
    monkeypatch.setattr(process, 'returncodes', {0: code})
    monkeypatch.setattr(process, 'lifetimes', {1: 6})  # still running when run 0 stops
    with pytest.raises(SystemExit) as stopped:
        sweep.train_all(runs, parallel=2)
    assert stopped.value.code == 128 + abs(code) % 128
    assert len(process.started) == 2 and process.started[1].returncode == 0
    assert all(p.signals == 0 for p in process.started)
    err = capsys.readouterr().err
    assert 'the same command resumes' in err and 'failed' not in err


@pytest.mark.parametrize('signum', sweep.STOP_SIGNALS)
@pytest.mark.parametrize('term_code', [128 + signal.SIGTERM, 1])  # train.py; torchrun once its workers stopped
def test_the_sweeps_own_signal_reaches_every_running_run_once(scripted, monkeypatch, capsys, signum, term_code):
    runs, process = scripted
    monkeypatch.setattr(process, 'term_code', term_code)
    monkeypatch.setattr(process, 'term_polls', 3)  # a few polls to save: the sweep must not signal it again
    monkeypatch.setattr(process, 'events', {(0, 1): signal_the_sweep(signum)})
    with pytest.raises(SystemExit) as stopped:
        sweep.train_all(runs, parallel=2)
    assert stopped.value.code == 128 + signum
    assert len(process.started) == 2 and [p.signals for p in process.started] == [1, 1]
    assert [p.returncode for p in process.started] == [term_code] * 2
    err = capsys.readouterr().err
    assert 'the same command resumes' in err and 'failed' not in err


def test_a_second_signal_aborts_the_runs_and_the_sweep(scripted, monkeypatch):
    runs, process = scripted
    monkeypatch.setattr(process, 'term_polls', 5)  # still saving when the second signal comes
    monkeypatch.setattr(process, 'events', {(0, 1): signal_the_sweep(signal.SIGINT),
                                            (1, 2): signal_the_sweep(signal.SIGINT)})
    with pytest.raises(SystemExit) as aborted:
        sweep.train_all(runs, parallel=2)
    assert aborted.value.code == 128 + signal.SIGINT
    assert len(process.started) == 2 and [p.signals for p in process.started] == [2, 2]  # train.py: abort now


def test_a_stop_after_a_failure_exits_as_a_stop_and_names_the_failure(scripted, monkeypatch, capsys):
    runs, process = scripted
    monkeypatch.setattr(process, 'returncodes', {0: 1})  # fails at its 3rd poll, as run 1 finishes: runs 2 and 3 start
    monkeypatch.setattr(process, 'events', {(2, 1): signal_the_sweep(signal.SIGTERM)})
    with pytest.raises(SystemExit) as stopped:
        sweep.train_all(runs, parallel=2)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert [p.signals for p in process.started] == [0, 0, 1, 1]
    err = capsys.readouterr().err
    assert '1 run(s) failed, e.g.' in err and 'v-s0/train.log' in err and 'the same command resumes' in err


def test_ctrl_c_to_a_local_sweep_stops_its_runs_once_and_the_same_command_resumes_them_bit_exactly(
        tiny_data_root, tmp_path, straight):
    """Real train.py runs: Ctrl-C (SIGINT to the terminal's process group, here the sweep's alone) reaches each run
    once through the sweep; each saves, the sweep exits 130, and rerunning it ends as if never stopped."""
    args = [sys.executable, '-m', 'lab.sweep', f'--variants={",".join(VARIANTS)}', '--seeds=1', '--parallel=2',
            f'--out_root={tmp_path}', f'--base={BASE}', '--', *RUN, f'--data_root={tiny_data_root}']
    dirs = {v: str(tmp_path / f'{v}-s0') for v in VARIANTS}
    first = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        wait_for(lambda: all(evaluated(d) for d in dirs.values()), 120, "both runs to start training")
        os.killpg(first.pid, signal.SIGINT)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 128 + signal.SIGINT, err[-3000:]
    assert 'the same command resumes' in err and 'failed' not in out + err
    logs = [open(os.path.join(d, 'train.log')).read() for d in dirs.values()]
    assert all('stopped at iter' in log and 'Traceback' not in log for log in logs)  # saved, not aborted
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    for v in VARIANTS:
        assert_same_as_straight(dirs[v], straight[v])


# ------------------------------------------------------------------------------------------------ any scheduler

def test_printed_commands_run_as_they_are_from_anywhere(tiny_data_root, tmp_path):
    args = [f'--variants={",".join(VARIANTS)}', '--seeds=1', '--out_root=sweep', '--launcher=commands',  # relative
            f'--base={BASE}', '--', *TINY_TRAIN_ARGS, '--max_iters=20', '--lr_decay_iters=20', '--eval_interval=10',
            '--eval_iters=2', f'--data_root={tiny_data_root}']
    result = run_script('lab.sweep', *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    commands = result.stdout.splitlines()
    assert len(commands) == 2 and '2 runs: 0 finished, 2 to train' in result.stderr
    for command in commands:  # as GNU parallel or a job array would: bash, somewhere else, without our env
        done = subprocess.run(['bash', '-c', command], cwd='/', capture_output=True, text=True, timeout=300,
                              env={'PATH': os.environ['PATH'], 'HOME': os.environ.get('HOME', '/')})
        assert done.returncode == 0, done.stderr[-3000:]
    assert all(run_state(tmp_path / 'sweep' / f'{v}-s0') == 'done' for v in VARIANTS)
    again = run_script('lab.sweep', *args, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == '' and '2 runs: 2 finished, 0 to train' in again.stderr


# ------------------------------------------------------------------------------------------------ submitit, locally

def test_submitit_local_study_with_a_killed_and_a_preempted_job_resumes_bit_exactly(tiny_data_root, tmp_path,
                                                                                  monkeypatch, straight):
    """Real processes and pickling: the attention job is killed (SIGTERM: train.py saves and stops, the job fails)
    and resubmitted by submit() again; the corridor job gets the preemption signal (USR2) and submitit requeues it
    itself. Both end with the bits of the runs trained straight through."""
    submitit = pytest.importorskip('submitit')
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(filter(None, (str(REPO), os.environ.get('PYTHONPATH')))))
    out_root = tmp_path / 'sweep'
    runs = study_runs(out_root, tiny_data_root)
    executor = submitit.LocalExecutor(folder=str(tmp_path / 'logs'))
    executor.update_parameters(timeout_min=5)
    dirs = {variant: out_dir for (_, variant, _), (out_dir, _) in runs.items()}
    assert launch.submit(runs, str(out_root), executor) is False
    jobs = json.loads((out_root / 'slurm_jobs.json').read_text())
    wait_for(lambda: all(evaluated(d) for d in dirs.values()), 120, "both runs' first evaluations")
    os.kill(int(jobs[dirs['attention']]), 15)  # the job's controller passes SIGTERM on to the job
    task, = children(jobs[dirs['corridor']])  # the job's task (its controller's child), whose child is train.py
    os.kill(task, 12)  # SIGUSR2, as SLURM sends it before a time limit or a preemption
    wait_for(lambda: not launch.active_jobs(executor, list(jobs.values())), 120, "both jobs to end")
    assert run_state(dirs['attention']) == 'partial'  # stopped part way, its checkpoint saved
    assert run_state(dirs['corridor']) == 'done'  # requeued by submitit, resumed, finished
    log = open(os.path.join(dirs['corridor'], 'train.log')).read()
    assert 'stopping after this iteration' in log and 'resuming at iter' in log
    assert launch.submit(runs, str(out_root), executor) is False  # resubmits the failed one
    job_id = json.loads((out_root / 'slurm_jobs.json').read_text())[dirs['attention']]
    assert job_id != jobs[dirs['attention']]
    wait_for(lambda: not launch.active_jobs(executor, [job_id]), 120, "the resubmitted job to end")
    assert launch.submit(runs, str(out_root), executor) is True
    for variant in VARIANTS:
        assert_same_as_straight(dirs[variant], straight[variant])


def children(pid):
    found = []
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            stat = open(f'/proc/{entry}/stat').read()
        except OSError:
            continue
        if stat.rsplit(')', 1)[1].split()[1] == str(pid):
            found.append(int(entry))
    return found


# ------------------------------------------------------------------------------------------------ a real SLURM

SLURM_CONF = '/tmp/corridor-slurm/slurm.conf'  # where tests/slurm_local.sh puts its one-node cluster


def local_slurm():
    """The environment for tests/slurm_local.sh's cluster, started if need be (as root); skips saying what is missing."""
    for tool in ('sbatch', 'squeue', 'scancel', 'sinfo', 'slurmctld', 'slurmd', 'munged'):
        if not shutil.which(tool) and not os.path.exists(f'/usr/sbin/{tool}'):
            pytest.skip(f"no {tool}: install slurm-wlm and munge (apt-get install slurm-wlm munge, as .ci/run does)")
    env = {**os.environ, **ONE_THREAD, 'SLURM_CONF': SLURM_CONF}
    if not up(env):
        if os.geteuid() != 0:
            pytest.skip(f"no SLURM at {SLURM_CONF}, and starting one (tests/slurm_local.sh) needs root")
        started = subprocess.run(['bash', str(REPO / 'tests' / 'slurm_local.sh')], capture_output=True, text=True,
                                 timeout=120)
        if started.returncode or not up(env):
            pytest.skip(f"tests/slurm_local.sh could not start slurmctld + slurmd: {started.stderr.strip()[-500:]}")
    return env


def up(env):
    try:
        listed = subprocess.run(['sinfo', '-h', '-o', '%T'], env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return False
    return listed.returncode == 0 and any(s in listed.stdout for s in ('idle', 'mixed', 'allocated'))


def test_real_slurm_study_with_a_cancelled_job_resumes_bit_exactly(tiny_data_root, tmp_path, monkeypatch,
                                                                   straight_slurm):
    """`python -m lab.sweep --launcher=slurm` on a one-node SLURM: two jobs; one is sent SIGTERM mid-run by scancel
    (train.py saves and stops, the job fails) and the same command again resubmits it; the other gets SIGUSR2, the
    warning SLURM sends before a time limit, and submitit requeues it. Both runs end bit-identical to uninterrupted
    ones. About 50 s on 2 cores with SLURM_RUN's 1,600 iterations (SLURM's requeue delay: 11 s), the bring-up (about
    1 s) included, and 8 s for its straight-through references."""
    env = local_slurm()
    monkeypatch.setenv('SLURM_CONF', SLURM_CONF)
    out_root = tmp_path / 'sweep'
    args = [f'--variants={",".join(VARIANTS)}', '--seeds=1', f'--out_root={out_root}', '--launcher=slurm',
            '--slurm_partition=debug', '--slurm_time=10', f'--base={BASE}', '--', *SLURM_RUN,
            f'--data_root={tiny_data_root}']
    dirs = {v: str(out_root / f'{v}-s0') for v in VARIANTS}
    first = run_script('lab.sweep', *args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert '2 runs: 2 new; 2 submitted' in first.stdout and str(out_root / 'slurm_logs') in first.stdout
    jobs = json.loads((out_root / 'slurm_jobs.json').read_text())

    def gone(*job_ids):  # no longer held by SLURM
        listed = subprocess.run(['squeue', '-h', '-o', '%i'], env=env, capture_output=True, text=True, timeout=20)
        return listed.returncode == 0 and not set(job_ids) & set(listed.stdout.split())

    wait_for(lambda: evaluated(dirs['attention']), 120, "the attention run's first evaluation under SLURM")
    subprocess.run(['scancel', '--signal=TERM', jobs[dirs['attention']]], env=env, check=True, timeout=20)
    wait_for(lambda: evaluated(dirs['corridor']), 120, "the corridor run's first evaluation under SLURM")
    subprocess.run(['scancel', '--signal=USR2', jobs[dirs['corridor']]], env=env, check=True, timeout=20)
    wait_for(lambda: gone(jobs[dirs['attention']]), 120, "the cancelled job to end")
    if run_state(dirs['attention']) == 'done':  # a loaded machine: the tiny run ended before SLURM's TERM reached it
        pytest.skip("the attention run finished before its cancel arrived: no mid-run stop to resume from")
    assert run_state(dirs['attention']) == 'partial'  # stopped part way, its checkpoint saved
    second = run_script('lab.sweep', *args, cwd=tmp_path, env=env)  # while the corridor's job is requeued
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"failed: {dirs['attention']}" in second.stdout and '1 failed; 1 submitted' in second.stdout
    resubmitted = json.loads((out_root / 'slurm_jobs.json').read_text())[dirs['attention']]
    wait_for(lambda: gone(resubmitted, jobs[dirs['corridor']]), 180, "the resubmitted and the requeued job to end")
    for variant in VARIANTS:  # each stopped by its signal and resumed: the corridor by submitit's requeue
        log = open(os.path.join(dirs[variant], 'train.log')).read()
        assert 'stopping after this iteration' in log and 'resuming at iter' in log
    last = run_script('lab.sweep', *args, cwd=tmp_path, env=env)
    assert last.returncode == 0 and '2 runs: 2 done; 0 submitted' in last.stdout, last.stderr[-3000:]
    assert (out_root / 'report.md').is_file()  # every run done: the study's report
    for variant in VARIANTS:
        assert_same_as_straight(dirs[variant], straight_slurm[variant])
