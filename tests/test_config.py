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


# ---- every drift point's switches, answered at once (issue 34): read_checked_controls, what apply() reads ----

CORE = ("VLLM_COMPAT_DISABLE", "VLLM_COMPAT_STRICT", "VLLM_COMPAT_DISABLE_PATCHES")


def _switches_of_the_catalogue():
    from vllm_compat.catalogue import CATALOGUE

    return [(entry.id, name) for entry in CATALOGUE for name in entry.point.switches]


def test_the_loader_variant_is_a_drift_point_switch():
    # the one switch a drift point reads today; the tests below walk the catalogue, this keeps them from walking
    # an empty list
    assert ("diffusers_loader_meta_device", "VLLM_COMPAT_LOADER_VARIANT") in _switches_of_the_catalogue()


@pytest.mark.parametrize(("entry_id", "name"), _switches_of_the_catalogue())
def test_read_checked_controls_rejects_a_bad_value_of_every_drift_point_switch(entry_id, name):
    from vllm_compat.config import read_checked_controls

    with pytest.raises(ConfigError) as excinfo:
        read_checked_controls({name: "turbo-42"})
    message = str(excinfo.value)
    assert name in message and "'turbo-42'" in message and "Allowed values" in message, (entry_id, message)


def test_read_checked_controls_names_the_loader_variants():
    from vllm_compat.config import read_checked_controls

    with pytest.raises(ConfigError) as excinfo:
        read_checked_controls({"VLLM_COMPAT_LOADER_VARIANT": "turbo"})
    assert str(excinfo.value).startswith("VLLM_COMPAT_LOADER_VARIANT='turbo' is not a loader variant. Allowed "
                                         "values: auto, legacy, meta_safe")
    assert read_checked_controls({"VLLM_COMPAT_LOADER_VARIANT": " Legacy "}).switch(
        "VLLM_COMPAT_LOADER_VARIANT") == " Legacy "


@pytest.mark.parametrize("name", ["VLLM_COMPAT_LOADER_VARIANTS", "VLLM_COMPAT_DISABLED", "VLLM_COMPAT_STICT"])
def test_an_unknown_variable_is_an_error_naming_the_known_ones(name):
    from vllm_compat.config import read_checked_controls

    with pytest.raises(ConfigError) as excinfo:
        read_checked_controls({name: "1"})
    message = str(excinfo.value)
    assert message.startswith(f"{name}='1' is set, but vllm_compat has no such variable"), message
    assert all(known in message for known in (*CORE, "VLLM_COMPAT_LOADER_VARIANT")), message


def test_valid_controls_and_tooling_variables_pass_and_are_no_switches():
    from vllm_compat.config import read_checked_controls

    tooling = {"VLLM_COMPAT_CELL": "v0.33-omni0.30", "VLLM_COMPAT_WHEEL_CACHE": "/tmp/w", "VLLM_COMPAT_ROTATION": "4",
               "VLLM_COMPAT_EXPECT_LEVEL": "meta", "VLLM_COMPAT_CACHE_DIR": "/tmp/c", "VLLM_COMPAT_TESTS_COLD": "1"}
    controls = read_checked_controls({**tooling, "VLLM_COMPAT_STRICT": "1", "VLLM_COMPAT_LOADER_VARIANT": "meta_safe"})
    assert controls.strict and controls.switches == (("VLLM_COMPAT_LOADER_VARIANT", "meta_safe"),)
    assert read_checked_controls(tooling) == read_checked_controls({}) == Controls()


def test_every_vllm_compat_variable_the_repository_names_is_legal():
    """A name the repository's tooling, tests or docs use (grep, not a list kept by hand) is a core control, a
    drift point's switch or a tooling variable: none of them is answered as a typo. This file and
    tests/test_activate.py are left out: they spell typos on purpose."""
    import re
    import subprocess
    from pathlib import Path

    from vllm_compat.config import read_checked_controls

    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so no list of the repository's files: {listed.stderr[-200:]!r}")
    names = set()
    for path in listed.stdout.decode().split("\0"):
        file = root / path
        if path and file.is_file() and path not in ("tests/test_config.py", "tests/test_activate.py"):
            names.update(re.findall(r"VLLM_COMPAT_[A-Z0-9_]*[A-Z0-9]\b(?!_)", file.read_text(errors="replace")))
    assert {"VLLM_COMPAT_CELL", "VLLM_COMPAT_WHEEL_CACHE", "VLLM_COMPAT_LOADER_VARIANT"} <= names  # the grep works
    values = {"VLLM_COMPAT_DISABLE_PATCHES": "", "VLLM_COMPAT_LOADER_VARIANT": "auto"}
    for name in sorted(names):
        read_checked_controls({name: values.get(name, "0")})  # raises, naming it, where it is no known variable


def test_without_drift_point_switches_no_drift_point_is_imported():
    """The cost side: core controls and tooling variables alone are checked without importing a drift point
    (importing them all costs some 70 ms); one drift-point switch imports them."""
    from conftest import run_python

    code = """
        import sys
        from vllm_compat.config import read_checked_controls
        read_checked_controls()
        print(sorted({m.split(".")[1] for m in sys.modules if m.startswith(("vllm_compat.patches.",
                                                                            "vllm_compat.bridges."))}))
        """
    quiet = run_python(code, env={"VLLM_COMPAT_STRICT": "1", "VLLM_COMPAT_CELL": "x", "VLLM_COMPAT_EXPECT_LEVEL": "y"})
    assert (quiet.returncode, quiet.stdout.strip()) == (0, "[]"), quiet.stderr
    switched = run_python(code, env={"VLLM_COMPAT_LOADER_VARIANT": "auto"})
    assert (switched.returncode, switched.stdout.strip()) == (0, "['bridges', 'patches']"), switched.stderr
