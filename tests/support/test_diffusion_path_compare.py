"""How a cell's diffusion-path record is held to the native one: the outputs bit for bit on the record's CPU
signature, by abs mean from another CPU; the parameters bit for bit everywhere, except those holding never-loaded
elements (values vLLM materializes, the test does not control): materialized with the complete checkpoint's dtype
and shape, loaded rows equal to the checkpoint, and then the output (which reads them) is not compared."""

from __future__ import annotations

import copy

import pytest

from tests.support.diffusion_path import OTHER_CPU_OUTPUT_RTOL, cpu_signature, model_differences, same_cpu

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


def test_two_processor_generations_a_virtual_machine_names_alike_are_two_cpus():
    """2026-12-07: an Emerald Rapids named "Intel(R) Xeon(R) Processor", as the Xeon the 0.24.0 record was made on,
    gave the complete checkpoint's output another low bit: the signature holds family / model / stepping, and a
    record made without them is another CPU's (compared by abs mean)."""
    pytest.importorskip("torch")
    here = cpu_signature()
    assert here["model"].count("/") == 2
    older = {key: value for key, value in here.items() if key != "model"}
    assert same_cpu({"cpu": here}, {"cpu": dict(here)}) and not same_cpu({"cpu": older}, {"cpu": here})
    native, cell = _record(older), _record(here, output="bb", abs_mean=0.8208 * (1 + 1.6e-5))
    assert model_differences(native, cell) == []


def test_another_cpu_compares_the_output_by_abs_mean_within_the_tolerance():
    native = _record(CPU_B)
    assert model_differences(native, _record(CPU_A, output="bb", abs_mean=0.8208 * (1 + 8.9e-5))) == []
    far = model_differences(native, _record(CPU_A, output="bb", abs_mean=0.8208 * (1 + 3 * OTHER_CPU_OUTPUT_RTOL)))
    assert len(far) == 1 and "more than another CPU's rounding" in far[0] and "AMD EPYC" in far[0]


def test_parameters_compare_bit_for_bit_on_any_cpu():
    for cpu in (CPU_A, CPU_B):
        found = model_differences(_record(cpu), _record(CPU_A, weight="w2"))
        assert found == ["Arch/complete: 1 parameter(s) differ (blocks.0.weight), 0 extra"], (cpu, found)


# The stragglers checkpoint as the records hold it: a fused projection missing a shard (its FP8 weight and scale
# processed from the whole layer, its bias's loaded rows kept) and the rest of the model fully loaded. Native
# records written before ``never_loaded`` existed lack it: the cell's own record says which parameters those are.
LAYOUT = {"blocks.0.weight": "float8_e4m3fn [8, 8]", "blocks.1.qkv.weight": "float8_e4m3fn [12, 8]",
          "blocks.1.qkv.weight_scale": "float32 [1]", "blocks.1.qkv.bias": "bfloat16 [12]"}


def _never_loaded(**changes) -> dict:
    entries = {"blocks.1.qkv.weight": {"rows": [[8, 12]], "processed": True},
               "blocks.1.qkv.weight_scale": {"rows": [], "processed": True},
               "blocks.1.qkv.bias": {"rows": [[8, 12]], "processed": False, "loaded_rows": "equal"}}
    for name, entry in entries.items():
        entry.update({"layout": LAYOUT[name], "meta": False, **changes.get(name, {})})
    return entries


