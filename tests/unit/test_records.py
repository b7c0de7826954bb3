"""The per-message records (``mqttamqp.records``): read-only to mypy, values at run time.

``@final_record`` classes (the hot ones, native in the compiled build) keep what
``@record`` gave: mypy --strict rejects an assignment to any field, equality and hash
are over the fields (``Publish.wire`` left out), ``dataclasses.replace`` and ``repr``
work, and in the pure build they have no instance dict.  The store's cold
operations are ``@record`` again (interpreted dataclasses in the compiled build too):
the same values.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import ModuleType

import pytest
from compiled import COMPILED

from mqttamqp.core import message, persistence
from mqttamqp.core.clients import registry
from mqttamqp.core.limits import Limits
from mqttamqp.core.routing import published
from mqttamqp.core.sessions.session import Session
from mqttamqp.mqtt import packets
from mqttamqp.mqtt.packets import Properties, Publish

MODULES = (message, packets, published, persistence, registry)
# The store operations built per message or delivery, or on the connect path: native
# in the compiled build.  The others (bans, queues' and groups' creation and deletion,
# exchanges, bindings, queue arguments) are cold, ``@record``.
P = persistence
HOT_OPS = (
    P.StoredQueued, P.PutRetained, P.DeleteRetained, P.PutQueued, P.DeleteQueued,
    P.PutInboundQos2, P.DeleteInboundQos2, P.PutQueueMessage, P.DeleteQueueMessage,
    P.TrimQueue, P.QueueDone, P.PutQueueGroup, P.QueueGroupRecord, P.PutSession,
    P.DeleteSession, P.PutSubscription, P.DeleteSubscription, P.PutWill, P.DeleteWill)
ROOT = Path(__file__).resolve().parents[2]


def _records(module: ModuleType) -> list[tuple[str, list[str]]]:
    """(class name, its fields' names) of each record with fields defined in ``module``
    (``@record`` and ``@final_record`` hash their values; a plain dataclass does not)."""
    found = []
    for name, value in vars(module).items():
        if (isinstance(value, type) and value.__module__ == module.__name__
                and dataclasses.is_dataclass(value) and dataclasses.fields(value)
                and value.__dataclass_params__.unsafe_hash):  # type: ignore[attr-defined]
            found.append((name, [f.name for f in dataclasses.fields(value)]))
    return found


def test_every_field_of_a_record_is_read_only_to_mypy(tmp_path: Path) -> None:
    """An assignment to any field of a record (of any of the modules) is an error to
    mypy --strict, whether the record is ``@record`` (frozen) or ``@final_record``
    (``Final`` fields)."""
    api = pytest.importorskip("mypy.api")
    lines = ["from typing import Any"]
    expected = []
    for module in MODULES:
        lines.append(f"import {module.__name__}")
        for cls, names in _records(module):
            lines.append(f"def set_{cls}(x: {module.__name__}.{cls}, v: Any) -> None:")
            for name in names:
                lines.append(f"    x.{name} = v")
                expected.append(len(lines))
    assert len({line.split("(")[0] for line in lines if line.startswith("def ")}) > 40
    snippet = tmp_path / "snippet.py"
    snippet.write_text("\n".join(lines) + "\n")
    out, err, _ = api.run([
        "--strict", "--follow-imports=silent", "--no-error-summary",
        "--cache-dir", str(ROOT / ".mypy_cache"),
        "--config-file", str(ROOT / "pyproject.toml"), str(snippet)])
    # (mypy replays a cached module's errors with the path it had then)
    errors = {int(line.split(":")[1]) for line in out.splitlines()
              if line.split(":")[0].endswith("snippet.py") and ": error:" in line
              and ("final attribute" in line or "read-only" in line)}
    assert errors == set(expected), (out, err)


def test_final_records_are_values() -> None:
    a = Publish("t", b"p", 1, packet_id=7, wire=b"\x30")
    b = Publish("t", b"p", 1, packet_id=7)
    assert a == b and hash(a) == hash(b)            # wire is not part of its value
    assert "wire" not in repr(a) and repr(a).startswith("Publish(topic='t'")
    assert [f.name for f in dataclasses.fields(Publish)] == [
        "topic", "payload", "qos", "retain", "dup", "packet_id", "properties", "wire"]
    c = dataclasses.replace(a, qos=2)
    assert (c.qos, c.wire, c.packet_id) == (2, b"\x30", 7) and c != a
    assert {a, b, c} == {a, c}
    props = Properties(topic_alias=3)
    assert props == Properties(topic_alias=3) != Properties()
    assert dataclasses.replace(props, topic_alias=None) == Properties()
    m = message.Message("t", b"x", 1, props=message.MessageProperties(expiry_interval=5))
    assert m.with_retain(True) == message.Message("t", b"x", 1, True, props=m.props)
    assert m.with_retain(False) is m
    assert published.ROUTED == published.Published()
    put = persistence.PutQueued("c", 1, persistence.StoredQueued(m, 1), first=True)
    assert put == persistence.PutQueued("c", 1, persistence.StoredQueued(m, 1))
    assert "first=True" in repr(put)
    if COMPILED:
        return   # native classes
    assert not hasattr(a, "__dict__") and not hasattr(m, "__dict__")
    with pytest.raises(AttributeError):
        a.extra = 1  # type: ignore[attr-defined]


def test_the_records_are_native_in_the_compiled_build() -> None:
    """In the compiled build the hot records are mypyc's native classes (C fields, a
    compiled ``__init__``), not interpreted dataclasses."""
    if not COMPILED:
        pytest.skip("pure Python build")
    for cls in (Publish, packets.Puback, packets.Connect, message.Message,
                published.Published, registry.Opened, *HOT_OPS):
        assert hasattr(cls, "__mypyc_attrs__"), cls
        assert type(cls.__init__).__name__ != "function", cls
    assert sys.modules[Publish.__module__] is packets


def test_the_cold_operations_are_values() -> None:
    """The cold operations (``@record``): fields, defaults, equality, hash and ``repr``
    as the ``@final_record`` form had them; no instance dict."""
    put = persistence.PutExchange("x", "direct")
    assert put == persistence.PutExchange("x", "direct", False, False, ())
    assert hash(put) == hash(persistence.PutExchange("x", "direct", False, False, ()))
    assert put != persistence.PutExchange("x", "direct", True)
    assert repr(put) == ("PutExchange(name='x', kind='direct', auto_delete=False, "
                         "internal=False, arguments=())")
    binding = persistence.PutBinding("x", "q", False, "k")
    unbinding: object = persistence.DeleteBinding("x", "q", False, "k")
    assert binding.arguments == () and binding != unbinding
    assert persistence.PutQueueArguments("q").arguments == ()
    ban = persistence.PutBan("user", "u", None, "why", 1.0, "admin")
    assert dataclasses.replace(ban, until=2.0).until == 2.0
    assert [f.name for f in dataclasses.fields(ban)] == [
        "kind", "value", "until", "reason", "created", "by"]
    for op in (put, binding, ban, persistence.DeleteQueue("q"),
               persistence.DeleteQueueGroup("q", "g")):
        assert not hasattr(op, "__dict__"), op
        assert not hasattr(type(op), "__mypyc_attrs__"), op


def test_opened_is_a_value() -> None:
    session = Session("c", True, Limits())
    a = registry.Opened(session, True, None)
    assert (a.session, a.present, a.durable) == (session, True, None)
    assert a == registry.Opened(session, True, None)
    assert repr(a) == f"Opened(session={session!r}, present=True, durable=None)"
