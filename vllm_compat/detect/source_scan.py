"""Reading Python source text without parsing it whole: where a plugin's imports run, and what a module binds.

Speed: ``ast.parse`` of vllm-omni's ~1600 files (24 MB) takes ~15 s, so nothing here parses whole files. Candidate
lines are found with C-level regex searches, code is told from triple-quoted strings by pairing the quote
delimiters, the block context is decided by walking indentation back to the enclosing headers, and only the import
statements themselves are parsed (a regex, or ``ast`` on one statement).

Where an import runs (``plugin_imports``' context): "module" when its module is imported: at module level,
including inside module-level ``if`` / ``with`` / ``for`` blocks, the ``else`` of ``if TYPE_CHECKING``, and the
``else`` of a ``try`` (it runs after the guarded body succeeded, unguarded); "function" inside a def or class;
"type_checking" under ``if TYPE_CHECKING``; "version_gated" under an ``if`` / ``elif`` / ``else`` on the running
version (``if not vllm_version_is("0.20.2"):``, ``if Version(vllm.__version__) >= ...``: only the run decides, so a
reading never says it stops an entrypoint); "guarded" inside a ``try`` with a handler catching ``ImportError``
(or a parent: ``ModuleNotFoundError``, ``Exception``, ``BaseException``, bare ``except:``) whose body does not
``raise``, and in any ``except`` body (fallback imports). A handler that re-raises (``except ModuleNotFoundError
as exc: if exc.name != "vllm": raise``, vllm-omni's own ``__init__``) guards nothing: the import counts as
running, so a verdict never says a module imports when it may not.

What a module binds (``summarize_module``): defs, classes, assignments and imports at module level and inside
module-level blocks (not under ``if TYPE_CHECKING``), a module-level ``__getattr__`` (lazy exports) and a literal
``__all__``. Limits (heuristics, all erring towards "binds"): names bound by ``globals()[...]``, module-level
``for`` / ``with ... as`` targets, or continuation lines dedented below their statement are not seen.
"""

from __future__ import annotations

import ast
import bisect
import re
from dataclasses import dataclass, field

from .source_tree import SourceTree

_TOP_LINE = re.compile(r"\n[^\s#)\]}]")  # a column-0 statement (not a closing bracket); "\n" first: fast
_HOST_IMPORT = re.compile(r"vllm(?:_omni)?[ \t.,\n\\]")  # literal prefix: fast; line checked afterwards
_PLUGIN_IMPORTS: dict[str, re.Pattern] = {}
_RELATIVE_IMPORT = re.compile(r"from[ \t]+\.")
_IMPORT_ERRORS = re.compile(r"\b(?:ImportError|ModuleNotFoundError|Exception|BaseException)\b")
_TYPE_CHECKING_IF = re.compile(r"(?:el)?if[ \t(]+(?:typing\.)?TYPE_CHECKING[ \t)]*:")
_MODULE_GETATTR = re.compile(r"^[ \t]*def[ \t]+__getattr__[ \t]*\([ \t]*(?!self\b|cls\b)\w+", re.M)
_DEF = re.compile(r"(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)")
_ASSIGN = re.compile(r"([A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)[ \t]*(?::[^=\n]*)?=(?!=)")
_BLOCK_KEYWORDS = ("if ", "if(", "elif ", "else", "try", "except", "finally", "with ", "for ", "while ", "async ")
_RAISE = re.compile(r"^[ \t]*raise\b", re.M)
# an `if` on the running version: names "version" and a version literal or __version__ (not `if version is None:`)
_VERSION_TEST = re.compile(r"(?:el)?if\b(?=.*version)(?=.*(?:__version__|[\"']v?\d+\.\d+))", re.I)
# a module-level flag set from such a test (`_V2_SUPPORTED = not vllm_version_is("0.20.2")`), then tested by `if`
_VERSION_FLAG = re.compile(r"^([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)(?=[^\n]*version)(?=[^\n]*(?:__version__|[\"']v?\d+\.\d+))",
                           re.M | re.I)


