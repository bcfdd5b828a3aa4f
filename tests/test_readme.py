"""README.md and docs/*.md: every command names a script and config files that exist and passes train.py,
sample.py and lab/sweep.py only keys (and value types) they take; every relative link and image points to a file that
exists, and every #anchor to a heading there. Cheap (no command is run): what running them would catch first."""

import re
import shlex
from pathlib import Path

import pytest

from common import UserError, parse_config

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / 'README.md', *sorted((REPO / 'docs').glob('*.md')), *sorted((REPO / 'docs').glob('*/*.md'))]
CONFIGURED = ('train.py', 'sample.py', 'lab/sweep.py')  # the scripts that take nanoGPT's --key=value configurator


def defaults_of(script):
    """The script's own DEFAULTS, imported (not re-parsed), so keys it builds at import time count too."""
    import importlib
    return importlib.import_module(script[:-3].replace('/', '.')).DEFAULTS


def prose(text):
    """The page without HTML comments (placeholders for work not landed yet may name commands that don't exist) and
    without a plan's verbatim text (docs/plans/: the commands and links of its commit, written from its folder)."""
    text = re.sub(r'<!-- verbatim: .*?<!-- end verbatim -->', '', text, flags=re.S)
    return re.sub(r'<!--.*?-->', '', text, flags=re.S)


def commands(text):
    """Command lines of a page: each line of a fenced block (backslash continuations joined, # comments and
    `&&`, `|`, `;` split off) and each inline code span (which may wrap across lines)."""
    text = prose(text)
    fence = r'^[ \t]*```[^\n]*\n(.*?)^[ \t]*```'  # indented too: a fenced block inside a list item
    lines = []
    for block in re.findall(fence, text, flags=re.S | re.M):
        lines += [re.sub(r'\s#\s.*$', '', line) for line in block.replace('\\\n', ' ').splitlines()]
    inline = re.sub(fence, '', text, flags=re.S | re.M)
    lines += [span.replace('\n', ' ') for span in re.findall(r'`([^`]+)`', inline)]
    return [c.strip() for line in lines for c in re.split(r'&&|\|\s|;', line) if c.strip()]


def tokens_of(command):
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in prose
        return command.split()


def script_call(tokens):
    """(script, its arguments, whether it is run with python/torchrun) of a command, or None."""
    if not tokens:
        return None
    if tokens[0] in ('python', 'python3') and len(tokens) > 2 and tokens[1] == '-m' and tokens[2].startswith('lab.'):
        return tokens[2].replace('.', '/') + '.py', tokens[3:], True  # a lab tool: python -m lab.walk is lab/walk.py
    if tokens[0] in ('python', 'python3') and len(tokens) > 1 and tokens[1].endswith('.py'):
        return tokens[1], tokens[2:], True
    if tokens[0] == 'torchrun':
        scripts = [i for i, t in enumerate(tokens) if t.endswith('.py')]
        return (tokens[scripts[0]], tokens[scripts[0] + 1:], True) if scripts else None
    if tokens[0] in CONFIGURED:  # `train.py --walk_interval=N` in prose: keys still count, the file is not run
        return tokens[0], tokens[1:], False
    return None


def configured_args(args):
    """The config files and --key=value overrides of a configurator command (what parse_config reads)."""
    return [a for a in args if re.fullmatch(r'--\w+=.*', a) or re.fullmatch(r'configs/[\w.-]+\.py', a)]


def problems_in_commands(text, repo=REPO):
    problems = []
    for command in commands(text):
        call = script_call(tokens_of(command))
        if call is None:
            continue
        script, args, runs = call
        if runs and not (repo / script).is_file():
            problems.append(f"{command!r}: no script {script}")
            continue
        if runs and script.startswith('lab/') and '-m' not in command.split():  # its imports need the root on the path
            problems.append(f"{command!r}: a lab tool runs as python -m {script[:-3].replace('/', '.')}")
            continue
        if script not in CONFIGURED:
            continue
        own, passed = (args[:args.index('--')], args[args.index('--') + 1:]) if '--' in args else (args, [])
        for name, part in ((script, own), ('train.py', passed)):
            if not runs:  # a mention in prose may hold a placeholder value (--walk_interval=N): keys only
                problems += [f"{command!r}: {name} has no key {key!r}" for key in re.findall(r'--(\w+)=', ' '.join(part))
                             if key not in defaults_of(name)]
                continue
            try:  # what the script itself does first: keys, value types, config files
                parse_config(defaults_of(name), configured_args(part), optional=('top_k',))
            except UserError as e:
                problems.append(f"{command!r}: {e}")
    for config in sorted(set(re.findall(r'configs/[\w.-]+\.py', prose(text)))):
        if not (repo / config).is_file():
            problems.append(f"no config file {config}")
    return problems


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, _ and - kept), spaces to -."""
    return re.sub(r'[^\w\- ]', '', heading.strip().lower().replace('`', '')).replace(' ', '-')


def anchors(path):
    text = re.sub(r'^[ \t]*```.*?^[ \t]*```', '', path.read_text(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r'^#+ (.+)$', text, flags=re.M)}


def problems_in_links(text, page):
    problems = []
    for target in re.findall(r'\]\(([^)\s]+)\)', prose(text)):
        if re.match(r'[a-z]+:', target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition('#')
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            problems.append(f"{page.name}: link to {target}: no such file")
        elif anchor and path.suffix == '.md' and anchor not in anchors(path):
            problems.append(f"{page.name}: link to {target}: no such heading")
    return problems


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.name)
def test_every_command_names_scripts_configs_and_keys_that_exist(page):
    assert problems_in_commands(page.read_text()) == []


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_image_points_to_something_that_exists(page):
    assert problems_in_links(page.read_text(), page) == []


def test_the_checks_catch_a_page_with_one_mistake_of_each_kind(tmp_path):
    page = tmp_path / 'page.md'
    text = """
