"""Unit tests for what resuming a persistent session commits before CONNACK: nothing
when its stored record does not change, the record when it does or when no commit
is known to hold it yet (the reconnect storm after a takeover, issue 28)."""

from __future__ import annotations

from core_broker import FakeLink, make_broker, will
from fakes import FailingStore, ManualStore, SnapshotStore

from mqttamqp.core.auth import Identity
from mqttamqp.core.persistence import DeleteWill, PutSession, PutWill, SessionRecord, Snapshot


def stored(client_id: str = "p", owner: str | None = None,
           expiry: float | None = None) -> SnapshotStore:
    snapshot = Snapshot()
    snapshot.sessions[client_id] = SessionRecord(client_id, 5.0, {"a/#": 1}, [], owner=owner,
                                                 expiry=expiry)
    return SnapshotStore(snapshot)


def test_stored_session_resumed_as_it_is_commits_nothing_before_connack() -> None:
    """A restored session resumed with the same owner and expiry: present, no commit."""
    broker, _, store = make_broker(stored())
    broker.start()
    opened = broker.open_session(FakeLink("p"), "p", False, None, Identity("p"))
    assert opened.present is True
    assert opened.durable is None
    assert store.submitted == []


def test_session_whose_creation_is_not_durable_is_stored_again_on_resume() -> None:
    """Resumed before its first commit is durable: the record goes into this commit too."""
    broker, clock, store = make_broker(ManualStore())
    first = broker.open_session(FakeLink("a"), "p", False, None)
    assert first.durable is not None and not first.durable.called
    again = broker.open_session(FakeLink("b"), "p", False, None)
    assert again.present is True
    assert again.durable is not None
    assert PutSession("p", clock.seconds()) in store.pending[-1][0]   # (the resume's own)


def test_once_the_record_is_durable_a_resume_commits_nothing() -> None:
    """After the creating commit succeeds, resuming the session waits for no commit."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    link = FakeLink("a")
    first = broker.open_session(link, "p", False, None)
    store.commit_all()
    assert first.durable is not None and first.durable.called
    broker.activate(first.session, link, "mqtt3.1.1")
    broker.end_session(link, first.session, clean=True, reason="bye")
    store.commit_all()
    before = len(store.submitted)
    again = broker.open_session(FakeLink("b"), "p", False, None)
    assert again.present is True and again.durable is None
    assert store.submitted[before:] == []


def test_a_failed_creation_is_stored_again_by_the_resume() -> None:
    """A record whose commit failed is not taken as stored: the resume commits it."""
    store = FailingStore()
    broker, clock, _ = make_broker(store)
    store.failing = True
    link = FakeLink("a")
    first = broker.open_session(link, "p", False, None)
    assert first.durable is not None
    first.durable.addErrback(lambda _: None)
    broker.activate(first.session, link, "mqtt3.1.1")
    broker.end_session(link, first.session, clean=True, reason="bye")   # (fails too)
    store.failing = False
    again = broker.open_session(FakeLink("b"), "p", False, None)
    assert again.present is True and again.durable is not None
    assert PutSession("p", clock.seconds()) in store.submitted


def test_an_anonymous_session_claimed_by_a_user_stores_its_owner() -> None:
    """The user that resumes an anonymous stored session becomes its stored owner."""
    broker, clock, store = make_broker(stored(owner=None))
    broker.start()
    opened = broker.open_session(FakeLink("p"), "p", False, None, Identity("p", "alice"))
    assert opened.durable is not None
    assert PutSession("p", clock.seconds(), "alice") in store.submitted


def test_a_new_session_expiry_interval_is_stored_before_connack() -> None:
    """MQTT 5: a resume with another session expiry interval stores it first."""
    broker, clock, store = make_broker(stored(expiry=60.0))
    broker.start()
    same = broker.open_session(FakeLink("a"), "p", False, None, Identity("p"), 60.0)
    assert same.durable is None and store.submitted == []
    other = broker.open_session(FakeLink("b"), "p", False, None, Identity("p"), 120.0)
    assert other.durable is not None
    assert PutSession("p", clock.seconds(), None, 120.0) in store.submitted


def test_a_resume_with_a_will_still_waits_for_the_will_to_be_stored() -> None:
    """A CONNECT's will is durable before CONNACK, resumed session or not."""
    broker, _, store = make_broker(stored())
    broker.start()
    w = will("p")
    opened = broker.open_session(FakeLink("p"), "p", False, w, Identity("p"))
    assert opened.durable is not None
    assert [type(op) for op in store.submitted] == [PutWill]


def test_an_expiry_a_disconnect_changed_whose_commit_failed_is_stored_by_the_resume() -> None:
    """MQTT 5: DISCONNECT changes the expiry 60 -> 3600 and that commit fails; the
    client resumes with 3600: the record is stored again (the store kept 60 for good,
    and a restart would have expired the session after 60 s)."""
    store = FailingStore()
    broker, _, _ = make_broker(store)
    link = FakeLink("a")
    first = broker.open_session(link, "p", False, None, Identity("p"), 60.0)
    broker.activate(first.session, link, "mqtt5")
    store.failing = True
    broker.end_session(link, first.session, clean=True, reason="bye", expiry=3600.0)
    store.failing = False
    before = len(store.submitted)
    again = broker.open_session(FakeLink("b"), "p", False, None, Identity("p"), 3600.0)
    assert again.present and again.durable is not None
    assert any(isinstance(op, PutSession) and op.expiry == 3600.0
               for op in store.submitted[before:])


def test_connack_after_a_disconnect_waits_for_its_new_expiry_to_be_durable() -> None:
    """MQTT 5: a resume while the DISCONNECT's new expiry is still being committed
    answers once a commit after it is durable, not at once."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    link = FakeLink("a")
    first = broker.open_session(link, "p", False, None, Identity("p"), 60.0)
    store.commit_all()
    broker.activate(first.session, link, "mqtt5")
    broker.end_session(link, first.session, clean=True, reason="bye", expiry=3600.0)
    assert store.pending
    again = broker.open_session(FakeLink("b"), "p", False, None, Identity("p"), 3600.0)
    assert again.present and again.durable is not None and not again.durable.called
    store.commit_all()
    assert again.durable.called


def test_a_takeover_resume_waits_for_the_old_wills_deletion() -> None:
    """A client resumes while its old connection (with a will) is live: CONNACK waits
    for the commit that deletes the old will (kill -9 before it would publish a will
    the live connection no longer had)."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    link = FakeLink("a")
    first = broker.open_session(link, "p", False, will("p"), Identity("p"))
    store.commit_all()
    broker.activate(first.session, link, "mqtt3.1.1")
    again = broker.open_session(FakeLink("b"), "p", False, None, Identity("p"))
    assert any(DeleteWill("p") in ops for ops, _ in store.pending)
    assert again.present and again.durable is not None and not again.durable.called
    store.commit_all()
    assert again.durable.called
