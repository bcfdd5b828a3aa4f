# Plain softmax attention: the baseline.  python train.py configs/shakespeare_char_attention.py
from configs._shakespeare_char import *

out_dir = 'out-shakespeare-char-attention'
operator = 'attention'
