"""Access control lists (``--acl FILE``): who may publish and subscribe where.

The file is Mosquitto's ACL format, the subset that can be enforced exactly::

    # a comment; '#' after whitespace ends a line too
    topic read $SYS/#                 # before any 'user' line: anonymous clients
    user alice                        # the lines after it, up to the next 'user': alice
    topic readwrite sensors/alice/#
    topic write cmd/#                 # access: read, write or readwrite (the default)
    pattern readwrite devices/%c/#    # every client; %u = user name, %c = client id

A publish (and a retained message, and a will) needs a ``write`` or
``readwrite`` rule whose filter matches its topic.  A subscription needs a
``read`` or ``readwrite`` rule whose filter covers the whole subscription filter
(``a/#`` covers ``a/+/b``; ``a/+`` does not cover ``a/#``), so that every message
it can match is readable and nothing is checked per delivery.  Without a rule,
access is denied.  ``deny`` rules are refused when the file is read: a grant-only
list cannot be half-enforced.  A pattern whose ``%u``/``%c`` value holds ``+``,
``#`` or ``/`` does not apply (it would widen the rule), and ``%u`` patterns never
apply to anonymous clients.

AMQP 0.9.1 queues and exchanges have lines of their own, in the same sections::

    user worker
    queue configure,read celery       # configure, write, read (comma-joined) or all
    exchange write celery             # '*' in a name: any run of characters
    exchange configure,write,read celery.pidbox
    queue all reply-%u-*              # %u / %c as in patterns

They grant on top of what the topic rules already give a queue (the 0.9.1
adapter's defaults, ``amqp091.permissions``: a topic grant on ``$queue/<name>``);
``may_use_resource`` answers for these lines alone.

The AMQP control addresses (``$mqtt.to.<client-id>.publish`` / ``.control``, the
subscription service) may be used only for the connection's own client id (its
container id) when an ACL file is in force.

The file is re-read when it changes (``AclAuthorizer.reload``; the service polls
it and SIGHUP asks too).  A file that does not parse is reported with its line
and the rules loaded before stay in force; at start it is an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.logger import Logger

from mqttamqp.core.auth import Identity

__all__ = ["AclError", "AclRules", "AclAuthorizer", "parse_acl", "read_acl", "covers"]

READ = 1
WRITE = 2
CONFIGURE = 4
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE}
# queue / exchange lines: each word, comma-joined
_RESOURCE_ACCESS = {"read": READ, "write": WRITE, "configure": CONFIGURE, "readwrite": READ | WRITE,
                    "all": READ | WRITE | CONFIGURE}
RESOURCE_KINDS = ("queue", "exchange")
_ACCESS_OF = {"read": READ, "write": WRITE, "configure": CONFIGURE}
_CACHE_MAX = 4096        # identities with compiled grants kept
_TOPIC_CACHE_MAX = 256   # verdicts per identity and kind kept


class AclError(ValueError):
    """A line of the ACL file that cannot be used (the message names the line)."""


@dataclass(frozen=True, slots=True)
class Rule:
    access: int
    filter: str                # a topic filter, or a queue or exchange name ('*')
    pattern: bool = False      # %u / %c are substituted
    kind: str = "topic"        # or "queue" / "exchange" (AMQP 0.9.1)


@dataclass
class AclRules:
    anonymous: list[Rule] = field(default_factory=list)
    users: dict[str, list[Rule]] = field(default_factory=dict)
    patterns: list[Rule] = field(default_factory=list)

    def count(self) -> int:
        return (len(self.anonymous) + len(self.patterns)
                + sum(len(r) for r in self.users.values()))


_COMMENT = re.compile(r"\s+#")


def _without_comment(value: str) -> str:
    """``value`` up to a trailing comment: ``#`` after whitespace, once the value has
    begun.  A valid topic filter never holds whitespace followed by ``#`` (``#`` is a
    whole level), and a user name may hold no whitespace at all, so this cuts nothing
    a rule could mean; the value's own first character is never a comment (``#``)."""
    match = _COMMENT.search(value, 1)
    return value[:match.start()] if match else value