```bash
python train.py configs/shakespeare_char.py --n_layr=4           # a typo in a key
python -m lab.sweep --study=claims -- --max_iter=10 && python nothere.py
python lab/walk.py gpt2                                             # a lab tool by its file: its imports fail
python -m lab.nothere
```
Inline: `python sample.py --out_dir=out --top_k=many` and `python train.py configs/missing.py`;
`lab/sweep.py --seeds=N` in prose may hold a placeholder, `train.py --walk_intervall=N` not a wrong key.
<!-- `python future.py` in a placeholder is not a command yet -->
[a link](nowhere.md), ![a figure](docs/none.png), [a heading](#not-here)
# A heading
[fine](#a-heading)
"""
    page.write_text(text)
    problems = problems_in_commands(text) + problems_in_links(text, page)
    assert any("n_layr" in p for p in problems)
    assert any("max_iter" in p for p in problems)       # train.py's keys after lab/sweep.py's `--`
    assert any("nothere.py" in p for p in problems) and any("lab/nothere.py" in p for p in problems)
    assert any("python -m lab.walk" in p for p in problems)
    assert any("top_k" in p for p in problems)          # a value of the wrong type
    assert any("configs/missing.py" in p for p in problems)
    assert any("nowhere.md" in p for p in problems) and any("none.png" in p for p in problems)
    assert any("#not-here" in p for p in problems)
    assert any("walk_intervall" in p for p in problems) and not any("seeds" in p for p in problems)
    assert not any("future.py" in p or "#a-heading" in p for p in problems)
    assert len(problems) == 12, problems  # configs/missing.py: once for the command, once as a named file


def test_github_anchors_keep_letters_digits_underscores_and_hyphens():
    assert slug("(d) fixed γ inside the corridor, δ = 1 (`--study=fixed_gamma`)") == \
        "d-fixed-γ-inside-the-corridor-δ--1---studyfixed_gamma"
    assert slug("Reproduce on one GPU") == "reproduce-on-one-gpu"


def test_the_quick_tier_names_tests_that_exist():
    """A renamed test would drop out of `pytest -m quick` silently: every name in conftest.QUICK is defined."""
    from conftest import QUICK
    for file, names in QUICK.items():
        source = (Path(__file__).parent / file).read_text()
        for name in names:
            assert re.search(rf'^def {name}\(', source, re.M), f"{file} has no {name}"


def test_every_mutant_of_the_mutation_check_still_finds_its_snippet_once():
    """tests/mutants.py is not collected by pytest; this keeps its list from rotting between runs of it: a refactor
    that moves a snippet fails here, in CI, not at the next mutation run."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('mutants', Path(__file__).parent / 'mutants.py')
    mutants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutants)
    repo = Path(__file__).parents[1]
    counts = {m.name: (repo / m.file).read_text().count(m.original) for m in mutants.MUTANTS}
    assert counts and all(n == 1 for n in counts.values()), {k: n for k, n in counts.items() if n != 1}


def unsupported_numbers(readme, root=REPO):
    """The decimals of each README paragraph (or list item) that links docs pages and that none of those pages
    contains: a number the README repeats from a page must be the page's (signs aside: − and - vary)."""
    text = re.sub(r'^[ \t]*```.*?^[ \t]*```', '', prose(readme), flags=re.S | re.M)
    problems = []
    for paragraph in re.split(r'\n\s*\n|\n(?=- )', text):
        pages = {t for t in re.findall(r'\]\((docs/[^)#\s]+\.md)', paragraph)}
        if not pages:
            continue
        sources = ''.join((root / page).read_text() for page in pages)
        problems += [f"{number} (beside {', '.join(sorted(pages))})" for number in re.findall(r'\d+\.\d+', paragraph)
                     if number not in sources]
    return problems


def test_every_number_the_readme_repeats_from_a_page_agrees_with_it():
    assert unsupported_numbers((REPO / 'README.md').read_text()) == []


def test_the_number_check_catches_a_number_its_page_does_not_have(tmp_path):
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 'a.md').write_text('the gain is −0.0031 [−0.0046, −0.0016]\n')
    readme = ("Intro 0.25 with no link.\n\n- (a) −0.0031 [−0.0046, −0.0016] ([docs/a.md](docs/a.md))\n"
              "- (b) +0.0030 ([docs/a.md](docs/a.md))\n\n```\n9.99 in code\n```\n")
    assert unsupported_numbers(readme, tmp_path) == ['0.0030 (beside docs/a.md)']
