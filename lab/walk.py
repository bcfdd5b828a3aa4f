"""
The connection-walk diagnostics' command line: any walk source (a run folder, GPT-2, a Hugging Face model) over a
text → per-layer tables (the paper's Table 1 / Table 2 layouts), JSON and plots, beside a random-init twin and the
closed-form null. The definitions and the exact fast computation are in lab/connection.py.

    python -m lab.walk gpt2 out-owt-corridor path/to/llama-or-bert --text wiki.test.raw --context_sweep
"""

import argparse
import json
import math
import os
import random
import re
import statistics
import sys

import torch
from tqdm import tqdm

from common import GPT2_NAMES, UserError, atomic_write, main_guard
from model import GPT
from sources import load_model, tokenizer_from_meta

from lab import connection, gguf_files, hf_sources, hf_walk, pretrained
from lab.connection import GPTWalk, TextCodec, connection_diagnostics, depth_regimes
from lab.figures import plt, save


# ---------------------------------------------------------------------------------------------- text and sampling

def read_text(path):
    """The text to walk over: a file, or by default the WikiText-2 test split through `datasets`."""
    if path:
        if not os.path.isfile(path):
            raise UserError(f"--text {path!r} not found")
        try:  # utf-8-sig: a BOM is no character of the text
            with open(path, encoding='utf-8-sig') as f:
                return f.read()
        except UnicodeDecodeError as e:
            raise UserError(f"--text {path} is not UTF-8 text (byte {e.start}): convert it, e.g. iconv -t UTF-8") \
                from None
    try:
        from datasets import load_dataset
        return ''.join(load_dataset('wikitext', 'wikitext-2-raw-v1', split='test')['text'])
    except Exception as e:
        raise UserError(f"cannot load WikiText-2 through datasets ({type(e).__name__}); pass a text file with "
                        f"--text (e.g. wiki.test.raw)") from None


def text_units(text, unit):
    """The text's lines (WikiText's rows: paragraphs and headings) or documents (articles, split before WikiText's
    top-level ` = Title = ` headings; a text without them is one document), blank ones left out."""
    parts = text.split('\n') if unit == 'lines' else re.split(r'\n(?= = [^=].* = \n)', text)
    return [p for p in parts if p.strip()]


SAMPLINGS = {
    'lines': "lines with at least T tokens, drawn at random (seeded), each truncated to its first T: the paper's "
             "'randomly sample 1,024 sequences, truncated to 64 tokens' (WikiText-2's rows are its lines)",
    'documents': "T-token chunks of the documents (articles), drawn at random (seeded); no chunk crosses a document "
                 "boundary: long contexts, where no line is long enough",
    'chunks': "the first N consecutive T-token chunks of the whole text, no seed",
}


def sample_sequences(text, codec, n_seqs, seq_len, sampling, seed):
    """[N, T] token ids: up to n_seqs sequences of seq_len tokens, special tokens included (see SAMPLINGS)."""
    m = seq_len - len(codec.prefix) - len(codec.suffix)  # content tokens per sequence
    if m < 1:
        raise UserError(f"--seq_len {seq_len} leaves no room beside the tokenizer's special tokens")
    if sampling == 'chunks':
        ids = codec.encode(text)
        candidates = [ids[k:k + m] for k in range(0, len(ids) - m + 1, m)][:n_seqs]
    else:
        units = [codec.encode(u) for u in text_units(text, sampling)]
        if sampling == 'lines':
            candidates = [u[:m] for u in units if len(u) >= m]
        else:
            candidates = [u[k:k + m] for u in units for k in range(0, len(u) - m + 1, m)]
        picks = random.Random(seed).sample(range(len(candidates)), min(n_seqs, len(candidates)))
        candidates = [candidates[k] for k in picks]
    if not candidates:
        unit = dict(lines='no line of the text has', documents='no document of the text has',
                    chunks='the text has fewer than')[sampling]
        raise UserError(f"{unit} {m} tokens, as one sequence of {seq_len} needs; use a longer text, a shorter "
                        f"--seq_len{'' if sampling == 'documents' else ', or --sampling documents'}")
    return torch.tensor([codec.wrap(c) for c in candidates], dtype=torch.long)


