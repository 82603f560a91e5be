"""The startup hook: ``vllm_compat_startup.pth``, installed into site-packages with the package (``setup.py``
puts it there for wheels and editable installs), runs ``import vllm_compat`` in every interpreter of the
environment, so the post-import hooks are registered before any ``import vllm_omni``. The plugin entry points
fire only after that import: too late for the names it needs (``vllm_compat.bridges``).

The line does what ``import vllm_compat`` does (register the finder and the first-import hooks that register one
post-import hook per catalogue entry before anything of vLLM or vllm-omni is looked up) and nothing else, at the
same cost: two modules, no vLLM import, no file read, no logging. It does nothing when ``VLLM_COMPAT_DISABLE``
is set to a true value, and swallows every exception: a broken vllm_compat must never stop an interpreter from
starting (``vllm-compat doctor`` says what is wrong). This module is not imported at startup; it answers
whether the hook is installed.
"""

from __future__ import annotations

PTH_NAME = "vllm_compat_startup.pth"


def is_installed() -> bool:
    """Whether this interpreter's site directories hold the startup ``.pth`` (a few ``stat`` calls)."""
    import os
    import site

    dirs = [*getattr(site, "getsitepackages", list)(), getattr(site, "getusersitepackages", str)()]
    return any(os.path.isfile(os.path.join(d, PTH_NAME)) for d in dirs if d)
