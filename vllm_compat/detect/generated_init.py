"""The constructor a class decorator or base generates, read from the class body as a def (``__init__``) that a call
binds against like any other: the behavioural-drift scan checks a call of a vLLM dataclass against its fields as it
checks a call against a function's parameters.

What is generated, and how each is read:

* ``@dataclasses.dataclass`` (``@dataclass(kw_only=True)``, ``init=False``): the fields of the class and its
  dataclass bases (base first, a redefined field keeps its place), each an annotation of the class body, minus
  ``ClassVar`` and ``field(init=False)``; a value or ``field(default=...)`` / ``default_factory`` is a default;
  ``kw_only`` (the decorator's, ``field(kw_only=)``, after a ``_: KW_ONLY`` marker) puts a field after the
  positional ones, keyword-only; an ``__init__`` the class body defines is kept, as ``dataclass`` keeps it;
* ``@pydantic.dataclasses.dataclass`` and a decorator marked ``@dataclass_transform`` (vLLM's ``@config``): the
  same fields (``Field(...)`` with no default is required); other keywords are accepted and ignored unless the
  config forbids extras (``ConfigDict(extra="forbid")`` in the decorator call, else in the transform's own body);
* a ``msgspec.Struct``: the fields of the class and its Struct bases, the ``kw_only=True`` class keyword making
  those of its class keyword-only (after the others);
* ``typing.NamedTuple``: the class's fields, positional or keyword; ``typing.TypedDict``: anything ``dict()``
  takes (a TypedDict call checks no keys);
* a pydantic ``BaseModel`` subclass: keyword-only fields (the annotations of the model classes on its walk, private
  ``_names`` aside), required without a value or a ``Field`` default, extras accepted unless its ``extra`` setting
  (class keyword or the nearest literal ``model_config``) is ``"forbid"``; a model class on the walk that defines
  ``__init__`` makes that one the constructor.

Where the files cannot tell, the answer is ``(None, why)`` and the caller counts the call as undecidable: a base
from a third package that may add fields, a field with an alias (for a model: a required one, or any where extras
are rejected), a model validator that runs before the fields are bound (``mode="before"``, or ``"wrap"`` unless it
hands its data to the handler untouched), an extras setting that is not a literal. attrs and enums are not read.
"""

from __future__ import annotations

import ast

# Bases a generated constructor's fields never come from.
_NO_FIELDS = frozenset({"object", "abc.ABC", "typing.Generic", "typing.Protocol", "typing_extensions.Protocol",
                        "typing_extensions.Generic"})
_DATACLASS = "dataclasses.dataclass"
_PYDANTIC_DATACLASS = "pydantic.dataclasses.dataclass"
_STRUCT = "msgspec.Struct"
_NAMED_TUPLE = frozenset({"typing.NamedTuple", "typing_extensions.NamedTuple"})
_TYPED_DICT = frozenset({"typing.TypedDict", "typing_extensions.TypedDict"})
_TRANSFORM_MARK = "dataclass_transform"
_DATACLASS_LIKE = ("dataclass", "pydantic", "transform")
_BASE_MODEL = frozenset({"pydantic.BaseModel", "pydantic.main.BaseModel"})


class _Undecidable(Exception):
    """What the files cannot tell about a generated constructor (its message says what)."""


def generated_init(model, cls) -> tuple[ast.FunctionDef | None, str] | None:
    """The constructor ``cls`` (a class ``Definition`` of ``model``, a ``CodeModel``) gets from its decorator or
    base: ``(the __init__ as a def, "")``, ``(None, why)`` where the files cannot tell it, or None where nothing
    read here generates it (a plain class, a dataclass whose body defines ``__init__``, a generator this module
    does not read)."""
    generator = _generator(model, cls)
    if generator is None:
        return None
    kind, options = generator
    if kind == "typed_dict":
        return _init_def([("mapping", True)], [], var_keyword=True, lineno=cls.node.lineno), ""
    if kind == "model":
        try:
            fields, rejects_extras = _model_fields(model, cls)
        except _Undecidable as exc:
            return None, str(exc)
        return _init_def([], list(fields.items()), var_keyword=not rejects_extras, lineno=cls.node.lineno), ""
    try:
        if kind == "named_tuple":
            fields = {name: (default, False, init) for name, default, _, init in _own_fields(model, cls, kind)}
        else:
            fields = _fields(model, cls, kind)
        rejects_extras = kind in ("dataclass", "struct", "named_tuple") or _forbids_extras(cls, options)
    except _Undecidable as exc:
        return None, str(exc)
    positional = [(name, default) for name, (default, kw_only, init) in fields.items() if init and not kw_only]
    keyword_only = [(name, default) for name, (default, kw_only, init) in fields.items() if init and kw_only]
    first_default = next((i for i, (_, default) in enumerate(positional) if default), len(positional))
    if not all(default for _, default in positional[first_default:]):
        return None, "a field without a default follows one with a default (the class cannot be defined)"
    return _init_def(positional, keyword_only, var_keyword=not rejects_extras, lineno=cls.node.lineno), ""


