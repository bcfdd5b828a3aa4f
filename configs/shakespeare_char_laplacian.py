# Earlier work: fixed Laplacian heads I − P on some heads (here the last 1 of 4 in every layer).
from configs._shakespeare_char import *

out_dir = 'out-shakespeare-char-laplacian'
operator = 'laplacian'
laplacian_heads = 1
