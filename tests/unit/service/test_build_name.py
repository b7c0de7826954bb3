"""``native.build()``: the build the start-up line names (``service.BrokerService``)."""

from __future__ import annotations

from compiled import COMPILED

from mqttamqp.native import build


def test_build_names_the_build_these_tests_import() -> None:
    """Told apart by the loader of a compiled core module (an extension module's), where
    ``COMPILED`` looks at the connection module's file: the same answer either way."""
    assert build() == ("compiled" if COMPILED else "pure Python")
