"""
A pretrained source's own tokenizer, one job: loading it, fingerprinting its vocabulary (so data prepared with
another tokenizer is refused), and encoding text with it for prepare.py and sample.py (through sources.py).
"""

import contextlib
import json

from common import UserError
from lab.hf_sources import model_folder, quiet_transformers


def load_tokenizer(source, folder=None):
    """The tokenizer saved with a source (a GGUF file's is rebuilt once, in its cached folder)."""
    import transformers
    quiet_transformers()
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
