"""The engine profile a worker chooses: extra_buffers auto / on / off, the safe profile, on each CPU kind."""

from __future__ import annotations

import pytest

from barrel_inference.hostinfo import cpu_flags, cpu_signature, has_amx
from barrel_inference.worker.engine_profile import resolve

SAPPHIRE_RAPIDS = frozenset("fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8".split())
AVX2_LAPTOP = frozenset("fpu sse2 avx avx2 fma f16c".split())
AVX512_NO_AMX = frozenset("fpu sse2 avx2 avx512f avx512bw avx512_vnni".split())
APPLE_ARM = frozenset("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp".split())


@pytest.mark.parametrize(
    "profile, setting, flags, extra",
    [
        ("default", "auto", SAPPHIRE_RAPIDS, False),  # AMX layouts crash llama.cpp: off
        ("default", "auto", AVX2_LAPTOP, True),  # repacked layouts speed up Q4_0 there: on
        ("default", "auto", AVX512_NO_AMX, True),
        ("default", "auto", APPLE_ARM, True),
        ("default", "on", SAPPHIRE_RAPIDS, True),  # the operator's word wins
        ("default", "off", AVX2_LAPTOP, False),
        ("safe", "on", AVX2_LAPTOP, False),  # the safe profile wins over everything
        ("safe", "auto", APPLE_ARM, False),
    ],
)
def test_resolve(profile, setting, flags, extra):
    p = resolve(profile, setting, flags)
    assert p.name == profile and p.extra_buffers is extra and p.reason


def test_resolve_rejects_unknown_values():
    with pytest.raises(ValueError, match="extra_buffers"):
        resolve("default", "maybe", AVX2_LAPTOP)
    with pytest.raises(ValueError, match="profile"):
        resolve("fast", "auto", AVX2_LAPTOP)


def test_cpu_flags_and_signature_from_cpuinfo():
    intel = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: fpu avx2 amx_tile amx_int8\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm\nCPU part\t: 0xd0c\n"
    assert cpu_flags(intel) == {"fpu", "avx2", "amx_tile", "amx_int8"} and has_amx(cpu_flags(intel))
    assert cpu_flags(arm) == {"fp", "asimd", "evtstrm"} and not has_amx(cpu_flags(arm))
    assert cpu_flags("") == frozenset()
    assert cpu_signature(intel) != cpu_signature(intel.replace(" amx_tile amx_int8", ""))
    assert cpu_signature(intel) == cpu_signature(intel)
