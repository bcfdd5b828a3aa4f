# GPT-2 350M, the convex corridor learnt per head.
from configs._owt_gpt2_350m import *

out_dir = 'out-owt-350m-corridor'
operator = 'corridor'