def _string_spans(text: str) -> list[int]:
    """Flat, sorted [start0, end0, start1, end1, ...] of triple-quoted string bodies (delimiters paired in
    order; an opening one inside a comment is skipped, one inside a one-line string is rare enough to ignore). str.find, not a
    regex: 3x faster on vllm-omni."""
    spans: list[int] = []
    pos, next_double, next_single = 0, text.find('"""'), text.find("'''")
    while next_double >= 0 or next_single >= 0:
        if next_single < 0 or 0 <= next_double < next_single:
            quote, start = '"""', next_double
        else:
            quote, start = "'''", next_single
        if _in_comment(text, start):  # vLLM 0.11.0's kv_events.py: `# ... (-1, b""")` hid the rest of the file
            if quote == '"""':
                next_double = text.find(quote, start + 3)
            else:
                next_single = text.find(quote, start + 3)
            continue
        end = text.find(quote, start + 3)
        spans.append(start)
        if end < 0:
            spans.append(len(text))
            break
        pos = end + 3
        spans.append(pos)
        if 0 <= next_double < pos:
            next_double = text.find('"""', pos)
        if 0 <= next_single < pos:
            next_single = text.find("'''", pos)
    return spans


def _in_comment(text: str, pos: int) -> bool:
    """Whether ``pos`` follows a ``#`` on its line that no one-line string quote encloses."""
    line_start = text.rfind("\n", 0, pos) + 1
    hash_at = text.find("#", line_start, pos)
    return hash_at >= 0 and text.count('"', line_start, hash_at) % 2 == 0 and text.count("'", line_start,
                                                                                         hash_at) % 2 == 0


def _top_lines(text: str, spans: list[int]) -> list[int]:
    """Starts of column-0 statement lines outside strings (closing-bracket lines excluded)."""
    starts = [m.start() + 1 for m in _TOP_LINE.finditer(text)]
    if text and not text[0].isspace() and text[0] not in "#)]}":
        starts.insert(0, 0)
    return [s for s in starts if not _in_string(spans, s)] if spans else starts


def _in_string(spans: list[int], pos: int) -> bool:
    return bisect.bisect_right(spans, pos) % 2 == 1


