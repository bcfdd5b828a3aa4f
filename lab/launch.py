"""
How lab/sweep.py starts a study's runs: here on this machine's GPUs (or CPU cores), as SLURM jobs through submitit,
or as printed commands for any other scheduler. A run is `python train.py ARGS`; one that stopped part way (ckpt.pt
short of max_iters) continues with `--init_from=resume --out_dir=DIR`, bit-exactly, wherever it is started.

    python -m lab.sweep --study=claims --gpu=True --parallel=8                 # 8 GPUs, one run on each
    python -m lab.sweep --study=claims --gpu=True --parallel=4 --gpus_per_run=2   # 4 runs, each DDP over 2 GPUs
    python -m lab.sweep --study=claims --gpu=True --launcher=slurm --slurm_partition=gpu --slurm_time=720
    python -m lab.sweep --study=claims --gpu=True --launcher=commands > runs.txt   # one command a line
"""

import getpass
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

import submitit

from common import REPO, UserError, atomic_write
from lab.studies import run_state


def run_args(out_dir, args, state):
    """train.py's arguments for a run in `state` (run_state's): one with a checkpoint short of max_iters resumes."""
    return ['--init_from=resume', f'--out_dir={out_dir}'] if state == 'partial' else args


def train_command(args, gpus_per_run=1):
    """`python train.py ARGS`, under torchrun (train.py's DDP) when a run takes more than one GPU."""
    train = os.path.join(REPO, 'train.py')
    if gpus_per_run > 1:  # --standalone: a rendezvous on a free local port, so several runs share a node
        return [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={gpus_per_run}',
                train, *args]
    return [sys.executable, train, *args]


# ------------------------------------------------------------------------------------------------ this machine

def visible_gpus():
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES as set, else every GPU torch sees."""
    if 'CUDA_VISIBLE_DEVICES' in os.environ:
        return [d for d in os.environ['CUDA_VISIBLE_DEVICES'].split(',') if d.strip()]
    import torch
    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_slots(gpus, gpus_per_run):
    """The visible GPUs cut into groups of gpus_per_run, one group per concurrent run (spare GPUs stay unused)."""
    if gpus and len(gpus) < gpus_per_run:
        raise UserError(f"gpus_per_run={gpus_per_run} but only {len(gpus)} GPU(s) visible ({','.join(gpus)})")
    return [gpus[i:i + gpus_per_run] for i in range(0, len(gpus) - gpus_per_run + 1, gpus_per_run)]


def local_process(args, slot, threads, gpus_per_run=1):
    """(command, env) of one run on this machine: `slot` its GPUs (None on a CPU-only machine), `threads` its share
    of the CPU cores."""
    env = {**os.environ, 'OMP_NUM_THREADS': str(threads)}
    if slot is not None:  # the run sees only its GPUs, as cuda:0 (and cuda:1.. under torchrun)
        env['CUDA_VISIBLE_DEVICES'] = ','.join(slot)
    return train_command(args, gpus_per_run if slot is not None else 1), env


# ------------------------------------------------------------------------------------------------ any scheduler

def print_commands(runs, gpus_per_run=1):
    """One self-contained shell command per unfinished run on stdout (absolute interpreter and train.py, run from
    this directory so that relative paths mean what they meant here), nothing else; the count on stderr."""
    states = {out_dir: run_state(out_dir) for out_dir, _ in runs.values()}
    todo = [(out_dir, args) for out_dir, args in runs.values() if states[out_dir] != 'done']
    print(f"{len(runs)} runs: {len(runs) - len(todo)} finished, {len(todo)} to train", file=sys.stderr)
    for out_dir, args in todo:
        command = shlex.join(train_command(run_args(out_dir, args, states[out_dir]), gpus_per_run))
        print(f"cd {shlex.quote(os.getcwd())} && mkdir -p {shlex.quote(out_dir)} && {command} >> "
              f"{shlex.quote(os.path.join(out_dir, 'train.log'))} 2>&1")


# ------------------------------------------------------------------------------------------------ SLURM

class TrainJob(submitit.helpers.Checkpointable):
    """What a submitted job runs: train.py as a child process, so that its own SIGTERM handler (finish the iteration,
    save ckpt.pt, exit 128 + 15) does the stopping. SLURM's warning before a time limit or preemption (submitit asks
    for SIGUSR2, signal_delay_s ahead) becomes a SIGTERM to train.py, then submitit's requeue; the requeued job runs
    this again, which resumes from the checkpoint."""

    def __call__(self, out_dir, args, gpus_per_run=1):
        requeue, caught, child = signal.getsignal(signal.SIGUSR2), [], None  # requeue: submitit's, to come back

        def forward(signum, frame):
            # one SIGTERM only (a second aborts train.py); under SLURM a TERM or INT reached train.py already
            if not caught and child and (signum == signal.SIGUSR2 or 'SLURM_JOB_ID' not in os.environ):
                child.send_signal(signal.SIGTERM)
            caught.append(signum)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(signum, forward)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, 'train.log'), 'a') as log:
            # USR2 ignored in train.py (SLURM signals every process of the job; its default action would kill it)
            command = train_command(run_args(out_dir, args, run_state(out_dir)), gpus_per_run)
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=ignore_usr2)
            if caught:  # a signal before train.py existed: stop it now
                child.send_signal(signal.SIGTERM)
            status = child.wait()
        if status == 0:
            return out_dir
        if signal.SIGUSR2 in caught and callable(requeue):  # train.py saved its state: requeue, to resume it
            requeue(signal.SIGUSR2, None)
        raise RuntimeError(f"train.py exited with status {status}: see {out_dir}/train.log")


def ignore_usr2():
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def slurm_executor(cfg, folder):
    """A submitit SlurmExecutor from the sweep's slurm_* keys."""
    if not shutil.which('sbatch'):  # else submitit's RuntimeError at the first submission, as a traceback
        raise UserError("--launcher=slurm needs SLURM's sbatch, and there is none on this machine's PATH: run the "
                        "sweep on a SLURM login node, or use --launcher=local (or commands)")
    # max_num_timeout: a run longer than slurm_time continues over as many jobs as it needs
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=100)
    flags = shlex.split(cfg['slurm_extra'])  # '--qos=high --exclusive' -> {'qos': 'high', 'exclusive': True}
    if not all(f.startswith('--') for f in flags):
        raise UserError(f"slurm_extra takes sbatch flags such as '--qos=high', got {cfg['slurm_extra']!r}")
    # in submitit's spelling (cpus_per_task), so that a flag replaces submitit's own rather than doubling it
    extra = {k.replace('-', '_'): v or True for k, _, v in (f[2:].partition('=') for f in flags)}
    executor.update_parameters(
        job_name='corridor', partition=cfg['slurm_partition'] or None, account=cfg['slurm_account'] or None,
        time=cfg['slurm_time'], gpus_per_node=cfg['gpus_per_run'] if cfg['gpu'] else None,  # CPU studies: none
        ntasks_per_node=1, signal_delay_s=120,  # the warning's lead: a GPT-2 124M checkpoint takes seconds
        additional_parameters=extra,
        # the job unpickles lab.launch.TrainJob: this checkout on its path, wherever sbatch was run from
        setup=[f'export PYTHONPATH={shlex.quote(REPO)}${{PYTHONPATH:+:$PYTHONPATH}}'])
    return executor


