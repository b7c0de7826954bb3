"""The TOML configuration file (``--config FILE``) and ``--print-config``.

What it owns: reading a file into an ``Options`` object, and writing one back out.
The keys a file may hold are the command line's long options, found in the options
table itself (``optFlags``, ``optParameters`` and the repeatable ``opt_`` methods
whose value is a list), so an option added to ``mqttamqp/options.py`` is accepted in
the file the moment it exists; there is no second list to keep in step.  Values go
through the option's own checks (its coerce function, its ``opt_`` method), and
options given on the command line win over the file's.

A list option may take TOML tables as items (``[[webhook]]``) when its ``opt_`` method
says so (``toml_tables = True``); the method then receives a dict and raises
``TableKeyError`` naming the offending key.

What it must not do: import the options module (it is handed the instance), or read
anything but the one file.  ``tomllib`` gives no line numbers for keys, so the line of
a bad key is found by scanning the text, simply (a key at the start of a line, or a
table header); when that fails the error names the key alone.
"""

from __future__ import annotations

import getopt
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, fields
from typing import Any

import tomli_w
from twisted.python import reflect, usage

__all__ = ["OptionSpec", "TableKeyError", "as_table", "table_values", "option_specs", "flag_pairs",
           "given_on_command_line", "merge_file", "dump", "effective"]

# Options that steer the parsing itself or only print; a file cannot hold them.
NOT_IN_FILE = frozenset({"config", "print-config", "help", "version"})


