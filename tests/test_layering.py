"""Where things live: the package's layers (docs/DESIGN.md, "Layers and imports") and one source per name.

Layering: every ``mediagen`` module is read with ``ast`` (imports inside functions included) and each
import of another top-level part of the package is checked against the layer order. A module may
import its own part and the parts of lower layers, never a higher one: the kernels must stay usable
without the models, the models without the pipelines, and so on up to the app.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mediagen"

# Lowest first. "data" holds the shipped datasets (numpy only), "host_memory" the process's allocator setting
# (standard library only); "__init__" is the package façade
# (``import mediagen``) and "cli" the console script, which reach every subcommand. "text" is the
# text-encoder stack: above "attention" (its softmax mixer reuses SDPAttention) and below "models",
# so the diffusion attentions never depend on it.
LAYERS = (
    ("data", "host_memory"),
    ("kernels",),
    ("attention",),
    ("text",),
    ("models",),
    ("pipelines",),
    ("training", "eval"),
    ("app", "cli", "__init__"),
)
LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}

# Parts that are layered inside as well, lowest first, by the subpackage below them: the same rule
# holds between their subpackages (the text kernels run without the text modules, the text modules
# without the encoders). "__init__" is the part's own package module.
SUBLAYERS = {
    "text": (("kernels",), ("attention",), ("encoders",), ("__init__",)),
}

# Imports between the two parts of one layer. Each is an exception to remove, not a pattern: the
# shared code belongs one layer down (docs/DESIGN.md, "Layers and imports").
SIDEWAYS_ALLOWED = {
    # video decoding shared by training data and evaluation; belongs in a lower I/O module
    ("mediagen/training/data/video_folder.py", "mediagen.eval.video_io"),
    # real Moving-MNIST clips for calibration are drawn with the training data generator
    ("mediagen/eval/moving_mnist.py", "mediagen.training.data.moving_mnist"),
}


def part_of(module: str) -> str:
    """The top-level part of ``mediagen.<part>...`` ("__init__" for ``mediagen`` itself)."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def subpart_of(module: str) -> str:
    """The subpackage of ``mediagen.<part>.<sub>...`` ("__init__" for ``mediagen.<part>`` itself)."""
    pieces = module.split(".")
    return pieces[2] if len(pieces) > 2 else "__init__"


def imported_modules(path: Path, root: Path):
    """(line, absolute module name) of every ``mediagen`` import in the file, relative ones resolved."""
    rel = path.relative_to(root.parent).with_suffix("")
    package = list(rel.parts[:-1])  # a module's package; for __init__.py the package itself
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            if name == root.name or name.startswith(root.name + "."):
                yield node.lineno, name


