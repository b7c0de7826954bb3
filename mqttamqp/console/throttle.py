"""The login throttle: slows password guessing per client address, per (user
name, address) pair, and per user name across many addresses, without ever
locking the right password out.  Pure bookkeeping on an injected clock; the login
route (``mqttamqp.console.apps.login``) asks it and waits or refuses.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoginThrottle"]


@dataclass
class _Failures:
    """Consecutive failures of one address or one (user, address) pair."""

    count: int
    last: float                   # when the last one happened
    refusal_logged: bool = False  # a refusal in the current back-off was logged


_ADDRESSES_KEPT = 32   # distinct addresses remembered per user name (for the log line)


@dataclass
class _UserFailures:
    """Failed logins for one user name, from any address: a spell of guessing."""

    count: int
    first: float                  # when the spell began
    last: float                   # the last failure
    addresses: set[str] = field(default_factory=set)   # distinct, up to a bound
    next_slot: float = 0.0        # the earliest a paced check may run
    paced_logged: bool = False    # the spell's pacing was logged
    refusal_logged: bool = False  # a refusal (the pace's wait too long) was logged


class LoginThrottle:
    """Slows password guessing per client address and per (user name, address) pair.

    Never per user name alone: wrong passwords from one address must not keep the
    right password out from another, so an address that has not been failing is
    never throttled, whatever other addresses do.

    A pair gets ``free`` failures, an address ``address_free`` (over any user names;
    an address can be shared, e.g. behind NAT); after that the next attempt must wait
    ``2**(failures-free)`` seconds (capped at ``max_delay``) after the last failure,
    and attempts in that window are refused without checking the password.  One
    check at a time per address.  A success clears its pair, not the address (else
    one known account would reset the count between guesses at other names).

    Guessing one user's password from many addresses (each staying within its own
    free failures) is paced per user name instead: once a name has ``user_free``
    failures from at least ``user_addresses`` addresses, password checks for it from
    addresses it has not logged in from are spaced ``user_pace`` seconds apart (the
    pace doubles every ``user_free`` failures more, up to ``user_max_pace``). An
    attempt waits for its turn (``user_hold``), at most ``user_max_wait`` seconds;
    when the turn is further off it is refused until then. Addresses that have been
    failing may take turns only in the first half of that wait, so an address that
    has not (the user somewhere new) finds a turn within ``user_max_wait``. Not a
    lockout: the right password still gets in after its turn, and at once from an
    address the user logged in from before (the last ``trusted_per_user`` of them,
    in memory).

    Every table is bounded: entries quiet for ``forget_after`` seconds expire, and
    past ``max_entries`` the entry with the oldest failure goes first.
    """

    USER_KEY_MAX = 65   # longer names are never valid; they share one key per address

    def __init__(self, clock: Callable[[], float], free: int = 3, address_free: int = 10,
                 max_delay: float = 60.0, max_entries: int = 10000,
                 forget_after: float = 15 * 60.0, user_free: int = 10,
                 user_addresses: int = 3, user_pace: float = 1.0,
                 user_max_pace: float = 5.0, user_max_wait: float = 30.0,
                 trusted_per_user: int = 16) -> None:
        self.clock = clock
        self.free = free
        self.address_free = address_free
        self.max_delay = max_delay
        self.max_entries = max_entries
        self.forget_after = max(forget_after, max_delay)
        self.user_free = user_free
        self.user_addresses = user_addresses
        self.user_pace = user_pace
        self.user_max_pace = user_max_pace
        self.user_max_wait = user_max_wait
        self.trusted_per_user = trusted_per_user
        self._addresses: OrderedDict[str, _Failures] = OrderedDict()
        self._pairs: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._users: OrderedDict[str, _UserFailures] = OrderedDict()
        # user -> the addresses it logged in from (most recent last)
        self._trusted: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._checking: set[str] = set()   # addresses with a password check under way
        # addresses that asked for a paced turn -> when (last): half the queue is theirs
        self._asked: OrderedDict[str, float] = OrderedDict()
        self.paced = 0          # checks held for their user's pace (counter)
        self.paced_refused = 0  # attempts refused: their user's pace was too far off

    def _pair(self, user: str, address: str) -> tuple[str, str]:
        return user[:self.USER_KEY_MAX], address

    def _delay(self, count: int, free: int) -> float:
        if count < free:
            return 0.0
        return float(min(2.0 ** min(count - free, 64), self.max_delay))

    def _live(self, table: OrderedDict[Any, _Failures], key: Any, now: float
              ) -> _Failures | None:
        entry = table.get(key)
        if entry is not None and now - entry.last > self.forget_after:
            del table[key]
            return None
        return entry

    def _limits(self, user: str, address: str, now: float) -> list[tuple[_Failures, float]]:
        """The entries that hold this attempt back, with the wait each one imposes."""
        found = []
        for table, key, free in ((self._pairs, self._pair(user, address), self.free),
                                 (self._addresses, address, self.address_free)):
            entry = self._live(table, key, now)
            if entry is not None:
                wait = entry.last + self._delay(entry.count, free) - now
                if wait > 0:
                    found.append((entry, wait))
        return found

    def retry_after(self, user: str, address: str) -> float:
        """Seconds until a login as ``user`` from ``address`` may be checked (0: now)."""
        now = self.clock()
        wait = 1.0 if address in self._checking else 0.0
        return max([wait] + [w for _, w in self._limits(user, address, now)])

    def note_refusal(self, user: str, address: str) -> bool:
        """Record a refused attempt; True for the first one in its back-off window
        (log that one; the rest of the window adds nothing)."""
        first = False
        for entry, _ in self._limits(user, address, self.clock()):
            if not entry.refusal_logged:
                entry.refusal_logged = first = True
        return first

    def begin(self, user: str, address: str) -> None:
        self._checking.add(address)

    def abandon(self, address: str) -> None:
        """A check begun for ``address`` will not finish (the client went away while
        it waited): nothing is counted."""
        self._checking.discard(address)

    def finish(self, user: str, address: str, ok: bool) -> None:
        self._checking.discard(address)
        now = self.clock()
        pair = self._pair(user, address)
        if ok:
            self._pairs.pop(pair, None)
            self._trust(pair[0], address)
        else:
            self._count(self._pairs, pair, now)
            self._count(self._addresses, address, now)
            self._count_user(pair[0], address, now)
        tables: tuple[OrderedDict[Any, Any], ...] = (self._pairs, self._addresses,
                                                     self._users)
        for table in tables:   # (each ordered by its last failure)
            while table and now - next(iter(table.values())).last > self.forget_after:
                table.popitem(last=False)

    # -- per user name: a pace for checks from addresses it never logged in from ---

    def _paced_user(self, user: str, now: float) -> _UserFailures | None:
        """The user's spell of failures if it is being paced now."""
        key = user[:self.USER_KEY_MAX]
        entry = self._users.get(key)
        if entry is not None and now - entry.last > self.forget_after:
            del self._users[key]
            return None
        if (entry is None or entry.count < self.user_free
                or len(entry.addresses) < self.user_addresses):
            return None
        return entry

    def _pace(self, entry: _UserFailures) -> float:
        doublings = min((entry.count - self.user_free) // self.user_free, 64)
        return float(min(self.user_pace * 2.0 ** doublings, self.user_max_pace))

    def _trusted_for(self, user: str, address: str) -> bool:
        known = self._trusted.get(user[:self.USER_KEY_MAX])
        return known is not None and address in known

    def user_hold(self, user: str, address: str) -> float | None:
        """Seconds a login as ``user`` from ``address`` must wait for its turn before
        its password is checked (0: at once), the turn taken; None: its turn is more
        than ``user_max_wait`` away (``user_retry_after`` says when to retry)."""
        now = self.clock()
        entry = self._paced_user(user, now)
        if entry is None or self._trusted_for(user, address):
            return 0.0
        slot = max(now, entry.next_slot)
        # Addresses that have been failing, or that asked for a paced turn before, may
        # fill only half the queue: the other half stays for one that has done
        # neither (the user at a new place), so its wait is bounded however many
        # such addresses keep asking.
        longest = self._longest_wait(address, now)
        self._paced_address(address, now)
        if slot - now > longest:
            self.paced_refused += 1
            return None
        entry.next_slot = slot + self._pace(entry)
        if slot > now:
            self.paced += 1
        return slot - now

    def user_retry_after(self, user: str, address: str) -> float:
        """When a refused ``user_hold`` may succeed: its turn minus the longest wait
        ``address`` may have."""
        now = self.clock()
        entry = self._paced_user(user, now)
        if entry is None:
            return 0.0
        return max(0.0, entry.next_slot - self._longest_wait(address, now) - now)

    def _longest_wait(self, address: str, now: float) -> float:
        seen = self._asked.get(address)
        if seen is not None and now - seen > self.forget_after:
            del self._asked[address]
            seen = None
        if seen is not None or self._live(self._addresses, address, now) is not None:
            return self.user_max_wait / 2
        return self.user_max_wait

    def _paced_address(self, address: str, now: float) -> None:
        self._asked.pop(address, None)
        self._asked[address] = now
        while len(self._asked) > self.max_entries:
            self._asked.popitem(last=False)

    def user_spell(self, user: str, refused: bool = False) -> tuple[int, int, float] | None:
        """(failures, addresses, seconds since it began) of ``user``'s spell the first
        time its pacing (``refused``: a refusal) is noted in that spell, else None:
        log that one; the rest of the spell adds nothing."""
        entry = self._paced_user(user, self.clock())
        if entry is None:
            return None
        if refused:
            if entry.refusal_logged:
                return None
            entry.refusal_logged = True
        else:
            if entry.paced_logged:
                return None
            entry.paced_logged = True
        return entry.count, len(entry.addresses), self.clock() - entry.first

    @property
    def addresses_kept(self) -> int:
        """How many distinct addresses of a user's spell are counted (at most)."""
        return max(self.user_addresses, _ADDRESSES_KEPT)

    def user_pace_now(self, user: str) -> float:
        """Seconds between checks for ``user`` from unknown addresses (0: not paced)."""
        entry = self._paced_user(user, self.clock())
        return self._pace(entry) if entry is not None else 0.0

    def _count_user(self, user: str, address: str, now: float) -> None:
        entry = self._users.get(user)
        if entry is None or now - entry.last > self.forget_after:
            entry = _UserFailures(0, now, now)
        self._users.pop(user, None)
        self._users[user] = entry
        entry.count += 1
        entry.last = now
        if len(entry.addresses) < self.addresses_kept:
            entry.addresses.add(address)
        while len(self._users) > self.max_entries:
            self._users.popitem(last=False)

    def _trust(self, user: str, address: str) -> None:
        known = self._trusted.pop(user, None) or OrderedDict()
        known.pop(address, None)
        known[address] = None
        while len(known) > self.trusted_per_user:
            known.popitem(last=False)
        self._trusted[user] = known
        while len(self._trusted) > self.max_entries:
            self._trusted.popitem(last=False)

    def _count(self, table: OrderedDict[Any, _Failures], key: Any, now: float) -> None:
        entry = self._live(table, key, now)
        table.pop(key, None)
        table[key] = _Failures((entry.count if entry else 0) + 1, now)
        while len(table) > self.max_entries:
            table.popitem(last=False)

    def failures(self, address: str, user: str | None = None) -> int:
        """Current failures of ``address``, or of the pair when ``user`` is given."""
        now = self.clock()
        entry = (self._live(self._addresses, address, now) if user is None
                 else self._live(self._pairs, self._pair(user, address), now))
        return entry.count if entry else 0

    def sizes(self) -> tuple[int, int]:
        """(addresses, pairs) held."""
        return len(self._addresses), len(self._pairs)

    def user_sizes(self) -> tuple[int, int]:
        """(user names with failures, user names with trusted addresses) held."""
        return len(self._users), len(self._trusted)
