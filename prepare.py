"""
Turn a corpus into what train.py reads: DATA_ROOT/NAME/{train.bin, val.bin} (uint16 token ids) + meta.json.

    python prepare.py shakespeare_char                  # Tiny Shakespeare (ships in data/), one token per character
    python prepare.py shakespeare                       # Tiny Shakespeare, GPT-2 BPE
    python prepare.py wikitext2_char                    # WikiText-2 (raw) at Tiny Shakespeare's size, characters
    python prepare.py wikitext2                         # the same, GPT-2 BPE
    python prepare.py openwebtext                       # OpenWebText, GPT-2 BPE (~9B tokens, ~17 GB)
    python prepare.py text --input notes/ --name notes  # your own .txt / .jsonl files, char or GPT-2 BPE
    python prepare.py wikitext2 --tokenizer=smollm2-135m  # a pretrained model's own: data/wikitext2_smollm2-135m

Tiny Shakespeare ships with the repo (data/tinyshakespeare.txt, public domain, checked against its SHA-256 as it is
read); the others download, or --input PATH uses a local copy. The output folder appears in one rename at the end: an
interrupted run leaves at most NAME.partial, and an earlier complete NAME stays until the new one replaces it.
"""

import argparse
import hashlib
import json
import math
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import UserError, WriteFailed, describe_os_error, gpt2_encoding, main_guard, storage_error

# Tiny Shakespeare (karpathy/char-rnn's input.txt, nanoGPT's shakespeare_char), shipped so the quick start is offline
SHAKESPEARE = Path(__file__).resolve().parent / 'data' / 'tinyshakespeare.txt'
SHAKESPEARE_SHA256 = '86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed'
# OpenWebText: the Hugging Face hub's parquet export of Skylion007/openwebtext (the original repository is a loading
# script, which datasets >= 4 no longer runs), checked against the known number of documents.
OPENWEBTEXT_DOCUMENTS = 8_013_769
GPT2_EOT = 50256


@contextmanager
def atomic_output_dir(final):
    """A scratch folder renamed to `final` if the block completes; else removed (a full disk: a WriteFailed)."""
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


def read_utf8(path):
    """A text file's content, or one line naming a file that is not UTF-8 text."""
    try:
        return path.read_text(encoding='utf-8')
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}): convert it, e.g. iconv -t UTF-8") from None


def char_tokenizer(text):
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    return itos, lambda s: [stoi[c] for c in s]


def write_small(out, train_ids, val_ids, source, tokenizer, vocab_size, itos=None, **extra):
    if len(train_ids) < 2 or len(val_ids) < 2:  # train.py needs at least one (input, target) pair per split
        raise UserError(f"{source} gives {len(train_ids)} training and {len(val_ids)} validation tokens: too little "
                        f"text to train on (an empty file?)")
    dtype = 'uint16' if vocab_size <= 65536 else 'uint32'  # uint32: pretrained vocabularies (Gemma 3: 262k)
    # write_bytes, not tofile: a full disk is then an OSError with its errno, not numpy's bare short-write message
    (out / 'train.bin').write_bytes(np.array(train_ids, dtype=dtype).tobytes())
    (out / 'val.bin').write_bytes(np.array(val_ids, dtype=dtype).tobytes())
    extra |= {'itos': itos} if itos is not None else {'eot_token': GPT2_EOT} if tokenizer == 'gpt2' else {}
    meta = dict(tokenizer=tokenizer, vocab_size=vocab_size, train_tokens=len(train_ids), val_tokens=len(val_ids),
                source=source, dtype=dtype, **extra)
    (out / 'meta.json').write_text(json.dumps(meta, indent=1) + '\n')


def write_subword(out, texts, source, tokenizer_name, dataset):
    """texts (train, val) through GPT-2's BPE, or a pretrained model's own tokenizer (--tokenizer=SOURCE)."""
    if tokenizer_name == 'gpt2':
        enc = gpt2_encoding()
        return write_small(out, *map(enc.encode_ordinary, texts), source, 'gpt2', enc.n_vocab)
    from lab import hf_tokenizer  # a pretrained model's own tokenizer: the lab's (and transformers')
    encode, vocab_size, extra = hf_tokenizer.data_tokenizer(tokenizer_name)
    write_small(out, *map(encode, texts), source, 'hf', vocab_size, dataset=dataset, **extra)


def shipped_shakespeare():
    """The shipped copy's text, or one line if its bytes are not the known ones (a partial clone, an edit)."""
    path = SHAKESPEARE
    data = path.read_bytes() if path.is_file() else b''
    if hashlib.sha256(data).hexdigest() != SHAKESPEARE_SHA256:
        what = 'missing' if not path.is_file() else 'not the shipped Tiny Shakespeare (its SHA-256 differs)'
        raise UserError(f"{path} is {what}: restore it with `git checkout -- data/tinyshakespeare.txt`, or pass a "
                        f"copy with --input PATH")
    return data.decode('utf-8')