# ---------------------------------------------------------------------------------------------- models

def source_kind(source):
    """'run', 'gpt2', or a transformers model_type; a source that is none of them is a UserError."""
    if os.path.isfile(os.path.join(source, 'ckpt.pt')):
        return 'run'
    if source in GPT2_NAMES:
        return 'gpt2'
    return hf_sources.model_type(source)


def load_source(source, kind, device):
    """(walk source, TextCodec, longest sequence it takes) for a run folder, a GPT-2 name or folder (read as our GPT),
    or a Llama / Qwen2 / Qwen3 / Gemma 3 / BERT folder, .gguf file or packaged model (lab/hf_walk.py)."""
    if kind in ('run', 'gpt2'):
        model, meta = load_model(source)
        if isinstance(model, pretrained.PretrainedLM):  # a run that fine-tuned a pretrained transformers model
            return hf_walk.run_walk(model, device)
        return GPTWalk(model.to(device)), TextCodec(tokenizer_from_meta(meta)[0]), model.config.block_size
    return hf_walk.load(source, device)


def random_twin(walker, seed):
    """The same architecture at its random initialisation (its own init scheme), on the same device."""
    if isinstance(walker, GPTWalk):
        torch.manual_seed(seed)
        device = next(walker.module.parameters()).device
        return GPTWalk(GPT(walker.module.config).to(device))
    return hf_walk.random_twin(walker, seed)


def architecture(walker):
    layers = walker.layers()
    H, d, d_h = layers[0].W_V.shape
    return dict(n_layer=len(layers), d=d, n_head=H, n_kv_head=int(layers[0].kv_head.max()) + 1, d_head=d_h,
                causal=walker.causal, specials=list(walker.specials))


def parts(walker):
    """The walks of a model: the attention part, and for the operator family also the full operator."""
    operator = walker.module.config.operator != 'attention' if isinstance(walker, GPTWalk) else \
        walker.has_operator
    return ['attention', 'operator'] if operator else ['attention']


def context_lengths(max_len, seq_len):
    return [n for n in (16, 32, 64, 128, 256, 512, 1024) if n <= max_len] or [seq_len]


SWEPT = ('drift', 'a_eff_fro', 'delta_orth', 'delta_orth_trace', 'delta_orth_null')


def walk_model(walker, idx, sweep_idx, part, args, desc):
    """One model's (or its twin's) numbers for one part: the per-layer lists, by depth regime, and the sweep."""
    r = connection_diagnostics(walker, idx, drop_sink=args.drop_sink, full_operator=part == 'operator',
                               progress=True, gram_edges=args.gram_edges, seed=args.seed)
    numbers = {k: v for k, v in r.items() if k not in ('a_eff', 'gram')}
    numbers['by_depth'] = {k: depth_regimes(v) for k, v in numbers.items()
                           if isinstance(v, list) and k != 'drift' and None not in v}
    if sweep_idx:
        numbers['context_sweep'] = {}
        for length, seqs in tqdm(sweep_idx.items(), desc=f'{desc}: context sweep', unit='length'):
            s = connection_diagnostics(walker, seqs, drop_sink=args.drop_sink, full_operator=part == 'operator')
            numbers['context_sweep'][length] = dict(sequences=len(seqs), **{k: s[k] for k in SWEPT},
                                                    sem={k: s['sem'][k] for k in s['sem']})
    return r, numbers


# ---------------------------------------------------------------------------------------------- tables

def ratios(numbers, d):
    """Derived per-layer series: the registry's 'shown' diagnostics (the Gram dominance ratios, both readings), and
    the closed-form nulls on the paper's scale and for the per-edge ratio."""
    return dict(**connection.shown(numbers), null_trace=[x / math.sqrt(d) for x in numbers['delta_orth_null']],
                null_gram_ratio=[math.sqrt(math.pi * d / 2) / x for x in numbers['delta_orth_null']])


