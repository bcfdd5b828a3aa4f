# GPT-2 124M, fixed Laplacian heads I − P: the last 3 of 12 heads in every layer (the quarter used at CPU scale).
from configs._owt_gpt2_124m import *

out_dir = 'out-owt-124m-laplacian'
operator = 'laplacian'
laplacian_heads = 3
