"""Records detection shares across drift points: a function's parameters as both detections see them (from
``ast`` in the files, from ``inspect`` in the imported module), so a drift point can hold the two equal.

What a drift point decides on (its facts) lives in the drift point itself (``vllm_compat.patches`` /
``vllm_compat.bridges``); nothing here knows a target.
"""

from __future__ import annotations

from dataclasses import dataclass


class ParamKind:
    POSITIONAL = "positional"  # positional-only or positional-or-keyword
    KEYWORD_ONLY = "keyword_only"
    VAR_POSITIONAL = "var_positional"  # *args
    VAR_KEYWORD = "var_keyword"  # **kwargs


@dataclass(frozen=True)
class Param:
    """One parameter of a function, as both detections see it (from ``ast`` or from ``inspect``)."""

    name: str
    kind: str = ParamKind.POSITIONAL
    has_default: bool = False

    def render(self) -> str:
        prefix = {ParamKind.VAR_POSITIONAL: "*", ParamKind.VAR_KEYWORD: "**"}.get(self.kind, "")
        return f"{prefix}{self.name}{'=...' if self.has_default else ''}"


def render_params(params) -> str:
    """``(model, *, strict, dtype=...)``: the signature the way Python prints it, defaults elided."""
    parts, star_written = [], False
    for param in params:
        if param.kind == ParamKind.VAR_POSITIONAL:
            star_written = True
        elif param.kind == ParamKind.KEYWORD_ONLY and not star_written:
            parts.append("*")
            star_written = True
        parts.append(param.render())
    return f"({', '.join(parts)})"


def accepts_call(params, positional: tuple[str, ...], keywords: tuple[str, ...]) -> bool:
    """Whether a function with ``params`` accepts ``f(*positional, **{k: ... for k in keywords})``: the
    positional arguments fill its leading positional parameters (or ``*args``), each keyword names a
    parameter that takes a keyword (or lands in ``**kwargs``), and every parameter left unfilled has a default."""
    leading = [p for p in params if p.kind == ParamKind.POSITIONAL]
    var_positional = any(p.kind == ParamKind.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == ParamKind.VAR_KEYWORD for p in params)
    if len(positional) > len(leading) and not var_positional:
        return False
    filled = {p.name for p in leading[: len(positional)]}
    by_keyword = {p.name for p in params[len(filled):] if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY)}
    for keyword in keywords:
        if keyword in by_keyword:
            filled.add(keyword)
        elif not var_keyword:
            return False
    return all(
        p.name in filled or p.has_default
        for p in params
        if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY)
    )


def why_call_fails(params, positional: int, keywords: tuple[str, ...]) -> str | None:
    """Why ``f(<positional> arguments, **{k: ... for k in keywords})`` does not bind to a function with
    ``params`` (as Python's ``TypeError`` would say it), or None when it binds."""
    leading = [p for p in params if p.kind == ParamKind.POSITIONAL]
    var_positional = any(p.kind == ParamKind.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == ParamKind.VAR_KEYWORD for p in params)
    if positional > len(leading) and not var_positional:
        return f"takes {len(leading)} positional argument(s), {positional} given"
    filled = {p.name for p in leading[:positional]}
    by_keyword = {p.name for p in params if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY)}
    unexpected = [k for k in keywords if k not in by_keyword and not var_keyword]
    if unexpected:
        return f"got an unexpected keyword argument {', '.join(unexpected)}"
    filled |= set(keywords)
    missing = [p for p in params if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY)
               and not p.has_default and p.name not in filled]
    if missing:
        kind = "keyword-only " if all(p.kind == ParamKind.KEYWORD_ONLY for p in missing) else ""
        return f"missing required {kind}argument(s) {', '.join(p.name for p in missing)}"
    return None


def why_override_narrows(base, override) -> list[tuple[str, str]]:
    """``[(parameter, why)]`` for each way a call that ``base``'s parameters accept fails on ``override``'s (both
    without ``self``): a parameter the base takes by keyword that the override does not, a positional slot it
    lacks, or a parameter the override requires that the base does not have. Empty when every call the base
    declares binds."""
    found = []
    over_names = {p.name for p in override if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY)}
    over_leading = [p for p in override if p.kind == ParamKind.POSITIONAL]
    over_var_positional = any(p.kind == ParamKind.VAR_POSITIONAL for p in override)
    over_var_keyword = any(p.kind == ParamKind.VAR_KEYWORD for p in override)
    base_leading = [p for p in base if p.kind == ParamKind.POSITIONAL]
    for index, param in enumerate(base_leading):
        if index >= len(over_leading) and not over_var_positional and param.name not in over_names \
                and not over_var_keyword:
            found.append((param.name, f"does not take {param.name} (positional {index + 1} of the base)"))
    for param in base:
        if param.kind == ParamKind.KEYWORD_ONLY and param.name not in over_names and not over_var_keyword:
            found.append((param.name, f"does not take the keyword {param.name}"))
    base_names = {p.name for p in base}
    for param in override:
        if param.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY) and not param.has_default \
                and param.name not in base_names:
            found.append((param.name, f"requires {param.name}, which the base does not declare"))
    return found


def why_open_call_fails(params, positional: int, keywords: tuple[str, ...], star_args: bool, star_kwargs: bool,
                        positional_only: int = 0) -> tuple[str | None, bool]:
    """For a call that also passes ``*args`` (``star_args``) and / or ``**kwargs`` (``star_kwargs``), whose contents
    the files do not tell, besides ``positional`` positionals and ``keywords``: ``(why it fails, True)`` where it
    cannot bind whatever they hold (more positionals than a function without ``*args`` takes, a keyword it does not
    take, one of its first ``positional_only`` parameters left for a keyword to fill without ``*args``, a
    keyword-only one left unfilled without ``**kwargs``); ``(None, True)`` where it binds whatever they hold (the
    function takes ``*args`` / ``**kwargs`` for what they add, and everything it requires is given); ``(None,
    False)`` where it depends on what they hold."""
    leading = [p for p in params if p.kind == ParamKind.POSITIONAL]
    var_positional = any(p.kind == ParamKind.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == ParamKind.VAR_KEYWORD for p in params)
    if positional > len(leading) and not var_positional:
        return f"takes {len(leading)} positional argument(s), {positional} given", True
    by_keyword = {p.name for i, p in enumerate(leading) if i >= positional_only} | {
        p.name for p in params if p.kind == ParamKind.KEYWORD_ONLY}
    unexpected = [k for k in keywords if k not in by_keyword and not var_keyword]
    if unexpected:
        return f"got an unexpected keyword argument {', '.join(unexpected)}", True
    filled = {p.name for p in leading[:positional]} | set(keywords)
    if not star_args:
        missing = [p for i, p in enumerate(leading) if positional <= i < positional_only and not p.has_default]
        if missing:
            return f"missing required positional-only argument(s) {', '.join(p.name for p in missing)}", True
    if not star_kwargs:
        missing = [p for p in params if p.kind == ParamKind.KEYWORD_ONLY and not p.has_default and p.name not in filled]
        if missing:
            return f"missing required keyword-only argument(s) {', '.join(p.name for p in missing)}", True
    left = [p for p in params if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY) and not p.has_default
            and p.name not in filled]
    return None, not left and (var_positional or not star_args) and (var_keyword or not star_kwargs)