# ---------------------------------------------------------------------------------------------- generators


def _generator(model, cls) -> tuple[str, dict] | None:
    """``generated_kind``, except for a dataclass decorator that generates no ``__init__``: a class body defining
    its own (``dataclass`` keeps it), or ``@dataclass(init=False)`` (pydantic generates one all the same)."""
    found = generated_kind(model, cls)
    if found is not None and found[0] == "model" and any(
            not isinstance(c, str) and "__init__" in model.methods(c) for c in model.mro(cls)):
        return None  # a model class on the walk defines __init__: that one is inherited, not generated
    if found is not None and found[0] in _DATACLASS_LIKE and (
            "__init__" in model.methods(cls) or (found[0] == "dataclass" and _is_false(found[1].get("init")))):
        return None
    return found


def generated_kind(model, cls) -> tuple[str, dict] | None:
    """``(kind, the decorator call's keywords)`` of what makes ``cls`` a class with generated fields: "dataclass",
    "pydantic" (a pydantic dataclass), "transform" (a ``dataclass_transform`` decorator: ``options["transform"]``
    is its def), "struct", "named_tuple" (the class deriving ``NamedTuple`` itself), "typed_dict"; None for
    none of them."""
    for decorator in cls.node.decorator_list:
        written = _dotted(decorator)
        found = model.origin(cls.module, written) if written else None
        options = {k.arg: k.value for k in decorator.keywords} if isinstance(decorator, ast.Call) else {}
        if found == _DATACLASS:
            return "dataclass", options
        if found == _PYDANTIC_DATACLASS:
            return "pydantic", options
        if _is_transform(found):
            return "transform", {**options, "transform": found}
    if any(model.origin(cls.module, _base_text(b)) in _NAMED_TUPLE for b in cls.node.bases):
        return "named_tuple", {}
    for base in model.mro(cls)[1:]:
        origin = model.origin(_module_of_base(model, cls, base), base) if isinstance(base, str) else None
        if origin == _STRUCT:
            return "struct", {}
        if origin in _TYPED_DICT:
            return "typed_dict", {}
        if origin in _BASE_MODEL:
            return "model", {}
    return None


def _module_of_base(model, cls, written: str) -> str:
    """The module whose bindings name the unresolved base ``written`` on ``cls``'s walk (the class that lists it)."""
    for candidate in model.mro(cls):
        if not isinstance(candidate, str) and any(_base_text(b) == written for b in candidate.node.bases):
            return candidate.module
    return cls.module


def _base_text(base) -> str:
    """A base as ``CodeModel.bases`` writes an unresolved one (``Generic[T]`` is ``Generic``)."""
    target = base.value if isinstance(base, ast.Subscript) else base
    return _dotted(target) or ast.unparse(base)


def _is_transform(found) -> bool:
    """Whether ``found`` is a decorator def marked ``@dataclass_transform`` (PEP 681)."""
    node = getattr(found, "node", None)
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        (_dotted(d) or "").rsplit(".", 1)[-1] == _TRANSFORM_MARK for d in node.decorator_list)


# -------------------------------------------------------------------------------------------------- fields


def _fields(model, cls, kind: str) -> dict[str, tuple[bool, bool, bool]]:
    """``{field: (has a default, keyword-only, in __init__)}`` of ``cls`` and the bases of its kind, in the
    order the generated ``__init__`` takes them (before moving keyword-only ones last)."""
    kinds = ("struct",) if kind == "struct" else _DATACLASS_LIKE
    fields: dict[str, tuple[bool, bool, bool]] = {}
    for candidate in reversed(model.mro(cls)):
        if isinstance(candidate, str):
            origin = model.origin(_module_of_base(model, cls, candidate), candidate)
            if candidate in ("object", "ABC", "Generic", "Protocol") or origin in _NO_FIELDS or origin == _STRUCT:
                continue
            raise _Undecidable(f"base {candidate} is not in either package's files (it may add fields)")
        found = generated_kind(model, candidate)
        if found is None or found[0] not in kinds:
            continue  # a base that is not a dataclass (a Struct) adds no field
        class_kw_only = _class_kw_only(model, candidate, kind)
        for name, default, kw_only, init in _own_fields(model, candidate, kind):
            fields[name] = (default, class_kw_only if kw_only is None else kw_only, init)
    return fields


