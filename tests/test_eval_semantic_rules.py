"""The Moving-MNIST scorer's rules, each on hand-made clips or tracks whose answer is known: value
ranges and colour map to grey as documented, the clip's parts cover every frame, a track's displacement
is its slope times the frames between first and last, the travel / cross-axis / every-part / edge-cut
limits hold at their thresholds, the canvas edge is the outermost pixel on every side of a non-square
canvas, frame votes break ties by summed probability, and a track's guess is carried on to the frame
asked for."""

import numpy as np
import pytest

from mediagen.eval import moving_mnist as mm
from mediagen.eval.moving_mnist import as_grey_clip, clip_parts, motion, motion_direction, moves_as_asked


def track(frames, start, velocity):
    """Exact centroids (F, 2) in (x, y) of a digit moving at ``velocity`` px per frame from ``start``."""
    t = np.arange(frames, dtype=np.float64)[:, None]
    return np.asarray(start, np.float64) + t * np.asarray(velocity, np.float64)


def drawn(height, width, shape, corners):
    """A uint8 clip (F, H, W) with the binary ``shape`` drawn at 255, its top-left at each (x, y) of ``corners``."""
    clip = np.zeros((len(corners), height, width), np.uint8)
    sh, sw = shape.shape
    for t, (x, y) in enumerate(corners):
        clip[t, y:y + sh, x:x + sw][shape] = 255
    return clip


def blob(height=12, width=8):
    return np.ones((height, width), bool)


# -- value ranges and colour ------------------------------------------------------------------------------------

def test_unit_and_signed_float_clips_map_to_the_uint8_values():
    """A [0, 1] float clip whose darkest pixel is exactly 0 (every clip with a black background) is a
    [0, 1] clip, not a [-1, 1] one: its grey values are the uint8 values, so dim ink stays ink."""
    rng = np.random.default_rng(0)
    clip = np.zeros((4, 32, 32), np.uint8)
    clip[:, 8:20, 8:16] = rng.integers(60, 256, (4, 12, 8))
    want = clip.astype(np.float32)
    assert np.allclose(as_grey_clip(clip.astype(np.float32) / 255.0), want, atol=1e-3)
    assert np.allclose(as_grey_clip(clip.astype(np.float32) / 127.5 - 1.0), want, atol=1e-3)
    # dim ink (0.3 of full scale) moving right is seen in the [0, 1] clip as in the uint8 clip
    dim = drawn(64, 64, blob(), [(12 + 2 * t, 26) for t in range(16)])
    dim = (dim // 255 * 77).astype(np.uint8)
    assert motion_direction(dim) == "right"
    assert motion_direction(dim.astype(np.float32) / 255.0) == "right"


def test_colour_is_averaged_to_grey():
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 80, (3, 16, 16, 3)).astype(np.uint8)
    rgb[:, 4:10, 4:10, 1] = 250          # ink in the green channel only
    assert np.allclose(as_grey_clip(rgb), rgb.astype(np.float32).mean(-1))
    rgba = np.concatenate([rgb, np.full(rgb.shape[:-1] + (1,), 255, np.uint8)], -1)
    assert np.allclose(as_grey_clip(rgba), rgb.astype(np.float32).mean(-1))  # alpha is not colour


# -- parts of the clip and the motion of a track -----------------------------------------------------------------

