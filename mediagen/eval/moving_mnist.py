"""Semantic scores of Moving-MNIST videos against their prompts: is the asked digit shown, does it
move the asked way.

Prompts name digits and directions in plain words, for example "the digit 7 moving left",
"digits 3 and 5 moving up", "a seven moving down", or the training captions "the digit 3 moves left
while the digit 8 moves down"; ``mediagen.data.captions.parse_prompt`` reads them. A direction word
applies to the digits named since the previous direction word (digits after the last one take the
last one). A prompt is a Moving-MNIST prompt when it names at least one digit.

The scorer (``score_clip`` / ``score_clips``) is built to survive generated clips, whose ink is
fuzzy, blocky and broken into specks, on any value range:
- Frames become grey floats in [0, 255] (uint8 as is; floats in [0, 1] or [-1, 1] are rescaled); a
  light background is inverted. Per frame the background level (the median, since a digit covers
  a small part of the frame) is subtracted and ink is what lies above max(48, 0.3 x the frame's
  brightest ink): faint haze never counts, dim generated digits still do. A frame with fewer ink
  pixels than 0.25% of its area shows no digit.
- Ink is never split into connected components, so a digit broken into specks stays one digit.
  With k digits asked, the frame's ink pixels are clustered into k groups by brightness-weighted
  k-means (k = 1: all ink); each group's centroid is then re-centred on a digit-sized window
  around it (mean shift), so stray specks far from the digit do not pull it.
- Classification: a digit-sized box around each centroid (the generator's digit side,
  7/16 of the frame), resized to 28x28, brightest pixel scaled to 255) is the MNIST layout
  the shipped classifier was trained on; every frame votes, and a digit is shown when the asked
  digit wins the vote (ties go to the larger summed probability).
- Motion: groups are linked frame to frame by the assignment that puts each nearest to where its
  track was heading (a line through its last positions), and a frame where two groups lie closer than
  half a digit (overlapping digits, one blob cut in two) places no track. A digit moves
  the asked way when the least-squares slope of its centroid along the asked axis has the asked
  sign (image y points down, so "up" is negative y), its displacement over the clip is at least
  10% of the frame along that axis, and the other axis moves less. At least half the frames must
  show ink. Direction is judged whatever the digit was read as.
- The motion must last the whole clip, inside the canvas: the clip is cut into parts of about 8
  frames (one part below 16 frames), and in every part the digit shows in at least 3/4 of the frames
  and moves at least 0.5 px per frame the asked way (the training clips move at least 1 px on every
  frame; half of that leaves room for a generated digit's jittering centroid). A digit that stops,
  starts late or is gone before the end fails. A digit cut by the canvas edge in more than an eighth
  of the frames that show it has left the canvas and fails too: cut means at least 5% of its ink on
  the outermost pixels, or a digit-sized box around its centroid sticking out of the canvas by more
  than 3 px. A digit drawn inside does neither (MNIST digits are centred by their centre of mass: the
  centroid of a digit's ink lies within 1.1 px of its box's centre in all 10,000 shipped digits).
- Digits are matched to groups by the assignment that shows the most asked digits, then moves the
  most of them as asked. Each asked digit gets its own verdict (``per_digit``: shown, moved); a clip
  passes on digit (direction) when every asked digit does.

Calibration (``calibration_rows``) scores clips whose answer is known, at the size of the clips being
scored: real clips of the data generator with their captions, the same clips frozen on their first
frame, stopped at their middle frame, or sliding out of the canvas from the middle on, uniform noise
and blank clips; and the same for two digits (real two-digit clips; frozen; the two directions swapped
in the caption; one digit drawn where two are asked; noise; blank). A usable measure passes real
clips (>= 95% digit and direction; two digits >= 90% on both), fails every moving-but-wrong clip on
direction (<= 5%), and leaves noise near chance.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

# the parser lives with the caption template (the pipelines read prompts too); its names stay importable here
from ..data.captions import COUNT_WORDS, DIRECTIONS, NUMBER_WORDS, DigitPrompt, parse_prompt  # noqa: F401

# Scorer constants; each is a rule of the measure, calibrated by ``calibration_rows``.
INK_MIN = 48.0            # ink must stand at least this far above the frame's background (of 255)
INK_FRACTION = 0.3        # ... and at least this fraction of the frame's brightest ink
MIN_INK_AREA = 0.0025     # a frame with fewer ink pixels than this fraction of its area shows no digit
MIN_TRAVEL = 0.1          # a moving digit travels at least this fraction of the frame along its axis
MIN_SEEN = 0.5            # a digit's motion is judged only when it shows in at least this fraction of frames
PART_FRAMES = 8           # the clip is cut into parts of about this many frames (at least one part) ...
PART_SEEN = 0.75          # ... the digit shows in at least this fraction of every part's frames ...
MIN_SPEED = 0.5           # ... and moves at least this many px per frame the asked way in every part
EDGE_RING = 1             # pixels from the canvas edge that count as the edge
EDGE_INK = 0.05           # a digit with at least this fraction of its ink on the edge is cut by it, and so
EDGE_SLACK = 3.0          # ... is one whose digit-sized box around its centroid sticks out by more pixels
MAX_CUT = 0.125           # a digit cut by the edge in more than this fraction of its frames has left the canvas
AXES = {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}  # (0 = x / 1 = y, sign)


def as_grey_clip(video) -> np.ndarray:
    """One clip as float32 (F, H, W) in [0, 255] with light ink on a dark background.

    Accepts (F, H, W) or (F, H, W, C) arrays or a list of (H, W) / (H, W, C) frames; uint8 (or
    other integer) values are read as 0..255, floats in [0, 1] as 0..1 and floats with negative
    values in [-1, 1] as -1..1 (the models' output ranges). Colour is averaged to grey, and a clip
    whose median is light is inverted (dark ink on a light background)."""
    v = np.stack([np.asarray(f) for f in video]) if isinstance(video, (list, tuple)) else np.asarray(video)
    integer = np.issubdtype(v.dtype, np.integer)  # before colour is averaged to float: still 0..255
    if v.ndim == 4 and v.shape[-1] in (1, 3, 4):
        v = v[..., :3].astype(np.float32).mean(axis=-1) if v.dtype != bool else v[..., 0]
    if v.ndim != 3 or min(v.shape) < 1:
        raise ValueError(f"video shape {tuple(v.shape)} is not allowed: use (frames, height, width) or "
                         "(frames, height, width, channels) with 1, 3 or 4 channels")
    if v.dtype == bool:
        g = v.astype(np.float32) * 255.0
    elif integer:
        lo, hi = int(v.min()), int(v.max())
        if lo < 0 or hi > 255:
            raise ValueError(f"video values {lo}..{hi} are not allowed for integer frames: use 0..255")
        g = v.astype(np.float32)
    else:
        g = v.astype(np.float32)
        if not np.isfinite(g).all():
            raise ValueError("video values must be finite; got NaN or inf")
        lo, hi = float(g.min()), float(g.max())
        if lo >= -1.0 - 1e-3 and hi <= 1.0 + 1e-3:
            g = (g + 1.0) * 127.5 if lo < 0 else g * 255.0
        elif lo < 0 or hi > 255.0 + 1e-3:
            raise ValueError(f"video values {lo:.3g}..{hi:.3g} are not allowed for float frames: use "
                             "[0, 1], [-1, 1] or [0, 255]")
        g = np.clip(g, 0.0, 255.0)
    if np.median(g) > 127.5:
        g = 255.0 - g
    return g


def digit_side(height: int, width: int) -> int:
    """The side of a digit's box in a frame, as the data generator draws it: 7/16 of the frame."""
    return max(4, min(height, width) * 7 // 16)


def ink_map(clip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ink (F, H, W) float32 above each frame's background, mask (F, H, W) of pixels counted as ink)."""
    flat = clip.reshape(len(clip), -1)
    ink = np.clip(clip - np.median(flat, axis=1)[:, None, None], 0.0, None)
    peak = np.percentile(ink.reshape(len(clip), -1), 99.5, axis=1)
    threshold = np.maximum(INK_MIN, INK_FRACTION * peak)
    return ink, ink >= threshold[:, None, None]


def _kmeans(points: np.ndarray, weights: np.ndarray, k: int, iters: int = 12) -> np.ndarray:
    """Labels (n,) of brightness-weighted k-means on (n, 2) points, seeded by bisection: the group with
    the largest weighted spread is split at its mean along its principal axis until there are k."""
    labels = np.zeros(len(points), np.int64)
    for new in range(1, k):
        spreads = []
        for j in range(new):
            p, w = points[labels == j], weights[labels == j]
            spreads.append(((p - np.average(p, 0, w)) ** 2 * w[:, None]).sum() if len(p) > 1 else -1.0)
        j = int(np.argmax(spreads))
        sel = np.flatnonzero(labels == j)
        p, w = points[sel], weights[sel]
        centred = p - np.average(p, 0, w)
        _, vecs = np.linalg.eigh((centred * w[:, None]).T @ centred)
        labels[sel[centred @ vecs[:, -1] > 0]] = new
    for _ in range(iters):
        centres = np.stack([np.average(points[labels == j], 0, weights[labels == j]) if (labels == j).any()
                            else points[0] for j in range(k)])
        new_labels = ((points[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
    return labels


def _recentre(points: np.ndarray, weights: np.ndarray, side: int, iters: int = 4):
    """Brightness centroid (x, y) of the points, re-centred on a digit-sized window (mean shift), so
    specks outside the digit's box do not pull it."""
    c = np.average(points, 0, weights)
    for _ in range(iters):
        inside = (np.abs(points - c) <= side / 2 + 1).all(axis=1)
        if not inside.any():
            break
        c_new = np.average(points[inside], 0, weights[inside])
        if np.allclose(c_new, c):
            break
        c = c_new
    return c


def _crop28(ink: np.ndarray, centre, side: int) -> np.ndarray:
    """A side x side box of ``ink`` (H, W) centred on ``centre`` (x, y), zero outside the frame,
    resized to 28x28 with its brightest pixel scaled to 255 (float32)."""
    import cv2

    h, w = ink.shape
    pad = np.zeros((h + 2 * side, w + 2 * side), np.float32)
    pad[side:side + h, side:side + w] = ink
    x0 = int(round(centre[0] - side / 2)) + side
    y0 = int(round(centre[1] - side / 2)) + side
    x0, y0 = min(max(x0, 0), w + side), min(max(y0, 0), h + side)
    crop = pad[y0:y0 + side, x0:x0 + side]
    if side != 28:
        crop = cv2.resize(crop, (28, 28), interpolation=cv2.INTER_AREA if side > 28 else cv2.INTER_LINEAR)
    top = crop.max()
    return crop * (255.0 / top) if top > 0 else crop


def _predicted(history: np.ndarray, t: int, recent: int = 6) -> np.ndarray:
    """Where each track of ``history`` (frames before t, k, 2; NaN where unseen) should be at frame t:
    the least-squares line through its last ``recent`` positions carried on to t (its last position
    when it has one). Linking groups to these guesses rather than to the last positions keeps two
    digits that cross each other on their own tracks."""
    k = history.shape[1]
    guess = np.full((k, 2), np.nan)
    for j in range(k):
        seen = np.flatnonzero(np.isfinite(history[:, j]).all(axis=1))[-recent:]
        if len(seen) == 1:
            guess[j] = history[seen[0], j]
        elif len(seen) > 1:
            slope, icpt = np.polyfit(seen.astype(np.float64), history[seen, j], 1)
            guess[j] = icpt + slope * t
    return guess


def digit_groups(clip: np.ndarray, k: int):
    """Per frame, k ink groups (one per asked digit): (centroids (F, k, 2) in (x, y), NaN where a frame
    shows no digit or, with k > 1, where the digits overlap; crops (F, k, 28, 28) float32), groups linked
    frame to frame by the assignment that puts each nearest to where its track was heading."""
    part = _groups(clip, k)
    return part["centroids"], part["crops"]


def _groups(clip: np.ndarray, k: int) -> dict:
    """``digit_groups`` plus ``cut`` (F, k): whether each group is cut by the canvas edge (at least
    EDGE_INK of its ink on the outermost EDGE_RING pixels, or its digit-sized box around the centroid
    out of the canvas by more than EDGE_SLACK px), False where the frame shows no digit; and ``hidden``
    (F,): frames whose k groups are one blob of overlapping digits (centroids closer than half a digit),
    where no track is placed."""
    from itertools import permutations

    frames, h, w = clip.shape
    side = digit_side(h, w)
    ink, mask = ink_map(clip)
    centroids = np.full((frames, k, 2), np.nan)
    crops = np.zeros((frames, k, 28, 28), np.float32)
    edge = np.zeros((frames, k))
    hidden = np.zeros(frames, bool)
    for t in range(frames):
        ys, xs = np.nonzero(mask[t])
        if len(xs) < max(k, MIN_INK_AREA * h * w):
            continue
        pts = np.stack([xs, ys], 1).astype(np.float64)
        wts = ink[t, ys, xs].astype(np.float64)
        labels = _kmeans(pts, wts, k) if k > 1 else np.zeros(len(pts), np.int64)
        on_edge = (np.minimum(xs, w - 1 - xs) < EDGE_RING) | (np.minimum(ys, h - 1 - ys) < EDGE_RING)
        cents, boxes, edges = [], [], []
        for j in range(k):
            sel = labels == j
            if not sel.any():
                cents.append(np.array([np.nan, np.nan]))
                boxes.append(np.zeros((28, 28), np.float32))
                edges.append(0.0)
                continue
            edges.append(float(wts[sel & on_edge].sum() / wts[sel].sum()))
            c = _recentre(pts[sel], wts[sel], side)
            if k == 1:
                only = ink[t] * mask[t]
            else:  # this group's ink only, so the other digit does not show in its box
                only = np.zeros((h, w), np.float32)
                only[ys[sel], xs[sel]] = wts[sel]
            cents.append(c)
            boxes.append(_crop28(only, c, side))
        cents = np.stack(cents)
        if k > 1 and min(np.linalg.norm(cents[a] - cents[b]) for a in range(k) for b in range(a)) < side / 2:
            # two groups this close are one blob of overlapping digits cut in two: neither half is a
            # digit, so the frame places, reads and moves no track (the digits pass each other here)
            hidden[t] = True
            continue
        order = list(range(k))
        if k > 1 and np.isfinite(centroids[:t]).any():
            guess = _predicted(centroids[:t], t)

            def cost(perm):
                d = [np.linalg.norm(cents[perm[j]] - guess[j]) for j in range(k)]
                return sum(x for x in d if np.isfinite(x))
            order = list(min(permutations(range(k)), key=cost))
        centroids[t] = cents[order]
        crops[t] = np.stack([boxes[j] for j in order])
        edge[t] = [edges[j] for j in order]
    # how far a digit-sized box around each centroid sticks out of the canvas, whose pixels span
    # [-0.5, size - 0.5]; a drawn digit's box lies inside, and its ink centroid is within 1.1 px of the centre
    with np.errstate(invalid="ignore"):
        low = -0.5 - (centroids - side / 2)
        high = centroids + side / 2 - (np.array([w, h]) - 0.5)
        out = np.max(np.concatenate([low, high], axis=2), axis=2)
    cut = (edge >= EDGE_INK) | (np.nan_to_num(out, nan=-np.inf) > EDGE_SLACK)
    return {"centroids": centroids, "crops": crops, "cut": cut, "hidden": hidden}


def clip_parts(frames: int) -> list[np.ndarray]:
    """The frame indices of the clip's parts: about PART_FRAMES frames each, at least one part."""
    return np.array_split(np.arange(frames), max(1, frames // PART_FRAMES))


def motion(centroids: np.ndarray, height: int, width: int, cut: np.ndarray | None = None,
           hidden: np.ndarray | None = None) -> dict | None:
    """Least-squares motion of one track of centroids (F, 2): total displacement (dx, dy) over the
    clip, ``parts``: the slope (vx, vy) in px per frame of each part of the clip (``clip_parts``; None
    for a part where the track shows in fewer than PART_SEEN of its frames, or 2, not counting those of
    ``hidden`` (F,), the frames where the digits overlap; a part left out where those cover half of it
    or more), and ``cut``: the
    fraction of the frames showing the track where ``cut`` (F,) says the canvas edge cuts it (0 without
    it). None when it shows in fewer than half the frames (and 2)."""
    frames = len(centroids)
    shown = np.isfinite(centroids).all(axis=1)
    seen = np.flatnonzero(shown)
    if len(seen) < max(2, MIN_SEEN * frames):
        return None
    t = seen.astype(np.float64)
    slopes = np.polyfit(t, centroids[seen], 1)[0]  # px per frame, (x, y)
    parts = []
    for part in clip_parts(frames):
        at = part[shown[part]]
        overlapped = 0 if hidden is None else int(hidden[part].sum())
        if overlapped >= len(part) / 2:
            continue  # the digits overlap here: no track can be placed, the part is not judged
        if len(at) < max(2, PART_SEEN * (len(part) - overlapped)):
            parts.append(None)
            continue
        vx, vy = np.polyfit(at.astype(np.float64), centroids[at], 1)[0]
        parts.append((float(vx), float(vy)))
    return {"dx": float(slopes[0] * (frames - 1)), "dy": float(slopes[1] * (frames - 1)), "parts": parts,
            "cut": 0.0 if cut is None else float(np.mean(cut[seen]))}


def moves_as_asked(move: dict | None, want: str, height: int, width: int) -> bool:
    """The track's displacement along the asked axis has the asked sign, covers MIN_TRAVEL of the frame,
    and beats the displacement along the other axis; in every part of the clip it moves at least
    MIN_SPEED px per frame the asked way; and it is cut by the canvas edge in at most MAX_CUT of its
    frames (the motion lasts the whole clip, inside the canvas)."""
    if move is None:
        return False
    axis, sign = AXES[want]
    along, across = (move["dx"], move["dy"]) if axis == 0 else (move["dy"], move["dx"])
    extent = width if axis == 0 else height
    if not (along * sign >= MIN_TRAVEL * extent and abs(across) < abs(along)):
        return False
    if any(part is None or part[axis] * sign < MIN_SPEED for part in move.get("parts", ())):
        return False
    return move.get("cut", 0.0) <= MAX_CUT


def direction_of(move: dict | None, height: int, width: int) -> str | None:
    """'left', 'right', 'up' or 'down' of a track's displacement, or None when it moves too little."""
    for want in AXES:
        if moves_as_asked(move, want, height, width):
            return want
    return None


def _frame_probs(crops: np.ndarray, device="cpu", batch_size: int = 1024) -> np.ndarray:
    """Classifier probabilities (N, 10) of 28x28 float crops in [0, 255]."""
    import torch

    from .digit_classifier import load_digit_classifier

    if len(crops) == 0:
        return np.zeros((0, 10), np.float32)
    model = load_digit_classifier(device)
    x = torch.from_numpy(np.ascontiguousarray(crops, dtype=np.float32) / 255.0)[:, None]
    with torch.no_grad():
        out = [model(x[i:i + batch_size].to(device)).softmax(-1).cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(out).numpy()


def _vote(probs: np.ndarray) -> tuple[int | None, list[int]]:
    """(winning digit, votes per digit) of per-frame probabilities (n, 10): the most frames' top label,
    ties broken by summed probability; None when no frame shows a digit."""
    if len(probs) == 0:
        return None, [0] * 10
    votes = np.bincount(probs.argmax(1), minlength=10)
    return int(np.lexsort((probs.sum(0), votes))[-1]), votes.tolist()


def _analyse(clip: np.ndarray, k: int) -> dict:
    """Groups of one grey clip for k digits, before classification."""
    part = _groups(clip, k)
    part["seen"] = np.isfinite(part["centroids"]).all(axis=2)  # (F, k)
    return part


def _judge(parsed: DigitPrompt, part: dict, probs: np.ndarray, height: int, width: int) -> dict:
    """The per-clip verdict from the groups of ``_analyse`` and their crops' probabilities (F, k, 10)."""
    from itertools import permutations

    k = len(parsed.digits)
    tracks = []
    for j in range(k):
        seen = part["seen"][:, j]
        label, votes = _vote(probs[seen, j])
        tracks.append({"read": label, "votes": votes,
                       "move": motion(part["centroids"][:, j], height, width, part["cut"][:, j], part["hidden"])})
    asked = list(zip(parsed.digits, parsed.directions))

    def fit(perm):
        shown = [tracks[perm[i]]["read"] == d for i, (d, _) in enumerate(asked)]
        moved = [m is None or moves_as_asked(tracks[perm[i]]["move"], m, height, width)
                 for i, (_, m) in enumerate(asked)]
        votes = sum(tracks[perm[i]]["votes"][d] for i, (d, _) in enumerate(asked))
        return sum(shown), sum(moved), votes, shown, moved

    best = max(permutations(range(k)), key=lambda p: fit(p)[:3])
    _, _, _, shown, moved = fit(best)
    with_direction = [i for i, (_, m) in enumerate(asked) if m is not None]
    digit_ok = all(shown)
    direction_ok = all(moved[i] for i in with_direction) if with_direction else None
    return {
        "digit_ok": bool(digit_ok),
        "direction_ok": None if direction_ok is None else bool(direction_ok),
        "both_ok": bool(digit_ok and direction_ok is not False),
        "digit_hits": sum(shown) / k,
        "direction_hits": (sum(moved[i] for i in with_direction) / len(with_direction)) if with_direction else None,
        "read": [tracks[best[i]]["read"] for i in range(k)],
        "moved": [direction_of(tracks[best[i]]["move"], height, width) for i in range(k)],
        "per_digit": [{"digit": d, "direction": m, "shown": bool(shown[i]),
                       "moved": None if m is None else bool(moved[i])} for i, (d, m) in enumerate(asked)],
        "frames_with_ink": int(part["seen"].any(axis=1).sum()),
    }


def _parsed(prompt) -> DigitPrompt:
    parsed = prompt if isinstance(prompt, DigitPrompt) else parse_prompt(str(prompt))
    if parsed is None:
        raise ValueError(f"prompt {prompt!r} is not allowed: a Moving-MNIST prompt names a digit, "
                         "e.g. 'the digit 3 moves left'")
    return parsed


def score_clips(videos, prompts, device="cpu") -> list[dict]:
    """Semantic verdicts of clips against their prompts, one dict per clip.

    ``videos``: an array (N, F, H, W) or (N, F, H, W, C), or a list of clips (each an array or a list
    of frames), light ink on a dark background (see ``as_grey_clip`` for value ranges). ``prompts``:
    one string (or ``DigitPrompt``) per clip. Each dict holds ``digit_ok`` (every asked digit is
    shown), ``direction_ok`` (every asked digit moves the asked way; None when the prompt asks no
    direction), ``both_ok``, the fractions ``digit_hits`` / ``direction_hits``, and what was seen:
    ``read`` (the digit each group was read as), ``moved`` (each group's direction or None) and
    ``frames_with_ink``. All frames of all clips go through the classifier in large batches."""
    videos = list(videos)
    prompts = list(prompts)
    if len(videos) != len(prompts):
        raise ValueError(f"prompts has {len(prompts)} entries for {len(videos)} videos: give one prompt per video")
    parsed = [_parsed(p) for p in prompts]
    clips = [as_grey_clip(v) for v in videos]
    parts = [_analyse(c, len(p.digits)) for c, p in zip(clips, parsed)]
    # only frames that show ink are classified: a frame without ink casts no vote
    flat = [p["crops"][p["seen"]] for p in parts]
    probs = _frame_probs(np.concatenate(flat) if flat else np.zeros((0, 28, 28), np.float32), device)
    out, at = [], 0
    for clip, p, part, crops in zip(clips, parsed, parts, flat):
        clip_probs = np.zeros(part["seen"].shape + (10,), np.float32)
        clip_probs[part["seen"]] = probs[at:at + len(crops)]
        at += len(crops)
        out.append(_judge(p, part, clip_probs, clip.shape[1], clip.shape[2]))
    return out


def score_clip(video, prompt, device="cpu") -> dict:
    """``score_clips`` of one clip (F, H, W), (F, H, W, C) or a list of frames."""
    return score_clips([video], [prompt], device)[0]


def semantic_rates(verdicts: list[dict]) -> dict:
    """Rates of a list of ``score_clips`` verdicts: digit, direction (over clips whose prompt asks one),
    both, and the number of clips; where some prompt names two digits, also ``per_digit``: the share of asked
    digits shown and of asked ways taken, each digit counted on its own."""
    n = len(verdicts)
    judged = [v["direction_ok"] for v in verdicts if v["direction_ok"] is not None]
    rates = {"clips": n,
             "digit": float(np.mean([v["digit_ok"] for v in verdicts])) if n else None,
             "direction": float(np.mean(judged)) if judged else None,
             "both": float(np.mean([v["both_ok"] for v in verdicts])) if n else None}
    if any(len(v.get("per_digit", ())) > 1 for v in verdicts):  # stills' verdicts have no per_digit
        hits = [v["direction_hits"] for v in verdicts if v["direction_hits"] is not None]
        rates["per_digit"] = {"digit": float(np.mean([v["digit_hits"] for v in verdicts])),
                              "direction": float(np.mean(hits)) if hits else None}
    return rates


def digit_count(video) -> int:
    """How many digits the clip shows: per frame, the ink pixels within two pixels of each other are
    joined (so specks of one fuzzy digit stay one) and pieces holding at least 15% of the frame's ink
    count; the median over frames that show ink (0 when none does)."""
    import cv2

    clip = as_grey_clip(video)
    ink, mask = ink_map(clip)
    h, w = clip.shape[1:]
    counts = []
    kernel = np.ones((5, 5), np.uint8)
    for t in range(len(clip)):
        if mask[t].sum() < MIN_INK_AREA * h * w:
            continue
        joined = cv2.dilate(mask[t].astype(np.uint8), kernel)
        n, labels = cv2.connectedComponents(joined, connectivity=8)
        mass = np.bincount(labels[mask[t]], weights=ink[t][mask[t]], minlength=n)[1:]
        counts.append(int((mass >= 0.15 * mass.sum()).sum()))
    return int(round(float(np.median(counts)))) if counts else 0


def motion_direction(video) -> str | None:
    """'left', 'right', 'up' or 'down' of all ink together (one group), or None when it does not move one
    way over the whole clip inside the canvas (``moves_as_asked``) or shows in too few frames."""
    clip = as_grey_clip(video)
    part = _groups(clip, 1)
    return direction_of(motion(part["centroids"][:, 0], *clip.shape[1:], part["cut"][:, 0]), *clip.shape[1:])


def semantic_dimensions(video, prompt, verdict: dict) -> dict[str, float]:
    """The VBench-style semantic dimensions in [0, 1] of a clip's ``score_clip`` verdict:
    digit_identity (fraction of asked digits shown), motion_direction (fraction moving as asked;
    only when the prompt asks a direction) and digit_count (1.0 when the clip shows as many digits
    as the prompt counts)."""
    parsed = _parsed(prompt)
    out = {"digit_identity": float(verdict["digit_hits"])}
    if verdict["direction_hits"] is not None:
        out["motion_direction"] = float(verdict["direction_hits"])
    if parsed.count is not None:
        out["digit_count"] = float(digit_count(video) == parsed.count)
    return out


def semantic_scores(video, prompt, device="cpu") -> dict[str, float]:
    """``semantic_dimensions`` of one clip against its prompt (a string or ``DigitPrompt``)."""
    parsed = _parsed(prompt)
    return semantic_dimensions(video, parsed, score_clip(video, parsed, device))


def real_clips(n_per_cell: int = 3, seed: int = 0, num_digits: int = 1, resolution: int = 64,
               num_frames: int = 16, split: str = "held_out") -> tuple[np.ndarray, list[str]]:
    """(uint8 clips (N, F, R, R), captions) from the training data generator on ``split``'s digits.

    One digit: ``n_per_cell`` clips for each of the 10 digits x 4 directions (the generator's first
    clips of ``seed`` that fall in each cell). More digits: its first 40 x ``n_per_cell`` clips."""
    from ..training.data.moving_mnist import DIRECTIONS as GENERATOR_DIRECTIONS
    from ..training.data.moving_mnist import MovingMNISTDataset, clip_caption

    if n_per_cell < 1:
        raise ValueError(f"n_per_cell={n_per_cell} is not allowed: use 1 or more")
    wanted = 40 * n_per_cell
    ds = MovingMNISTDataset(resolution=resolution, num_frames=num_frames, num_digits=num_digits,
                            split=split, seed=seed, length=10 ** 9)
    def what(i):  # (digits, directions) of clip i, from its plan when the generator exposes one
        if hasattr(ds, "plan"):
            ks, names = ds.plan(i)[:2]
            return [int(ds.labels[k]) for k in ks], list(names)
        return ds.clip(i)[1:]

    cells, chosen = Counter(), []
    for i in range(400 * wanted):
        digits, directions = what(i)
        if num_digits == 1:
            cell = (digits[0], directions[0])
            if cells[cell] >= n_per_cell:
                continue
            cells[cell] += 1
        chosen.append((i, digits, directions))
        if len(chosen) == wanted:
            break
    if len(chosen) < wanted:
        raise RuntimeError(f"the data generator gave only {len(chosen)} of {wanted} clips for the calibration cells")
    videos, captions = [], []
    for start in range(0, wanted, 64):  # rendered in chunks: one pass per chunk when the generator batches
        part = chosen[start:start + 64]
        if hasattr(ds, "render"):
            frames = ds.render([i for i, _, _ in part])[0].numpy()
        else:
            frames = np.stack([ds.clip(i)[0] for i, _, _ in part])
        videos.extend(np.round(frames * 255.0).astype(np.uint8))
        captions.extend(clip_caption(d, m) for _, d, m in part)
    assert len(GENERATOR_DIRECTIONS) == 4, "calibration cells assume the generator's four directions"
    return np.stack(videos), captions


CALIBRATION_TARGETS = {
    "real": "digit >= 0.95 and direction >= 0.95",
    "static": "direction <= 0.05",
    "stops halfway": "direction <= 0.05",
    "leaves the canvas": "direction <= 0.05",
    "noise": "digit <= 0.25 and direction <= 0.10",
    "blank": "digit = direction = 0",
    "real (two digits)": "digit, direction and both >= 0.90",
    "static (two digits)": "direction <= 0.05",
    "directions swapped (two digits)": "direction <= 0.05",
    "one digit drawn (two digits)": "digit <= 0.10",
    "noise (two digits)": "digit <= 0.05 and direction <= 0.10",
    "blank (two digits)": "digit = direction = 0",
}

_TARGET_TESTS = {
    "real": lambda d, m, b: d >= 0.95 and m >= 0.95,
    "static": lambda d, m, b: m <= 0.05,
    "stops halfway": lambda d, m, b: m <= 0.05,
    "leaves the canvas": lambda d, m, b: m <= 0.05,
    "noise": lambda d, m, b: d <= 0.25 and m <= 0.10,
    "blank": lambda d, m, b: d == 0 and m == 0,
    "real (two digits)": lambda d, m, b: min(d, m, b) >= 0.90,
    "static (two digits)": lambda d, m, b: m <= 0.05,
    "directions swapped (two digits)": lambda d, m, b: m <= 0.05,
    "one digit drawn (two digits)": lambda d, m, b: d <= 0.10,
    "noise (two digits)": lambda d, m, b: d <= 0.05 and m <= 0.10,
    "blank (two digits)": lambda d, m, b: d == 0 and m == 0,
}


def _meets(row: str, rates: dict) -> bool | None:
    test = _TARGET_TESTS.get(row)
    if test is None or rates["clips"] == 0:
        return None
    return bool(test(rates["digit"], rates["direction"], rates["both"]))


def _shifted(frame: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``frame`` moved by (dy, dx) whole pixels; what comes in from outside is zero, what leaves is lost."""
    h, w = frame.shape
    out = np.zeros_like(frame)
    if abs(dy) >= h or abs(dx) >= w:
        return out
    out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = frame[max(-dy, 0):h - max(dy, 0),
                                                                        max(-dx, 0):w - max(dx, 0)]
    return out


def stopped_clips(videos: np.ndarray) -> np.ndarray:
    """Each clip (N, F, H, W) as it is up to its middle frame, which it then holds to the end: a digit
    that moves half the clip and stops."""
    mid = videos.shape[1] // 2
    return np.concatenate([videos[:, :mid], np.repeat(videos[:, mid:mid + 1], videos.shape[1] - mid, 1)], 1)


def leaving_clips(videos: np.ndarray, directions: list[str]) -> np.ndarray:
    """One-digit clips (N, F, H, W) remade so that the digit, at its own speed and the asked way, reaches
    the canvas edge with its box (the generator's digit side around its centre of mass, which the
    generator keeps inside) at the middle frame and slides out of the canvas after it: the motion is
    right but does not stay inside."""
    n, frames, h, w = videos.shape
    half = digit_side(h, w) / 2
    out = np.zeros_like(videos)
    for i, (clip, name) in enumerate(zip(videos, directions)):
        first, last = clip[0].astype(np.float64), clip[-1].astype(np.float64)
        if first.sum() == 0 or frames < 2:
            continue
        rows, cols = np.mgrid[0:h, 0:w]

        def centre(f):
            return np.array([(f * rows).sum(), (f * cols).sum()]) / f.sum()

        speed = float(np.abs(centre(last) - centre(first)).max()) / (frames - 1)  # px per frame
        axis, sign = AXES[name]  # axis 0 = x (columns), 1 = y (rows)
        pos = centre(first)[1 if axis == 0 else 0]
        extent = w if axis == 0 else h
        room = (extent - pos - half) if sign > 0 else (pos - half)   # from the box's leading side to the edge
        for t in range(frames):
            step = sign * int(round(room + speed * (t - frames // 2)))
            out[i, t] = _shifted(clip[0], 0, step) if axis == 0 else _shifted(clip[0], step, 0)
    return out


def _rates(videos, captions, device) -> dict:
    verdicts = score_clips(videos, captions, device)
    return semantic_rates(verdicts)


def calibration_rows(n_per_cell: int = 3, seed: int = 0, device="cpu", two_digits: bool = True,
                     resolution: int = 64, num_frames: int = 16, one_digit: bool = True) -> list[dict]:
    """Rates of ``score_clips`` on clips of ``num_frames`` frames of ``resolution`` x ``resolution`` whose
    answer is known, each with the real clips' captions. One digit (``one_digit``): ``real`` (the data
    generator, held-out digits, 10 digits x 4 directions x ``n_per_cell``), ``static`` (each real clip
    frozen on its first frame), ``stops halfway`` (held at its middle frame from there on), ``leaves the
    canvas`` (``leaving_clips``), ``noise`` (uniform) and ``blank`` (all zero). Two digits
    (``two_digits``; 40 x ``n_per_cell`` two-digit clips of the generator): ``real``, ``static``,
    ``directions swapped`` (the clips whose two different digits move different ways, captioned with
    each other's direction), ``one digit drawn`` (the one-digit real clips captioned with a second digit and
    direction), ``noise`` and ``blank``, each row named with " (two digits)". Each row: row, clips, digit,
    direction, both (two digits: also ``per_digit`` rates), digits, frames, height, width, target,
    meets_target."""
    if not (one_digit or two_digits):
        raise ValueError("calibration_rows needs one_digit or two_digits (or both) to be true")
    from ..training.data.moving_mnist import clip_caption

    rng = np.random.default_rng(seed)
    size = {"frames": num_frames, "height": resolution, "width": resolution}
    sets = []
    videos, captions = real_clips(n_per_cell, seed, 1, resolution, num_frames)
    directions = [parse_prompt(c).directions[0] for c in captions]
    if one_digit:
        sets += [
            ("real", videos, captions),
            ("static", np.repeat(videos[:, :1], videos.shape[1], axis=1), captions),
            ("stops halfway", stopped_clips(videos), captions),
            ("leaves the canvas", leaving_clips(videos, directions), captions),
            ("noise", rng.integers(0, 256, videos.shape, dtype=np.uint8), captions),
            ("blank", np.zeros_like(videos), captions),
        ]
    if two_digits:
        pairs, pair_captions = real_clips(n_per_cell, seed, 2, resolution, num_frames)
        parsed = [parse_prompt(c) for c in pair_captions]
        # a swap changes the caption only where the two digits differ and move different ways
        differ = [i for i, p in enumerate(parsed) if p.directions[0] != p.directions[1] and p.digits[0] != p.digits[1]]
        swapped = [clip_caption(parsed[i].digits, parsed[i].directions[::-1]) for i in differ]
        asked = []
        for c in captions:
            d = parse_prompt(c)
            other = int((d.digits[0] + rng.integers(1, 10)) % 10)
            asked.append(clip_caption([d.digits[0], other], [d.directions[0], list(AXES)[int(rng.integers(4))]]))
        sets += [
            ("real (two digits)", pairs, pair_captions),
            ("static (two digits)", np.repeat(pairs[:, :1], pairs.shape[1], axis=1), pair_captions),
            ("directions swapped (two digits)", pairs[differ], swapped),
            ("one digit drawn (two digits)", videos, asked),
            ("noise (two digits)", rng.integers(0, 256, pairs.shape, dtype=np.uint8), pair_captions),
            ("blank (two digits)", np.zeros_like(pairs), pair_captions),
        ]
    rows = []
    for name, clips, prompts in sets:
        rates = _rates(clips, prompts, device)
        rows.append({"row": name, **rates, "digits": 2 if name.endswith("(two digits)") else 1, **size,
                     "target": CALIBRATION_TARGETS[name], "meets_target": _meets(name, rates)})
    return rows


SHIPPED_SIZE = (16, 64)  # (frames, side) of the shipped video models' clips: the calibration size by default


def calibration_size_problem(frames: int, side: int) -> str | None:
    """Why the data generator cannot draw calibration clips of ``frames`` frames of ``side`` x ``side``
    with a digit moving at least 1 px on every frame inside the canvas; None when it can."""
    from ..training.data.moving_mnist import MIN_STEP
    from ..training.data.moving_mnist import digit_side as generator_digit_side

    if frames < 2:
        return f"{frames} frame(s) show no motion: use 2 or more"
    if side < 10:
        return f"a {side}x{side} canvas is too small for a digit: use 10 or more"
    free = side - generator_digit_side(side)
    if free / (frames - 1) < MIN_STEP:
        return (f"a {generator_digit_side(side)}-px digit has {free} px to cross in {frames - 1} steps, less than "
                f"{MIN_STEP:g} px per frame: use at most {int(free // MIN_STEP) + 1} frames at {side}x{side}")
    return None


def calibration_sizes(video_shapes) -> list[tuple[int, int]]:
    """The (frames, side) sizes to calibrate at for videos of ``video_shapes`` ((frames, height, width)
    each): every square size among them the generator can draw with moving digits, else the shipped
    size (stills and clips of other shapes are scored against the shipped size's rows)."""
    sizes = sorted({(int(f), int(h)) for f, h, w in video_shapes if h == w and calibration_size_problem(f, h) is None})
    return sizes or [SHIPPED_SIZE]
