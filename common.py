"""
What the scripts share: one-line errors, the `--key=value` configurator, tokenizers, atomic checkpoint files,
reading run folders (and where their heads sit: occupancy_report), and the accelerator peak-FLOPs table for MFU.
"""

import ast
import difflib
import glob
import json
import os
import sys
from typing import Callable, NamedTuple

import torch

from model import GPT, GPTConfig, gamma_delta, in_corridor


class UserError(Exception):
    """Bad input: printed as one line (no traceback), exit status 2."""


def main_guard(main):
    """Run main(); a UserError becomes `error: <message>` on stderr and exit status 2."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def closest(name, candidates):
    match = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


# ---------------------------------------------------------------------------------------------- configurator

def _checked(key, value, default, optional):
    """value converted to the type of the default, or a UserError naming the key."""
    if value is None and key in optional:
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, type(default)):
        return value
    raise UserError(f"{key} must be {type(default).__name__} like its default {default!r}, got {value!r}")


def parse_config(defaults, argv, optional=(), hints=None):
    """nanoGPT's convention: arguments without '=' are Python config files of `key = value` lines, applied in
    order, then `--key=value` overrides. Returns a new dict with the same keys as defaults; unknown keys and
    values of the wrong type are UserErrors. Keys in `optional` may also be None; `hints` maps keys a user may
    expect (but that this script doesn't take) to the message that says why."""
    config = dict(defaults)

    def assign(key, value, where):
        if key in (hints or {}):
            raise UserError(f"{hints[key]} ({where})")
        if key not in defaults:
            raise UserError(f"unknown config key {key!r} in {where}{closest(key, defaults)}")
        config[key] = _checked(key, value, defaults[key], optional)

    for arg in argv:
        if arg.startswith('--'):
            key, eq, text = arg[2:].partition('=')
            if not eq:
                raise UserError(f"expected --key=value, got {arg!r}")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                value = text  # a bare string (--operator=corridor); a wrong type is reported below
            assign(key, value, 'the command line')
        else:
            if not os.path.isfile(arg):
                raise UserError(f"config file {arg!r} not found")
            namespace = {}
            try:
                exec(open(arg).read(), namespace)
            except Exception as e:
                raise UserError(f"config file {arg} failed: {type(e).__name__}: {e}") from None
            for key, value in namespace.items():
                if not key.startswith('_') and not callable(value) and type(value).__name__ != 'module':
                    assign(key, value, arg)
    return config


def model_config(config):
    """The GPTConfig named by a run config's keys; an impossible one is a UserError."""
    keys = GPTConfig.__dataclass_fields__
    try:
        return GPTConfig(**{k: v for k, v in config.items() if k in keys})
    except ValueError as e:
        raise UserError(str(e)) from None


# ---------------------------------------------------------------------------------------------- tokenizers

def gpt2_encoding():
    """tiktoken's GPT-2 BPE. It downloads its files once; offline, point TIKTOKEN_CACHE_DIR at a cache."""
    import tiktoken
    try:
        return tiktoken.get_encoding('gpt2')
    except Exception as e:
        raise UserError(f"cannot load the GPT-2 BPE through tiktoken ({type(e).__name__}): it downloads its files "
                        f"once, so without network set TIKTOKEN_CACHE_DIR to a folder that holds them") from None


class TextCodec(NamedTuple):
    """How a model reads text: its content tokens, and the special tokens its tokenizer puts around a sequence
    (walk.py samples sequences with it; walk_hf.py builds one for each Hugging Face tokenizer)."""
    encode: Callable          # text -> token ids, no special tokens
    prefix: tuple = ()        # e.g. BERT's [CLS], Llama's <|begin_of_text|>
    suffix: tuple = ()        # e.g. BERT's [SEP]

    def wrap(self, ids):
        return list(self.prefix) + list(ids) + list(self.suffix)


def tokenizer_from_meta(meta):
    """(encode, decode) for a dataset's meta.json dict: 'char' (its itos list) or 'gpt2'."""
    if meta['tokenizer'] == 'char':
        itos = meta['itos']
        stoi = {c: i for i, c in enumerate(itos)}

        def encode(text):
            unknown = sorted(set(text) - set(stoi))
            if unknown:
                raise UserError(f"characters {''.join(unknown)!r} are not in the model's vocabulary")
            return [stoi[c] for c in text]
        return encode, lambda ids: ''.join(itos[i] for i in ids)
    enc = gpt2_encoding()
    return (lambda text: enc.encode(text, allowed_special={'<|endoftext|>'})), enc.decode


# ---------------------------------------------------------------------------------------------- checkpoints

def save_checkpoint(obj, path):
    """Write atomically: a crash at any moment leaves either the old file or the new one, never a torn one."""
    tmp = f"{path}.tmp"
    with open(tmp, 'wb') as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load_checkpoint(path, map_location='cpu'):
    """A checkpoint dict, loaded with weights_only=True (no code runs from the file)."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupt?): {reason}") from None
    if not isinstance(ckpt, dict) or not {'model', 'model_args'} <= set(ckpt):
        raise UserError(f"{path} is not a corridor-gpt checkpoint (no 'model' / 'model_args')")
    return ckpt


def model_from_checkpoint(ckpt, **overrides):
    """The GPT a checkpoint holds (weights loaded, train mode); overrides: GPTConfig keys that carry no weights
    (dropout, operator_lr_mult)."""
    model = GPT(GPTConfig(**{**ckpt['model_args'], **overrides}))
    state = {k.removeprefix('_orig_mod.'): v for k, v in ckpt['model'].items()}  # saved from a compiled model
    model.load_state_dict(state)
    return model


# ---------------------------------------------------------------------------------------------- run folders

def read_log(out_dir):
    path = os.path.join(out_dir, 'log.jsonl')
    if not os.path.isfile(path):
        return []
    entries = []
    with open(path) as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line torn by a crash
    return entries


def load_run(out_dir):
    """A run folder: its name, config, log entries, final (γ, δ), the snapshot series (iter, γ, δ) and the
    model's parameter count (non-embedding)."""
    if not os.path.isdir(out_dir):
        raise UserError(f"no run folder {out_dir!r}")
    ckpt = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))
    snapshots = []
    for path in sorted(glob.glob(os.path.join(out_dir, 'ckpt_*.pt'))):  # zero-padded: sorted is iteration order
        snap = load_checkpoint(path)
        snapshots.append((snap['iter_num'], *gamma_delta(model_from_checkpoint(snap).operator_coefficients())))
    model = model_from_checkpoint(ckpt)
    gamma, delta = gamma_delta(model.operator_coefficients())
    return dict(name=os.path.basename(os.path.normpath(out_dir)), out_dir=out_dir, config=ckpt['config'],
                iter=ckpt['iter_num'], log=read_log(out_dir), gamma=gamma, delta=delta, snapshots=snapshots,
                params=model.get_num_params())



