"""``detect.function_uses``: a plugin's reads of vLLM attributes this vLLM lacks, on synthetic trees (each name one
rule: a mutant of any one changes the set) and, in tests/plugins/test_check_plugins.py, on the reported releases."""

from __future__ import annotations

from tests.support.trees import write_tree
from vllm_compat.detect.function_uses import missing_uses

HOST = {
    "vllm/__init__.py": "",
    "vllm/config.py": """
        from dataclasses import dataclass

        class ModelConfig:
            def __init__(self):
                self.dtype = 1

        @dataclass
        class VllmConfig:
            model_config: ModelConfig
            tensors: list[ModelConfig]

        class Other:
            def defined_elsewhere(self):
                return 1
        """,
}

PLUGIN = {
    "plug/__init__.py": """
        from typing import TYPE_CHECKING
        from vllm.config import VllmConfig
        from plug.version import vllm_version_is
        if TYPE_CHECKING:
            from vllm.config import ModelConfig
        else:
            ModelConfig = None

        def start(cfg: VllmConfig, model: "ModelConfig"):
            cfg.model_config                      # a field: present
            cfg.gone_field                        # missing
            mc = cfg.model_config
            mc.gone_one_hop                       # missing, one field further
            for t in cfg.tensors:
                t.gone_in_element                 # missing, an element of an annotated container
            model.gone_type_checking              # missing: the annotation names the TYPE_CHECKING import
            cfg.defined_elsewhere                 # vLLM defines it on another class (a subclass may): not called missing
            if hasattr(cfg, "guarded"):
                cfg.guarded                       # guarded
            if vllm_version_is("0.20.2"):
                cfg.gated                         # only the run decides
            VllmConfig.gone_on_the_class          # missing, the class named directly

        def sets(context):
            context.set_by_plugin = True

        def reads_what_it_set(cfg: VllmConfig):
            cfg.set_by_plugin                     # the plugin sets it on vLLM objects itself
        """,
    "plug/version.py": "def vllm_version_is(v):\n    return False\n",
}


def test_which_reads_are_missing(tmp_path):
    host = write_tree(tmp_path / "host", HOST)
    plugin = write_tree(tmp_path / "plugin", PLUGIN)
    found = missing_uses(plugin, host, "plug", {"plug"})
    assert sorted((f.function, f.target) for f in found) == [
        ("start", "vllm.config.ModelConfig.gone_in_element"),
        ("start", "vllm.config.ModelConfig.gone_one_hop"),
        ("start", "vllm.config.ModelConfig.gone_type_checking"),
        ("start", "vllm.config.VllmConfig.gone_field"),
        ("start", "vllm.config.VllmConfig.gone_on_the_class"),
    ]
    assert {f.module for f in found} == {"plug"}


def test_a_plugin_subclass_of_the_class_silences_its_reads(tmp_path):
    host = write_tree(tmp_path / "host", HOST)
    plugin = write_tree(tmp_path / "plugin", {**PLUGIN, "plug/sub.py": """
        from vllm.config import VllmConfig

        class MyConfig(VllmConfig):
            pass
        """})
    assert {f.target for f in missing_uses(plugin, host, "plug", {"plug"})} == {
        "vllm.config.ModelConfig.gone_one_hop", "vllm.config.ModelConfig.gone_in_element",
        "vllm.config.ModelConfig.gone_type_checking"}


IMPORTS = {
    "plug/__init__.py": """
        from plug.version import vllm_version_is

        def patched():
            from vllm.config import ModelConfig             # present
            from vllm.config import gone_plain              # missing
            import vllm.gone_module                         # missing module
            from vllm.gone_from import thing                # missing module, from-imported
            try:
                from vllm.config import gone_guarded        # guarded: its handler catches ImportError
            except ImportError:
                from vllm.config import gone_fallback       # the fallback: runs only when the guarded one failed
            try:
                from vllm.config import gone_reraised       # the handler re-raises: guards nothing
            except Exception:
                raise
            try:
                pass
            except ValueError:
                from vllm.config import gone_on_error       # runs where ValueError is raised
            if vllm_version_is("0.20.2"):
                from vllm.config import gone_gated          # only the run decides
        """,
    "plug/version.py": "def vllm_version_is(v):\n    return False\n",
}


def test_which_imports_inside_functions_are_missing(tmp_path):
    host = write_tree(tmp_path / "host", HOST)
    plugin = write_tree(tmp_path / "plugin", IMPORTS)
    found = missing_uses(plugin, host, "plug", {"plug"})
    assert sorted((f.function, f.how, f.target) for f in found) == [
        ("patched", "imports", "vllm.config.gone_on_error"),
        ("patched", "imports", "vllm.config.gone_plain"),
        ("patched", "imports", "vllm.config.gone_reraised"),
        ("patched", "imports", "vllm.gone_from"),
        ("patched", "imports", "vllm.gone_module"),
    ]
