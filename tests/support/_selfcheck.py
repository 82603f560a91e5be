"""Exercise every helper of ``online_quant`` against the installed vLLM.

Run from the repository root with the interpreter of the env to check:

    python -m tests.support._selfcheck

Prints what happened (meta params before/after, processing counts, exact
exception messages) instead of asserting, so one run documents an env.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

if __package__ in (None, ""):  # allow ``python tests/support/_selfcheck.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
import vllm

from tests.support import online_quant as oq

CPU = torch.device("cpu")
X = torch.randn(2, 16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)


def ungated(model: torch.nn.Module) -> None:
    """The ungated fix on a ``LoaderShaped`` loader, targeting the CPU."""
    oq.ungated_process_weights_after_loading(oq.LoaderShaped(), model, CPU)


def section(title: str) -> None:
    print(f"\n== {title}")


def loaded_model(online: bool = True, stragglers: tuple[oq.Straggler, ...] = oq.DEFAULT_STRAGGLERS):
    model = oq.build_model(online=online, stragglers=stragglers)
    checkpoint = oq.make_checkpoint(model, seed=1)
    before = len(oq.meta_param_names(model))
    oq.load_checkpoint(model, checkpoint)
    return model, checkpoint, before


def processing_summary(model: torch.nn.Module) -> str:
    rows = []
    for name, layer in oq.quant_layers(model).items():
        weight = f"{layer.weight.device.type}/{str(layer.weight.dtype).removeprefix('torch.')}"
        flag = getattr(layer, oq.PROCESSED_FLAG, False)
        rows.append(f"{name}: {weight} flag={flag} calls={getattr(layer, '_test_process_calls', 0)}")
    return "\n    ".join(rows)


def check_values(model: torch.nn.Module, checkpoint: dict[str, torch.Tensor]) -> bool:
    """Fully loaded layers hold exactly quantize_fp8(checkpoint tensor)."""
    ok = True
    skipped = {s.layer for s in model.stragglers}
    for name, layer in oq.quant_layers(model).items():
        if name in skipped:
            continue
        parent, _, child = name.rpartition(".")
        if layer.n_shards > 1:
            parts = [checkpoint[f"{parent}.{ck}.weight"] for m, ck, _ in oq.STACKED_PARAMS if m == child]
            source = torch.cat(parts)
        else:
            source = checkpoint[f"{name}.weight"]
        qweight, scale = oq.quantize_fp8(source)
        ok &= torch.equal(layer.weight.view(torch.uint8), qweight.view(torch.uint8))
        ok &= torch.equal(layer.weight_scale, scale)
    return ok


def report_call(label: str, fn: Callable[..., object], *args: object) -> BaseException | None:
    """Call ``fn(*args)`` and print whether it completed or what it raised."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the point is to print it
        print(f"  {label}: raised {type(exc).__name__}: {exc}")
        return exc
    print(f"  {label}: completed")
    return None


def check_layerwise() -> None:
    section("online model + load_checkpoint (vLLM layerwise machinery)")
    model, checkpoint, before = loaded_model()
    print(f"  meta params before load: {before}, after load: {oq.meta_param_names(model)}")
    print(f"    {processing_summary(model)}")
    print(f"  processed values == quantize_fp8(checkpoint): {check_values(model, checkpoint)}")
    print(f"  forward while stragglers on meta (output is uninitialized memory) -> {probe_error(model)}")


def probe_error(model: torch.nn.Module) -> str:
    probe = oq.probe_forward(model, X)
    if probe.error is not None:
        return f"{type(probe.error).__name__}: {probe.error}"
    return f"no error, output on {probe.output.device}"


def check_offline() -> None:
    section("offline model (no meta) + ungated fix with LoaderShaped")
    model, checkpoint, before = loaded_model(online=False, stragglers=())
    print(f"  meta params before/after load: {before}/{len(oq.meta_param_names(model))}")
    processed = sum(hasattr(m, "_test_process_calls") for m in oq.quant_layers(model).values())
    print(f"  processed after load: {processed}")
    report_call("ungated_process_weights_after_loading", ungated, model)
    print(f"    {processing_summary(model)}")
    print(
        f"  values ok: {check_values(model, checkpoint)}, forward uses fp8: "
        f"{oq.probe_forward(model, X).used_processed_weights}"
    )


