"""Stand-in for the module ``vllm.v1.worker.block_table``, removed in vLLM 0.34.0.

Why: vLLM 0.34 removed the v1 model runner with its block table module (``BlockTable``, ``MultiGroupBlockTable``,
``get_block_table_width``); the one function vllm-omni uses moved, unchanged, to
``vllm.v1.kv_cache_interface.get_block_table_width``. vllm-omni 0.28.0 and 0.30.0 import the module at module level
in ``vllm_omni/diffusion/diffusion_kv/model_runner_backend.py`` (``from vllm.v1.worker import block_table as
native_block_table``), which the diffusion worker, engine and stage process import: on vLLM 0.34 the diffusion stage
dies with ``ImportError: cannot import name 'block_table' from 'vllm.v1.worker'``.

When: ``vllm.v1.worker`` is imported without a ``block_table`` submodule, an installed vllm-omni imports it (read
from its files) and vLLM's ``kv_cache_interface`` defines ``get_block_table_width(max_num_blocks, block_size, *,
token_alignment=128)`` at module level (read from the file, never imported by the hook): a module object is
registered as ``sys.modules["vllm.v1.worker.block_table"]`` and as ``vllm.v1.worker.block_table`` (marked), its
``get_block_table_width`` vLLM's own function (looked up when first read, so the stand-in imports nothing while vLLM
loads). vLLM <= 0.33 keeps its own module.

The smallest module vllm-omni's source needs: its only use is ``native_block_table.get_block_table_width(capacity,
block_size)`` (paged diffusion KV setup); ``BlockTable`` / ``MultiGroupBlockTable`` are left out (no caller in any
vllm-omni 0.24-0.30; vllm-omni uses ``vllm.v1.worker.gpu.block_table.BlockTables``, which vLLM 0.34 keeps), and
reading them raises ``AttributeError`` naming the removal. Nothing of the diffusion path is left out.

Serves: vllm-omni 0.28.0 and 0.30.0 on vLLM 0.34 (vLLM <= 0.33 keeps its own; vllm-omni 0.24.0 / 0.26.0 do not
import it).

Retire when: the oldest supported vllm-omni no longer imports ``vllm.v1.worker.block_table``.
"""

from __future__ import annotations

from ._module_stand_in import ModuleStandIn, Moved

# The vllm-omni file that imports it (0.28.0, 0.30.0): read, never imported.
IMPORTERS = ("vllm_omni/diffusion/diffusion_kv/model_runner_backend.py",)
NEW_MODULE = "vllm.v1.kv_cache_interface"
FUNCTION = "get_block_table_width"
PARAMS = "max_num_blocks, block_size, *, token_alignment"  # vLLM 0.33's and 0.34's


class BlockTableModule(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.34"
    built_on = ("vllm/v1/kv_cache_interface.py", FUNCTION, PARAMS)

    def members(self) -> dict:
        return {FUNCTION: Moved(NEW_MODULE, FUNCTION)}


DRIFT_POINT = BlockTableModule()
