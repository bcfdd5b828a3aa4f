"""The repo's shape: the brief's scripts at the top (with common.py and two support modules), the research tools in
lab/, the core never importing the lab when it loads, no import circle (lazy imports counted), and every lab tool
answering at its documented command (python -m lab.<tool>). Sizes are a goal the maintainers watch, not a test a
hacker's added line fails: test_file_sizes prints them (pytest -s) and asserts nothing about them."""

import ast
import subprocess
import sys

import pytest

from conftest import REPO, run_script

CORE = {'model', 'train', 'prepare', 'sample', 'analyze', 'common', 'run', 'sources'}
TOOLS = ('walk', 'probe', 'bench', 'selfcheck', 'sweep')  # the lab modules with a command line


def module_imports(path, lazy=False):
    """The repo modules a file imports when it loads: top-level import statements only (an import inside a function
    runs when the function does, which is how the core reaches the lab lazily); with lazy, those too."""
    names = set()
    tree = ast.parse(path.read_text())
    for node in (ast.walk(tree) if lazy else tree.body):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == 'lab':  # from lab import pretrained
                names |= {f'lab.{a.name}' for a in node.names}
    return names


def import_graph(lazy=False):
    files = {p.stem: p for p in REPO.glob('*.py')} | {f'lab.{p.stem}': p for p in (REPO / 'lab').glob('*.py')
                                                       if p.stem != '__init__'}
    return {name: {m for m in module_imports(path, lazy) if m in files} for name, path in files.items()}


def test_the_top_level_is_the_briefs_scripts_and_the_research_tools_are_in_lab():
    assert {p.stem for p in REPO.glob('*.py')} == CORE
    assert {p.stem for p in (REPO / 'lab').glob('*.py')} >= {'__init__', *TOOLS, 'connection', 'pretrained', 'stats'}


def find_cycle(graph):
    """A circle of imports in graph ({module: modules it imports}) as [a, b, ..., a], or None."""
    def walk(node, path):
        for nxt in sorted(graph[node]):
            found = path[path.index(nxt):] + [nxt] if nxt in path else walk(nxt, path + [nxt])
            if found:
                return found
        return None
    return next((c for c in map(lambda n: walk(n, [n]), graph) if c), None)


def test_the_core_imports_nothing_of_the_lab_when_it_loads_and_nothing_imports_in_a_circle():
    graph = import_graph()
    assert {(a, b) for a in CORE for b in graph[a] if b.startswith('lab')} == set()
    assert find_cycle(graph) is None
    assert find_cycle(import_graph(lazy=True)) is None  # the lazy imports too: no module reaches back into its caller
    # and as Python sees it: loading every core script leaves the lab, and the lab's own dependencies, unloaded
    loaded = subprocess.run([sys.executable, '-c', 'import sys, model, common, train, prepare, sample, analyze; '
                             'print(sorted({m.split(".")[0] for m in sys.modules} & {"lab", "scipy", "transformers"}))'],
                            cwd=REPO, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == '[]'


def test_the_cycle_check_finds_a_circle():
    """The check above is not vacuous: the lab imports the core, so an import back, even a lazy one, would close a
    circle (as common.py's lazy import of the lab's pretrained-model code once did)."""
    graph = import_graph(lazy=True)
    assert 'common' in graph['lab.pretrained'] and 'lab.pretrained' in graph['sources']  # reached lazily
    graph['common'] = graph['common'] | {'lab.pretrained'}
    assert find_cycle(graph) in (['common', 'lab.pretrained', 'common'], ['lab.pretrained', 'common', 'lab.pretrained'])


def test_file_sizes():
    """Lines per file, printed (pytest -s): the top level near nanoGPT's size (model.py about 350) is a target to
    watch, never a failure, so adding a form or a diagnostic passes."""
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
             for p in sorted([*REPO.glob('*.py'), *(REPO / 'lab').glob('*.py')])}
    top = sum(n for name, n in lines.items() if '/' not in name)
    longest = max(function_lengths(REPO / 'train.py').items(), key=lambda item: item[1])
    print('\n' + '\n'.join(f'{n:6d}  {name}' for name, n in lines.items()) + f'\n{top:6d}  top level in all'
          f'\n{longest[1]:6d}  train.py\'s longest function, {longest[0]} (a screen or two reads top to bottom)')
    assert lines['model.py'] > 0


def function_lengths(path):
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize('command', [f'lab.{tool}' for tool in TOOLS] + ['train.py', 'sample.py'])
def test_every_command_answers_help_at_its_documented_place(command, tmp_path):
    """From any folder: argparse's usage, or for the configurator's scripts their docstring and every key."""
    result = run_script(command, '--help', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'usage' in result.stdout.lower() or ('python' in result.stdout and 'seed=' in result.stdout), result.stdout
