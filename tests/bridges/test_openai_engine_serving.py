"""The ``openai_engine_serving`` bridge on the real wheels (the shared checks: ``serve_stand_in_cases``)."""

from __future__ import annotations

from tests.bridges.serve_stand_in_cases import cases
from vllm_compat.bridges import openai_engine_serving as bridge

globals().update(cases(bridge))
