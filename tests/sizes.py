"""
The core's size, as the project watches it (targets, never a failing test: a user who adds a line breaks nothing).

    python tests/sizes.py

Per top-level script: its lines, its lines over 100 characters, and the target where there is one; then the total
against the eight files' target. nanoGPT's model.py and train.py, for scale: about 330 lines each, 17 and 11 lines
over 100 characters.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = ('model.py', 'train.py', 'prepare.py', 'sample.py', 'analyze.py', 'run.py', 'sources.py', 'common.py')
TARGETS = {'model.py': 350, 'train.py': 400}
TOTAL_TARGET = 2200


def main():
    total = 0
    print(f"{'file':<12} {'lines':>6} {'>100 chars':>11}  target")
    for name in CORE:
        lines = (REPO / name).read_text(encoding='utf-8').splitlines()
        total += len(lines)
        long = sum(len(line) > 100 for line in lines)
        target = TARGETS.get(name)
        mark = '' if target is None else f"{target}{'  (over)' if len(lines) > target else ''}"
        print(f"{name:<12} {len(lines):>6} {long:>11}  {mark}")
    print(f"{'total':<12} {total:>6} {'':>11}  {TOTAL_TARGET}{'  (over)' if total > TOTAL_TARGET else ''}")


if __name__ == '__main__':
    main()
