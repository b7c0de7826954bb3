"""Storage URIs (``--storage URI``) in process: what each URI opens (file, SQLite,
PostgreSQL DSNs with hidden passwords), bad URIs, history-free RelStorage with SQLite's
full sync and auto-vacuum, and RelStorage's info lines kept out of the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqttamqp.store.engines import FILENAME, EngineError, resolve

pytestmark = pytest.mark.timeout(120)



def test_no_uri_is_the_file_storage_in_the_data_directory(tmp_path: Path) -> None:
    """Without --storage the state is DATA/mqttamqp.fs, as before engines existed."""
    engine = resolve(None, str(tmp_path))
    assert engine.kind == "file" and engine.locks_itself and engine.durable
    assert engine.size_path == str(tmp_path / FILENAME)


def test_file_uris_absolute_and_relative(tmp_path: Path) -> None:
    """file:///abs is that file; file://rel is under the data directory."""
    assert resolve("file:///var/x/state.fs", str(tmp_path)).size_path == "/var/x/state.fs"
    assert resolve("file://state.fs", str(tmp_path)).size_path == str(tmp_path / "state.fs")


def test_sqlite_uris_name_a_directory(tmp_path: Path) -> None:
    """sqlite:// is DATA/sqlite; sqlite:///DIR and zodburi's ?data_dir=DIR name DIR."""
    assert resolve("sqlite://", str(tmp_path)).size_path == str(tmp_path / "sqlite")
    assert resolve("sqlite:///srv/db", str(tmp_path)).size_path == "/srv/db"
    assert resolve("sqlite://?data_dir=/srv/db2", str(tmp_path)).size_path == "/srv/db2"
    engine = resolve("sqlite://", str(tmp_path))
    assert engine.kind == "sqlite" and engine.durable and not engine.locks_itself


def test_postgresql_uri_hides_its_password_and_builds_a_dsn(tmp_path: Path) -> None:
    """The display form never shows the password; the libpq DSN carries it."""
    engine = resolve("postgresql://bob:s3cret@127.0.0.1:5433/state?connect_timeout=3",
                     str(tmp_path))
    assert engine.kind == "postgresql"
    assert "s3cret" not in engine.display and "bob:***@127.0.0.1:5433" in engine.display
    assert "password='s3cret'" in engine.dsn and "port='5433'" in engine.dsn
    assert "connect_timeout='3'" in engine.dsn
    assert resolve("postgres://u@h/db", str(tmp_path)).kind == "postgresql"


@pytest.mark.parametrize("uri, says", [
    ("mysql://h/db", "unknown engine 'mysql'"),
    ("/var/lib/x", "unknown engine"),
    ("file://", "needs a path"),
    ("file:///x?create=1", "takes no options"),
    ("postgresql://u@h", "name the database"),
    ("sqlite://?no_such_option=1", "unknown option(s) no_such_option"),
    ("postgresql://u@h/db?keep_history=maybe", "--storage"),
])
def test_bad_uris_say_what_is_wrong(tmp_path: Path, uri: str, says: str) -> None:
    """Every bad URI is an EngineError whose text says what to change."""
    with pytest.raises(EngineError) as info:
        resolve(uri, str(tmp_path))
    assert says in str(info.value)


def test_relstorage_engines_are_history_free(tmp_path: Path) -> None:
    """RelStorage keeps one revision per object unless asked (keep_history=true)."""
    store = resolve("sqlite://", str(tmp_path)).factory()
    try:
        assert store._options.keep_history is False
    finally:
        store.close()
    kept = resolve("sqlite://?keep_history=true", str(tmp_path / "h")).factory()
    try:
        assert kept._options.keep_history is True
    finally:
        kept.close()


def test_sqlite_runs_with_full_sync_and_auto_vacuum(tmp_path: Path) -> None:
    """The SQLite engine's own connections run synchronous=FULL (a commit is on disk
    when it returns, as with FileStorage), WAL, and auto_vacuum=FULL, so a pack gives
    the freed pages back to the file system."""
    import sqlite3

    storage = resolve("sqlite://", str(tmp_path)).factory()
    try:
        from ZODB import DB

        db = DB(storage)
        db.close()
    finally:
        storage.close()
    main = tmp_path / "sqlite" / "main.sqlite3"
    conn = sqlite3.connect(main)
    try:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
    adapter = resolve("sqlite://", str(tmp_path)).factory()
    try:
        pragmas = adapter._adapter.connmanager.pragmas
        assert pragmas["synchronous"] == 2 and pragmas["auto_vacuum"] == 1
    finally:
        adapter.close()


def test_relstorage_info_lines_stay_out_of_the_log() -> None:
    """RelStorage narrates a pack in a dozen info lines; the broker's log gets its own
    one line per pack, not RelStorage's (they are kept from warnings up)."""
    import logging

    from mqttamqp import logbridge

    logbridge.install()
    assert logging.getLogger("relstorage").getEffectiveLevel() == logging.WARNING
    assert not logging.getLogger("relstorage.storage.pack").isEnabledFor(logging.INFO)
    assert logging.getLogger("ZODB.FileStorage").isEnabledFor(logging.INFO)
