"""Environment faults: what is installed, importable and shaped how. Each scenario is a fresh interpreter.

vLLM and vllm-omni are always the real installed wheels. Absence is made with ``python -S`` over a
symlinked copy of site-packages that leaves them out (``_support.isolated_site``); failures at import with
a meta-path finder that raises for the real module. Fake packages are written only for shapes no release has
(loader modules that fail to import, lack the method, rename it, change its signature or body, or subclass
the loader) and are real files on ``sys.path`` so ``inspect`` reads them like an installed module.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import VLLM_VERSION, needs_layerwise_finalize, needs_vllm, run_python

from . import _support
from ._support import result_of, run_isolated

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPORT = """
import json, sys, io, contextlib
import vllm_compat
from vllm_compat.cli import main

def doctor(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["doctor", *args])
    text = out.getvalue()  # vLLM logs to stdout: the report starts at its first line
    start = text.find('{\\n  "mode"')
    return code, text[start:] if start >= 0 else text

out = {}
out["static_code"], out["static_table"] = doctor("--verbose")
code, text = doctor("--json")
out["static"] = json.loads(text)
out["apply"] = [d.action for d in vllm_compat.apply() if d.name == "diffusers_loader_meta_device"]
out["modules_after_static"] = sorted(m for m in ("vllm", "vllm_omni", "torch") if m in sys.modules)
if "--runtime" in sys.argv:
    out["runtime_code"], text = doctor("--runtime", "--json")
    out["runtime"] = json.loads(text)
print("RESULT" + json.dumps(out))
"""


def test_report_can_be_called_twice_and_says_the_same():
    """A second report is built afresh (nothing cached half-way) and says what the first said, entry by entry."""
    import vllm_compat
    from vllm_compat.catalogue import CATALOGUE

    first, second = vllm_compat.report().to_dict(), vllm_compat.report().to_dict()
    assert first == second
    assert [p["name"] for p in first["patches"]] == [e.id for e in CATALOGUE]


def test_vllm_not_installed_doctor_still_works_and_says_so(tmp_path):
    site = _support.isolated_site(tmp_path / "site", exclude=("vllm", "vllm_omni", "vllm-omni"))
    out = result_of(run_isolated(REPORT, site, args=["--runtime"]))
    # nothing to judge (docs/cli.md's exit codes): neither works (0) nor fails (1)
    assert out["static_code"] == 3 and out["runtime_code"] == 3
    assert "verdict: NOTHING TO JUDGE: vLLM and vllm-omni are not installed here." in out["static_table"]
    for report in (out["static"], out["runtime"]):
        assert report["verdict"]["kind"] == "nothing_to_judge" and report["exit_code"] == 3
        assert report["vllm"]["version"] is None and report["vllm"]["level"] == "absent"
        assert report["vllm_omni"]["loader_kind"] == "absent"
        assert report["patches"][0]["action"] == "pending"
    assert "vllm       not installed" in out["static_table"] and "level: absent" in out["static_table"]
    assert out["apply"] == ["pending"] and out["modules_after_static"] == []


def test_vllm_omni_not_installed(tmp_path):
    if VLLM_VERSION is None:
        pytest.skip("vLLM is not installed in this env")
    site = _support.isolated_site(tmp_path / "site", exclude=("vllm_omni", "vllm-omni"))
    out = result_of(run_isolated(REPORT, site, args=["--runtime"]))
    assert out["static_code"] == 3 and out["runtime_code"] == 3, out  # nothing to judge without vllm-omni
    assert "verdict: NOTHING TO JUDGE: vllm-omni is not installed here." in out["static_table"]
    assert out["static"]["vllm"]["version"] == VLLM_VERSION
    for report in (out["static"], out["runtime"]):
        assert report["vllm_omni"]["version"] is None and report["vllm_omni"]["loader_kind"] == "absent"
        assert report["patches"][0]["action"] == "pending"
    assert out["runtime"]["mismatches"] == []
    assert out["runtime"]["vllm"]["capabilities"] == out["static"]["vllm"]["capabilities"]


@needs_vllm
def test_vllm_installed_but_importing_it_raises():
    blocker = """
