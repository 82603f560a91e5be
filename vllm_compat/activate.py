"""Activation: the post-import hook, the plugin entry point, ``apply()`` and ``revert()``.

Idempotent and thread-safe by construction: detection runs outside the lock (it may import modules); the
decision, the install and the bookkeeping run under one lock, and ``install`` is a no-op when the same variant
is already on the class. However often the hook fires, plugins load or ``apply()`` runs, a process ends with one
patch and one INFO line per patched class on logger ``vllm_compat``.
"""

from __future__ import annotations

import _thread  # not threading: `import vllm_compat` imports this module and must stay cheap
import sys

from .patches.catalogue import DIFFUSERS_LOADER

LOADER_MODULE = DIFFUSERS_LOADER.target_module
LOADER_CLASS_NAME, METHOD_NAME = DIFFUSERS_LOADER.target.split(".")

_lock = _thread.RLock()
_decisions: dict = {}  # patch id -> latest Decision in this process
_settled: dict = {}  # (id(loader class), Controls) -> (method left on the class, Decision): apply() fast path
_suspended = False  # set by revert(): the hook records instead of patching until apply() runs again


def _record(decision, loader_class=None) -> None:
    _decisions[decision.name] = decision
    from .hooks import shared_state

    logged = shared_state("logged_decisions", set)  # shared: a re-imported vllm_compat does not log twice
    key = (decision.action, decision.variant, id(loader_class))
    if key in logged:
        return
    logged.add(key)
    import logging  # not at module level: `import vllm_compat` imports this module and must stay cheap

    logger = logging.getLogger("vllm_compat")
    level = logging.WARNING if decision.action == "refused" else logging.INFO
    logger.log(level, "vllm_compat: %s %s%s: %s", decision.action, decision.target,
               f" ({decision.variant} variant)" if decision.variant else "", decision.reason)


def _refusal(reason: str):
    from .decide import Action, Decision

    return Decision(DIFFUSERS_LOADER.id, DIFFUSERS_LOADER.target_path, Action.REFUSED, None, reason)


def _method_owner(module):
    """The class that defines the loader method in effect: vllm-omni's class, or, where the module's class was
    replaced by a subclass that inherits the method, the base that defines it. None when there is no class."""
    loader_class = getattr(module, LOADER_CLASS_NAME, None)
    if not isinstance(loader_class, type):
        return None
    return next((klass for klass in loader_class.__mro__ if METHOD_NAME in vars(klass)), loader_class)


def patch_loader_module(module, controls=None):
    """Detect, decide and (maybe) patch vllm-omni's already imported diffusion loader ``module``.

    Returns the Decision. Raises ``ConfigError`` on a bad control, and ``PatchRefusedError`` for a refusal
    under ``VLLM_COMPAT_STRICT=1``; any other failure is recorded as a refusal with its cause, so a worker
    never dies because of the shim. A "disabled" decision also takes out a patch installed earlier.
    """
    from .config import read_controls
    from .decide import Action
    from .errors import PatchRefusedError

    controls = controls or read_controls()
    owner = _method_owner(module)
    settled = _settled_decision(owner, controls)
    if settled is not None:
        return settled
    try:
        decision, deps = _decide_for_module(module, owner, controls)
        with _lock:
            if _suspended and decision.action == Action.PATCHED:
                decision = _suspended_decision(decision)
            elif decision.action in (Action.PATCHED, Action.DISABLED):
                from .patches import diffusers_loader

                if decision.action == Action.PATCHED:
                    diffusers_loader.install(owner, decision.variant, deps)
                elif owner is not None:
                    diffusers_loader.uninstall(owner)
            _record(decision, owner)
            if not _suspended:
                _settled[(id(owner), controls)] = (_current_method(owner), decision)
    except PatchRefusedError as exc:
        decision = _refusal(str(exc))
        with _lock:
            _record(decision, owner)
    except Exception as exc:  # noqa: BLE001 - never let the shim kill the import it hooks
        import logging

        logging.getLogger("vllm_compat").exception("vllm_compat: unexpected error while patching %s", LOADER_MODULE)
        decision = _refusal(f"unexpected {type(exc).__name__}: {exc}; left unpatched")
        with _lock:
            _record(decision, owner)
    if decision.action == Action.REFUSED and controls.strict:
        raise PatchRefusedError(f"{decision.target}: {decision.reason} (VLLM_COMPAT_STRICT=1 makes this an error)")
    return decision


