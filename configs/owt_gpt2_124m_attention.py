# GPT-2 124M, plain softmax attention: the baseline.
from configs._owt_gpt2_124m import *

out_dir = 'out-owt-124m-attention'
operator = 'attention'