def _with_stragglers(cpu, *, native: bool, weight="w1", qkv=("q1", "s1"), output="nan", output_shape=(1, 4),
                     never_loaded=None) -> dict:
    record = _record(cpu)
    complete = record["models"]["Arch"]["complete"]
    complete.update(never_loaded={}, layout=dict(LAYOUT), output_shape=[1, 4],
                    params={"blocks.0.weight": "w1", "blocks.1.qkv.weight": "c1",
                            "blocks.1.qkv.weight_scale": "c2", "blocks.1.qkv.bias": "c3"})
    stragglers = {"fp8_params": 2, "meta_left": [], "output_finite": output != "nan",
                  "output": output, "output_abs_mean": 0.0 if output == "nan" else 0.81,
                  "params": {"blocks.0.weight": weight, "blocks.1.qkv.weight": qkv[0],
                             "blocks.1.qkv.weight_scale": qkv[1], "blocks.1.qkv.bias": "b1"}}
    if native:  # as matrix/native/ records are: no layout, no never_loaded, no output_shape
        for key in ("never_loaded", "layout", "output_shape"):
            complete.pop(key)
    else:
        stragglers.update(layout=dict(LAYOUT), output_shape=list(output_shape),
                          never_loaded=never_loaded if never_loaded is not None else _never_loaded())
    record["models"]["Arch"]["stragglers"] = stragglers
    return record


def test_never_loaded_elements_are_not_compared_bit_for_bit_nor_the_output_that_reads_them():
    native = _with_stragglers(CPU_A, native=True)
    # vLLM 0.34: the straggler layer's FP8 weight and scale differ, the output is finite where it was NaN
    assert model_differences(native, _with_stragglers(CPU_A, native=False, qkv=("q2", "s2"), output="finite")) == []
    assert model_differences(native, _with_stragglers(CPU_B, native=False, qkv=("q2", "s2"), output="finite")) == []


def test_a_changed_loaded_element_still_fails_beside_never_loaded_ones():
    native = _with_stragglers(CPU_A, native=True)
    found = model_differences(native, _with_stragglers(CPU_A, native=False, weight="w2", qkv=("q2", "s2")))
    assert found == ["Arch/stragglers: 1 parameter(s) differ (blocks.0.weight), 0 extra"], found
    bias = _never_loaded(**{"blocks.1.qkv.bias": {"loaded_rows": "differ"}})
    found = model_differences(native, _with_stragglers(CPU_A, native=False, never_loaded=bias))
    assert found == ["Arch/stragglers: blocks.1.qkv.bias's loaded rows differ from the checkpoint's tensors"], found


def test_never_loaded_parameters_must_be_materialized_with_the_complete_checkpoints_layout():
    native = _with_stragglers(CPU_A, native=True)
    meta = _never_loaded(**{"blocks.1.qkv.weight": {"meta": True}})
    found = model_differences(native, _with_stragglers(CPU_A, native=False, never_loaded=meta))
    assert found == ["Arch/stragglers: blocks.1.qkv.weight never materialized (left on meta)"], found
    bf16 = _never_loaded(**{"blocks.1.qkv.weight": {"layout": "bfloat16 [12, 8]"}})
    found = model_differences(native, _with_stragglers(CPU_A, native=False, never_loaded=bf16))
    assert found == ["Arch/stragglers: blocks.1.qkv.weight is bfloat16 [12, 8], float8_e4m3fn [12, 8] from the "
                     "complete checkpoint"], found
    found = model_differences(native, _with_stragglers(CPU_A, native=False, output_shape=(1, 5)))
    assert found == ["Arch/stragglers: forward output of shape [1, 5], [1, 4] from the complete checkpoint"], found


def test_what_is_never_loaded_is_not_left_out_where_nothing_is_or_not_said():
    native = _with_stragglers(CPU_A, native=True)
    cell = _with_stragglers(CPU_A, native=False, qkv=("q2", "s2"))
    del cell["models"]["Arch"]["stragglers"]["never_loaded"]  # nothing excluded: the bits must match then
    found = model_differences(native, cell)
    assert found == ["Arch/stragglers: 2 parameter(s) differ (blocks.1.qkv.weight, blocks.1.qkv.weight_scale), "
                     "0 extra"], found
    cell = _with_stragglers(CPU_A, native=False)
    cell["models"]["Arch"]["complete"]["never_loaded"] = _never_loaded()
    found = model_differences(native, cell)
    assert found[0].startswith("Arch/complete: never-loaded elements in the complete checkpoint"), found
