# GPT-2 124M, γ fixed at −0.5 and δ at 1 in every head.
from configs._owt_gpt2_124m import *

out_dir = 'out-owt-124m-fixed-gamma'
operator = 'corridor'
gamma_init = -0.5
learn_gamma = False
learn_delta = False
