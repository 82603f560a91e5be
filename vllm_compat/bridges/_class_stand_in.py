"""What the class-attribute stand-ins share (``scheduler_skipped_waiting``, ``omni_output_ec_transfer_params``): one
descriptor put on a vllm-omni class that lacks an attribute vLLM now reads or no longer provides.

A subclass names the class (``class_name``), the attribute (``name``) and the one descriptor object (``stand_in``:
module-level, so a revert and a second apply put back the same object). ``provide`` never replaces what the class
defines, and marks the descriptor so that ``uninstall`` removes exactly it.
"""

from __future__ import annotations

from ..drift import DriftPoint, provide, withdraw


class ClassAttributeStandIn(DriftPoint):
    class_name: str
    name: str
    stand_in: object

    def locate(self, module):
        cls = getattr(module, self.class_name, None)
        return cls if isinstance(cls, type) else None

    def in_place(self, owner):
        return vars(owner).get(self.name) if owner is not None else None

    def install(self, owner, decision, state) -> bool:
        import inspect

        # read statically: the stand-in is a descriptor, and ``self.stand_in`` would call its ``__get__`` on us
        return provide(owner, self.name, inspect.getattr_static(self, "stand_in"), self.id)

    def uninstall(self, owner) -> bool:
        return withdraw(owner, self.name, self.id)