def labelled(saved):
    """(label, d, numbers, twin numbers or None) for every model and part."""
    for name, entry in saved.items():
        if name == 'settings':
            continue
        for part in ('attention', 'operator'):
            if part in entry:
                label = name if 'operator' not in entry else \
                    f"{name} ({'attention part' if part == 'attention' else 'full operator'})"
                yield label, entry['d'], entry[part], entry.get('random_init', {}).get(part)


def fmt(x, spec='.3f'):
    return '–' if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table_delta_orth(saved):
    rows = ["| model | d | initial | middle | final |", "|---|---|---|---|---|"]

    def row(label, d, trace, ours):
        cells = [f"{fmt(trace[k])} ({fmt(ours[k], '.2f')})" for k in ('initial', 'middle', 'final')]
        rows.append(f"| {label} | {d} | " + ' | '.join(cells) + ' |')
    for label, d, n, twin in labelled(saved):
        row(label, d, n['by_depth']['delta_orth_trace'], n['by_depth']['delta_orth'])
        if twin:
            row(f"↳ {label}, random init", d, twin['by_depth']['delta_orth_trace'], twin['by_depth']['delta_orth'])
        null = n['by_depth']['delta_orth_null']
        row(f"↳ random W_V, W_O on {label}'s walk (closed form)", d,
            {k: None if v is None else v / math.sqrt(d) for k, v in null.items()}, null)
    return rows