def _line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def _line_at(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _statement(text: str, start: int) -> str:
    """The statement starting at ``start``, with parenthesized / backslash continuation lines."""
    end = start
    while True:
        nl = text.find("\n", end)
        line = text[end:] if nl < 0 else text[end:nl]
        end = len(text) if nl < 0 else nl + 1
        chunk = text[start:end]
        code = line.split("#", 1)[0].rstrip()
        if nl < 0 or (chunk.count("(") <= chunk.count(")") and not code.endswith("\\")):
            return chunk


def _previous_code_line(text: str, start: int, spans: list[int], below: int) -> int | None:
    """Start of the nearest line before ``start`` indented less than ``below`` (blank lines, comments,
    string contents and closing-bracket lines skipped); None at the top of the file."""
    pos = start
    while pos > 0:
        pos = _line_start(text, pos - 1)
        line = _line_at(text, pos)
        stripped = line.strip()
        if not stripped or stripped[0] in "#)]}" or _in_string(spans, pos):
            continue
        if _indent(line) < below:
            return pos
    return None


def _version_test(text: str) -> re.Pattern:
    """What an ``if`` header on the running version looks like in this module: ``_VERSION_TEST``, or a test of one of
    its module-level version flags."""
    flags = sorted(set(_VERSION_FLAG.findall(text)))
    if not flags:
        return _VERSION_TEST
    return re.compile(rf"{_VERSION_TEST.pattern}|(?:el)?if\b[^:]*\b(?:{'|'.join(flags)})\b", re.I)


def _else_of_version_test(text: str, else_start: int, spans: list[int], indent: int, version_test: re.Pattern) -> bool:
    """Whether the ``else:`` at ``else_start`` closes an ``if`` / ``elif`` chain that tests the running version."""
    pos = else_start
    while (pos := _previous_code_line(text, pos, spans, indent + 1)) is not None:
        line = _line_at(text, pos)
        header = line.strip()
        if _indent(line) != indent or not header.startswith(("if", "elif")):
            return False
        if version_test.match(header):
            return True
        if not header.startswith("elif"):
            return False
    return False


def _try_catches_import_errors(text: str, try_start: int, indent: int) -> bool:
    """Whether the ``try:`` at ``try_start`` has a handler that catches ImportError and does not raise."""
    pos = text.find("\n", try_start)
    while pos >= 0:
        start = pos + 1
        line = _line_at(text, start)
        pos = text.find("\n", start)
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _indent(line) > indent:
            continue
        if _indent(line) < indent or not stripped.startswith(("except", "else", "finally")):
            return False
        clause = stripped.split("#", 1)[0].strip()
        if clause.startswith("except") and (
            clause.rstrip(":").strip() == "except" or _IMPORT_ERRORS.search(clause)
        ) and not _RAISE.search(_handler_body(text, start, indent)):
            return True
    return False


def _handler_body(text: str, start: int, indent: int) -> str:
    """The text of the ``except`` clause whose line starts at ``start``: what follows its colon on that line (a
    one-line handler) and the lines below indented deeper than ``indent``."""
    body = [_line_at(text, start).partition(":")[2]]
    pos = text.find("\n", start)
    while pos >= 0:
        line = _line_at(text, pos + 1)
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and _indent(line) <= indent:
            break
        body.append(line)
        pos = text.find("\n", pos + 1)
    return "\n".join(body)


def _context(text: str, start: int, spans: list[int], top_lines: list[int], version_test: re.Pattern) -> str:
    """Where the statement at line ``start`` runs: "module" (when the module is imported), "function"
    (def/class body), "type_checking", "version_gated" or "guarded" (try/except ImportError, or an except body)."""
    indent = _indent(_line_at(text, start))
    if indent == 0:
        return "module"
    # Fast path: the enclosing column-0 statement is a def/class (most imports inside functions).
    index = bisect.bisect_left(top_lines, start) - 1
    if index >= 0:
        top = _line_at(text, top_lines[index])
        if top.startswith(("def ", "class ", "async ", "@")):
            return "function"
    context = "module"
    pos, level = start, indent
    while level > 0:
        header_start = _previous_code_line(text, pos, spans, level)
        if header_start is None:
            return context
        header_line = _line_at(text, header_start)
        header = header_line.strip()
        level = _indent(header_line)
        pos = header_start
        if header.startswith(("def ", "class ", "async def ", "@")):
            return "function"
        if _TYPE_CHECKING_IF.match(header) and not header.startswith("elif"):
            return "type_checking"
        if version_test.match(header) or (header.startswith("else") and
                                          _else_of_version_test(text, header_start, spans, level, version_test)):
            return "version_gated"
        if header.startswith("try"):
            if _try_catches_import_errors(text, header_start, level):
                context = "guarded"
        elif header.startswith("except"):
            context = "guarded"  # a fallback import: runs only when the guarded one failed
        elif header.startswith("else"):
            pass  # else of `if TYPE_CHECKING` (runtime), of a try (unguarded) or of a plain if: runs
        elif not header.startswith(_BLOCK_KEYWORDS) and not header.endswith(":"):
            return "function"  # an indented line under something that is not a block: continuation
    return context


@dataclass
class ModuleSummary:
    """What a host module binds at module level, as far as its text tells."""

    defined: set[str] = field(default_factory=set)
    import_texts: list[tuple[str, str]] = field(default_factory=list)  # (context, statement text)
    dynamic: bool = False  # module-level __getattr__
    all_names: list[str] | None = None


def summarize_module(text: str) -> ModuleSummary:
    """What a module binds at module level (defs, classes, assignments, imports as text, ``__all__``), read from
    its text without parsing it whole."""
    summary = ModuleSummary(dynamic=bool(_MODULE_GETATTR.search(text)))
    spans = _string_spans(text)
    tops = _top_lines(text, spans)
    if summary.dynamic:
        answered = _closed_getattr_names(text, tops)
        if answered is not None:  # a __getattr__ that answers a literal list of names and raises for the rest
            summary.dynamic = False
            summary.defined.update(answered)
    for start in tops:
        line = _line_at(text, start)
        kind = _record_binding(text, start, line, "module", summary)
        if line.startswith("__all__"):  # __all__ = [...], and __all__ += [...] / __all__.extend([...])
            summary.all_names = _literal_names(_statement(text, start), summary.all_names)
        elif kind is None and line.startswith(_BLOCK_KEYWORDS) and not _TYPE_CHECKING_IF.match(line):
            _summarize_block(text, start, spans, summary)
    return summary


def _closed_getattr_names(text: str, tops: list[int]) -> set[str] | None:
    """The names a module-level ``__getattr__(name)`` answers, where it answers only names listed literally and raises
    ``AttributeError`` for every other: its body is ``if`` statements testing ``name in X`` / ``name == "..."`` (``X`` a
    literal tuple, list or set, or a module-level dict / set / list literal, vLLM 0.11.1's ``vllm.utils``
    ``_DEPRECATED_MAPPINGS``), then ``raise AttributeError(...)``. None for any other shape (the answer stays
    "unknown")."""
    chunks = {}  # first word of a column-0 statement -> its text, up to the next column-0 statement
    for start, end in zip(tops, [*tops[1:], len(text)], strict=True):
        word = re.match(r"(?:def[ \t]+)?(\w+)", text[start:end])
        if word:
            chunks.setdefault(word.group(1), text[start:end])
    try:
        function = ast.parse(chunks.get("__getattr__", "")).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(function, ast.FunctionDef) or not function.args.args:
        return None
    parameter, body = function.args.args[0].arg, list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    last = body[-1] if body else None
    if not (isinstance(last, ast.Raise) and isinstance(last.exc, ast.Call) and isinstance(last.exc.func, ast.Name)
            and last.exc.func.id == "AttributeError"):
        return None

    def literal_strings(node: ast.expr) -> set[str] | None:
        if isinstance(node, ast.Name):  # a module-level literal
            try:
                node = ast.parse(chunks.get(node.id, "")).body[0].value
            except (SyntaxError, IndexError, AttributeError):
                return None
        elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)) or not all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elements):
            return None
        return {e.value for e in elements}

    def tested(test: ast.expr) -> set[str] | None:
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
            parts = [tested(value) for value in test.values]
            return None if None in parts else set().union(*parts)
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name)
                and test.left.id == parameter):
            return None
        (op,), (against,) = test.ops, test.comparators
        if isinstance(op, ast.Eq) and isinstance(against, ast.Constant) and isinstance(against.value, str):
            return {against.value}
        return literal_strings(against) if isinstance(op, ast.In) else None

    answered: set[str] = set()
    for statement in body[:-1]:
        while isinstance(statement, ast.If):
            names = tested(statement.test)
            if names is None:
                return None
            answered |= names
            if not statement.orelse:
                break
            if len(statement.orelse) != 1:
                return None
            statement = statement.orelse[0]  # an elif
        else:
            return None
    return answered or None  # one that answers nothing is left "unknown", as a lazy module's placeholder


