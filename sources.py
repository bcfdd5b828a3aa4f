"""
What the scripts read: prepared data, run folders (ckpt.pt, log.jsonl), the models they hold or come from (ours, or a
pretrained one through lab/gpt2.py and lab/pretrained.py, imported only when one is asked for), and their tokenizers.
"""

import json
import os
import pickle
import sys
import zipfile
import zlib

import numpy as np
import torch

from common import GPT2_NAMES, UserError, gpt2_encoding, model_config
from model import GPT, OPERATOR_KEYS, GPTConfig, gamma_delta


# meta.json's tokenizers (prepare.py writes them; tokenizer_from_meta reads them), and a bound no vocabulary reaches
# (the largest, Gemma 3's, has 262k entries): a larger vocab_size is a corrupt file, not a model to allocate
TOKENIZERS = ('char', 'gpt2', 'hf', 'synthetic')  # synthetic: lab/bench.py's random ids, no text
MAX_VOCAB = 1 << 24
TOKEN_DTYPES = {'uint16': 1 << 16, 'uint32': 1 << 32}  # a .bin's dtype, and how many ids it can hold


def check_meta(meta):
    """A meta.json dict as prepare.py writes it (no dtype, as in a checkpoint's copy: uint16); a ValueError says what."""
    if not isinstance(meta, dict):
        raise ValueError(f"a {type(meta).__name__}, not an object")
    vocab_size, dtype = meta.get('vocab_size'), meta.get('dtype', 'uint16')
    if meta.get('tokenizer') not in TOKENIZERS:
        raise ValueError(f"tokenizer is {meta.get('tokenizer')!r}, not one of {', '.join(TOKENIZERS)}")
    if type(vocab_size) is not int or not 0 < vocab_size <= MAX_VOCAB:
        raise ValueError(f"vocab_size is {vocab_size!r}, not a whole number from 1 to {MAX_VOCAB:,}")
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"dtype is {dtype!r}, not {' or '.join(TOKEN_DTYPES)}")
    if vocab_size > TOKEN_DTYPES[dtype]:
        raise ValueError(f"vocab_size {vocab_size} does not fit {dtype} token ids")
    itos = meta.get('itos')
    if meta['tokenizer'] == 'char' and not (isinstance(itos, list) and len(itos) == vocab_size
                                            and all(isinstance(c, str) for c in itos) and len(set(itos)) == len(itos)):
        raise ValueError(f"itos is not a list of vocab_size={vocab_size} distinct characters")
    if meta['tokenizer'] == 'hf' and not isinstance(meta.get('tokenizer_source'), str):
        raise ValueError("tokenizer 'hf' without a tokenizer_source")


def read_meta(data_root, dataset):
    """data_root/dataset/meta.json, checked (check_meta), or one line naming it and how to write it again."""
    path = os.path.join(data_root, dataset, 'meta.json')
    if not os.path.isfile(path):
        raise UserError(f"no prepared data at {os.path.join(data_root, dataset)} (meta.json missing): run "
                        f"`python prepare.py {dataset}` or set --data_root / --dataset")
    try:
        with open(path, encoding='utf-8') as f:
            meta = json.load(f)
        check_meta(meta)
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


def is_gpt2(source):
    """A GPT-2 name, or a local folder saved by `transformers` whose config.json says model_type 'gpt2'."""
    try:
        with open(os.path.join(source, 'config.json')) as f:
            return source in GPT2_NAMES or json.load(f).get('model_type') == 'gpt2'
    except (OSError, ValueError, AttributeError, RecursionError):  # not GPT-2's: what reads it next says what's wrong
        return source in GPT2_NAMES


def load_model(source, **overrides):
    """(model, meta naming its tokenizer) of a run folder, GPT-2 (as our GPT) or another pretrained causal LM (see
    lab/hf_sources.py). overrides: keys that carry no weights (dropout; a pretrained model's operator keys)."""
    if is_gpt2(source):
        from lab.gpt2 import gpt2
        return gpt2(source, **overrides), dict(tokenizer='gpt2', vocab_size=50257)
    if os.path.isfile(os.path.join(source, 'ckpt.pt')):
        ckpt = load_checkpoint(os.path.join(source, 'ckpt.pt'))
        return model_from_checkpoint(ckpt, **overrides), ckpt['meta']
    from lab import pretrained  # dropout: a pretrained model keeps its own
    return pretrained.load_pretrained(source, **{k: v for k, v in overrides.items() if k != 'dropout'})