@pytest.mark.parametrize("frames", [1, 2, 7, 8, 15, 16, 17, 32, 33])
def test_the_parts_cover_every_frame_once_in_order(frames):
    parts = clip_parts(frames)
    assert np.array_equal(np.concatenate(parts), np.arange(frames))
    assert len(parts) == max(1, frames // mm.PART_FRAMES)
    assert all(len(p) >= min(frames, mm.PART_FRAMES) for p in parts)


def test_motion_of_a_straight_track_is_its_slope():
    frames, v = 16, (1.25, -0.5)
    move = motion(track(frames, (10.0, 40.0), v), 64, 64)
    assert move["dx"] == pytest.approx(v[0] * (frames - 1)) and move["dy"] == pytest.approx(v[1] * (frames - 1))
    assert len(move["parts"]) == len(clip_parts(frames))
    assert all(p == pytest.approx(v) for p in move["parts"]) and move["cut"] == 0.0


def test_a_track_seen_in_fewer_than_half_the_frames_has_no_motion():
    centroids = track(16, (10.0, 30.0), (2.0, 0.0))
    centroids[:9] = np.nan                      # 7 of 16 frames show it
    assert motion(centroids, 64, 64) is None
    centroids[8] = (26.0, 30.0)                 # 8 of 16: judged
    assert motion(centroids, 64, 64) is not None


def test_the_cut_fraction_counts_the_frames_that_show_the_digit():
    centroids = track(16, (10.0, 30.0), (2.0, 0.0))
    centroids[[3, 11]] = np.nan
    cut = np.zeros(16, bool)
    cut[[0, 3, 5, 11]] = True                   # two shown frames cut; frames 3 and 11 show nothing
    shown = np.isfinite(centroids).all(1)
    assert motion(centroids, 64, 64, cut)["cut"] == pytest.approx(cut[shown].mean())


def test_a_digit_cut_in_more_than_an_eighth_of_its_frames_has_left():
    centroids = track(16, (10.0, 30.0), (2.0, 0.0))
    for n_cut, ok in ((0, True), (2, True), (3, False), (8, False)):   # 2/16 = MAX_CUT exactly
        cut = np.zeros(16, bool)
        cut[16 - n_cut:] = True
        assert moves_as_asked(motion(centroids, 64, 64, cut), "right", 64, 64) is ok, n_cut


def test_travel_under_a_tenth_of_the_frame_is_no_motion():
    """One part (8 frames): only the travel rule can fail. 0.85 px per frame travels 0.85 x 7 = 5.95 px
    between the first and last frame, under 6.4 (a tenth of 64); 0.95 px per frame travels 6.65."""
    assert len(clip_parts(8)) == 1
    assert not moves_as_asked(motion(track(8, (20.0, 30.0), (0.85, 0.0)), 64, 64), "right", 64, 64)
    assert moves_as_asked(motion(track(8, (20.0, 30.0), (0.95, 0.0)), 64, 64), "right", 64, 64)
    # the axis's own extent: 0.95 px per frame is under a tenth of a 96-px-wide canvas
    assert not moves_as_asked(motion(track(8, (20.0, 30.0), (0.95, 0.0)), 64, 96), "right", 64, 96)
    assert moves_as_asked(motion(track(8, (20.0, 30.0), (0.0, 0.95)), 64, 96), "down", 64, 96)


def test_a_diagonal_digit_moves_only_along_its_larger_axis():
    move = motion(track(16, (10.0, 10.0), (2.0, 1.0)), 64, 64)
    assert moves_as_asked(move, "right", 64, 64) and not moves_as_asked(move, "down", 64, 64)
    corners = [(14 + t, 14 + 2 * t) for t in range(16)]          # down 2 px, right 1 px per frame
    assert motion_direction(drawn(64, 64, blob(), corners)) == "down"
    corners = [(46 - 2 * t, 14 + t) for t in range(16)]         # left 2 px, down 1 px per frame
    assert motion_direction(drawn(64, 64, blob(), corners)) == "left"


def test_a_digit_that_turns_back_does_not_move_the_asked_way():
    """Right 3 px per frame over the first part, then left 1 px per frame over the second: the clip's
    displacement is right and long enough, but the second part moves the wrong way."""
    xs = [12 + 3 * t for t in range(8)] + [33 - (t - 7) for t in range(8, 16)]
    centroids = np.array([[x, 30.0] for x in xs], np.float64)
    move = motion(centroids, 64, 64)
    assert move["dx"] >= mm.MIN_TRAVEL * 64 and move["parts"][1][0] < 0   # only the part rule is left
    assert not moves_as_asked(move, "right", 64, 64) and not moves_as_asked(move, "left", 64, 64)
    assert motion_direction(drawn(64, 64, blob(), [(x, 26) for x in xs])) is None
    assert motion_direction(drawn(64, 64, blob(), [(12 + 2 * t, 26) for t in range(16)])) == "right"


# -- the canvas edge ---------------------------------------------------------------------------------------------

def seven(stem=23):
    """A 7-like shape: a 10-px bar on its first row and a 3-px stem below it, so a quarter of its ink
    lies on one row while its centroid sits well inside (its digit-sized box around the centroid
    sticks out by less than EDGE_SLACK when the bar is on the canvas edge)."""
    s = np.zeros((1 + stem, 10), bool)
    s[0] = True
    s[1:, 6:9] = True
    return s


@pytest.mark.parametrize("height, width", [(64, 64), (64, 96), (96, 64)])
def test_ink_on_the_outermost_row_is_cut_and_one_row_in_is_not(height, width):
    """A digit whose bar runs along the canvas edge is cut in every frame and fails; the same digit one
    pixel further in is inside and moves. On a non-square canvas the bottom edge is row height - 1."""
    top, bottom = seven(), seven()[::-1]
    xs = [10 + 2 * t for t in range(16)]
    assert motion_direction(drawn(height, width, top, [(x, 0) for x in xs])) is None
    assert motion_direction(drawn(height, width, top, [(x, 1) for x in xs])) == "right"
    low = height - bottom.shape[0]
    assert motion_direction(drawn(height, width, bottom, [(x, low) for x in xs])) is None
    assert motion_direction(drawn(height, width, bottom, [(x, low - 1) for x in xs])) == "right"
    # the same on the side edges, moving down
    ys = [10 + 2 * t for t in range(16)]
    left, right = seven().T, seven().T[:, ::-1]
    assert motion_direction(drawn(height, width, left, [(0, y) for y in ys])) is None
    assert motion_direction(drawn(height, width, left, [(1, y) for y in ys])) == "down"
    far = width - right.shape[1]
    assert motion_direction(drawn(height, width, right, [(far, y) for y in ys])) is None
    assert motion_direction(drawn(height, width, right, [(far - 1, y) for y in ys])) == "down"


# -- reading the digit and linking tracks ------------------------------------------------------------------------

def test_the_most_frames_win_the_vote_and_summed_probability_breaks_ties():
    def frames(label, p, n):
        row = np.full(10, (1 - p) / 9)
        row[label] = p
        return [row] * n

    # three confident-enough frames of 1 beat two very confident frames of 2
    probs = np.array(frames(1, 0.4, 3) + frames(2, 0.99, 2))
    assert probs.sum(0).argmax() == 2
    label, votes = mm._vote(probs)
    assert label == 1 and votes[1] == 3 and votes[2] == 2 and sum(votes) == 5
    # a tie on votes goes to the larger summed probability
    assert mm._vote(np.array(frames(4, 0.5, 2) + frames(6, 0.9, 2)))[0] == 6
    assert mm._vote(np.array(frames(6, 0.5, 2) + frames(4, 0.9, 2)))[0] == 4
    assert mm._vote(np.zeros((0, 10))) == (None, [0] * 10)


def test_a_track_is_guessed_where_its_line_reaches_the_asked_frame():
    t = 10
    history = np.full((t, 2, 2), np.nan)
    history[:, 0] = track(t, (5.0, 40.0), (3.0, 0.0))           # seen on every frame
    seen = [1, 4, 6, 9]
    history[seen, 1] = track(t, (80.0, 10.0), (-2.0, 1.5))[seen]  # seen on some frames only
    guess = mm._predicted(history, t)
    assert guess[0] == pytest.approx(np.array([5.0, 40.0]) + t * np.array([3.0, 0.0]))
    assert guess[1] == pytest.approx(np.array([80.0, 10.0]) + t * np.array([-2.0, 1.5]))
