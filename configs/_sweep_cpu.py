# Base of sweep.py's default sweep (not a run by itself): the shakespeare_char model with a budget that fits
# 8 variants × 3 seeds in about an hour on 2 CPU cores: 1,200 iterations × 768 tokens ≈ 0.92M tokens per run.
# Validation uses 50 fixed batches (38k characters, the same for every variant of a seed), so the differences
# between variants pair up cleanly by seed.
from configs._shakespeare_char import *

max_iters = 1200
lr_decay_iters = 1200
warmup_iters = 100
eval_interval = 200
eval_iters = 50
log_interval = 100
