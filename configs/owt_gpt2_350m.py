# Base for the owt_gpt2_350m_*.py runs (the "across scales" pair): GPT-2 medium size (~350M) on OpenWebText,
# one GPU, the same ~0.5M tokens per iteration and token budget as the 124M runs.
from configs._owt_gpt2_124m import *

n_layer = 24
n_head = 16
n_embd = 1024
batch_size = 8
gradient_accumulation_steps = 60
learning_rate = 3e-4
min_lr = 3e-5
