"""The workloads of issue 4, each driven through an OpenAI-compatible endpoint by bench.client.

- concurrency: N simultaneous streaming completions of `max_tokens` tokens (EOS suppressed)
- long_prompt: ~2,000-token prompts arriving while 4 streams decode; how long running streams stall
- conversation: a 10-turn chat, TTFT per turn (the history grows every turn)
"""

from __future__ import annotations

import asyncio
import random
import time

from .client import DEFAULT_SUPPRESS, LoadClient, RequestSpec, StreamResult, percentile, summarize

SUBJECTS = [
    "a lighthouse keeper", "a clockmaker", "a young cartographer", "an old fisherman", "a travelling musician",
    "a baker in the mountains", "a retired astronaut", "a botanist", "a lost robot", "a village librarian",
    "a ship's cook", "a desert guide", "a beekeeper", "a glassblower", "a night-train conductor", "a tailor",
    "a chess prodigy", "a weather scientist", "a potter", "a mountain rescuer",
]  # fmt: skip


def short_prompt(i: int) -> str:
    """Distinct per stream, so no system can answer one stream from another's prompt cache."""
    who = SUBJECTS[i % len(SUBJECTS)]
    return f"Story {i + 1}. Once upon a time, in a small town by the sea, there lived {who} who"


WORDS = (
    "river stone market lantern winter garden copper thread harbor meadow engine signal orchard candle "
    "valley ladder compass mirror forest bridge kettle window island shadow ribbon marble feather anchor "
    "canyon violin pepper saddle tunnel blanket meteor pocket ginger ferry castle puzzle velvet crater"
).split()


def filler_text(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rng.choice(WORDS))
        if i % 12 == 11:
            out.append(f"{rng.randint(10, 9999)}.")
    return " ".join(out)


def long_prompt(seed: int, target_tokens: int, count_tokens) -> str:
    """A prompt of about target_tokens tokens (counted with the model's own tokenizer)."""
    head = f"Document {seed}. Read the notes below and summarise them.\n\n"
    n_words = target_tokens
    text = head + filler_text(seed, n_words)
    for _ in range(8):
        n = count_tokens(text)
        if abs(n - target_tokens) <= target_tokens // 100:
            break
        n_words = max(1, int(n_words * target_tokens / n))
        text = head + filler_text(seed, n_words)
    return text + "\n\nSummary:"


# ---- concurrency ----------------------------------------------------------------------------------


async def concurrency(client: LoadClient, n: int, *, rounds: int, max_tokens: int, temperature: float,
                      suppress: tuple[int, ...] = DEFAULT_SUPPRESS) -> dict:  # fmt: skip
    """`rounds` waves of n simultaneous streams; figures over all waves (wall = sum of wave walls).
    `suppress`: token ids biased away (the model's end-of-generation tokens), so every stream runs to max_tokens."""
    results: list[StreamResult] = []
    wall = 0.0
    for r in range(rounds):
        specs = [
            RequestSpec(prompt=short_prompt(r * n + i), max_tokens=max_tokens, temperature=temperature, seed=1000 + i,
                        suppress=suppress)  # fmt: skip
            for i in range(n)
        ]
        t0 = time.perf_counter()
        wave = await asyncio.gather(*(client.stream(s) for s in specs))
        wall += time.perf_counter() - t0
        results.extend(wave)
    out = summarize(results, wall)
    out["concurrency"] = n
    out["rounds"] = rounds
    out["max_tokens"] = max_tokens
    return out


# ---- long prompt arriving during decode -----------------------------------------------------------


def _stall(background: list[StreamResult], t0: float, t1: float) -> tuple[float | None, int]:
    """Largest gap (s) between consecutive chunks of streams that were running over [t0, t1].

    A stream counts as running when it had produced output before t0 and produced more after it.
    The gap of a stream spanning t0..t1 includes the time until its first chunk after t1.
    """
    worst, running = None, 0
    for r in background:
        times = r.chunk_times
        if not times or times[0] >= t0 or times[-1] <= t0:
            continue
        running += 1
        for a, b in zip(times, times[1:]):
            if b >= t0 and a <= t1:  # the gap overlaps the window
                g = b - a
                worst = g if worst is None else max(worst, g)
    return worst, running


