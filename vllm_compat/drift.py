"""The drift point: the small base every drift point derives from, and the one install primitive they share.

A drift point is one module (or one package) under ``vllm_compat/patches/`` or ``vllm_compat/bridges/`` that
opens with its docstring (the one home of its prose, see below), defines one class deriving ``DriftPoint`` (or a
base built on it: ``bridges._name_stand_in.NameStandIn`` / ``FunctionStandIn``, ``bridges._module_stand_in.
ModuleStandIn``, ``bridges._engine_startup_call.CallAdapter``, ``patches._method.MethodPatch``) and exports one
instance::

    DRIFT_POINT = MyStandIn()

and has one row in ``vllm_compat/catalogue.py`` (id, kind, module, target module, target). The instance finds its
row itself (``entry``, by its class's module); it never imports the catalogue. The interface, with the defaults
this base gives:

==============================================  ====================================================================
``entry`` / ``id`` / ``target_path``            its catalogue row (resolved on first use), its id, ``module.name``
``detect_static(site) -> facts``                the facts it decides on, from files only (``detect.static.StaticSite``)
                                                (required)
``detect_runtime(module) -> facts``             the same facts from the imported target module; equal to the static
                                                ones on the same install (required)
``decide(facts, controls) -> Decision``         pure; ``self.decision(action, reason, variant)`` builds one; the
                                                shared "disabled" controls are handled before it is called (required)
``switches``                                    the ``VLLM_COMPAT_*`` variables it reads (names); one set that no
                                                drift point reads is a ``ConfigError`` at ``apply()``; default:
                                                none
``check_controls(controls)``                    validates its own ``VLLM_COMPAT_*`` switches (``controls.switch(name)``),
                                                ``ConfigError`` on a bad value; run for every drift point at
                                                activation and at ``apply()`` (``config.check_switches``), before
                                                its target is imported; default: it has none
``locate(module) -> owner | None``              the object that holds the target; default: the module itself
``prepare(owner, facts) -> state``              the pre-install contract check (``PatchRefusedError`` saying what was
                                                expected and found) and what ``install`` needs; default: nothing
``install(owner, decision, state) -> bool``     idempotent; marks what it puts in place (``mark``); False: already
                                                there (required)
``uninstall(owner) -> bool``                    puts back exactly what was there; False when nothing of ours was
                                                (required)
``in_place(owner)``                             what is now on the owner (activation's "already settled?" check);
                                                default: ``owner.<target>``
``is_installed(owner) -> bool``                 whether something of ours is there; default: ``in_place`` is ours
``compare(static, runtime) -> list[str]``       differences between the two detections; default: the two facts
                                                differ at all
``facts_dict(facts) -> dict``                   the facts for ``--json``; default: ``facts.to_dict()`` or ``asdict``
``report_lines(facts) -> list[str]``            lines doctor and check print under the versions; default: none
``report_fields(facts) -> dict``                keys merged into doctor's / check's ``--json``; default: none
``header_note(facts) -> str``                   a word for the pytest header beside the versions; default: none
``capabilities(facts) -> dict[str, bool]``      answers to ``@pytest.mark.vllm_capability(name)`` for the names in
                                                ``capability_names``; default: none
``imported_by_doctor``                          whether ``doctor --runtime`` imports the target module (default:
                                                False; doctor imports vLLM and vllm-omni and reads what is loaded)
==============================================  ====================================================================

The docstring of a drift-point module opens with a title line naming the target, then, each as a paragraph
starting with its label: ``Why:`` (the upstream change and what breaks without us), ``When:`` (which variant or
install serves which upstream shape), ``Serves:`` (one line: the versions it is for, as measured) and ``Retire
when:`` (one line). ``python -m vllm_compat.docs`` renders them as ``docs/drift-points.md`` and one page per entry.

The install primitive (as wrapt's ``resolve_path`` / ``apply_patch`` / ``wrap_object``): ``where`` is an owner and a
name (a class for a method, a module for a name), ``what`` is the object put there and ``how`` is one of
``provide`` (a name the owner lacks), ``replace`` (a wrapper around what is there, its ``__wrapped__``) and their
inverses ``withdraw`` / ``restore``. Everything vllm_compat puts anywhere carries one mark, ``MARK`` (the entry
id), and ``unwrap`` takes off exactly our wrappers, never anyone else's. This module imports nothing heavy.
"""