def _record_binding(text: str, start: int, line: str, context: str, summary: ModuleSummary) -> str | None:
    """Record in ``summary`` what the statement at ``start`` (``line``, without its indentation) binds: an import's
    text (under ``context``), a def's or class's name, an assignment's targets. Returns which it was ("import",
    "def", "assign"), or None for any other statement."""
    if line.startswith(("from ", "import ")):
        summary.import_texts.append((context, _statement(text, start)))
        return "import"
    match = _DEF.match(line)
    if match:
        summary.defined.add(match.group(1))
        return "def"
    match = _ASSIGN.match(line)
    if match:
        summary.defined.update(n.strip() for n in match.group(1).split(","))
        return "assign"
    return None


def _summarize_block(text: str, header: int, spans: list[int], summary: ModuleSummary) -> None:
    """Bindings inside a module-level compound statement (liberal: any depth, def/class bodies excluded
    by their indentation only when they start inside the block)."""
    pos = text.find("\n", header)
    skip_below = None  # inside a nested def/class: skip lines indented more than its header
    while pos >= 0:
        start = pos + 1
        pos = text.find("\n", start)
        line = text[start:] if pos < 0 else text[start:pos]
        stripped = line.strip()
        if not stripped or stripped[0] == "#" or _in_string(spans, start):
            continue
        indent = _indent(line)
        if indent == 0 and not stripped.startswith(("elif", "else", "except", "finally")):
            return
        if skip_below is not None and indent > skip_below:
            continue
        skip_below = None
        if _TYPE_CHECKING_IF.match(stripped):
            skip_below = indent
            continue
        if _record_binding(text, start, stripped, "block", summary) == "def":
            skip_below = indent


