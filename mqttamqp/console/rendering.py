"""Jinja2 environment of the console: where templates and static files are, and
the filters the templates use.

Autoescape is on for every template; no filter here returns ``Markup`` built from
client data.  Templates and static files are package data of ``mqttamqp.console``
(``templates/`` and ``static/`` beside this module), in a source tree and installed
alike; the top-level ``templates`` and ``static`` of the repository are links to them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2

__all__ = ["templates_dir", "static_dir", "make_environment"]


_HERE = Path(__file__).parent


def templates_dir() -> Path:
    return _HERE / "templates"


def static_dir() -> Path:
    return _HERE / "static"


def _timestamp(value: float | None) -> str:
    if not value:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))


def duration(seconds: float | None) -> str:
    """``3d 4h``, ``5m 12s``, ``42s``: two units at most."""
    if seconds is None:
        return "—"
    s = int(max(0, seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (s, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    return " ".join(f"{n}{u}" for n, u in parts[:2])


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


def _yesno(value: bool | None) -> str:
    if value is None:
        return "—"
    return "yes" if value else "no"


def make_environment(now: Callable[[], float], directory: Path | None = None
                     ) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory or templates_dir())),
        autoescape=True,           # every template, whatever its extension
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["timestamp"] = _timestamp
    env.filters["ago"] = lambda t: duration(now() - t) if t else "—"
    env.filters["until"] = lambda t: duration(t - now()) if t else "—"
    env.filters["duration"] = duration
    env.filters["num"] = _number
    env.filters["bytes"] = _bytes
    env.filters["yesno"] = _yesno
    return env
