"""Message selectors: the JMS message selector language (the SQL-92 conditional
subset of JMS 2.0 §3.8.1), parsed once into a predicate over a message's fields.

What it owns: the grammar (literals, identifiers, comparison, ``LIKE`` with
``ESCAPE``, ``IN``, ``BETWEEN``, ``IS [NOT] NULL``, ``AND``/``OR``/``NOT`` with
three-valued logic, arithmetic), its bounds (``MAX_SELECTOR_LENGTH``,
``MAX_DEPTH``) and ``SelectorError`` with the reason a selector is refused.  A
compiled ``Selector`` is asked ``matches(lookup)``: ``lookup(name)`` gives an
identifier's value (``None``: the message has no such field), and is called at
most once per identifier the selector names, only when evaluation reaches it.

What it must not do: know a wire protocol; where the fields come from (an AMQP
1.0 message's sections, MQTT 5 properties) is the adapter's ``lookup``.

Values: ``None`` is SQL's NULL/unknown; numbers are ``int``/``float`` (never
``bool``); strings ``str``; booleans ``bool``.  An operation on values of types
it does not take (arithmetic on a string, a division by zero) is unknown; a
comparison of unlike types (or of strings or booleans with ``<``...) is false,
as the JMS specification says; a selector that evaluates to unknown does not
match.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["Selector", "SelectorError", "compile_selector", "MAX_SELECTOR_LENGTH",
           "MAX_DEPTH", "MAX_OPERATORS"]

# A selector longer than this is refused (by default: ``compile_selector``'s
# ``max_length``, --amqp-max-selector-length): it is parsed once per link, but a
# peer attaching links in a loop must not make the broker parse megabytes each time.
MAX_SELECTOR_LENGTH = 4096
# Nesting (parentheses, NOT, unary signs) deeper than this is refused: the parser
# and the compiled predicate recurse once per level.
MAX_DEPTH = 64
# Operators one selector may hold: a chain ``a + a + ...`` or ``x OR x OR ...`` is
# one level deep to the parser but evaluates one call deeper per operator.
MAX_OPERATORS = 200

Lookup = Callable[[str], Any]
_Eval = Callable[[dict[str, Any], Lookup], Any]


class SelectorError(ValueError):
    """A selector that does not parse, with why."""


_TOKEN = re.compile(r"""
    \s*(?:
      (?P<string>'(?:[^']|'')*')
    | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[lLfFdD]?)
    | (?P<word>[A-Za-z_$][A-Za-z0-9_$.]*)
    | (?P<op><>|<=|>=|[=<>()+\-*/,])
    )""", re.VERBOSE)

_KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "LIKE", "IN", "IS", "NULL", "ESCAPE",
                       "TRUE", "FALSE"})


def _tokenize(text: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos >= end:
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise SelectorError(f"unexpected {text[pos:pos + 10]!r} at {pos}")
        pos = m.end()
        kind = m.lastgroup or ""
        value = m.group(kind)
        if kind == "string":
            tokens.append(("lit", value[1:-1].replace("''", "'")))
        elif kind == "number":
            tokens.append(("lit", _number(value)))
        elif kind == "word":
            upper = value.upper()
            if upper in _KEYWORDS:
                if upper in ("TRUE", "FALSE"):
                    tokens.append(("lit", upper == "TRUE"))
                else:
                    tokens.append(("kw", upper))
            else:
                tokens.append(("id", value))
        else:
            tokens.append(("op", value))
    tokens.append(("end", None))
    return tokens


_LONG_MIN, _LONG_MAX = -(2 ** 63), 2 ** 63 - 1


def _number(text: str) -> int | float:
    if text[:2] in ("0x", "0X"):
        value = int(text, 16)
    elif text[-1] in "lL":
        value = int(text[:-1])
    elif text[-1] in "fFdD":
        return float(text[:-1])
    elif any(c in text for c in ".eE"):
        return float(text)
    else:
        value = int(text)
    if not _LONG_MIN <= value <= _LONG_MAX:   # (JMS: an exact literal is a Java long)
        raise SelectorError(f"integer literal {text[:24]!r} out of the long range")
    return value


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- three-valued logic (None: unknown) -------------------------------------------------

def _and(left: _Eval, right: _Eval) -> _Eval:
    def run(memo: dict[str, Any], lookup: Lookup) -> Any:
        a = left(memo, lookup)
        if a is False:
            return False
        b = right(memo, lookup)
        if b is False:
            return False
        return True if (a is True and b is True) else None
    return run


def _or(left: _Eval, right: _Eval) -> _Eval:
    def run(memo: dict[str, Any], lookup: Lookup) -> Any:
        a = left(memo, lookup)
        if a is True:
            return True
        b = right(memo, lookup)
        if b is True:
            return True
        return False if (a is False and b is False) else None
    return run


def _not(inner: _Eval) -> _Eval:
    def run(memo: dict[str, Any], lookup: Lookup) -> Any:
        value = inner(memo, lookup)
        return (not value) if isinstance(value, bool) else None
    return run


def _truth(inner: _Eval) -> _Eval:
    """A boolean operand of AND/OR/NOT: anything but a boolean is unknown."""
    def run(memo: dict[str, Any], lookup: Lookup) -> Any:
        value = inner(memo, lookup)
        return value if isinstance(value, bool) else None
    return run


def _compare(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    if _num(a) and _num(b):
        pass
    elif type(a) is not type(b) or (op not in ("=", "<>")):
        # Values of unlike types, or strings and booleans with an order (defined
        # for numbers only): false, as JMS 2.0 §3.8.1.2 says.
        return False
    if op == "=":
        return bool(a == b)
    if op == "<>":
        return bool(a != b)
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def _arith(op: str, a: Any, b: Any) -> Any:
    if not (_num(a) and _num(b)):
        return None
    try:
        return _arith_numbers(op, a, b)
    except ArithmeticError:   # (OverflowError: a long times a float past its range)
        return None


def _arith_numbers(op: str, a: Any, b: Any) -> Any:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)     # (Java's integer division truncates toward zero)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


_ONE, _ANY = object(), object()   # ``_`` and ``%`` in a compiled LIKE pattern


def _like_pattern(pattern: str, escape: str | None) -> list[object]:
    """The pattern as characters and the two wildcards (``_ONE``, ``_ANY``)."""
    out: list[object] = []
    chars = iter(pattern)
    for c in chars:
        if escape is not None and c == escape:
            nxt = next(chars, None)
            if nxt is None:
                raise SelectorError("LIKE pattern ends with its escape character")
            out.append(nxt)
        elif c == "%":
            if not out or out[-1] is not _ANY:
                out.append(_ANY)
        elif c == "_":
            out.append(_ONE)
        else:
            out.append(c)
    return out


def _like(value: str, pattern: list[object]) -> bool:
    """Does ``value`` match ``pattern``?  Greedy, back to the last ``%`` on a
    mismatch: at most len(value) * len(pattern) steps (a regular expression
    could backtrack far longer on ``'%a%a%a…'``)."""
    v = p = 0
    star = -1
    mark = 0
    n, m = len(value), len(pattern)
    while v < n:
        if p < m and (pattern[p] is _ONE or pattern[p] == value[v]):
            v += 1
            p += 1
        elif p < m and pattern[p] is _ANY:
            star, mark = p, v
            p += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            v = mark
        else:
            return False
    while p < m and pattern[p] is _ANY:
        p += 1
    return p == m


class _Parser:
    """Recursive descent over the tokens: OR < AND < NOT < comparison < + - < * / <
    unary sign < primary."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0
        self.depth = 0
        self.operators = 0
        self.names: set[str] = set()

    def peek(self) -> tuple[str, Any]:
        return self.tokens[self.pos]

    def take(self) -> tuple[str, Any]:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def accept(self, kind: str, value: Any) -> bool:
        if self.tokens[self.pos] == (kind, value):
            self.pos += 1
            return True
        return False

    def expect(self, kind: str, value: Any, what: str) -> None:
        if not self.accept(kind, value):
            raise SelectorError(f"expected {what}, found {self._shown()}")

    def _shown(self) -> str:
        kind, value = self.peek()
        return "the end" if kind == "end" else repr(value)

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(f"nested deeper than {MAX_DEPTH} levels")

    def counted(self) -> None:
        self.operators += 1
        if self.operators > MAX_OPERATORS:
            raise SelectorError(f"more than {MAX_OPERATORS} operators")

    def parse(self) -> _Eval:
        expr = self.disjunction()
        if self.peek()[0] != "end":
            raise SelectorError(f"unexpected {self._shown()}")
        return expr

    def disjunction(self) -> _Eval:
        expr = self.conjunction()
        while self.accept("kw", "OR"):
            self.counted()
            expr = _or(_truth(expr), _truth(self.conjunction()))
        return expr

    def conjunction(self) -> _Eval:
        expr = self.negation()
        while self.accept("kw", "AND"):
            self.counted()
            expr = _and(_truth(expr), _truth(self.negation()))
        return expr

    def negation(self) -> _Eval:
        if self.accept("kw", "NOT"):
            self.deeper()
            inner = self.negation()
            self.depth -= 1
            return _not(inner)
        return self.comparison()

    def comparison(self) -> _Eval:
        left = self.sum()
        kind, value = self.peek()
        if kind == "op" and value in ("=", "<>", "<", "<=", ">", ">="):
            self.take()
            right = self.sum()
            op = value
            return lambda m, lk: _compare(op, left(m, lk), right(m, lk))
        negate = False
        if (kind, value) == ("kw", "NOT"):
            self.take()
            negate = True
            kind, value = self.peek()
            if kind != "kw" or value not in ("BETWEEN", "LIKE", "IN"):
                raise SelectorError(f"expected BETWEEN, LIKE or IN after NOT, found "
                                    f"{self._shown()}")
        if (kind, value) == ("kw", "BETWEEN"):
            self.take()
            low = self.sum()
            self.expect("kw", "AND", "AND of BETWEEN")
            high = self.sum()
            if negate:   # (JMS: x NOT BETWEEN a AND b is x < a OR x > b)
                return _or(lambda m, lk: _compare("<", left(m, lk), low(m, lk)),
                           lambda m, lk: _compare(">", left(m, lk), high(m, lk)))
            return _and(lambda m, lk: _compare(">=", left(m, lk), low(m, lk)),
                        lambda m, lk: _compare("<=", left(m, lk), high(m, lk)))
        if (kind, value) == ("kw", "LIKE"):
            self.take()
            return self.like(left, negate)
        if (kind, value) == ("kw", "IN"):
            self.take()
            return self.within(left, negate)
        if (kind, value) == ("kw", "IS"):
            self.take()
            is_not = self.accept("kw", "NOT")
            self.expect("kw", "NULL", "NULL after IS")
            if is_not:
                return lambda m, lk: left(m, lk) is not None
            return lambda m, lk: left(m, lk) is None
        return left

    def _string_literal(self, what: str) -> str:
        kind, value = self.take()
        if kind != "lit" or not isinstance(value, str):
            raise SelectorError(f"{what} must be a string literal")
        return value

    def like(self, left: _Eval, negate: bool) -> _Eval:
        pattern = self._string_literal("a LIKE pattern")
        escape = None
        if self.accept("kw", "ESCAPE"):
            escape = self._string_literal("an ESCAPE character")
            if len(escape) != 1:
                raise SelectorError("an ESCAPE character is one character")
        compiled = _like_pattern(pattern, escape)

        def run(memo: dict[str, Any], lookup: Lookup) -> Any:
            value = left(memo, lookup)
            if not isinstance(value, str):
                return None
            return _like(value, compiled) is not negate
        return run

    def within(self, left: _Eval, negate: bool) -> _Eval:
        self.expect("op", "(", "( after IN")
        items = [self._string_literal("an IN list item")]
        while self.accept("op", ","):
            items.append(self._string_literal("an IN list item"))
        self.expect("op", ")", ") closing the IN list")
        values = frozenset(items)

        def run(memo: dict[str, Any], lookup: Lookup) -> Any:
            value = left(memo, lookup)
            if not isinstance(value, str):
                return None
            return (value not in values) if negate else (value in values)
        return run

    def sum(self) -> _Eval:
        expr = self.product()
        while True:
            kind, value = self.peek()
            if kind != "op" or value not in ("+", "-"):
                return expr
            self.take()
            self.counted()
            expr = self._binary(value, expr, self.product())

    def product(self) -> _Eval:
        expr = self.unary()
        while True:
            kind, value = self.peek()
            if kind != "op" or value not in ("*", "/"):
                return expr
            self.take()
            self.counted()
            expr = self._binary(value, expr, self.unary())

    @staticmethod
    def _binary(op: str, left: _Eval, right: _Eval) -> _Eval:
        return lambda m, lk: _arith(op, left(m, lk), right(m, lk))

    def unary(self) -> _Eval:
        kind, value = self.peek()
        if kind == "op" and value in ("+", "-"):
            self.take()
            self.deeper()
            inner = self.unary()
            self.depth -= 1
            if value == "+":
                return lambda m, lk: inner(m, lk) if _num(inner(m, lk)) else None
            return lambda m, lk: _arith("-", 0, inner(m, lk))
        return self.primary()

    def primary(self) -> _Eval:
        kind, value = self.take()
        if kind == "lit":
            constant = value
            return lambda m, lk: constant
        if kind == "id":
            name = value
            self.names.add(name)

            def field(memo: dict[str, Any], lookup: Lookup) -> Any:
                try:
                    return memo[name]
                except KeyError:
                    found = memo[name] = _plain(lookup(name))
                    return found
            return field
        if (kind, value) == ("op", "("):
            self.deeper()
            inner = self.disjunction()
            self.depth -= 1
            self.expect("op", ")", ")")
            return inner
        if kind == "end":
            raise SelectorError("the selector ends where a value was expected")
        raise SelectorError(f"expected a value, found {value!r}")


