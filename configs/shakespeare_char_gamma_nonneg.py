# Ablation: the corridor with γ ≥ 0 (the paper: restricting γ ≥ 0 hurts).
from configs._shakespeare_char import *

out_dir = 'out-shakespeare-char-gamma-nonneg'
operator = 'corridor'
gamma_nonneg = True