def _class_kw_only(model, cls, kind: str) -> bool:
    """The class's own keyword-only setting: a Struct's ``kw_only=True`` class keyword, a dataclass decorator's."""
    if kind == "struct":
        return any(k.arg == "kw_only" and _is_true(k.value) for k in cls.node.keywords)
    found = generated_kind(model, cls)
    return found is not None and _is_true(found[1].get("kw_only"))


def _own_fields(model, cls, kind: str):
    """``(name, has a default, keyword-only or None for the class's setting, in __init__)`` for each field the
    class body annotates."""
    kw_only_marker = None
    for node in cls.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _validates_before(node):
            raise _Undecidable(f"{cls.path}.{node.name} validates the arguments before the fields are bound")
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        annotation = _annotation_head(node.annotation)
        if annotation == "ClassVar":
            continue
        if annotation == "KW_ONLY":
            kw_only_marker = True
            continue
        default, kw_only, init = node.value is not None, kw_only_marker, True
        if isinstance(node.value, ast.Call) and (_dotted(node.value.func) or "").rsplit(".", 1)[-1] in (
                "field", "Field"):
            options = {k.arg: k.value for k in node.value.keywords}
            for alias in ("alias", "validation_alias"):
                if alias in options and kind not in ("dataclass", "struct"):
                    raise _Undecidable(f"{cls.path}.{node.target.id} is bound by its alias")
            first = node.value.args[0] if node.value.args else None
            default = "default" in options or "default_factory" in options or (
                first is not None and not (isinstance(first, ast.Constant) and first.value is Ellipsis))
            init = not _is_false(options.get("init"))
            if "kw_only" in options:
                kw_only = _is_true(options["kw_only"])
        yield node.target.id, default, kw_only, init


def _model_fields(model, cls) -> tuple[dict[str, bool], bool]:
    """``({field: has a default}, rejects extra keywords)`` of a pydantic ``BaseModel`` subclass: the annotated
    names of the model classes on its walk (base first; ``ClassVar``, private ``_names`` and ``model_config`` are
    not fields), each required unless it has a value or a ``Field(...)`` default (``x: int | None`` without one is
    required, as in pydantic 2), and whether its ``extra`` setting is ``"forbid"`` (the class keyword, else the
    first ``model_config`` on the walk that sets it; pydantic's default ignores extras). A field bound by its alias
    that is required or where extras are rejected, a ``model_config`` that is not a literal, or a validator that
    may change the arguments first is undecidable."""
    walk = model.mro(cls)
    extra = None
    for candidate in walk:
        if isinstance(candidate, str):
            continue
        for keyword in candidate.node.keywords:
            if keyword.arg == "extra" and extra is None:
                extra = _constant(keyword.value, cls, "its extra setting")
        for node in candidate.node.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(
                node, "target", None)
            if extra is None and isinstance(target, ast.Name) and target.id == "model_config" and node.value:
                if not isinstance(node.value, (ast.Call, ast.Dict)):
                    raise _Undecidable(f"{candidate.path}'s model_config is not a literal")
                extra = _literal_extra(node.value)
    rejects = extra == "forbid"
    fields: dict[str, bool] = {}
    aliased: set[str] = set()
    for candidate in reversed(walk):
        if isinstance(candidate, str):
            origin = model.origin(_module_of_base(model, cls, candidate), candidate)
            if candidate in ("object", "ABC", "Generic", "Protocol") or origin in _NO_FIELDS | _BASE_MODEL:
                continue
            raise _Undecidable(f"base {candidate} is not in either package's files (it may add fields)")
        found = generated_kind(model, candidate)
        if found is None or found[0] != "model":
            continue  # a mixin that is no model adds no field
        for node in candidate.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _validates_before(node):
                raise _Undecidable(f"{candidate.path}.{node.name} validates the arguments before the fields are bound")
            if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
                continue
            name = node.target.id
            if name.startswith("_") or name == "model_config" or _annotation_head(node.annotation) == "ClassVar":
                continue
            default = node.value is not None
            for call in [node.value, *ast.walk(node.annotation)]:
                if isinstance(call, ast.Call) and (_dotted(call.func) or "").rsplit(".", 1)[-1] == "Field":
                    options = {k.arg: k.value for k in call.keywords}
                    first = call.args[0] if call.args else None
                    default = "default" in options or "default_factory" in options or (
                        first is not None and not (isinstance(first, ast.Constant) and first.value is Ellipsis))
                    if "alias" in options or "validation_alias" in options:
                        aliased.add(name)
            fields[name] = default
    for name in aliased & set(fields):
        if rejects or not fields[name]:
            raise _Undecidable(f"{cls.path}.{name} is bound by its alias")
    return fields, rejects


def _constant(node, cls, what: str):
    if not isinstance(node, ast.Constant):
        raise _Undecidable(f"{cls.path}: {what} is not a literal")
    return node.value


