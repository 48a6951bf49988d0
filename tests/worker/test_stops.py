import pytest

from barrel_inference.worker.stops import StopMatcher


def run(stops, pieces):
    m = StopMatcher(stops)
    out, matched = [], None
    for p in pieces:
        text, matched = m.push(p)
        out.append(text)
        if matched:
            break
    else:
        out.append(m.flush())
    return "".join(out), matched, out


@pytest.mark.parametrize(
    "stops, pieces, text, matched",
    [
        (["END"], ["hello ", "E", "N", "D", " more"], "hello ", "END"),  # split over three tokens
        (["END"], ["hello EN", "D"], "hello ", "END"),
        (["END"], ["hello EN", "x"], "hello ENx", None),  # a false start is released
        (["\n\n"], ["a\n", "\nb"], "a", "\n\n"),
        (["ab", "b"], ["xab"], "x", "ab"),  # earliest match wins
        (["abc"], ["xxab"], "xxab", None),  # flushed at the end
        ([], ["plain"], "plain", None),
        (["<|im_end|>"], ["hi<|im", "_e", "nd|>"], "hi", "<|im_end|>"),
    ],
)
def test_stop_sequences(stops, pieces, text, matched):
    got, m, _ = run(stops, pieces)
    assert (got, m) == (text, matched)


def test_no_part_of_a_stop_sequence_is_emitted_before_it_is_decided():
    _, _, chunks = run(["STOP"], ["go S", "T", "O", "P"])
    assert chunks == ["go ", "", "", ""]
