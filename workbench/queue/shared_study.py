"""A shared study read: every workbench sweep in a shared database (``--storage URL``) with its trials, as ``workbench
sweep ls/show --storage`` print them and the Queue tab shows them (read-only, through ``SharedReader``), and the
study-level facts the workers (``queue.distributed``) write and read: the sweep's spec and trial count kept as study
attributes, and the study-wide trial count. Torch-free; Optuna and SQLAlchemy are loaded when used."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from workbench.queue import sweep as local
from workbench.queue.dburl import StorageError, _why, masked, open_storage
from workbench.queue.store import trial_name
from workbench.queue.sweep_results import Result
from workbench.queue.sweep_spec import SweepSpec

__all__ = ["SPEC_ATTR", "TRIALS_ATTR", "SharedReader", "counted", "results", "shared_sweeps", "summaries"]

SPEC_ATTR = "workbench_spec"        # the sweep's spec, a study attribute (the same name with another spec: refused)
TRIALS_ATTR = "workbench_trials"    # its trial count


def _optuna() -> Any:
    optuna = local._optuna()
    # our workers record heartbeats themselves (Heartbeat, below), which is what the warning is about
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    return optuna


def _spec_of(study: Any) -> SweepSpec | None:
    d = study.user_attrs.get(SPEC_ATTR)
    return SweepSpec.from_dict(d) if d else None


def counted(study: Any) -> int:
    """The study-wide trial count: every trial but those a retry replaced."""
    trials = study.get_trials(deepcopy=False)
    replaced = {t.system_attrs["retry_history"][-1] for t in trials if t.system_attrs.get("retry_history")}
    return sum(1 for t in trials if t.number not in replaced)


# ----------------------------------------------------------------------------- results

def summaries(url: str) -> list[dict[str, Any]]:
    """Each workbench sweep in the shared database: its method, trials ended of counted, and best."""
    optuna = _optuna()
    storage = open_storage(url)
    out = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if SPEC_ATTR not in s.user_attrs:
            continue
        spec = SweepSpec.from_dict(s.user_attrs[SPEC_ATTR])
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
        best = (min if spec.metric.goal == "minimize" else max)(done, key=lambda t: t.value) if done else None
        out.append({"name": s.study_name, "method": spec.method, "counted": counted(study),
                    "ended": sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials),
                    "target": s.user_attrs.get(TRIALS_ATTR), "metric": spec.metric.name,
                    "best_run": best.user_attrs.get("run") if best else None,
                    "best": best.value if best else None, "best_params": dict(best.params) if best else None})
    return out


def results(url: str, name: str) -> tuple[SweepSpec, list[dict[str, Any]]]:
    """The sweep's trials as the shared study holds them, ranked by the metric."""
    optuna = _optuna()
    storage = open_storage(url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise StorageError(f"no sweep {name!r} in {masked(url)}") from None
    spec = _spec_of(study)
    if spec is None:
        raise StorageError(f"the study {name!r} in {masked(url)} is not a workbench sweep")
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append({"trial": t.number + 1, "run": t.user_attrs.get("run", ""), "host": t.user_attrs.get("host", ""),
                     "device": t.user_attrs.get("device", ""),
                     "params": dict(t.params), "state": t.state.name.lower(), "value": t.value,
                     "retry_of": (t.system_attrs.get("failed_trial") + 1
                                  if t.system_attrs.get("failed_trial") is not None else None),
                     "resumed_from": t.user_attrs.get("resumed_from") or None, "note": t.user_attrs.get("note", "")})
    done = sorted((r for r in rows if r["state"] == "complete" and r["value"] is not None),
                  key=lambda r: r["value"], reverse=spec.metric.goal == "maximize")
    for k, r in enumerate(done, 1):
        r["rank"] = k
    return spec, rows


# ----------------------------------------------------------------------------- the TUI's view

SHOWN_STATE = {"COMPLETE": "finished", "RUNNING": "running", "FAIL": "failed", "PRUNED": "pruned",
               "WAITING": "queued"}


def _trial_result(spec: SweepSpec, t: Any, replaced: dict[int, int], now: Any) -> Result:
    state = SHOWN_STATE.get(t.state.name, t.state.name.lower())
    a = t.user_attrs
    host, device = a.get("host", ""), a.get("device", "")
    notes = [a.get("note", "")]
    if t.number in replaced:
        notes.append(f"failed by heartbeat; retried as trial {replaced[t.number] + 1}")
    if t.system_attrs.get("failed_trial") is not None:
        notes.append(f"retry of trial {t.system_attrs['failed_trial'] + 1}"
                     + (f"; resumed {a['resumed_from']}" if a.get("resumed_from") else ""))
    start, end = t.datetime_start, t.datetime_complete
    secs = ((end or now) - start).total_seconds() if start else None
    params = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})   # a waiting trial: its point
    return Result(t.number + 1, a.get("run") or trial_name(spec.name, t.number + 1), params, state, t.value, None,
                  secs, "; ".join(n for n in notes if n),
                  where=f"{host}: {device}" if host and device else host or device)


def shared_sweeps(storage: Any) -> list[tuple[str, SweepSpec, list[Result]]]:
    """Every workbench sweep of a shared study database with its trials (ranked by the metric), each trial's
    machine and device (the Queue tab's view of it; read-only)."""
    import datetime
    optuna = _optuna()
    now = datetime.datetime.now()
    out = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if SPEC_ATTR not in s.user_attrs:
            continue
        spec = SweepSpec.from_dict(s.user_attrs[SPEC_ATTR])
        trials = storage.get_all_trials(storage.get_study_id_from_name(s.study_name), deepcopy=False)
        replaced = {t.system_attrs["retry_history"][-1]: t.number for t in trials
                    if t.system_attrs.get("retry_history")}
        rows = [_trial_result(spec, t, replaced, now) for t in trials]
        done = sorted((r for r in rows if r.state == "finished" and r.metric is not None),
                      key=lambda r: (1.0 if spec.metric.goal == "minimize" else -1.0) * (r.metric or 0.0))
        ranks = {r.number: k for k, r in enumerate(done, 1)}
        out.append((s.study_name, spec, [dataclasses.replace(r, rank=ranks.get(r.number)) for r in rows]))
    return out


class SharedReader:
    """The Queue tab's read-only view of a shared study database (``--storage``/``$WORKBENCH_STORAGE``): its
    storage kept open between reads, dropped after a failure and opened again at the next read, so the tab
    recovers when the database comes back. Every failure is one StorageError line, the URL masked."""

    def __init__(self, url: str):
        self.url = url
        self.storage: Any = None

    def read(self) -> list[tuple[str, SweepSpec, list[Result]]]:
        import sqlalchemy.exc
        try:
            if self.storage is None:
                self.storage = open_storage(self.url, readonly=True)
            return shared_sweeps(self.storage)
        except StorageError:
            self.close()
            raise
        except (sqlalchemy.exc.SQLAlchemyError, ValueError, KeyError, _optuna().exceptions.StorageInternalError) as e:
            self.close()   # (Optuna wraps a connection lost while it reads in its own error: the driver's is its cause)
            raise StorageError(_why(e.__cause__ or e, self.url)) from None

    def close(self) -> None:
        if self.storage is not None:
            try:
                self.storage.engine.dispose()
            except Exception:
                pass
            self.storage = None
