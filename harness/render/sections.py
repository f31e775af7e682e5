"""The GSM8K, output-parity and MTP sections of the report, from ``accuracy/summary.json``, ``parity.json``,
``verdict.json`` and the MTP columns of ``levels.csv`` (None, or a "not measured" reason, without data)."""

from __future__ import annotations

from typing import Any, Mapping

from harness.render.metrics_table import ARMS, summarize
from harness.render.text import show
from harness.rundir import store as records
from harness.rundir.schema import MTP_COLUMNS, AccuracySummary, Level, Manifest
from harness.rundir.store import RunDir


GSM8K_REFERENCE_PCT = 94.768


GSM8K_REFERENCE = f"{GSM8K_REFERENCE_PCT} % GSM8K exact_match on GLM-5.2 NVFP4 (upstream figure)"


MTP_REFERENCE_PCT = 79.1


MTP_REFERENCE = f"{MTP_REFERENCE_PCT} % MTP acceptance rate (upstream figure)"


GSM8K_FILTERS = ("strict-match", "flexible-extract")


def _is_gpu_scenario(manifest: Manifest) -> bool:
    return manifest.scenario_value("platform") == "cuda"


def _pct(value: Any) -> float | None:
    number = records.finite_float(value)
    return None if number is None else 100.0 * number


def gsm8k_section(summary: AccuracySummary | None, gpu: bool, verdict: Any = None) -> dict[str, Any] | str | None:
    """The ``gsm8k`` section from ``accuracy/summary.json`` (see harness.run.accuracy.summarize): per arm and filter
    accuracy ± stderr in %, the paired rows, why an arm is missing, and the upstream reference on GPU scenarios.
    A skipped run gives its reason (a string: "not measured: <reason>").

    The paired row of the gated filter carries the verdict's interval (``verdict.json``'s GSM8K cell: Agresti–Min at
    the level Holm's procedure tested it); the page shows no second interval for the same comparison."""
    if summary is None:
        return None
    if summary.status == "skipped":
        return show(summary.reason or "GSM8K skipped")
    rows, notes = [], []
    for arm in ARMS:
        info = summary.arms.get(arm)
        if info is None:
            continue
        if info.status != "done" or not info.filters:
            notes.append(f"{arm}: {show(info.status)}")
            continue
        names = [f for f in GSM8K_FILTERS if f in info.filters] + [f for f in info.filters if f not in GSM8K_FILTERS]
        rows += [{"arm": arm, "filter": name, "accuracy_pct": _pct(info.filters[name].accuracy),
                  "stderr_pct": _pct(info.filters[name].stderr), "n": info.filters[name].n} for name in names]
    gated, cell = _verdict_gsm8k(verdict)
    paired = []
    for row in summary.paired:
        own = cell if row.filter == gated else {}
        paired.append({**row.model_dump(mode="json"), "ci_low_pts": own.get("ci_low_pts"),
                       "ci_high_pts": own.get("ci_high_pts"), "ci_level": own.get("ci_level")})
    first = next((info for info in summary.arms.values() if info.status == "done"), None)
    setup = ""
    if first is not None:
        setup = (f"lm-eval task {show(first.task)}, {show(first.num_fewshot)}-shot, "
                 f"{'full test set' if first.limit is None else f'first {first.limit} questions'}, data: "
                 f"{show(first.data or first.source)}")
    return {"arms": rows, "paired": paired, "notes": notes, "setup": setup,
            "reference": GSM8K_REFERENCE if gpu else None, "reference_pct": GSM8K_REFERENCE_PCT if gpu else None}


def _verdict_gsm8k(verdict: Any) -> tuple[str | None, Mapping[str, Any]]:
    """(the gated GSM8K filter, the verdict's GSM8K cell) of a ``verdict.json`` document, (None, {}) without one."""
    if not isinstance(verdict, Mapping):
        return None, {}
    fields = verdict.get("policy_fields") if isinstance(verdict.get("policy_fields"), Mapping) else {}
    cell = next((c for c in verdict.get("cells") or [] if isinstance(c, Mapping)
                 and c.get("metric") == "gsm8k_accuracy"), {})
    return fields.get("gsm8k_filter"), cell


def parity_section(result: Any) -> dict[str, Any] | None:
    """The ``parity`` section from ``parity.json`` (harness.run.parity.compare's result, already in the report's shape)."""
    return dict(result) if isinstance(result, Mapping) else None


