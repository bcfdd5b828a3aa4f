# GPT-2 124M, the convex corridor δ(γI + P), γ and δ learnt per head from γ = 0, δ = 1.
from configs._owt_gpt2_124m import *

out_dir = 'out-owt-124m-corridor'
operator = 'corridor'
