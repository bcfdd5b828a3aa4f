"""
What the scripts read: prepared data, run folders (ckpt.pt, log.jsonl), and the models they hold or come from: ours,
or a pretrained one (GPT-2 as ours, any other causal LM) through lab/gpt2.py and lab/pretrained.py, imported only when one is asked for (it
imports common.py and model.py, never this file); and the tokenizer that goes with each.
"""

import json
import os

import numpy as np
import torch

from common import GPT2_NAMES, UserError, gpt2_encoding
from model import GPT, OPERATOR_KEYS, GPTConfig, gamma_delta


class Data:
    """data_root/dataset: meta.json, train.bin and val.bin (uint16 tokens, or meta.json's dtype: uint32)."""

    def __init__(self, data_root, dataset, block_size, batch_size, device):
        self.dir, self.block_size, self.batch_size, self.device = \
            os.path.join(data_root, dataset), block_size, batch_size, device
        meta_path = os.path.join(self.dir, 'meta.json')
        if not os.path.isfile(meta_path):
            raise UserError(f"no prepared data at {self.dir} (meta.json missing): run `python prepare.py {dataset}` "
                            f"or set --data_root / --dataset")
        try:
            with open(meta_path) as f:
                self.meta = json.load(f)
            self.meta['vocab_size'], self.meta['tokenizer']
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise UserError(f"{meta_path} is not a meta.json written by prepare.py ({type(e).__name__}): rerun "
                            f"`python prepare.py {dataset}`") from None
        self.dtype = np.dtype(self.meta.get('dtype', 'uint16'))
        self.n_tokens = {}
        for split in ('train', 'val'):
            path = os.path.join(self.dir, f'{split}.bin')
            size = os.path.getsize(path) if os.path.isfile(path) else 0
            if size % self.dtype.itemsize:
                raise UserError(f"{path} has {size} bytes, not a whole number of {self.dtype} tokens (truncated?): "
                                f"rerun `python prepare.py {dataset}`")
            if size // self.dtype.itemsize <= block_size:
                raise UserError(f"block_size={block_size} needs more tokens than that, but {split}.bin in {self.dir} "
                                f"has {size // self.dtype.itemsize}")
            self.n_tokens[split] = size // self.dtype.itemsize

    def offsets(self, split, count, generator):  # [count, batch_size] random start positions
        return torch.randint(self.n_tokens[split] - self.block_size, (count, self.batch_size), generator=generator)

    def batch(self, split, offsets):
        """(x, y) [len(offsets), block_size] on the device: the tokens at offsets, and the ones after each."""
        # reopened per batch: a long-lived np.memmap keeps its pages referenced and memory creeps up
        data = np.memmap(os.path.join(self.dir, f'{split}.bin'), dtype=self.dtype, mode='r')
        x = torch.stack([torch.from_numpy(data[i:i + self.block_size].astype(np.int64)) for i in offsets])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + self.block_size].astype(np.int64)) for i in offsets])
        if self.device.startswith('cuda'):
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x, y


def tokenizer_from_meta(meta):
    """(encode, decode) for a meta.json dict: 'char' (its itos), 'gpt2', or 'hf' (a pretrained model's own)."""
    if meta['tokenizer'] == 'char':
        itos = meta['itos']
        stoi = {c: i for i, c in enumerate(itos)}

        def encode(text):
            unknown = sorted(set(text) - set(stoi))
            if unknown:
                raise UserError(f"characters {''.join(unknown)!r} are not in the model's vocabulary")
            return [stoi[c] for c in text]
        return encode, lambda ids: ''.join(itos[i] for i in ids)
    if meta['tokenizer'] == 'hf':
        from lab import hf_tokenizer
        return hf_tokenizer.hf_codec(meta['tokenizer_source'])
    enc = gpt2_encoding()
    return (lambda text: enc.encode(text, allowed_special={'<|endoftext|>'})), enc.decode


def check_tokenizer(model, meta, data_dir):
    """The data must be tokenized as the model reads: our GPT's vocabulary size, a pretrained model's tokenizer."""
    if isinstance(model, GPT):
        if model.config.vocab_size != meta['vocab_size']:
            raise UserError(f"the model's vocabulary ({model.config.vocab_size}) does not match the data's "
                            f"({meta['vocab_size']}, {meta['tokenizer']} tokenizer in {data_dir})")
        return
    if meta.get('tokenizer_fingerprint') != model.tokenizer_fingerprint:  # computed as the model loaded
        used = meta.get('tokenizer_source', meta['tokenizer'])
        raise UserError(f"{data_dir} was tokenized with {used}'s tokenizer, not {model.source}'s: prepare the data "
                        f"with it, e.g. `python prepare.py {meta.get('dataset', 'wikitext2')} --tokenizer={model.source}`")


