"""detect.plugin_entrypoints on the plugins' real release files (cached wheels and sdists; a skip says which is
missing), and on small trees for the shapes no release has.

Expected values are read off the release files by hand (``unzip -p WHEEL PATH``, ``tar -xzOf SDIST PATH``), not from
the code under test: e.g. vllm-spyre 0.5.3's ``entry_points.txt`` is ``[vllm.platform_plugins] spyre =
vllm_spyre:register``, its ``register()`` returns ``"vllm_spyre.platform.SpyrePlatform"``, and
``SpyrePlatform.check_and_update_config`` writes ``parallel_config.worker_cls = f'vllm_spyre{".v1" if
envs.VLLM_USE_V1 else ""}.worker.spyre_worker.SpyreWorker'`` (platform.py:86-89).
"""

from __future__ import annotations

import ast
import shutil
import zipfile

import pytest

from tests.plugins.releases import release_or_skip, vllm_tree_or_skip
from tests.support.trees import write_tree
from vllm_compat.detect.plugin_entrypoints import (
    ArchiveTree,
    _strings,
    host_references,
    read_plugin,
)
from vllm_compat.entrypoints import Entrypoint


def _named(plugin, role):
    return {n.qualname for n in plugin.named if n.role == role}


# ---------------------------------------------------------------------------------------------- real releases


def test_vllm_spyre_platform_plugin_and_its_named_classes():
    plugin = read_plugin(release_or_skip("vllm-spyre", "0.5.3"))
    assert (plugin.distribution, plugin.version, plugin.source, plugin.packages) == (
        "vllm-spyre", "0.5.3", "wheel", ("vllm_spyre",))
    [platform] = plugin.callables
    assert (platform.group, platform.name, platform.value, platform.kind) == (
        "vllm.platform_plugins", "spyre", "vllm_spyre:register", "platform")
    assert platform.function == "vllm_spyre.register"
    assert platform.returns == ("vllm_spyre.platform.SpyrePlatform",)
    # both spellings of the f-string, V1 and V0
    assert _named(plugin, "worker") == {"vllm_spyre.v1.worker.spyre_worker.SpyreWorker",
                                        "vllm_spyre.worker.spyre_worker.SpyreWorker"}
    assert _named(plugin, "scheduler") == {"vllm_spyre.v1.core.scheduler.ContinuousBatchingSpyreScheduler",
                                           "vllm_spyre.v1.core.scheduler.StaticBatchingSpyreScheduler",
                                           "vllm_spyre.core.scheduler.SpyreScheduler"}
    worker = next(n for n in plugin.named if n.qualname.startswith("vllm_spyre.v1.worker"))
    assert (worker.where, worker.via, worker.defined) == (
        "vllm_spyre.platform.SpyrePlatform.check_and_update_config", "parallel_config.worker_cls", True)
    by_id = {e.id: e for e in plugin.entrypoints()}
    assert set(by_id) == {"platform:spyre", "worker", "scheduler"}
    assert by_id["platform:spyre"].roots == ("vllm_spyre", "vllm_spyre.platform")
    assert set(by_id["worker"].roots) == {"vllm_spyre.v1.worker.spyre_worker", "vllm_spyre.worker.spyre_worker"}
    assert all(isinstance(e, Entrypoint) for e in by_id.values())


def test_vllm_spyre_open_range_admits_the_vllm_it_breaks_on():
    """Issue 40: vllm-spyre 0.5.x declares vllm>=0.9.2 and breaks on 0.10.0 (sendnn-inference#336); 0.7.0 declares
    the upper bound 0.10.0 and so excludes 0.10.1, where is_multi_step is gone (sendnn-inference#376)."""
    open_range = read_plugin(release_or_skip("vllm-spyre", "0.5.3"))
    assert [r.requirement for r in open_range.vllm_requirements] == ["vllm>=0.9.2"]
    assert open_range.declared_vllm.marker is None
    assert open_range.allows_vllm("0.10.0") is True
    assert open_range.allows_vllm("0.9.1") is False
    bounded = read_plugin(release_or_skip("vllm-spyre", "0.7.0"))
    assert bounded.declared_vllm.specifier == "<=0.10.0,>=0.9.2"
    assert bounded.allows_vllm("0.10.0") is True
    assert bounded.allows_vllm("0.10.1") is False