def _plain(value: Any) -> Any:
    """A field's value as the selector language has it: numbers, strings and
    booleans; anything else (binary, lists, maps...) is unknown."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)   # (a subclass such as a symbol compares as its text)
    return None


class Selector:
    """A compiled selector: ``matches(lookup)`` is true only when the expression
    evaluates to TRUE (FALSE and unknown do not match)."""

    __slots__ = ("_run", "names", "text")

    def __init__(self, text: str, run: _Eval, names: frozenset[str]) -> None:
        self.text = text
        self.names = names   # the identifiers it names (what ``lookup`` may be asked)
        self._run = run

    def matches(self, lookup: Lookup) -> bool:
        return self._run({}, lookup) is True

    def evaluate(self, lookup: Lookup) -> bool | None:
        """The expression's truth value: True, False or None (unknown)."""
        value = self._run({}, lookup)
        return value if isinstance(value, bool) else None

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str, max_length: int = MAX_SELECTOR_LENGTH) -> Selector:
    """Parse ``text`` into a ``Selector``; ``SelectorError`` says why it does not
    parse (or is over ``max_length``, ``MAX_DEPTH`` or ``MAX_OPERATORS``)."""
    if len(text) > max_length:
        raise SelectorError(f"longer than {max_length} characters "
                            "(--amqp-max-selector-length)")
    if not text.strip():
        raise SelectorError("empty")
    parser = _Parser(text)
    try:
        run = parser.parse()
    except RecursionError:
        raise SelectorError("nested too deeply") from None
    return Selector(text, _truth(run), frozenset(parser.names))
