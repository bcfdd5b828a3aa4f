"""
OpenWebText for the GPU configs, as `python prepare.py openwebtext` runs it (--input DIR: parquet files downloaded
elsewhere; --num_proc: workers): the Hugging Face hub's parquet export of Skylion007/openwebtext (the original
repository is a loading script, which datasets >= 4 no longer runs), checked against its known number of documents,
through GPT-2's BPE into train.bin / val.bin (uint16, ~9B tokens, ~17 GB) + meta.json, after a disk plan that
refuses a disk too small in one line.

Written straight from the parquet files (`datasets` would copy the corpus into its Arrow cache and map it to int64
lists, several times the 17 GB train.py reads): each worker tokenizes a row group into uint16 shards, which the main
process appends to train.bin / val.bin in order and deletes, so the folder never holds much more than the result.
"""

import json
import math
import multiprocessing
import shutil
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import UserError, gpt2_encoding

PARQUET = ('Skylion007/openwebtext', 'refs/convert/parquet', 'plain_text/train/')
DOCUMENTS = 8_013_769
VAL_FRACTION, SPLIT_SEED = 0.0005, 2357  # nanoGPT's split: 0.05 % of the documents validate
BYTES_PER_TOKEN_PLAN = 3.5  # GPT-2 BPE: ~4.2 bytes of web text a token; the disk plan errs on the safe side


def parquet_files(input_path):
    """(parquet files, bytes to download, source) of --input or the hub's export: sizes first, for the disk plan."""
    if input_path:
        root = Path(input_path)
        files = sorted(root.rglob('*.parquet')) if root.is_dir() else [root]
        if not files or files[0].suffix != '.parquet':
            raise UserError(f"--input {input_path}: no .parquet files (for .txt / .jsonl use `prepare.py text`)")
        return files, 0, f"local:{input_path}"
    from huggingface_hub import HfApi, hf_hub_download
    repo, revision, folder = PARQUET
    try:
        listing = [f for f in HfApi().list_repo_tree(repo, path_in_repo=folder.rstrip('/'), repo_type='dataset',
                                                     revision=revision, recursive=True)
                   if f.path.endswith('.parquet')]
    except Exception as e:  # offline, a moved repository, ...
        raise UserError(f"cannot list {repo}@{revision} on the Hugging Face hub ({type(e).__name__}); download its "
                        f"parquet files elsewhere and pass --input DIR") from None
    files = [Path(hf_hub_download(repo, f.path, repo_type='dataset', revision=revision))
             for f in tqdm(sorted(listing, key=lambda f: f.path), desc='downloading parquet', unit='file')]
    return files, sum(f.size for f in listing), f"{repo}@{revision}"


def row_groups(files):
    """One work unit per parquet row group: (file, row group, index of its first document, documents, text bytes)."""
    import pyarrow.parquet as pq
    units, first = [], 0
    for path in files:
        meta = pq.ParquetFile(path).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        if 'text' not in names:
            raise UserError(f"{path}: no 'text' column (columns: {', '.join(names)})")
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            text_bytes = group.column(names.index('text')).total_uncompressed_size
            units.append((str(path), g, first, group.num_rows, text_bytes))
            first += group.num_rows
    return units, first


def disk_plan(units, to_fetch, out, workers):
    """The output's peak bytes (the .bin files and shards in flight), the download, the free space."""
    text_bytes, largest = sum(u[4] for u in units), max(u[4] for u in units)
    output = int(2 * text_bytes / BYTES_PER_TOKEN_PLAN)
    in_flight = int(2 * largest / BYTES_PER_TOKEN_PLAN) * 2 * (workers + 1)  # finished shards wait their turn
    return dict(text_bytes=text_bytes, output=output, peak=output + in_flight, download=to_fetch,
                free=shutil.disk_usage(out).free)


def size(n_bytes):
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.1f} MB"