def test_sendnn_inference_pins_a_vllm_range():
    plugin = read_plugin(release_or_skip("sendnn-inference", "2.6.3"))
    assert plugin.declared_vllm.specifier == "<0.28.1,>=0.26.0"
    assert [plugin.allows_vllm(v) for v in ("0.25.1", "0.26.0", "0.28.0", "0.28.1", "0.30.0")] == [
        False, True, True, False, False]
    assert plugin.allows_vllm("not a version") is None
    assert [c.value for c in plugin.callables] == ["sendnn_inference:register"]
    assert plugin.callables[0].returns == ("sendnn_inference.platform.SpyrePlatform",)
    assert _named(plugin, "worker") == {"sendnn_inference.v1.worker.spyre_worker.SpyreWorker"}
    # console scripts are listed, and are entrypoints only when asked for
    assert ("sendnn-bench", "sendnn_inference.benchmarks.spyre_bench_serve:main") in plugin.scripts
    assert "script:sendnn-bench" not in {e.id for e in plugin.entrypoints()}
    scripted = {e.id: e for e in plugin.entrypoints(include_scripts=True)}["script:sendnn-bench"]
    assert scripted.scripts == ("sendnn_inference.benchmarks.spyre_bench_serve",)


def test_vllm_metal_register_is_served_by_a_module_getattr():
    """vllm_metal/__init__.py defines no ``register``: its ``__getattr__`` returns ``_register`` for that name, whose
    body imports vllm_metal.platform and returns "vllm_metal.platform.MetalPlatform". Its vLLM requirement applies to
    the ``vllm`` extra only."""
    plugin = read_plugin(release_or_skip("vllm-metal", "0.1.0"))
    by_name = {c.name: c for c in plugin.callables}
    assert set(by_name) == {"metal", "metal_ops"}
    assert by_name["metal"].function == "vllm_metal._register"
    assert "vllm_metal.platform" in by_name["metal"].imports
    assert by_name["metal"].returns == ("vllm_metal.platform.MetalPlatform",)
    assert by_name["metal_ops"].kind == "general" and by_name["metal_ops"].function == "vllm_metal._register_ops"
    assert _named(plugin, "worker") == {"vllm_metal.v1.worker.MetalWorker"}
    [declared] = plugin.vllm_requirements
    assert declared.specifier == ">=0.13.0" and declared.marker == 'extra == "vllm"'
    assert plugin.declared_vllm is declared  # the only one, conditional as it is


def test_vllm_ascend_general_plugin_body_imports_and_platform_classes():
    plugin = read_plugin(release_or_skip("vllm-ascend", "0.9.0rc1"))
    by_name = {c.name: c for c in plugin.callables}
    assert set(by_name) == {"ascend", "ascend_enhanced_model"}
    # register_model(): `import vllm_ascend.patch.worker.patch_common.patch_utils`, `from .models import register_model`
    assert by_name["ascend_enhanced_model"].imports[:2] == ("vllm_ascend.patch.worker.patch_common.patch_utils",
                                                             "vllm_ascend.models")
    assert _named(plugin, "attention_backend") == {
        "vllm_ascend.attention.mla_v1.AscendMLABackend", "vllm_ascend.attention.attention_v1.AscendAttentionBackend",
        "vllm_ascend.attention.attention.AscendMLAAttentionBackend",
        "vllm_ascend.attention.attention.AscendAttentionBackend"}
    assert _named(plugin, "communicator") == {"vllm_ascend.distributed.communicator.NPUCommunicator"}
    assert "vllm_ascend.worker.worker_v1.NPUWorker" in _named(plugin, "worker")
    assert plugin.vllm_requirements == ()  # vllm-ascend declares no vLLM: its docs pair the releases
    roots = {e.id: e.roots for e in plugin.entrypoints()}
    assert roots["general:ascend_enhanced_model"] == (
        "vllm_ascend", "vllm_ascend.patch.worker.patch_common.patch_utils", "vllm_ascend.models")


def test_kvcached_sdist_startup_hook_and_vllm_modules_named_by_string():
    """kvcached publishes sdists only and registers no entry point: kvcached_autopatch.pth (at the sdist's top)
    imports kvcached.autopatch, whose patches reach vLLM modules through importlib.import_module("vllm...")."""
    plugin = read_plugin(release_or_skip("kvcached", "0.1.5"))
    assert (plugin.source, plugin.distribution, plugin.version, plugin.packages) == (
        "sdist", "kvcached", "0.1.5", ("kvcached",))
    assert plugin.callables == ()
    [hook] = plugin.startup
    assert hook.file == "kvcached_autopatch.pth" and "kvcached.autopatch" in hook.imports
    assert {"vllm.v1.core.block_pool", "vllm.v1.worker.gpu_worker"} <= {r.name for r in plugin.host_refs}
    by_id = {e.id: e for e in plugin.entrypoints()}
    assert set(by_id) == {"startup:kvcached_autopatch.pth"}
    assert by_id["startup:kvcached_autopatch.pth"].roots == ("kvcached.autopatch",)
    assert by_id["startup:kvcached_autopatch.pth"].scripts == ("kvcached.autopatch",)  # the .pth calls autopatch_all()
    # autopatch_all() loads the vLLM integration by name: an edge for the import graph, not a start of its own
    assert ("kvcached.integration.vllm.autopatch", "dynamic_import") in {(n.qualname, n.role) for n in plugin.named}
    assert plugin.vllm_requirements == ()


