"""Grammar-constrained sampling checks the best candidates first: the same tokens as checking the
whole vocabulary (greedy and seeded top-k sampling), for a fraction of the grammar's work."""

import pytest

import barrel_inference.worker.engine as engine_mod
import barrel_inference.worker.samplers as samplers_mod
from barrel_inference.protocol import Sampling

SCHEMAS = [
    {},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}}},
    {"enum": [f"option {i}" for i in range(40)]},
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 8},
]
SAMPLINGS = [
    Sampling(temperature=0),
    Sampling(temperature=0, logit_bias={40: 5.0}, repeat_penalty=1.3),
    Sampling(temperature=0.9, top_k=8, seed=7),
    Sampling(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=3),
    Sampling(temperature=0.8, top_k=0, seed=11),  # no top-k: the whole vocabulary every time
]


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    e = engine_mod.LlamaEngine(str(tiny_gguf), n_ctx=256, n_seq_max=1, threads=1)
    yield e
    e.close()


def generate(e, sampling, grammar, n=24):
    sampler = e.make_sampler(sampling, grammar)
    e.seq_clear(0)
    prompt = e.tokenize("Answer in JSON: ", True, True)
    assert e.decode(prompt, list(range(len(prompt))), [0] * len(prompt), [False] * (len(prompt) - 1) + [True]) == 0
    out, pos, idx = [], len(prompt), len(prompt) - 1
    try:
        for _ in range(n):
            tok = e.sample(sampler, idx)
            out.append(tok)
            if e.is_eog(tok):
                break
            assert e.decode([tok], [pos], [0], [True]) == 0
            pos, idx = pos + 1, 0
    finally:
        sampler.free()
    return out


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_staged_grammar_sampling_equals_the_whole_vocabulary(engine, monkeypatch, schema, sampling):
    grammar = engine.grammar_from_schema(schema)
    sizes = []
    apply = samplers_mod.Samplers._apply
    monkeypatch.setattr(samplers_mod.Samplers, "_apply", lambda self, smpl, cand: (sizes.append(len(cand)), apply(self, smpl, cand))[1])
    staged = generate(engine, sampling, grammar)
    if sampling.top_k or sampling.temperature <= 0:
        assert 64 in sizes  # the grammar checked 64 candidates instead of the vocabulary, at least once
    monkeypatch.setattr(samplers_mod, "GRAMMAR_STAGES", ())
    whole = generate(engine, sampling, grammar)
    assert staged == whole and len(staged) > 1


def test_constrained_output_parses(engine):
    import json

    grammar = engine.grammar_from_schema(SCHEMAS[1])
    text = engine.detokenize(generate(engine, Sampling(temperature=0), grammar, n=200))
    assert isinstance(json.loads(text), dict)
