# One GPU: the corridor in a larger pretrained decoder, the two experiments of the CPU's SmolLM2 study
# (configs/smollm2_operator.py) at ~4× the size. Qwen2.5-0.5B by default; any Llama / Qwen2 / Qwen3 / Gemma 3 causal LM
# works the same (e.g. --init_from=path/to/Llama-3.2-1B, a folder saved with save_pretrained, and its own dataset).
#   python prepare.py wikitext2 --tokenizer=Qwen/Qwen2.5-0.5B     # -> data/wikitext2_Qwen2.5-0.5B
#   python train.py configs/gpu_pretrained.py                     # operator only: γ and δ learn, 494M weights frozen
#   python train.py configs/gpu_pretrained.py --learn_gamma=False --out_dir=out-qwen-delta   # the δ-only control
#   python train.py configs/gpu_pretrained.py --train_only=all --learning_rate=2e-5 --min_lr=2e-6 --max_iters=60 \
#       --lr_decay_iters=60 --out_dir=out-qwen-full                # full fine-tuning, the operator included
#   python -m lab.sweep --study=pretrained --gpu=True --plan=True      # all of it as a study: runs and estimated hours
# A hub name needs network once; offline, pass a local folder (and prepare with the same --tokenizer=FOLDER).
init_from = 'Qwen/Qwen2.5-0.5B'
train_only = 'operator'
operator = 'corridor'
dataset = 'wikitext2_Qwen2.5-0.5B'
out_dir = 'out-qwen-corridor'
compile = False          # transformers' models under torch.compile are not tested here (no GPU was lent)

block_size = 1024
batch_size = 16
gradient_accumulation_steps = 1   # 16k tokens per iteration

# operator-only: as the CPU preset, Adam moves each scalar by about the learning rate per step
learning_rate = 5e-3
min_lr = 5e-4
max_iters = 300          # 4.9M tokens: ~20 passes over WikiText-2's 250k training tokens; 540 scalars do not overfit
lr_decay_iters = 300     # (full fine-tuning: 60 iterations, ~4 passes, see above)
warmup_iters = 20
beta2 = 0.99
weight_decay = 0.0

eval_interval = 50
eval_iters = 40          # 40 × 16k = 655k tokens: the whole WikiText-2 test split about twice
log_interval = 10
