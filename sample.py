"""
Sample from a trained run (or from OpenAI's GPT-2).

    python sample.py --out_dir=out-shakespeare-char
    python sample.py --out_dir=out-owt-124m-corridor --start="The convex corridor" --num_samples=3
    python sample.py --init_from=gpt2 --start=FILE:prompt.txt

Keys as in train.py: a config file and/or --key=value.
"""

import os
import shlex
import sys
from contextlib import nullcontext

import torch

from common import DTYPES, UserError, check_device, main_guard, parse_config, resolve_dtype
from sources import is_run_folder, load_model, tokenizer_from_meta

DEFAULTS = dict(
    init_from='resume',   # 'resume': out_dir/ckpt.pt; or a GPT-2 name ('gpt2', 'gpt2-medium', ...) or local folder
    out_dir='out',        # the run folder whose ckpt.pt samples (init_from='resume')
    start='\n',           # the prompt, or FILE:path to read it from a file
    num_samples=10,       # samples to print, each after the prompt
    max_new_tokens=500,   # tokens generated per sample
    temperature=0.8,      # 1.0: the model's distribution; lower is more conservative; 0: greedy
    top_k=200,            # sample among the k likeliest tokens only (None: all)
    seed=1337,            # the sampling generator's seed
    use_cache=True,       # KV cache: the same tokens as recomputing every position, faster
    device='cuda' if torch.cuda.is_available() else 'cpu',  # 'cpu', 'cuda', 'cuda:N' or 'mps' (Apple silicon)
    dtype='auto',         # 'auto': as train.py's (bfloat16 on GPUs that compute it natively, else float16; on a CPU
                          # bfloat16 where it has bf16 units and n_embd >= 256, else float32; MPS float32)
)


def main(argv):
    for arg in argv:  # parse_config reads an argument without -- as a config file; a folder there is a model to sample
        if not arg.startswith('--') and os.path.isdir(arg):
            flag = shlex.quote(f'--out_dir={arg}')
            raise UserError(f"{arg!r} is a run folder, not a config file (did you mean {flag}?)" if is_run_folder(arg)
                            else f"{arg!r} is a folder, not a config file: sample a run folder with --out_dir=FOLDER, "
                            "a transformers model folder with --init_from=FOLDER")
    cfg = parse_config(DEFAULTS, argv, optional=('top_k',))
    if 'out_dir' in cfg.given and cfg['init_from'] != 'resume':
        raise UserError(f"out_dir names the run folder to sample with init_from='resume'; init_from={cfg['init_from']!r}"
                        f" samples that model: drop --out_dir, or --init_from")
    model, meta = load_model(cfg['out_dir'] if cfg['init_from'] == 'resume' else cfg['init_from'])
    encode, decode = tokenizer_from_meta(meta)
    for wrong, message in ((cfg['num_samples'] < 1, f"num_samples must be at least 1, got {cfg['num_samples']}"),
                           (cfg['max_new_tokens'] < 1, f"max_new_tokens must be at least 1, got {cfg['max_new_tokens']}"),
                           (cfg['temperature'] < 0, f"temperature must be >= 0, got {cfg['temperature']}"),
                           (cfg['top_k'] is not None and cfg['top_k'] < 1,
                            f"top_k must be at least 1 (or None for all tokens), got {cfg['top_k']}"),
                           (cfg['dtype'] not in DTYPES,
                            f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {cfg['dtype']!r}")):
        if wrong:
            raise UserError(message)
    start = cfg['start']
    if start.startswith('FILE:'):
        path = start[len('FILE:'):]
        if not os.path.isfile(path):
            raise UserError(f"prompt file {path!r} not found")
        try:
            with open(path, encoding='utf-8-sig') as f:  # a BOM is no character of the prompt
                start = f.read()
        except UnicodeDecodeError:
            raise UserError(f"prompt file {path} is not UTF-8 text: save it as UTF-8") from None
    start_ids = encode(start)
    if not start_ids:
        raise UserError("the prompt is empty: give at least one token with --start")
    device, device_type = cfg['device'], cfg['device'].split(':')[0]
    check_device(device)
    dtype = resolve_dtype(cfg['dtype'], device, model.config.n_embd)
    autocast = nullcontext() if dtype == 'float32' else torch.autocast(device_type, getattr(torch, dtype))
    model.eval().to(device)
    generator = torch.Generator(device=device).manual_seed(cfg['seed'])

    x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, :]
    with torch.no_grad(), autocast:
        for _ in range(cfg['num_samples']):
            y = model.generate(x, cfg['max_new_tokens'], temperature=cfg['temperature'], top_k=cfg['top_k'],
                               use_cache=cfg['use_cache'], generator=generator)
            print(decode(y[0].tolist()))
            print('---------------')


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