from __future__ import annotations

MARK = "_vllm_compat_installed"  # on everything vllm_compat installs: the catalogue entry id
VARIANT_MARK = "_vllm_compat_variant"  # beside it where an entry has variants: the variant installed


# ---- the install primitive: one mark, one unwrap ----

def mark(obj, entry_id: str, variant: str | None = None):
    """Mark ``obj`` as installed by ``entry_id`` (and as ``variant``); returns ``obj``."""
    setattr(obj, MARK, entry_id)
    if variant is not None:
        setattr(obj, VARIANT_MARK, variant)
    return obj


def is_ours(obj, entry_id: str | None = None) -> bool:
    """Whether ``obj`` was installed by vllm_compat (by ``entry_id``, when given)."""
    found = getattr(obj, MARK, None)
    return bool(found) and (entry_id is None or found == entry_id)


def variant_of(obj) -> str | None:
    """The variant of an object of ours, or None (not ours, or an entry without variants)."""
    return getattr(obj, VARIANT_MARK, None) if is_ours(obj) else None


def unwrap(obj, entry_id: str | None = None):
    """``obj`` without our wrappers (``entry_id``'s only, when given): follows ``__wrapped__`` while the object is
    ours and wraps something; never unwraps anyone else's wrapper."""
    while is_ours(obj, entry_id) and hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    return obj


def _name_of(owner) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or repr(owner)


def provide(owner, name: str, value, entry_id: str) -> bool:
    """Set ``owner.name = value`` (value marked with ``entry_id``) where ``owner`` lacks the name. False when ours
    is already there (a no-op); ``PatchRefusedError`` when something else is (never replace vLLM's own)."""
    current = vars(owner).get(name)
    if current is not None and is_ours(current, entry_id):
        return False
    if name in vars(owner):
        from .errors import PatchRefusedError

        raise PatchRefusedError(
            f"{_name_of(owner)}.{name} exists ({current!r}) and is not vllm_compat's stand-in; left as it is. "
            f"The installed vLLM defines it, so the stand-in is not needed.")
    setattr(owner, name, mark(value, entry_id))
    return True


def withdraw(owner, name: str, entry_id: str) -> bool:
    """Remove ``owner.name`` if it is ours (``entry_id``'s); False when nothing of ours was there."""
    if not is_ours(vars(owner).get(name), entry_id):
        return False
    delattr(owner, name)
    return True


def replace(owner, name: str, make_wrapper, entry_id: str, variant: str | None = None) -> bool:
    """Put ``make_wrapper(original)`` on ``owner.name`` (``original``: what is there, without our wrappers; the
    wrapper gets ``__wrapped__ = original`` and our mark). Another variant of ours is replaced; False when the
    same variant of ours is already there (a no-op)."""
    current = vars(owner).get(name)
    if is_ours(current, entry_id):
        if getattr(current, VARIANT_MARK, None) == variant:
            return False
        restore(owner, name, entry_id)
    original = vars(owner)[name]
    wrapper = make_wrapper(original)
    wrapper.__wrapped__ = original
    setattr(owner, name, mark(wrapper, entry_id, variant))
    return True


def restore(owner, name: str, entry_id: str) -> bool:
    """Put back the exact object our wrapper on ``owner.name`` wraps; False when the binding is not ours."""
    current = vars(owner).get(name)
    if not is_ours(current, entry_id):
        return False
    setattr(owner, name, unwrap(current, entry_id))
    return True