def prepare_shakespeare(out, args, char_level):
    """nanoGPT's split: the first 90% of the characters train, the rest validate."""
    text = read_utf8(Path(args.input)) if args.input else shipped_shakespeare()
    source = args.input or 'data/tinyshakespeare.txt'
    split = int(len(text) * 0.9)
    if char_level:
        itos, encode = char_tokenizer(text)
        write_small(out, encode(text[:split]), encode(text[split:]), source, 'char', len(itos), itos)
    else:
        write_subword(out, (text[:split], text[split:]), source, args.tokenizer, 'shakespeare')


def read_wikitext2(input_path):
    """{'validation': text, 'test': text} of WikiText-2 (raw): from `datasets`, or --input's two .raw files."""
    if input_path:
        folder = Path(input_path)
        files = {'validation': folder / 'wiki.valid.raw', 'test': folder / 'wiki.test.raw'}
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise UserError(f"--input {input_path}: expected a folder with wiki.valid.raw and wiki.test.raw, "
                            f"missing {', '.join(missing)}")
        return {split: read_utf8(path) for split, path in files.items()}
    from datasets import load_dataset
    try:  # one row per line, each ending in a newline: joined, the rows are the raw files
        return {split: ''.join(load_dataset('wikitext', 'wikitext-2-raw-v1', split=split)['text'])
                for split in ('validation', 'test')}
    except Exception as e:
        raise UserError(f"cannot load WikiText-2 through datasets ({type(e).__name__}); pass a folder with "
                        f"wiki.valid.raw and wiki.test.raw with --input DIR") from None


