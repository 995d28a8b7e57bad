"""The config reader's two YAML parsers agree: whatever libyaml's events (the fast path) compose
is exactly what the pure-Python parser (the reference) composes, nodes, tags and positions, and
the reference reads whatever libyaml refuses, so the reader's answers do not depend on which one
ran. The random texts here look for what the fast path must leave to the reference (each
case it names was found so; 30,000 more examples, run by hand, found nothing else)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from yaml.nodes import Node

from sharing_plugin.config import yamldoc

pytestmark = pytest.mark.skipif(yamldoc._FastLoader is None, reason="PyYAML without libyaml")

Shape = list[tuple[str, str, int, int, str | None]]

# The characters YAML gives a meaning to, a few letters and digits, and the whitespace kinds.
_ALPHABET = "-:{}[],#&*!|>'\"%@?.~ \t\nabcxyz019"
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=8))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def _mutated_documents(draw: st.DrawFn) -> str:
    """A dumped document (block or flow style) with a few characters inserted or deleted."""
    text = yaml.safe_dump(draw(_values), default_flow_style=draw(st.booleans()))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:at] + draw(st.sampled_from(_ALPHABET)) + text[at:]
        else:
            text = text[:at] + text[at + 1 :]
    return text


def _shape(node: Node | None, out: Shape) -> Shape:
    if node is None:
        return out
    value = node.value if isinstance(node.value, str) else None
    out.append((type(node).__name__, node.tag, node.start_mark.line, node.start_mark.column, value))
    if isinstance(node.value, list):
        for item in node.value:
            for child in item if isinstance(item, tuple) else (item,):
                _shape(child, out)
    return out


def _compose(loader_class: Any, text: str, *, routed: bool = True) -> Shape | str:
    """The node graph's shape, or the error the loader stopped at; `routed`: text the reader
    gives to the reference alone is not composed."""
    if routed and yamldoc._REFERENCE_ONLY.search(text):
        return "read by the reference alone"
    loader = loader_class(text)
    try:
        return _shape(loader.get_single_node(), [])
    except (yaml.YAMLError, yamldoc.YamlProblem, RecursionError, ValueError, OverflowError) as exc:
        return f"refused ({type(exc).__name__}: {exc})"
    finally:
        loader.dispose()


def _agree(text: str) -> None:
    reference = _compose(yamldoc._NoAliasLoader, text)
    if reference == "read by the reference alone":
        return  # the reader never gives such text to libyaml
    fast = _compose(yamldoc._FastLoader, text)
    # What libyaml refuses the reader reads again with the reference, whatever that says; what
    # libyaml accepts must be exactly what the reference makes of it.
    if not isinstance(fast, str):
        assert fast == reference


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=60))
def test_punctuation_soup_composes_alike(text: str) -> None:
    _agree(text)


@settings(max_examples=100, deadline=None)
@given(_mutated_documents())
def test_mutated_documents_compose_alike(text: str) -> None:
    _agree(text)


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        ("a: &x 1\nb: *x\n", "refused"),  # an alias: refused by both, at the alias
        ("a: 1\na: 2\n", "composed"),  # duplicate keys compose; the reader refuses them later
        ("a: b # c\n", "composed"),
        # A flow mapping and an explicit key: never given to libyaml, and the reference reads it.
        ("- [a, {b: c}]\n- ? k\n  : v\n", "reference alone"),
        ('\u00e9t\u00e9: "\\u00e9"\n', "composed"),
        ("[" * 200 + "]" * 200, "composed"),
    ],
)
def test_known_corners_compose_alike(text: str, outcome: str) -> None:
    reference = _compose(yamldoc._NoAliasLoader, text)
    if outcome == "reference alone":
        assert reference == "read by the reference alone"
        assert isinstance(_compose(yamldoc._NoAliasLoader, text, routed=False), list)
        return
    fast = _compose(yamldoc._FastLoader, text)
    if outcome == "refused":
        assert isinstance(reference, str) and reference.startswith("refused")
    else:
        assert isinstance(reference, list) and reference
    assert fast == reference


def test_the_reader_says_the_reference_error_where_libyaml_words_it_differently() -> None:
    text = "a: b: c\n"
    with pytest.raises(yamldoc.YamlProblem) as caught:
        yamldoc.read(text)
    slow = yamldoc._NoAliasLoader(text)
    with pytest.raises(yaml.MarkedYAMLError) as reference:
        slow.get_single_node()
    assert reference.value.problem is not None
    assert reference.value.problem in caught.value.message


def test_an_escape_past_the_last_unicode_character_is_a_problem_not_a_crash() -> None:
    # PyYAML's scanner lets chr() raise ValueError here; the reader says where instead.
    text = 'version: v1\nflags:\n  migStrategy: "\\U00110000"\n'
    with pytest.raises(yamldoc.YamlProblem) as caught:
        yamldoc.read(text)
    assert caught.value.message == (
        "invalid YAML: escape \\U00110000 is past U+10FFFF, the last Unicode character"
    )
    assert caught.value.mark == yamldoc.Mark(2, 16)
    assert yamldoc.read('a: "\\U0010FFFF"\n').value == {"a": "\U0010ffff"}
    with pytest.raises(yamldoc.YamlProblem, match=r"escape \\Ua0010000 is past U\+10FFFF"):
        yamldoc.read('a: ["\\Ua0010000"]\n')  # past a C int, too: OverflowError
