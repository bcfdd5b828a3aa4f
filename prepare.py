"""
Turn a corpus into what train.py reads: DATA_ROOT/NAME/{train.bin, val.bin} (uint16 token ids) + meta.json.

    python prepare.py shakespeare_char                  # Tiny Shakespeare, one token per character (vocab 65)
    python prepare.py shakespeare                       # Tiny Shakespeare, GPT-2 BPE
    python prepare.py wikitext2_char                    # WikiText-2 (raw) at Tiny Shakespeare's size, characters
    python prepare.py wikitext2                         # the same, GPT-2 BPE
    python prepare.py openwebtext                       # OpenWebText, GPT-2 BPE (~9B tokens, ~17 GB)
    python prepare.py text --input notes/ --name notes  # your own .txt / .jsonl files, char or GPT-2 BPE
    python prepare.py wikitext2 --tokenizer=smollm2-135m  # a pretrained model's own tokenizer (train.py
                                                          # --init_from=smollm2-135m): data/wikitext2_smollm2-135m

--input PATH uses a local copy instead of downloading (a machine without network). The output folder
appears in one rename at the end: an interrupted run leaves at most a NAME.partial folder, never files that
look complete, and an earlier complete NAME folder stays until the new one replaces it.
"""

import argparse
import json
import math
import os
import shutil
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import UserError, WriteFailed, describe_os_error, gpt2_encoding, main_guard, storage_error

SHAKESPEARE_URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'
# OpenWebText: the Hugging Face hub's parquet export of Skylion007/openwebtext (the original repository is a loading
# script, which datasets >= 4 no longer runs), checked against the known number of documents.
OPENWEBTEXT_DOCUMENTS = 8_013_769
GPT2_EOT = 50256


@contextmanager
def atomic_output_dir(final):
    """Yield a scratch folder that becomes `final` in one rename, only if the block completes. A failure removes the
    scratch folder; one of the storage (a full disk: an OSError) is a WriteFailed, one line for the user."""
    final = Path(final)
    partial, old = final.with_name(final.name + '.partial'), final.with_name(final.name + '.old')
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)  # left by a crash between the two renames below
    try:
        partial.mkdir(parents=True)
        yield partial
        if final.exists():
            os.replace(final, old)
        try:
            os.replace(partial, final)
        except OSError:
            if old.exists():
                os.replace(old, final)  # the earlier complete folder back in place
            raise
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        cause = storage_error(e)
        if cause is None or isinstance(e, UserError):
            raise
        raise WriteFailed(final, describe_os_error(cause)) from None
    shutil.rmtree(old, ignore_errors=True)


def write_meta(out, **meta):
    (out / 'meta.json').write_text(json.dumps(meta, indent=1) + '\n')


def token_dtype(vocab_size):
    """uint16 as nanoGPT, uint32 for the larger vocabularies of pretrained models (Gemma 3: 262k, Qwen: 152k)."""
    return 'uint16' if vocab_size <= 65536 else 'uint32'


def model_tokenizer(source):
    """(encode, vocab_size, meta entries) for a pretrained model's own tokenizer (lab/hf.py loads it)."""
    from lab import hf  # here, not at the top: a pretrained model's tokenizer is the lab's (and transformers')
    tokenizer = hf.load_tokenizer(source)
    vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)

    def encode(text):  # line by line: a progress bar, and no single 1 MB call
        lines = text.splitlines(keepends=True)
        return [i for line in tqdm(lines, desc='tokenizing', unit='line', mininterval=1, leave=False)
                for i in tokenizer(line, add_special_tokens=False)['input_ids']]
    meta = dict(tokenizer_source=source, tokenizer_fingerprint=hf.tokenizer_fingerprint(tokenizer))
    if tokenizer.eos_token_id is not None:
        meta['eot_token'] = tokenizer.eos_token_id
    return encode, vocab_size, meta


