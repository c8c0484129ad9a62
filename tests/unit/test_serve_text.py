"""Streamed text of `dtrain serve`: stop strings cut it, and nothing a later token could still
change is emitted early."""

from __future__ import annotations

from dtrain_node.serve.text import StopText


def _bytes_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _run(text: str, stops: tuple[str, ...]) -> tuple[list[str], StopText]:
    st = StopText(_bytes_decode, stops)
    deltas = []
    for b in text.encode():
        deltas.append(st.push(b))
        if st.stopped:
            break
    deltas.append(st.flush())
    return deltas, st


def test_stop_string_cuts_the_text_and_is_not_returned() -> None:
    deltas, st = _run("hello world. more", ("world",))
    assert "".join(deltas) == "hello " and st.stopped


def test_the_start_of_a_stop_string_waits_until_it_is_not_one() -> None:
    deltas, st = _run("a wor wo", ("world",))
    assert not st.stopped and "".join(deltas) == "a wor wo"
    assert deltas[:5] == ["a", " ", "", "", ""]  # "wor" is held while it may become "world"
    assert deltas[5] == "wor "


def test_a_character_is_emitted_only_once_all_its_bytes_arrived() -> None:
    deltas, _ = _run("é東😀", ())
    assert "\ufffd" not in "".join(deltas) and "".join(deltas) == "é東😀"
    assert [d for d in deltas if d] == ["é", "東", "😀"]


def test_earliest_of_several_stops_wins() -> None:
    deltas, _ = _run("one two three", ("three", "two"))
    assert "".join(deltas) == "one "


def test_empty_stop_strings_are_ignored() -> None:
    deltas, st = _run("abc", ("",))
    assert "".join(deltas) == "abc" and not st.stopped