def _pooled_mtp(frame) -> dict[str, Any]:
    """Acceptance over the repeats of one arm × level: counts summed, ratios recomputed from the sums
    (rate = Σaccepted / Σdraft tokens, length = 1 + Σaccepted / Σdrafts, per position weighted by drafts);
    without counts, the median of the stored ratios."""
    drafts = [records.finite_float(v) for v in frame["spec_drafts"]] if "spec_drafts" in frame else []
    tokens = [records.finite_float(v) for v in frame["spec_draft_tokens"]] if "spec_draft_tokens" in frame else []
    accepted = [records.finite_float(v) for v in frame["spec_accepted_tokens"]] if "spec_accepted_tokens" in frame else []
    per_pos_cells = list(frame["acceptance_per_pos"]) if "acceptance_per_pos" in frame else [None] * len(frame)
    complete = [i for i in range(len(frame))
                if drafts and tokens and accepted and None not in (drafts[i], tokens[i], accepted[i])]
    if complete and sum(drafts[i] for i in complete) > 0:
        total_drafts = sum(drafts[i] for i in complete)
        total_tokens = sum(tokens[i] for i in complete)
        total_accepted = sum(accepted[i] for i in complete)
        weighted: list[float] = []
        for i in complete:
            for pos, value in enumerate(_per_pos(per_pos_cells[i])):
                if pos == len(weighted):
                    weighted.append(0.0)
                weighted[pos] += value * drafts[i]
        return {"acceptance_rate_pct": 100.0 * total_accepted / total_tokens if total_tokens else None,
                "acceptance_length": 1.0 + total_accepted / total_drafts,
                "per_position": [100.0 * w / total_drafts for w in weighted],
                "drafts": int(total_drafts), "draft_tokens": int(total_tokens), "accepted": int(total_accepted)}
    rates = [records.finite_float(v) for v in frame["acceptance_rate"]] if "acceptance_rate" in frame else []
    lengths = [records.finite_float(v) for v in frame["acceptance_length"]] if "acceptance_length" in frame else []
    rate, length = summarize([r for r in rates if r is not None]), summarize([x for x in lengths if x is not None])
    return {"acceptance_rate_pct": None if rate.value is None else 100.0 * rate.value,
            "acceptance_length": length.value, "per_position": [],
            "drafts": int(sum(d for d in drafts if d is not None)) if drafts else None,
            "draft_tokens": None, "accepted": None}


def _per_pos(cell: Any) -> list[float]:
    """A ``levels.csv`` ``acceptance_per_pos`` cell (fractions joined by ``;``) as a list."""
    if records.finite_float(cell) is not None:
        return [float(cell)]
    if not isinstance(cell, str) or not cell.strip():
        return []
    values = [records.finite_float(part) for part in cell.split(";")]
    return [v for v in values if v is not None]


def mtp_section(levels, manifest: Manifest) -> dict[str, Any] | str | None:
    """The ``mtp`` section from the MTP columns of ``levels.csv``: one row per level × arm, and the reference on GPU
    scenarios. A run with MTP off says so; a run whose levels.csv has no acceptance yields None. The rows feed
    :func:`harness.render.plots.acceptance_plot`."""
    mtp = manifest.scenario_value("mtp")
    mtp = mtp if isinstance(mtp, Mapping) else {}
    if mtp and not mtp.get("num_speculative_tokens"):
        return "MTP is off in this run (mtp.num_speculative_tokens = 0)"
    present = [c for c in MTP_COLUMNS if c in levels.columns]
    if not len(levels) or "acceptance_rate" not in present:
        return None
    has_value = levels["acceptance_rate"].map(lambda v: records.finite_float(v) is not None)
    if "spec_drafts" in present:
        has_value |= levels["spec_drafts"].map(lambda v: records.finite_float(v) is not None)
    if not has_value.any():
        return None
    rows = []
    for level in sorted(filter(None, map(Level.parse, levels["level"].dropna().unique()))):
        for arm in ARMS:
            frame = levels[(levels["arm"] == arm) & (levels["level"] == str(level)) & has_value]
            if len(frame):
                rows.append({"concurrency": level.concurrency, "level": level.label(), "arm": arm,
                             **_pooled_mtp(frame)})
    k = mtp.get("num_speculative_tokens") if mtp else None
    gpu = _is_gpu_scenario(manifest)
    return {"rows": rows, "num_speculative_tokens": k,
            "reference": MTP_REFERENCE if gpu else None, "reference_pct": MTP_REFERENCE_PCT if gpu else None}


def load_sections(store: RunDir, manifest: Manifest, levels, verdict: Any = None) -> dict[str, Any]:
    """The GSM8K, parity and MTP sections read from the run directory (values None when it has no such data);
    ``verdict`` (the verdict section) gives the GSM8K interval."""
    gpu = _is_gpu_scenario(manifest)
    gsm8k, parity = store.accuracy_summary(), store.parity_summary()
    return {
        "gsm8k": gsm8k_section(gsm8k, gpu, verdict),
        "parity": parity_section(parity.model_dump(mode="json") if parity is not None else None),
        "mtp": mtp_section(levels, manifest),
    }
