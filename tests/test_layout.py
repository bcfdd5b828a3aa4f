"""The repo's shape: the brief's scripts at the top (with common.py and two support modules, nanoGPT's size), the
research tools in lab/, the core never importing the lab when it loads, no import circle (lazy imports counted), and
every lab tool answering at its documented command (python -m lab.<tool>)."""

import ast
import subprocess
import sys

import pytest

from conftest import REPO, run_script

CORE = {'model', 'train', 'prepare', 'sample', 'analyze', 'common', 'run', 'sources'}
TOOLS = ('walk', 'probe', 'bench', 'sweep')  # the lab modules with a command line


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
            if node.module == 'lab':  # from lab import hf
                names |= {f'lab.{a.name}' for a in node.names}
    return names


def import_graph(lazy=False):
    files = {p.stem: p for p in REPO.glob('*.py')} | {f'lab.{p.stem}': p for p in (REPO / 'lab').glob('*.py')
                                                       if p.stem != '__init__'}
    return {name: {m for m in module_imports(path, lazy) if m in files} for name, path in files.items()}


def test_the_top_level_is_the_briefs_scripts_and_the_research_tools_are_in_lab():
    assert {p.stem for p in REPO.glob('*.py')} == CORE
    lines = {p.name: len(p.read_text().splitlines()) for p in REPO.glob('*.py')}
    assert sum(lines.values()) <= 2200 and lines['model.py'] <= 350 and lines['train.py'] <= 400, lines
    assert {p.stem for p in (REPO / 'lab').glob('*.py')} >= {'__init__', *TOOLS, 'connection', 'hf', 'stats'}


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
    circle (as common.py's lazy import of lab/hf.py once did)."""
    graph = import_graph(lazy=True)
    assert 'common' in graph['lab.hf'] and 'lab.hf' in graph['sources']  # sources.py reaches lab/hf.py lazily
    graph['common'] = graph['common'] | {'lab.hf'}
    assert find_cycle(graph) in (['common', 'lab.hf', 'common'], ['lab.hf', 'common', 'lab.hf'])


def no_function_over(path, limit):
    tree = ast.parse(path.read_text())
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > limit}


def test_train_py_reads_top_to_bottom_in_functions_of_a_screen_or_two():
    assert no_function_over(REPO / 'train.py', 80) == {}


@pytest.mark.parametrize('command', [f'lab.{tool}' for tool in TOOLS] + ['train.py', 'sample.py'])
def test_every_command_answers_help_at_its_documented_place(command, tmp_path):
    """From any folder: argparse's usage, or for the configurator's scripts their docstring and every key."""
    result = run_script(command, '--help', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'usage' in result.stdout.lower() or ('python' in result.stdout and 'seed=' in result.stdout), result.stdout
