"""Generated constructors (``vllm_compat.detect.generated_init``): what a dataclass, a pydantic dataclass, a
``dataclass_transform`` decorator (vLLM's ``@config``), a ``msgspec.Struct``, a ``NamedTuple``, a ``TypedDict`` or a
pydantic ``BaseModel`` accepts, read from the class body.

Expected values come from Python: the small tree's classes are built by the real ``dataclasses``, pydantic and
msgspec, and each call either raises or not; the installed vLLM's classes that vllm-omni builds are compared with
``inspect.signature`` in a fresh interpreter.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest

from conftest import needs_vllm, run_python
from tests.support.trees import write_tree
from vllm_compat.detect.behaviour_drift import scan
from vllm_compat.detect.code_model import CodeModel, bound_params
from vllm_compat.detect.model import ParamKind
from vllm_compat.detect.source_tree import installed_package_root, tree_at

HOST = """
    from dataclasses import KW_ONLY, InitVar, dataclass, field
    from typing import ClassVar, NamedTuple, TypedDict

    import msgspec
    from pydantic import BaseModel, ConfigDict, Field, model_validator
    from pydantic.dataclasses import dataclass as pydantic_dataclass
    from typing_extensions import dataclass_transform


    @dataclass_transform()
    def config(cls=None, *, config=None):
        merged = ConfigDict(extra="forbid")  # vLLM's @config: extras forbidden unless the call's config says
        if config is not None:
            merged.update(config)

        def wrap(cls):
            return pydantic_dataclass(cls, config=merged)

        return wrap if cls is None else wrap(cls)


    @dataclass
    class Base:
        size: int
        kinds: ClassVar[int] = 0


    @dataclass
    class Tensor(Base):
        layers: int
        cache: dict = field(init=False, default_factory=dict)
        offset: int = 0
        _: KW_ONLY
        strict: bool = False


    @dataclass(kw_only=True)
    class Options:
        mode: int
        level: int = field(default=0, kw_only=False)


    class Plain(Tensor):
        note: int = 0  # not a field: Plain is no dataclass


    @dataclass(init=False)
    class NoInit(Plain):
        more: int = 0


    @dataclass
    class Manual:
        a: int

        def __init__(self, a, b):
            self.a = a + b


    @dataclass
    class WithInitVar:
        seed: InitVar[int]
        name: str = "x"

        def __post_init__(self, seed):
            pass


    @pydantic_dataclass
    class Loose:
        x: int
        y: int = Field(default=0)


    @pydantic_dataclass(config=ConfigDict(extra="forbid"))
    class Strict:
        x: int


    @config
    class Settings:
        x: int
        y: int = 0


    @config(config=ConfigDict(extra="allow"))
    class OpenSettings:
        x: int


    class Event(msgspec.Struct):
        a: int
        b: int = 0


    class Later(Event, kw_only=True):
        c: int


    class Pair(NamedTuple):
        a: int
        b: int = 0


    class Prompt(TypedDict):
        text: str


    class ApiModel(BaseModel):  # vLLM's OpenAIBaseModel: extras allowed, a wrap validator that only looks
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="wrap")
        @classmethod
        def log_extra(cls, data, handler):
            result = handler(data)
            return result


    class Delta(ApiModel):
        role: str | None = None
        content: str
        _private: int = 0
        _secret: int  # a private attribute, no field: never required
        tags: list = Field(default_factory=list)


    class Closed(BaseModel):
        model_config = ConfigDict(extra="forbid")
        x: int
        y: int | None
    """
CALLS = (
    "Tensor(1, 2)", "Tensor(size=1, layers=2, offset=3, strict=True)", "Tensor(1, 2, 3, True)",
    "Tensor(size=1, shared_by=2)", "Tensor(1, 2, cache={})", "Tensor(1, 2, kinds=3)",
    "Options(mode=1)", "Options(1, mode=2)", "Options(1)",
    "Plain(1, 2)", "Plain(1, 2, note=1)", "NoInit(1, 2)", "NoInit(1, 2, more=1)",
    "Manual(1, 2)", "Manual(1)", "WithInitVar(1)", "WithInitVar(name='a')",
    "Loose(1, z=2)", "Loose()", "Strict(1, z=2)", "Settings(x=1, y=2)", "Settings(x=1, z=2)",
    "OpenSettings(x=1, z=2)", "Event(1, b=2)", "Event(1, c=2)", "Later(1, c=2)", "Later(1, 2, 3)",
    "Pair(1)", "Pair(1, 2, 3)", "Prompt(text='t', other=1)",
    "Delta(content='a')", "Delta(role='r')", "Delta(content='a', other=1)", "Delta('a')",
    "Closed(x=1, y=None)", "Closed(x=1)", "Closed(x=1, y=2, z=3)",
)


def _runtime_failures() -> set[str]:
    """The calls of ``CALLS`` that raise when Python builds the classes of ``HOST``."""
    pytest.importorskip("msgspec", reason="the Struct cases are built by msgspec (a vLLM dependency)")
    pytest.importorskip("pydantic", reason="the pydantic dataclass cases are built by pydantic (a vLLM dependency)")
    module = types.ModuleType("generated_init_host")
    sys.modules[module.__name__] = module  # dataclasses looks its module up
    try:
        exec(compile(textwrap.dedent(HOST), "generated_init_host.py", "exec"), module.__dict__)
        failing = set()
        for call in CALLS:
            try:
                eval(call, module.__dict__)
            except Exception:  # TypeError from dataclasses / msgspec / NamedTuple, pydantic's ValidationError
                failing.add(call)
        return failing
    finally:
        del sys.modules[module.__name__]


def test_each_generated_constructor_binds_as_python_builds_the_class(tmp_path):
    failing = _runtime_failures()
    assert "Tensor(size=1, shared_by=2)" in failing and "Tensor(1, 2)" not in failing  # the oracle is alive
    header = ["from vllm.api import (Tensor, Options, Plain, NoInit, Manual, WithInitVar, Loose, Strict, Settings,",
              "                      OpenSettings, Event, Later, Pair, Prompt, Delta, Closed)", "", "def start():"]
    plugin = write_tree(tmp_path / "plugin", {
        "vllm_omni/__init__.py": "", "vllm_omni/entrypoints/__init__.py": "",
        "vllm_omni/entrypoints/omni.py": "\n".join(header + [f"    {call}" for call in CALLS]) + "\n"})
    host = write_tree(tmp_path / "host", {"vllm/__init__.py": "", "vllm/api.py": HOST})
    findings, checked, undecidable = scan(plugin, host)
    reported = {CALLS[f.line - len(header) - 1] for f in findings}
    assert all(f.kind == "call" and f.vllm_object.endswith(".__init__") for f in findings)
    assert reported == failing
    assert checked == len(CALLS) and undecidable == 0


def test_what_the_files_cannot_tell_is_undecidable_never_a_fit(tmp_path):
    host = write_tree(tmp_path / "host", {"vllm/__init__.py": "", "vllm/api.py": """
        from dataclasses import dataclass
        from pydantic import BaseModel, Field, model_validator
        from pydantic.dataclasses import dataclass as pydantic_dataclass
        from torch.nn import Module

        @dataclass
        class FromElsewhere(Module):  # a base from a third package may add fields
            x: int

        @pydantic_dataclass
        class Aliased:
            x: int = Field(alias="X")

        @pydantic_dataclass
        class Validated:
            x: int

            @model_validator(mode="before")
            @classmethod
            def fill(cls, data):
                return data

        class Reshaped(BaseModel):  # a wrap validator that changes what it hands on
            x: int

            @model_validator(mode="wrap")
            @classmethod
            def fill(cls, data, handler):
                data = {"x": 1, **data}
                return handler(data)

        class AliasedModel(BaseModel):
            x: int = Field(alias="X")
        """})
    model = CodeModel(host, host)
    for name, why in (("FromElsewhere", "Module"), ("Aliased", "alias"), ("Validated", "before"),
                      ("Reshaped", "before"), ("AliasedModel", "alias")):
        init, reason = model.constructor(model.resolve("vllm.api", name))
        assert init is None and why in reason, (name, reason)


# Classes of vLLM's that vllm-omni 0.24.0 builds, one of each generator (dataclass, msgspec.Struct, @config).
INSTALLED = ("vllm.v1.kv_cache_interface.KVCacheTensor", "vllm.v1.kv_cache_interface.KVCacheConfig",
             "vllm.v1.core.sched.output.SchedulerOutput", "vllm.v1.core.sched.output.NewRequestData",
             "vllm.outputs.CompletionOutput", "vllm.v1.engine.EngineCoreOutput", "vllm.v1.engine.EngineCoreOutputs",
             "vllm.lora.request.LoRARequest", "vllm.config.lora.LoRAConfig", "vllm.config.load.LoadConfig",
             "vllm.model_executor.models.utils.WeightsMapper")


@needs_vllm
def test_the_installed_vllms_generated_constructors_read_as_inspect_signature_says():
    """Each class's parameters (name, kind, default or not) as the files read them equal what
    ``inspect.signature`` gives for the imported class; a ``**kwargs`` the reading adds for a pydantic dataclass
    that ignores extras is left out (inspect does not show it)."""
    result = run_python(f"""
        import importlib, inspect, json
        found = {{}}
        for path in {list(INSTALLED)!r}:
            module, _, name = path.rpartition(".")
            cls = getattr(importlib.import_module(module), name, None)
            if isinstance(cls, type):
                found[path] = [(p.name, p.kind.name, p.default is not inspect.Parameter.empty)
                               for p in inspect.signature(cls).parameters.values() if p.kind.name != "VAR_KEYWORD"]
        print(json.dumps(found))
        """, env={"VLLM_COMPAT_DISABLE": "1"}, timeout=600, warm=True)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert imported, "none of the classes is in the installed vLLM"
    tree = tree_at(installed_package_root("vllm"))
    model = CodeModel(tree, tree)
    kinds = {ParamKind.POSITIONAL: "POSITIONAL_OR_KEYWORD", ParamKind.KEYWORD_ONLY: "KEYWORD_ONLY"}
    for path, expected in imported.items():
        module, _, name = path.rpartition(".")
        init, why = model.constructor(model.resolve(module, name))
        assert init is not None, (path, why)
        read = [[p.name, kinds[p.kind], p.has_default] for p in bound_params(init.node)
                if p.kind != ParamKind.VAR_KEYWORD]
        assert read == [list(p) for p in expected], path