import sys
class RaisingLoader:
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise RuntimeError("libcudart.so.13: cannot open shared object file")
class Broken:
    # the real spec (so the files are found where they are installed), with a loader that fails to execute
    def find_spec(self, name, path=None, target=None):
        if name != "vllm":
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = RaisingLoader()
                    return spec
sys.meta_path.insert(0, Broken())
"""
    out = result_of(run_python(blocker + REPORT.replace('"--runtime" in sys.argv', "True"), warm=True))
    drift = out["static"]["import_drift"]
    # static detection reads files only: unaffected (1 only where an entrypoint of vllm-omni cannot start anyway; 3,
    # nothing to judge, where vllm-omni is not installed)
    assert out["static_code"] == (3 if drift is None else 1 if not drift["starts"] else 0)
    assert out["static"]["vllm"]["version"] == VLLM_VERSION and out["static"]["vllm"]["level"] != "unknown"
    assert out["apply"] == ["pending"] and "vllm" not in out["modules_after_static"]
    assert out["runtime_code"] == 1
    assert "RuntimeError: libcudart.so.13" in out["runtime"]["runtime_error"]


def _fake_dist(root: Path, name: str, version: str) -> Path:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@needs_vllm
# the dev build is of a release far above the tested range: the range follows matrix/vllm.toml's passed cells
# (vllm_compat/detect/tested.py), so a near one (it was 0.34.0rc1 while 0.33 was the newest) turns tested
@pytest.mark.parametrize("version, tested", [("9.1.0", False), ("9.0.0rc1.dev7+g1234abc", False),
                                              ("0.16.0", True), ("not-a-version", None)])
def test_unknown_or_inconsistent_vllm_version_keeps_detection_from_files(tmp_path, version, tested):
    """Metadata that disagrees with the files: capabilities still come from the files, the decision does not
    change, and the report says whether the version is tested."""
    site = _support.isolated_site(tmp_path / "site", exclude_dist=("vllm",))
    meta = _fake_dist(tmp_path / "meta", "vllm", version)
    out = result_of(run_isolated(REPORT, site, extra_paths=[meta]))
    real = result_of(run_python(REPORT, warm=True))
    assert out["static"]["vllm"]["version"] == version
    assert out["static"]["vllm"]["tested"] is tested
    assert out["static"]["vllm"]["capabilities"] == real["static"]["vllm"]["capabilities"]
    assert out["static"]["patches"] == real["static"]["patches"]
    if tested is False:
        assert "UNTESTED" in out["static_table"]


@needs_vllm
def test_vllm_distribution_metadata_missing(tmp_path):
    site = _support.isolated_site(tmp_path / "site", exclude_dist=("vllm",))
    out = result_of(run_isolated(REPORT, site))
    real = result_of(run_python(REPORT, warm=True))
    drift = real["static"]["import_drift"]
    if drift and drift["bridged"]:
        # `python -S` reads no .pth: the startup hook that puts those bridges in place before vllm-omni (and its
        # worker) import is absent there, so the verdict may differ; the detection below may not.
        assert out["static"]["import_drift"]["early"] is False and drift["early"] is True
    else:
        assert out["static_code"] == real["static_code"]
    assert out["static"]["vllm"]["version"] is None and out["static"]["vllm"]["tested"] is None
    # the files are there: capabilities and the decision are those of the real install
    assert out["static"]["vllm"]["capabilities"] == real["static"]["vllm"]["capabilities"]
    assert out["static"]["vllm"]["level"] == real["static"]["vllm"]["level"] != "absent"
    assert out["static"]["patches"] == real["static"]["patches"]
    # Reported as a finding: the table prints "not installed" next to a non-absent level.
    line = next(row for row in out["static_table"].splitlines() if row.strip().startswith("vllm "))
    print("metadata-missing table line:", line)


# --------------------------------------------------------------------------- loader shapes no release has

LEGACY_BODY = """
        for _, module in model.named_modules():
            quant_method = getattr(module, "quant_method", None)
            if quant_method is not None and isinstance(quant_method, QuantizeMethodBase):
                module_device = next(module.parameters(), None)
                if module_device is not None:
                    module_device = module_device.device
                needs_device_move = module_device != target_device
                if needs_device_move:
                    module.to(target_device)
                quant_method.process_weights_after_loading(module)
                if needs_device_move:
                    module.to(module_device)
