"""bench.replicas in a tiny configuration (collected with the test suite: `bench` is in testpaths):
it starts its daemons, runs its conversations and reports figures of the right shape. No speed is checked."""

from __future__ import annotations

from bench.replicas import parse_args, run


async def test_replicas_benchmark_runs_small(tmp_path, capsys):
    out = tmp_path / "figures.json"
    args = parse_args(["--conversations", "2", "--turns", "2", "--max-tokens", "4", "--system-words", "60",
                       "--start-timeout", "120", "--out", str(out)])  # fmt: skip
    results = await run(args)
    printed = capsys.readouterr().out
    assert out.exists() and set(results["policies"]) == {"affinity", "round_robin"}
    for policy, r in results["policies"].items():
        assert (r["requests"], r["ok"], r["errors"]) == (4, 4, [])
        assert r["prompt_tokens"] > 0 and 0.0 <= r["cached_share"] <= 1.0
        assert r["ttft_ms_p50"] is not None and r["ttft_ms_p50_later_turns"] is not None
        assert sum(sum(rep["routed"].values()) for rep in r["replicas"]) == 4
        assert printed.count(policy) >= 1
    affinity = results["policies"]["affinity"]
    # each conversation's second turn went back to its replica and found its prefix there
    assert sum(rep["routed"].get("affinity", 0) for rep in affinity["replicas"]) == 2
    assert affinity["cached_tokens"] > 0
    assert {k for rep in results["policies"]["round_robin"]["replicas"] for k in rep["routed"]} == {"round_robin"}