def download_text(url, args):
    if args.input:
        return Path(args.input).read_text(encoding='utf-8')
    print(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.read().decode('utf-8')
    except OSError as e:  # the whole command, as train.py passes this line on when it prepares on demand
        raise UserError(f"could not download {url} ({e}); prepare it from a local copy: python prepare.py "
                        f"{args.dataset} --input PATH --data_root={args.data_root}") from None


# ---------------------------------------------------------------------------------------------- small corpora

def char_tokenizer(text):
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    return itos, lambda s: [stoi[c] for c in s]


def write_small(out, train_ids, val_ids, source, tokenizer, vocab_size, itos=None, **extra):
    if len(train_ids) < 2 or len(val_ids) < 2:  # train.py needs at least one (input, target) pair per split
        raise UserError(f"{source} gives {len(train_ids)} training and {len(val_ids)} validation tokens: too little "
                        f"text to train on (an empty file?)")
    dtype = token_dtype(vocab_size)
    # write_bytes, not tofile: a full disk is then an OSError with its errno, not numpy's bare short-write message
    (out / 'train.bin').write_bytes(np.array(train_ids, dtype=dtype).tobytes())
    (out / 'val.bin').write_bytes(np.array(val_ids, dtype=dtype).tobytes())
    meta = dict(tokenizer=tokenizer, vocab_size=vocab_size, train_tokens=len(train_ids), val_tokens=len(val_ids),
                source=source, dtype=dtype)
    if itos is not None:
        meta['itos'] = itos
    if tokenizer == 'gpt2':
        meta['eot_token'] = GPT2_EOT
    write_meta(out, **meta, **extra)


def write_subword(out, texts, source, tokenizer_name, dataset):
    """texts (train, val) through GPT-2's BPE, or a pretrained model's own tokenizer (--tokenizer=SOURCE)."""
    if tokenizer_name == 'gpt2':
        enc = gpt2_encoding()
        return write_small(out, *map(enc.encode_ordinary, texts), source, 'gpt2', enc.n_vocab)
    encode, vocab_size, extra = model_tokenizer(tokenizer_name)
    write_small(out, *map(encode, texts), source, 'hf', vocab_size, dataset=dataset, **extra)


def prepare_shakespeare(out, args, char_level):
    """nanoGPT's split: the first 90% of the characters train, the rest validate."""
    text = download_text(SHAKESPEARE_URL, args)
    source = args.input or SHAKESPEARE_URL
    split = int(len(text) * 0.9)
    if char_level:
        itos, encode = char_tokenizer(text)
        write_small(out, encode(text[:split]), encode(text[split:]), source, 'char', len(itos), itos)
    else:
        write_subword(out, (text[:split], text[split:]), source, args.tokenizer, 'shakespeare')


def read_wikitext2(input_path):
    """{'validation': text, 'test': text} of WikiText-2 (raw): through `datasets`, or from a folder holding
    wiki.valid.raw and wiki.test.raw (as in wikitext-2-raw-v1.zip)."""
    if input_path:
        folder = Path(input_path)
        files = {'validation': folder / 'wiki.valid.raw', 'test': folder / 'wiki.test.raw'}
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise UserError(f"--input {input_path}: expected a folder with wiki.valid.raw and wiki.test.raw, "
                            f"missing {', '.join(missing)}")
        return {split: path.read_text(encoding='utf-8') for split, path in files.items()}
    from datasets import load_dataset
    try:  # one row per line, each ending in a newline: joined, the rows are the raw files
        return {split: ''.join(load_dataset('wikitext', 'wikitext-2-raw-v1', split=split)['text'])
                for split in ('validation', 'test')}
    except Exception as e:
        raise UserError(f"cannot load WikiText-2 through datasets ({type(e).__name__}); pass a folder with "
                        f"wiki.valid.raw and wiki.test.raw with --input DIR") from None


def prepare_wikitext2(out, args, char_level):
    """WikiText-2 at Tiny Shakespeare's size, the CPU studies' second corpus: the validation split (1.15M
    characters, 250k GPT-2 tokens) trains and the test split (1.29M, 286k) validates. The 10.9M-character train
    split is left out on purpose, so that the corpus matches Tiny Shakespeare's size and an offline copy of the
    two small splits gives exactly the same data."""
    texts = read_wikitext2(args.input)
    source = args.input or 'wikitext/wikitext-2-raw-v1 (datasets)'
    if char_level:  # the vocabulary covers both splits, so no validation character is unknown
        itos, encode = char_tokenizer(texts['validation'] + texts['test'])
        write_small(out, encode(texts['validation']), encode(texts['test']), source, 'char', len(itos), itos)
    else:
        write_subword(out, (texts['validation'], texts['test']), source, args.tokenizer, 'wikitext2')


def read_documents(input_path, text_field):
    """Every .txt file is a document; every line of a .jsonl file is one (its text_field)."""
    root = Path(input_path)
    files = sorted(p for p in root.rglob('*') if p.suffix in ('.txt', '.jsonl')) if root.is_dir() else [root]
    if not files:
        raise UserError(f"no .txt or .jsonl files under {root}")
    documents = []
    for path in files:
        if path.suffix == '.jsonl':
            for n, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    documents.append(json.loads(line)[text_field])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise UserError(f"{path}:{n}: not a JSON object with a {text_field!r} field") from None
        else:
            documents.append(path.read_text(encoding='utf-8'))
    return documents


def prepare_text(out, args):
    """Your own files: documents concatenated in order (GPT-2 BPE: an end-of-text token after each), the last
    val_fraction of the tokens validate."""
    documents = read_documents(args.input, args.text_field)
    extra = {}
    if args.tokenizer == 'char':
        itos, encode = char_tokenizer(''.join(documents))
        ids = [i for doc in documents for i in encode(doc)]
        vocab_size = len(itos)
    elif args.tokenizer != 'gpt2':  # a pretrained model's own, its end-of-sequence token after each document
        encode, vocab_size, extra = model_tokenizer(args.tokenizer)
        itos, end = None, [extra['eot_token']] if 'eot_token' in extra else []
        ids = [i for doc in tqdm(documents, desc='documents', unit='doc') for i in encode(doc) + end]
    else:
        enc, itos = gpt2_encoding(), None
        ids = [i for doc in tqdm(documents, desc='tokenizing', unit='doc') for i in enc.encode_ordinary(doc) + [GPT2_EOT]]
        vocab_size = enc.n_vocab
    split = int(len(ids) * (1 - args.val_fraction))
    write_small(out, ids[:split], ids[split:], str(args.input), 'hf' if extra else args.tokenizer, vocab_size, itos,
                **extra)


# ---------------------------------------------------------------------------------------------- OpenWebText

# Written straight from the parquet files: `datasets` would first copy the corpus into its Arrow cache and then map
# it into int64 id lists there (about 9B tokens × 8 bytes), several times the 17 GB of uint16 that train.py reads.
# Here each worker tokenizes one parquet row group into uint16 shard files, and the main process appends the shards
# to train.bin / val.bin in order and deletes them: the output folder never holds much more than the final files.
OPENWEBTEXT_PARQUET = ('Skylion007/openwebtext', 'refs/convert/parquet', 'plain_text/train/')
VAL_FRACTION, SPLIT_SEED = 0.0005, 2357  # nanoGPT's split: 0.05 % of the documents validate
# GPT-2 BPE on English web text: about 4.2 bytes of UTF-8 per token (OpenWebText: ~38 GB → 9.04B). The disk plan
# assumes 3.5, so that it errs on the safe side by ~20 %.
BYTES_PER_TOKEN_PLAN = 3.5


def openwebtext_files(input_path):
    """(parquet files, bytes still to download, source) for --input, or for the hub's parquet export: the file list
    and sizes first, so that the disk plan is known before anything is fetched."""
    if input_path:
        root = Path(input_path)
        files = sorted(root.rglob('*.parquet')) if root.is_dir() else [root]
        if not files or files[0].suffix != '.parquet':
            raise UserError(f"--input {input_path}: no .parquet files (for .txt / .jsonl use `prepare.py text`)")
        return files, 0, f"local:{input_path}"
    from huggingface_hub import HfApi, hf_hub_download
    repo, revision, folder = OPENWEBTEXT_PARQUET
    try:
        listing = [f for f in HfApi().list_repo_tree(repo, path_in_repo=folder.rstrip('/'), repo_type='dataset',
                                                     revision=revision, recursive=True)
                   if f.path.endswith('.parquet')]
    except Exception as e:  # offline, a moved repository, ...
        raise UserError(f"cannot list {repo}@{revision} on the Hugging Face hub ({type(e).__name__}); download its "
                        f"parquet files elsewhere and pass --input DIR") from None
    to_fetch = sum(f.size for f in listing)
    files = []
    for f in tqdm(sorted(listing, key=lambda f: f.path), desc='downloading parquet', unit='file'):
        files.append(Path(hf_hub_download(repo, f.path, repo_type='dataset', revision=revision)))
    return files, to_fetch, f"{repo}@{revision}"


def row_groups(files):
    """One work unit per parquet row group: (file, row group, index of its first document, documents, text bytes)."""
    import pyarrow.parquet as pq
    units, first = [], 0
    for path in files:
        meta = pq.ParquetFile(path).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        if 'text' not in names:
            raise UserError(f"{path}: no 'text' column (columns: {', '.join(names)})")
        column = names.index('text')
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            units.append((str(path), g, first, group.num_rows, group.column(column).total_uncompressed_size))
            first += group.num_rows
    return units, first


def disk_plan(units, to_fetch, out, workers):
    """Bytes the output folder will hold at its peak (the two .bin files, estimated from the text's size, plus the
    shards in flight), what the download adds, and what is free: printed before the work starts."""
    text_bytes = sum(u[4] for u in units)
    largest = max(u[4] for u in units)
    output = int(2 * text_bytes / BYTES_PER_TOKEN_PLAN)
    in_flight = int(2 * largest / BYTES_PER_TOKEN_PLAN) * 2 * (workers + 1)  # finished shards wait their turn
    return dict(text_bytes=text_bytes, output=output, peak=output + in_flight, download=to_fetch,
                free=shutil.disk_usage(out).free)


def size(n_bytes):
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.1f} MB"


