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
