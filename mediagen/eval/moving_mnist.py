"""Semantic scores of Moving-MNIST videos against their prompts: digit identity, motion direction, count.

Prompts name digits and a direction in plain words, for example "the digit 7 moving left",
"digits 3 and 5 moving up", "two digits 1 and 4 moving right", "a seven moving down". A prompt is a
Moving-MNIST prompt when it names at least one digit; direction and count are scored only when
the prompt states them (the count is a number word before "digit(s)", else the digits listed).

Per frame, ink is found by thresholding the grey frame (light ink on a dark background; a light
background is inverted) and split into connected components; tiny specks are dropped.
- identity: each component is cropped, scaled to fit 20x20 and centred on its centre of mass in a
  28x28 canvas (the MNIST recipe) and classified by the shipped digit classifier; a frame scores the
  fraction of the prompt's digits found among its predictions (as a multiset); the video scores the
  mean over frames.
- direction: component centroids are tracked frame to frame by nearest neighbour; the mean step
  gives the direction (image y points down, so "up" is negative y); 1 if it matches the prompt.
- count: the median number of components over frames equals the prompt's count.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

NUMBER_WORDS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                "eight": 8, "nine": 9}
COUNT_WORDS = {"a": 1, "an": 1, "one": 1, "single": 1, "two": 2, "three": 3, "four": 4, "five": 5}
DIRECTIONS = {"left": "left", "leftward": "left", "leftwards": "left", "right": "right", "rightward": "right",
              "rightwards": "right", "up": "up", "upward": "up", "upwards": "up", "down": "down",
              "downward": "down", "downwards": "down"}


@dataclass
class DigitPrompt:
    digits: list[int]
    direction: str | None
    count: int | None


def parse_prompt(prompt: str) -> DigitPrompt | None:
    """The digits, direction and count a Moving-MNIST prompt asks for; None for other prompts."""
    words = re.findall(r"[a-z]+|\d", prompt.lower())
    count = None
    for w, nxt in zip(words, words[1:]):
        if nxt in ("digit", "digits") and w in COUNT_WORDS:
            count = COUNT_WORDS[w]
    digits = []
    for i, w in enumerate(words):
        if w.isdigit():
            digits.append(int(w))
        elif w in NUMBER_WORDS and not (w in COUNT_WORDS and i + 1 < len(words) and words[i + 1] in ("digit", "digits")):
            digits.append(NUMBER_WORDS[w])
    if not digits:
        return None
    direction = next((DIRECTIONS[w] for w in words if w in DIRECTIONS), None)
    return DigitPrompt(digits, direction, count if count is not None else len(digits))


def ink_components(frame: np.ndarray, min_area: int | None = None):
    """Connected ink components of one frame: list of (mask crop uint8, bbox (x, y, w, h), centroid (x, y))."""
    import cv2

    grey = frame.mean(axis=-1) if frame.ndim == 3 else frame.astype(np.float64)
    if np.median(grey) > 127:  # dark ink on a light background
        grey = 255 - grey
    grey = grey.astype(np.uint8)
    binary = (grey > 100).astype(np.uint8)
    min_area = min_area if min_area is not None else max(8, grey.size // 2000)
    n, labels, stats, centroids = cv2.connectedComponentsWithStats(binary, connectivity=8)
    comps = []
    for j in range(1, n):
        x, y, w, h, area = stats[j]
        if area < min_area:
            continue
        crop = np.where(labels[y:y + h, x:x + w] == j, grey[y:y + h, x:x + w], 0).astype(np.uint8)
        comps.append((crop, (x, y, w, h), tuple(centroids[j])))
    return comps


def to_mnist_canvas(crop: np.ndarray) -> np.ndarray:
    """A digit crop scaled to fit 20x20 and centred by centre of mass in 28x28 (uint8)."""
    import cv2

    h, w = crop.shape
    s = 20.0 / max(h, w)
    nh, nw = max(1, round(h * s)), max(1, round(w * s))
    small = cv2.resize(crop, (nw, nh), interpolation=cv2.INTER_AREA)
    canvas = np.zeros((28, 28), np.float32)
    mass = small.astype(np.float64)
    total = mass.sum()
    cy = (mass.sum(1) @ np.arange(nh)) / total if total else nh / 2
    cx = (mass.sum(0) @ np.arange(nw)) / total if total else nw / 2
    top, left = int(round(14 - cy)), int(round(14 - cx))
    top, left = min(max(top, 0), 28 - nh), min(max(left, 0), 28 - nw)
    canvas[top:top + nh, left:left + nw] = small
    return canvas.astype(np.uint8)


def digit_identity(video: np.ndarray, digits: list[int], device="cpu") -> float:
    from .digit_classifier import classify_digits

    per_frame = [[to_mnist_canvas(c[0]) for c in ink_components(f)] for f in video]
    flat = [c for frame in per_frame for c in frame]
    if not flat:
        return 0.0
    preds = classify_digits(np.stack(flat), device).tolist()
    want = Counter(digits)
    scores, k = [], 0
    for frame in per_frame:
        got = Counter(preds[k:k + len(frame)])
        k += len(frame)
        scores.append(sum((want & got).values()) / len(digits))
    return float(np.mean(scores))


def track_velocity(video: np.ndarray) -> np.ndarray | None:
    """Mean per-frame displacement (dx, dy) of component centroids matched by nearest neighbour."""
    steps = []
    prev = None
    for frame in video:
        cur = np.array([c[2] for c in ink_components(frame)]).reshape(-1, 2)
        if prev is not None and len(prev) and len(cur):
            d = np.linalg.norm(cur[:, None] - prev[None], axis=-1)
            nearest = d.argmin(axis=1)
            steps.extend(cur - prev[nearest])
        prev = cur
    return np.mean(steps, axis=0) if steps else None


def motion_direction(video: np.ndarray, min_speed: float = 0.25) -> str | None:
    """'left', 'right', 'up', 'down', or None when nothing moves (mean speed < min_speed px/frame)."""
    vel = track_velocity(video)
    if vel is None or np.hypot(*vel) < min_speed:
        return None
    dx, dy = vel
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def digit_count(video: np.ndarray) -> int:
    return int(np.median([len(ink_components(f)) for f in video]))


def semantic_scores(video: np.ndarray, prompt: DigitPrompt, device="cpu") -> dict[str, float]:
    """Per-video scores in [0, 1]: digit_identity, and motion_direction / digit_count when asked for."""
    out = {"digit_identity": digit_identity(video, prompt.digits, device)}
    if prompt.direction is not None:
        out["motion_direction"] = float(motion_direction(video) == prompt.direction)
    if prompt.count is not None:
        out["digit_count"] = float(digit_count(video) == prompt.count)
    return out