def occupancy_report(gamma, delta):
    """corridor.json's content for [n_layer, n_head] tensors of γ and δ."""
    layers = []
    for layer, (g, d) in enumerate(zip(gamma, delta)):
        layers.append(dict(layer=layer, gamma=g.tolist(), delta=d.tolist(),
                           occupancy=in_corridor(g).float().mean().item(),
                           below=int((g <= -1).sum()), above=int((g >= 0).sum()),
                           # torch's median: the lower middle value for an even number of heads
                           gamma_mean=g.mean().item(), gamma_median=g.median().item(), delta_mean=d.mean().item()))
    return dict(layers=layers, occupancy=in_corridor(gamma).float().mean().item(),
                occupancy_beyond_first=in_corridor(gamma[1:]).float().mean().item() if len(gamma) > 1 else None)


GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')


def is_gpt2(source):
    """A GPT-2 name, or a local folder saved by `transformers` whose config.json says model_type 'gpt2'."""
    if source in GPT2_NAMES:
        return True
    try:
        with open(os.path.join(source, 'config.json')) as f:
            return json.load(f).get('model_type') == 'gpt2'
    except (OSError, ValueError, AttributeError):
        return False


def load_model(source, **overrides):
    """(model, meta) from a run folder (its ckpt.pt) or from OpenAI's GPT-2 (a name or a local transformers
    folder); meta names the tokenizer as a dataset's meta.json does. overrides: GPTConfig keys that carry no
    weights (dropout and, for GPT-2, the operator keys)."""
    if is_gpt2(source):
        try:
            return GPT.from_pretrained(source, **overrides), dict(tokenizer='gpt2', vocab_size=50257)
        except (RuntimeError, ValueError) as e:
            raise UserError(str(e)) from None
    if not os.path.isdir(source):
        raise UserError(f"no run folder {source!r} (a folder train.py wrote, or a GPT-2 name: {', '.join(GPT2_NAMES)})")
    if os.path.isfile(os.path.join(source, 'config.json')) and not os.path.isfile(os.path.join(source, 'ckpt.pt')):
        raise UserError(f"{source} is a transformers folder, but not of a GPT-2 model (model_type in its config.json)")
    ckpt = load_checkpoint(os.path.join(source, 'ckpt.pt'))
    return model_from_checkpoint(ckpt, **overrides), ckpt['meta']


