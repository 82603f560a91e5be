"""Activation: the post-import hooks, the plugin entry point, ``apply()`` and ``revert()``, for every entry of
the catalogue alike.

Idempotent and thread-safe by construction: detection runs outside the lock (it may import modules); the
decision, the install and the bookkeeping run under one lock, and an entry's ``install`` is a no-op when the
same thing is already in place. However often a hook fires, plugins load or ``apply()`` runs, a process ends
with one patch per target, one INFO line on logger ``vllm_compat`` (what it patched or bridged, with ids) and
the per-entry lines at DEBUG.

Nothing here knows a target: module, owner, facts and install all come from the drift point's module, found
through its catalogue row (``vllm_compat.catalogue``).

Bad controls are answered early, with one message: ``apply()`` raises the ``ConfigError`` of any invalid
``VLLM_COMPAT_*`` value or unknown ``VLLM_COMPAT_*`` name before it does anything else; activation (the hooks'
registration, when the startup hook's first-import hook fires) logs that message once as a WARNING and goes on;
a post-import hook records the entry as refused with that message instead of raising it mid-import (under a
valid ``VLLM_COMPAT_STRICT=1`` it raises). The shim never kills a worker over a typo.
"""

# No `from __future__ import annotations`: see vllm_compat/__init__.py.

import _thread  # not threading: `import vllm_compat` imports this module and must stay cheap
import sys

from .catalogue import CATALOGUE

_lock = _thread.RLock()
_decisions: dict = {}  # entry id -> latest Decision in this process
_settled: dict = {}  # (entry id, id(owner), Controls) -> (what we left on the owner, Decision): fast path
_suspended = False  # set by revert(): the hooks record instead of patching until apply() runs again
_applying = 0  # apply() calls running now: the summary waits for them


def _record(decision, owner=None) -> None:
    """Keep ``decision`` and log it: per entry at DEBUG (a refusal at WARNING), and what vllm_compat changed in the
    process in one INFO line (``_summarize_once``)."""
    _decisions[decision.name] = decision
    from .hooks import shared_state

    logged = shared_state("logged_decisions", set)  # shared: a re-imported vllm_compat does not log twice
    key = (decision.name, decision.action, decision.variant, id(owner))
    if key in logged:
        return
    logged.add(key)
    import logging  # not at module level: `import vllm_compat` imports this module and must stay cheap

    logger = logging.getLogger("vllm_compat")
    level = logging.WARNING if decision.action == "refused" else logging.DEBUG
    logger.log(level, "vllm_compat: %s %s%s: %s", decision.action, decision.target,
               f" ({decision.variant} variant)" if decision.variant else "", decision.reason)
    if decision.action == "patched":
        _summarize_once()


def _summarize_once() -> None:
    """The one INFO line of a process: what vllm_compat patched or bridged, with ids. Logged once, when the first
    entry is installed; where that happens inside a hooked import (a target, or vLLM or vllm-omni itself) or
    inside ``apply()``, once the last of those has ended (``_log_summary_if_due``), so the line names everything
    that import installed. Later installs are at DEBUG."""
    from .hooks import shared_state

    shared_state("summary", dict)["due"] = True
    _log_summary_if_due()


def _log_summary_if_due() -> None:
    """Imports-settled hook, and the end of ``apply()``: the summary that came due meanwhile is logged now."""
    from .hooks import hooked_import_in_progress, shared_state

    if shared_state("summary", dict).get("due") and not hooked_import_in_progress() and not _applying:
        _log_summary()


def _log_summary() -> None:
    from .hooks import shared_state

    state = shared_state("summary", dict)
    if state.get("logged"):
        return
    state["logged"] = True
    import logging

    with _lock:
        decisions = list(_decisions.values())
    changed = [f"{d.name}" + (f" ({d.variant})" if d.variant else "") for d in decisions if d.action == "patched"]
    refused = [d.name for d in decisions if d.action == "refused"]
    logging.getLogger("vllm_compat").info(
        "vllm_compat: patched or bridged %d drift point(s): %s%s (per entry at DEBUG on logger vllm_compat; "
        "`vllm-compat doctor` shows all)", len(changed), ", ".join(changed),
        f"; refused {', '.join(refused)}" if refused else "")


