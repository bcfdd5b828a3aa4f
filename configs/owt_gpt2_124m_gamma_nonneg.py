# GPT-2 124M, the corridor restricted to γ ≥ 0.
from configs._owt_gpt2_124m import *

out_dir = 'out-owt-124m-gamma-nonneg'
operator = 'corridor'
gamma_nonneg = True