def parse_acl(text: str, path: str = "ACL file") -> AclRules:
    """The rules of ``text``; ``AclError`` naming ``path`` and the line otherwise.

    A line is a comment when it starts with ``#``; ``#`` after whitespace ends a line
    (``topic read a/#   # why``), as in the example of docs/security.md.  A user name holding
    whitespace, and an access word that is not one, are errors naming the line (Mosquitto
    takes the rest of a ``user`` line, spaces and comment included, as the name: rules
    that silently never apply)."""
    from mqttamqp.core.topics import validate_topic_filter

    rules = AclRules()
    current: list[Rule] = rules.anonymous
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, *more = line.split(None, 1)
        rest = more[0] if more else ""

        def fail(why: str, number: int = number, line: str = line) -> AclError:
            return AclError(f"{path} line {number}: {why}: {line!r}")

        if keyword == "user":
            name = _without_comment(rest)
            if not name:
                raise fail("'user' needs a user name")
            if any(c.isspace() for c in name):
                raise fail(f"a user name holds no whitespace ({name!r}; a comment "
                           "starts with whitespace and '#')")
            current = rules.users.setdefault(name, [])
            continue
        if keyword in RESOURCE_KINDS:
            current.append(_resource_rule(keyword, rest, fail))
            continue
        if keyword not in ("topic", "pattern"):
            raise fail("expected 'topic', 'pattern', 'queue', 'exchange' or 'user'")
        access_word, *after = rest.split(None, 1) or [""]
        if access_word == "deny":
            raise fail("'deny' is not supported: grant only what is allowed")
        if access_word in _ACCESS:
            access, filt = _ACCESS[access_word], _without_comment(after[0] if after else "")
        else:
            access, filt = READ | WRITE, _without_comment(rest)
            if any(c.isspace() for c in filt):
                raise fail(f"{access_word!r} is not an access (read, write or readwrite); "
                           "a filter holding whitespace needs one before it")
        if not filt:
            raise fail("a topic filter is missing")
        problem = validate_topic_filter(filt)
        if problem is not None:
            raise fail(f"not a topic filter ({problem})")
        if keyword == "pattern":
            rules.patterns.append(Rule(access, filt, True))
        else:
            current.append(Rule(access, filt, "%" in filt))
    return rules


def _resource_rule(kind: str, rest: str, fail: Callable[[str], AclError]) -> Rule:
    """A ``queue`` or ``exchange`` line's rule: ``<access>[,<access>...] <name>``."""
    words = _without_comment(rest).split() if rest else []
    if len(words) != 2:
        raise fail(f"'{kind}' needs an access (configure, write, read, readwrite or all; "
                   "comma-joined) and a name without whitespace")
    access = 0
    for word in words[0].split(","):
        if word not in _RESOURCE_ACCESS:
            raise fail(f"{word!r} is not an access (configure, write, read, readwrite or "
                       "all)")
        access |= _RESOURCE_ACCESS[word]
    name = words[1]
    if len(name.encode("utf-8")) > 255:
        raise fail(f"a {kind} name is at most 255 bytes")
    return Rule(access, name, "%" in name, kind)


def _name_pattern(name: str) -> re.Pattern[str]:
    """A queue or exchange rule's name as a pattern: ``*`` any run of characters."""
    return re.compile(".*".join(re.escape(part) for part in name.split("*")), re.DOTALL)


def read_acl(path: str) -> AclRules:
    """The rules of the file at ``path``, read and checked without logging (the option
    check, run at every parse of the command line, SIGHUP included: the one line
    saying what is in force comes from the ``AclAuthorizer`` that applies them)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise AclError(f"cannot read ACL file {os.path.abspath(path)}: {exc.strerror}"
                       ) from None
    except UnicodeDecodeError:
        raise AclError(f"ACL file {os.path.abspath(path)} is not UTF-8 text") from None
    return parse_acl(text, os.path.abspath(path))


def covers(rule: list[str], levels: list[str]) -> bool:
    """Does filter ``rule`` (split on ``/``) match every topic that ``levels`` (a
    topic or a filter, split) can?  Wildcards at the first level do not match
    topics starting with ``$`` (MQTT 4.7.2)."""
    n = len(levels)
    for i, r in enumerate(rule):
        if r == "#":
            return not (i == 0 and n > 0 and levels[0].startswith("$"))
        if i >= n:
            return False
        f = levels[i]
        if r == "+":
            if f == "#" or (i == 0 and f.startswith("$")):
                return False
            continue
        if r != f:
            return False
    return len(rule) == n


def _substitute(flt: str, identity: Identity) -> str | None:
    """``flt`` with ``%u``/``%c`` filled in, or None when the rule cannot apply."""
    if "%u" in flt:
        user = identity.username
        if not user or any(c in user for c in "+#/"):
            return None
        flt = flt.replace("%u", user)
    if "%c" in flt:
        cid = identity.client_id
        if not cid or any(c in cid for c in "+#/"):
            return None
        flt = flt.replace("%c", cid)
    return flt


class _Grants:
    """One identity's rules, compiled, with a bounded verdict cache per kind."""

    __slots__ = ("read", "resource_verdicts", "resources", "verdicts", "write")

    def __init__(self, rules: list[Rule], identity: Identity) -> None:
        self.read: list[list[str]] = []
        self.write: list[list[str]] = []
        # (kind, access bit) -> name patterns: the queue and exchange lines
        self.resources: dict[tuple[str, int], list[re.Pattern[str]]] = {}
        self.resource_verdicts: dict[tuple[str, int, str], bool] = {}   # (bounded)
        for rule in rules:
            if rule.kind != "topic":
                self._resource(rule, identity)
                continue
            flt = _substitute(rule.filter, identity) if rule.pattern else rule.filter
            if flt is None:
                continue
            levels = flt.split("/")
            if rule.access & READ:
                self.read.append(levels)
            if rule.access & WRITE:
                self.write.append(levels)
        self.verdicts: tuple[dict[str, bool], dict[str, bool]] = ({}, {})

    def _resource(self, rule: Rule, identity: Identity) -> None:
        name = rule.filter
        for token, value in (("%u", identity.username), ("%c", identity.client_id)):
            if token in name:
                # (a value holding '*' would widen the rule: it does not apply, nor
                # a %u rule to an anonymous client)
                if not value or "*" in value:
                    return
                name = name.replace(token, value)
        pattern = _name_pattern(name)
        for bit in (READ, WRITE, CONFIGURE):
            if rule.access & bit:
                self.resources.setdefault((rule.kind, bit), []).append(pattern)

    def allows_resource(self, kind: str, access: int, name: str) -> bool:
        patterns = self.resources.get((kind, access))
        if not patterns:
            return False
        cache = self.resource_verdicts
        key = (kind, access, name)
        verdict = cache.get(key)
        if verdict is None:
            verdict = any(p.fullmatch(name) for p in patterns)
            if len(cache) >= _TOPIC_CACHE_MAX:
                cache.clear()
            cache[key] = verdict
        return verdict

    def allows(self, kind: int, topic: str) -> bool:
        cache = self.verdicts[kind - 1]
        verdict = cache.get(topic)
        if verdict is None:
            levels = topic.split("/")
            verdict = any(covers(r, levels) for r in (self.read if kind == READ else self.write))
            if len(cache) >= _TOPIC_CACHE_MAX:
                cache.clear()
            cache[topic] = verdict
        return verdict


