"""``vllm-compat check --json`` on a release pair, in-process, with chosen drift points disabled: what the tests
that read check's answer for real wheels share."""

from __future__ import annotations

import json

from vllm_compat.cli import main


def check_json(capsys, monkeypatch, vllm: str, omni: str, disabled: str = "") -> tuple[int, dict]:
    """``(exit code, check --json)`` of vLLM ``vllm`` + vllm-omni ``omni``, with ``disabled`` (ids, comma-separated)
    in VLLM_COMPAT_DISABLE_PATCHES and nothing else disabled."""
    if disabled:
        monkeypatch.setenv("VLLM_COMPAT_DISABLE_PATCHES", disabled)
    else:
        monkeypatch.delenv("VLLM_COMPAT_DISABLE_PATCHES", raising=False)
    capsys.readouterr()
    code = main(["check", "--json", f"vllm=={vllm}", f"vllm-omni=={omni}"])
    return code, json.loads(capsys.readouterr().out)