def tokenize_row_group(unit, val_documents, scratch):
    """Worker: one row group → scratch/NNNNN.train, NNNNN.val (uint16 ids, an end-of-text token after each document).
    Returns the two token counts."""
    import pyarrow.parquet as pq
    path, group, first, n, _ = unit
    texts = pq.ParquetFile(path).read_row_group(group, columns=['text']).column('text').to_pylist()
    enc = gpt2_encoding()
    is_val = np.isin(np.arange(first, first + n), val_documents)
    counts = []
    for split, keep in (('train', ~is_val), ('val', is_val)):
        ids = [np.array(enc.encode_ordinary(text or '') + [GPT2_EOT], dtype=np.uint16)
               for text, k in zip(texts, keep) if k]
        ids = np.concatenate(ids) if ids else np.zeros(0, np.uint16)
        (scratch / f'{first:012d}.{split}').write_bytes(ids.tobytes())
        counts.append(len(ids))
    return counts


def _tokenize_unit(job):  # Pool.imap sends one picklable argument
    return tokenize_row_group(*job)


def prepare_openwebtext(out, args):
    """OpenWebText through GPT-2's BPE, parquet row group by row group in parallel. Documents keep their order; 0.05 %
    of them, drawn with nanoGPT's seed, validate (nanoGPT's split draws another 0.05 % and shuffles the rest, which
    random batches make no different for training)."""
    import multiprocessing
    files, to_fetch, source = openwebtext_files(args.input)
    units, n_documents = row_groups(files)
    if not args.input and n_documents != OPENWEBTEXT_DOCUMENTS:
        raise UserError(f"{source} has {n_documents:,} documents, expected {OPENWEBTEXT_DOCUMENTS:,} (a partial "
                        f"export?); pass complete parquet files with --input DIR")
    enc = gpt2_encoding()  # here too: a missing tokenizer is one line before any work
    plan = disk_plan(units, to_fetch, out, max(1, args.num_proc))
    print(f"source: {'local parquet files under ' + str(args.input) if args.input else source} ({n_documents:,} "
          f"documents, {len(files)} files, {len(units)} row groups, {size(plan['text_bytes'])} of text)")
    print(f"disk: {out.parent} needs about {size(plan['peak'])} at the peak (train.bin + val.bin "
          f"~{size(plan['output'])}, and the shards in flight); "
          + (f"the download took {size(plan['download'])} in the Hugging Face cache; " if plan['download'] else '')
          + f"{size(plan['free'])} free")
    if plan['peak'] > plan['free']:
        raise UserError(f"{out.parent} has {size(plan['free'])} free, and the prepared corpus needs about "
                        f"{size(plan['peak'])}: free some space or choose --data_root on a larger disk")
    rng = np.random.default_rng(SPLIT_SEED)
    val_documents = np.sort(rng.choice(n_documents, size=math.ceil(VAL_FRACTION * n_documents), replace=False))
    scratch = out / 'shards'
    scratch.mkdir()
    counts, peak = dict(train=0, val=0), 0
    jobs = [(unit, val_documents[(val_documents >= unit[2]) & (val_documents < unit[2] + unit[3])], scratch)
            for unit in units]
    context = multiprocessing.get_context('spawn')  # no forked copies of a parent's threads (torch, tokenizers)
    with context.Pool(max(1, args.num_proc)) as pool, open(out / 'train.bin', 'ab') as train, \
            open(out / 'val.bin', 'ab') as val:
        for unit, (n_train, n_val) in zip(units, tqdm(pool.imap(_tokenize_unit, jobs), total=len(jobs),
                                                     desc='tokenizing', unit='row group')):
            shards = [(f, scratch / f'{unit[2]:012d}.{split}') for split, f in (('train', train), ('val', val))]
            for f, shard in shards:
                f.write(shard.read_bytes())
                f.flush()
            # the peak comes here, just before this unit's shards go: the .bin files and every shard on disk
            peak = max(peak, sum(p.stat().st_size for p in out.rglob('*') if p.is_file()))
            for _, shard in shards:
                shard.unlink()
            counts['train'] += n_train
            counts['val'] += n_val
    scratch.rmdir()
    print(f"peak disk used in {out}: {size(peak)} (planned {size(plan['peak'])})")
    write_meta(out, tokenizer='gpt2', vocab_size=enc.n_vocab, eot_token=GPT2_EOT, train_tokens=counts['train'],
               val_tokens=counts['val'], documents=n_documents, source=source, dtype='uint16', peak_disk_bytes=peak)


