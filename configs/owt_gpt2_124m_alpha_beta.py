# GPT-2 124M, αP + β(I − P) learnt per head.
from configs._owt_gpt2_124m import *

out_dir = 'out-owt-124m-alpha-beta'
operator = 'alpha_beta'