def table_gram(saved):
    rows = ["| model | layers | Ḡ diag | Ḡ off-diag | Ḡ ratio | per-edge diag | per-edge off-diag | per-edge ratio "
            "| closed form ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for label, d, n, twin in labelled(saved):
        for tag, numbers in ((label, n), (f"↳ {label}, random init", twin)):
            if numbers is None:
                continue
            r = {k: depth_regimes(v) for k, v in ratios(numbers, d).items()}
            by = {k: depth_regimes(numbers[k]) if k in numbers else dict.fromkeys(('initial', 'middle', 'final'))
                  for k in ('gram_diag_mean', 'gram_offdiag_mean', 'gram_edge_diag_mean', 'gram_edge_offdiag_mean')}
            for regime in ('initial', 'middle', 'final'):
                rows.append(f"| {tag} | {regime} | {fmt(by['gram_diag_mean'][regime], '.3g')} "
                            f"| {fmt(by['gram_offdiag_mean'][regime], '.3g')} | {fmt(r['gram_ratio'][regime], '.1f')} "
                            f"| {fmt(by['gram_edge_diag_mean'][regime], '.3g')} "
                            f"| {fmt(by['gram_edge_offdiag_mean'][regime], '.3g')} "
                            f"| {fmt(r.get('gram_edge_ratio', {}).get(regime), '.1f')} "
                            f"| {fmt(r['null_gram_ratio'][regime], '.1f')} |")
    return rows


def table_layers(saved):
    """Every layer of every model (and part): a column per diagnostic of the registry that has one."""
    columns = [e for e in connection.DIAGNOSTICS if e.column]
    rows = ["| model | layer | " + ' | '.join(e.column[0] for e in columns) + ' |', '|---' * (2 + len(columns)) + '|']
    for label, d, n, twin in labelled(saved):
        for tag, r in ((label, n), (f"{label}, random init", twin)):
            if r is None:
                continue
            series = {**r, **ratios(r, d)}
            for l in range(max(len(series[e.name]) for e in columns if e.name in series)):
                cells = [fmt(series[e.name][l], e.column[1]) if l < len(series.get(e.name, ())) else '–'
                         for e in columns]
                rows.append(f"| {tag} | {l} | " + ' | '.join(cells) + ' |')
    return rows


def table_sweep(saved):
    rows = ["| model | T | sequences | drift | ‖A_eff‖_F | δ_orth/√d |", "|---|---|---|---|---|---|"]
    for label, _, n, twin in labelled(saved):
        for tag, r in ((label, n), (f"{label}, random init", twin)):
            for length, s in ((r or {}).get('context_sweep') or {}).items():
                cells = []
                for key, spec in (('drift', '.4f'), ('a_eff_fro', '.3f'), ('delta_orth_trace', '.4f')):
                    mean = statistics.fmean(s[key]) if s[key] else float('nan')
                    cells.append(f"{fmt(mean, spec)} ± {fmt(max(s['sem'][key], default=float('nan')), '.0e')}")
                rows.append(f"| {tag} | {length} | {s['sequences']} | " + ' | '.join(cells) + ' |')
    return rows


TABLE_NOTES = dict(
    table1="‖G − μI‖_F / tr G (= δ_orth/√d, the paper's scale); in parentheses δ_orth = ‖G − μI‖_F / ‖μI‖_F. Closed "
           "form: Gaussian W_V, W_O on the model's own head weights, √(1 + (d/d_h)·Σ_g(Σ_{h∈g} w_h²)² / (Σ_h w_h²)²) "
           "per edge.",
    table2="Mean |diagonal| and mean |off-diagonal| entry of Ḡ = mean over edges of G_ij (\"|mean G|\") and of each "
           "edge's G_ij, averaged over sampled edges (\"mean |G|\"); ratio = diagonal / off-diagonal, averaged over "
           "the regime's layers. Closed form ≈ √(πd/2) / δ_orth,null (a Gaussian transport: √(πd/2)).",
    rounding="The model with its 2-D weights rounded through a GGUF format and back (gguf.quants) minus the model, on "
             "the same sequences (paired: no sampling noise in the difference); drift: between layer ℓ and ℓ+1.",
    sweep="Mean over layers ± the largest standard error (over sequences) of one layer; every layer's numbers are in "
          "diagnostics.json and context_sweep_*.png.",
)


ROUNDED = (('delta_orth_trace', '.1e'), ('gram_ratio', '.2f'), ('gram_edge_ratio', '.2f'), ('drift', '.1e'),
           ('a_eff_fro', '.1e'))


def table_rounding(saved):
    rows = ["| model | format | layer | Δ δ_orth/√d | Δ Ḡ ratio | Δ per-edge ratio | Δ drift | Δ ‖A_eff‖_F |",
            "|---|---|---|---|---|---|---|---|"]
    for label, d, n, _ in labelled(saved):
        name, part = label.split(' (')[0], 'operator' if 'full operator' in label else 'attention'
        base = {**n, **ratios(n, d)}
        for qtype, parts in saved[name].get('gguf_rounded', {}).items():
            q = {**parts[part], **ratios(parts[part], d)}
            deltas = {k: [a - b for a, b in zip(q[k], base[k])] for k, _ in ROUNDED if k in q}
            for l in range(len(base['delta_orth'])):
                cells = [fmt(deltas[k][l], f'+{spec}') if k in deltas and l < len(deltas[k]) else '–'
                         for k, spec in ROUNDED]
                rows.append(f"| {label} | {qtype} | {l} | " + ' | '.join(cells) + ' |')
            cells = [fmt(max(map(abs, deltas[k])), spec) if deltas.get(k) else '–' for k, spec in ROUNDED]
            rows.append(f"| {label} | {qtype} | max \\|Δ\\| | " + ' | '.join(cells) + ' |')
    return rows


def write_tables(saved, path):
    s = saved['settings']
    header = (f"Text: {s['text']}; {s['sampling']} sampling (seed {s['seed']}), up to {s['n_seqs']} sequences of "
              f"{s['seq_len']} tokens per model; drop_sink: {s['drop_sink']}; per-edge Gram from {s['gram_edges']} "
              f"sampled edges per layer. Depth regimes: initial = the first 20 % of the layers, final = the last "
              f"20 %, middle = the rest. \"random init\": the same architecture at its random initialisation, on the "
              f"same sequences.")
    text = ["# Connection-walk diagnostics\n", header,
            "\n## Table 1: δ_orth by depth\n", TABLE_NOTES['table1'] + '\n', *table_delta_orth(saved),
            "\n## Table 2: Gram diagonal vs off-diagonal by depth\n", TABLE_NOTES['table2'] + '\n', *table_gram(saved),
            "\n## Per layer\n", *table_layers(saved)]
    rounded = table_rounding(saved)
    if len(rounded) > 2:
        text += ["\n## GGUF rounding\n", TABLE_NOTES['rounding'] + '\n', *rounded]
    sweep = table_sweep(saved)
    if len(sweep) > 2:
        text += ["\n## Context sweep\n", TABLE_NOTES['sweep'] + '\n', *sweep]
    with atomic_write(path) as f:
        f.write('\n'.join(text) + '\n')
    return '\n'.join(text)


# ---------------------------------------------------------------------------------------------- plots

def plot_walk_layers(saved, path):
    """Per-layer curves of every model (and part), a panel per diagnostic of the registry that has one: the model
    solid, its random-init twin dashed, the closed form dotted. A diagnostic between adjacent layers (drift) sits
    between them."""
    panels = [e for e in connection.DIAGNOSTICS if e.plot]
    nulls = dict(delta_orth_trace='null_trace', gram_edge_ratio='null_gram_ratio')  # closed forms: dotted
    between = set()  # the panels whose diagnostic is between adjacent layers
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.7), squeeze=False)
    axes = axes[0]
    for k, (label, d, n, twin) in enumerate(labelled(saved)):
        color = f'C{k}'
        for numbers, style, tag in ((n, '-', label), (twin, '--', 'random init')):
            if numbers is None:
                continue
            series = {**numbers, **ratios(numbers, d)}
            n_layer = max(len(numbers[key]) for key in connection.per_layer() if key in numbers)
            for ax, e in zip(axes, panels):
                if e.name in series:
                    values = series[e.name]
                    if len(values) < n_layer:
                        between.add(e.name)
                    x = [l + 0.5 for l in range(len(values))] if len(values) < n_layer else range(len(values))
                    ax.plot(list(x), values, style, color=color, marker='.', label=tag)
                if e.name in nulls and numbers is n:
                    ax.plot(range(len(series[nulls[e.name]])), series[nulls[e.name]], ':', color=color,
                            label='closed form, random W_V, W_O')
    for ax, e in zip(axes, panels):
        ax.set_xlabel(f'layer ({e.name}: between ℓ and ℓ+1)' if e.name in between else 'layer')
        ax.set_title(e.plot, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.suptitle('Connection-walk diagnostics by layer (solid: model, dashed: random init, dotted: closed form)',
                 fontsize=11)
    return save(fig, path)


def plot_context_sweep(label, numbers, twin, path):
    """Every layer's drift, ‖A_eff‖_F and δ_orth/√d at each context length: one curve per length; the random-init
    twin in a second row."""
    rows = [(label, numbers)] + ([('random init', twin)] if twin else [])
    panels = [('drift', 'drift'), ('a_eff_fro', '‖A_eff‖_F'), ('delta_orth_trace', 'δ_orth/√d')]
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.2 * len(panels), 3.4 * len(rows)), squeeze=False,
                             sharey='col')
    for (tag, r), axrow in zip(rows, axes):
        sweep = r['context_sweep']
        for k, (length, s) in enumerate(sweep.items()):
            color = plt.cm.viridis(k / max(1, len(sweep) - 1))
            for ax, (key, title) in zip(axrow, panels):
                x = [l + 0.5 for l in range(len(s[key]))] if key == 'drift' else list(range(len(s[key])))
                ax.plot(x, s[key], marker='.', color=color, label=f"T = {length} ({s['sequences']})")
                ax.set_title(f'{tag}: {title}', fontsize=9)
                ax.set_xlabel('layer')
        axrow[0].legend(fontsize=6)
    fig.suptitle('Per layer at each context length T (sequences in parentheses)', fontsize=11)
    return save(fig, path)


