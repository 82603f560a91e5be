"""Stand-in for ``vllm.model_executor.layers.quantization.fp8._copy_missing_attrs``, removed in vLLM 0.27.0.

Why: vLLM <= 0.26 defines ``_copy_missing_attrs(old, new)`` in its fp8 quantization module (copy every attribute
``old`` has and ``new`` lacks onto ``new``, through ``vllm.model_executor.utils.set_weight_attrs``); vLLM 0.27
removed it (commit b5bcb3ce88, "[Refactor] Remove dead code in multiple files", as vllm-omni 0.30.0 notes).
vllm-omni 0.24.0's diffusion quant configs import it at module level (``vllm_omni/quantization/int8_config.py`` and
``mxfp8_config.py`` beside ``CopyNumelCounter``, ``mxfp4_config.py`` alone), so on vLLM 0.27-0.33 those modules die
with ``ImportError: cannot import name '_copy_missing_attrs'`` and ``quantization="int8"`` / ``"mxfp8"`` /
``"mxfp4"`` fail for diffusion models.
When: vLLM's fp8 module lacks the name and an installed vllm-omni imports it (read from vllm-omni's files), and the
installed vLLM's ``set_weight_attrs`` takes ``(weight, weight_attrs)`` (otherwise refused); a vLLM that defines it
(<= 0.26) keeps its own. Installed by the hook on the fp8 module, so it is there before a quant config imports it.
``CopyNumelCounter``, the configs' other fp8 name, is vLLM's own on 0.27 and bridged by ``moved_names`` on 0.28+.
Serves: vllm-omni 0.24.0 on vLLM 0.27-0.33 (vLLM <= 0.26 keeps its own; vllm-omni 0.30.0 imports its own copy).
Retire when: the oldest supported vllm-omni no longer imports it from vLLM (0.30.0 does not: it re-homed the same
definition as ``vllm_omni.quantization._copy_missing_attrs.copy_missing_attrs``).

The definition is vLLM 0.26's, line for line (vllm-omni 0.30.0's re-homed copy is the same function), not a
delegation: no vLLM 0.27-0.33 defines it or an equivalent anywhere (read from the wheels). It is built on the
installed vLLM's ``set_weight_attrs`` (same signature and behaviour in 0.24-0.33: asserts it never overwrites an
attribute, wraps ``weight_loader`` on platforms that sync weight loaders, then ``setattr``), looked up at each call
so a later wrapper of it is the one called. vllm-omni calls it as ``_copy_missing_attrs(layer.weight, weight)``
when its quant methods replace a layer's weight, to carry vLLM's weight attributes (``weight_loader``,
``output_dim``, ``input_dim``, ...) over to the new parameter. ``revert()`` takes it off vLLM's module; a vllm-omni
module that imported it already keeps its own reference, as with every stand-in.
"""

from __future__ import annotations

from typing import Any

from ..errors import PatchRefusedError
from ._name_stand_in import NameStandIn

NAME = "_copy_missing_attrs"  # the catalogue row's target, on vllm.model_executor.layers.quantization.fp8
# The vllm-omni files that import it (0.24.0; 0.30.0 imports its own copy): read, never imported.
IMPORTERS = ("vllm_omni/quantization/int8_config.py", "vllm_omni/quantization/mxfp8_config.py",
             "vllm_omni/quantization/mxfp4_config.py")
# What the stand-in is built on: unchanged from vLLM 0.24 to 0.33.
HELPER_MODULE, HELPER, HELPER_PARAMS = "vllm.model_executor.utils", "set_weight_attrs", ("weight", "weight_attrs")


def _copy_missing_attrs(old, new) -> None:
    """Copies any attrs present in `old` but not in `new` to `new` (vLLM 0.26's, stand-in by vllm_compat)."""
    from vllm.model_executor.utils import (
        set_weight_attrs,  # at each call: a later wrapper of it is the one called
    )

    new_attrs = set(dir(new))
    attrs_to_set: dict[str, Any] = {}
    for attr in dir(old):
        if attr not in new_attrs:
            attrs_to_set[attr] = getattr(old, attr)
    set_weight_attrs(new, attrs_to_set)


# ---- the drift point ----

class CopyMissingAttrsStandIn(NameStandIn):
    importers = IMPORTERS
    removed_in = "0.27"

    def build(self, owner):
        return _copy_missing_attrs

    def prepare(self, owner, facts):
        """The contract: the module does not define the name itself (ours may be there already), and vLLM's
        ``set_weight_attrs`` is there taking ``(weight, weight_attrs)``; ``PatchRefusedError`` saying what was found
        otherwise."""
        import importlib
        import inspect

        value = super().prepare(owner, facts)
        helper = getattr(importlib.import_module(HELPER_MODULE), HELPER, None)  # the fp8 module imported it already
        if not callable(helper):
            raise PatchRefusedError(f"{HELPER_MODULE}.{HELPER} is missing ({helper!r}); the {NAME} stand-in is built "
                                    f"on it, as vLLM 0.26's was, so it is not installed. Set VLLM_COMPAT_DISABLE_PATCHES="
                                    f"{self.id} to silence this, and report the vLLM version.")
        try:
            params = tuple(inspect.signature(helper).parameters)
        except (TypeError, ValueError):
            params = None
        if params != HELPER_PARAMS:
            raise PatchRefusedError(f"{HELPER_MODULE}.{HELPER} takes {params}, expected {HELPER_PARAMS} (vLLM "
                                    f"0.24-0.33); the {NAME} stand-in calls it as vLLM 0.26 did, so it is not "
                                    f"installed. Set VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, and "
                                    "report the vLLM version.")
        return value


DRIFT_POINT = CopyMissingAttrsStandIn()
