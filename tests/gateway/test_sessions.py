"""Session ids and prompt normalisers (family-neutral helpers of the gateway)."""

import re

import pytest

from barrel_inference.config import CLAUDE_CODE_ATTRIBUTION, Settings
from barrel_inference.gateway.metrics import GatewayMetrics
from barrel_inference.gateway.sessions import PromptNormalizer, prepare, session_id
from barrel_inference.protocol import CacheInfo, ChatMessage, Submit


@pytest.mark.parametrize(
    "headers, kw, want",
    [
        ({"x-conversation-id": "c1"}, {}, "h:c1"),
        ({"x-session-id": " s9 "}, {}, "h:s9"),
        ({"x-conversation-id": "c1", "x-session-id": "s9"}, {}, "h:c1"),  # the conversation header first
        ({"x-session-id": ""}, {}, None),
        ({}, {}, None),
        (None, {}, None),
    ],
)
def test_session_from_headers(headers, kw, want):
    assert session_id(headers, **kw) == want


def test_session_from_user_id_and_first_user_message():
    msgs = [ChatMessage("system", "sys"), ChatMessage("user", "fix the bug"), ChatMessage("assistant", "ok")]
    a = session_id({}, user_id="user_abc_session_1", messages=msgs)
    assert a is not None and a.startswith("u:")
    assert session_id({}, user_id="user_abc_session_1", messages=msgs[:2]) == a  # later turns: the same session
    sub = [ChatMessage("user", "explore the repo")]
    assert session_id({}, user_id="user_abc_session_1", messages=sub) != a  # a sub-agent: its own session
    assert session_id({"x-session-id": "h"}, user_id="u", messages=msgs) == "h:h"  # the header wins
    assert len(session_id({"x-session-id": "x" * 5000})) < 80


def test_claude_code_attribution_line_is_removed_from_system_messages_only():
    norm = PromptNormalizer(Settings().prompt_normalizers)
    line = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;"
    msgs = [
        ChatMessage("system", line + "\nYou are Claude Code.\nBe brief."),
        ChatMessage("user", line),
    ]
    out = norm.messages(msgs)
    assert out[0].content == "You are Claude Code.\nBe brief."
    assert out[1].content == line  # user text is never touched
    other = norm.messages([ChatMessage("system", line.replace("fa690", "0aaa9") + "\nYou are Claude Code.\nBe brief.")])
    assert other[0].content == out[0].content  # two requests' system prompts are now identical
    assert norm.messages([ChatMessage("system", line)])[0].content == ""
    assert PromptNormalizer([]).messages(msgs) is msgs  # normalising off


def test_prepare_sets_session_and_normalises():
    s = Submit("r1", messages=[ChatMessage("system", "x-anthropic-billing-header: cch=1;\nsys"), ChatMessage("user", "hi")])
    prepare(s, PromptNormalizer([CLAUDE_CODE_ATTRIBUTION]), {"x-session-id": "abc"})
    assert s.session == "h:abc" and s.messages[0].content == "sys"
    keep = Submit("r2", prompt="hi", session="u:given")
    prepare(keep, None, {"x-session-id": "abc"})
    assert keep.session == "h:abc"  # a session header beats a family's own derivation (metadata.user_id)
    own = Submit("r3", prompt="hi", session="u:given")
    prepare(own, None, {"user-agent": "claude-cli"})
    assert own.session == "u:given"  # which stands without one
    assert re.compile(CLAUDE_CODE_ATTRIBUTION)


def test_cache_metrics():
    m = GatewayMetrics()
    m.record_cache("tiny", CacheInfo("sticky", evaluated_tokens=5, ram_bytes=100, ram_entries=1, evictions=2))
    m.record_cache("tiny", CacheInfo("cold", miss="diverged-at=7", evaluated_tokens=9, evictions=3))
    text = m.render().decode()
    assert 'barrel_inference_cache_hits_total{kind="sticky",model="tiny"} 1.0' in text
    assert 'barrel_inference_prompt_tokens_evaluated_total{model="tiny"} 14.0' in text
    assert 'barrel_inference_cache_misses_total{model="tiny",reason="diverged-at"} 1.0' in text
    assert 'barrel_inference_kv_evictions_total{model="tiny"} 3.0' in text
    assert 'barrel_inference_kv_tier_bytes{model="tiny",tier="ram"} 0.0' in text  # the latest figures
    m.record_cache("tiny", CacheInfo("disk", evaluated_tokens=1, ram_bytes=300, ram_entries=2, disk_bytes=900, disk_entries=5,
                                     evictions=4))  # fmt: skip
    text = m.render().decode()
    for line in ('barrel_inference_cache_hits_total{kind="disk",model="tiny"} 1.0',
                 'barrel_inference_kv_tier_bytes{model="tiny",tier="ram"} 300.0',
                 'barrel_inference_kv_tier_entries{model="tiny",tier="ram"} 2.0',
                 'barrel_inference_kv_tier_bytes{model="tiny",tier="disk"} 900.0',
                 'barrel_inference_kv_tier_entries{model="tiny",tier="disk"} 5.0',
                 'barrel_inference_kv_evictions_total{model="tiny"} 4.0'):  # fmt: skip
        assert line in text, line


