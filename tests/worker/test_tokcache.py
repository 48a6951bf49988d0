"""The cache of tokenised text runs: the same tokens as the tokenizer, each long run tokenised once,
bounded by characters (least recently used out), short runs never kept."""

from barrel_inference.worker.tokcache import TokenCache


class Counting:
    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.calls.append(text)
        return [ord(c) for c in text]


def test_a_repeated_run_is_tokenised_once_with_the_same_tokens():
    tok = Counting()
    cache = TokenCache(tok, min_chars=8, max_chars=1000)
    run = "a system prompt that comes back every turn"
    first, again = cache(run), cache(run)
    assert first == again == [ord(c) for c in run]
    assert tok.calls == [run] and (cache.hits, cache.misses) == (1, 1)
    again.append(0)  # the caller owns what it gets: the cache is not changed through it
    assert cache(run) == first


def test_short_runs_are_not_kept_and_the_bound_drops_the_least_recently_used():
    tok = Counting()
    cache = TokenCache(tok, min_chars=8, max_chars=30)
    cache("short")
    cache("short")
    assert tok.calls == ["short", "short"]
    a, b, c = "a" * 12, "b" * 12, "c" * 12
    cache(a), cache(b), cache(a)  # a is now the more recent of the two
    cache(c)  # 36 characters > 30: b goes
    tok.calls.clear()
    cache(a), cache(c), cache(b)
    assert tok.calls == [b]


def test_prompt_tokens_are_the_same_through_the_cache(tiny_gguf):
    """A conversation's prompt tokenised with the cache, turn after turn, equals the uncached tokens."""
    from barrel_inference.protocol.messages import ChatMessage, Submit
    from barrel_inference.worker.engine import LlamaEngine
    from barrel_inference.worker.prompt import PromptBuilder
    from barrel_inference.worker.templates import ChatTemplate

    e = LlamaEngine(str(tiny_gguf), n_ctx=2048, n_seq_max=1, threads=1)
    try:
        t = ChatTemplate.choose(None, e.chat_template, e.architecture, "", "")
        cached, plain = PromptBuilder(e, t, 2048, "tiny"), PromptBuilder(e, t, 2048, "tiny")
        plain.run_tokens = lambda text: e.tokenize(text, add_special=False, parse_special=False)
        msgs = [ChatMessage("system", "You answer briefly and never use lists. " * 10)]
        for i in range(4):
            msgs.append(ChatMessage("user", f"question {i}: what is {i} plus {i}? " * 3))
            sub = Submit(id=f"r{i}", messages=list(msgs))
            assert cached.tokens(sub) == plain.tokens(sub)
            msgs.append(ChatMessage("assistant", f"it is {2 * i}, as anyone can see. " * 4))
        assert cached.run_tokens.hits > 0
    finally:
        e.close()
