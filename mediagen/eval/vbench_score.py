"""VBench's normalisation and aggregation: raw dimension scores -> Quality, Semantic and Total.

Each dimension is normalised as (x - min) / (max - min) with VBench's bounds; Quality is the
weighted mean of the quality dimensions (dynamic degree weighs 0.5, the others 1: with all seven,
Σ w·x / 6.5 as VBench), Semantic the mean of the semantic ones (VBench: Σ of nine / 9), and
Total = (4 Quality + Semantic) / 5. Dimensions we cannot measure offline (aesthetic and imaging
quality; VBench's open-world semantic dimensions) are left out of the means, and the report lists
which dimensions each aggregate covers. The Moving-MNIST dimensions stand in for VBench's semantic
ones: digit_identity for object_class, digit_count for multiple_objects, motion_direction for
temporal_style; bounds 0..1, weight 1.
"""

from __future__ import annotations

from . import tables

# name -> (min, max, weight)
QUALITY_DIMS = {
    "subject_consistency": (0.1462, 1.0, 1.0),
    "background_consistency": (0.2615, 1.0, 1.0),
    "temporal_flickering": (0.6293, 1.0, 1.0),
    "motion_smoothness": (0.706, 0.9975, 1.0),
    "dynamic_degree": (0.0, 1.0, 0.5),
    "aesthetic_quality": (0.0, 1.0, 1.0),
    "imaging_quality": (0.0, 1.0, 1.0),
}
SEMANTIC_DIMS = {name: (0.0, 1.0, 1.0) for name in (
    "object_class", "multiple_objects", "human_action", "color", "spatial_relationship", "scene",
    "appearance_style", "temporal_style", "overall_consistency",
    "digit_identity", "motion_direction", "digit_count")}


def normalise(name: str, value: float) -> float:
    lo, hi, _ = {**QUALITY_DIMS, **SEMANTIC_DIMS}[name]
    return (value - lo) / (hi - lo)


def _weighted(dims: dict, raw: dict):
    present = [d for d in dims if raw.get(d) is not None]
    if not present:
        return None, []
    total_w = sum(dims[d][2] for d in present)
    return sum(dims[d][2] * normalise(d, raw[d]) for d in present) / total_w, present


def aggregate(raw: dict[str, float]) -> dict:
    """Normalised dimensions and the Quality / Semantic / Total scores of raw dimension scores."""
    unknown = sorted(set(raw) - set(QUALITY_DIMS) - set(SEMANTIC_DIMS))
    if unknown:
        raise ValueError(f"unknown VBench dimensions {unknown}; known: {sorted({**QUALITY_DIMS, **SEMANTIC_DIMS})}")
    quality, q_dims = _weighted(QUALITY_DIMS, raw)
    semantic, s_dims = _weighted(SEMANTIC_DIMS, raw)
    total = None
    if quality is not None and semantic is not None:
        total = (4 * quality + semantic) / 5
    elif quality is not None:
        total = quality
    return {"raw": dict(raw), "normalised": {d: normalise(d, v) for d, v in raw.items() if v is not None},
            "quality": quality, "semantic": semantic, "total": total,
            "quality_dims": q_dims, "semantic_dims": s_dims}


def markdown_table(report: dict) -> str:
    rows = [[d, f"{v:.4f}", f"{report['normalised'][d]:.4f}"] for d, v in report["raw"].items() if v is not None]
    rows += [[f"**{key.capitalize()}**", "", "—" if report[key] is None else f"{report[key]:.4f}"]
             for key in ("quality", "semantic", "total")]
    return tables.markdown_table(["dimension", "raw", "normalised"], rows)


def _rate(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def semantic_table(rows: list[dict]) -> str:
    """Markdown table of semantic rates: one row per set of clips (dicts with row, clips, digit,
    direction, both and optionally target / meets_target)."""
    cells = []
    for r in rows:
        target = r.get("target") or ""
        if target and r.get("meets_target") is not None:
            target += " (met)" if r["meets_target"] else " (NOT met)"
        cells.append([r["row"], r["clips"], _rate(r["digit"]), _rate(r["direction"]), _rate(r["both"]), target])
    return tables.markdown_table(["clips", "n", "digit", "direction", "both", "target"], cells)


def _size(row: dict) -> str:
    """' FxHxW' of a calibration row that records its clip size, else ''."""
    return f" {row['frames']}x{row['height']}x{row['width']}" if "frames" in row else ""


def report_tables(report: dict) -> str:
    """The dimension table (when the report scored videos) and the semantic rates of the scored videos
    beside the calibration rows (when present)."""
    parts = []
    if "raw" in report:
        parts.append(markdown_table(report))
    rows = []
    if report.get("semantic_rates"):
        rates = report["semantic_rates"]
        rows.append({"row": "these videos", **rates})
        if rates.get("per_digit"):  # two-digit prompts: each asked digit on its own (no "both" per digit)
            rows.append({"row": "these videos, each asked digit", "clips": rates["clips"], "both": None,
                         **rates["per_digit"]})
    rows += [{**r, "row": f"calibration{_size(r)}: {r['row']}"} for r in report.get("calibration", [])]
    if rows:
        parts.append(semantic_table(rows))
    return "\n\n".join(parts)

