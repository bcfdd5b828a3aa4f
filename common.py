"""
What the scripts share: one-line errors, the `--key=value` configurator (and the checks that turn a run's keys
into a GPTConfig), GPT-2's tokenizer, files written whole or not at all, dtypes, SDPA kernels and MFU.
"""

import ast
import difflib
import json
import os
import shlex
import sys
from contextlib import contextmanager, nullcontext, suppress

import torch

from model import OPERATOR_DEFAULTS, OPERATOR_KEYS, OPERATORS, GPTConfig


REPO = os.path.dirname(os.path.abspath(__file__))  # the checkout: configs/, train.py, prepare.py sit here


class UserError(Exception):
    """Bad input: printed as one line (no traceback), exit status 2."""


def main_guard(main):
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def _checked(key, value, default, optional):
    """value as the type of its default (an int where a float is; a bool is no number), or a UserError."""
    if value is None and key in optional or type(value) is type(default) and not isinstance(default, float):
        return value
    if isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise UserError(f"{key} must be {type(default).__name__} like its default {default!r}, got {value!r}")


class Config(dict):
    """A parsed config: every key of its defaults. `given`: the keys a config file or the command line set, whatever
    their value: a key set to its default is set, and is honoured or refused, never replaced by a checkpoint's value."""
    given = frozenset()


def parse_config(defaults, argv, optional=(), hints=None):
    """nanoGPT's convention: config files (`key = value` lines) in order, then `--key=value` overrides; a new Config of
    defaults' keys, an unknown key or a wrong type a UserError. `optional` keys may be None; `hints`: key -> why not."""
    config, given = Config(defaults), set()

    def assign(key, value, where):
        if key in (hints or {}):
            raise UserError(f"{hints[key]} ({where})")
        if key not in defaults:
            match = difflib.get_close_matches(key, list(defaults), n=1)
            raise UserError(f"unknown config key {key!r} in {where}"
                            + (f" (did you mean {match[0]!r}?)" if match else ''))
        config[key] = _checked(key, value, defaults[key], optional)
        given.add(key)

    for arg in argv:
        if arg in ('-h', '--help'):  # the script's own docstring, then every key: its default and meaning
            from lab.key_help import script_help
            print(script_help(defaults))
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
            if os.path.isdir(arg) and {'init_from', 'out_dir'} <= defaults.keys():  # a run folder where a file goes
                raise UserError(f"{arg!r} is a folder, not a config file (a run folder is a key's value: "
                                f"--init_from=resume --out_dir={shlex.quote(arg)} resumes its run, "
                                f"--init_from={shlex.quote(arg)} starts from its weights)")
            if not os.path.isfile(arg):
                raise UserError(f"config file {arg!r} {'is a folder' if os.path.isdir(arg) else 'not found'}")
            namespace = {}
            try:  # utf-8-sig: a BOM, which Python itself accepts in a source file
                with open(arg, encoding='utf-8-sig') as f:
                    exec(compile(f.read(), arg, 'exec'), namespace)
            except UnicodeDecodeError:
                raise UserError(f"config file {arg} is not UTF-8 text: save it as UTF-8") from None
            except (Exception, SystemExit, KeyboardInterrupt) as e:  # a config that exits ends no run silently
                raise UserError(f"config file {arg} failed: {type(e).__name__}: {e}") from None
            for key, value in namespace.items():
                if not key.startswith('_') and not callable(value) and type(value).__name__ != 'module':
                    assign(key, value, arg)
    config.given = frozenset(given)
    return config


def saved_config(defaults, saved, where):
    """(config, ignored keys): a config an earlier run saved (a checkpoint's) over defaults, each value checked as
    parse_config checks one; its keys defaults lack (another version's) left out, not carried into a new config.json."""
    config, ignored = dict(defaults), sorted(set(saved) - set(defaults))
    for key in defaults.keys() & saved.keys():
        try:
            config[key] = _checked(key, saved[key], defaults[key], ())
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
    return config, ignored


