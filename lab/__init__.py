"""
The research lab beside the core: every tool here imports the core (model.py, train.py, common.py, analyze.py),
never the other way round, except lazily where a run asks for it (a pretrained source: common.transformers_side;
walk_interval: train.walk_geometry). Each tool is run from the repository root as `python -m lab.<tool>`.

    connection.py   the connection-walk math: A_eff, transports, drift, δ_orth, Gram dominance
    walk.py         its command line: any model over a text, per-layer tables and plots      python -m lab.walk
    hf.py           Hugging Face / GGUF models: loading, their walk, the operator inside them
    probe.py        how much a trained model leans on the operator, head by head              python -m lab.probe
    bench.py        speed and memory of every form; the one-command GPU self-check           python -m lab.bench
    sweep.py        studies: variants × seeds trained, resumed and reported                  python -m lab.sweep
    studies.py      the studies' table: variants, settings, studies
    stats.py        paired t-tests, Holm, power (scipy.stats)
    reports.py      each study's report: tables, claim lines and figures
"""
