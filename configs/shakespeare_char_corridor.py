# The convex corridor δ(γI + P), γ and δ learnt per head, starting as attention (γ = 0, δ = 1).
from configs._shakespeare_char import *

out_dir = 'out-shakespeare-char-corridor'
operator = 'corridor'
gamma_init = 0.0
delta_init = 1.0