# What train.py writes into ckpt.pt (run.checkpoint_state): each key's type. Every reader needs READ_KEYS, a resume
# RESUME_KEYS too; a missing other key is one from before it was saved (its default). SHAPING_KEYS: every version's.
CHECKPOINT_KEYS = dict(model=dict, model_args=dict, config=dict, meta=dict, iter_num=int, optimizer=dict, scaler=dict,
                       rng=dict, tokens_seen=int, best_val_loss=float, seconds=float, weights=str, source=(str, type(None)))
READ_KEYS = ('model', 'model_args', 'config', 'meta', 'iter_num')
RESUME_KEYS = ('optimizer', 'scaler', 'rng', 'tokens_seen', 'best_val_loss')
SHAPING_KEYS = ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'bias', 'operator')
NOTED = set()


def load_checkpoint(path, map_location='cpu', mmap=False, purpose='model'):
    """A checkpoint dict, weights_only (no code runs from the file), checked for its purpose: 'info' (keys, types, the
    pickle's CRC-32), 'model' (and the weights' bytes and values) or 'resume' (and all a resume reads). The first thing
    wrong is one line that says what still works. mmap: tensors read only when used (a legacy non-zip file: read)."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}")
    changed = changed_records(path, pickle_only=purpose == 'info')
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
    saved_crcs = None
    if changed:  # which tensors sit in the changed records decides what still works (check_tensors)
        with zipfile.ZipFile(path) as archive:
            saved_crcs = {info.CRC for info in archive.infolist()}
    if isinstance(ckpt, dict) and isinstance(ckpt.get('model_args'), dict) and 'operator' not in ckpt['model_args'] \
            and 'meta' not in ckpt and 'n_layer' in ckpt['model_args']:
        raise UserError(f"{path} is a nanoGPT checkpoint (no operator keys, no tokenizer meta): corridor-gpt reads its "
                        f"own run folders and pretrained models; for OpenAI's weights use --init_from=gpt2")
    try:
        defaulted = check_read_keys(ckpt, purpose, saved_crcs)
    except ValueError as e:
        raise UserError(f"{path} is not a checkpoint this version of corridor-gpt reads: {e}; nothing in it is used "
                        f"(restore it from a copy, or train again)") from None
    if purpose == 'resume':  # a resume's own keys are checked only for a resume
        try:
            check_resume_keys(ckpt, saved_crcs, changed)
        except ValueError as e:
            raise UserError(f"{path} cannot resume the run: {e}; its weights are intact: sample or analyze it, or "
                            f"start a new run from them with --init_from={os.path.dirname(path) or '.'}") from None
    note = f"{path} predates model_args " + ', '.join(f"{k} (read as {ckpt['model_args'][k]!r})" for k in defaulted)
    if defaulted and note not in NOTED:  # said once a process, and only of a checkpoint that is read
        NOTED.add(note)
        print(note, file=sys.stderr)
    return ckpt


def check_read_keys(ckpt, purpose, saved_crcs=None):
    """What every reader uses: keys, types, model_args (returns the defaulted ones), meta, the weights' names and
    shapes; unless purpose is 'info', their bytes as saved and finite. A ValueError says what is wrong."""
    if not isinstance(ckpt, dict):
        raise ValueError(f"a {type(ckpt).__name__}, not a dict")
    missing = [key for key in READ_KEYS if key not in ckpt]
    if missing:
        raise ValueError(f"no {', '.join(map(repr, missing))}")
    for key, kind in CHECKPOINT_KEYS.items():
        if key in ckpt and not (isinstance(ckpt[key], kind) and not isinstance(ckpt[key], bool)
                                or kind is float and type(ckpt[key]) is int) \
                and (purpose == 'resume' or key not in RESUME_KEYS):
            kind = ' or '.join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
            raise ValueError(f"{key!r} must be {kind}, got a {type(ckpt[key]).__name__}")
    if ckpt['iter_num'] < 0:
        raise ValueError(f"iter_num is {ckpt['iter_num']}")
    if ckpt.get('weights', 'all') not in ('all', 'operator'):
        raise ValueError(f"weights is {ckpt['weights']!r}, not 'all' or 'operator'")
    args = ckpt['model_args']
    defaulted = check_model_args(args, ckpt['config'])
    try:
        check_meta(ckpt['meta'])
    except ValueError as e:
        raise ValueError(f"meta: {e}") from None
    if not all(isinstance(k, str) for k in ckpt['config']):
        raise ValueError("config has keys that are not names")
    # the architecture a run's config names is its model's; block_size may shrink and dropout change on a resume,
    # and a pretrained source's model_args are the source's own, whatever the config's defaults say
    fixed = ('n_layer', 'n_head', 'n_embd') if ckpt.get('source') is None else ()
    disagree = [k for k in fixed if k in ckpt['config'] and ckpt['config'][k] != args[k]]
    if disagree:
        raise ValueError(f"config and model_args disagree on {', '.join(disagree)}")
    check_weights(ckpt, args)
    if purpose != 'info':
        check_tensors(ckpt, ('model',), saved_crcs)
    return defaulted


def check_model_args(args, config):
    """model_args as GPTConfig's fields, of its defaults' types, values a model can have. A field newer than the file
    takes the run config's value, or else its default (by GPTConfig's rule, the run's behaviour): returns those."""
    fields = GPTConfig.__dataclass_fields__
    unknown, missing = sorted(set(args) - set(fields)), [key for key in fields if key not in args]
    if unknown:
        raise ValueError(f"model_args has unknown keys {', '.join(map(repr, unknown))} (written by a newer version?)")
    if any(key in SHAPING_KEYS for key in missing):  # no default can stand in for the shape of saved weights
        raise ValueError(f"model_args lacks {', '.join(repr(k) for k in missing if k in SHAPING_KEYS)}")
    args.update({key: config.get(key, fields[key].default) for key in missing})
    for key, field in fields.items():
        value, default = args[key], field.default
        if not (type(value) is type(default) or type(default) is float and type(value) is int):
            raise ValueError(f"model_args {key} must be {type(default).__name__}, got {value!r}")
    try:
        model_config(args, saved=True)
    except UserError as e:
        raise ValueError(f"model_args: {e}") from None
    return missing


