# GPT-2 124M on OpenWebText, one GPU: ~0.5M tokens per iteration (12 × 1024 × 40 through gradient accumulation),
# 10,000 iterations ≈ 4.9B tokens. Prepare the data first: python prepare.py openwebtext
#   python train.py configs/owt_gpt2_124m.py --operator=corridor --out_dir=out-owt-124m-corridor
#   torchrun --standalone --nproc_per_node=8 train.py configs/owt_gpt2_124m.py --operator=corridor   # 8 GPUs
# lab/sweep.py --study=NAME --gpu=True runs the paper's studies from this config.
out_dir = 'out-owt-124m'
dataset = 'openwebtext'
compile = True

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
bias = False
batch_size = 12
gradient_accumulation_steps = 40

learning_rate = 6e-4
max_iters = 10000
lr_decay_iters = 10000
min_lr = 6e-5
warmup_iters = 500
weight_decay = 1e-1

eval_interval = 500
eval_iters = 100
log_interval = 10
# no ckpt_<iter>.pt snapshots (each 1.5 GB with the optimizer): log.jsonl holds every head's γ/δ at every
# evaluation, which is all analyze.py reads; --snapshot_interval=N keeps them if you want the weights
