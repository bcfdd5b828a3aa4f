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
import os
import shutil
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import UserError, WriteFailed, describe_os_error, gpt2_encoding, main_guard, storage_error

SHAKESPEARE_URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'
# OpenWebText on the Hugging Face hub. datasets >= 4 no longer runs loading scripts, which the original repo
# is; its automatic parquet export is script-free. Tried in order, each checked against the known size.
OPENWEBTEXT_SOURCES = [('Skylion007/openwebtext', 'refs/convert/parquet'), ('Skylion007/openwebtext', None)]
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
    """(encode, vocab_size, meta entries) for a pretrained model's own tokenizer (walk_hf.py loads it)."""
    import walk_hf  # here, not at the top: it imports torch and transformers, which the other datasets never need
    tokenizer = walk_hf.load_tokenizer(source)
    vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)

    def encode(text):  # line by line: a progress bar, and no single 1 MB call
        lines = text.splitlines(keepends=True)
        return [i for line in tqdm(lines, desc='tokenizing', unit='line', mininterval=1, leave=False)
                for i in tokenizer(line, add_special_tokens=False)['input_ids']]
    meta = dict(tokenizer_source=source, tokenizer_fingerprint=walk_hf.tokenizer_fingerprint(tokenizer))
    if tokenizer.eos_token_id is not None:
        meta['eot_token'] = tokenizer.eos_token_id
    return encode, vocab_size, meta


def download_text(url, input_path):
    if input_path:
        return Path(input_path).read_text(encoding='utf-8')
    print(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.read().decode('utf-8')
    except OSError as e:
        raise UserError(f"could not download {url} ({e}); pass a local copy with --input PATH") from None


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
    text = download_text(SHAKESPEARE_URL, args.input)
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

def load_openwebtext(input_path, num_proc):
    """(dataset with a 'text' column, source description). --input: local parquet / jsonl / txt files."""
    from datasets import load_dataset
    if input_path:
        files = sorted(str(p) for p in Path(input_path).rglob('*.parquet')) if Path(input_path).is_dir() \
            else [str(input_path)]
        if not files or not Path(files[0]).exists():
            raise UserError(f"--input {input_path}: no parquet files found")
        fmt = {'.parquet': 'parquet', '.jsonl': 'json', '.json': 'json', '.txt': 'text'}.get(Path(files[0]).suffix)
        if fmt is None:
            raise UserError(f"--input {input_path}: expected .parquet, .jsonl or .txt files")
        dataset = load_dataset(fmt, data_files=files, split='train', num_proc=num_proc)
        print(f"source: local {fmt} files under {input_path} ({len(dataset):,} documents)")
        return dataset, f"local:{input_path}"
    tried = []
    for repo, revision in OPENWEBTEXT_SOURCES:
        name = f"{repo}@{revision or 'main'}"
        try:
            dataset = load_dataset(repo, revision=revision, split='train', num_proc=num_proc)
        except (ConnectionError, TimeoutError) as e:
            raise UserError(f"cannot reach the Hugging Face hub for {name} ({type(e).__name__}); download the "
                            f"parquet files elsewhere and pass --input DIR") from None
        except Exception as e:  # a missing revision, a loading script datasets refuses, an offline cache miss...
            tried.append(f"{name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            continue
        if len(dataset) == OPENWEBTEXT_DOCUMENTS:
            print(f"source: {name} ({len(dataset):,} documents, as expected)")
            return dataset, name
        tried.append(f"{name}: {len(dataset):,} documents, expected {OPENWEBTEXT_DOCUMENTS:,} (partial export?)")
    raise UserError("no complete OpenWebText source: " + '; '.join(tried) + ". Pass local parquet files with --input DIR")


def prepare_openwebtext(out, args):
    dataset, source = load_openwebtext(args.input, args.num_proc)
    split = dataset.train_test_split(test_size=0.0005, seed=2357, shuffle=True)  # nanoGPT's split
    split['val'] = split.pop('test')
    enc = gpt2_encoding()

    def tokenize(batch):
        ids = [enc.encode_ordinary(text) + [GPT2_EOT] for text in batch['text']]
        return {'ids': ids, 'len': [len(x) for x in ids]}

    counts = {}
    for name, part in split.items():
        tokenized = part.map(tokenize, batched=True, remove_columns=part.column_names, num_proc=args.num_proc,
                             desc=f"tokenizing {name}")
        total = int(np.sum(tokenized['len'], dtype=np.uint64))
        counts[name] = total
        tokens = np.memmap(out / f'{name}.bin', dtype=np.uint16, mode='w+', shape=(total,))
        # stream shard by shard: memory stays at one shard, never the corpus
        n_shards, position = min(1024, len(tokenized)), 0
        for i in tqdm(range(n_shards), desc=f"writing {name}.bin"):
            shard = tokenized.shard(num_shards=n_shards, index=i, contiguous=True).with_format('numpy')
            ids = np.concatenate(list(shard['ids'])) if len(shard) else np.zeros(0, np.uint16)
            tokens[position:position + len(ids)] = ids
            position += len(ids)
        tokens.flush()
        del tokens
    write_meta(out, tokenizer='gpt2', vocab_size=enc.n_vocab, eot_token=GPT2_EOT, train_tokens=counts['train'],
               val_tokens=counts['val'], documents=len(dataset), source=source, dtype='uint16')


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
