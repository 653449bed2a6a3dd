"""benchmarks/dit_samples_grid.py: the docs' sample grid shows sample r * 10 + c at row r, column c."""

import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "dit_samples_grid.py"


def test_grid_places_each_digit_in_its_column(tmp_path):
    # sample i is a flat image of value i (mod 256): its position in the grid tells where it went
    images = np.broadcast_to((np.arange(40) * 5 % 256).astype(np.uint8)[:, None, None, None], (40, 4, 4, 3))
    np.savez(tmp_path / "a.npz", images=images)
    np.savez(tmp_path / "b.npz", images=images[::-1].copy())
    out = tmp_path / "grid.png"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--rows", "2", "--scale", "1",
                    "--label-width", "10", f"A={tmp_path / 'a.npz'}", f"B={tmp_path / 'b.npz'}"], check=True)
    grid = np.asarray(Image.open(out))
    assert grid.shape == (2 * 4 + 8 + 2 * 4, 10 + 10 * 4)
    for r in range(2):
        for c in range(10):
            assert grid[r * 4 + 1, 10 + c * 4 + 1] == (r * 10 + c) * 5 % 256          # band A
            assert grid[16 + r * 4 + 1, 10 + c * 4 + 1] == (39 - (r * 10 + c)) * 5 % 256  # band B
    bad = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), str(tmp_path / "a.npz")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "LABEL=PATH.npz" in bad.stderr
