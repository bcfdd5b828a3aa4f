"""
--help's key list: each key's default and meaning, read from the comments beside the script's DEFAULTS and
GPTConfig's fields in model.py, so a key's meaning is written once, where its default is. common.parse_config
reaches it lazily, when a script gets -h or --help.
"""

import re
import sys
import textwrap

import model


def key_meanings(path, start):
    """{key: (heading, meaning)} from the `key=value,  # meaning` lines after the line matching `start` in a source
    file: a comment at the keys' indentation heads the keys below it, a deeper one continues the meaning above it."""
    with open(path, encoding='utf-8') as f:
        lines = f.read().splitlines()
    begin = next((n for n, line in enumerate(lines) if re.match(start, line)), len(lines)) + 1
    found, heading, key, indent = {}, None, None, None
    for line in lines[begin:]:
        if line.strip() and not line[0].isspace():
            break  # the block's end: its closing bracket, or the next top-level statement
        entry = re.match(r'^(\s+)(\w+)\s*(?::[^=#]*)?=(?!=)[^#]*(?:#\s*(.*))?$', line)
        comment = re.match(r'^(\s+)#\s*(.*)$', line)
        if re.match(r'^\s+\*\*\w+', line):  # **OTHER_DEFAULTS: its keys are under the heading above it
            found['**'], key = (heading, ''), None
        elif entry and indent in (None, len(entry[1])):
            indent, key = len(entry[1]), entry[2]
            found[key] = (heading, entry[3] or '')
        elif comment and indent is not None and len(comment[1]) == indent or comment and indent is None:
            heading, key = comment[2], None
        elif comment and key:
            found[key] = (found[key][0], f"{found[key][1]} {comment[2]}".strip())
    return found


def key_help(defaults, script):
    """--help's list of keys, grouped as the script's defaults are, each with its default and meaning (the model's
    keys' meanings from GPTConfig's comments)."""
    meanings = key_meanings(script, r'^DEFAULTS = dict\(') if script else {}
    model_meanings = key_meanings(model.__file__, r'^class GPTConfig')
    lines, heading = ["keys (config files' `key = value` lines, then --key=value), each with its default:"], None
    for key, value in defaults.items():
        group, meaning = meanings.get(key, (meanings.get('**', (heading,))[0], model_meanings.get(key, (None, ''))[1]))
        if group != heading and group:
            lines.append(f"\n{group}")
        heading = group or heading
        if key == 'operator':  # its choices read from the table, so a sixth form is listed with no second list
            meaning = f"{meaning.rstrip('.')}; the forms: {', '.join(model.OPERATORS)}"
        lines.append(textwrap.fill(meaning, 118, initial_indent=f"  {f'{key}={value!r}':<30} ",
                                   subsequent_indent=' ' * 33) if meaning else f"  {key}={value!r}")
    return '\n'.join(lines)


def script_help(defaults):
    """What -h / --help prints: the running script's docstring, then its keys."""
    main = sys.modules['__main__']
    return (main.__doc__ or '').strip() + '\n\n' + key_help(defaults, getattr(main, '__file__', None))
