"""A mixture (data.mixture): a source whose own val loss rises while the mixture's falls, the others' share
crowding it out (or the source memorised, where it is repeated). From the evals' ``val_sources`` (each source's
val loss on its own held-out documents) and the start event's ``mixture`` facts."""

from __future__ import annotations

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding

# Evals with each source's loss before anything is judged: the best and a later one, and one between.
MIN_EVALS = 3
# A source's last val loss at least this far above its best: a source's loss is measured on eval_iters batches of
# that source alone, noisier than the mixture's (which auto eval_iters sizes to ~0.05 nats); twice that is a rise,
# not noise.
RISE_MIN = 0.1
# Repeated more than this many times over the run (its start facts): a rise is then likely memorising it too.
REPEATS_NOTE = 4.0


def check(ctx: Context) -> list[Finding]:
    f = ctx.facts
    evals = [e for e in f.evals if e.extra.get("val_sources") and e.val_loss is not None]
    if len(evals) < MIN_EVALS:
        return []
    last = evals[-1]
    facts = {s["name"]: s for s in ((f.start_value("mixture") or {}).get("sources") or [])}
    total = sum(float(s.get("weight", 0)) for s in facts.values()) or 1.0
    out = []
    for name, now in last.extra["val_sources"].items():
        seen = [(e, e.extra["val_sources"][name]) for e in evals[:-1] if name in e.extra["val_sources"]]
        if not seen:
            continue
        best, low = min(seen, key=lambda x: x[1])
        assert best.val_loss is not None and last.val_loss is not None  # evals with a val loss, above
        if now - low < RISE_MIN or last.val_loss >= best.val_loss:
            continue
        weight = float(facts.get(name, {}).get("weight", 0))
        evidence = [f"source {name!r}: val loss {low:.3f} at step {best.step} (its best), {now:.3f} at step "
                    f"{last.step} (+{now - low:.3f})",
                    f"the mixture's val loss {best.val_loss:.3f} -> {last.val_loss:.3f} over the same steps"]
        also = []
        if weight:
            evidence.append(f"its weight is {weight:g} ({weight / total:.0%} of the sequences)")
        repeats = float(facts.get(name, {}).get("repeats", 0))
        if repeats > REPEATS_NOTE:
            also.append(f"it is repeated {repeats:.1f} times over the run: more text for it (or a max_repeat) keeps "
                        "it from being memorised")
        also.append("a new run from the best checkpoint with other weights: `workbench train --init-from "
                    f"{f.run_id}:{best.step}` and the mixture in its preset")
        change = (f"raise the weight of {name!r} in the preset's [[data.mixture]] (e.g. {weight:g} -> "
                  f"{2 * weight:g}) or lower the others', then `workbench resume {f.run_id} --remix`" if weight else
                  f"raise the weight of {name!r} in [[data.mixture]]")
        out.append(Finding("data", "data.mixture_source_rises", "medium",
                           f"the val loss of source {name!r} rises while the mixture's falls", tuple(evidence), change,
                           step=best.step, also=tuple(also),
                           data={"source": name, "best_step": best.step, "best": low, "last": now,
                                 "mixture_best": best.val_loss, "mixture_last": last.val_loss, "weight": weight}))
    return out