def prepare_wikitext2(out, args, char_level):
    """WikiText-2 at Tiny Shakespeare's size, the CPU studies' second corpus: the validation split (1.15M characters)
    trains, the test split (1.29M) validates (left out: the 10.9M train split, which an offline copy lacks)."""
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
            for n, line in enumerate(read_utf8(path).splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    documents.append(json.loads(line)[text_field])
                except (json.JSONDecodeError, KeyError, TypeError, IndexError, RecursionError):
                    raise UserError(f"{path}:{n}: not a JSON object with a {text_field!r} field") from None
                if not isinstance(documents[-1], str):
                    raise UserError(f"{path}:{n}: its {text_field!r} field is a {type(documents[-1]).__name__}, "
                                    f"not text") from None
        else:
            documents.append(read_utf8(path))
    return documents


def prepare_text(out, args):
    """Your own files, concatenated in order (an end-of-text token after each), the last val_fraction validating."""
    documents = read_documents(args.input, args.text_field)
    extra = {}
    if args.tokenizer == 'char':
        itos, encode = char_tokenizer(''.join(documents))
        ids = [i for doc in documents for i in encode(doc)]
        vocab_size = len(itos)
    elif args.tokenizer != 'gpt2':  # a pretrained model's own, its end-of-sequence token after each document
        from lab import hf_tokenizer
        encode, vocab_size, extra = hf_tokenizer.data_tokenizer(args.tokenizer)
        itos, end = None, [extra['eot_token']] if 'eot_token' in extra else []
        ids = [i for doc in tqdm(documents, desc='documents', unit='doc') for i in encode(doc) + end]
    else:
        enc, itos = gpt2_encoding(), None
        ids = [i for doc in tqdm(documents, desc='tokenizing', unit='doc') for i in enc.encode_ordinary(doc) + [GPT2_EOT]]
        vocab_size = enc.n_vocab
    split = int(len(ids) * (1 - args.val_fraction))
    write_small(out, ids[:split], ids[split:], str(args.input), 'hf' if extra else args.tokenizer, vocab_size, itos,
                **extra)


# Written straight from the parquet files (`datasets` would copy the corpus into its Arrow cache and map it to int64
# lists, several times the 17 GB train.py reads): each worker tokenizes a row group into uint16 shards, which the main
# process appends to train.bin / val.bin in order and deletes, so the folder never holds much more than the result.
OPENWEBTEXT_PARQUET = ('Skylion007/openwebtext', 'refs/convert/parquet', 'plain_text/train/')
VAL_FRACTION, SPLIT_SEED = 0.0005, 2357  # nanoGPT's split: 0.05 % of the documents validate
BYTES_PER_TOKEN_PLAN = 3.5  # GPT-2 BPE: ~4.2 bytes of web text a token; the disk plan errs on the safe side


def openwebtext_files(input_path):
    """(parquet files, bytes to download, source) of --input or the hub's export: sizes first, for the disk plan."""
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
            units.append((str(path), g, first, group.num_rows, group.column(names.index('text')).total_uncompressed_size))
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
        ids = [np.array(enc.encode_ordinary(text or '') + [GPT2_EOT], dtype=np.uint16)
               for text, k in zip(texts, keep) if k]
        ids = np.concatenate(ids) if ids else np.zeros(0, np.uint16)
        (scratch / f'{first:012d}.{split}').write_bytes(ids.tobytes())
        counts.append(len(ids))
    return counts


def prepare_openwebtext(out, args):
    """OpenWebText through GPT-2's BPE, row group by row group in parallel, in order; 0.05 % of the documents, drawn
    with nanoGPT's seed, validate (nanoGPT also shuffles the rest, which random batches make no difference to)."""
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
    rng, scratch, counts, peak = np.random.default_rng(SPLIT_SEED), out / 'shards', dict(train=0, val=0), 0
    val_documents = np.sort(rng.choice(n_documents, size=math.ceil(VAL_FRACTION * n_documents), replace=False))
    scratch.mkdir()
    jobs = [(unit, val_documents[(val_documents >= unit[2]) & (val_documents < unit[2] + unit[3])], scratch)
            for unit in units]
    context = multiprocessing.get_context('spawn')  # no forked copies of a parent's threads (torch, tokenizers)
    with context.Pool(max(1, args.num_proc)) as pool, open(out / 'train.bin', 'ab') as train, \
            open(out / 'val.bin', 'ab') as val:
        for unit, (n_train, n_val) in zip(units, tqdm(pool.imap(tokenize_row_group, jobs), total=len(jobs),
                                                     desc='tokenizing', unit='row group')):
            shards = [(f, scratch / f'{unit[2]:012d}.{split}') for split, f in (('train', train), ('val', val))]
            for f, shard in shards:
                f.write(shard.read_bytes())
                f.flush()
            # the peak comes here, just before this unit's shards go: the .bin files and every shard on disk
            peak = max(peak, sum(p.stat().st_size for p in out.rglob('*') if p.is_file()))
            for _, shard in shards:
                shard.unlink()
            counts = dict(train=counts['train'] + n_train, val=counts['val'] + n_val)
    scratch.rmdir()
    print(f"peak disk used in {out}: {size(peak)} (planned {size(plan['peak'])})")
    meta = dict(tokenizer='gpt2', vocab_size=enc.n_vocab, eot_token=GPT2_EOT, train_tokens=counts['train'],
                val_tokens=counts['val'], documents=n_documents, source=source, dtype='uint16', peak_disk_bytes=peak)
    (out / 'meta.json').write_text(json.dumps(meta, indent=1) + '\n')


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('dataset', choices=['shakespeare_char', 'shakespeare', 'wikitext2_char', 'wikitext2',
                                            'openwebtext', 'text'])
    parser.add_argument('--input', help='a local copy (file or folder) instead of the download or shipped copy')
    parser.add_argument('--data_root', default='data', help='prepared data goes to DATA_ROOT/NAME (default: data)')
    parser.add_argument('--name', help='the folder under data_root (default: the dataset, for text the input stem)')
    parser.add_argument('--tokenizer', default='gpt2', help="gpt2, char (text only), or a pretrained model's own: "
                        "smollm2-135m, gemma3-270m, a .gguf file, a transformers folder (shakespeare, wikitext2, text)")
    parser.add_argument('--text_field', default='text', help='text, .jsonl: the field holding each document')
    parser.add_argument('--val_fraction', type=float, default=0.1, help='text: fraction of tokens that validate')
    parser.add_argument('--num_proc', type=int, default=min(8, os.cpu_count() or 1), help='openwebtext: workers')
    args = parser.parse_args()
    own_tokenizer = args.tokenizer not in ('char', 'gpt2')
    for wrong, message in (
            (args.dataset == 'text' and not args.input, "the text dataset needs --input FILE_OR_FOLDER"),
            (not 0 < args.val_fraction < 1, f"--val_fraction must be in (0, 1), got {args.val_fraction}"),
            (args.input and not Path(args.input).exists(), f"--input {args.input} does not exist"),
            (own_tokenizer and args.dataset not in ('shakespeare', 'wikitext2', 'text'), f"--tokenizer={args.tokenizer}: "
             f"a pretrained model's tokenizer prepares shakespeare, wikitext2 and text ({args.dataset} takes gpt2)"),
            (args.tokenizer == 'char' and args.dataset != 'text',
             f"--tokenizer=char is for text; {args.dataset} has its own _char dataset")):
        if wrong:
            raise UserError(message)
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
