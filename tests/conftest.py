"""Offline by default: the shared tiktoken cache when it exists, and no Hugging Face network calls."""

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / 'shared'  # ../shared beside the checkout, in CI and sessions
TIKTOKEN_CACHE = SHARED / 'tiktoken_cache'
SHAKESPEARE = SHARED / 'data' / 'tinyshakespeare.txt'
WIKITEXT_TEST = SHARED / 'data' / 'wikitext-2-raw' / 'wiki.test.raw'

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
if TIKTOKEN_CACHE.is_dir():
    os.environ.setdefault('TIKTOKEN_CACHE_DIR', str(TIKTOKEN_CACHE))

needs_tokenizer = pytest.mark.skipif(not TIKTOKEN_CACHE.is_dir(),
                                     reason=f"GPT-2 BPE needs the offline tiktoken cache {TIKTOKEN_CACHE}")
needs_shakespeare = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no local copy at {SHAKESPEARE}")