def active_jobs(executor, job_ids):
    """{job id: 'queued' | 'running'} of the jobs the scheduler still holds."""
    if isinstance(executor, submitit.LocalExecutor):  # a local job's id is its controller's pid
        return {j: 'running' for j in job_ids if os.path.exists(f'/proc/{j}') and not zombie(j)}
    listed = subprocess.run(['squeue', '-h', '-r', '-u', getpass.getuser(), '-o', '%i %T'], capture_output=True,
                            text=True, timeout=60)
    if listed.returncode:
        raise UserError(f"squeue failed: {listed.stderr.strip()}")
    states = dict(line.split() for line in listed.stdout.splitlines())
    return {j: 'queued' if states[j] in ('PENDING', 'REQUEUED', 'REQUEUE_HOLD') else 'running'
            for j in job_ids if j in states}


def zombie(pid):
    with open(f'/proc/{pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()[0] == 'Z'


def submit(runs, out_root, executor, gpus_per_run=1):
    """Submit every run that is neither finished nor held by the scheduler, one job each; print what each run is
    doing and where the logs go. Returns True when every run is done. The job ids are kept in
    OUT_ROOT/slurm_jobs.json, so the same command again tells a queued or running run from a failed one."""
    path = os.path.join(out_root, 'slurm_jobs.json')
    jobs = {}
    if os.path.isfile(path):
        with open(path) as f:
            jobs = json.load(f)
    active = active_jobs(executor, [jobs[d] for d, _ in runs.values() if d in jobs])
    counts, submitted = dict(done=0, running=0, queued=0, failed=0, new=0), []
    for out_dir, args in runs.values():
        state = 'done' if run_state(out_dir) == 'done' else active.get(jobs.get(out_dir)) or \
            ('failed' if out_dir in jobs else 'new')
        counts[state] += 1
        if state in ('failed', 'new'):
            if state == 'failed':
                print(f"failed: {out_dir} (job {jobs[out_dir]}, see {out_dir}/train.log); resubmitting")
            job = executor.submit(TrainJob(), out_dir, args, gpus_per_run)  # args as planned: the job picks resume
            jobs[out_dir] = job.job_id
            submitted.append((out_dir, job.job_id))
    os.makedirs(out_root, exist_ok=True)
    with atomic_write(path) as f:
        json.dump(jobs, f, indent=1)
    for out_dir, job_id in submitted:
        print(f"submitted job {job_id}: {out_dir}")
    print(f"{len(runs)} runs: {', '.join(f'{n} {s}' for s, n in counts.items() if n)}; {len(submitted)} submitted. "
          f"Job logs in {executor.folder}, each run's in its train.log; the same command again shows their state "
          f"and resubmits failed ones, --report_only=True reports once they are done")
    return counts['done'] == len(runs)
