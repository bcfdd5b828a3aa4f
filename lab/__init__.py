"""
The research lab beside the core: every tool here imports the core (model.py, common.py, sources.py, analyze.py,
train.py's DEFAULTS), never the other way round but lazily, where a run asks for it: a file being read
(sources.py reaches lab/file_checks.py), a pretrained source (lab/gpt2.py, lab/pretrained.py), walk_interval
(train.py reaches lab/connection.py), a run's logged walk (analyze.py reaches lab/figures.py), OpenWebText
(prepare.py reaches lab/openwebtext.py), --help (lab/key_help.py), a --sdpa_backend other than auto
(lab/sdpa.py) and --wandb_log (run.py reaches lab/wandb_log.py). Each tool is run from the repository root as
`python -m lab.<tool>`.

    connection.py   the connection-walk math: A_eff, transports, drift, δ_orth, Gram dominance
    walk.py         its command line: any model over a text, per-layer tables and plots      python -m lab.walk
    hf_walk.py      Hugging Face / GGUF models as walk sources, a trained PretrainedLM included
    hf_sources.py   what a Hugging Face source is: its family (FAMILIES), its folder, the packaged models
    hf_tokenizer.py a pretrained source's own tokenizer: loading, fingerprint, prepare.py's encoder
    gguf_files.py   GGUF files: packaged and chunked models, the dequantised cache, GGUF rounding
    pretrained.py   the operator inside a transformers causal LM (PretrainedLM), for train.py and sample.py
    openwebtext.py  OpenWebText's parquet files → train.bin / val.bin, tokenized by worker processes
    gpt2.py         OpenAI's GPT-2 weights in our own GPT (sources.py's --init_from=gpt2)
    file_checks.py  what ckpt.pt, log.jsonl and meta.json must hold before a script trusts them, one line a fault
    key_help.py     --help's key list: each key's default and meaning, from the comments beside the defaults
    sdpa.py         --sdpa_backend's check: the chosen kernel tried on the model's forward and backward first
    wandb_log.py    Weights & Biases for --wandb_log=True: what log.jsonl gets, and each log line
    probe.py        how much a trained model leans on the operator, head by head              python -m lab.probe
    bench.py        speed and memory of every form                                          python -m lab.bench
    selfcheck.py    the GPU self-check, part by part, PASS / WARN / FAIL / SKIP each         python -m lab.selfcheck
    sweep.py        studies: variants × seeds trained, resumed and reported                  python -m lab.sweep
    studies.py      the studies' table: variants, settings, studies
    stats.py        paired t-tests, Holm, power (scipy.stats)
    reports.py      each study's report: the tables and figures every study shares
    study_figures.py each study's own figures and claim lines, one function per study (FIGURES)
    figures.py      the lab's matplotlib setup, and the walk's figure over training (analyze.py's walk.png too)
"""
