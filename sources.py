"""
What the scripts read: prepared data, run folders (ckpt.pt, log.jsonl), the models they hold or come from (ours, or a
pretrained one through lab/gpt2.py and lab/pretrained.py, imported only when one is asked for), and their tokenizers.
Each file is checked as it is read, by lab/file_checks.py.
"""

import json
import os
import pickle
import sys
import zipfile

import numpy as np
import torch

from common import UserError, gpt2_encoding, is_gpt2
from model import GPT, OPERATOR_KEYS, OPERATORS, GPTConfig, gamma_delta


def read_meta(data_root, dataset):
    """data_root/dataset/meta.json, checked (lab/file_checks.py), or one line naming it and how to write it again."""
    from lab import file_checks
    path = os.path.join(data_root, dataset, 'meta.json')
    if not os.path.isfile(path):
        raise UserError(f"no prepared data at {os.path.join(data_root, dataset)} (meta.json missing): run "
                        f"`python prepare.py {dataset}` or set --data_root / --dataset")
    try:
        with open(path, encoding='utf-8') as f:
            meta = json.load(f)
        file_checks.check_meta(meta)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        reason = str(e).splitlines()[0] if not isinstance(e, UnicodeDecodeError) else 'not UTF-8 text'
        raise UserError(f"{path} is not a meta.json written by prepare.py ({reason}): rerun "
                        f"`python prepare.py {dataset}`") from None
    return meta


def read_tokens(data_root, dataset, split, meta, at_least):
    """data_root/dataset/split.bin as a memmap of meta.json's dtype, checked: a whole number of tokens, more than
    at_least[0] of them (at_least[1] says what needs them), every id below vocab_size."""
    path = os.path.join(data_root, dataset, f'{split}.bin')
    dtype = np.dtype(meta.get('dtype', 'uint16'))
    size = os.path.getsize(path) if os.path.isfile(path) else 0
    if size % dtype.itemsize:
        raise UserError(f"{path} has {size} bytes, not a whole number of {dtype} tokens (truncated?): rerun "
                        f"`python prepare.py {dataset}`")
    if size // dtype.itemsize <= at_least[0]:
        raise UserError(f"{at_least[1]}, but {path} has {size // dtype.itemsize} tokens")
    tokens = np.memmap(path, dtype=dtype, mode='r')
    # an id past the vocabulary is an IndexError deep in the model on a CPU, a device-side assert on CUDA: one
    # vectorised pass now (docs/training.md: its time per GB)
    largest = int(tokens.max())
    if largest >= meta['vocab_size']:
        raise UserError(f"{path} holds token id {largest}, but meta.json's vocab_size is {meta['vocab_size']} "
                        f"(corrupt, or from another preparation): rerun `python prepare.py {dataset}`")
    return tokens


class Data:
    """data_root/dataset: meta.json, train.bin and val.bin, checked as they open (read_meta, read_tokens)."""

    def __init__(self, data_root, dataset, block_size, batch_size, device):
        self.dir, self.block_size, self.batch_size, self.device = \
            os.path.join(data_root, dataset), block_size, batch_size, device
        self.meta = read_meta(data_root, dataset)
        self.dtype = np.dtype(self.meta.get('dtype', 'uint16'))
        self.n_tokens = {split: len(read_tokens(data_root, dataset, split, self.meta, (
            block_size, f"block_size={block_size} needs more tokens than that"))) for split in ('train', 'val')}

    def offsets(self, split, count, generator):  # [count, batch_size] random start positions
        return torch.randint(self.n_tokens[split] - self.block_size, (count, self.batch_size), generator=generator)

    def batch(self, split, offsets):
        """(x, y) [len(offsets), block_size] on the device: the tokens at offsets, and the ones after each."""
        # reopened per batch: a long-lived np.memmap keeps its pages referenced and memory creeps up
        data = np.memmap(os.path.join(self.dir, f'{split}.bin'), dtype=self.dtype, mode='r')
        x = torch.stack([torch.from_numpy(data[i:i + self.block_size].astype(np.int64)) for i in offsets])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + self.block_size].astype(np.int64)) for i in offsets])
        if self.device.startswith('cuda'):  # pinned: the copy overlaps the step (MPS shares the host's memory)
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)


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


def load_model(source, **overrides):
    """(model, meta naming its tokenizer) of a run folder, GPT-2 (as our GPT) or another pretrained causal LM (see
    lab/hf_sources.py). overrides: keys that carry no weights (dropout; a pretrained model's operator keys)."""
    if is_gpt2(source):
        from lab.gpt2 import gpt2
        return gpt2(source, **overrides), dict(tokenizer='gpt2', vocab_size=50257)
    if os.path.isfile(os.path.join(source, 'ckpt.pt')):
        ckpt = load_checkpoint(os.path.join(source, 'ckpt.pt'))
        return model_from_checkpoint(ckpt, **overrides), ckpt['meta']
    if is_run_folder(source):  # its config.json is a run's, not a transformers model's
        raise UserError(no_checkpoint_yet(source, 'loading its model'))
    from lab import pretrained  # dropout: a pretrained model keeps its own
    return pretrained.load_pretrained(source, **{k: v for k, v in overrides.items() if k != 'dropout'})


def is_run_folder(folder):
    """A folder train.py writes: its lock and log.jsonl from the run's first moment, ckpt.pt from its first evaluation
    after iteration 0."""
    return any(os.path.isfile(os.path.join(folder, name)) for name in ('ckpt.pt', 'log.jsonl', 'train.lock'))