def check_weights(ckpt, args):
    """ckpt['model'] holds named tensors; our GPT's (a fine-tuned GPT-2's) fit a model of args (a pretrained one's: as
    they load, model_from_checkpoint)."""
    state = ckpt['model']
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError("'model' holds entries that are not named tensors")
    source, weights = ckpt.get('source'), ckpt.get('weights', 'all')
    if not (source is None or weights == 'all' and is_gpt2(source)):
        return
    with torch.device('meta'):  # no memory
        expected = GPT(GPTConfig(**args)).state_dict()
    state = {k.removeprefix('_orig_mod.'): v for k, v in state.items()}
    missing, unknown = [k for k in expected if k not in state], [k for k in state if k not in expected]
    if missing or unknown:
        raise ValueError(f"'model' lacks {missing[:3]} or has unknown {unknown[:3]} for model_args")
    wrong = [f"{k} {list(v.shape)} (model_args make {list(expected[k].shape)})" for k, v in state.items()
             if v.shape != expected[k].shape or not v.is_floating_point()]
    if wrong:
        raise ValueError(f"'model' has a wrong tensor: {wrong[0]}")


def check_resume_keys(ckpt, saved_crcs=None, changed=()):
    """What restore_state reads beyond check_read_keys, intact, and no record changed (a resume uses the whole file)."""
    missing = [key for key in RESUME_KEYS if key not in ckpt]
    if missing:
        raise ValueError(f"no {', '.join(map(repr, missing))}")
    groups, state = ckpt['optimizer'].get('param_groups'), ckpt['optimizer'].get('state')
    if not (isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get('params'), list) for g in groups)
            and isinstance(state, dict) and all(isinstance(s, dict) for s in state.values())):
        raise ValueError("'optimizer' is not an optimizer's state dict (param_groups, state)")
    rng = ckpt['rng']
    if not (all(isinstance(rng.get(k), torch.Tensor) and rng[k].dtype == torch.uint8 for k in ('torch', 'data'))
            and all(isinstance(rng.get(k), (torch.Tensor, type(None))) for k in ('cuda', 'mps'))):
        raise ValueError("'rng' lacks the torch, data and device generator states")
    check_tensors(ckpt, ('optimizer', 'rng'), saved_crcs)
    if changed:
        raise ValueError(f"its record {changed[0]} does not match the CRC-32 saved with it (bytes changed on disk)")


