"""
Turn a corpus into what train.py reads: DATA_ROOT/NAME/{train.bin, val.bin} (uint16 token ids) + meta.json.

    python prepare.py shakespeare_char                  # Tiny Shakespeare (ships in data/), one token per character
    python prepare.py shakespeare                       # Tiny Shakespeare, GPT-2 BPE
    python prepare.py wikitext2_char                    # WikiText-2 (raw) at Tiny Shakespeare's size, characters
    python prepare.py wikitext2                         # the same, GPT-2 BPE
    python prepare.py openwebtext                       # OpenWebText, GPT-2 BPE, ~9B tokens: lab/openwebtext.py
    python prepare.py text --input notes/ --name notes  # your own .txt / .jsonl files, char or GPT-2 BPE
    python prepare.py wikitext2 --tokenizer=smollm2-135m  # a pretrained model's own: data/wikitext2_smollm2-135m

Tiny Shakespeare ships with the repo (data/tinyshakespeare.txt, public domain, checked against its SHA-256 as it is
read); the others download, or --input PATH uses a local copy. The output folder appears in one rename at the end: an
interrupted run leaves at most NAME.partial, and an earlier complete NAME stays until the new one replaces it.
"""

import argparse
import hashlib
import json
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


@contextmanager
def atomic_output_dir(final):
    """A scratch folder renamed to the Path final if the block completes; else removed (a full disk: a WriteFailed)."""
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
    try:
        return path.read_text(encoding='utf-8')
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}): convert it, e.g. iconv -t UTF-8") from None


def tokenizer(name, texts):
    """(encode, vocab_size, meta.json entries, with the eot_token if there is one) of --tokenizer: one token per
    character of texts (all of them, so no validation character is unknown), GPT-2's BPE, or a pretrained model's."""
    if name == 'char':
        itos = sorted(set().union(*texts))
        stoi = {c: i for i, c in enumerate(itos)}
        return (lambda s: [stoi[c] for c in s]), len(itos), {'itos': itos}
    if name == 'gpt2':
        enc = gpt2_encoding()
        return enc.encode_ordinary, enc.n_vocab, {'eot_token': enc.eot_token}
    from lab import hf_tokenizer  # a pretrained model's own tokenizer: the lab's (and transformers')
    return hf_tokenizer.data_tokenizer(name)


def write(out, train_ids, val_ids, source, tokenizer_name, vocab_size, extra):
    if len(train_ids) < 2 or len(val_ids) < 2:  # train.py needs at least one (input, target) pair per split
        raise UserError(f"{source} gives {len(train_ids)} training and {len(val_ids)} validation tokens: too little "
                        f"text to train on (an empty file?)")
    dtype = 'uint16' if vocab_size <= 65536 else 'uint32'  # uint32: pretrained vocabularies (Gemma 3: 262k)
    # write_bytes, not tofile: a full disk is then an OSError with its errno, not numpy's bare short-write message
    (out / 'train.bin').write_bytes(np.array(train_ids, dtype=dtype).tobytes())
    (out / 'val.bin').write_bytes(np.array(val_ids, dtype=dtype).tobytes())
    meta = dict(tokenizer=tokenizer_name if tokenizer_name in ('char', 'gpt2') else 'hf', vocab_size=vocab_size,
                train_tokens=len(train_ids), val_tokens=len(val_ids), source=source, dtype=dtype, **extra)
    (out / 'meta.json').write_text(json.dumps(meta, indent=1) + '\n')


def shakespeare(input_path):
    """(train, val, source): nanoGPT's split, the first 90% of the characters train, the rest validate."""
    if input_path:
        text = read_utf8(Path(input_path))
    else:
        data = SHAKESPEARE.read_bytes() if SHAKESPEARE.is_file() else b''
        if hashlib.sha256(data).hexdigest() != SHAKESPEARE_SHA256:
            what = 'missing' if not SHAKESPEARE.is_file() else 'not the shipped Tiny Shakespeare (its SHA-256 differs)'
            raise UserError(f"{SHAKESPEARE} is {what}: restore it with `git checkout -- data/tinyshakespeare.txt`, "
                            f"or pass a copy with --input PATH")
        text = data.decode('utf-8')
    split = int(len(text) * 0.9)
    return text[:split], text[split:], input_path or 'data/tinyshakespeare.txt'


