"""How a cell's diffusion-path record is held to the native one: the outputs bit for bit on the record's CPU
signature, by abs mean from another CPU; the parameters bit for bit everywhere."""

from __future__ import annotations

import copy

from tests.support.diffusion_path import OTHER_CPU_OUTPUT_RTOL, model_differences

CPU_A = {"capability": "AVX512", "processor": "Intel(R) Xeon(R) Processor", "threads": 2}
CPU_B = {"capability": "AVX2", "processor": "AMD EPYC", "threads": 2}


def _record(cpu, *, output="aa", abs_mean=0.8208, weight="w1") -> dict:
    model = {"fp8_params": 2, "meta_left": [], "output_finite": True, "output": output,
             "output_abs_mean": abs_mean, "params": {"blocks.0.weight": weight}}
    return {"cpu": cpu, "models": {"Arch": {"complete": model}}}


def test_same_cpu_compares_the_output_bit_for_bit():
    native = _record(CPU_A)
    assert model_differences(native, copy.deepcopy(native)) == []
    rounded = _record(CPU_A, output="bb", abs_mean=0.8208 * (1 + OTHER_CPU_OUTPUT_RTOL / 10))
    assert model_differences(native, rounded) == [
        f"Arch/complete: forward output differs (abs mean {rounded['models']['Arch']['complete']['output_abs_mean']}, "
        "natively 0.8208)"]


def test_another_cpu_compares_the_output_by_abs_mean_within_the_tolerance():
    native = _record(CPU_B)
    assert model_differences(native, _record(CPU_A, output="bb", abs_mean=0.8208 * (1 + 8.9e-5))) == []
    far = model_differences(native, _record(CPU_A, output="bb", abs_mean=0.8208 * (1 + 3 * OTHER_CPU_OUTPUT_RTOL)))
    assert len(far) == 1 and "more than another CPU's rounding" in far[0] and "AMD EPYC" in far[0]


def test_parameters_compare_bit_for_bit_on_any_cpu():
    for cpu in (CPU_A, CPU_B):
        found = model_differences(_record(cpu), _record(CPU_A, weight="w2"))
        assert found == ["Arch/complete: 1 parameter(s) differ (blocks.0.weight), 0 extra"], (cpu, found)
