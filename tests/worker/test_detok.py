from barrel_inference.worker.detok import IncrementalDetokenizer


def test_multibyte_characters_are_never_split():
    data = "é€😀".encode()
    pieces = {i: bytes([b]) for i, b in enumerate(data)}
    d = IncrementalDetokenizer(pieces.__getitem__)
    outs = [d.feed(i) for i in range(len(data))]
    assert "".join(outs) == "é€😀"
    assert all(o in ("", "é", "€", "😀") for o in outs)
    assert outs[1] == "é" and outs[0] == ""


def test_invalid_bytes_are_replaced_at_flush():
    d = IncrementalDetokenizer({0: b"a", 1: b"\xe2\x82"}.__getitem__)
    assert d.feed(0) == "a"
    assert d.feed(1) == ""
    assert d.flush() == "\ufffd"