def model_config(config, saved=False):
    """The GPTConfig of a run config's keys; one no model can have is a UserError now, not mid-run, and so is a key the
    chosen form does not read set away from its default, unless saved (a checkpoint is read as it trained)."""
    c = GPTConfig(**{k: v for k, v in config.items() if k in GPTConfig.__dataclass_fields__})
    for key in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd'):
        if getattr(c, key) <= 0:
            raise UserError(f"{key} must be positive, got {getattr(c, key)}")
    if c.operator not in OPERATORS:
        raise UserError(f"unknown operator {c.operator!r} (choose from {', '.join(OPERATORS)})")
    form = OPERATORS[c.operator]
    ignored = [k for k in OPERATOR_KEYS[1:] if k not in form.keys and getattr(c, k) != OPERATOR_DEFAULTS[k]]
    # the scalars are float32: a value past its range is inf there, and so is every loss after it
    non_finite = [k for k, v in vars(c).items() if isinstance(v, float) and not abs(v) <= torch.finfo().max]
    for wrong, message in (
            (non_finite, f"{', '.join(non_finite)} must be finite in float32, got "
                         f"{', '.join(repr(getattr(c, k)) for k in non_finite)}"),
            (c.n_embd % c.n_head, f"n_embd={c.n_embd} must be divisible by n_head={c.n_head}"),
            (not 0 <= c.dropout < 1, f"dropout must be in [0, 1), got {c.dropout}"),
            (ignored and not saved, f"operator={c.operator!r} does not read {', '.join(ignored)} (it reads "
             f"{', '.join(form.keys) or 'no other key'}); " + '; '.join(
                 f"{k} is read by {', '.join(n for n, f in OPERATORS.items() if k in f.keys)}" for k in ignored)),
            (c.init_spread < 0, f"init_spread must be >= 0, got {c.init_spread}"),
            (c.operator_lr_mult < 0, f"operator_lr_mult must be >= 0, got {c.operator_lr_mult}"),
            (c.operator == 'laplacian' and not 1 <= c.laplacian_heads <= c.n_head,
             f"laplacian_heads must be in [1, n_head={c.n_head}], got {c.laplacian_heads}"),
            (c.gamma_nonneg and c.gamma_init - c.init_spread < 0,
             f"gamma_nonneg needs gamma_init - init_spread >= 0, got {c.gamma_init} - {c.init_spread}")):
        if wrong:
            raise UserError(message)
    return c


GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')  # OpenAI's checkpoints (lab/gpt2.py reads them)


def is_gpt2(source):
    """A GPT-2 name, or a local folder saved by `transformers` whose config.json says model_type 'gpt2'."""
    try:
        with open(os.path.join(source, 'config.json')) as f:
            return source in GPT2_NAMES or json.load(f).get('model_type') == 'gpt2'
    except (OSError, ValueError, AttributeError, RecursionError):  # not GPT-2's: what reads it next says what's wrong
        return source in GPT2_NAMES


def gpt2_encoding():
    import tiktoken
    try:
        return tiktoken.get_encoding('gpt2')
    except Exception as e:
        raise UserError(f"cannot load the GPT-2 BPE through tiktoken ({type(e).__name__}): it downloads its files "
                        f"once, so without network set TIKTOKEN_CACHE_DIR to a folder that holds them") from None


class WriteFailed(UserError):
    def __init__(self, path, reason):
        self.path, self.reason = path, reason
        super().__init__(f"could not write {path} ({reason}); what was there is untouched, and no partial file is left")


def storage_error(e):
    """The OSError behind an exception, or None (torch's serializer reports a full disk as a RuntimeError)."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def describe_os_error(e):
    return f"{e.strerror or type(e).__name__} [errno {e.errno}]" if e.errno else str(e) or type(e).__name__


@contextmanager
def atomic_write(path, mode='w', durable=False, **open_kwargs):
    """A file for `path` that appears whole or not at all: path.tmp renamed over it (durable: fsynced, the rename too,
    so a power cut keeps the old or the new). A failure removes path.tmp; the storage's is a WriteFailed."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, mode, **open_kwargs) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:  # the rename itself
            fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
            os.fsync(fd), os.close(fd)
    except BaseException as e:
        with suppress(OSError):
            os.remove(tmp)
        cause = storage_error(e)
        if cause is None or isinstance(e, WriteFailed):
            raise
        raise WriteFailed(path, describe_os_error(cause)) from None


def append_line(path, line):
    """Append one line (a log entry) whole or not at all: a failed write is cut back off (a WriteFailed)."""
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


def save_figure(fig, path, rect=(0, 0, 1, 1)):
    """A figure written atomically (its format from the name), closed; rect: tight_layout's (room for a legend)."""
    import matplotlib.pyplot as plt
    fig.tight_layout(rect=rect)
    try:
        with atomic_write(path, 'wb') as f:  # the format from the real name, not from path.tmp
            fig.savefig(f, dpi=110, format=os.path.splitext(path)[1][1:] or 'png')
    finally:
        plt.close(fig)
    return path


def save_checkpoint(obj, path):  # a crash or a full disk leaves the old file or the new one, never a torn one
    with atomic_write(path, 'wb', durable=True) as f:
        torch.save(obj, f)


# ------------------------------------------------------------------------------------------------- the device
# Every choice that depends on the device ('cpu', 'cuda', 'cuda:N', 'mps'); pinned memory (sources.Data.batch)
# and the fused optimizer (model.configure_optimizers) are CUDA's alone.

def check_device(device):
    kind = device.split(':')[0]
    if kind == 'cuda' and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but CUDA is not available here (use --device=cpu)")
    if kind == 'mps' and not torch.backends.mps.is_available():
        raise UserError(f"device={device!r} but MPS is not available here (it needs Apple silicon and a PyTorch "
                        f"built with MPS): use --device=cpu")


def synchronize(device):
    """Wait for the device's queued work (timing): CUDA and MPS run ahead of the host, the CPU does not."""
    if device.startswith('cuda'):
        torch.cuda.synchronize(device)
    elif device.startswith('mps'):
        torch.mps.synchronize()