def _literal_names(statement: str, current: list[str] | None) -> list[str] | None:
    try:
        node = ast.parse(statement.strip()).body[0]
    except (SyntaxError, IndexError):
        return current
    value = getattr(node, "value", None)
    if isinstance(node, ast.Expr) and isinstance(value, ast.Call) and value.args:
        value = value.args[0]  # __all__.extend([...])
    try:
        names = [n for n in ast.literal_eval(value) if isinstance(n, str)]
    except (ValueError, TypeError, SyntaxError):
        return current
    if isinstance(node, ast.Assign):
        return names
    return (current or []) + names


_SIMPLE_IMPORT = re.compile(r"(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+|import[ \t]+)([\w., \t*]+)$")


def _parse_import(statement: str) -> tuple[int, str | None, list[str]] | None:
    """``(level, module, names)`` of ``from M import a, b as c`` (names as bound in M: "a", "b"; level and
    module None-ish for ``import x.y``, where names are the dotted modules). A regex, not ast: ~20x faster."""
    code = "\n".join(line.split("#", 1)[0] for line in statement.splitlines())
    code = code.replace("\\\n", " ").replace("(", " ").replace(")", " ").replace("\n", " ").strip()
    match = _SIMPLE_IMPORT.match(code)
    if match is None:
        return None
    names = [n.split()[0] for n in match.group(3).split(",") if n.strip()]
    if code.startswith("import"):
        return -1, None, names
    return len(match.group(1)), match.group(2) or None, names


def _candidates(plugin: str) -> re.Pattern:
    """The candidate-line prefilter of ``plugin_imports``: vLLM's name, or ``plugin``'s (its absolute self-imports,
    ``from tpu_inference.runner import ...``, are edges of its import graph even where the line never says vllm)."""
    found = _PLUGIN_IMPORTS.get(plugin)
    if found is None:  # vllm_omni's own is _HOST_IMPORT: it names it already
        found = _PLUGIN_IMPORTS[plugin] = _HOST_IMPORT if _HOST_IMPORT.match(plugin + " ") else re.compile(
            r"(?:vllm(?:_omni)?|" + re.escape(plugin) + r")[ \t.,\n\\]")
    return found


def plugin_imports(tree: SourceTree, relpath: str, plugin: str):
    """Yield ``(line, level, module, names, context)`` for each import in one plugin file that names vLLM,
    the plugin itself, or a relative module (``level`` -1 for ``import x.y``, names then being modules)."""
    text = tree.read(relpath)
    if not text:
        return
    matches = list(_candidates(plugin).finditer(text)) + list(_RELATIVE_IMPORT.finditer(text))
    if not matches:
        return
    spans = top_lines = version_test = None
    seen_lines = set()
    prefixes = ("from vllm", "import vllm", "from .", f"from {plugin}", f"import {plugin}")
    for match in matches:
        start = _line_start(text, match.start())
        if start in seen_lines:
            continue
        seen_lines.add(start)
        line = _line_at(text, start)
        if not line.lstrip(" \t").startswith(prefixes):
            continue
        if spans is None:
            spans = _string_spans(text)
        if _in_string(spans, start):
            continue
        if _indent(line) == 0:
            context = "module"
        else:
            if top_lines is None:
                top_lines, version_test = _top_lines(text, spans), _version_test(text)
            context = _context(text, start, spans, top_lines, version_test)
        parsed = _parse_import(_statement(text, start))
        if parsed is None:
            continue
        lineno = text.count("\n", 0, start) + 1
        yield (lineno, *parsed, context)


_COLUMN0_IMPORT = re.compile(r"^(?:from[ \t]+([A-Za-z_]\w*)[\w.]*[ \t]+import\b|import[ \t]+([^\n#;]+))", re.M)


def unguarded_packages(text: str) -> list[tuple[int, str]]:
    """``(line, top-level package)`` for each absolute import at column 0 of a module's text: what importing the
    module needs installed, with no ``try`` / ``if`` around it (an indented import may be guarded; it is left
    out, so the list errs towards "needs less")."""
    spans = _string_spans(text)
    found = []
    for match in _COLUMN0_IMPORT.finditer(text):
        if _in_string(spans, match.start()):
            continue
        line = text.count("\n", 0, match.start()) + 1
        if match.group(1):
            found.append((line, match.group(1)))
            continue
        for part in match.group(2).replace("\\", " ").split(","):
            name = part.split()[0] if part.split() else ""
            if name and name[0] not in "(.":
                found.append((line, name.split(".")[0]))
    return found