def wikitext2(input_path):
    """(train, val, source): WikiText-2 (raw) at Tiny Shakespeare's size, the CPU studies' second corpus: the
    validation split (1.15M characters) trains, the test split (1.29M) validates (left out: the 10.9M train split,
    which an offline copy lacks). From `datasets`, or --input's wiki.valid.raw and wiki.test.raw."""
    if input_path:
        files = [Path(input_path) / f'wiki.{split}.raw' for split in ('valid', 'test')]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise UserError(f"--input {input_path}: expected a folder with wiki.valid.raw and wiki.test.raw, "
                            f"missing {', '.join(missing)}")
        return *map(read_utf8, files), input_path
    from datasets import load_dataset
    try:  # one row per line, each ending in a newline: joined, the rows are the raw files
        return *(''.join(load_dataset('wikitext', 'wikitext-2-raw-v1', split=split)['text'])
                 for split in ('validation', 'test')), 'wikitext/wikitext-2-raw-v1 (datasets)'
    except Exception as e:
        raise UserError(f"cannot load WikiText-2 through datasets ({type(e).__name__}); pass a folder with "
                        f"wiki.valid.raw and wiki.test.raw with --input DIR") from None


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
                                    f"not text")
        else:
            documents.append(read_utf8(path))
    return documents


def prepare_text(out, args):
    """Your own files, concatenated in order (an end-of-text token after each), the last val_fraction validating."""
    documents = read_documents(args.input, args.text_field)
    encode, vocab_size, extra = tokenizer(args.tokenizer, documents)
    end = [extra['eot_token']] if 'eot_token' in extra else []  # none for characters
    if args.tokenizer != 'char':  # a pretrained model's tokenizer adds its own 'tokenizing' bar, line by line
        documents = tqdm(documents, desc='tokenizing' if args.tokenizer == 'gpt2' else 'documents', unit='doc')
    ids = [i for doc in documents for i in encode(doc) + end]
    split = int(len(ids) * (1 - args.val_fraction))
    write(out, ids[:split], ids[split:], str(args.input), args.tokenizer, vocab_size, extra)


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
            (own_tokenizer and args.dataset not in ('shakespeare', 'wikitext2', 'text'),
             f"--tokenizer={args.tokenizer}: a pretrained model's tokenizer prepares shakespeare, wikitext2 and text "
             f"({args.dataset} takes gpt2)"),
            (args.tokenizer == 'char' and args.dataset != 'text',
             f"--tokenizer=char is for text; {args.dataset} has its own _char dataset")):
        if wrong:
            raise UserError(message)
    name = args.name or (Path(args.input).stem if args.dataset == 'text' else args.dataset)
    if own_tokenizer and not args.name:  # beside the GPT-2 one, never over it
        name += '_' + Path(args.tokenizer).name.removesuffix('.gguf')
    final = Path(args.data_root) / name
    with atomic_output_dir(final) as out:
        if args.dataset == 'text':
            prepare_text(out, args)
        elif args.dataset == 'openwebtext':
            from lab import openwebtext  # parquet from the hub and worker processes: a job of its own, for a GPU
            openwebtext.prepare(out, args.input, args.num_proc)
        else:
            corpus = args.dataset.removesuffix('_char')
            train, val, source = (shakespeare if corpus == 'shakespeare' else wikitext2)(args.input)
            tokenizer_name = 'char' if args.dataset.endswith('_char') else args.tokenizer
            encode, vocab_size, extra = tokenizer(tokenizer_name, (train, val))
            if 'tokenizer_source' in extra:  # a tokenizer mismatch names the corpus to prepare again
                extra = {'dataset': corpus, **extra}
            write(out, encode(train), encode(val), source, tokenizer_name, vocab_size, extra)
    meta = json.loads((final / 'meta.json').read_text())
    print(f"wrote {final}: " + ', '.join(f"{k}={v}" for k, v in meta.items() if k != 'itos'))


if __name__ == '__main__':
    main_guard(main)
