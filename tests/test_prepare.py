"""prepare.py: token files, meta.json, splits, atomic output, one-line errors."""

import hashlib
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import prepare
from sources import tokenizer_from_meta
from conftest import (SHAKESPEARE, WIKITEXT_TEST, assert_one_line_error, needs_tokenizer,
                      needs_wikitext, run_script, synthetic_text)


def read_prepared(folder):
    meta = json.loads((folder / 'meta.json').read_text())
    train = np.fromfile(folder / 'train.bin', dtype=np.uint16)
    val = np.fromfile(folder / 'val.bin', dtype=np.uint16)
    return meta, train, val


def test_text_char_level_round_trips_with_a_90_10_split(tmp_path):
    text = synthetic_text(200)
    (tmp_path / 'story.txt').write_text(text)
    result = run_script('prepare.py', 'text', '--input', tmp_path / 'story.txt', '--tokenizer', 'char',
                        '--data_root', tmp_path / 'data', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    meta, train, val = read_prepared(tmp_path / 'data' / 'story')
    assert meta['tokenizer'] == 'char' and meta['vocab_size'] == len(set(text)) == len(meta['itos'])
    assert (meta['train_tokens'], meta['val_tokens']) == (len(train), len(val))
    assert len(train) == int(len(text) * 0.9) and len(train) + len(val) == len(text)
    encode, decode = tokenizer_from_meta(meta)
    assert decode(train.tolist()) + decode(val.tolist()) == text
    assert encode(text[:50]) == train[:50].tolist()


@needs_tokenizer
def test_text_gpt2_jsonl_puts_an_end_of_text_token_after_each_document(tmp_path):
    docs = ['First document.', 'Second one, a bit longer.', 'Third.']
    (tmp_path / 'docs.jsonl').write_text(''.join(json.dumps({'body': d}) + '\n' for d in docs))
    result = run_script('prepare.py', 'text', '--input', tmp_path / 'docs.jsonl', '--text_field', 'body',
                        '--val_fraction', '0.2', '--data_root', tmp_path / 'data', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    meta, train, val = read_prepared(tmp_path / 'data' / 'docs')
    assert meta['tokenizer'] == 'gpt2' and meta['vocab_size'] == 50257
    ids = train.tolist() + val.tolist()
    assert ids.count(50256) == 3 and ids[-1] == 50256
    _, decode = tokenizer_from_meta(meta)
    assert decode(ids) == '<|endoftext|>'.join(docs) + '<|endoftext|>'


def test_shakespeare_char_from_the_shipped_copy_matches_nanogpt_counts(tmp_path):
    """No --input and no network: the copy in data/ is read (its checksum checked) and split as nanoGPT splits it."""
    result = run_script('prepare.py', 'shakespeare_char', '--data_root', tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    meta, train, val = read_prepared(tmp_path / 'shakespeare_char')
    assert (meta['vocab_size'], len(train), len(val)) == (65, 1_003_854, 111_540)
    assert meta['source'] == 'data/tinyshakespeare.txt'
    _, decode = tokenizer_from_meta(meta)
    assert decode(train[:14].tolist()) == 'First Citizen:'


def test_a_local_copy_given_with_input_is_read_instead_of_the_shipped_one(tmp_path):
    (tmp_path / 'mine.txt').write_text('to be or not to be\n' * 50)
    result = run_script('prepare.py', 'shakespeare_char', '--input', tmp_path / 'mine.txt', '--data_root', tmp_path,
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    meta, train, val = read_prepared(tmp_path / 'shakespeare_char')
    assert meta['vocab_size'] == len(set('to be or not to be\n')) and len(train) + len(val) == 19 * 50


@needs_tokenizer
def test_shakespeare_bpe_matches_nanogpt_counts(tmp_path):
    result = run_script('prepare.py', 'shakespeare', '--input', SHAKESPEARE, '--data_root', tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    meta, train, val = read_prepared(tmp_path / 'shakespeare')
    assert (meta['vocab_size'], len(train), len(val)) == (50257, 301_966, 36_059)


@needs_tokenizer
def test_openwebtext_pipeline_on_local_parquet(tmp_path):
    """The real OpenWebText code path (datasets, split, batched BPE, sharded memmap writes) on a small local
    parquet file standing in for the hub download."""
    pa = pytest.importorskip('pyarrow')
    import pyarrow.parquet as pq
    import tiktoken
    docs = [f"Document number {i}: " + synthetic_text(3, seed=i) for i in range(4000)]
    pq.write_table(pa.table({'text': docs}), tmp_path / 'owt.parquet')
    result = run_script('prepare.py', 'openwebtext', '--input', tmp_path / 'owt.parquet', '--num_proc', '1',
                        '--data_root', tmp_path / 'data', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'source: local parquet' in result.stdout
    meta, train, val = read_prepared(tmp_path / 'data' / 'openwebtext')
    assert meta['documents'] == 4000 and meta['source'].startswith('local:')
    enc = tiktoken.get_encoding('gpt2')
    expected = sum(len(enc.encode_ordinary(d)) + 1 for d in docs)
    assert len(train) + len(val) == expected
    assert list(train).count(50256) == 3998 and list(val).count(50256) == 2  # 0.0005 of 4000 documents
    text = enc.decode(val.tolist())
    assert all(piece[len('Document number '):].split(':')[0].isdigit()
               for piece in text.split('<|endoftext|>')[:-1])


@needs_tokenizer
def test_openwebtext_states_its_peak_disk_first_and_stays_within_it(tmp_path, monkeypatch, capsys):
    """Several parquet files of several row groups, two workers: the plan is printed before the work, the output
    folder's measured peak (the .bin files and the shards on disk together) stays under it, the shards are gone, and
    the token files are exactly the documents' ids in order."""
    pa = pytest.importorskip('pyarrow')
    import pyarrow.parquet as pq
    import tiktoken
    docs = [f"Document {i}. " + synthetic_text(20, seed=i) for i in range(300)]
    (tmp_path / 'owt').mkdir()
    for k in range(3):
        pq.write_table(pa.table({'text': docs[k * 100:(k + 1) * 100]}), tmp_path / 'owt' / f'{k}.parquet',
                       row_group_size=25)
    monkeypatch.setattr(sys, 'argv', ['prepare.py', 'openwebtext', '--input', str(tmp_path / 'owt'), '--num_proc',
                                      '2', '--data_root', str(tmp_path / 'data')])
    prepare.main()
    out = capsys.readouterr().out
    assert out.index('disk: ') < out.index('peak disk used')
    planned = float(out.split('needs about ')[1].split(' MB')[0]) * 1e6
    meta, train, val = read_prepared(tmp_path / 'data' / 'openwebtext')
    assert 0 < meta['peak_disk_bytes'] <= planned
    assert meta['peak_disk_bytes'] >= (len(train) + len(val)) * 2  # the final files were on disk at the end
    assert sorted(p.name for p in (tmp_path / 'data' / 'openwebtext').iterdir()) == ['meta.json', 'train.bin', 'val.bin']
    enc = tiktoken.get_encoding('gpt2')
    ids = [enc.encode_ordinary(d) + [50256] for d in docs]
    val_docs = [i for i, d in enumerate(docs) if enc.encode_ordinary(d)[:3] == val.tolist()[:3]]
    assert len(val_docs) == 1 and val.tolist() == ids[val_docs[0]]  # ceil(0.0005 × 300) = 1 document validates
    assert train.tolist() == [t for i, doc in enumerate(ids) if i != val_docs[0] for t in doc]


@needs_tokenizer
def test_openwebtext_refuses_a_disk_too_small_in_one_line(tmp_path, monkeypatch):
    pa = pytest.importorskip('pyarrow')
    import pyarrow.parquet as pq
    pq.write_table(pa.table({'text': [synthetic_text(50, seed=i) for i in range(20)]}), tmp_path / 'owt.parquet')
    monkeypatch.setattr('shutil.disk_usage', lambda path: SimpleNamespace(free=10_000))
    monkeypatch.setattr(sys, 'argv', ['prepare.py', 'openwebtext', '--input', str(tmp_path / 'owt.parquet'),
                                      '--data_root', str(tmp_path / 'data')])
    with pytest.raises(prepare.UserError, match=r'has 0.0 MB free, and the prepared corpus needs about'):
        prepare.main()
    assert not (tmp_path / 'data' / 'openwebtext').exists()


def test_an_interrupted_prepare_leaves_no_complete_looking_output(tmp_path, monkeypatch):
    (tmp_path / 'a.txt').write_text(synthetic_text(100))
    argv = ['prepare.py', 'text', '--input', str(tmp_path / 'a.txt'), '--tokenizer', 'char',
            '--data_root', str(tmp_path / 'data'), '--name', 'corpus']
    monkeypatch.setattr(sys, 'argv', argv)
    prepare.main()  # a complete earlier output
    before = {p.name: p.read_bytes() for p in (tmp_path / 'data' / 'corpus').iterdir()}

    write_text = prepare.Path.write_text

    def crash(path, *args, **kwargs):  # dies after train.bin and val.bin were written, at meta.json
        if path.name == 'meta.json':
            raise KeyboardInterrupt
        return write_text(path, *args, **kwargs)
    monkeypatch.setattr(prepare.Path, 'write_text', crash)
    (tmp_path / 'a.txt').write_text(synthetic_text(300, seed=5))
    with pytest.raises(KeyboardInterrupt):
        prepare.main()
    assert sorted(p.name for p in (tmp_path / 'data').iterdir()) == ['corpus']  # no partial folder left behind
    assert {p.name: p.read_bytes() for p in (tmp_path / 'data' / 'corpus').iterdir()} == before

    monkeypatch.setattr(sys, 'argv', [*argv[:-1], 'fresh'])
    with pytest.raises(KeyboardInterrupt):
        prepare.main()
    assert not (tmp_path / 'data' / 'fresh').exists()


@pytest.mark.parametrize('args,message', [
    (['text'], 'needs --input'),
    (['text', '--input', 'nowhere.txt'], '--input nowhere.txt does not exist'),
    (['shakespeare_char', '--input', 'nowhere.txt'], '--input nowhere.txt does not exist'),
    (['text', '--input', 'x.txt', '--val_fraction', '1.5'], '--val_fraction must be in (0, 1)'),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    assert_one_line_error(run_script('prepare.py', *args, cwd=tmp_path), message)
    assert not (tmp_path / 'data').exists()


@pytest.mark.parametrize('damage', ['one byte changed', 'missing'])
def test_a_damaged_or_missing_shipped_copy_is_one_line_naming_how_to_restore_it(tmp_path, monkeypatch, capsys, damage):
    copy = tmp_path / 'tinyshakespeare.txt'
    if damage != 'missing':
        text = bytearray(SHAKESPEARE.read_bytes())
        text[1000] ^= 1  # one bit of one byte: the checksum, not the length, must catch it
        copy.write_bytes(bytes(text))
    monkeypatch.setattr(prepare, 'SHAKESPEARE', copy)
    out = tmp_path / 'data'
    monkeypatch.setattr(sys, 'argv', ['prepare.py', 'shakespeare_char', '--data_root', str(out)])
    with pytest.raises(SystemExit) as exit_:
        prepare.main_guard(prepare.main)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert 'git checkout -- data/tinyshakespeare.txt' in err and ('.txt is missing' in err) == (damage == 'missing')
    assert not out.exists() or list(out.iterdir()) == []


def test_the_shipped_copy_is_the_known_tiny_shakespeare():
    assert hashlib.sha256(SHAKESPEARE.read_bytes()).hexdigest() == prepare.SHAKESPEARE_SHA256
    train, val, source = prepare.shakespeare(None)
    assert train.startswith('First Citizen:') and source == 'data/tinyshakespeare.txt'


@pytest.mark.parametrize('text', ['', 'ab'])
def test_a_file_with_too_little_text_is_one_line_and_writes_nothing(tmp_path, text):
    (tmp_path / 'empty.txt').write_text(text)
    result = run_script('prepare.py', 'text', '--input', tmp_path / 'empty.txt', '--tokenizer', 'char', cwd=tmp_path)
    assert_one_line_error(result, 'too little text to train on')
    assert not (tmp_path / 'data').exists() or not any((tmp_path / 'data').iterdir())


@needs_wikitext
@pytest.mark.parametrize('dataset,counts', [('wikitext2_char', (1_144_748, 1_288_556)),
                                            pytest.param('wikitext2', (249_887, 286_221), marks=needs_tokenizer)])
def test_wikitext2_trains_on_the_validation_split_and_validates_on_the_test_split(tmp_path, dataset, counts):
    result = run_script('prepare.py', dataset, '--input', WIKITEXT_TEST.parent, '--data_root', tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    meta = json.loads((tmp_path / dataset / 'meta.json').read_text())
    assert (meta['train_tokens'], meta['val_tokens']) == counts  # the shared copy's README gives the BPE counts
    assert (tmp_path / dataset / 'train.bin').stat().st_size == 2 * counts[0]
    if dataset == 'wikitext2_char':  # every character of either split is in the vocabulary
        assert meta['vocab_size'] == len(set((WIKITEXT_TEST.parent / 'wiki.valid.raw').read_text(encoding='utf-8')
                                             + WIKITEXT_TEST.read_text(encoding='utf-8')))


def test_jsonl_without_the_text_field_is_one_line(tmp_path):
    (tmp_path / 'd.jsonl').write_text('{"body": "x"}\n')
    assert_one_line_error(run_script('prepare.py', 'text', '--input', tmp_path / 'd.jsonl', '--tokenizer', 'char',
                                     cwd=tmp_path), "d.jsonl:1: not a JSON object with a 'text' field")
