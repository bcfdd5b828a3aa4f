"""
What the scripts read: prepared data (Data), run folders (ckpt.pt, log.jsonl), and the models they come from, ours,
OpenAI's GPT-2 as ours, or another pretrained causal LM through lab/hf.py, imported only when one is asked for
(that module imports this repo's common.py and model.py, never this file); the tokenizer that goes with each.
"""

import json
import os

import numpy as np
import torch

from common import GPT2_NAMES, UserError, gpt2_encoding
from model import GPT, OPERATOR_KEYS, GPTConfig, gamma_delta

# ---------------------------------------------------------------------------------------------- prepared data


class Data:
    """data_root/dataset: meta.json and the token files train.bin and val.bin (uint16, or uint32 for a vocabulary
    beyond 65,536: meta.json's dtype)."""

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

    def offsets(self, split, count, generator):
        """[count, batch_size] random start positions."""
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
    """(encode, decode) for a dataset's meta.json dict: 'char' (its itos list), 'gpt2', or a pretrained model's own
    ('hf', prepare.py --tokenizer=SOURCE)."""
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
        from lab import hf
        return hf.hf_codec(meta['tokenizer_source'])
    enc = gpt2_encoding()
    return (lambda text: enc.encode(text, allowed_special={'<|endoftext|>'})), enc.decode


def check_tokenizer(model, meta, data_dir):
    """Data (its meta.json dict) must be tokenized as the model reads: the same vocabulary size for our GPT, the same
    tokenizer (its fingerprint, prepare.py --tokenizer=SOURCE) for a pretrained transformers model."""
    if isinstance(model, GPT):
        if model.config.vocab_size != meta['vocab_size']:
            raise UserError(f"the model's vocabulary ({model.config.vocab_size}) does not match the data's "
                            f"({meta['vocab_size']}, {meta['tokenizer']} tokenizer in {data_dir})")
        return
    if meta.get('tokenizer_fingerprint') != model.tokenizer_fingerprint:  # computed as the model loaded
        used = meta.get('tokenizer_source', meta['tokenizer'])
        raise UserError(f"{data_dir} was tokenized with {used}'s tokenizer, not {model.source}'s: prepare the data "
                        f"with it, e.g. `python prepare.py {meta.get('dataset', 'wikitext2')} --tokenizer={model.source}`")


# ---------------------------------------------------------------------------------------------- models

def is_gpt2(source):
    """A GPT-2 name, or a local folder saved by `transformers` whose config.json says model_type 'gpt2'."""
    if source in GPT2_NAMES:
        return True
    try:
        with open(os.path.join(source, 'config.json')) as f:
            return json.load(f).get('model_type') == 'gpt2'
    except (OSError, ValueError, AttributeError):
        return False


def gpt2(model_type, **overrides):
    """OpenAI's GPT-2 weights (a name in GPT2_NAMES or a local transformers folder) in our GPT, through `transformers`.
    overrides: dropout and the operator keys (at γ0 = 0, δ0 = 1 every form computes exactly GPT-2)."""
    architecture = {'block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'bias'} & set(overrides)
    if architecture:
        raise UserError(f"GPT-2's architecture is fixed by its weights: cannot override {sorted(architecture)}")
    from transformers import GPT2LMHeadModel  # only needed here
    try:
        hf = GPT2LMHeadModel.from_pretrained(model_type)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load GPT-2 weights {model_type!r}: {str(e).splitlines()[0]} (no network? pass a "
                        f"local folder saved with save_pretrained)") from None
    c = hf.config
    model = GPT(GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                          n_embd=c.n_embd, bias=True, **overrides))
    ours, copied = model.state_dict(), set()
    transposed = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')  # Conv1D
    with torch.no_grad():
        for key, value in hf.state_dict().items():
            if key.endswith(('.attn.masked_bias', '.attn.bias')) or key == 'lm_head.weight':
                continue  # causal-mask buffers; lm_head is tied to wte
            value = value.t() if key.endswith(transposed) else value
            target = ours[key][:value.size(0)] if key == 'transformer.wte.weight' else ours[key]  # padded vocabulary
            assert target.shape == value.shape, f"{key}: ours {tuple(target.shape)}, GPT-2 {tuple(value.shape)}"
            target.copy_(value)
            copied.add(key)
    missing = [k for k in ours if k not in copied and '.coefficients.' not in k and k != 'lm_head.weight']
    assert not missing, f"not in the GPT-2 checkpoint: {missing}"
    return model