def read_run_config(out_dir):
    """A run folder's config.json (every key of the run, as train.py wrote it), or one line saying what is wrong."""
    path = os.path.join(out_dir, 'config.json')
    try:
        with open(path, encoding='utf-8') as f:
            config = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} is missing: train.py writes it as a run starts") from None
    except (OSError, ValueError, RecursionError) as e:
        raise UserError(f"{path} is not a config.json train.py writes ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or config.get('operator') not in OPERATORS:
        raise UserError(f"{path} is not a config.json train.py writes (no known operator)")
    return config


def no_checkpoint_yet(out_dir, needs):
    """The line for a run folder without ckpt.pt, naming what needed it and when the run writes it."""
    try:
        when = f" (iter {int(read_run_config(out_dir)['eval_interval'])})"
    except (UserError, KeyError, TypeError, ValueError):
        when = ''
    return (f"{out_dir} holds a train.py run with no ckpt.pt yet, which {needs} needs: train.py writes it at the "
            f"run's first evaluation after iteration 0{when}; if the run is still training, wait for that, else run "
            f"its train.py command again (its keys: {os.path.join(out_dir, 'config.json')})")


NOTED = set()  # the "predates model_args" notes printed so far


def load_checkpoint(path, map_location='cpu', mmap=False, purpose='model'):
    """A checkpoint dict, weights_only (no code runs from the file), checked for its purpose: 'info' (keys, types, the
    pickle's CRC-32), 'model' (and the weights' bytes and values) or 'resume' (and all a resume reads). The first thing
    wrong is one line that says what still works. mmap: tensors read only when used (a legacy non-zip file: read)."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}")
    from lab import file_checks
    changed = file_checks.changed_records(path, pickle_only=purpose == 'info')
    if 'data.pkl' in changed:
        raise UserError(f"{path} is not a readable checkpoint: its bytes changed on disk (they no longer match the "
                        f"CRC-32 saved with them); restore it from a copy, or train again")
    mmap = mmap and zipfile.is_zipfile(path)  # torch memory-maps only the zip format it writes since 1.6
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:  # torch's own message advises weights_only=False: wrong for a corrupt file, and risky
        raise UserError(f"{path} is not a readable checkpoint: corrupt, or holding objects other than tensors and "
                        f"plain values, which are not unpickled (that could run code from the file)") from None
    except Exception as e:
        reason = next((line for line in str(e).strip().splitlines() if 'weights_only' not in line), type(e).__name__)
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupt?): {reason.strip()}") from None
    defaulted = file_checks.check_checkpoint(path, ckpt, purpose, changed)
    note = f"{path} predates model_args " + ', '.join(f"{k} (read as {ckpt['model_args'][k]!r})" for k in defaulted)
    if defaulted and note not in NOTED:  # said once a process, and only of a checkpoint that is read
        NOTED.add(note)
        print(note, file=sys.stderr)
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
    else:  # our GPT's names and shapes were checked as the checkpoint loaded; a pretrained model's, here
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise UserError(f"the checkpoint's weights do not fit {source or 'the model of its model_args'} "
                            f"({str(e).splitlines()[0].strip()})") from None
    return model


def read_log(out_dir):
    """log.jsonl's entries, one per evaluation, checked; a last line torn by a crash (no newline) is skipped, anything
    else wrong is one line naming the file and the line: nothing is dropped silently."""
    path, entries, shape = os.path.join(out_dir, 'log.jsonl'), [], None
    if not os.path.isfile(path):
        return entries
    from lab import file_checks
    with open(path, 'rb') as f:
        lines = f.read().split(b'\n')
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line.decode('utf-8'))
            shape = file_checks.check_log_entry(entry, shape)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
            if n == len(lines):  # no newline after it: an append a crash cut short
                continue
            reason = 'not UTF-8 text' if isinstance(e, UnicodeDecodeError) else str(e).splitlines()[0]
            raise UserError(f"{path}:{n}: not a log line train.py writes ({reason}): remove or fix that line") from None
        entries.append(entry)
    return entries


def load_run(out_dir):
    """A run folder: name, config, log, final (γ, δ), the (iter, γ, δ) series, parameter counts, source, seconds, and
    checkpoint (its path, or None). The checkpoint (memory-mapped) makes a model only for what log.jsonl lacks (a stop
    after the last eval; a size). A run that saved none yet is read from log.jsonl and config.json: its last
    evaluation, no parameter counts or seconds (those are ckpt.pt's)."""
    if not os.path.isdir(out_dir):
        raise UserError(f"no run folder {out_dir!r}")
    path = os.path.join(out_dir, 'ckpt.pt')
    log = read_log(out_dir)
    series = [(e['iter'], torch.tensor(e['gamma']), torch.tensor(e['delta'])) for e in log if 'gamma' in e]
    if not os.path.isfile(path):
        if not is_run_folder(out_dir):
            raise UserError(f"{out_dir} is not a train.py run folder (no ckpt.pt, no log.jsonl)")
        if not series:
            raise UserError(f"{out_dir} holds a run with no evaluation in log.jsonl and no checkpoint yet: nothing to "
                            f"analyze before its first evaluation")
        config = read_run_config(out_dir)
        source = config.get('init_from', 'scratch')
        return dict(name=os.path.basename(os.path.normpath(out_dir)), out_dir=out_dir, config=config,
                    iter=series[-1][0], log=log, gamma=series[-1][1], delta=series[-1][2], series=series, params=None,
                    non_embedding=None, source=None if source == 'scratch' else source, seconds=None, checkpoint=None)
    ckpt = load_checkpoint(path, mmap=True)
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
                source=ckpt.get('source'), seconds=ckpt.get('seconds'), checkpoint=path)