def _current_method(owner):
    return vars(owner).get(METHOD_NAME) if owner is not None else None


def _settled_decision(owner, controls):
    """The decision already made for this class object under these controls, while the method on the class is
    still the one we left there; None when anything changed (reload, revert, someone else's patch)."""
    with _lock:
        settled = _settled.get((id(owner), controls))
        if settled is None or _suspended:
            return None
        method, decision = settled
        return decision if _current_method(owner) is method else None


def _decide_for_module(module, owner, controls):
    from .decide import Action, decide_loader_patch
    from .detect.runtime import detect_runtime
    from .patches import diffusers_loader

    env = detect_runtime(module)
    decision = decide_loader_patch(env, controls, DIFFUSERS_LOADER.id, DIFFUSERS_LOADER.target_path)
    if decision.action != Action.PATCHED:
        return decision, None
    diffusers_loader.check_contract(_current_method(owner), env.loader)
    return decision, diffusers_loader.resolve_deps(env.vllm.has_compatible_finalize)


def _suspended_decision(decision):
    from dataclasses import replace

    from .decide import Action

    return replace(decision, action=Action.SKIPPED, variant=None,
                   reason="reverted by vllm_compat.revert(); call vllm_compat.apply() to patch again")


def _on_loader_imported(module) -> None:
    patch_loader_module(module)


def install_import_hook() -> None:
    """Register the post-import hook (cheap; imports nothing heavy). Idempotent."""
    from .hooks import register_post_import_hook

    register_post_import_hook(LOADER_MODULE, _on_loader_imported)


def _loaded_loader_module():
    from .hooks import _is_initialized

    module = sys.modules.get(LOADER_MODULE)
    return module if module is not None and _is_initialized(module) else None


def apply() -> list:
    """Patch everything the decision table says to patch, now or when the target is imported.

    Returns the list of Decisions (one per catalogue entry). Idempotent: a second call changes nothing.
    Does not import vllm-omni: a loader that is installed but not imported yet is "pending" and gets patched by
    the import hook.
    """
    global _suspended
    from .config import read_controls
    from .decide import DISABLED_REASON, Action, Decision
    from .detect.versions import installed_version

    controls = read_controls()
    with _lock:
        _suspended = False
    install_import_hook()
    module = _loaded_loader_module()
    if module is not None:
        return [patch_loader_module(module, controls)]
    if controls.disabled:
        action, reason = Action.DISABLED, DISABLED_REASON
    elif installed_version("vllm-omni") is None:
        action, reason = Action.PENDING, "vllm-omni is not installed; patched if it is imported"
    else:
        action, reason = Action.PENDING, f"{LOADER_MODULE} is not imported yet; patched when it is"
    decision = Decision(DIFFUSERS_LOADER.id, DIFFUSERS_LOADER.target_path, action, None, reason)
    with _lock:
        _decisions.setdefault(decision.name, decision)
        if _decisions[decision.name].action in (Action.PENDING, Action.DISABLED):
            _decisions[decision.name] = decision
    return [_decisions[decision.name]]


def revert() -> list:
    """Put back the exact original functions and stop the hook from patching until ``apply()`` runs again.

    Returns the Decisions as they stand afterwards.
    """
    global _suspended
    from .patches import diffusers_loader

    module = _loaded_loader_module()
    with _lock:
        _suspended = True
        _settled.clear()
        owner = _method_owner(module) if module is not None else None
        if owner is not None and diffusers_loader.uninstall(owner):
            previous = _decisions.get(DIFFUSERS_LOADER.id)
            if previous is not None:  # None: patched by another copy of vllm_compat in this process
                _decisions[DIFFUSERS_LOADER.id] = _suspended_decision(previous)
        return list(_decisions.values())


def current_decisions() -> list:
    """The Decisions recorded in this process so far (empty before any hook fired or apply() ran)."""
    with _lock:
        return list(_decisions.values())


def activate_plugin() -> None:
    """Entry point of the ``vllm.general_plugins`` and ``vllm_omni.general_plugins`` groups: every vLLM and
    vllm-omni process calls it at start. Safe to call any number of times."""
    apply()
