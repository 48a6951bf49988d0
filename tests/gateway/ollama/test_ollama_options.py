"""Ollama options -> engine terms, and the Modelfile parser (pure)."""

from __future__ import annotations

import pytest

from barrel_inference.gateway.errors import GatewayError
from barrel_inference.gateway.ollama import options as opts
from barrel_inference.gateway.ollama.modelfile import ModelfileError, parse


def test_every_sampling_option_reaches_the_engine():
    o = opts.to_engine({}, opts.validate({
        "temperature": 0.2, "top_k": 7, "top_p": 0.5, "min_p": 0.1, "typical_p": 0.7, "repeat_penalty": 1.3,
        "repeat_last_n": 33, "presence_penalty": 1.5, "frequency_penalty": 1.0, "seed": 42, "stop": ["\n", "user:"],
        "num_predict": 100, "num_keep": 5, "mirostat": 0, "tfs_z": 1.0, "penalize_newline": True,
    }))  # fmt: skip
    s = o.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.typical_p) == (0.2, 7, 0.5, 0.1, 0.7)
    assert (s.repeat_penalty, s.repeat_last_n, s.presence_penalty, s.frequency_penalty, s.seed) == (1.3, 33, 1.5, 1.0, 42)
    assert o.stop == ["\n", "user:"] and o.max_tokens == 100 and not o.ignore_eos and o.loader == {}


@pytest.mark.parametrize("n, max_tokens, ignore_eos", [(-1, None, False), (-2, None, True), (0, 0, False), (7, 7, False)])
def test_num_predict(n, max_tokens, ignore_eos):
    o = opts.to_engine({}, opts.validate({"num_predict": n}))
    assert (o.max_tokens, o.ignore_eos) == (max_tokens, ignore_eos)


def test_loader_options_and_model_parameters():
    o = opts.to_engine({"temperature": 0.1, "stop": ["x"], "num_ctx": 2048},
                       opts.validate({"num_ctx": 4096, "num_batch": 64, "num_thread": 2, "num_gpu": 0, "stop": "y"}))  # fmt: skip
    assert o.loader == {"n_ctx": 4096, "n_batch": 64, "threads": 2, "n_gpu_layers": 0}
    assert o.sampling.temperature == 0.1  # the model's PARAMETER where the request says nothing
    assert o.stop == ["y"]  # the request wins


@pytest.mark.parametrize(
    "options, param, words",
    [
        ({"temperature": "hot"}, "options.temperature", "must be a number"),
        ({"top_k": 1.5}, "options.top_k", "must be an integer"),
        ({"seed": True}, "options.seed", "must be an integer"),
        ({"use_mmap": 1}, "options.use_mmap", "true or false"),
        ({"stop": [1]}, "options.stop", "list of strings"),
        ({"temprature": 0.5}, "options.temprature", "did you mean 'temperature'"),
        ({"num_predict": -3}, "options.num_predict", ">= -2"),
        ({"num_ctx": 0}, "options.num_ctx", "positive"),
        ({"seed": 2**70}, "options.seed", "out of range"),
        ({"stop": [""]}, "options.stop", "must not be empty"),
    ],
)  # fmt: skip
def test_mistyped_option_names_it(options, param, words):
    with pytest.raises(GatewayError) as e:
        opts.to_engine({}, opts.validate(options))
    assert e.value.param == param and words in e.value.info.message


def test_integral_float_and_nulls_are_accepted():
    assert opts.validate({"top_k": 40.0, "seed": None}) == {"top_k": 40}


MODELFILE = '''# a comment
FROM tiny:latest
PARAMETER temperature 0.2
PARAMETER num_ctx 1024
PARAMETER stop "<|im_end|>"
PARAMETER stop "user:"
parameter use_mmap false
SYSTEM """You are
a pirate."""
TEMPLATE "{{ .Prompt }}"
MESSAGE user "Hi"
MESSAGE assistant """Arr."""
LICENSE MIT
'''


def test_modelfile_parse():
    mf = parse(MODELFILE)
    assert mf.from_ == "tiny:latest"
    assert mf.parameters == {"temperature": 0.2, "num_ctx": 1024, "stop": ["<|im_end|>", "user:"], "use_mmap": False}
    assert mf.system == "You are\na pirate." and mf.template == "{{ .Prompt }}"
    assert mf.messages == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Arr."}]
    assert mf.license == ["MIT"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("FROM x\nPARAMETER temprature 1", "line 2: unknown option 'temprature'"),
        ("FROM x\nPARAMETER num_ctx big", "line 2: parameter 'num_ctx' must be an integer"),
        ("FROM x\nFOO bar", "line 2: unknown instruction 'FOO'"),
        ('FROM x\nSYSTEM """never closed', 'unterminated'),
        ("FROM x\nMESSAGE robot hi", "MESSAGE role"),
    ],
)  # fmt: skip
def test_modelfile_errors_name_the_line(text, words):
    with pytest.raises(ModelfileError) as e:
        parse(text)
    assert words in str(e.value)


def test_think_as_template_switches():
    from barrel_inference.gateway.ollama.convert_gen import think_switches

    assert think_switches(None) == {}
    assert think_switches(True) == {"enable_thinking": True}
    assert think_switches(False) == {"enable_thinking": False}
    assert think_switches("high") == {"enable_thinking": True, "reasoning_effort": "high"}