# ---- the base ----

class DriftPoint:
    """The defaults of the drift-point interface (this module's docstring); a drift point overrides what it needs.

    Subclasses are defined in the drift-point module itself (the row is found by the class's ``__module__``), so a
    base shared by two entries gets one small subclass in each entry's module."""

    capability_names: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()  # the VLLM_COMPAT_* variables check_controls validates
    imported_by_doctor = False
    # The behavioural drift it handles where it acts (``detect.behaviour_drift``): (kind, vLLM object, vllm-omni
    # object, name) glob patterns, matched by ``handles``; a finding none of the acting drift points handles stops
    # the verdict.
    handles_drift: tuple[tuple[str, str, str, str], ...] = ()

    def __init__(self) -> None:
        self._entry = None

    # ---- identity: the catalogue row, found without the drift-point module importing the catalogue ----

    @property
    def entry(self):
        if self._entry is None:
            from .catalogue import entry_for_module

            self._entry = entry_for_module(type(self).__module__)
        return self._entry

    id = property(lambda self: self.entry.id, doc="the catalogue id")
    target_module = property(lambda self: self.entry.target_module, doc="the module whose import triggers it")
    target = property(lambda self: self.entry.target, doc="the attribute of target_module it acts on")
    target_path = property(lambda self: self.entry.target_path, doc="target_module.target")

    def decision(self, action: str, reason: str, variant: str | None = None, provides: tuple[str, ...] = ()):
        return self.entry.decision(action, reason, variant, provides)

    def refused(self, what: str):
        """The refusal every drift point words the same way: ``what`` was found; left alone; how to silence it."""
        from .decide import Action

        return self.decision(Action.REFUSED, f"{what}; left unpatched. Set VLLM_COMPAT_DISABLE_PATCHES={self.id} "
                             "to silence this, or upgrade vllm_compat")

    def handles(self, finding) -> bool:
        """Whether this drift point, where it acts, makes the behavioural drift ``finding`` fit (``handles_drift``)."""
        return any(finding.matches(*pattern) for pattern in self.handles_drift)

    # ---- facts and the decision ----

    def detect_static(self, site):
        raise NotImplementedError(f"{type(self).__qualname__} must define detect_static(site)")

    def detect_runtime(self, module):
        raise NotImplementedError(f"{type(self).__qualname__} must define detect_runtime(module)")

    def decide(self, facts, controls):
        raise NotImplementedError(f"{type(self).__qualname__} must define decide(facts, controls)")

    def check_controls(self, controls) -> None:
        """Validate this drift point's own switches in ``controls`` (``ConfigError`` on a bad value)."""

    # ---- install ----

    def locate(self, module):
        return module

    def prepare(self, owner, facts):
        return None

    def install(self, owner, decision, state) -> bool:
        raise NotImplementedError(f"{type(self).__qualname__} must define install(owner, decision, state)")

    def uninstall(self, owner) -> bool:
        raise NotImplementedError(f"{type(self).__qualname__} must define uninstall(owner)")

    def in_place(self, owner):
        return vars(owner).get(self.target) if owner is not None else None

    def is_installed(self, owner) -> bool:
        """Whether something of this entry's is on ``owner`` now."""
        return owner is not None and is_ours(self.in_place(owner), self.id)

    # ---- reports ----

    def compare(self, static, runtime) -> list[str]:
        return [] if static == runtime else [f"{static} (files) != {runtime} (imported)"]

    def facts_dict(self, facts) -> dict:
        if hasattr(facts, "to_dict"):
            return facts.to_dict()
        from dataclasses import asdict

        return asdict(facts)

    def report_lines(self, facts) -> list[str]:
        return []

    def report_fields(self, facts) -> dict:
        return {}

    def header_note(self, facts) -> str:
        return ""

    def capabilities(self, facts) -> dict:
        return {}