def test_tpu_inference_has_no_entry_point_and_vllm_imports_it():
    """tpu-inference 0.12.0 registers nothing (no entry_points.txt): vLLM's own vllm/platforms/tpu.py imports it, and
    vllm/platforms/__init__.py names "tpu_inference.platforms.tpu_platform.TpuPlatform". Its wheel also ships a
    top-level ``tests`` package, which is not the plugin."""
    plugin = read_plugin(release_or_skip("tpu-inference", "0.12.0"))
    assert plugin.packages == ("tpu_inference",)
    assert plugin.callables == () and plugin.vllm_requirements == ()
    assert _named(plugin, "attention_backend") == {"tpu_inference.layers.vllm.attention.PallasAttentionBackend"}
    assert _named(plugin, "worker") == {"tpu_inference.worker.tpu_worker.TPUWorker"}
    assert "vllm.attention.backends.pallas.PallasAttentionBackend" in {r.name for r in plugin.host_refs}
    refs = host_references(vllm_tree_or_skip("0.24.0"), plugin.packages)
    assert ("vllm.platforms.tpu", "tpu_inference.platforms.TpuPlatform", "import") in {
        (r.importer, r.target, r.how) for r in refs}
    assert ("vllm.platforms", "tpu_inference.platforms.tpu_platform.TpuPlatform", "string") in {
        (r.importer, r.target, r.how) for r in refs}
    reverse = {e.id: e for e in plugin.entrypoints(host_refs=refs)}["imported_by_vllm"]
    assert {"tpu_inference.platforms", "tpu_inference.platforms.tpu_platform"} <= set(reverse.roots)


def test_tpu_inference_0_11_1s_kv_connector_runs_where_it_is_configured():
    """tpu-inference 0.11.1's tpu_inference/distributed/tpu_connector.py defines ``class
    TPUConnector(KVConnectorBase_V1)`` (imported from vllm.distributed.kv_transfer.kv_connector.v1.base); no string
    and no import of the plugin or of vLLM 0.11.1 names that module: vLLM loads it from the user's
    ``kv_connector_module_path``. Its line-80 import of vllm.utils.round_down broke on 0.11.1 (tpu-inference#965)."""
    plugin = read_plugin(release_or_skip("tpu-inference", "0.11.1"))
    assert _named(plugin, "kv_connector") == {"tpu_inference.distributed.tpu_connector.TPUConnector"}
    roots = {e.id: e.roots for e in plugin.entrypoints()}
    assert roots["kv_connector"] == ("tpu_inference.distributed.tpu_connector",)


def test_lmcache_is_imported_by_vllm_and_misses_what_vllm_0_24_imports():
    """vLLM 0.24.0's in-tree LMCache integration (lmcache_integration/vllm_v1_adapter.py:32) imports
    lmcache.v1.plugin.runtime_plugin_launcher; lmcache 0.3.10 (2025) has lmcache/v1/plugin/ but not that module."""
    plugin = read_plugin(release_or_skip("lmcache", "0.3.10"))
    assert plugin.callables == () and plugin.startup == ()
    refs = host_references(vllm_tree_or_skip("0.24.0"), plugin.packages)
    assert ("vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector",
            "lmcache.integration.vllm.vllm_v1_adapter.LMCacheConnectorV1Impl") in {(r.importer, r.target) for r in refs}
    missing = {r.module for r in plugin.missing_for_host(refs)}
    assert "lmcache.v1.plugin.runtime_plugin_launcher" in missing
    assert "lmcache.integration.vllm.vllm_v1_adapter" not in missing
    roots = {e.id: e for e in plugin.entrypoints(host_refs=refs)}["imported_by_vllm"].roots
    assert "lmcache.integration.vllm.vllm_v1_adapter" in roots
    # vLLM's strings "lmcache.skip_save" and "lmcache.mp.host" are config keys, not code: no root of their own
    strings = tuple(r for r in refs if r.how == "string")
    assert {"lmcache.skip_save", "lmcache.mp.host"} <= {r.target for r in strings}
    assert "imported_by_vllm" not in {e.id for e in plugin.entrypoints(host_refs=strings)}