class TableKeyError(ValueError):
    """A bad key inside a table item (``[[webhook]]``): ``key`` is named in the error."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
        self.index: int | None = None   # which item of the list (set by the reader)


def table_values(settings_class: Any, table: Mapping[str, Any], leave_out: str,
                 check: Callable[[str, Field[Any], Any], Any]) -> dict[str, Any]:
    """A table item's values by field name (a dataclass's fields, each under its
    dashed name, ``leave_out`` not among them), each through
    ``check(key, field, value)``;
    ``TableKeyError`` for a key that names no field."""
    known = {f.name.replace("_", "-"): f for f in fields(settings_class)
             if f.name != leave_out}
    values: dict[str, Any] = {}
    for key, value in table.items():
        spec = known.get(key)
        if spec is None:
            raise TableKeyError(key, "unknown key (one of " + ", ".join(known) + ")")
        values[spec.name] = check(key, spec, value)
    return values


def as_table(settings: Any, leave_out: str) -> dict[str, Any]:
    """The TOML table of a table item's settings (a dataclass: ``[[webhook]]``,
    ``[[bridge]]``), as its ``from_table`` reads it back: each field under its
    dashed name, tuples as lists, None and the field ``leave_out`` left out."""
    table: dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.name == leave_out or value is None:
            continue
        table[f.name.replace("_", "-")] = list(value) if isinstance(value, tuple) else value
    return table


@dataclass(frozen=True)
class OptionSpec:
    """One option as the file sees it: ``kind`` is 'flag', 'parameter' or 'list'."""

    name: str
    kind: str
    types: tuple[type, ...]
    coerce: Any = None
    tables: bool = False
    default: Any = None

    def type_name(self) -> str:
        if self.kind == "flag":
            return "true or false"
        if self.kind == "list":
            return "a list of strings" + (" or tables" if self.tables else "")
        return " or ".join({int: "an integer", float: "a number", str: "a string"}[t]
                           for t in self.types)


def option_specs(options: usage.Options) -> dict[str, OptionSpec]:
    """Every option of ``options``' class, by long name, in the table's order."""
    specs: dict[str, OptionSpec] = {}
    flags: list[list[Any]] = []
    reflect.accumulateClassList(type(options), "optFlags", flags)
    for flag in flags:
        specs[flag[0]] = OptionSpec(flag[0], "flag", (bool,))
    parameters: list[list[Any]] = []
    reflect.accumulateClassList(type(options), "optParameters", parameters)
    for param in parameters:
        coerce = param[4] if len(param) > 4 else None
        specs[param[0]] = OptionSpec(param[0], "parameter", _types_of(param[2], coerce),
                                     coerce, default=param[2])
    for attr in sorted(dir(options)):
        if not attr.startswith("opt_"):
            continue
        name = attr[4:].replace("_", "-")
        if name not in specs and isinstance(options.get(name), list):
            method = getattr(options, attr)
            specs[name] = OptionSpec(name, "list", (str,),
                                     tables=bool(getattr(method, "toml_tables", False)))
    return specs


def flag_pairs(specs: Mapping[str, OptionSpec]) -> dict[str, str]:
    """``{"no-X": "X"}`` for every flag ``X`` whose opposite ``no-X`` is a flag too
    (``archive`` / ``no-archive``): one setting under two keys.  The file may use
    either (``archive = false`` turns archiving off), ``--print-config`` writes ``X``."""
    return {name: name[3:] for name, spec in specs.items()
            if spec.kind == "flag" and name.startswith("no-")
            and getattr(specs.get(name[3:]), "kind", None) == "flag"}


def _types_of(default: Any, coerce: Any) -> tuple[type, ...]:
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, int):
        return (int,)
    if isinstance(default, float):
        return (int, float)
    if default is None and coerce is not None:
        return (int, float, str)
    return (str,)


def given_on_command_line(options: usage.Options, argv: Sequence[str]) -> set[str]:
    """The long names of the options in ``argv`` (as twistd's parser would read them);
    empty if it cannot read them (the parser itself then reports why)."""
    try:
        opts, _ = getopt.getopt(list(argv), options.shortOpt, options.longOpt)
    except getopt.GetoptError:
        return set()
    given: set[str] = set()
    for opt, _value in opts:
        name = opt.lstrip("-")
        name = options.synonyms.get(name) or options.synonyms.get(name.replace("-", "_"), name)
        given.add(name.replace("_", "-"))
    return given


def merge_file(options: usage.Options, path: str, given: set[str]) -> None:
    """Set every option the file ``path`` holds and ``given`` does not name; a
    ``UsageError`` naming the key and its line for anything wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise usage.UsageError(f"--config {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise usage.UsageError(f"--config {path}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise usage.UsageError(f"--config {path}: not valid TOML: {e}") from None
    specs = option_specs(options)
    pairs = flag_pairs(specs)
    partners = {**pairs, **{x: no_x for no_x, x in pairs.items()}}
    for key, value in data.items():
        spec = specs.get(key)
        if spec is None or key in NOT_IN_FILE:
            raise _error(path, text, key, None,
                         "unknown key (not an option of twistd mqttamqp --help)")
        partner = partners.get(key)
        if key in given or partner in given:
            continue
        if (key in pairs and partner in data and isinstance(value, bool)
                and data[partner] is value):
            raise _error(path, text, key, None,
                         f"contradicts {partner} = {str(data[partner]).lower()} (one "
                         "setting: give one of the two keys)")
        try:
            _apply(options, spec, value)
            if partner is not None:
                options[partner] = 0 if value else 1
        except TableKeyError as e:
            raise _error(path, text, key, (e.index, e.key), e.message) from None
        except (usage.UsageError, ValueError, TypeError) as e:
            raise _error(path, text, key, None, str(e)) from None


def _apply(options: usage.Options, spec: OptionSpec, value: Any) -> None:
    if spec.kind == "flag":
        if not isinstance(value, bool):
            raise ValueError(f"must be {spec.type_name()}, got {_toml_type(value)}")
        options[spec.name] = 1 if value else 0
        return
    if spec.kind == "parameter":
        if isinstance(value, bool) or not isinstance(value, spec.types):
            raise ValueError(f"must be {spec.type_name()}, got {_toml_type(value)}")
        options[spec.name] = spec.coerce(str(value)) if spec.coerce is not None else value
        return
    if not isinstance(value, list):
        raise ValueError(f"must be {spec.type_name()}, got {_toml_type(value)}")
    method = getattr(options, "opt_" + spec.name.replace("-", "_"))
    options[spec.name] = []
    for index, item in enumerate(value):
        if not (isinstance(item, str) or (spec.tables and isinstance(item, dict))):
            raise ValueError(f"must be {spec.type_name()}, item {index + 1} is "
                             f"{_toml_type(item)}")
        try:
            method(item)
        except TableKeyError as e:
            e.index = index
            raise


def _toml_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def _error(path: str, text: str, key: str, inner: tuple[int | None, str] | None,
           message: str) -> usage.UsageError:
    line = _line_of(text, key, inner)
    where = f"--config {path}" + (f", line {line}" if line is not None else "")
    named = key if inner is None else f"{key}.{inner[1]}"
    return usage.UsageError(f"{where}: {named}: {message}")


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?")


def _key_line(key: str) -> re.Pattern[str]:
    k = re.escape(key)
    return re.compile(rf"""^\s*(?:{k}|"{k}"|'{k}')\s*=""")


def _line_of(text: str, key: str, inner: tuple[int | None, str] | None) -> int | None:
    """The 1-based line where ``key`` (or, for ``inner`` = (item index, sub-key), that
    key of the item-th ``[[key]]`` table) is written; None if the scan cannot tell."""
    lines = text.splitlines()
    if inner is None:
        wanted = _key_line(key)
        in_table = False
        for number, line in enumerate(lines, 1):
            header = _HEADER.match(line)
            if header:
                if header.group(1).strip("\"'") == key:
                    return number
                in_table = True
            elif not in_table and wanted.match(line):
                return number
        return None
    index, sub = inner
    seen = -1
    wanted = _key_line(sub)
    inside = False
    header_line = None
    for number, line in enumerate(lines, 1):
        header = _HEADER.match(line)
        if header:
            inside = header.group(1).strip("\"'") == key and line.strip().startswith("[[")
            if inside:
                seen += 1
                inside = index is None or seen == index
                header_line = number if inside else header_line
        elif inside and wanted.match(line):
            return number
    return header_line


def _to_toml(item: Any) -> Any:
    as_table = getattr(item, "as_table", None)
    return as_table() if callable(as_table) else item


def effective(options: Mapping[str, Any], specs: Mapping[str, OptionSpec],
              replace: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The configuration as the file would hold it: flags as booleans, lists' items
    as TOML values, options without a value (None) left out (or written 'none' when
    their default is a value: turned off), ``replace`` applied.  A flag pair
    (``archive`` / ``no-archive``) is one key, ``X``, with the value in force."""
    out: dict[str, Any] = {}
    pairs = flag_pairs(specs)
    opposite = {x: no_x for no_x, x in pairs.items()}

    def current(name: str) -> Any:
        return (replace or {}).get(name, options[name])

    for name, spec in specs.items():
        if name in NOT_IN_FILE or name in pairs:
            continue
        value = current(name)
        if name in opposite:
            value = not current(opposite[name])
        elif spec.kind == "flag":
            value = bool(value)
        elif value is None and isinstance(spec.default, str):
            value = "none"   # a listener with a default, turned off (e.g. metrics)
        elif value is None:
            continue
        elif spec.kind == "list":
            value = [_to_toml(item) for item in value]
        out[name] = value
    return out


def dump(options: usage.Options, replace: Mapping[str, Any] | None = None) -> str:
    """``options`` as a TOML file that ``--config`` reads back to the same options."""
    header = ("# The effective configuration of twistd mqttamqp (--print-config).\n"
              "# Options without a value (their default is none) are left out.\n\n")
    return header + tomli_w.dumps(effective(options, option_specs(options), replace))
