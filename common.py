"""
What the scripts share: one-line errors, the `--key=value` configurator, tokenizers, atomic checkpoint files,
reading run folders (and where their heads sit: occupancy_report), and the accelerator peak-FLOPs table for MFU.
"""

import ast
import difflib
import json
import os
import re
import sys
from contextlib import contextmanager, suppress
from typing import Callable, NamedTuple

import torch

from model import GPT, OPERATOR_KEYS, GPTConfig, gamma_delta, in_corridor


REPO = os.path.dirname(os.path.abspath(__file__))  # the checkout: configs/, train.py, prepare.py sit here


def transformers_side():
    """lab/hf.py, the module for pretrained transformers models, imported only when one is asked for: where a
    pretrained source reaches into the lab (the other lazy import is train.walk_geometry's, for walk_interval).
    lab/hf.py imports this module, and through it transformers, which takes seconds."""
    from lab import hf
    return hf


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
        if arg in ('-h', '--help'):  # the script's own docstring, then every key with its default
            print((sys.modules['__main__'].__doc__ or '').strip() + '\n\nkeys (config files or --key=value), with '
                  'their defaults:\n' + '\n'.join(f'  {key}={value!r}' for key, value in defaults.items()))
            sys.exit(0)
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
    (lab/walk.py samples sequences with it; lab/hf.py builds one for each Hugging Face tokenizer)."""
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
    if meta['tokenizer'] == 'hf':  # a pretrained model's own (prepare.py --tokenizer=SOURCE)
        return transformers_side().hf_codec(meta['tokenizer_source'])
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


# ---------------------------------------------------------------------------------------------- checkpoints

class WriteFailed(UserError):
    """A file could not be written: no space, permission lost, an I/O error. What was at the path is untouched and
    no temporary file is left. `path` and `reason` let a caller say more (train.py names the intact checkpoint)."""

    def __init__(self, path, reason):
        self.path, self.reason = path, reason
        super().__init__(f"could not write {path} ({reason}); what was there is untouched, and no partial file is left")


def storage_error(e):
    """The OSError behind an exception, or None. torch's serializer reports a full disk as a RuntimeError
    ('unexpected pos'), with the file's OSError as its context."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def describe_os_error(e):
    return f"{e.strerror or type(e).__name__} [errno {e.errno}]" if e.errno else str(e) or type(e).__name__


@contextmanager
def atomic_write(path, mode='w', durable=False, **open_kwargs):
    """A file object for `path` that appears complete or not at all: written as path.tmp, then renamed over path.
    durable=True also fsyncs the file and the rename (a power cut keeps the old or the new file, never a torn one).
    Any failure removes path.tmp; a failure of the storage (an OSError, also inside torch's serializer) becomes a
    WriteFailed, one line for the user."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, mode, **open_kwargs) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_folder(os.path.dirname(os.path.abspath(path)))
    except BaseException as e:
        with suppress(OSError):
            os.remove(tmp)
        cause = storage_error(e)
        if cause is None or isinstance(e, WriteFailed):
            raise
        raise WriteFailed(path, describe_os_error(cause)) from None


def append_line(path, line):
    """Append one line (a log entry) whole or not at all: a failed write is cut back off, so a full disk never leaves
    a torn line for the next append to run into. A failure is a WriteFailed."""
    data = (line + '\n').encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            with suppress(OSError):
                os.ftruncate(fd, size)
            raise
        finally:
            os.close(fd)
    except OSError as e:
        raise WriteFailed(path, describe_os_error(e)) from None


def fsync_folder(folder):
    """Make a rename in folder durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(obj, path):
    """Write atomically: a crash at any moment leaves either the old file or the new one, never a torn one; a
    failed write (a full disk) leaves the old one and no ckpt.pt.tmp, and raises WriteFailed."""
    with atomic_write(path, 'wb', durable=True) as f:
        torch.save(obj, f)