def test_an_unpacked_wheel_reads_as_the_wheel(tmp_path):
    wheel = release_or_skip("vllm-spyre", "0.5.3")
    zipfile.ZipFile(wheel).extractall(tmp_path)
    assert read_plugin(tmp_path).to_dict() == {**read_plugin(wheel).to_dict(), "source": "tree"}


def test_a_site_packages_directory_needs_the_distribution(tmp_path):
    for name in ("vllm-spyre", "sendnn-inference"):
        zipfile.ZipFile(release_or_skip(name, {"vllm-spyre": "0.5.3", "sendnn-inference": "2.6.3"}[name])
                        ).extractall(tmp_path)
    spyre = read_plugin(tmp_path, distribution="vllm_spyre")
    assert (spyre.distribution, spyre.packages) == ("vllm-spyre", ("vllm_spyre",))
    sendnn = read_plugin(tmp_path, distribution="sendnn-inference")
    assert (sendnn.distribution, sendnn.packages) == ("sendnn-inference", ("sendnn_inference",))


def test_an_unpacked_sdist_reads_as_the_sdist(tmp_path):
    sdist = release_or_skip("kvcached", "0.1.5")
    archive = ArchiveTree(sdist)
    for name in archive.meta_names():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(archive._tar.extractfile(archive._members[archive.top + name]).read())
    unpacked = read_plugin(tmp_path)
    assert unpacked.to_dict() == {**read_plugin(sdist).to_dict(), "source": "tree"}


# ---------------------------------------------------------------------------------------------- shapes


def test_sdist_metadata_from_pyproject_and_src_layout(tmp_path):
    """An unpacked source tree with a ``src/`` layout and its entry points and requirement in pyproject.toml only."""
    write_tree(tmp_path, {
        "pyproject.toml": """
            [project]
            name = "demo-plugin"
            version = "1.2.3"
            dependencies = ["torch", "vllm>=0.20,<0.22"]
            [project.optional-dependencies]
            extra = ["vllm==0.21.0"]
            [project.entry-points."vllm.general_plugins"]
            demo = "demo_plugin.hooks:register"
            """,
        "src/demo_plugin/__init__.py": "",
        "src/demo_plugin/hooks.py": """
            def register():
                from demo_plugin import ops  # noqa: F401
                import importlib
                importlib.import_module("demo_plugin.kernels")
            """,
        "src/demo_plugin/ops.py": "",
        "src/demo_plugin/kernels.py": "",
        "tests/__init__.py": "",
    })
    plugin = read_plugin(tmp_path)
    assert (plugin.distribution, plugin.version, plugin.packages) == ("demo-plugin", "1.2.3", ("demo_plugin",))
    assert [(r.specifier, r.marker) for r in plugin.vllm_requirements] == [
        ("<0.22,>=0.20", None), ("==0.21.0", 'extra == "extra"')]
    [hook] = plugin.callables
    assert hook.function == "demo_plugin.hooks.register"
    assert set(hook.imports) >= {"demo_plugin", "demo_plugin.ops", "demo_plugin.kernels"}
    [entry] = plugin.entrypoints()
    assert entry.roots == ("demo_plugin.hooks", "demo_plugin", "demo_plugin.ops", "demo_plugin.kernels")


def test_strings_that_name_code_and_those_that_do_not(tmp_path):
    write_tree(tmp_path, {
        "demo/__init__.py": 'def register():\n    return "demo.platform.DemoPlatform"\n',
        "demo/platform.py": '''
            LOGGER = "demo.platform"  # a logger name: a module, but nothing imports it by this name
            KEY = "demo.cache_size"  # a config key
            class DemoPlatform:
                def get_attn_backend_cls(cls, use_mla):
                    return "demo.attn.MLABackend" if use_mla else "demo.attn.Backend"
                def check_and_update_config(cls, config):
                    if config.worker_cls == "demo.worker.Old":  # a comparison names nothing
                        pass
                    config.worker_cls = "demo.worker." + "DemoWorker"
                    config.update({"scheduler_cls": "demo.sched.Gone"})
                    return "vllm.v1.worker.gpu_worker.Worker"
            ''',
        "demo/attn.py": "class Backend: ...\nclass MLABackend: ...\n",
        "demo/worker.py": "class DemoWorker: ...\n",
        "demo/sched.py": "",
    })
    write_tree(tmp_path, {"demo-0.1.dist-info/METADATA": "Name: demo\nVersion: 0.1\n",
                          "demo-0.1.dist-info/entry_points.txt": "[vllm.platform_plugins]\ndemo = demo:register\n"})
    plugin = read_plugin(tmp_path)
    named = {n.qualname: n for n in plugin.named}
    assert set(named) == {"demo.platform.DemoPlatform", "demo.attn.MLABackend", "demo.attn.Backend",
                          "demo.worker.DemoWorker", "demo.sched.Gone"}
    assert named["demo.attn.Backend"].role == "attention_backend"
    assert named["demo.worker.DemoWorker"].role == "worker"
    assert (named["demo.sched.Gone"].role, named["demo.sched.Gone"].defined) == ("scheduler", False)
    assert [r.name for r in plugin.host_refs] == ["vllm.v1.worker.gpu_worker.Worker"]
    roles = {e.id: e.roots for e in plugin.entrypoints()}
    assert roles == {"platform:demo": ("demo", "demo.platform"), "attention_backend": ("demo.attn",),
                     "worker": ("demo.worker",)}  # a dangling name has no root to follow


