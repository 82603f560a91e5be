"""Model builders, move recorders and comparisons shared by the loading and integrity scenarios.

Imports vLLM (through ``tests.support.online_quant``): only test modules that need vLLM import this.
"""

from __future__ import annotations

import contextlib
import importlib

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from . import _support  # noqa: F401 - puts the repository root on sys.path

oq = importlib.import_module("tests.support.online_quant")

CPU = torch.device("cpu")
# A CPU tensor always reports device "cpu", which compares unequal to "cpu:0": with params on "cpu" and
# target "cpu:0" every loader believes a device move is needed and performs it (as a no-op copy), so the
# moves can be recorded on a CPU-only machine.
CPU0 = torch.device("cpu", 0)


class MoveRecorder(TorchFunctionMode):
    """Records the device of every ``Tensor.to`` call that names one (``module.to`` goes through it too)."""

    def __init__(self):
        super().__init__()
        self.moves: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
            if device is not None:
                self.moves.append(str(device))
        return func(*args, **(kwargs or {}))


class Boom(RuntimeError):
    pass


class RaisingOfflineMethod(oq.CpuFp8OfflineMethod):
    """A quant method whose processing fails after it has looked at the (moved) weight."""

    def process_weights_after_loading(self, layer):
        self.seen_device = layer.weight.device
        self.raised = Boom(f"cannot quantize {type(layer).__name__}")
        raise self.raised


class CountingOfflineMethod(oq.CpuFp8OfflineMethod):
    """Processes nothing, counts calls: for parameterless quant modules."""

    calls = 0

    def create_weights(self, layer, *args, **kwargs):  # registers no parameter at all
        pass

    def process_weights_after_loading(self, layer):
        self.calls += 1


class ParamlessQuant(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant_method = CountingOfflineMethod()


def online_anchor() -> oq.QuantLinear:
    """A fully loaded online layer: makes ``uses_online_quant(model)`` true (the meta-safe path)."""
    layer = oq.QuantLinear(8, 8, oq.CpuFp8OnlineMethod())
    oq.load_checkpoint(layer, oq.make_checkpoint(layer, seed=5), stragglers=())
    return layer


def loaded(model: nn.Module, seed: int = 1, stragglers=None) -> nn.Module:
    oq.load_checkpoint(model, oq.make_checkpoint(model, seed=seed), stragglers=stragglers)
    return model


def snapshot(model: nn.Module) -> dict:
    """Every parameter and buffer: (kind, device, dtype, shape, bytes or None on meta, identity)."""
    out = {}
    for kind, items in (("param", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for name, tensor in items:
            data = None
            if tensor.device.type != "meta":
                data = tensor.detach().contiguous().view(-1).view(torch.uint8).clone()
            out[name] = (kind, str(tensor.device), tensor.dtype, tuple(tensor.shape), data)
    return out


def tie_groups(model: nn.Module) -> list[tuple[str, ...]]:
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return sorted(tuple(names) for names in groups.values() if len(names) > 1)


def diff_snapshots(a: dict, b: dict) -> list[str]:
    """Human-readable differences between two snapshots (empty: bit-for-bit equal)."""
    problems = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append(f"{name}: only in {'first' if name in a else 'second'}")
            continue
        (ka, da, ta, sa, xa), (kb, db, tb, sb, xb) = a[name], b[name]
        if (ka, da, ta, sa) != (kb, db, tb, sb):
            problems.append(f"{name}: {(ka, da, ta, sa)} != {(kb, db, tb, sb)}")
        elif (xa is None) != (xb is None) or (xa is not None and not torch.equal(xa, xb)):
            problems.append(f"{name}: values differ")
    return problems


@contextlib.contextmanager
def recording():
    recorder = MoveRecorder()
    with recorder:
        yield recorder