def load_model(source, **overrides):
    """(model, meta) from a run folder (its ckpt.pt), OpenAI's GPT-2 (a name or a local transformers folder) as our
    GPT, or another pretrained causal LM (lab.hf.PretrainedLM: a packaged model, a .gguf file, a transformers folder
    or hub name; lab/hf.py names every kind when a source is none of them). meta names the tokenizer as a dataset's
    meta.json does. overrides: keys that carry no weights (dropout; for a pretrained model the operator keys)."""
    if is_gpt2(source):
        return gpt2(source, **overrides), dict(tokenizer='gpt2', vocab_size=50257)
    if os.path.isfile(os.path.join(source, 'ckpt.pt')):
        ckpt = load_checkpoint(os.path.join(source, 'ckpt.pt'))
        return model_from_checkpoint(ckpt, **overrides), ckpt['meta']
    from lab import hf  # dropout: a pretrained model keeps its own
    return hf.load_pretrained(source, **{k: v for k, v in overrides.items() if k != 'dropout'})


# ---------------------------------------------------------------------------------------------- checkpoints

def load_checkpoint(path, map_location='cpu', mmap=False):
    """A checkpoint dict, loaded with weights_only=True (no code runs from the file); mmap: tensors are read from
    the file only when used."""
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


def checkpoint_progress(path):
    """(iteration, config) of a checkpoint file, or (None, None) when there is none or it is unreadable.
    Memory-mapped: the weights are not read."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
        return int(ckpt['iter_num']), dict(ckpt.get('config', {}))
    except Exception:
        return None, None


def model_from_checkpoint(ckpt, **overrides):
    """The model a checkpoint holds (weights loaded, train mode): our GPT, or a pretrained model rebuilt from its
    source. overrides: GPTConfig keys that carry no weights (dropout, operator_lr_mult). A checkpoint of
    weights='operator' (train.py --train_only=operator) holds only the operator's scalars; the frozen weights come
    from the source again."""
    args = {**ckpt['model_args'], **overrides}
    source, weights = ckpt.get('source'), ckpt.get('weights', 'all')
    operator = {key: args[key] for key in OPERATOR_KEYS}
    if source is not None and not is_gpt2(source):
        from lab import hf
        model, _ = hf.load_pretrained(source, **operator)
    elif weights == 'operator':
        model = gpt2(source, dropout=args['dropout'], **operator)
    else:
        model = GPT(GPTConfig(**args))
    state = {k.removeprefix('_orig_mod.'): v for k, v in ckpt['model'].items()}  # saved from a compiled model
    if weights == 'operator':
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or any('.coefficients.' in key for key in missing):
            raise UserError(f"the checkpoint's operator scalars do not fit {source}'s layers")
    else:
        model.load_state_dict(state)
    return model


# ---------------------------------------------------------------------------------------------- run folders

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
    """A run folder: its name, config, log entries, final (γ, δ), the series (iter, γ, δ) at every evaluation, the
    model's parameter counts, the source of a pretrained model, and the wall seconds it trained.

    γ and δ come from log.jsonl, which holds every head's at every evaluation; the checkpoint gives the config and
    progress (memory-mapped: its weights are not read), and is rebuilt into a model only for what the log lacks: a
    run stopped after its last evaluation, and a pretrained model's size."""
    if not os.path.isdir(out_dir):
        raise UserError(f"no run folder {out_dir!r}")
    ckpt = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), mmap=True)
    log = read_log(out_dir)
    series = [(e['iter'], torch.tensor(e['gamma']), torch.tensor(e['delta'])) for e in log if 'gamma' in e]
    model = None
    if series and series[-1][0] == ckpt['iter_num']:
        gamma, delta = series[-1][1:]
    else:  # stopped after its last evaluation (Ctrl-C), or a log lost: the checkpoint's own scalars
        model = model_from_checkpoint(ckpt)
        gamma, delta = gamma_delta(model.operator_coefficients())
    if ckpt.get('source') is None or is_gpt2(ckpt['source']):
        with torch.device('meta'):  # our GPT's parameters counted without allocating them
            counted = GPT(GPTConfig(**ckpt['model_args']))
    else:
        counted = model or model_from_checkpoint(ckpt)
    return dict(name=os.path.basename(os.path.normpath(out_dir)), out_dir=out_dir, config=ckpt['config'],
                iter=ckpt['iter_num'], log=log, gamma=gamma, delta=delta, series=series,
                params=counted.get_num_params(), non_embedding=counted.non_embedding_params(),
                source=ckpt.get('source'), seconds=ckpt.get('seconds'))
