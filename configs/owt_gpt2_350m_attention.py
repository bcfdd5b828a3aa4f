# GPT-2 350M, plain softmax attention.
from configs._owt_gpt2_350m import *

out_dir = 'out-owt-350m-attention'
operator = 'attention'