def activate_entry(entry, module, controls=None):
    """Detect, decide and (maybe) install ``entry`` on its already imported target ``module``.

    Returns the Decision. Raises ``ConfigError`` on a bad control (its hook turns that into a refusal,
    ``_hook_for``), and ``PatchRefusedError`` for a refusal under ``VLLM_COMPAT_STRICT=1``; any other failure is
    recorded as a refusal with its cause, so a worker never dies because of the shim. A "disabled" decision also
    takes out what was installed earlier.
    """
    from .config import read_controls
    from .decide import Action, decide_entry
    from .errors import PatchRefusedError

    controls = controls or read_controls()
    point = entry.point
    point.check_controls(controls)  # a bad switch is the user's error to see, not a refusal
    owner = point.locate(module)
    settled = _settled_decision(entry, point, owner, controls)
    if settled is not None:
        return settled
    try:
        facts = point.detect_runtime(module)
        decision = decide_entry(entry, facts, controls)
        state = point.prepare(owner, facts) if decision.action == Action.PATCHED else None
        with _lock:
            if _suspended and decision.action == Action.PATCHED:
                decision = _suspended_decision(decision)
            elif decision.action == Action.PATCHED:
                point.install(owner, decision, state)
            elif decision.action == Action.DISABLED and owner is not None:
                point.uninstall(owner)
            _record(decision, owner)
            if not _suspended:
                _settled[(entry.id, id(owner), controls)] = (point.in_place(owner), decision)
    except PatchRefusedError as exc:
        decision = entry.decision(Action.REFUSED, str(exc))
        with _lock:
            _record(decision, owner)
    except Exception as exc:  # noqa: BLE001 - never let the shim kill the import it hooks
        import logging

        logging.getLogger("vllm_compat").exception("vllm_compat: unexpected error while patching %s",
                                                   entry.target_path)
        decision = entry.decision(Action.REFUSED, f"unexpected {type(exc).__name__}: {exc}; left unpatched")
        with _lock:
            _record(decision, owner)
    if decision.action == Action.REFUSED and controls.strict:
        raise PatchRefusedError(f"{decision.target}: {decision.reason} (VLLM_COMPAT_STRICT=1 makes this an error)")
    return decision


def _settled_decision(entry, point, owner, controls):
    """The decision already made for this owner object under these controls, while what is on the owner is
    still what we left there; None when anything changed (reload, revert, someone else's patch)."""
    with _lock:
        settled = _settled.get((entry.id, id(owner), controls))
        if settled is None or _suspended:
            return None
        in_place, decision = settled
        return decision if point.in_place(owner) is in_place else None


def _suspended_decision(decision):
    from dataclasses import replace

    from .decide import Action

    return replace(decision, action=Action.SKIPPED, variant=None,
                   reason="reverted by vllm_compat.revert(); call vllm_compat.apply() to patch again")


def _hook_for(entry):
    def on_target_imported(module) -> None:
        try:
            activate_entry(entry, module)
        except Exception as exc:
            from .config import is_strict
            from .errors import ConfigError

            if not isinstance(exc, ConfigError) or is_strict():
                raise
            _refuse_for_bad_control(entry, module, exc)

    on_target_imported.__qualname__ = f"on_import[{entry.id}]"
    return on_target_imported


def _refuse_for_bad_control(entry, module, error) -> None:
    """Record ``entry`` as refused because of the ``ConfigError`` ``error``: its target, mid-import, is left as it
    is. The WARNING is the activation's one line for that message (logged here when activation did not see it:
    the variable was set later); the refusal itself is at DEBUG."""
    from .decide import Action

    _warn_bad_controls(error)
    decision = entry.decision(Action.REFUSED, f"{error} Left unpatched until it is fixed.")
    with _lock:
        _decisions[entry.id] = decision
    import logging

    logging.getLogger("vllm_compat").debug("vllm_compat: refused %s: %s", decision.target, decision.reason)


def _warn_bad_controls(error) -> None:
    """Log the ``ConfigError`` ``error`` as a WARNING on logger ``vllm_compat``, once per message and process."""
    from .hooks import shared_state

    warned = shared_state("bad_controls_warned", set)
    if str(error) in warned:
        return
    warned.add(str(error))
    import logging

    logging.getLogger("vllm_compat").warning(
        "vllm_compat: %s vllm_compat.apply() raises this error; the import hooks do not, and leave each entry "
        "whose control is invalid unpatched (refused) until it is fixed.", error)