# ---------------------------------------------------------------------------------------------- dtype and MFU


def resolve_dtype(dtype, device):
    """'auto': bfloat16 on a GPU that computes it natively (compute capability 8.0 and up), float16 with a grad
    scaler on older GPUs (torch.cuda.is_bf16_supported also counts the slow emulated bf16 of a V100 or T4), float32
    on CPU."""
    if dtype != 'auto':
        return dtype
    if not device.startswith('cuda'):
        return 'float32'
    return 'bfloat16' if torch.cuda.get_device_capability(torch.device(device))[0] >= 8 else 'float16'


# Dense peak FLOP/s (without 2:4 sparsity, half the data sheets' starred figures) of NVIDIA's data sheets:
# bf16/fp16 tensor cores, and TF32 for float32 (train.py and bench.py turn TF32 on). Matched in order against
# torch.cuda.get_device_name(), e.g. 'NVIDIA H100 80GB HBM3', 'NVIDIA H100 NVL', 'NVIDIA H200 NVL': the PCIe and
# NVL cards come before the SXM parts whose names they contain.
PEAK_FLOPS = {
    'H200 NVL':  {'bfloat16': 835e12, 'float16': 835e12, 'float32': 418e12},  # H200 NVL: 1,671 / 835 sparse
    'H200':      {'bfloat16': 989e12, 'float16': 989e12, 'float32': 494e12},  # H200 SXM: 1,979 / 989 sparse
    'H100 NVL':  {'bfloat16': 835e12, 'float16': 835e12, 'float32': 418e12},  # H100 NVL: 1,671 / 835 sparse
    'H100 PCIe': {'bfloat16': 756e12, 'float16': 756e12, 'float32': 378e12},  # H100 PCIe: 1,513 / 756 sparse
    'H100':      {'bfloat16': 989e12, 'float16': 989e12, 'float32': 494e12},  # H100 SXM: 1,979 / 989 sparse
    'A100':      {'bfloat16': 312e12, 'float16': 312e12, 'float32': 156e12},  # A100: 312 / 156 dense
}


def peak_flops(device, dtype):
    """The device's peak FLOP/s for dtype ('bfloat16', 'float16', 'float32'), or None when unknown (CPU)."""
    if not str(device).startswith('cuda') or not torch.cuda.is_available():
        return None
    return peak_flops_of(torch.cuda.get_device_name(torch.device(device)), dtype)


def peak_flops_of(device_name, dtype):
    """PEAK_FLOPS for a GPU's name as torch.cuda.get_device_name() gives it, or None for one not in the table."""
    for key, peaks in PEAK_FLOPS.items():
        if key in device_name:
            return peaks.get(dtype)
    return None
