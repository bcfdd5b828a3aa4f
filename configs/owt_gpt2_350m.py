# GPT-2 medium size (~350M) on OpenWebText, one GPU, the same ~0.5M tokens per iteration and token budget as
# owt_gpt2_124m.py (the "across scales" pair).
from configs.owt_gpt2_124m import *

out_dir = 'out-owt-350m'
n_layer = 24
n_head = 16
n_embd = 1024
batch_size = 8
gradient_accumulation_steps = 60
learning_rate = 3e-4
min_lr = 3e-5