async def long_prompt_during_decode(
    client: LoadClient,
    prompts: list[str],
    *,
    background: int = 4,
    background_tokens: int = 256,
    long_max_tokens: int = 8,
    temperature: float = 0.0,
    start_timeout: float = 120.0,
    suppress: tuple[int, ...] = DEFAULT_SUPPRESS,
) -> dict:
    """Start `background` streams; once all produce output, send each long prompt in turn (1 s apart)."""
    bg_specs = [
        RequestSpec(prompt=short_prompt(100 + i), max_tokens=background_tokens, temperature=temperature, seed=2000 + i,
                    suppress=suppress)  # fmt: skip
        for i in range(background)
    ]
    started = asyncio.Event()
    first_seen: set[int] = set()

    def make_cb(i):
        def cb(res, t):
            first_seen.add(i)
            if len(first_seen) == background:
                started.set()

        return cb

    bg_tasks = [asyncio.create_task(client.stream(s, on_chunk=make_cb(i))) for i, s in enumerate(bg_specs)]
    all_started = True
    try:
        await asyncio.wait_for(started.wait(), start_timeout)
    except asyncio.TimeoutError:
        all_started = False
    await asyncio.sleep(1.0)
    arrivals = []
    for k, prompt in enumerate(prompts):
        spec = RequestSpec(prompt=prompt, max_tokens=long_max_tokens, temperature=temperature, seed=3000 + k, suppress=suppress)
        res = await client.stream(spec)
        arrivals.append(res)
        await asyncio.sleep(1.0)
    bg = await asyncio.gather(*bg_tasks)
    windows = []
    for res in arrivals:
        t1 = res.t_first if res.t_first is not None else res.t_end
        stall, running = _stall(bg, res.t_start, t1)
        windows.append({
            "prompt_tokens": res.prompt_tokens,
            "ttft_ms": (t1 - res.t_start) * 1000.0,
            "ok": res.ok,
            "error": res.error,
            "running_streams": running,
            "max_gap_ms": None if stall is None else stall * 1000.0,
        })  # fmt: skip
    # the background streams' ordinary gaps, outside every window, as the baseline
    base = []
    for r in bg:
        for a, b in zip(r.chunk_times, r.chunk_times[1:]):
            if not any(b >= w.t_start and a <= (w.t_first or w.t_end) for w in arrivals):
                base.append((b - a) * 1000.0)
    stalls = [w["max_gap_ms"] for w in windows if w["max_gap_ms"] is not None]
    return {
        "background_streams": background,
        "all_background_started": all_started,
        "background_ok": sum(r.ok for r in bg),
        "arrivals": windows,
        "max_gap_ms": max(stalls) if stalls else None,
        "baseline_itl_ms_p50": percentile(base, 50),
        "baseline_itl_ms_max": max(base) if base else None,
        "long_ttft_ms_p50": percentile([w["ttft_ms"] for w in windows], 50),
    }


# ---- multi-turn conversation ----------------------------------------------------------------------

QUESTIONS = [
    "Tell me about the history of lighthouses.", "How were they powered before electricity?",
    "Who looked after them?", "What was a typical day like for a keeper?", "Were there famous keepers?",
    "How did storms affect the work?", "When did automation arrive?", "What happened to the keepers then?",
    "Which lighthouses can people visit today?", "Summarise our conversation in three sentences.",
]  # fmt: skip


async def conversation(client: LoadClient, *, turns: int = 10, max_tokens: int = 64, temperature: float = 0.0,
                       suppress: tuple[int, ...] = DEFAULT_SUPPRESS) -> dict:  # fmt: skip
    messages: list[dict] = []
    per_turn = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        res = await client.stream(RequestSpec(messages=list(messages), max_tokens=max_tokens, temperature=temperature, suppress=suppress))
        per_turn.append({
            "turn": i + 1,
            "ttft_ms": None if res.ttft is None else res.ttft * 1000.0,
            "prompt_tokens": res.prompt_tokens,
            "tokens": res.n_tokens,
            "ok": res.ok,
            "error": res.error,
        })  # fmt: skip
        messages.append({"role": "assistant", "content": res.text})
    ttfts = [t["ttft_ms"] for t in per_turn if t["ttft_ms"] is not None]
    return {
        "turns": per_turn,
        "ttft_ms_first": ttfts[0] if ttfts else None,
        "ttft_ms_last": ttfts[-1] if ttfts else None,
        "ttft_ms_p50": percentile(ttfts, 50),
        "ok": sum(t["ok"] for t in per_turn),
    }
