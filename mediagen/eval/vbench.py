"""VBench-style evaluation of a set of videos with their prompts: per-video scores, then
dimension means (consistency weighted per frame, as VBench), the aggregate report, and the
Moving-MNIST semantic rates (digit / direction / both) over the videos whose prompt names digits."""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from . import vbench_quality as q
from .moving_mnist import parse_prompt, score_clip, semantic_dimensions, semantic_rates
from .vbench_score import aggregate

QUALITY_MEASURED = ("subject_consistency", "background_consistency", "temporal_flickering",
                    "motion_smoothness", "dynamic_degree")
# per_digit / digit_hits / direction_hits: each asked digit's own verdict, so that a two-digit prompt's rates
# count the digits one by one too (semantic_rates' per_digit)
VERDICT_KEYS = ("digit_ok", "direction_ok", "both_ok", "read", "moved", "per_digit", "digit_hits", "direction_hits")


def score_video(video, prompt: str | None, subject_fx, background_fx, fps=None, device="cpu") -> dict:
    """Scores of one uint8 video (T, H, W, 3); consistency as (sum, frames) pairs for pooling. A prompt
    that names digits adds the semantic dimensions and the verdict (``VERDICT_KEYS``). A one-frame
    video (a still, e.g. the pipelines' prompt-mode images) gets only those: the quality dimensions
    compare frames."""
    from .fid import extract_features

    out = {}
    if len(video) > 1:
        for name, fx in (("subject_consistency", subject_fx), ("background_consistency", background_fx)):
            feats = extract_features(list(video), fx, 32, progress=False)
            out[name] = q.consistency_from_features(feats)
        out["temporal_flickering"] = q.temporal_flickering(video)
        if len(video) > 2:  # it re-creates frame 1 from frames 0 and 2: a two-frame clip has none to score
            out["motion_smoothness"] = q.motion_smoothness(video)
        out["dynamic_degree"] = float(q.dynamic_degree(video, fps))
    parsed = parse_prompt(prompt) if prompt else None
    if parsed is not None:
        verdict = score_clip(video, parsed, device)
        out.update(semantic_dimensions(video, parsed, verdict))
        out.update({key: verdict[key] for key in VERDICT_KEYS if key in verdict})
    return out


def evaluate_videos(videos, prompts, subject_fx, background_fx, fps=None, device="cpu", progress=True) -> dict:
    """Score every video (a sequence of arrays) against its prompt (or None); returns the report, with
    ``semantic_rates`` (clips, digit, direction, both) when some prompt names digits."""
    per_video = []
    for video, prompt in tqdm(list(zip(videos, prompts)), desc="vbench", disable=not progress):
        per_video.append(score_video(np.asarray(video), prompt, subject_fx, background_fx, fps, device))
    raw = {}
    for dim in ("subject_consistency", "background_consistency"):
        pairs = [s[dim] for s in per_video if dim in s]
        if pairs:
            raw[dim] = sum(p[0] for p in pairs) / sum(p[1] for p in pairs)
    for dim in ("temporal_flickering", "motion_smoothness", "dynamic_degree",
                "digit_identity", "motion_direction", "digit_count"):
        vals = [s[dim] for s in per_video if dim in s]
        if vals:
            raw[dim] = float(np.mean(vals))
    report = aggregate(raw)
    for s in per_video:
        for dim in ("subject_consistency", "background_consistency"):
            if dim in s:
                s[dim] = s[dim][0] / s[dim][1]
    verdicts = [s for s in per_video if "digit_ok" in s]
    if verdicts:
        report["semantic_rates"] = semantic_rates(verdicts)
    report["per_video"] = per_video
    return report