def checkpoint_progress(path):
    """(iteration, config) of a checkpoint file, or (None, None) when there is none or it is unreadable.
    Memory-mapped: the weights are not read."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
        return int(ckpt['iter_num']), dict(ckpt.get('config', {}))
    except Exception:
        return None, None


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


def model_from_checkpoint(ckpt, **overrides):
    """The model a checkpoint holds (weights loaded, train mode): our GPT, or a pretrained model rebuilt from its
    source (lab.hf.PretrainedLM, or GPT-2). overrides: GPTConfig keys that carry no weights (dropout,
    operator_lr_mult). A checkpoint of weights='operator' (train.py --train_only=operator) holds only the operator's
    scalars; the frozen weights come from the source again."""
    args = {**ckpt['model_args'], **overrides}
    source, weights = ckpt.get('source'), ckpt.get('weights', 'all')
    operator = {key: args[key] for key in OPERATOR_KEYS}
    if source is not None and not is_gpt2(source):
        model, _ = transformers_side().load_pretrained(source, **operator)
    elif weights == 'operator':
        model = GPT.from_pretrained(source, dropout=args['dropout'], **operator)
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
    """A run folder: its name, config, log entries, final (γ, δ), the series (iter, γ, δ) at every evaluation, the
    model's parameter count (GPT.get_num_params), the source of a pretrained model, and the wall seconds it trained.

    γ and δ come from log.jsonl, which holds every head's at every evaluation: no model is rebuilt to read scalars.
    The checkpoint gives the config and progress (memory-mapped: its weights are not read), and is rebuilt into a
    model only for what the log lacks: a run stopped after its last evaluation, and a pretrained model's size."""
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
                params=counted.get_num_params(), source=ckpt.get('source'), seconds=ckpt.get('seconds'),
                non_embedding=counted.non_embedding_params() if hasattr(counted, 'non_embedding_params') else None)


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
# lab/hf.py's packaged models (PACKAGED_GGUF and MiniLM; a test holds the two lists together): not GPT-2s
HF_ONLY_NAMES = ('all-MiniLM-L6-v2', 'smollm2-135m', 'gemma3-270m', 'qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b')


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
    """(model, meta) from a run folder (its ckpt.pt), OpenAI's GPT-2 (a name or a local transformers folder) as our
    GPT, or another pretrained causal LM (lab.hf.PretrainedLM: a packaged model, a .gguf file, a transformers folder
    or hub name); meta names the tokenizer as a dataset's meta.json does. overrides: GPTConfig keys that carry no
    weights (dropout and, for a pretrained model, the operator keys)."""
    if is_gpt2(source):
        try:
            return GPT.from_pretrained(source, **overrides), dict(tokenizer='gpt2', vocab_size=50257)
        except (RuntimeError, ValueError) as e:
            raise UserError(str(e)) from None
    hub_name = re.fullmatch(r'[\w.-]+/[\w.-]+', source) and not os.path.exists(source)
    pretrained = source.endswith('.gguf') or source in HF_ONLY_NAMES or hub_name or \
        os.path.isfile(os.path.join(source, 'config.json')) and not os.path.isfile(os.path.join(source, 'ckpt.pt'))
    if pretrained:  # a transformers causal LM (lab/hf.py); the keys that carry no weights are the operator's
        return transformers_side().load_pretrained(source, **{k: v for k, v in overrides.items() if k != 'dropout'})
    if not os.path.isdir(source):
        raise UserError(f"no run folder {source!r} (a folder train.py wrote, a GPT-2 name: {', '.join(GPT2_NAMES)}, "
                        f"or a pretrained causal LM: {', '.join(HF_ONLY_NAMES[1:])}, a .gguf file, a transformers folder)")
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


# --sdpa_backend: which of F.scaled_dot_product_attention's kernels may run ('auto': PyTorch's own priority). On
# Hopper its default picks FlashAttention; cuDNN's is reported faster for training shapes there, so it is a choice.
SDPA_BACKENDS = ('auto', 'flash', 'efficient', 'cudnn', 'math')


def sdpa_backend(name, device, dtype, head_size):
    """A context manager that lets only this SDPA backend run ('auto': every one, nullcontext), after trying it here
    on a small causal input of the model's dtype and head size, forward and backward: a backend this device (or
    dtype, or head size) has no kernel for is one line now, not a crash at the first step."""
    import contextlib
    import warnings
    if name not in SDPA_BACKENDS:
        raise UserError(f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {name!r}")
    if name == 'auto':
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {'flash': SDPBackend.FLASH_ATTENTION, 'efficient': SDPBackend.EFFICIENT_ATTENTION,
               'cudnn': SDPBackend.CUDNN_ATTENTION, 'math': SDPBackend.MATH}[name]
    q = torch.randn(1, 2, 16, head_size, device=device, dtype=getattr(torch, dtype), requires_grad=True)
    try:
        with sdpa_kernel(backend), warnings.catch_warnings():
            warnings.simplefilter('ignore')  # PyTorch warns once per reason a kernel was refused; the error says it
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    except RuntimeError as e:
        reason = (str(e).strip().splitlines() or ['no kernel'])[0].split('. ')[0].rstrip('.')
        raise UserError(f"sdpa_backend={name!r} does not run on {device} in {dtype} with head size {head_size} "
                        f"({reason}): use --sdpa_backend=auto, or one of {', '.join(n for n in SDPA_BACKENDS[1:] if n != name)}") from None
    return sdpa_kernel(backend)


# Dense peak FLOP/s (without 2:4 sparsity, half the data sheets' starred figures) of NVIDIA's data sheets:
# bf16/fp16 tensor cores, and TF32 for float32 (train.py and lab/bench.py turn TF32 on). Matched in order against
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
