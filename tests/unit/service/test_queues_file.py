"""``--queues FILE`` (``mqttamqp.queuesfile``): max-priority beside the retention keys,
checked, and the levels a queue it names gets."""

from __future__ import annotations

from pathlib import Path

import pytest
from queue_facade import make, send

from mqttamqp.core.limits import Limits
from mqttamqp.queuesfile import load_queue_rules


def _rules(tmp_path: Path, text: str) -> tuple[tuple[object, ...], ...]:
    path = tmp_path / "queues.toml"
    path.write_text(text)
    return load_queue_rules(str(path))


def test_max_priority_is_read_with_the_retention_keys(tmp_path: Path) -> None:
    """max-priority 9 is the fifth field; left out or 0, there is none."""
    rules = _rules(tmp_path, '[[queue]]\npattern = "jobs*"\nmax-priority = 9\n'
                             'max-messages = 10\n\n[[queue]]\npattern = "plain"\n\n'
                             '[[queue]]\npattern = "zero"\nmax-priority = 0\n')
    assert rules == (("jobs*", None, None, 10, 9), ("plain", None, None, None, None),
                     ("zero", None, None, None, None))


@pytest.mark.parametrize("value", ["256", "-1", '"high"', "true"])
def test_a_bad_max_priority_says_where(tmp_path: Path, value: str) -> None:
    """Out of 0-255 or not a whole number: refused with the table's place."""
    with pytest.raises(ValueError, match=r"\[\[queue\]\] #1.*max-priority"):
        _rules(tmp_path, f'[[queue]]\npattern = "jobs"\nmax-priority = {value}\n')


def test_a_queue_the_rule_names_gets_its_levels(tmp_path: Path) -> None:
    """The rule reaches the queue manager: a queue it names is made with levels 0..9,
    another without any."""
    rules = _rules(tmp_path, '[[queue]]\npattern = "jobs*"\nmax-priority = 9\n')
    broker, _, _ = make(queue_rules=rules)
    assert Limits(queue_rules=rules).queue_rules == rules
    send(broker, "$queue/jobs1/k")
    send(broker, "$queue/other/k")
    assert broker.queues.queues["jobs1"].max_priority == 9
    assert broker.queues.queues["other"].max_priority == 0