"""
HEADER = "import torch\nfrom vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase\n"
SHAPES = {
    # name: (module source, expected auto action, expected action with VLLM_COMPAT_LOADER_VARIANT=meta_safe)
    "no_class": ("class SomethingElse:\n    pass\n", "refused", "refused"),
    "method_missing": ("class DiffusersPipelineLoader:\n    def load_model(self):\n        pass\n",
                       "refused", "refused"),
    "method_renamed": ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading_v2(self, model,"
                       " target_device):\n" + LEGACY_BODY, "refused", "refused"),
    "method_not_callable": ("class DiffusersPipelineLoader:\n    _process_weights_after_loading = None\n",
                            "refused", "refused"),
    "extra_required_param": ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading(self, model,"
                             " target_device, model_config):\n" + LEGACY_BODY, "refused", "refused"),
    "params_renamed": ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading(self, module,"
                       " device):\n" + LEGACY_BODY.replace("model.", "module.").replace("target_device", "device"),
                       "refused", "refused"),
    "unknown_body": ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading(self, model,"
                     " target_device):\n        model.apply(lambda m: None)\n", "refused", "patched"),
    "future_extra_kwargs": ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading(self, model,"
                            " target_device, *, offload=None, **kw):\n" + LEGACY_BODY, "patched", "patched"),
    "subclass_override": ("class _Base:\n    def _process_weights_after_loading(self, model, target_device):\n"
                          + LEGACY_BODY + "class DiffusersPipelineLoader(_Base):\n"
                          "    def _process_weights_after_loading(self, model, target_device):\n"
                          "        super()._process_weights_after_loading(model, target_device)\n"
                          "        self.done = True\n", "refused", "patched"),
    "subclass_inherits": ("class _Base:\n    def _process_weights_after_loading(self, model, target_device):\n"
                          + LEGACY_BODY + "class DiffusersPipelineLoader(_Base):\n    pass\n",
                          # Runtime follows the MRO to the legacy method and patches the base that defines it
                          # (static detection reads the class body only and calls it unknown).
                          "patched", "patched"),
}


@needs_vllm
def test_loader_shapes_no_release_has_are_refused_not_patched_blindly(tmp_path):
    for name, (source, _, _) in SHAPES.items():
        _support.write_package(tmp_path / "shapes", {f"shape_{name}.py": HEADER + source})
    code = f"""
import importlib, json, sys
sys.path.insert(0, {str(tmp_path / 'shapes')!r})
import torch
from vllm_compat.activate import activate_entry
from vllm_compat.catalogue import entry as catalogue_entry
def patch_loader_module(module, controls):
    return activate_entry(catalogue_entry("diffusers_loader_meta_device"), module, controls)
from vllm_compat.config import Controls
from vllm_compat.errors import PatchRefusedError
from vllm_compat.patches.diffusers_loader import installed_variant
from tests.support.online_quant import LoaderShaped, build_model, make_checkpoint, load_checkpoint

out = {{}}
for name in {list(SHAPES)!r}:
    row = out[name] = {{}}
    module = importlib.import_module("shape_" + name)
    cls = getattr(module, "DiffusersPipelineLoader", None)
    before = cls.__dict__.get("_process_weights_after_loading") if cls else None
    d = patch_loader_module(module, Controls())
    row["auto"] = d.action
    row["reason"] = d.reason
    row["untouched"] = cls is None or cls.__dict__.get("_process_weights_after_loading") is before
    try:
        patch_loader_module(module, Controls(strict=True))
        row["strict"] = "no error"
    except PatchRefusedError as exc:
        row["strict"] = "PatchRefusedError"
    d = patch_loader_module(module, Controls(switches=(("VLLM_COMPAT_LOADER_VARIANT", "meta_safe"),)))
    row["forced"] = d.action
    if d.action == "patched":
        owner = next(k for k in cls.__mro__ if "_process_weights_after_loading" in vars(k))  # inherited: the base
        row["forced_variant"] = installed_variant(owner)
        model = build_model(online=False, stragglers=())
        load_checkpoint(model, make_checkpoint(model))
        kwargs = {{"offload": True}} if name == "future_extra_kwargs" else {{}}
        cls()._process_weights_after_loading(model, torch.device("cpu"), **kwargs)
        row["forced_call"] = str(model.blocks[0].proj_out.weight.dtype)