def module_part(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def module_subpart(path: Path, root: Path) -> str:
    """The subpackage of a module inside a part, "__init__" for the part's own ``__init__.py``; a
    plain module directly in the part counts as a subpackage of its name."""
    rel = path.relative_to(root)
    return "__init__" if len(rel.parts) == 2 and rel.name == "__init__.py" else Path(rel.parts[1]).stem


def cross_imports(root: Path = PACKAGE):
    """(file, line, importer part, imported module) for every import between two parts."""
    for path in sorted(root.rglob("*.py")):
        src = module_part(path, root)
        for line, name in imported_modules(path, root):
            if part_of(name) != src:
                yield path.relative_to(root.parent).as_posix(), line, src, name


def sub_imports(root: Path = PACKAGE):
    """(file, line, part, importer subpackage, imported module) for every import between two
    subpackages of one part listed in SUBLAYERS."""
    for part in SUBLAYERS:
        for path in sorted((root / part).rglob("*.py")):
            src = module_subpart(path, root)
            for line, name in imported_modules(path, root):
                if part_of(name) == part and subpart_of(name) != src:
                    yield path.relative_to(root.parent).as_posix(), line, part, src, name


def violations(root: Path = PACKAGE):
    """Imports that go up a layer, into an unknown part, or sideways without being listed; inside a
    part of SUBLAYERS the same between its subpackages (no sideways exceptions there)."""
    found = []
    for file, line, part, src, name in sub_imports(root):
        order = {sub: level for level, subs in enumerate(SUBLAYERS[part]) for sub in subs}
        dst = subpart_of(name)
        if src not in order or dst not in order:
            found.append(f"{file}:{line} imports {name}: {part}.{src if src not in order else dst} has no "
                         f"sub-layer (add it to SUBLAYERS here and to docs/DESIGN.md)")
        elif order[dst] > order[src]:
            found.append(f"{file}:{line} imports {name}: {part}.{src} may not import {part}.{dst} (a higher layer)")
        elif order[dst] == order[src]:
            found.append(f"{file}:{line} imports {name}: {part}.{src} and {part}.{dst} share a layer and do not "
                         f"import each other")
    for file, line, src, name in cross_imports(root):
        dst = part_of(name)
        if src not in LAYER_OF or dst not in LAYER_OF:
            found.append(f"{file}:{line} imports {name}: part {src if src not in LAYER_OF else dst!r} has no layer "
                         f"(add it to LAYERS here and to docs/DESIGN.md)")
        elif LAYER_OF[dst] > LAYER_OF[src]:
            found.append(f"{file}:{line} imports {name}: {src} may not import {dst} (a higher layer)")
        elif LAYER_OF[dst] == LAYER_OF[src] and (file, name) not in SIDEWAYS_ALLOWED:
            found.append(f"{file}:{line} imports {name}: {src} and {dst} share a layer and do not import each other")
    return found


def test_no_module_imports_upward():
    assert violations() == []


def test_listed_sideways_imports_still_exist():
    seen = {(file, name) for file, _, _, name in cross_imports()}
    stale = sorted(SIDEWAYS_ALLOWED - seen)
    assert not stale, f"these listed exceptions are gone; delete them from SIDEWAYS_ALLOWED: {stale}"


def test_checker_sees_real_and_planted_imports(tmp_path):
    """The checker finds the imports the package is known to have, and flags a planted upward one
    (relative, inside a function) as well as a sideways one."""
    assert any(src == "attention" and part_of(name) == "kernels" for _, _, src, name in cross_imports())
    assert any(src == "text" and part_of(name) == "attention" for _, _, src, name in cross_imports())
    root = tmp_path / "mediagen"
    for part in ("kernels", "models", "training", "eval", "text", "text/attention"):
        (root / part).mkdir(parents=True)
        (root / part / "__init__.py").write_text("")
    (root / "models" / "spec.py").write_text("import math\n")
    (root / "kernels" / "op.py").write_text("def f():\n    from ..models.spec import math\n")
    (root / "training" / "loop.py").write_text("from mediagen.eval import fid\n")
    (root / "text" / "attention" / "mix.py").write_text("from ..encoders import load\n")
    found = violations(root)
    assert len(found) == 3
    assert "mediagen/text/attention/mix.py:1 imports mediagen.text.encoders: text.attention may not import" in found[0]
    assert "mediagen/kernels/op.py:2 imports mediagen.models.spec" in found[1]
    assert "training and eval share a layer" in found[2]


# --- one source per name: the command line and the app read the spec's lists -------------------------

def _generate_parser() -> argparse.ArgumentParser:
    from mediagen.pipelines import generate_cli

    parser = argparse.ArgumentParser()
    generate_cli.register(parser.add_subparsers())
    return parser


def _choices(parser: argparse.ArgumentParser, option: str):
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["generate"]
    return next(a for a in sub._actions if option in a.option_strings).choices


def test_generate_offers_the_spec_attentions_and_the_built_schedulers():
    from mediagen.models.attention_spec import ATTENTION_CHOICES
    from mediagen.pipelines.schedulers import SCHEDULERS, make_scheduler

    parser = _generate_parser()
    assert tuple(_choices(parser, "--attention")) == ATTENTION_CHOICES
    assert tuple(_choices(parser, "--scheduler")) == SCHEDULERS
    for name in SCHEDULERS:  # every name offered is one the factory builds
        make_scheduler(name)


def test_app_offers_the_spec_attentions_under_the_shipped_folder_labels():
    from mediagen.app.models import ATTENTIONS
    from mediagen.models.attention_spec import ATTENTION_CHOICES
    from mediagen.pipelines.names import CHECKPOINT_LABELS

    assert sorted(ATTENTIONS.values()) == sorted(ATTENTION_CHOICES)
    assert {CHECKPOINT_LABELS[name]: name for name in ATTENTION_CHOICES} == ATTENTIONS
    assert len(set(CHECKPOINT_LABELS.values())) == len(CHECKPOINT_LABELS)  # one folder label per attention


@pytest.mark.parametrize("module", ["mediagen.pipelines.names", "mediagen.models.attention_spec"])
def test_name_modules_import_without_torch_or_diffusers(module):
    code = (f"import sys, {module}; heavy = [m for m in ('torch', 'diffusers') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


# --- pointers into docs/DESIGN.md name sections that exist ---------------------------------------------

def _design_anchors() -> set[str]:
    """GitHub's anchors of the headings of docs/DESIGN.md: lower case, punctuation dropped, spaces to '-'."""
    text = (PACKAGE.parent / "docs" / "DESIGN.md").read_text()
    headings = re.findall(r"^#+\s+(.+?)\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_design_pointers_resolve():
    anchors = _design_anchors()
    root = PACKAGE.parent
    files = [root / "README.md", root / "docs" / "DESIGN.md"]
    files += [p for d in ("mediagen", "tests", "benchmarks") for p in sorted((root / d).rglob("*.py"))]
    broken = []
    for path in files:
        text = path.read_text()
        links = re.findall(r"docs/DESIGN\.md#([\w-]+)", text)
        if path.name == "DESIGN.md":
            links += re.findall(r"\]\(#([\w-]+)\)", text)
        broken += [f"{path.relative_to(root)}: #{a}" for a in links if a not in anchors]
    assert not broken, f"pointers to sections docs/DESIGN.md does not have: {broken}"


def test_kernels_use_no_collectives():
    """The kernels run in one process: where their parts meet other processes' (sequence-parallel MHLA),
    the collectives come from the attention layer through a hook (kernels/mhla/exchange.py)."""
    found = []
    for path in sorted((PACKAGE / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {n}" for n in names
                      if n.startswith("torch.distributed")]
    assert not found, found


def test_feature_maps_have_one_source():
    """The kernels own the feature-map names and their codes; a model spec offers those maps but None
    (a model layer's q and k are not guaranteed positive)."""
    from mediagen.kernels.mhla.checks import FEATURE_CODES, FEATURE_MAPS
    from mediagen.models import attention_spec

    assert set(attention_spec.FEATURE_MAPS) == set(FEATURE_MAPS) - {None}
    assert FEATURE_CODES == {"none": 0, "relu": 1, "elu1": 2}  # the constexpr values the kernels branch on