def test_kv_layout_line_of_the_doctor_report():
    from barrel_inference.sysreport import kv_layout_text

    assert kv_layout_text(False, "auto: a buffer per sequence takes 0.10 GiB of KV, within 2 GiB") == (
        "a buffer per sequence (auto: a buffer per sequence takes 0.10 GiB of KV, within 2 GiB)"
    )
    assert kv_layout_text(True, "set") == "one buffer for all sequences (set)"
    assert kv_layout_text(None, "").startswith("unknown")


def test_kv_selftest_line_of_the_doctor_report():
    from barrel_inference.sysreport import kv_selftest_text

    assert kv_selftest_text(None).startswith("off")
    exact = {"exact_up_to": None, "probes": [{"tokens": 256, "exact": True, "max_abs_diff": 0.0}]}
    assert kv_selftest_text(exact) == "exact (256 tokens exact)"
    swa = {"exact_up_to": 512, "probes": [{"tokens": 512, "exact": True, "max_abs_diff": 0.0},
                                         {"tokens": 576, "exact": False, "max_abs_diff": 1.5}]}  # fmt: skip
    assert kv_selftest_text(swa) == "exact up to 512 tokens (longer states recomputed) (512 tokens exact, 576 tokens off by 1.5)"
    line = kv_selftest_text({**swa, "flash_attn": "auto"})
    assert line.endswith('576 tokens off by 1.5; flash_attn auto (flash_attn = "off" makes restores exact on sliding-window models, at some speed))')
    assert kv_selftest_text({**exact, "flash_attn": "off"}) == "exact (256 tokens exact; flash_attn off)"
    # a state that matches at one thread: complete, which kv_restore = "complete" restores
    gemma = {"exact_up_to": 512, "complete_up_to": None, "flash_attn": "on", "probes": [
        {"tokens": 512, "exact": True, "complete": True, "max_abs_diff": 0.0},
        {"tokens": 576, "exact": False, "complete": True, "max_abs_diff": 5.4}]}  # fmt: skip
    strict = kv_selftest_text({**gemma, "kv_restore": "exact", "restore_up_to": 512})
    assert strict == ("exact up to 512 tokens (longer states recomputed) (512 tokens exact, 576 tokens off by 5.4; exact at one "
                      'thread; flash_attn on (every state is complete: kv_restore = "complete" restores them at any length))')
    loose = kv_selftest_text({**gemma, "kv_restore": "complete", "restore_up_to": None})
    assert loose == ("complete (512 tokens exact, 576 tokens off by 5.4; exact at one thread; flash_attn on; bit for bit up to "
                     "512 tokens)")
    lost = {**gemma, "complete_up_to": 512, "kv_restore": "complete", "restore_up_to": 512,
            "probes": [gemma["probes"][0], {**gemma["probes"][1], "complete": False}]}  # fmt: skip
    # relaid before going on (the default on Gemma 3 with flash attention on): exact at any length
    relaid = {**gemma, "relayout": True, "relayout_up_to": None, "kv_restore": "exact", "restore_up_to": None,
              "probes": [{**p, "relayout": True} for p in gemma["probes"]]}  # fmt: skip
    assert kv_selftest_text(relaid) == ("exact, sequences relaid as their restores lie before they go on (512 tokens exact, "
                                        "576 tokens off by 5.4; exact at one thread; exact relaid; flash_attn on)")
    # "complete" relays nothing (the probes still say what relaying would give)
    assert kv_selftest_text({**relaid, "kv_restore": "complete", "relayout": False}) == (
        "complete (512 tokens exact, 576 tokens off by 5.4; exact at one thread; exact relaid; flash_attn on; bit for bit "
        "up to 512 tokens)")  # fmt: skip
    assert kv_selftest_text(lost).startswith("complete up to 512 tokens (longer states recomputed) (512 tokens exact, 576 tokens off by 5.4; flash_attn on (")