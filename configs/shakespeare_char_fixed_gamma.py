# Ablation: γ fixed at −0.5 inside the corridor, δ fixed at 1, nothing learnt (the paper: already beats attention).
from configs._shakespeare_char import *

out_dir = 'out-shakespeare-char-fixed-gamma'
operator = 'corridor'
gamma_init = -0.5
delta_init = 1.0
learn_gamma = False
learn_delta = False