def finalize_stragglers() -> torch.nn.Module:
    model, _, _ = loaded_model()
    ungated(model)
    return model


def check_ungated_online() -> None:
    section("online model + ungated fix (finalize_layerwise_processing)")
    if not oq.HAS_FINALIZE:
        print("  this vLLM has no finalize_layerwise_processing")
        return
    with oq.deterministic_fill():
        first, second = finalize_stragglers(), finalize_stragglers()
    print(f"  meta params left: {oq.meta_param_names(first)}")
    print(f"    {processing_summary(first)}")
    same = all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        for a, b in zip(first.parameters(), second.parameters(), strict=True)
    )
    print(f"  two deterministic_fill runs bit-identical: {same}")
    print(f"  forward uses fp8 everywhere: {oq.probe_forward(first, X).used_processed_weights}")
    print(f"  deterministic flags restored: {not torch.are_deterministic_algorithms_enabled()}")


def check_real_omni() -> None:
    section("vllm-omni's real DiffusersPipelineLoader._process_weights_after_loading")
    try:
        from vllm_omni.diffusion.model_loader.diffusers_loader import DiffusersPipelineLoader
    except ImportError as exc:
        print(f"  vllm-omni not importable: {exc}")
        return
    import vllm_omni

    print(f"  vllm-omni {vllm_omni.__version__}")
    method = DiffusersPipelineLoader._process_weights_after_loading
    for label, loader in (
        ("object.__new__(DiffusersPipelineLoader)", object.__new__(DiffusersPipelineLoader)),
        ("LoaderShaped()", oq.LoaderShaped()),
    ):
        model, _, _ = loaded_model()
        meta = len(oq.meta_param_names(model))
        report_call(label, method, loader, model, CPU)
        print(f"    meta params before/after: {meta}/{len(oq.meta_param_names(model))}")


def check_fsdp() -> None:
    section("FSDP2 (gloo, world size 1)")
    model, _ = oq.fsdp_model(online=False)
    weight = model.blocks[0].proj_out.weight
    local_ptr = weight.to_local().data_ptr()
    reference = oq.probe_forward(model, X).output
    weight.data = weight.data.to("cpu")
    weight.data = weight.data * 0
    probe = oq.probe_forward(model, X)
    print(
        f"  param type {type(weight).__name__}; after `.data = .to('cpu')` and `.data = .data * 0`: "
        f"local storage unchanged={weight.to_local().data_ptr() == local_ptr}, "
        f"forward unchanged={torch.equal(probe.output, reference)}"
    )

    report_call("offline, sharded, ungated", ungated, model)
    probe = oq.probe_forward(model, X)
    print(f"    forward error: {type(probe.error).__name__}: {probe.error}")
    print(f"    weight dtypes seen by apply: {sorted({str(d) for d in probe.weight_dtypes.values()})}")

    model, _ = oq.fsdp_model(online=True)
    unsharded, _, _ = loaded_model(stragglers=())
    probe = oq.probe_forward(model, X)
    print(
        f"  online (processed during load), sharded: used fp8={probe.used_processed_weights}, "
        f"equals unsharded={torch.equal(probe.output, oq.probe_forward(unsharded, X).output)}"
    )

    if oq.HAS_FINALIZE:
        model, _ = oq.fsdp_model(online=True, stragglers=oq.DEFAULT_STRAGGLERS)
        print(f"  online with stragglers, sharded: meta={oq.meta_param_names(model)}")
        report_call("ungated", ungated, model)
        print(f"    forward -> {probe_error(model)}")


def main() -> None:
    print(
        f"vllm {vllm.__version__}, torch {torch.__version__}, "
        f"initialize_online_processing={oq.HAS_ONLINE_PROCESSING}, "
        f"finalize_layerwise_processing={oq.HAS_FINALIZE}"
    )
    check_layerwise()
    check_offline()
    check_ungated_online()
    check_real_omni()
    check_fsdp()


if __name__ == "__main__":
    main()