def tokenize_row_group(job):
    """Worker: a row group → scratch/N.train, N.val (uint16, end-of-text after each document); their token counts."""
    import pyarrow.parquet as pq
    (path, group, first, n, _), val_documents, scratch = job
    texts = pq.ParquetFile(path).read_row_group(group, columns=['text']).column('text').to_pylist()
    enc = gpt2_encoding()
    is_val = np.isin(np.arange(first, first + n), val_documents)
    counts = []
    for split, keep in (('train', ~is_val), ('val', is_val)):
        ids = [np.array(enc.encode_ordinary(text or '') + [enc.eot_token], dtype=np.uint16)
               for text, k in zip(texts, keep) if k]
        ids = np.concatenate(ids) if ids else np.zeros(0, np.uint16)
        (scratch / f'{first:012d}.{split}').write_bytes(ids.tobytes())
        counts.append(len(ids))
    return counts


def prepare(out, input_path, num_proc):
    """Into the folder out, row group by row group in parallel, in order; 0.05 % of the documents, drawn with
    nanoGPT's seed, validate (nanoGPT also shuffles the rest, which random batches make no difference to)."""
    files, to_fetch, source = parquet_files(input_path)
    units, n_documents = row_groups(files)
    if not input_path and n_documents != DOCUMENTS:
        raise UserError(f"{source} has {n_documents:,} documents, expected {DOCUMENTS:,} (a partial "
                        f"export?); pass complete parquet files with --input DIR")
    enc = gpt2_encoding()  # here too: a missing tokenizer is one line before any work
    workers = max(1, num_proc)
    plan = disk_plan(units, to_fetch, out, workers)
    print(f"source: {'local parquet files under ' + str(input_path) if input_path else source} ({n_documents:,} "
          f"documents, {len(files)} files, {len(units)} row groups, {size(plan['text_bytes'])} of text)")
    print(f"disk: {out.parent} needs about {size(plan['peak'])} at the peak (train.bin + val.bin "
          f"~{size(plan['output'])}, and the shards in flight); "
          + (f"the download took {size(plan['download'])} in the Hugging Face cache; " if plan['download'] else '')
          + f"{size(plan['free'])} free")
    if plan['peak'] > plan['free']:
        raise UserError(f"{out.parent} has {size(plan['free'])} free, and the prepared corpus needs about "
                        f"{size(plan['peak'])}: free some space or choose --data_root on a larger disk")
    rng, scratch, counts, peak = np.random.default_rng(SPLIT_SEED), out / 'shards', [0, 0], 0
    val_documents = np.sort(rng.choice(n_documents, size=math.ceil(VAL_FRACTION * n_documents), replace=False))
    scratch.mkdir()
    jobs = [(unit, val_documents[(val_documents >= unit[2]) & (val_documents < unit[2] + unit[3])], scratch)
            for unit in units]
    context = multiprocessing.get_context('spawn')  # no forked copies of a parent's threads (torch, tokenizers)
    with context.Pool(workers) as pool, open(out / 'train.bin', 'ab') as train, open(out / 'val.bin', 'ab') as val:
        for unit, unit_counts in zip(units, tqdm(pool.imap(tokenize_row_group, jobs), total=len(jobs),
                                                 desc='tokenizing', unit='row group')):
            shards = [(f, scratch / f'{unit[2]:012d}.{split}') for split, f in (('train', train), ('val', val))]
            for f, shard in shards:
                f.write(shard.read_bytes())
                f.flush()
            # the peak comes here, just before this unit's shards go: the .bin files and every shard on disk
            peak = max(peak, sum(p.stat().st_size for p in out.rglob('*') if p.is_file()))
            for _, shard in shards:
                shard.unlink()
            counts = [c + n for c, n in zip(counts, unit_counts)]
    scratch.rmdir()
    print(f"peak disk used in {out}: {size(peak)} (planned {size(plan['peak'])})")
    meta = dict(tokenizer='gpt2', vocab_size=enc.n_vocab, eot_token=enc.eot_token, train_tokens=counts[0],
                val_tokens=counts[1], documents=n_documents, source=source, dtype='uint16', peak_disk_bytes=peak)
    (out / 'meta.json').write_text(json.dumps(meta, indent=1) + '\n')