print("RESULT" + json.dumps(out))
"""
    out = result_of(run_python(code, warm=True))
    for name, (_, auto, forced) in SHAPES.items():
        row = out[name]
        assert (row["auto"], row["forced"]) == (auto, forced), (name, row)
        assert row["strict"] == ("PatchRefusedError" if auto == "refused" else "no error"), (name, row)
        if auto == "refused":
            assert row["untouched"], (name, row)
        if forced == "patched":
            assert row["forced_variant"] == "meta_safe" and row["forced_call"] == "torch.float8_e4m3fn", row


FAKE_OMNI = {
    "vllm_omni/__init__.py": "",
    "vllm_omni/diffusion/__init__.py": "",
    "vllm_omni/diffusion/model_loader/__init__.py": "",
}


@needs_vllm
def test_broken_and_unknown_loader_modules_through_the_import_hook(tmp_path):
    """A vllm_omni package (shadowing any installed one) whose loader module first fails to import, then has
    an unknown shape under VLLM_COMPAT_STRICT=1, then is fine: the hook never masks the module's own error,
    strict refusal raises from the import, and a good module is patched."""
    root = _support.write_package(tmp_path / "fake", FAKE_OMNI)
    loader = root / _support.LOADER_FILE
    code = f"""
import importlib, json, os, sys
sys.dont_write_bytecode = True
sys.path.insert(0, {str(root)!r})
import vllm_compat
from vllm_compat.errors import PatchRefusedError
from vllm_compat.patches.diffusers_loader import installed_variant
NAME = {_support.LOADER_MODULE!r}
path = {str(loader)!r}
HEADER = {HEADER!r}
out = {{}}

def attempt(source, **env):
    with open(path, "w") as f:
        f.write(source)
    importlib.invalidate_caches()
    sys.modules.pop(NAME, None)
    os.environ.update(env)
    try:
        module = importlib.import_module(NAME)
        return ["imported", installed_variant(module.DiffusersPipelineLoader),
                [d.action for d in vllm_compat.current_decisions() if d.name == "diffusers_loader_meta_device"]]
    except BaseException as exc:
        return [type(exc).__name__, str(exc), [d.action for d in vllm_compat.current_decisions() if d.name == "diffusers_loader_meta_device"]]
    finally:
        for k in env:
            os.environ.pop(k)