def is_gpt2(source):
    """A GPT-2 name, or a local folder saved by `transformers` whose config.json says model_type 'gpt2'."""
    try:
        with open(os.path.join(source, 'config.json')) as f:
            return source in GPT2_NAMES or json.load(f).get('model_type') == 'gpt2'
    except (OSError, ValueError, AttributeError):
        return source in GPT2_NAMES


def load_model(source, **overrides):
    """(model, meta as a meta.json names its tokenizer) of a run folder, GPT-2 (as our GPT) or another pretrained causal
    LM (a packaged model, .gguf file, transformers folder, hub name: lab/hf_sources.py names each when a source is none).
    overrides: keys that carry no weights (dropout; a pretrained model's operator keys)."""
    if is_gpt2(source):
        from lab.gpt2 import gpt2
        return gpt2(source, **overrides), dict(tokenizer='gpt2', vocab_size=50257)
    if os.path.isfile(os.path.join(source, 'ckpt.pt')):
        ckpt = load_checkpoint(os.path.join(source, 'ckpt.pt'))
        return model_from_checkpoint(ckpt, **overrides), ckpt['meta']
    from lab import pretrained  # dropout: a pretrained model keeps its own
    return pretrained.load_pretrained(source, **{k: v for k, v in overrides.items() if k != 'dropout'})


def load_checkpoint(path, map_location='cpu', mmap=False):
    """A checkpoint dict, weights_only (no code runs from the file); mmap: tensors read only when used."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupt?): {reason}") from None
    if not isinstance(ckpt, dict) or not {'model', 'model_args'} <= set(ckpt):
        raise UserError(f"{path} is not a corridor-gpt checkpoint (no 'model' / 'model_args')")
    return ckpt


def model_from_checkpoint(ckpt, **overrides):
    """The model a checkpoint holds: our GPT, or a pretrained one rebuilt from its source (with weights='operator' the
    checkpoint holds the scalars alone). overrides: keys without weights (dropout, operator_lr_mult)."""
    args = {**ckpt['model_args'], **overrides}
    source, weights = ckpt.get('source'), ckpt.get('weights', 'all')
    operator = {key: args[key] for key in OPERATOR_KEYS}
    if source is None or weights == 'all' and is_gpt2(source):  # (a fine-tuned GPT-2: every weight in the file)
        model = GPT(GPTConfig(**args))
    else:
        from lab import pretrained
        from lab.gpt2 import gpt2
        model = gpt2(source, dropout=args['dropout'], **operator) if is_gpt2(source) else \
            pretrained.load_pretrained(source, **operator)[0]
    state = {k.removeprefix('_orig_mod.'): v for k, v in ckpt['model'].items()}  # saved from a compiled model
    if weights == 'operator':
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or any('.coefficients.' in key for key in missing):
            raise UserError(f"the checkpoint's operator scalars do not fit {source}'s layers")
    else:
        model.load_state_dict(state)
    return model


def read_log(out_dir):
    """log.jsonl's entries, one per evaluation; a line torn by a crash is skipped."""
    path, entries = os.path.join(out_dir, 'log.jsonl'), []
    for line in open(path) if os.path.isfile(path) else []:
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return entries


def load_run(out_dir):
    """A run folder: name, config, log, final (γ, δ), the (iter, γ, δ) series, parameter counts, source, seconds. The
    checkpoint (memory-mapped) makes a model only for what log.jsonl lacks (a stop after the last eval; a size)."""
    if not os.path.isdir(out_dir):
        raise UserError(f"no run folder {out_dir!r}")
    ckpt = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), mmap=True)
    log = read_log(out_dir)
    series = [(e['iter'], torch.tensor(e['gamma']), torch.tensor(e['delta'])) for e in log if 'gamma' in e]
    # stopped after its last evaluation (Ctrl-C), or a log lost: the checkpoint's own scalars
    model = None if series and series[-1][0] == ckpt['iter_num'] else model_from_checkpoint(ckpt)
    gamma, delta = series[-1][1:] if model is None else gamma_delta(model.operator_coefficients())
    if ckpt.get('source') is None or is_gpt2(ckpt['source']):
        with torch.device('meta'):  # our GPT's parameters counted without allocating them
            counted = GPT(GPTConfig(**ckpt['model_args']))
    else:
        counted = model or model_from_checkpoint(ckpt)
    return dict(name=os.path.basename(os.path.normpath(out_dir)), out_dir=out_dir, config=ckpt['config'],
                iter=ckpt['iter_num'], log=log, gamma=gamma, delta=delta, series=series,
                params=counted.get_num_params(), non_embedding=counted.non_embedding_params(),
                source=ckpt.get('source'), seconds=ckpt.get('seconds'))
