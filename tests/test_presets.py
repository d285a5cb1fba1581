"""The host spec: what it reads off the machine it runs on."""

from __future__ import annotations

import pytest

from fusion_tvm import presets


@pytest.mark.parametrize(("flags", "bits"), [
    ({"fpu", "sse2", "avx", "avx2", "fma"}, 256),  # Zen 2 / Zen 3 / Haswell
    ({"sse2", "avx", "avx2", "avx512f", "avx512bw"}, 512),
    ({"sse2", "sse4_2"}, 128),
])
def test_host_simd_width_follows_the_cpu_flags(monkeypatch, flags, bits):
    """LLVM's vector width for a named CPU is not the register width (TVM 0.27 says 512
    for znver3 and haswell): an AVX2 host got 16-lane blocks and register tiles sized for
    32 registers (ResNet-50 on a Zen 3: 2.3x slower)."""
    monkeypatch.setattr(presets, "_cpu_flags", lambda: flags)
    assert presets.host_simd_bits(512) == bits


def test_host_simd_width_without_x86_flags_is_llvms(monkeypatch):
    monkeypatch.setattr(presets, "_cpu_flags", lambda: {"fp", "asimd", "sve"})
    assert presets.host_simd_bits(128) == 128


@pytest.fixture
def fresh_host_spec():
    """The host spec is read once per process (cached): read it again under the test's
    flags, and again after it (an AVX-512 host once kept its cached 512-bit spec here)."""
    presets.host_cpu.cache_clear()
    yield
    presets.host_cpu.cache_clear()


def test_host_spec_registers_follow_the_width(monkeypatch, fresh_host_spec):
    monkeypatch.setattr(presets, "_cpu_flags", lambda: {"sse2", "avx", "avx2", "fma"})
    spec = presets.get_hardware("host")
    assert spec.simd_width_bits == 256 and spec.num_vector_registers == 16