def test_a_class_deriving_a_base_vllm_loads_by_module_path_is_that_role(tmp_path):
    """A KV connector runs where the user configures its module path: the class deriving vLLM's base is the root,
    imported by name or dotted; a same-named base of the plugin's own, or one nested in a function, is not."""
    write_tree(tmp_path, {
        "demo/__init__.py": "",
        "demo/conn.py": """
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1 as Base
            class Mine(Base): ...
            """,
        "demo/dotted.py": """
            import vllm.distributed.kv_transfer.kv_connector.base
            class Old(vllm.distributed.kv_transfer.kv_connector.base.KVConnectorBase): ...
            """,
        "demo/own.py": """
            class KVConnectorBase_V1: ...
            class NotVllms(KVConnectorBase_V1): ...
            def make():
                from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
                class Inner(KVConnectorBase_V1): ...
            """,
    })
    write_tree(tmp_path, {"demo-0.1.dist-info/METADATA": "Name: demo\nVersion: 0.1\n"})
    plugin = read_plugin(tmp_path)
    assert {(n.qualname, n.via) for n in plugin.named if n.role == "kv_connector"} == {
        ("demo.conn.Mine", "derives KVConnectorBase_V1"), ("demo.dotted.Old", "derives KVConnectorBase")}
    assert {e.id: e.roots for e in plugin.entrypoints()} == {"kv_connector": ("demo.conn", "demo.dotted")}


def test_constant_strings_are_expanded_without_running_anything():
    def strings(source):
        return _strings(ast.parse(source, mode="eval").body)

    assert strings('"a.b"') == ["a.b"]
    assert strings('f"a{\'.v1\' if V1 else \'\'}.w.W"') == ["a.v1.w.W", "a.w.W"]
    assert strings('"a." + ("x" if c else "y")') == ["a.x", "a.y"]
    assert strings('f"a.{name}"') == []  # not constant: unknown, never guessed
    assert strings("name") == []


def test_a_tree_with_no_package_is_refused_with_a_sentence(tmp_path):
    (tmp_path / "README.md").write_text("nothing here")
    with pytest.raises(ValueError, match="No Python package found"):
        read_plugin(tmp_path)


def test_reading_imports_nothing_of_the_plugin(tmp_path):
    """The plugin's code would raise on import; reading it does not run it."""
    write_tree(tmp_path, {"boom/__init__.py": "raise RuntimeError('imported')\ndef register():\n    return None\n",
                          "boom-1.0.dist-info/METADATA": "Name: boom\nVersion: 1.0\nRequires-Dist: vllm>=0.30\n",
                          "boom-1.0.dist-info/entry_points.txt": "[vllm.general_plugins]\nboom = boom:register\n"})
    plugin = read_plugin(tmp_path)
    assert [c.function for c in plugin.callables] == ["boom.register"]
    assert plugin.allows_vllm("0.34.0") is True
    shutil.rmtree(tmp_path / "boom")


def test_an_sdist_serves_the_readers_a_wheel_serves():
    """ArchiveTree answers as a wheel's SourceTree does (``is_zip``: a full name list), so host_index can read a
    release that exists only as an sdist (kvcached; vLLM releases older than the cached wheels)."""
    from vllm_compat.detect.host_index import HostIndex

    archive = ArchiveTree(release_or_skip("kvcached", "0.1.5"))
    index = HostIndex(archive)
    assert index.module_file("kvcached.integration.vllm.patches") == "kvcached/integration/vllm/patches.py"
    assert index.module_file("kvcached.integration.vllm") == "kvcached/integration/vllm/__init__.py"
    assert index.module_file("kvcached.nothing") is None
    assert index.lookup("kvcached.autopatch", "autopatch_all") == "yes"