def plot_heatmap(matrix, path, title, xlabel, ylabel, first_row=0, first_column=0):
    fig, ax = plt.subplots(figsize=(5, 4.2))
    rows, columns = matrix.shape
    image = ax.imshow(matrix.numpy(), cmap='viridis', aspect='auto', extent=(
        first_column - 0.5, first_column + columns - 0.5, first_row + rows - 0.5, first_row - 0.5))
    fig.colorbar(image, ax=ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return save(fig, path)


def plot_heatmaps(walker, r, label, layer, tag, out):
    """A_eff of `layer` on the edges that count (a decoder: without the sink column; an encoder: without its special
    tokens), and Ḡ."""
    a_eff = r['a_eff'][layer]
    if walker.causal:
        matrix, rows, columns, what = a_eff[:, 1:], 0, 1, 'sink column removed'
    else:
        (s0, s1), T = walker.specials, a_eff.shape[0]
        matrix, rows, columns, what = a_eff[s0:T - s1, s0:T - s1], s0, s0, 'special tokens removed'
    plot_heatmap(matrix, os.path.join(out, f'a_eff_{tag}.png'), f'{label}\nA_eff, layer {layer}, {what}',
                 'key position j', 'query position i', rows, columns)
    plot_heatmap(r['gram'][layer], os.path.join(out, f'gram_{tag}.png'),
                 f'{label}\nedge-averaged Gram Ḡ, layer {layer}', 'feature', 'feature')


# ---------------------------------------------------------------------------------------------- command line

def run_diagnostics(args):
    out = args.out
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.sampling not in SAMPLINGS:
        raise UserError(f"--sampling {args.sampling!r}: choose from {', '.join(SAMPLINGS)}")
    if min(args.n_seqs, args.seq_len, args.sweep_seqs) < 1 or args.gram_edges < 0:
        raise UserError("--n_seqs, --seq_len and --sweep_seqs must be >= 1, --gram_edges >= 0")
    quantize = [q for q in args.quantize.split(',') if q] if args.quantize else []
    if set(quantize) - set(gguf_files.GGUF_ROUNDINGS):
        raise UserError(f"--quantize {args.quantize!r}: choose from {', '.join(gguf_files.GGUF_ROUNDINGS)}")
    kinds = {source: source_kind(source) for source in args.sources}  # a bad source fails before any slow loading
    names = [os.path.basename(os.path.normpath(source)) for source in args.sources]
    if len(set(names)) < len(names):
        raise UserError("several sources share a folder name; give them distinct names")
    text = read_text(args.text)
    saved = dict(settings=dict(n_seqs=args.n_seqs, seq_len=args.seq_len, drop_sink=args.drop_sink,
                               text=args.text or 'wikitext-2 test', sampling=args.sampling, seed=args.seed,
                               gram_edges=args.gram_edges, null_model=args.null_model, quantize=quantize,
                               context_sweep=dict(sampling='documents', sequences=args.sweep_seqs)
                               if args.context_sweep else None))
    for source, name in zip(args.sources, names):
        walker, codec, max_len = load_source(source, kinds[source], device)
        idx = sample_sequences(text, codec, args.n_seqs, min(args.seq_len, max_len), args.sampling, args.seed)
        print(f"{name}: {idx.shape[0]} sequences of {idx.shape[1]} tokens ({args.sampling}, seed {args.seed})")
        sweep_idx = None
        if args.context_sweep:  # documents: the only unit long enough at 1,024 tokens, the same at every length
            sweep_idx = {n: sample_sequences(text, codec, args.sweep_seqs, n, 'documents', args.seed).to(device)
                         for n in context_lengths(min(max_len, args.sweep_max_len), args.seq_len)}
        entry = dict(kind=kinds[source], **architecture(walker), sequences=idx.shape[0], seq_len=idx.shape[1])
        layer = args.layer if args.layer is not None else entry['n_layer'] // 2
        if not 0 <= layer < entry['n_layer']:
            raise UserError(f"--layer {layer} is not a layer of {name} (0 .. {entry['n_layer'] - 1})")
        twin = random_twin(walker, args.seed) if args.null_model else None
        os.makedirs(out, exist_ok=True)  # here, with the first plot: a source refused above leaves no empty folder
        for part in parts(walker):
            r, entry[part] = walk_model(walker, idx.to(device), sweep_idx, part, args, name)
            plot_heatmaps(walker, r, name if part == 'attention' else f'{name} (full operator)', layer,
                          f'{name}_{part}', out)
            if twin is not None:
                entry.setdefault('random_init', {})[part] = walk_model(twin, idx.to(device), sweep_idx, part, args,
                                                                       f'{name}, random init')[1]
            for qtype in quantize:  # the same sequences through the weights GGUF rounding leaves: the error bar
                entry.setdefault('gguf_rounded', {}).setdefault(qtype, {})[part] = walk_model(
                    gguf_files.gguf_rounded(walker, qtype), idx.to(device), None, part, args, f'{name}, {qtype}')[1]
        saved[name] = entry
        del walker, twin
    with atomic_write(os.path.join(out, 'diagnostics.json')) as f:
        json.dump(saved, f, indent=1)
    plot_walk_layers(saved, os.path.join(out, 'walk_layers.png'))
    if args.context_sweep:
        for name in names:
            for part in parts_of(saved[name]):
                plot_context_sweep(name, saved[name][part], saved[name].get('random_init', {}).get(part),
                                   os.path.join(out, f'context_sweep_{name}_{part}.png'))
    print(write_tables(saved, os.path.join(out, 'diagnostics.md')) + f"\n-> {out}")


def parts_of(entry):
    return [part for part in ('attention', 'operator') if part in entry]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('sources', nargs='+', help="run folders, GPT-2 names (gpt2, ...), local transformers folders "
                        "of GPT-2, Llama, Qwen2, Qwen3, Gemma 3 or BERT models, .gguf files of Llama or Gemma 3 models "
                        "(dequantised once into ~/.cache/corridor-gpt/gguf), or a model from its PyPI package: "
                        "'all-MiniLM-L6-v2', 'smollm2-135m', 'gemma3-270m'")
    parser.add_argument('--out', default='diagnostics', help='where to write (default: ./diagnostics)')
    parser.add_argument('--text', help='text file to walk over (default: WikiText-2 test through datasets)')
    parser.add_argument('--n_seqs', type=int, default=1024, help='sequences (default 1024, as the paper)')
    parser.add_argument('--seq_len', type=int, default=64, help='tokens per sequence, special tokens included '
                        '(default 64, as the paper)')
    parser.add_argument('--sampling', default='lines', help='; '.join(f'{k}: {v}' for k, v in SAMPLINGS.items()))
    parser.add_argument('--seed', type=int, default=0, help='of the sampling, the random-init twins and the '
                        'per-edge Gram sample')
    parser.add_argument('--drop_sink', action='store_true', help="leave out a decoder's edges to the first token "
                        "(an encoder's [CLS]/[SEP] are always left out)")
    parser.add_argument('--gram_edges', type=int, default=64, help='edges per layer whose Gram is built explicitly '
                        'for the per-edge Gram dominance (default 64; 0: skip; O(d³) each)')
    parser.add_argument('--null_model', action=argparse.BooleanOptionalAction, default=True,
                        help='also walk each model at random initialisation (default: yes)')
    parser.add_argument('--layer', type=int, help='layer of the A_eff and Gram heatmaps (default: the middle one)')
    parser.add_argument('--context_sweep', action='store_true', help='also every layer at context lengths 16 ... 1024 '
                        '(up to the model\'s), on random document chunks')
    parser.add_argument('--sweep_seqs', type=int, default=32, help='sequences at each length of the sweep (default 32; '
                        'the standard errors in the output say whether they are enough)')
    parser.add_argument('--quantize', default='', help='also walk each model with its 2-D weights rounded through '
                        'these GGUF formats and back (comma-separated: Q4_1, Q5_1, Q8_0; needs gguf): how far each '
                        'number moves, per layer, is the error bar of a quantised model\'s')
    parser.add_argument('--sweep_max_len', type=int, default=1024, help='longest context of the sweep (default 1024; '
                        'the cost grows as T², so a CPU run may stop at 256)')
    parser.add_argument('--device', help='default: cuda when available, else cpu')
    run_diagnostics(parser.parse_args(argv))


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