class AclAuthorizer:
    """The ``Authorizer`` for ``--acl FILE``."""

    log = Logger(namespace="mqttamqp.acl")

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.rules = AclRules()
        self._stamp: tuple[int, int] | None = None
        self._grants: dict[tuple[str | None, str], _Grants] = {}
        self.loaded_text = ""
        try:
            self.reload(strict=True)
        except OSError as exc:
            raise AclError(f"cannot read ACL file {self.path}: {exc.strerror}") from None

    # -- loading ------------------------------------------------------------------

    def reload(self, strict: bool = False) -> bool:
        """Re-read the file if it changed; True if new rules are in force.  A file
        that does not parse keeps the old rules (``strict``: raises)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return False
            with open(self.path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            if strict:
                raise
            if self._stamp is not None:
                self.log.warn("cannot read ACL file {p}: {e}; the rules loaded before stay "
                              "in force", p=self.path, e=exc.strerror)
                self._stamp = None
            return False
        self._stamp = stamp
        try:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise AclError(f"ACL file {self.path} is not UTF-8 text (byte {exc.start})"
                               ) from None
            rules = parse_acl(text, self.path)
        except AclError as exc:
            if strict:
                raise AclError(str(exc)) from None
            self.log.warn("{e}; the rules loaded before stay in force", e=str(exc))
            return False
        self.rules, self.loaded_text = rules, text
        self._grants = {}
        self.log.info("ACL {p}: {n} rule(s) for {u} user(s), {a} anonymous, {pt} pattern(s)",
                      p=self.path, n=rules.count(), u=len(rules.users),
                      a=len(rules.anonymous), pt=len(rules.patterns))
        return True

    # -- the Authorizer -------------------------------------------------------------

    def _for(self, identity: Identity) -> _Grants:
        key = (identity.username, identity.client_id)
        grants = self._grants.get(key)
        if grants is None:
            rules = self.rules
            own = (rules.users.get(identity.username, []) if identity.username is not None
                   else rules.anonymous)
            grants = _Grants([*own, *rules.patterns], identity)
            if len(self._grants) >= _CACHE_MAX:
                self._grants.clear()
            self._grants[key] = grants
        return grants

    def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
        if not identity.protocol:
            return True      # the broker's own (console publish is checked by its role)
        return self._for(identity).allows(WRITE, topic)

    def may_subscribe(self, identity: Identity, topic_filter: str) -> bool:
        if not identity.protocol:
            return True
        return self._for(identity).allows(READ, topic_filter)

    def may_use_session(self, identity: Identity, client_id: str) -> bool:
        return bool(identity.client_id) and identity.client_id == client_id

    def may_use_resource(self, identity: Identity, kind: str, access: str, name: str
                         ) -> bool:
        """Does a ``queue`` / ``exchange`` line grant ``access`` (configure, write,
        read) on ``name``?  (What the topic rules imply is the adapter's to add.)"""
        if not identity.protocol:
            return True
        return self._for(identity).allows_resource(kind, _ACCESS_OF[access], name)