def changed_records(path, pickle_only=False):
    """The records of a checkpoint's zip whose bytes no longer match the CRC-32 torch.save wrote beside each (on by
    default: torch.utils.serialization.config.save.compute_crc32; torch checks none on an mmap load). None in a legacy
    (non-zip) file, nor for a record saved without one (CRC 0). pickle_only: only data.pkl, the dict's structure."""
    changed = []
    try:
        if not zipfile.is_zipfile(path):
            return []
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, ValueError):  # its directory unreadable
        return ['data.pkl']
    with archive:
        for info in archive.infolist():
            if info.CRC == 0 or pickle_only and not info.filename.endswith('/data.pkl'):
                continue
            try:
                with archive.open(info) as record:
                    while record.read(1 << 24):  # zipfile checks the CRC-32 as it reaches the record's end
                        pass
            except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, ValueError, zlib.error):
                changed.append(info.filename.split('/', 1)[-1])  # its header is damaged, or its bytes
    return changed


def tensors_in(obj, path=''):
    """(path, tensor) of every tensor in nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        yield from tensors_in(value, f"{path}/{key}" if path else str(key))


def check_tensors(ckpt, parts, saved_crcs=None):
    """The tensors under parts (top-level keys) are finite and, when some record changed (saved_crcs: every record's
    CRC-32 as saved), stored in an unchanged one. A ValueError names the first that fails."""
    for path, t in tensors_in({part: ckpt[part] for part in parts}):
        if saved_crcs is not None:
            storage = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage().cpu())
            if zlib.crc32(storage.numpy()) not in saved_crcs:
                raise ValueError(f"{path} does not match the CRC-32 saved with it (bytes changed on disk)")
        # a sum is finite if every value is (20x faster than isfinite().all()); one that overflowed is checked exactly
        if t.is_floating_point() and not torch.isfinite(t.sum()) and not torch.isfinite(t).all():
            raise ValueError(f"{path} holds non-finite values (inf or nan)")


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
    with open(path, 'rb') as f:
        lines = f.read().split(b'\n')
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line.decode('utf-8'))
            shape = check_log_entry(entry, shape)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
            if n == len(lines):  # no newline after it: an append a crash cut short
                continue
            reason = 'not UTF-8 text' if isinstance(e, UnicodeDecodeError) else str(e).splitlines()[0]
            raise UserError(f"{path}:{n}: not a log line train.py writes ({reason}): remove or fix that line") from None
        entries.append(entry)
    return entries


def check_log_entry(entry, shape):
    """An evaluation's entry: iter and tokens whole numbers >= 0, the losses numbers, γ and δ (if any) [layers, heads]
    lists of numbers, the same shape on every line; returns that shape. A ValueError says what is wrong."""
    if not isinstance(entry, dict):
        raise ValueError(f"a {type(entry).__name__}, not an object")
    for key in ('iter', 'tokens'):
        if type(entry.get(key)) is not int or entry[key] < 0:
            raise ValueError(f"{key} is {entry.get(key)!r}, not a whole number >= 0")
    for key in ('val_loss', 'train_loss'):
        if type(entry.get(key)) not in (int, float):
            raise ValueError(f"{key} is {entry.get(key)!r}, not a number")
    for key, rows in ((key, entry[key]) for key in ('gamma', 'delta') if key in entry):
        if not (isinstance(rows, list) and rows and all(isinstance(r, list) and len(r) == len(rows[0]) and r
                                                        and all(type(x) in (int, float) for x in r) for r in rows)):
            raise ValueError(f"{key} is not a [layers, heads] table of numbers")
        if (shape or (len(rows), len(rows[0]))) != (len(rows), len(rows[0])):
            raise ValueError(f"{key} has {len(rows)}×{len(rows[0])} heads, the lines before {shape[0]}×{shape[1]}")
        shape = (len(rows), len(rows[0]))
    return shape


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