# ---------------------------------------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('dataset', choices=['shakespeare_char', 'shakespeare', 'wikitext2_char', 'wikitext2',
                                            'openwebtext', 'text'])
    parser.add_argument('--input', help='a local copy (file or folder) instead of the download')
    parser.add_argument('--data_root', default='data', help='prepared data goes to DATA_ROOT/NAME (default: data)')
    parser.add_argument('--name', help='the folder name under data_root (default: the dataset, or for text the '
                                       'input file stem)')
    parser.add_argument('--tokenizer', default='gpt2',
                        help="gpt2 (default), char (text only), or a pretrained model's own: smollm2-135m, "
                             "gemma3-270m, a .gguf file or a transformers folder (shakespeare, wikitext2, text)")
    parser.add_argument('--text_field', default='text', help='text, .jsonl: the field holding each document')
    parser.add_argument('--val_fraction', type=float, default=0.1, help='text: fraction of tokens that validate')
    parser.add_argument('--num_proc', type=int, default=min(8, os.cpu_count() or 1),
                        help='openwebtext: worker processes')
    args = parser.parse_args()
    if args.dataset == 'text' and not args.input:
        raise UserError("the text dataset needs --input FILE_OR_FOLDER")
    if not 0 < args.val_fraction < 1:
        raise UserError(f"--val_fraction must be in (0, 1), got {args.val_fraction}")
    if args.input and not Path(args.input).exists():
        raise UserError(f"--input {args.input} does not exist")
    own_tokenizer = args.tokenizer not in ('char', 'gpt2')
    if own_tokenizer and args.dataset not in ('shakespeare', 'wikitext2', 'text'):
        raise UserError(f"--tokenizer={args.tokenizer}: a pretrained model's tokenizer prepares shakespeare, wikitext2 "
                        f"and text ({args.dataset} takes gpt2)")
    if args.tokenizer == 'char' and args.dataset != 'text':
        raise UserError(f"--tokenizer=char is for text; {args.dataset} has its own _char dataset")
    name = args.name or (Path(args.input).stem if args.dataset == 'text' else args.dataset)
    if own_tokenizer and not args.name:  # beside the GPT-2 one, never over it
        name += '_' + Path(args.tokenizer).name.removesuffix('.gguf')
    final = Path(args.data_root) / name
    with atomic_output_dir(final) as out:
        if args.dataset in ('shakespeare_char', 'shakespeare'):
            prepare_shakespeare(out, args, char_level=args.dataset == 'shakespeare_char')
        elif args.dataset in ('wikitext2_char', 'wikitext2'):
            prepare_wikitext2(out, args, char_level=args.dataset == 'wikitext2_char')
        elif args.dataset == 'text':
            prepare_text(out, args)
        else:
            prepare_openwebtext(out, args)
    meta = json.loads((final / 'meta.json').read_text())
    print(f"wrote {final}: " + ', '.join(f"{k}={v}" for k, v in meta.items() if k != 'itos'))


if __name__ == '__main__':
    main_guard(main)
