"""
What ckpt.pt, log.jsonl and meta.json must hold before a script trusts them. sources.py calls these as it reads each
file (read_meta, load_checkpoint, read_log); a fault is a ValueError that says what is wrong, or for a checkpoint one
line that says what still works. torch.save writes each zip record's CRC-32 and torch checks none on an mmap load:
changed_records reads them, so bytes changed on disk stop only what uses them.
"""

import os
import zipfile
import zlib

import torch

from common import UserError, is_gpt2, model_config
from model import GPT, GPTConfig

# meta.json's tokenizers (prepare.py writes them; sources.tokenizer_from_meta reads them), and a bound no vocabulary
# reaches (the largest, Gemma 3's, has 262k entries): a larger vocab_size is a corrupt file, not a model to allocate
TOKENIZERS = ('char', 'gpt2', 'hf', 'synthetic')  # synthetic: lab/bench.py's random ids, no text
MAX_VOCAB = 1 << 24
TOKEN_DTYPES = {'uint16': 1 << 16, 'uint32': 1 << 32}  # a .bin's dtype, and how many ids it can hold


def check_meta(meta):
    """meta.json as prepare.py writes it (no dtype, as in a checkpoint's copy: uint16); a ValueError says what."""
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


# What train.py writes into ckpt.pt (run.checkpoint_state): each key's type. Every reader needs READ_KEYS, a resume
# RESUME_KEYS too; a missing other key is one from before it was saved (its default). SHAPING_KEYS: every version's.
CHECKPOINT_KEYS = dict(model=dict, model_args=dict, config=dict, meta=dict, iter_num=int, optimizer=dict,
                       scaler=dict, rng=dict, tokens_seen=int, best_val_loss=float, seconds=float, weights=str,
                       source=(str, type(None)))
READ_KEYS = ('model', 'model_args', 'config', 'meta', 'iter_num')
RESUME_KEYS = ('optimizer', 'scaler', 'rng', 'tokens_seen', 'best_val_loss')
SHAPING_KEYS = ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'bias', 'operator')


def check_checkpoint(path, ckpt, purpose, changed):
    """A loaded ckpt for load_checkpoint's purpose; changed: its changed_records. Returns the defaulted model_args;
    a fault is one line that says what still works."""
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
    return defaulted


def check_read_keys(ckpt, purpose, saved_crcs):
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
    they load, sources.model_from_checkpoint)."""
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


def check_resume_keys(ckpt, saved_crcs, changed):
    """What run.restore_state reads beyond check_read_keys, intact; and no record changed (a resume uses them all)."""
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
    """The records of a checkpoint's zip whose bytes no longer match their CRC-32 (torch.save writes them unless
    torch.utils.serialization.config.save.compute_crc32 is off). None in a legacy (non-zip) file, nor for a record
    saved without one (CRC 0). pickle_only: only data.pkl, the dict's structure."""
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
