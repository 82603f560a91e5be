"""Build hooks only (the metadata is in pyproject.toml): put ``vllm_compat_startup.pth`` into site-packages,
for wheels and editable installs alike.

A wheel gets it from ``build_py`` (top level of the build tree, so of purelib). setuptools' editable wheels
(PEP 660, what ``uv pip install -e .`` builds) ignore the build tree in their default ("lenient") mode and
``data_files`` land under the prefix, not site-packages; so the editable wheel's strategy is wrapped to write
the same file into the wheel's root. ``tests/test_startup.py`` checks both installs.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).resolve().parent / "vllm_compat_startup.pth"


class BuildPyWithStartup(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib, PTH.name)), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib, PTH.name))]


class _WithStartupPth:
    """An editable strategy that also writes the startup .pth into the editable wheel."""

    def __init__(self, strategy):
        self.strategy = strategy

    def __call__(self, wheel, files, mapping):
        self.strategy(wheel, files, mapping)
        wheel.writestr(PTH.name, PTH.read_bytes())

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self.strategy.__exit__(*exc_info)


class EditableWheelWithStartup(editable_wheel):
    def _select_strategy(self, *args, **kwargs):
        return _WithStartupPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildPyWithStartup, "editable_wheel": EditableWheelWithStartup})
