# GPT-2 124M, α0·I + α1·P learnt per head.
from configs._owt_gpt2_124m import *

out_dir = 'out-owt-124m-alpha'
operator = 'alpha'