def device_rng_state(device):
    """The device's own generator state (its dropout masks), or None on the CPU (torch.get_rng_state holds that)."""
    kind = device.split(':')[0]
    return torch.cuda.get_rng_state(device) if kind == 'cuda' else torch.mps.get_rng_state() if kind == 'mps' else None


def set_device_rng_state(device, state):
    if state is not None and device.startswith('cuda'):
        torch.cuda.set_rng_state(state, device)
    elif state is not None and device.startswith('mps'):
        torch.mps.set_rng_state(state)


@contextmanager
def rng_untouched(device):
    """The host's and the device's generators as they were before the block, whatever it drew."""
    host, own = torch.get_rng_state(), device_rng_state(device)
    try:
        yield
    finally:
        torch.set_rng_state(host)
        set_device_rng_state(device, own)


DTYPES = ('auto', 'float32', 'bfloat16', 'float16')  # --dtype's choices, train.py's and sample.py's


def resolve_dtype(dtype, device, n_embd=None):
    """The autocast dtype --dtype names on device. 'auto': bf16 where the GPU has it natively (capability ≥ 8), else
    float16 (a grad scaler); on a CPU, auto_cpu_dtype's choice for a model n_embd wide; MPS float32."""
    if dtype != 'auto':
        return dtype
    if device.startswith('cuda'):
        return 'bfloat16' if torch.cuda.get_device_capability(torch.device(device))[0] >= 8 else 'float16'
    return auto_cpu_dtype(n_embd)[0] if device == 'cpu' else 'float32'


# A CPU computes bfloat16 matmuls natively with AVX512-BF16 or AMX; without them PyTorch emulates bf16, slower than
# float32. With them, bf16 pays once the matmuls are wide enough to outweigh the casts around them: lab/bench.py on
# a Xeon with AMX trained n_embd 256 (3.3M parameters, 8 × 256 tokens) 2.2× faster in bf16, and the quick start's
# n_embd 128 (0.8M, 12 × 64) at 0.77× of float32 (docs/speed.md).
CPU_BF16_MIN_WIDTH = 256


def auto_cpu_dtype(n_embd):
    """dtype='auto' on a CPU, for a model n_embd wide (None: unknown): (dtype, why, as a clause for a run's header)."""
    if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return 'float32', 'this CPU has no bfloat16 units, AVX512-BF16 or AMX'
    if n_embd is None or n_embd < CPU_BF16_MIN_WIDTH:
        return 'float32', (f"n_embd {n_embd} is under {CPU_BF16_MIN_WIDTH}, too narrow for this CPU's bfloat16 "
                           "units to pay")
    return 'bfloat16', f"this CPU has bfloat16 units and n_embd {n_embd} is at least {CPU_BF16_MIN_WIDTH}"


# --sdpa_backend: which of F.scaled_dot_product_attention's kernels may run ('auto': PyTorch's own priority). On
# Hopper its default picks FlashAttention; cuDNN's is reported faster for training shapes there, so it is a choice.
SDPA_BACKENDS = ('auto', 'flash', 'efficient', 'cudnn', 'math')


def sdpa_backend(name, model, block_size, device, dtype, autocast):
    """A context that lets only this SDPA backend run ('auto': any), once it ran the model's own forward and backward
    (lab/sdpa.py) with the run's random numbers untouched: a backend with no kernel for them is one line, not a crash."""
    if name not in SDPA_BACKENDS:
        raise UserError(f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {name!r}")
    if name == 'auto':
        return nullcontext()
    from lab import sdpa
    with rng_untouched(device):
        refused = sdpa.refusal(name, model, block_size, device, dtype, autocast)
    if refused:
        raise UserError(refused)
    return sdpa.sdpa_kernel(sdpa.KERNELS[name])


# Dense peak FLOP/s of NVIDIA's data sheets (half their starred 2:4-sparse figures): bf16/fp16 tensor cores, TF32 for
# float32. Matched in order against torch.cuda.get_device_name(): the PCIe / NVL cards before the SXM names they contain.
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
    if str(device).startswith('cuda') and torch.cuda.is_available():
        return peak_flops_of(torch.cuda.get_device_name(torch.device(device)), dtype)


def peak_flops_of(device_name, dtype):
    """PEAK_FLOPS for a GPU's name as torch.cuda.get_device_name() gives it, or None for one not in the table."""
    return next((peaks.get(dtype) for key, peaks in PEAK_FLOPS.items() if key in device_name), None)


def flops_per_token(model, seq_len, weights_train=True):
    """Training FLOPs per token, PaLM appendix B: 6N + 12·L·H·d_head·T, the 6N being 2N forward, 2N for the
    activations' gradients and 2N for the weights'. Frozen weights (train_only='operator') get none: 4N."""
    attention = 12 * model.config.n_layer * model.config.n_head * model.head_size * seq_len
    return (6 if weights_train else 4) * model.get_num_params() + attention
