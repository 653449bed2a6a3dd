"""An output_dir holds one run: a run without checkpoint.resume refuses a folder that holds another run
(overwrite_output_dir=true starts it over on purpose), and resuming a checkpoint of another model says
so in one line."""

from mediagen.cli import main as cli_main
from mediagen.training.checkpoint import list_checkpoints
from training_helpers import TINY_DIT, TINY_WAN, steps_logged

DIT = [*TINY_DIT, "train.batch_size=4", "checkpoint.every=2", "checkpoint.keep_last=2"]


def train(tmp_path, out, *args):
    config = tmp_path / "empty.yaml"
    config.write_text("{}\n")
    return cli_main(["train", str(config), f"output_dir={out}", *args])


def snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_new_run_refuses_an_output_dir_that_holds_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(tmp_path, out, *DIT, "train.max_steps=8") == 0
    before = snapshot(out)
    capsys.readouterr()
    # the same command again (or another config) without checkpoint.resume: refused at once, nothing touched
    assert train(tmp_path, out, *DIT, "train.max_steps=3") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"output_dir={str(out)!r} already holds a run" in err
    assert "checkpoint.resume=latest" in err and "overwrite_output_dir=true" in err
    assert snapshot(out) == before
    # overwriting on purpose: the earlier run's checkpoints, metrics and pipeline go first, so keep_last
    # and a later resume see this run's steps only (not the old checkpoint-8 after this run's 1..3)
    assert train(tmp_path, out, *DIT, "train.max_steps=3", "overwrite_output_dir=true",
                 "checkpoint.save_pipeline=false") == 0
    assert "deleted the earlier run's" in capsys.readouterr().out
    assert [s for s, _ in list_checkpoints(out)] == [2, 3]
    assert steps_logged(out) == [1, 2, 3] and not (out / "pipeline").exists()
    assert train(tmp_path, out, *DIT, "train.max_steps=5", "checkpoint.resume=latest") == 0
    assert "(step 3)" in capsys.readouterr().out
    assert steps_logged(out) == [1, 2, 3, 4, 5]
    # the two options contradict each other
    assert train(tmp_path, out, *DIT, "overwrite_output_dir=true", "checkpoint.resume=latest") == 2
    assert "give one or the other" in capsys.readouterr().err


def test_resuming_another_models_checkpoint_says_so_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(tmp_path, out, *DIT, "train.max_steps=2", "checkpoint.save_pipeline=false") == 0
    capsys.readouterr()
    before = snapshot(out)
    assert train(tmp_path, out, *TINY_WAN, "train.max_steps=4", "checkpoint.resume=latest") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "checkpoint-0000002 holds another model's weights" in err
    assert "model.preset='dit-tiny' (this run: 'wan-tiny')" in err
    assert snapshot(out) == before
    # the same model with another shape (a wider DiT) is named too
    assert train(tmp_path, out, *DIT, "train.max_steps=4", "checkpoint.resume=latest",
                 "model.overrides.num_attention_heads=4") == 2
    err = capsys.readouterr().err.strip()
    assert "of other shapes" in err and "(32, 1, 2, 2) saved, (64, 1, 2, 2) here" in err and len(err.splitlines()) == 1
    assert "model.overrides={} (this run: {'num_attention_heads': 4})" in err
    assert snapshot(out) == before


def test_export_never_replaces_a_folder_that_is_not_a_pipeline(tmp_path, capsys):
    """`mediagen train CONFIG --export STEP --to FOLDER` replaces FOLDER when it holds an earlier export (a pipeline
    folder); the run's own output_dir, a folder above it, other folders and files are refused in one line, with
    nothing deleted."""
    from mediagen.training.checkpoint import list_checkpoints

    out = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    args = [str(config), f"output_dir={out}", *TINY_DIT, "train.max_steps=2", "checkpoint.every=1"]
    assert cli_main(["train", *args]) == 0
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me too")
    for target in (out, tmp_path, other, a_file):
        capsys.readouterr()
        assert cli_main(["train", *args, "--export", "latest", "--to", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--to {str(target)!r}" in err, err
    assert [s for s, _ in list_checkpoints(out)] == [1, 2] and (out / "config.yaml").is_file()
    assert (other / "notes.txt").read_text() == "keep me" and a_file.read_text() == "keep me too"
    # an earlier export is replaced
    target = tmp_path / "exported"
    for step in ("1", "2"):
        assert cli_main(["train", *args, "--export", step, "--to", str(target)]) == 0
        assert (target / "model_index.json").is_file()


def test_export_builds_the_model_the_run_trained(tmp_path, capsys):
    """`--export` builds the model from the run's config.yaml: a command without the training command's
    overrides (another model size, train.seed, which seeds the byte text encoder no checkpoint holds, and
    objective.shift, the scheduler's) writes the pipeline the run wrote, and names the differing keys in one line."""
    import json

    import torch
    from safetensors.torch import load_file

    out = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    args = [str(config), f"output_dir={out}", *TINY_WAN, "train.max_steps=1", "checkpoint.every=1"]
    trained = ["model.overrides.num_layers=1", "train.seed=5", "objective.shift=3.0"]
    assert cli_main(["train", *args, *trained]) == 0

    def pipeline(folder):
        tensors = {f"{p.relative_to(folder)}:{k}": v for p in sorted(folder.rglob("*.safetensors"))
                   for k, v in load_file(str(p)).items()}
        return tensors, json.loads((folder / "scheduler" / "scheduler_config.json").read_text())

    want, want_scheduler = pipeline(out / "pipeline")
    capsys.readouterr()
    assert cli_main(["train", *args, "--export", "latest", "--to", str(tmp_path / "exported")]) == 0
    said = capsys.readouterr().out.splitlines()
    notice = [line for line in said if line.startswith("--export:")]
    assert len(notice) == 1 and f"built from the run's {out / 'config.yaml'}" in notice[0]
    for part in ("model.overrides={'num_layers': 1} (command: {})", "train.seed=5 (command: 0)",
                 "objective.shift=3.0 (command: 1.0)"):
        assert part in notice[0], notice[0]
    got, got_scheduler = pipeline(tmp_path / "exported")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert got_scheduler == want_scheduler
    # the same command as the training one exports without a notice
    assert cli_main(["train", *args, *trained, "--export", "latest", "--to", str(tmp_path / "exported")]) == 0
    assert "--export:" not in capsys.readouterr().out
    # a run without config.yaml is exported from the command's config, which says so
    (out / "config.yaml").unlink()
    assert cli_main(["train", *args, *trained, "--export", "latest", "--to", str(tmp_path / "exported")]) == 0
    assert "config.yaml is missing, so the model is built from this command's config" in capsys.readouterr().out
    assert pipeline(tmp_path / "exported")[0].keys() == want.keys()
