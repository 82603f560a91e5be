"""``detect.attribute_reads``: a plugin's reads of vLLM attributes this vLLM lacks, on synthetic trees (each name one
rule: a mutant of any one changes the set) and, in tests/plugins/test_check_plugins.py, on the reported releases."""

from __future__ import annotations

from tests.support.trees import write_tree
from vllm_compat.detect.attribute_reads import missing_attributes

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
    found = missing_attributes(plugin, host, "plug", {"plug"})
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
    assert {f.target for f in missing_attributes(plugin, host, "plug", {"plug"})} == {
        "vllm.config.ModelConfig.gone_one_hop", "vllm.config.ModelConfig.gone_in_element",
        "vllm.config.ModelConfig.gone_type_checking"}