def _check_controls_on_activation() -> None:
    """Activation's look at the controls: each bad one logged once (``_warn_bad_controls``), never raised.

    Nearly free in the usual case: with no ``VLLM_COMPAT_*`` variable set it reads the environment and returns;
    with core controls or tooling variables only, it parses them without importing any drift point
    (``config.check_switches``)."""
    import os

    if not any(name.startswith("VLLM_COMPAT_") for name in os.environ):
        return
    try:
        from .config import read_checked_controls
        from .errors import ConfigError

        read_checked_controls()
    except ConfigError as exc:
        _warn_bad_controls(exc)
    except Exception:  # noqa: BLE001 - never let the shim kill the import it runs before
        import logging

        logging.getLogger("vllm_compat").exception("vllm_compat: could not check the VLLM_COMPAT_* controls; "
                                                   "`vllm_compat.apply()` and `vllm-compat doctor` say more")


_HOOKS = {entry.id: _hook_for(entry) for entry in CATALOGUE}  # one callable per entry: registration dedups


def install_import_hook() -> None:
    """Register one post-import hook per catalogue entry (cheap; imports nothing heavy), then check the
    ``VLLM_COMPAT_*`` controls (``_check_controls_on_activation``: a bad one is logged, never raised).
    Idempotent."""
    _register_hooks()
    _check_controls_on_activation()


def _register_hooks() -> None:
    from .hooks import register_imports_settled_hook, register_post_import_hook

    for entry in CATALOGUE:
        register_post_import_hook(entry.target_module, _HOOKS[entry.id])
    from . import SERVED_PACKAGES

    register_imports_settled_hook(_log_summary_if_due, watched=SERVED_PACKAGES)


def _loaded(name: str):
    from .hooks import _is_initialized

    module = sys.modules.get(name)
    return module if module is not None and _is_initialized(module) else None


def _pending_decision(entry, controls):
    from .decide import Action, disabled_decision
    from .detect.versions import installed_version

    disabled = disabled_decision(entry, controls)
    if disabled is not None:
        return disabled
    if installed_version(entry.distribution) is None:
        return entry.decision(Action.PENDING, f"{entry.distribution} is not installed; patched if it is imported")
    return entry.decision(Action.PENDING, f"{entry.target_module} is not imported yet; handled when it is")


def apply() -> list:
    """Handle every catalogue entry the decision table says to handle, now or when its target is imported.

    Returns the list of Decisions, one per catalogue entry, in catalogue order. Idempotent: a second call
    changes nothing. Imports no target: an entry whose target module is not imported yet is "pending" and is
    handled by its import hook. Raises ``ConfigError`` first, before registering or changing anything, when a
    ``VLLM_COMPAT_*`` value is invalid or a ``VLLM_COMPAT_*`` name unknown (``config.read_checked_controls``: every
    drift point's switches, not only those of the targets imported so far).
    """
    global _suspended, _applying
    from .config import read_checked_controls
    from .decide import Action

    controls = read_checked_controls()
    with _lock:
        _suspended = False
        _applying += 1
    _register_hooks()
    decisions = []
    try:
        for entry in CATALOGUE:
            module = _loaded(entry.target_module)
            if module is not None:
                decisions.append(activate_entry(entry, module, controls))
                continue
            decision = _pending_decision(entry, controls)
            with _lock:
                _decisions.setdefault(entry.id, decision)
                if _decisions[entry.id].action in (Action.PENDING, Action.DISABLED):
                    _decisions[entry.id] = decision
                decisions.append(_decisions[entry.id])
    finally:
        with _lock:
            _applying -= 1
        _log_summary_if_due()
    return decisions


def revert() -> list:
    """Put back exactly what every entry replaced and stop the hooks from patching until ``apply()`` runs
    again. Returns the Decisions as they stand afterwards."""
    global _suspended

    with _lock:
        _suspended = True
        _settled.clear()
        for entry in CATALOGUE:
            module = _loaded(entry.target_module)
            owner = entry.point.locate(module) if module is not None else None
            if owner is not None and entry.point.uninstall(owner):
                previous = _decisions.get(entry.id)
                if previous is not None:  # None: installed by another copy of vllm_compat in this process
                    _decisions[entry.id] = _suspended_decision(previous)
        return list(_decisions.values())


def current_decisions() -> list:
    """The Decisions recorded in this process so far (empty before any hook fired or apply() ran)."""
    with _lock:
        return list(_decisions.values())


def activate_plugin() -> None:
    """Entry point of the ``vllm.general_plugins`` and ``vllm_omni.general_plugins`` groups: every vLLM and
    vllm-omni process calls it at start. Safe to call any number of times."""
    apply()
