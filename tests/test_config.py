import pytest

from vllm_compat.config import Controls, read_controls
from vllm_compat.errors import ConfigError


def test_defaults_when_nothing_is_set():
    assert read_controls({}) == Controls(disabled=False, strict=False)


def test_other_vllm_compat_variables_are_kept_for_their_drift_point():
    controls = read_controls({"VLLM_COMPAT_LOADER_VARIANT": "Meta_Safe", "OTHER": "x"})
    assert controls.switches == (("VLLM_COMPAT_LOADER_VARIANT", "Meta_Safe"),)
    assert controls.switch("VLLM_COMPAT_LOADER_VARIANT") == "Meta_Safe" and controls.switch("VLLM_COMPAT_X", "d") == "d"


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_disable_accepts_true_spellings(value):
    assert read_controls({"VLLM_COMPAT_DISABLE": value}).disabled


def test_forced_variant_is_read_case_insensitively():
    from vllm_compat.patches.diffusers_loader import loader_variant

    assert loader_variant(read_controls({"VLLM_COMPAT_LOADER_VARIANT": "Meta_Safe"})) == "meta_safe"
    assert loader_variant(read_controls({})) == "auto"


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("VLLM_COMPAT_LOADER_VARIANT", "metasafe", "auto, legacy, meta_safe"),
        ("VLLM_COMPAT_DISABLE", "maybe", "1/true/yes/on"),
        ("VLLM_COMPAT_STRICT", "2", "1/true/yes/on"),
    ],
)
def test_invalid_value_names_variable_value_and_allowed_values(name, value, allowed):
    from vllm_compat.patches.diffusers_loader import loader_variant

    with pytest.raises(ConfigError) as excinfo:
        loader_variant(read_controls({name: value}))  # the loader's own switch is read by the loader
    message = str(excinfo.value)
    assert name in message and repr(value) in message and allowed in message


def test_disable_patches_takes_catalogue_ids_and_rejects_unknown_ones():
    from vllm_compat.catalogue import CATALOGUE

    ids = [entry.id for entry in CATALOGUE]
    controls = read_controls({"VLLM_COMPAT_DISABLE_PATCHES": f" {ids[0]} , {ids[-1]},"})
    assert controls.disabled_patches == {ids[0], ids[-1]}
    assert read_controls({}).disabled_patches == frozenset()
    with pytest.raises(ConfigError) as excinfo:
        read_controls({"VLLM_COMPAT_DISABLE_PATCHES": f"{ids[0]},no_such_patch"})
    message = str(excinfo.value)
    assert "VLLM_COMPAT_DISABLE_PATCHES='" in message and "no_such_patch" in message
    assert all(i in message for i in ids)  # names the known ids, so the fix is in the message
