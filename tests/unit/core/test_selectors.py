"""The JMS message selector language (``core.selectors``), from the descriptions
and examples of JMS 2.0 §3.8.1: literals, identifiers, comparison, LIKE with
ESCAPE, IN, BETWEEN, IS [NOT] NULL, arithmetic and three-valued logic (against a
reference evaluator with hypothesis), and the bounds."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqttamqp.core.selectors import (
    MAX_DEPTH,
    MAX_OPERATORS,
    MAX_SELECTOR_LENGTH,
    SelectorError,
    compile_selector,
)


def _eval(text: str, **fields: Any) -> bool | None:
    return compile_selector(text).evaluate(fields.get)


def test_the_specification_example() -> None:
    """JMS 2.0's example ``JMSType = 'car' AND color = 'blue' AND weight > 2500``."""
    text = "JMSType = 'car' AND color = 'blue' AND weight > 2500"
    assert _eval(text, JMSType="car", color="blue", weight=3000) is True
    assert _eval(text, JMSType="car", color="blue", weight=2500) is False
    assert _eval(text, JMSType="car", color="blue") is None
    assert _eval(text, JMSType="van", color="blue") is False


@pytest.mark.parametrize(("text", "value", "expected"), [
    ("phone LIKE '12%3'", "123", True),
    ("phone LIKE '12%3'", "12993", True),
    ("phone LIKE '12%3'", "1234", False),
    ("word LIKE 'l_se'", "lose", True),
    ("word LIKE 'l_se'", "loose", False),
    ("underscored LIKE '\\_%' ESCAPE '\\'", "_foo", True),
    ("underscored LIKE '\\_%' ESCAPE '\\'", "bar", False),
    ("phone NOT LIKE '12%3'", "123", False),
    ("phone NOT LIKE '12%3'", "1234", True),
])
def test_like(text: str, value: str, expected: bool) -> None:
    """The specification's LIKE examples: ``_`` one character, ``%`` any, ESCAPE."""
    name = text.split()[0]
    assert _eval(text, **{name: value}) is expected


def test_like_and_in_of_null_are_unknown() -> None:
    """LIKE and IN on a missing (NULL) identifier are unknown, NOT of them too."""
    assert _eval("phone LIKE '1%'") is None
    assert _eval("phone NOT LIKE '1%'") is None
    assert _eval("Country IN ('UK')") is None
    assert _eval("Country NOT IN ('UK')") is None


def test_in() -> None:
    """``Country IN (' UK', 'US', 'France')``: true for 'US', false for 'Peru'
    (and for 'UK': the spec's list has ' UK')."""
    text = "Country IN (' UK', 'US', 'France')"
    assert _eval(text, Country="US") is True
    assert _eval(text, Country="Peru") is False
    assert _eval(text, Country="UK") is False
    assert _eval("Country NOT IN (' UK', 'US', 'France')", Country="Peru") is True


def test_between() -> None:
    """``age BETWEEN 15 AND 19`` is ``age >= 15 AND age <= 19``; NOT BETWEEN is
    ``age < 15 OR age > 19``."""
    for age in (14, 15, 17, 19, 20):
        assert _eval("age BETWEEN 15 AND 19", age=age) is (15 <= age <= 19)
        assert _eval("age NOT BETWEEN 15 AND 19", age=age) is not (15 <= age <= 19)
    assert _eval("age BETWEEN 15 AND 19") is None


def test_is_null() -> None:
    """IS NULL is true of a missing property, IS NOT NULL of a present one; never
    unknown."""
    assert _eval("prop_name IS NULL") is True
    assert _eval("prop_name IS NOT NULL") is False
    assert _eval("prop_name IS NULL", prop_name=0) is False
    assert _eval("prop_name IS NOT NULL", prop_name="x") is True


def test_literals() -> None:
    """String literals double their quote; exact and approximate numerics (with
    exponents, signs, Java suffixes, hex); TRUE and FALSE in any case."""
    assert _eval("s = 'literal''s'", s="literal's") is True
    assert _eval("n = 57", n=57) is True
    assert _eval("n = -957", n=-957) is True
    assert _eval("n = +62", n=62) is True
    assert _eval("n = 7E3", n=7000) is True
    assert _eval("n = -57.9E2", n=-5790.0) is True
    assert _eval("n = 7.", n=7) is True
    assert _eval("n = 10L AND m = 1.5F AND h = 0x1F", n=10, m=1.5, h=31) is True
    assert _eval("b = true AND c = FALSE", b=True, c=False) is True


def test_identifiers_case_sensitive_keywords_not() -> None:
    """Identifiers are case sensitive; keywords are not."""
    assert _eval("Colour = 'red'", colour="red") is None
    assert _eval("colour = 'red' and NOT (x is null)", colour="red", x=1) is True


def test_comparison_types() -> None:
    """Numbers compare across int and float; strings and booleans only with = and
    <>; values of unlike types compare false (NULL: unknown)."""
    assert _eval("a = 2.0", a=2) is True
    assert _eval("a <> 'x'", a="y") is True
    assert _eval("a > 'x'", a="y") is False
    assert _eval("a = 1", a="1") is False
    assert _eval("a = TRUE", a=1) is False
    assert _eval("NOT (a = 1)", a="1") is True
    assert _eval("a = 1") is None


def test_arithmetic() -> None:
    """+ - * / with precedence, unary signs, Java integer division; NULL, a string
    or a division by zero make it unknown."""
    assert _eval("a + b * 2 = 7", a=1, b=3) is True
    assert _eval("(a + b) * 2 = 8", a=1, b=3) is True
    assert _eval("-a = -4 AND a / 3 = 1 AND -a / 3 = -1", a=4) is True
    assert _eval("a / 2 = 2.5", a=5.0) is True
    assert _eval("a + 1 > 0") is None
    assert _eval("a + 1 > 0", a="x") is None
    assert _eval("a / 0 > 0", a=1) is None


