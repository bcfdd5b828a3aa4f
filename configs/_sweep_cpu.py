# Base of every CPU-scale run of lab/sweep.py (not a run by itself; lab/sweep.py sets dataset, size, budget, variant,
# seed and out_dir): the shakespeare_char model with a budget that trains 8 variants × 3 seeds in under an hour
# on 2 CPU cores, 1,200 iterations × 768 tokens ≈ 0.92M tokens per run. Validation uses 50 fixed batches (38k
# tokens, the same for every variant of a seed), so the differences between variants pair up cleanly by seed.
from configs.shakespeare_char import *

max_iters = 1200
lr_decay_iters = 1200
warmup_iters = 100
eval_interval = 200
eval_iters = 50
log_interval = 100
walk_interval = 200      # the connection-walk geometry at every evaluation (~2 % of the run's time)
walk_seqs = 32
