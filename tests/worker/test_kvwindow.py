"""Sliding-window arithmetic (pure): what a sequence's next token attends to, and the headroom."""

import pytest

from barrel_inference.worker.kvwindow import swa_headroom, window_start


@pytest.mark.parametrize(
    "n_past, n_swa, swa_full, want",
    [
        (1000, 512, False, 489),  # positions 489 .. 999: 511 of them, and the token itself
        (512, 512, False, 1),
        (511, 512, False, 0),
        (10, 512, False, 0),
        (1000, 512, True, 0),  # swa_full keeps everything
        (1000, 0, False, 0),  # no window
    ],
)
def test_window_start(n_past, n_swa, swa_full, want):
    assert window_start(n_past, n_swa, swa_full) == want


@pytest.mark.parametrize(
    "n_ctx, n_swa, swa_full, idle, spare, want",
    [
        (4096, 512, False, 4, 200, 8),  # one context's worth of shared window cells
        (4100, 512, False, 4, 200, 9),
        (4096, 512, False, 4, 3, 3),  # never beyond the context's id limit
        (4096, 512, False, 0, 200, 0),  # no idle sequences: llama.cpp's own sizing
        (4096, 512, True, 4, 200, 0),  # swa_full: the window layers are full size already
        (4096, 0, False, 4, 200, 0),
    ],
)
def test_swa_headroom(n_ctx, n_swa, swa_full, idle, spare, want):
    assert swa_headroom(n_ctx, n_swa, swa_full, idle, spare) == want


def test_swa_headroom_is_no_more_than_the_idle_caches_may_hold():
    assert swa_headroom(8192, 1024, False, 4, 200, idle_cells=4096) == 4  # not 8: idle caches hold 4,096 tokens
    assert swa_headroom(4096, 512, False, 4, 200, idle_cells=32768) == 8  # one context, whatever they may hold
