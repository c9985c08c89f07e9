"""YAML to plain data that remembers where each key is, for ``file:line`` errors.

PyYAML's dicts forget their positions, so this loader builds dict and list subclasses that
keep the 1-based line of every mapping key and list item (from each node's ``start_mark``)
and the source text of plain scalars (so ``3.10`` can stay ``"3.10"`` and ``yes`` can be
named as written). It also refuses duplicate keys, which PyYAML resolves silently by keeping
the last one.
"""

from __future__ import annotations

from typing import Any

import yaml

from .model import InventoryError, too_long_number

_MERGE_TAG = "tag:yaml.org,2002:merge"
# values an inventory may expand to, aliases and merge keys counted at every use: far above
# any real cluster, far below what a few nested `<<: *a` (doubling per level) reach
MAX_VALUES = 100_000

# Fix hints for the PyYAML problems people hit most; matched by substring of ``problem``.
_HINTS = (
    ("mapping values are not allowed", "check indentation and quote values that contain ': '"),
    ("that cannot start any token", "indent with spaces (YAML does not allow tabs), and quote "
     "values that start with '@' or '`'"),
    ("could not find expected ':'", "every key needs a ':' after it; look for a missing ':' "
     "or an unclosed quote on this line or the one above"),
    ("end of stream", "a quote or bracket is not closed"),
    ("expected ',' or '}'", "inside { } quote values that contain braces, e.g. "
     "{K: \"${VAR}\"}"),
    ("expected a single document", "an inventory is one YAML document; remove the extra '---'"),
    ("expected <block end>", "check indentation: the keys of one mapping must line up"),
    ("did not find expected key", "check indentation: the keys of one mapping must line up"),
    ("did not find expected '-'", "check indentation: the items of one list must line up"),
    ("found undefined alias", "define the anchor (&name) before using it (*name)"),
    ("could not determine a constructor", "inventories are plain YAML; remove the '!' tag"),
)


class LineDict(dict):
    """A YAML mapping plus ``line`` (where it starts), ``key_lines`` and ``raw`` (the source
    text of each plain-scalar value)."""

    def __init__(self, line: int):
        super().__init__()
        self.line = line
        self.key_lines: dict[str, int] = {}
        self.raw: dict[str, str] = {}


class LineList(list):
    """A YAML sequence plus ``line`` (where it starts) and ``item_lines``."""

    def __init__(self, line: int):
        super().__init__()
        self.line = line
        self.item_lines: list[int] = []


class _TooBig(Exception):
    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


def _check_expansion(root: yaml.Node) -> None:
    """Raise _TooBig if ``root`` expands to more than MAX_VALUES values once every alias and
    merge key is replaced by what it names, or if an alias names a node it is inside of.
    Each node's expanded size is computed once, so this costs the size of the text."""
    sizes: dict[int, int] = {}
    inside: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in inside:
            raise _TooBig("an alias refers to the mapping or list it is in; inventories "
                          "cannot be recursive", _line(node))
        inside.add(key)
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_VALUES:
                raise _TooBig(f"aliases and merge keys expand this to more than {MAX_VALUES} "
                              "values; an inventory needs far fewer: write the hosts out or "
                              "use fewer nested '<<: *anchor'", _line(node))
        inside.discard(key)
        sizes[key] = total
        return total

    size(root)


class _DuplicateKey(Exception):
    def __init__(self, key: str, first: int, line: int):
        super().__init__(key)
        self.key, self.first, self.line = key, first, line


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _key(node: yaml.Node) -> str:
    # Keys stay as written: an inventory's keys are names, and `ON:` or `1:` should not turn
    # into True or 1 on the way.
    if isinstance(node, yaml.ScalarNode):
        return node.value
    raise yaml.constructor.ConstructorError(
        None, None, "a key must be plain text, not a list or mapping", node.start_mark
    )


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LineDict:
    first: dict[str, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # `<<: *defaults` merges; the explicit keys below override it
        key = _key(key_node)
        if key in first:
            raise _DuplicateKey(key, first[key], _line(key_node))
        first[key] = _line(key_node)
    loader.flatten_mapping(node)
    data = LineDict(_line(node))
    for key_node, value_node in node.value:
        key = _key(key_node)
        data[key] = loader.construct_object(value_node, deep=True)
        data.key_lines[key] = _line(key_node)
        if isinstance(value_node, yaml.ScalarNode) and value_node.style is None:
            data.raw[key] = value_node.value
        else:
            data.raw.pop(key, None)
    return data


def _construct_sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> LineList:
    data = LineList(_line(node))
    for item in node.value:
        data.append(loader.construct_object(item, deep=True))
        data.item_lines.append(_line(item))
    return data


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_int(loader, node):
    """YAML's int, or a line-marked error for a number of more digits than Python converts
    (``slots: 99…9`` past 4300 digits raised ValueError, a traceback)."""
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        raise _TooBig(too_long_number(len(node.value)), node.start_mark.line + 1) from None



_LineLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


class YamlDoc:
    """Loaded YAML data and where each part of it came from."""

    def __init__(self, data: Any):
        self.data = data

    def line(self, path: tuple) -> int | None:
        """The line of the deepest part of ``path`` that exists (a missing key: its parent)."""
        node = self.data
        line = getattr(node, "line", 1)
        for step in path:
            if isinstance(node, LineDict) and step in node:
                line, node = node.key_lines[step], node[step]
            elif isinstance(node, LineList) and isinstance(step, int) and 0 <= step < len(node):
                line, node = node.item_lines[step], node[step]
            else:
                break
        return line

    def raw(self, path: tuple) -> str | None:
        """The source text of the plain scalar at ``path``, or None."""
        node = self.data
        for step in path[:-1]:
            try:
                node = node[step]
            except (KeyError, IndexError, TypeError):
                return None
        return node.raw.get(path[-1]) if isinstance(node, LineDict) and path else None


def parse(path: str, text: str) -> YamlDoc:
    """Parse ``text`` (the contents of ``path``); raise InventoryError on a syntax error."""
    loader = None
    try:
        loader = _LineLoader(text)
        node = loader.get_single_node()  # the node graph: aliases not yet expanded
        if node is None:
            return YamlDoc(None)
        _check_expansion(node)
        return YamlDoc(loader.construct_document(node))
    except _TooBig as err:
        raise InventoryError(path, err.line, str(err)) from None
    except RecursionError:
        raise InventoryError(path, None, "nested too deeply to be an inventory; an inventory "
                                         "is a few levels of mappings and lists") from None
    except _DuplicateKey as dup:
        raise InventoryError(
            path, dup.line,
            f"duplicate key {dup.key!r} (first on line {dup.first}); YAML would keep only the "
            "last one, so remove or rename one of them",
        ) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = err.problem or err.context or "not valid YAML"
        if problem.startswith("but ") and err.context:
            problem = f"{err.context}, {problem}"  # "expected a single document, but found ..."
        hint = next((h for key, h in _HINTS if key in problem),
                    "check indentation and quoting on this line and the one above")
        raise InventoryError(path, mark.line + 1 if mark else None,
                             f"YAML syntax error: {problem}; {hint}") from None
    except yaml.reader.ReaderError as err:  # a control character in the text
        line = text.count("\n", 0, err.position) + 1
        raise InventoryError(
            path, line, f"YAML syntax error: character #x{err.character:04x} is not allowed "
            f"({err.reason}); delete it or write it as an escape in a double-quoted string",
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
