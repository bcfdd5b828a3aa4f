# α0·I + α1·P with both learnt per head (the same family as the corridor, another parameterisation).
from configs._shakespeare_char import *

out_dir = 'out-shakespeare-char-alpha'
operator = 'alpha'