def test_header_fields_are_identifiers() -> None:
    """The JMS header names are plain identifiers, whatever ``lookup`` gives."""
    text = "JMSPriority > 4 AND JMSDeliveryMode = 'PERSISTENT' AND JMSMessageID IS NOT NULL"
    assert _eval(text, JMSPriority=7, JMSDeliveryMode="PERSISTENT", JMSMessageID="m1") is True
    assert _eval(text, JMSPriority=4, JMSDeliveryMode="PERSISTENT", JMSMessageID="m1") is False


def test_lookup_asked_once_per_identifier_and_lazily() -> None:
    """An identifier is looked up at most once per evaluation, and only when the
    evaluation reaches it."""
    asked: list[str] = []

    def lookup(name: str) -> Any:
        asked.append(name)
        return {"a": 1, "b": 2}.get(name)

    selector = compile_selector("a = 2 AND b = 2 OR a = 1 OR c = 3")
    assert selector.matches(lookup)
    assert asked == ["a"]


@pytest.mark.parametrize("text", [
    "", "   ", "a =", "a = 'x", "a LIKE b", "a IN ()", "a IN (1)", "a BETWEEN 1",
    "a IS 3", "a NOT = 1", "(a = 1", "a = 1)", "a LIKE 'x' ESCAPE 'ab'",
    "a LIKE 'x\\' ESCAPE '\\'", "a = 1 #", "AND",
])
def test_refused_with_a_reason(text: str) -> None:
    """What does not parse raises SelectorError with a reason."""
    with pytest.raises(SelectorError) as err:
        compile_selector(text)
    assert str(err.value)


def test_bounds() -> None:
    """Length, nesting and operator count are bounded."""
    with pytest.raises(SelectorError, match="longer"):
        compile_selector("a = '" + "x" * MAX_SELECTOR_LENGTH + "'")
    with pytest.raises(SelectorError, match="nested"):
        compile_selector("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(SelectorError, match="operators"):
        compile_selector(" + ".join(["a"] * (MAX_OPERATORS + 2)) + " = 1")
    deep = compile_selector(" OR ".join(["a = 1"] * MAX_OPERATORS))
    assert deep.matches({"a": 1}.get)


# -- three-valued logic against a reference evaluator --------------------------------

_ATOMS = {"t": True, "f": False}   # ("u": missing, so unknown)


def _kleene_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return True if a is True and b is True else None


def _kleene_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return False if a is False and b is False else None


_leaf = st.sampled_from(["t", "f", "u"]).map(lambda n: (f"{n} = TRUE", _ATOMS.get(n)))


def _extend(children: Any) -> Any:
    def both(op: str) -> Any:
        def make(pair: Any) -> Any:
            (lt, lv), (rt, rv) = pair
            value = _kleene_and(lv, rv) if op == "AND" else _kleene_or(lv, rv)
            return (f"({lt} {op} {rt})", value)
        return st.tuples(children, children).map(make)
    negation = children.map(lambda c: (f"NOT ({c[0]})", None if c[1] is None else not c[1]))
    return st.one_of(both("AND"), both("OR"), negation)


@given(st.recursive(_leaf, _extend, max_leaves=12))
def test_three_valued_logic_matches_reference(case: tuple[str, bool | None]) -> None:
    """AND/OR/NOT over true, false and unknown give SQL's (Kleene's) truth values."""
    text, expected = case
    assert compile_selector(text).evaluate(_ATOMS.get) is expected


@given(st.text(alphabet="ab%_", max_size=8), st.text(alphabet="ab_%", max_size=10))
def test_like_matches_a_regular_expression(pattern: str, value: str) -> None:
    """LIKE agrees with the equivalent regular expression (``_`` one character,
    ``%`` any run) on any pattern and value."""
    import re

    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    expected = re.fullmatch(regex, value, re.DOTALL) is not None
    literal = pattern.replace("'", "''")
    assert _eval(f"v LIKE '{literal}'", v=value) is expected


def test_like_is_not_exponential() -> None:
    """A pattern of many ``%`` against a long value that fails answers (the
    matcher does not backtrack exponentially)."""
    pattern = "%a" * 30 + "%b"
    assert _eval(f"v LIKE '{pattern}'", v="a" * 2000) is False


def test_numbers_past_their_range_never_raise_while_matching() -> None:
    """An exact literal outside a Java long is refused when parsed, and arithmetic
    that overflows a float is unknown (not selected): a receiver's selector can
    never make a publish fail (review of wave 2: OverflowError reached the router)."""
    with pytest.raises(SelectorError):
        compile_selector("x * 1" + "0" * 400 + " > 0")
    huge = " * ".join(["9223372036854775807"] * 20)   # (an int past a float's range)
    assert _eval(huge + " * x > 0", x=1.5) is None
    assert _eval("x * 2 > 0", x=1e308) is True   # (inf: a float, no error)


def test_not_between_is_less_or_greater_even_on_unlike_types() -> None:
    """x NOT BETWEEN a AND b is x < a OR x > b (JMS 2.0 3.8.1.2): a string against
    numbers compares false both ways, so NOT BETWEEN is false, not the negation."""
    assert _eval("s NOT BETWEEN 1 AND 2", s="text") is False
    assert _eval("x NOT BETWEEN 1 AND 2", x=3) is True
    assert _eval("x NOT BETWEEN 1 AND 2", x=2) is False
    assert _eval("x NOT BETWEEN 1 AND 2") is None
