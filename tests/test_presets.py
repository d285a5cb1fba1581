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


def test_host_fork_join_is_measured_once_and_cached(monkeypatch, tmp_path, fresh_host_spec):
    """The host spec's thread-pool fork/join is measured on the machine (it was a fixed
    10 us, 5-8x the 1.2-2.3 us a 2-core Zen 4 measures, so small kernels stayed serial and
    were priced at twice their time), once: later processes read it from the cache."""
    monkeypatch.setenv("FUSION_TVM_CACHE", str(tmp_path))
    monkeypatch.delenv("FUSION_TVM_PARALLEL_US", raising=False)
    monkeypatch.setenv("FUSION_TVM_DRAM_GBPS", "20")  # not the test's subject
    calls = []
    monkeypatch.setattr(presets, "measure_fork_join_us",
                        lambda cores: calls.append(cores) or [1.5, 1.25])
    assert presets.host_fork_join_us(2) == (1.5, 1.25)
    assert presets.host_fork_join_us(2) == (1.5, 1.25)
    assert calls == [2]
    assert presets.host_fork_join_us(1) == (0.0, 0.0)  # no pool to fork
    spec = presets.get_hardware("host")
    if spec.num_cores > 1:
        assert spec.parallel_overhead_s == pytest.approx(1.5e-6)
        assert spec.parallel_region_s == pytest.approx(1.25e-6)


def test_host_fork_join_env_override(monkeypatch):
    monkeypatch.setenv("FUSION_TVM_PARALLEL_US", "3.5")
    assert presets.host_fork_join_us(4) == (3.5, 3.5)
    monkeypatch.setenv("FUSION_TVM_PARALLEL_US", "3.5,2")
    assert presets.host_fork_join_us(4) == (3.5, 2.0)


def test_host_fork_join_remeasures_a_clamped_figure(monkeypatch, tmp_path):
    """A probe that hits the clamp (another runtime's threads still spinning, a burst of
    load) is measured again after a pause and each figure's least is cached, so one busy
    moment does not keep this machine's small kernels serial in every later compile."""
    monkeypatch.setenv("FUSION_TVM_CACHE", str(tmp_path))
    monkeypatch.delenv("FUSION_TVM_PARALLEL_US", raising=False)
    rounds = iter([[10.0, 3.0], [10.0, 1.0], [1.75, 2.0], [9.0, 9.0]])
    monkeypatch.setattr(presets, "measure_fork_join_us", lambda cores: next(rounds))
    assert presets.host_fork_join_us(2) == (1.75, 1.0)
    assert presets.host_fork_join_us(2) == (1.75, 1.0)  # cached: the fourth never runs


@pytest.mark.parametrize("name, value", [("FUSION_TVM_PARALLEL_US", "fast"),
                                         ("FUSION_TVM_PARALLEL_US", "-1"),
                                         ("FUSION_TVM_DRAM_GBPS", "0"),
                                         ("FUSION_TVM_DRAM_GBPS", "nan")])
def test_host_env_overrides_refuse_non_numbers(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    call = presets.host_fork_join_us if "PARALLEL" in name else presets.host_dram_gbps
    with pytest.raises(presets.InvalidHardwareSpecError, match=f"{name}='{value}'"):
        call(2)


def test_fork_join_probe_measures_this_machine():
    """The probe itself: two figures, each within [0, DEFAULT_PARALLEL_US] (a busy moment
    never makes the cached figure worse than the old fixed one)."""
    first, further = presets.measure_fork_join_us(2, rounds=3)
    assert 0.0 <= first <= presets.DEFAULT_PARALLEL_US
    assert 0.0 <= further <= presets.DEFAULT_PARALLEL_US
