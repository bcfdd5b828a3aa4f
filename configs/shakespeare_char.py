# A 0.8M-parameter character-level GPT on Tiny Shakespeare: val loss ~1.91 after 2,000 iterations,
# 2 min 10 s on 2 CPU cores (preparing its data included).
#   python train.py configs/shakespeare_char.py --operator=corridor             # -> out-shakespeare-char/
# (train.py runs `python prepare.py shakespeare_char` first when data/shakespeare_char is missing: from the copy of
# Tiny Shakespeare that ships in data/, no network needed)
# Any operator of model.py's table is one --operator=... (and its keys) away; lab/sweep.py's VARIANTS names the
# paper's ablations.
out_dir = 'out-shakespeare-char'
dataset = 'shakespeare_char'
device = 'cpu'
compile = False          # Inductor's C++ kernels don't pay back their compile time at this size (measured)
dtype = 'float32'

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
dropout = 0.0
batch_size = 12
gradient_accumulation_steps = 1

learning_rate = 1e-3     # small models can take a large step
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
warmup_iters = 100
beta2 = 0.99             # few tokens per iteration

eval_interval = 250
eval_iters = 50
log_interval = 50
