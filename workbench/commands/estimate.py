"""`workbench estimate PRESET`: parameters, FLOPs, memory by component, fit, time, energy, cost;
`--gpu NAME` as if on a GPU of the table, `--compare` on every common GPU (``workbench.plan.compare``)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from workbench.analysis.history import measured_in
from workbench.commands.common import add_corpus_option, add_init_from_option, add_json_option, add_set_option
from workbench.config import Preset
from workbench.config.objectives import objective_spec
from workbench.errors import WorkbenchError
from workbench.fmt import GiB, duration, human_bytes, millions
from workbench.machine.detect import Machine, detect
from workbench.machine.gpus import find_gpu
from workbench.machine.rates import Calibration
from workbench.plan import compare, report
from workbench.plan.fit import memory as est
from workbench.plan.recipe.finetune import compare_methods, method_overrides
from workbench.plan.report import EstimateReport, FinetuneFacts
from workbench.plan.run_plan import NewRun, plan_new_run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("estimate", help="memory, fit, tokens/s, time and cost of a preset on this machine",
                       description="Estimate a preset's parameters, FLOPs per token, training memory by "
                                   "component, whether it fits this machine, tokens/s, time to max_iters, "
                                   "energy and cost. Every number is an estimate unless it says measured.")
    p.add_argument("preset", nargs="?", default=None,
                   help="preset name or path to a .toml file (with --init-from, default: the one that suits this "
                        "machine)")
    add_init_from_option(p)
    add_corpus_option(p, " (default: the preset's data.corpus); NAME=PATH:WEIGHT items, repeated, a mixture: its "
                         "realized shares are shown (its sources prepared, as `train` would)")
    add_set_option(p)
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda", "mps"],
                   help="device to estimate for (default: the preset's hardware.device)")
    p.add_argument("--precision", default=None, choices=["auto", "fp32", "bf16", "fp16"],
                   help="precision (default: the preset's hardware.precision)")
    p.add_argument("--tokens-per-s", type=float, default=None,
                   help="use this throughput instead of a previous run or the calibration")
    p.add_argument("--no-calibrate", action="store_true",
                   help="skip the short matmul calibration (no torch): use the best rate measured here before, if any")
    p.add_argument("--usd-per-hour", action="append", default=[], metavar="PRICE|NAME=PRICE",
                   help="machine price in $ per hour, for the cost; with --compare (or --gpu) NAME=PRICE per GPU, "
                        "repeatable, e.g. --usd-per-hour 'H100=2.49' --usd-per-hour 4090=0.69")
    p.add_argument("--gpu", action="append", default=[], metavar="NAME",
                   help="estimate as if on this GPU from the table (`workbench hw --gpus` lists them; '4090', "
                        "'H100', 'A100 80GB', 'M4 Max 64GB'); with --compare: the GPUs to compare (repeatable)")
    p.add_argument("--compare", action="store_true",
                   help="one row per common GPU: fits or not, the micro-batch `fit` would choose, tokens/s, time to "
                        "max_iters, energy, and cost where prices are given")
    p.add_argument("--sort", choices=compare.SORT_KEYS, default="time", help="--compare rows by time or by cost")
    p.add_argument("--prices", metavar="FILE.toml", default=None,
                   help='$ per hour by GPU for --compare / --gpu: lines of "NAME" = PRICE')
    p.add_argument("--mfu", metavar="X", default=None,
                   help="with --gpu / --compare: assume this model FLOPs utilisation (0-1) instead of the measured "
                        "or scaled one (see workbench/plan/throughput.py)")
    p.add_argument("--usd-per-kwh", type=float, default=None, help="electricity price, for the cost")
    p.add_argument("--watts", type=float, default=None,
                   help="power draw while training (default: the GPU's power limit, or 65 W for a CPU)")
    add_json_option(p, "print everything as JSON")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------- the command

def _number(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise WorkbenchError(f"{flag} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise WorkbenchError(f"{flag} {text!r} must be a finite number")
    return value


def _prices(args: argparse.Namespace) -> tuple[float | None, dict[str, float]]:
    """(a bare --usd-per-hour, $/hour by GPU table name from --prices and NAME=PRICE)."""
    bare, named = None, compare.load_prices(args.prices) if args.prices else {}
    for text in args.usd_per_hour:
        if "=" in text:
            name, price = compare.parse_price(text)
            named[name] = price
        elif bare is not None:
            raise WorkbenchError(f"--usd-per-hour {text}: one price without a GPU name is enough; "
                                 "name the GPU for more (--usd-per-hour 'NAME=PRICE')")
        else:
            try:
                price = float(text)
            except ValueError:
                raise WorkbenchError(f"--usd-per-hour {text!r}: write PRICE (this machine, --gpu) or NAME=PRICE "
                                     "(a GPU of --compare), e.g. --usd-per-hour 'H100=2.49'") from None
            bare = compare.check_price(price, f"--usd-per-hour {text}")
    return bare, named


def _check_flags(args: argparse.Namespace) -> None:
    on_gpus = bool(args.gpu or args.compare)
    if args.compare:
        for flag, value in (("--device", args.device), ("--tokens-per-s", args.tokens_per_s), ("--watts", args.watts)):
            if value is not None:
                raise WorkbenchError(f"{flag} does not go with --compare (each GPU has its own); leave it out")
    elif len(args.gpu) > 1:
        raise WorkbenchError(f"{len(args.gpu)} --gpu names without --compare; give one, or add --compare")
    if args.gpu and args.device is not None:
        raise WorkbenchError("--device does not go with --gpu (the GPU decides the device); leave it out")
    if not on_gpus:
        for flag, value in (("--mfu", args.mfu), ("--prices", args.prices)):
            if value is not None:
                raise WorkbenchError(f"{flag} goes with --gpu NAME or --compare"
                                     + (" (on this machine, give --tokens-per-s)" if flag == "--mfu" else ""))
        if args.sort != "time":
            raise WorkbenchError("--sort goes with --compare")


def _preset(args: argparse.Namespace, info: dict) -> Preset:
    """The preset to estimate: with --init-from, as `workbench train` would run it from that checkpoint."""
    if args.init_from is None and args.preset is None:
        raise WorkbenchError("give a preset to estimate (`workbench presets list`), or --init-from RUN")
    return plan_new_run(NewRun(args.preset, tuple(args.overrides), tuple(args.corpus or ()),
                               init_from=args.init_from), args.runs_dir, info).preset


def mixture_report(p: Preset, steps: int | None = None) -> dict[str, Any] | None:
    """A preset's mixture of several sources: its realized shares over the run (``steps``: a time budget's, as
    estimated; the sources prepared now unless they are cached; what they say goes to stderr), else None."""
    import sys

    from workbench.data.mixture.mixture_data import MixtureData, active_sources, mixture_facts, mixture_lines
    from workbench.data.preset_data import prepare_data
    if len(active_sources(p.data)) < 2:
        return None

    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=log, objective=p.train.objective)
    assert isinstance(data, MixtureData)
    return {**mixture_facts(data, p, steps), "lines": mixture_lines(data, p, steps)}


def build_report(args: argparse.Namespace) -> EstimateReport | dict[str, Any]:
    """The estimate the flags ask for: a report (this machine, or ``--gpu NAME``), or with ``--compare`` the
    table of GPUs (``workbench.plan.compare.compare``'s)."""
    _check_flags(args)
    info = detect()
    p = _preset(args, info)
    bare, named = _prices(args)
    mfu = _number(args.mfu, "--mfu")
    if args.compare:
        if bare is not None:
            raise WorkbenchError(f"--usd-per-hour {bare:g} with --compare needs a GPU name: "
                                 f"--usd-per-hour 'NAME={bare:g}'")
        gpus = [find_gpu(g) for g in args.gpu] or None
        return compare.compare(p, gpus, precision=args.precision, mfu=mfu, prices=named,
                               usd_per_kwh=args.usd_per_kwh, sort=args.sort)
    if args.gpu:
        gpu = find_gpu(args.gpu[0])
        return compare.gpu_report(p, gpu, precision=args.precision, mfu=mfu, tokens_per_s=args.tokens_per_s,
                                  watts=args.watts, usd_per_hour=bare if bare is not None else named.get(gpu.name),
                                  usd_per_kwh=args.usd_per_kwh)
    if named:
        raise WorkbenchError("--usd-per-hour NAME=PRICE goes with --gpu NAME or --compare; "
                             "for this machine give a bare price (--usd-per-hour 0.5)")
    peak = None
    if not args.no_calibrate:
        # lazily: the probe imports torch, for a short matmul calibration
        from workbench.machine.probe import calibration_here, measured_peak
        peak = measured_peak
    nvidia = info.get("nvidia") or []
    machine = Machine.from_info(info)
    r = report.build_report(
        p, machine, device=args.device, precision=args.precision, tokens_per_s=args.tokens_per_s,
        history=measured_in(args.runs_dir), peak=peak, watts=args.watts,
        usd_per_hour=bare, usd_per_kwh=args.usd_per_kwh,
        power_limit_w=nvidia[0].get("power_limit_w") if nvidia else None)
    if peak is not None:  # the matmul rate measured now, and the best one measured here that the estimate used
        cal = calibration_here(r.settings.device, r.settings.precision)
        if cal is not None:
            r.calibration = cal.to_dict()
    r.optimizer = p.train.optimizer  # muon: Muon's momentum for the hidden matrices, AdamW's for the rest
    if p.init is not None:  # which fine-tuning method fits this machine
        m = p.model  # the source's model (plan.recipe.finetune), whatever the preset's [model] says
        r.finetune = FinetuneFacts(
            p.init, p.source,
            {k: getattr(m, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                                        "vocab_size", "seq_len")},
            compare_methods(est.what_if(p, device=args.device if args.device not in (None, "auto") else None,
                                        precision=args.precision if args.precision not in (None, "auto") else None),
                            machine))
    return r


def _pct(measured: float, estimated: float) -> str:
    return f"{(estimated - measured) / measured * 100:+.0f} %"


def print_report(r: EstimateReport) -> None:
    """`workbench estimate`'s report: the model and setup, the memory at the peak and whether it fits, the
    fine-tuning methods, an earlier run's measurement beside the estimate, and the time, energy and cost."""
    print_setup(r)
    print_memory(r)
    print_fit(r)
    if r.finetune and r.finetune.methods:
        print_methods(r.finetune)
    print_measured(r)
    print_time(r)


def print_setup(r: EstimateReport) -> None:
    """The GPU it is estimated for, the model's size and FLOPs, and how it runs (settings, batch, savers)."""
    m, pr = r.memory, r.params
    if r.on_gpu:
        g = r.on_gpu.gpu
        tf = f"{g.bf16:g} TFLOPS bf16" if g.bf16 else f"{g.fp16:g} TFLOPS fp16, no bf16"
        print(f"as if on {g.name} (GPU table: {g.memory_gib:g} GiB, {tf}, {g.fp32:g} fp32, "
              f"{g.bandwidth_gbs:g} GB/s, {g.power_w:g} W; {g.source})")
        if r.on_gpu.note:
            print(f"note: {r.on_gpu.note}")
    if (objective := objective_spec(m.objective)).preference:
        ref = "no reference" if m.reference == "none" else f"reference: {m.reference} ({m.reference_why})"
        pair = "a pair is two rows a forward; " if objective.rows_per_item == 2 else ""
        print(f"objective {m.objective}: {pair}{ref}")
    label = r.preset
    if r.finetune:  # a fine-tune: the model is its source's, in the source's own shape
        im = r.finetune.init_model
        label += (f" with {r.finetune.init['run']}'s model (dim {im['dim']}, {im['n_layers']} layers, {im['n_heads']}/"
                  f"{im['n_kv_heads']} heads of {im['head_dim']}, MLP {im['hidden_dim']}, vocab {im['vocab_size']:,})")
    print(f"{label}: {millions(pr['total'], '.2f')} parameters (embedding {millions(pr['embedding'], '.2f')}"
          + (", tied" if not pr["lm_head"] else f", lm_head {millions(pr['lm_head'], '.2f')}") + "), "
          f"{r.flops_per_token / 1e6:.4g} MFLOP per token (6N + 12·L·H·Q·T)")
    st = r.settings
    masked = " with packed conversations' mask" if st.packed else ""
    muon = "Muon + " if r.optimizer == "muon" else ""  # a fine-tune's plan has AdamW (plan/recipe/finetune.py)
    print(f"{m.device}, {m.precision}, attention {m.attention}{masked}, activation checkpointing "
          f"{'on' if m.activation_checkpointing else 'off'}, {muon}AdamW {'fused' if m.fused_adamw else 'unfused'}; "
          f"batch {m.batch_size} x seq {m.seq_len} x accum {m.grad_accum} = "
          f"{r.tokens_per_step:,} tokens/step")
    loss = f"fused, {st.loss_chunk_tokens} tokens a chunk" if st.loss_chunk_tokens else "plain"
    print(f"loss {loss}, activation checkpointing {'on' if st.activation_checkpointing else 'off'} "
          f"({st.savers_reason}); compile {st.compile_mode} ({st.compile_reason})")


def print_memory(r: EstimateReport) -> None:
    """The memory at the step's peak, part by part, and per layer by attention kernel."""
    hb, m = human_bytes, r.memory
    muon = r.optimizer == "muon"
    c = m.components
    cast = "bf16/fp16" if m.precision != "fp32" else ""
    lora = m.finetune == "lora"
    if lora:
        print(f"LoRA: {millions(m.trainable_params, '.3g')} adapter parameters trained; the other weights frozen"
              + (f" and kept in {m.precision}" if m.precision != "fp32" else ""))
    saved_as = {"8bit": "8-bit", "offload": "offloaded"}.get(m.optimizer_states)
    states = (f"optimizer states (Muon + AdamW{' ' + saved_as if saved_as else ''})" if muon else
              f"optimizer states (AdamW, {saved_as or '2 x fp32'}{', adapters' if lora else ''})")
    rows = [
        ("weights (frozen + fp32 adapters)" if lora else "weights (fp32)", c["weights"], ""),
        ("gradients (fp32" + (", adapters)" if lora else ")"), c["gradients"],
         "" if c["gradients"] else f"{hb(4 * m.trainable_params)} allocated after this point (grad_accum 1)"),
        (states, c["optimizer"],
         f"+ {hb(m.host_offload)} pinned in host memory (weights, gradients, moments)" if m.host_offload else ""),
        (f"weight casts ({cast or 'none in fp32'})", c["weight_casts"], ""),
        ("activations", c["activations"],
         "compiled: less saved, the rest recomputed" if m.whole_compiled
         else f"{m.per_layer['saved'] / 2**20:.1f} MiB/layer saved"),
        ("logits + their gradient" if m.whole_compiled else "logits + fp32 log-softmax", c["logits"], ""),
        ("optimizer temporaries", c["optimizer_temp"], ""),
    ]
    if c.get("workspace"):
        rows.append(("cuBLAS workspaces", c["workspace"], ""))
    if objective_spec(m.objective).preference:
        rows.append((f"reference ({m.reference})", c.get("reference", 0), m.reference_why))
    print(f"\nmemory at the peak ({m.peak_phase}), estimate:")
    for name, v, note in rows:
        print(f"  {name:<38} {hb(v):>11}" + (f"   {note}" if note else ""))
    print(f"  {'= peak allocated (tensors)':<38} {hb(m.peak_allocated):>11}")
    print(f"  {'allocator fragmentation (~12 %)':<38} {hb(m.fragmentation):>11}")
    fw = "CUDA context" if m.device == "cuda" else "torch runtime"
    print(f"  {fw:<38} {hb(m.framework):>11}")
    print(f"  {'= total':<38} {hb(m.total):>11}")
    pl = m.per_layer
    print(f"  per layer: {hb(pl['flash'])} with SDPA flash / memory-efficient attention, {hb(pl['math'])} with "
          f"eager (math) attention, {hb(pl['checkpointed'])} with activation checkpointing")


def print_fit(r: EstimateReport) -> None:
    """Whether it fits the memory here, and what would make it fit."""
    hb, m = human_bytes, r.memory
    if r.available:
        verdict = {True: "fits", False: "does NOT fit", None: "?"}[r.fits]
        print(f"fit: {verdict}: {hb(m.total)} of {hb(r.available)} {r.available_what} "
              f"(keeping {est.HEADROOM:.0%} headroom)")
        if r.savers and len(r.savers) > 1:
            print("  to fit, by estimate (memory savers, cheapest in speed first):")
            for o in r.savers:
                print(f"    --set {' '.join(o['set'])}: {hb(o['total'])}" + (f"; {o['why']}" if o["why"] else ""))
        elif r.suggestion:
            print(f"  to fit: {r.suggestion}")
    else:
        print(f"fit: no {m.device} device here ({r.device_here}); the numbers above are for {m.device}")


def print_measured(r: EstimateReport) -> None:
    """An earlier run of the preset here: its measured memory beside the estimate."""
    hb, m = human_bytes, r.memory
    prev = r.previous_run
    if prev and (prev.get("mem_mb") or prev.get("mem_reserved_mb")):
        meas = prev["mem_mb"] * 2**20 if prev.get("mem_mb") else None
        if m.device == "cuda" and meas:
            line = (f"measured peak allocated {hb(meas)} (estimate {hb(m.peak_allocated)}, "
                    f"{_pct(meas, m.peak_allocated)})")
            if prev.get("mem_reserved_mb"):
                res = prev["mem_reserved_mb"] * 2**20
                est_res = m.peak_allocated + m.fragmentation
                line += f"; reserved {hb(res)} (estimate {hb(est_res)}, {_pct(res, est_res)})"
            print(f"run {prev['run']}: {line}")
        elif meas:
            print(f"run {prev['run']}: measured memory {hb(meas)} (process RSS at log time; "
                  f"estimated peak {hb(m.total)}, {_pct(meas, m.total)})")


def print_time(r: EstimateReport) -> None:
    """Throughput, the time to the end (or a time budget's steps), energy and cost; or why they are unknown."""
    m = r.memory
    if r.tokens_per_s:
        t, cst = r.time, r.cost
        assert t is not None and cst is not None  # a speed gives both
        print(f"throughput: {r.tokens_per_s:,.0f} tokens/s ({r.tokens_per_s_source})")
        if r.calibration:
            print(f"matmul rate: {Calibration(**r.calibration).describe()}")
        if t.budget_s:
            print(f"time budget: {duration(t.budget_s)}, ~{t.steps:,.0f} steps ({millions(t.tokens, ',.1f')} "
                  f"tokens: train {duration(t.train_s)} + eval {duration(t.eval_s)})")
            if r.budget_warning:
                print(f"warning: {r.budget_warning}")
        else:
            print(f"time to max_iters: {duration(t.total_s)} ({millions(t.tokens, ',.1f')} tokens: "
                  f"train {duration(t.train_s)} + eval {duration(t.eval_s)})")
        parts = []
        if cst.kwh is not None:
            parts.append(f"energy {cst.kwh:.3g} kWh at {cst.watts:g} W ({cst.watts_source})")
        if cst.usd is not None:
            parts.append(f"cost ${cst.usd:,.2f}")
        elif cst.kwh is not None:
            parts.append("cost: give --usd-per-hour or --usd-per-kwh")
        if parts:
            print("; ".join(parts))
    elif m.device.split(":")[0] in ("cpu", r.device_here):
        print("throughput: unknown (no previous run of this preset here, and no matmul rate measured on this "
              "machine: leave out --no-calibrate, or give --tokens-per-s)")
    else:
        print("throughput: unknown (no previous run of this preset here, and the device is not this machine's; "
              "give --tokens-per-s)")


def print_methods(f: FinetuneFacts) -> None:
    """Full / LoRA / LoRA + activation checkpointing on this machine, and the recommendation."""
    mt, hb = f.methods, human_bytes
    src = (f.source or {}).get("model") or f.init["run"]
    where = f"{hb(mt['available'])} {mt['available_what']}" if mt["available"] else f"no {mt['device']} here"
    print(f"\nfine-tuning {src} (from {f.init['run']} step {f.init['step']}) on this machine ({mt['device']}, "
          f"{where}), estimate:")
    rows = [["method", "trained", "weights", "grads + AdamW", "activations", "total", "fits", "checkpoint"]]
    for x in mt["rows"]:
        if "error" in x:
            rows.append([x["label"], "—", "—", "—", "—", "—", "—", x["error"][:40]])
            continue
        rows.append([x["label"], millions(x["trainable"], ".3g"), hb(x["weights"]), hb(x["gradients"] + x["optimizer"]),
                     hb(x["activations"]), hb(x["total"]), {True: "yes", False: "no", None: "?"}[x["fits"]],
                     hb(x["checkpoint_bytes"])])
    for line in _table(rows, right={1, 2, 3, 4, 5, 7}):
        print("  " + line)
    rec = mt["recommended"]
    if rec:
        print(f"recommended: {next(x['label'] for x in mt['rows'] if x['method'] == rec)} "
              f"(--set {' '.join(method_overrides(rec))}): {mt['why']}")
    else:
        print(f"recommended: {mt['why']}")
    print("rule of thumb (this estimator): full fine-tuning needs ~16 bytes per parameter (fp32 weights, gradients, "
          "AdamW) plus activations; LoRA ~2 (bf16) or 4 (fp32) bytes per parameter plus activations")


MFU_MARK = {"measured": "m", "measured elsewhere": "h", "scaled": "s", "given": ""}


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def print_compare(c: dict[str, Any]) -> None:
    print(f"{c['preset']}: {millions(c['params'], '.1f')} parameters, {c['max_iters']:,} steps x "
          f"{c['tokens_per_step']:,} tokens = {millions(c['tokens'], ',.1f')} tokens; sorted by {c['sort']}")
    print(f"fits: the memory estimate is at most {(1 - c['headroom']) * 100:.0f} % of the usable memory (an Apple Mac "
          "gives MPS ~2/3 of its RAM)")
    print("fit batch: batch_size x grad_accum that `workbench fit` would choose there (same tokens per step)")
    rows = [["GPU", "memory est. / usable", "fits", "fit batch", "MFU", "tokens/s", "time", "energy", "cost"]]
    for r in c["rows"]:
        mem = f"{r['estimate'] / GiB:.1f} / {r['available'] / GiB:.1f} GiB"
        batch = f"{r['batch_size']} x {r['grad_accum']}" if r["fit_batch"] else "none"
        mfu = f"{r['mfu'] * 100:.1f} % {MFU_MARK.get(r['mfu_basis'], '')}".rstrip() if r["mfu"] else "—"
        rows.append([r["gpu"], mem, "yes" if r["fits"] else "no", batch, mfu,
                     f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "—", duration(r["time_s"]),
                     f"{r['kwh']:.3g} kWh" if r["kwh"] is not None else "—",
                     f"${r['usd']:,.2f}" if r["usd"] is not None else "—"])
    print()
    for line in _table(rows, right={1, 5, 6, 7, 8}):
        print(line)
    print()
    if c["mfu_given"] is None:
        print("MFU: m measured on that GPU; h the same setup measured on the H100; s scaled from the H100 measurement "
              "compiled the same way, by model size (workbench/plan/throughput.py); give --mfu X to assume your own")
    else:
        print(f"MFU: {c['mfu_given'] * 100:.1f} % for every GPU (--mfu)")
    print("energy: at the GPU's typical board power (GPU table, `workbench hw --gpus`); time includes evaluation")
    for note in c["notes"][1 if c["mfu_given"] is None else 0:]:
        print(f"note: {note}")
    for r in c["rows"]:
        if r["note"] or r["batch_note"]:
            print(f"note: {r['gpu']}: " + "; ".join(x for x in (r["note"], r["batch_note"]) if x))


def run(args: argparse.Namespace) -> int:
    r = build_report(args)
    t = r.time if isinstance(r, EstimateReport) else None
    mix = mixture_report(_preset(args, detect()), max(1, int(t.steps)) if t is not None and t.budget_s else None)
    if isinstance(r, EstimateReport):
        r.mixture = mix
        out = r.to_dict()
    else:  # --compare's table
        out = r if mix is None else r | {"mixture": mix}
    if args.json:
        print(json.dumps(out, indent=2, default=lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o)))
    elif isinstance(r, EstimateReport):
        print_report(r)
    else:
        print_compare(out)
    if mix is not None and not args.json:
        print("\n".join(mix["lines"]))
    return 0