def _annotation_head(annotation) -> str:
    """``ClassVar`` for ``ClassVar[int]`` / ``typing.ClassVar`` / ``"ClassVar[int]"``: the last part of what the
    annotation subscripts."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        text = annotation.value
    else:
        target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
        text = _dotted(target) or ""
    return text.split("[", 1)[0].strip().rsplit(".", 1)[-1]


def _validates_before(func) -> bool:
    """A pydantic ``@model_validator(mode="before" | "wrap")`` (or a v1 ``@root_validator(pre=True)``): it may add
    or drop arguments. A wrap validator that hands its data to the handler as it came (the data parameter never
    rebound, changed or deleted, every handler call given it first) adds or drops nothing: it only looks."""
    for decorator in func.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        name = (_dotted(decorator.func) or "").rsplit(".", 1)[-1]
        options = {k.arg: k.value for k in decorator.keywords}
        mode = options.get("mode")
        if name == "root_validator" and isinstance(options.get("pre"), ast.Constant) and options["pre"].value:
            return True
        if name == "model_validator" and isinstance(mode, ast.Constant) and mode.value == "before":
            return True
        if name == "model_validator" and isinstance(mode, ast.Constant) and mode.value == "wrap":
            return not _passes_data_through(func)
    return False


def _passes_data_through(func) -> bool:
    """Whether a wrap validator ``(cls, data, handler)`` calls ``handler(data)`` with its data untouched."""
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    if params[:1] in (["cls"], ["self"]):
        params = params[1:]
    if len(params) < 2:
        return False
    data, handler = params[0], params[1]
    calls = 0
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and node.id == data and isinstance(node.ctx, (ast.Store, ast.Del)):
            return False
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and isinstance(node.value, ast.Name) and node.value.id == data:
            return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == data and node.func.attr in ("pop", "update", "setdefault", "clear",
                                                                      "popitem", "__setitem__", "__delitem__"):
            return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == handler:
            if not node.args or not (isinstance(node.args[0], ast.Name) and node.args[0].id == data):
                return False
            calls += 1
    return calls > 0


def _forbids_extras(cls, options: dict) -> bool:
    """Whether a pydantic dataclass (or a transform's) rejects keywords that name no field: its config's
    ``extra="forbid"``, from the decorator call, else from the transform's body (vLLM's ``@config`` forbids)."""
    config = options.get("config")
    if config is not None:
        extra = _literal_extra(config)
        if extra is not None:
            return extra == "forbid"
        if not (isinstance(config, ast.Call) and (_dotted(config.func) or "").endswith("ConfigDict")):
            raise _Undecidable(f"{cls.path}'s config is not a literal (extra keywords may be accepted or not)")
    transform = options.get("transform")
    if transform is not None:
        for node in ast.walk(transform.node):
            if isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith("ConfigDict"):
                extra = _literal_extra(node)
                if extra is not None:
                    return extra == "forbid"
    return False


def _literal_extra(config) -> str | None:
    """``extra`` of ``ConfigDict(extra="forbid")`` / ``dict(extra=...)`` / ``{"extra": ...}``; None where it is
    not written literally."""
    if isinstance(config, ast.Call):
        for keyword in config.keywords:
            if keyword.arg == "extra" and isinstance(keyword.value, ast.Constant):
                return keyword.value.value
    if isinstance(config, ast.Dict):
        for key, value in zip(config.keys, config.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "extra" and isinstance(value, ast.Constant):
                return value.value
    return None


# ------------------------------------------------------------------------------------------------ helpers


def _init_def(positional, keyword_only, var_keyword: bool, lineno: int) -> ast.FunctionDef:
    """``def __init__(self, <positional>, *, <keyword_only>, **extra)`` with ``...`` for each default."""
    taken = {name for name, _ in (*positional, *keyword_only)}
    extra = next(name for name in ("kwargs", "extra", "_kwargs") if name not in taken)
    args = ast.arguments(
        posonlyargs=[], args=[ast.arg("self")] + [ast.arg(name) for name, _ in positional], vararg=None,
        kwonlyargs=[ast.arg(name) for name, _ in keyword_only],
        kw_defaults=[ast.Constant(...) if default else None for _, default in keyword_only],
        kwarg=ast.arg(extra) if var_keyword else None,
        defaults=[ast.Constant(...) for _, default in positional if default])
    fields = {"name": "__init__", "args": args, "body": [ast.Pass()], "decorator_list": [], "returns": None}
    if "type_params" in ast.FunctionDef._fields:
        fields["type_params"] = []
    node = ast.FunctionDef(**fields)
    node.lineno = node.end_lineno = lineno
    node.col_offset = node.end_col_offset = 0
    return node


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_false(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is False