out["broken"] = attempt("import huggingface_hub_missing_dep\\n")
out["raises_inside"] = attempt("raise RuntimeError('loader exploded at import')\\n")
out["doctor_runtime"] = vllm_compat.report(runtime=True).to_dict()["runtime_error"]
out["unknown_strict"] = attempt(HEADER + {SHAPES['unknown_body'][0]!r}, VLLM_COMPAT_STRICT="1")
out["unknown_lenient"] = attempt(HEADER + {SHAPES['unknown_body'][0]!r})
out["good"] = attempt(HEADER + {SHAPES['future_extra_kwargs'][0]!r}, VLLM_COMPAT_LOADER_VARIANT="legacy")
print("RESULT" + json.dumps(out))
"""
    out = result_of(run_python(code, warm=True))
    assert out["broken"][:2] == ["ModuleNotFoundError", "No module named 'huggingface_hub_missing_dep'"]
    assert out["raises_inside"][:2] == ["RuntimeError", "loader exploded at import"]
    assert out["broken"][2] == out["raises_inside"][2] == []  # nothing recorded: the hook never ran
    # Runtime detection finds vllm_omni by import, metadata or not, so the module's own error is shown.
    assert "loader exploded at import" in out["doctor_runtime"]
    assert out["unknown_strict"][0] == "PatchRefusedError" and "VLLM_COMPAT_STRICT=1" in out["unknown_strict"][1]
    assert out["unknown_lenient"] == ["imported", None, ["refused"]]
    assert out["good"] == ["imported", "legacy", ["patched"]]


# --------------------------------------------------------------------------- vLLM capability shapes


def _vllm_tree(tmp_path: Path, edit_layerwise) -> Path:
    from vllm_compat.detect.static import installed_package_root
    from vllm_compat.patches.diffusers_loader.facts import BASE_CONFIG_FILE, LAYERWISE_FILE

    real = installed_package_root("vllm")
    root = tmp_path / "tree"
    for rel in ("vllm/__init__.py", BASE_CONFIG_FILE, LAYERWISE_FILE):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(real / rel, root / rel)
    text = (root / LAYERWISE_FILE).read_text()
    (root / LAYERWISE_FILE).write_text(edit_layerwise(text))
    return root


FINALIZE_EDITS = {
    "finalize_missing": lambda t: t.replace("def finalize_layerwise_processing(", "def _removed_finalize("),
    "finalize_other_signature": lambda t: t.replace(
        "def finalize_layerwise_processing(model: torch.nn.Module, model_config: ModelConfig)",
        "def finalize_layerwise_processing(model_config: ModelConfig, model: torch.nn.Module)"),
}


@needs_vllm
@needs_layerwise_finalize  # the faults are edits of an existing finalize
@pytest.mark.parametrize("fault", list(FINALIZE_EDITS))
def test_uses_meta_device_without_a_compatible_finalize_static(tmp_path, fault):
    from vllm_compat.config import Controls
    from vllm_compat.detect.static import SourceTree
    from vllm_compat.patches.diffusers_loader import DRIFT_POINT
    from vllm_compat.patches.diffusers_loader.facts import LoaderKind, LoaderShape, scan_tree

    decide = DRIFT_POINT.decide

    root = _vllm_tree(tmp_path, FINALIZE_EDITS[fault])
    env = scan_tree(SourceTree(root), versions={"vllm": "0.99.0"})
    if not env.vllm.has_uses_meta_device:
        pytest.skip("this vLLM has no uses_meta_device")
    assert env.vllm.level == "meta_device_without_finalize"
    assert env.vllm.has_layerwise_finalize is (fault != "finalize_missing")
    from dataclasses import replace

    legacy = replace(env, loader=LoaderShape(LoaderKind.LEGACY))
    assert decide(legacy, Controls()).variant == "meta_safe"


@needs_vllm
@needs_layerwise_finalize  # the faults are edits of an existing finalize
@pytest.mark.parametrize("fault", list(FINALIZE_EDITS))
def test_uses_meta_device_without_a_compatible_finalize_runtime(monkeypatch, fault, oq):
    """The real layerwise module with finalize deleted / re-signed: detection says so, no finalize is
    resolved, and meta_safe processes stragglers where they are (meta, with a warning) instead of crashing."""
    import vllm.model_executor.model_loader.reload.layerwise as layerwise

    from vllm_compat.patches.diffusers_loader import process_meta_safe, resolve_deps
    from vllm_compat.patches.diffusers_loader.facts import probe_vllm

    if fault == "finalize_missing":
        monkeypatch.delattr(layerwise, "finalize_layerwise_processing")
    else:
        real = layerwise.finalize_layerwise_processing
        monkeypatch.setattr(layerwise, "finalize_layerwise_processing",
                            lambda model_config, model, *extra: real(model, model_config))
    caps = probe_vllm()
    assert caps.has_uses_meta_device and not caps.has_compatible_finalize
    assert caps.level == "meta_device_without_finalize"
    deps = resolve_deps()
    assert deps.find_finalize() is None  # looked up on the live module, at call time
    model = oq.build_model()
    oq.load_checkpoint(model, oq.make_checkpoint(model, seed=1))
    process_meta_safe(oq.LoaderShaped(), model, oq.torch.device("cpu"), deps=deps)
    assert {n.rsplit(".", 1)[0] for n in oq.meta_param_names(model)} == {s.layer for s in oq.DEFAULT_STRAGGLERS}

