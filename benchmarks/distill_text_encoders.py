"""Distil the shipped text encoders (MLRA-2, HLA) from all-MiniLM-L6-v2 and write slim checkpoints.

For each encoder: ``encoder_from_minilm``, held-out sentence-embedding cosine to MiniLM, distillation
of the attention and norms only (embeddings and FFNs stay MiniLM's, so the checkpoint stores only
the rest, ``slim.py``), the same cosines again, then ``OUT/text-mlra`` / ``OUT/text-hla`` (slim, fp16),
reloaded through ``load_text_encoder`` to check them, and ``OUT/distill_text_encoders.{json,md}``.

The prompt mix is the synthetic image/video corpus (``make_prompts``) plus Moving-MNIST captions at
``--mmnist-weight``: the captions the video models are trained on, in the template wording ("the digit 3
moves left", one and two digits and still clips, from the training data's own ``clip_caption``) at
``--template-share`` of them and in the varied training wordings (``mediagen.training.data.wordings``)
for the rest. A tenth of the two-digit template captions and every held-out wording
(``wordings.HELD_OUT``) stay out of training, for evaluation. Besides the sentence-embedding cosines the
summary has the mean token cosine to MiniLM on the 40 one-digit template captions, the token states the
video models read.

``--reader video-mhla video-sdpa`` (shipped names or pipeline folders) adds what those video transformers
read from the token states to the loss (``CrossAttentionReader``: text projection, every block's
cross-attention keys and values; ``--reader-weight``), and a "reads" similarity (1 - relative squared
error of those reads) on the evaluation sets. ``--empty-share`` of the prompts are "", the negative prompt
that classifier-free guidance encodes.

``--init DIR`` continues from a saved encoder (e.g. the shipped ``mediagen/checkpoints/text-mlra``)
instead of MiniLM's calibrated initialisation.

``--time-limit`` is each encoder's wall-time budget (initialisation, evaluations, training, saving):
training gets what is left after the rest (estimated from the first evaluation); after a few timed
steps its step count is cut to fit (the learning-rate schedule still anneals), and it stops and saves
once its share is spent.

    python -m benchmarks.distill_text_encoders --out-dir OUT --device cuda:1
    python -m benchmarks.distill_text_encoders --out-dir /tmp/te --device cpu --steps 3 --batch-size 4  # smoke
    nice -n 10 python -m benchmarks.distill_text_encoders --out-dir OUT --device cpu --time-limit 1200
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mediagen.text.encoders import (CrossAttentionReader, DistillConfig, PromptEncoder, distill,
                                    encoder_from_minilm, load_minilm, load_minilm_tokenizer, load_text_encoder,
                                    make_prompts, read_similarity, sentence_similarity, token_similarity)
from mediagen.text.kernels.hla import fla_available
from mediagen.training.data.moving_mnist import DIRECTIONS, STILL, clip_caption
from mediagen.training.data.wordings import caption_corpus

FOLDERS = {"mlra2": "text-mlra", "hla": "text-hla"}                  # what mediagen/app/models.py looks for
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def mmnist_captions(seed: int = 0):
    """(one-digit captions (all 40), two-digit captions for training, held-out two-digit captions)."""
    one = [(d, m) for d in range(10) for m in DIRECTIONS]
    singles = [clip_caption([d], [m]) for d, m in one]
    pairs = [clip_caption([a[0], b[0]], [a[1], b[1]]) for a in one for b in one]
    random.Random(f"mmnist-{seed}").shuffle(pairs)
    cut = len(pairs) // 10
    return singles, pairs[cut:], pairs[:cut]


def prompt_mix(n_general: int, weight: float, seed: int, template_share: float = 0.4, empty_share: float = 0.0):
    """General prompts plus Moving-MNIST captions making up ``weight`` of the list; distillation samples
    the list uniformly. Of the captions, ``template_share`` are template ones (drawn with replacement:
    6 in 10 one-digit, as the shipped video models are trained, 3 in 10 two-digit, 1 in 10 still), the
    rest varied wordings in the same shares. Then "" is added to make up ``empty_share`` of the list."""
    if not 0 <= empty_share < 1:
        raise ValueError(f"--empty-share={empty_share} is not allowed: use 0 <= s < 1")
    if not 0 <= weight < 1:
        raise ValueError(f"--mmnist-weight={weight} is not allowed: use 0 <= w < 1")
    if not 0 <= template_share <= 1:
        raise ValueError(f"--template-share={template_share} is not allowed: use 0 <= s <= 1")
    general = make_prompts(n_general, "train", seed)
    singles, pairs, _ = mmnist_captions(seed)
    stills = [clip_caption([d], [STILL]) for d in range(10)]
    n = round(n_general * weight / (1 - weight))
    n_template = round(n * template_share)
    rng = random.Random(f"mix-{seed}")
    captions = []
    for _ in range(n_template):
        pick = rng.random()
        captions.append(rng.choice(stills if pick < 0.1 else singles if pick < 0.7 else pairs))
    varied = caption_corpus(n - n_template, seed, two_digits=1 / 3, still=0.1)
    mix = general + captions + varied
    return mix + [""] * round(len(mix) * empty_share / (1 - empty_share))


def token_evals(seed: int) -> dict:
    """Caption sets for the token cosine: the 40 one-digit template captions (what the video models are
    trained and scored on) and held-out wordings."""
    singles = mmnist_captions(seed)[0]
    return {"mmnist_1digit": singles, "heldout_wordings": caption_corpus(120, seed + 1, held_out=True)}


def similarities(model, teacher, tok, evals, device, tokens: dict | None = None, reader=None) -> dict:
    """Sentence-embedding cosine per set of ``evals``; with ``tokens`` the mean token cosine per set of it
    (keys ``tokens_<set>``), and with ``reader`` too the similarity of the reads (``reads_<set>``)."""
    out = {name: round(sentence_similarity(model, teacher, tok, prompts, device=device), 5)
           for name, prompts in evals.items()}
    for name, prompts in (tokens or {}).items():
        out[f"tokens_{name}"] = round(token_similarity(model, teacher, tok, prompts, device=device), 5)
        if reader is not None:
            out[f"reads_{name}"] = round(read_similarity(model, teacher, tok, prompts, reader, device=device), 5)
    return out


def load_reader(names, device):
    """``CrossAttentionReader`` over the transformers of the pipelines ``names`` (shipped names or
    folders); None when ``names`` is empty."""
    if not names:
        return None
    from mediagen.models.converted import MHLAWanTransformer3DModel
    from mediagen.pipelines.shipping import shipped_checkpoint

    transformers = []
    for name in names:
        folder = shipped_checkpoint(name) or Path(name)
        if not (folder / "transformer" / "config.json").is_file():
            raise ValueError(f"--reader {name!r} is neither a shipped video model nor a pipeline folder with a "
                             "transformer/ in it")
        transformers.append(MHLAWanTransformer3DModel.from_pretrained(folder / "transformer",
                                                                      torch_dtype=torch.float32))
    return CrossAttentionReader(transformers).to(device)


def initial_student(name, args):
    """MiniLM's calibrated initialisation, or the saved encoder ``--init`` names (same attention); with
    ``--echo`` it reads each prompt twice (``MediagenTextEncoder``'s ``echo``)."""
    if args.init is None:
        model = encoder_from_minilm(name, calibration_prompts=args.calibration_prompts)
    else:
        model = load_text_encoder(args.init).model
        if model.config.attention != name:
            raise ValueError(f"--init {args.init} holds a {model.config.attention!r} encoder, not {name!r}: "
                             "distil one encoder at a time with --encoders")
    if args.echo:
        model.register_to_config(echo=True)
    return model


def run_one(name, args, teacher, tok, prompts, evals, tokens, device, reader=None) -> dict:
    # not measure: one distillation's elapsed times, spent against --time-limit, not a repeated call
    t0 = time.perf_counter()
    student = initial_student(name, args).to(device)
    init_s = time.perf_counter() - t0
    t_eval = time.perf_counter()
    before = similarities(student, teacher, tok, evals, device, tokens, reader)
    eval_s = time.perf_counter() - t_eval
    # left for training: the budget minus what is spent, one more evaluation, a reload check and saving
    budget = None
    if args.time_limit is not None:
        budget = max(args.time_limit - (time.perf_counter() - t0) - 2 * eval_s - 5.0, 5.0)
    print(f"[{name}] init {init_s:.1f}s, evaluation {eval_s:.1f}s, similarity before: {before}; "
          f"training budget {'none' if budget is None else f'{budget:.0f}s'}", flush=True)
    cfg = DistillConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, max_length=args.max_length,
                        seed=args.seed, log_every=args.log_every, train_only=args.train_only,
                        time_limit=budget, reader_weight=args.reader_weight)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    history = distill(student, teacher, tok, cfg, prompts=prompts, device=device, progress=sys.stderr.isatty(),
                      reader=reader)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_s = time.perf_counter() - t1
    steps = history[-1]["step"] + 1
    for h in history:
        print(f"[{name}] step {h['step']}: " + ", ".join(f"{k} {v:.4f}" for k, v in h.items()
                                                          if isinstance(v, float)), flush=True)
    after = similarities(student, teacher, tok, evals, device, tokens, reader)
    print(f"[{name}] {steps} steps in {train_s:.1f}s ({steps / train_s:.2f} steps/s), "
          f"similarity after: {after}", flush=True)
    folder = Path(args.out_dir) / FOLDERS.get(name, f"text-{name}")
    info = PromptEncoder(tok, student.cpu(), kind="mediagen").save_pretrained(folder, slim=True,
                                                                             dtype=DTYPES[args.save_dtype])
    reloaded = load_text_encoder(str(folder), device=device).model
    loaded = similarities(reloaded, teacher, tok, {"heldout": evals["heldout"]}, device)["heldout"]
    print(f"[{name}] wrote {folder}: {info['bytes'] / 1e6:.2f} MB ({info['stored'] / 1e6:.2f}M params stored, "
          f"{info['from_base'] / 1e6:.2f}M from MiniLM); reloaded held-out similarity {loaded}", flush=True)
    return {"folder": str(folder), "bytes": info["bytes"], "stored_params": info["stored"],
            "base_params": info["from_base"], "dtype": info["dtype"], "steps": steps,
            "steps_requested": args.steps, "stopped": history[-1].get("stopped"),
            "batch_size": args.batch_size, "init_s": round(init_s, 2), "eval_s": round(eval_s, 2),
            "train_budget_s": None if budget is None else round(budget, 1), "train_s": round(train_s, 2),
            "steps_per_s": round(steps / train_s, 3), "wall_s": round(time.perf_counter() - t0, 2),
            "similarity_before": before, "similarity_after": after, "heldout_after_reload": loaded,
            "final_loss": history[-1]["loss"], "history": history}


def markdown(summary) -> str:
    evals = list(next(iter(summary["encoders"].values()))["similarity_before"]) if summary["encoders"] else []
    lines = [f"## Distilled text encoders ({summary['device']}, torch {summary['torch']}, fla "
             f"{'yes' if summary['fla'] else 'no'}, train_only={summary['args']['train_only']})", "",
             "Cosine to MiniLM's sentence embeddings (tokens_*: mean cosine of the token states), init → "
             "distilled (" + "; ".join(
                 f"{e}: {summary['eval_sizes'][e]} prompts" for e in evals) + ").", "",
             "| encoder | steps | batch | train s | steps/s | wall s | " + " | ".join(evals) + " | slim folder |",
             "|---|---|---|---|---|---|" + "---|" * len(evals) + "---|"]
    for name, r in summary["encoders"].items():
        sims = " | ".join(f"{r['similarity_before'][e]:.4f} → {r['similarity_after'][e]:.4f}" for e in evals)
        stop = (" (time limit)" if r["stopped"] else
                f" of {r['steps_requested']}" if r["steps"] < r["steps_requested"] else "")
        lines.append(f"| {name} | {r['steps']}{stop} | {r['batch_size']} | {r['train_s']:.1f} | "
                     f"{r['steps_per_s']:.2f} | {r['wall_s']:.1f} | {sims} | {r['bytes'] / 1e6:.2f} MB {r['dtype']} |")
    lines += ["", f"Total wall time {summary['wall_s']:.1f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", required=True, help="writes text-mlra/, text-hla/ and the summary here")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="e.g. cuda:1")
    p.add_argument("--encoders", nargs="+", default=["mlra2", "hla"], choices=["mlra2", "mlra4", "hla", "sdpa"])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--time-limit", type=float, default=140.0,
                   help="seconds per encoder, all included; training gets the rest (fewer steps if needed, "
                        "stop and save past it); 0 = no limit")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--train-only", default="attention", help="'attention' (slim), 'all', or a name regex")
    p.add_argument("--train-prompts", type=int, default=20000)
    p.add_argument("--mmnist-weight", type=float, default=0.7,
                   help="share of Moving-MNIST captions (what the video models read) in the prompt mix")
    p.add_argument("--template-share", type=float, default=0.4,
                   help="share of the captions in the template wording; the rest in varied wordings")
    p.add_argument("--empty-share", type=float, default=0.0,
                   help="share of empty prompts (classifier-free guidance's negative prompt) in the mix")
    p.add_argument("--reader", nargs="*", default=[],
                   help="video models (shipped names or folders) whose cross-attention reads join the loss")
    p.add_argument("--reader-weight", type=float, default=1.0)
    p.add_argument("--echo", action="store_true",
                   help="the student reads each prompt twice and returns the second copy's states (every token "
                        "then sees the whole prompt; the attention stays causal)")
    p.add_argument("--init", default=None,
                   help="a saved encoder folder to continue from (default: MiniLM's calibrated initialisation)")
    p.add_argument("--heldout-prompts", type=int, default=512)
    p.add_argument("--calibration-prompts", type=int, default=256)
    p.add_argument("--save-dtype", default="fp16", choices=list(DTYPES))
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        p.error(f"--steps={args.steps} and --batch-size={args.batch_size} must be >= 1")
    if args.reader_weight < 0 or not 0 <= args.empty_share < 1:
        p.error(f"--reader-weight={args.reader_weight} must be >= 0 and --empty-share={args.empty_share} in [0, 1)")
    if args.time_limit is not None and args.time_limit <= 0:
        args.time_limit = None
    device = torch.device(args.device)
    if device.type == "cuda":
        if device.index is not None:
            torch.cuda.set_device(device)                              # Triton (fla) launches on the current one
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    from diffusers.utils import logging as diffusers_logging
    diffusers_logging.set_verbosity_error()
    start = time.perf_counter()  # the whole run's wall clock (summary wall_s), not measure's repeated call
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    teacher, tok = load_minilm(device=device), load_minilm_tokenizer()
    singles, _, held_pairs = mmnist_captions(args.seed)
    tokens = token_evals(args.seed)
    evals = {"heldout": make_prompts(args.heldout_prompts, "heldout"), "mmnist_1digit": singles,
             "mmnist_2digit_heldout": held_pairs, "heldout_wordings": tokens["heldout_wordings"]}
    prompts = prompt_mix(args.train_prompts, args.mmnist_weight, args.seed, args.template_share, args.empty_share)
    reader = load_reader(args.reader, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    summary = {"device": f"{name} ({device})", "torch": torch.__version__, "fla": fla_available(),
               "args": vars(args), "eval_sizes": {**{k: len(v) for k, v in evals.items()},
                                                  **{f"tokens_{k}": len(v) for k, v in tokens.items()},
                                                  **{f"reads_{k}": len(v) for k, v in tokens.items() if reader}},
               "train_prompts": len(prompts), "encoders": {}}
    print(f"device {summary['device']}, fla {summary['fla']}, {len(prompts)} training prompts "
          f"({args.mmnist_weight:.0%} Moving-MNIST captions, {args.template_share:.0%} of them template)", flush=True)
    for enc in args.encoders:
        summary["encoders"][enc] = run_one(enc, args, teacher, tok, prompts, evals, tokens, device, reader)
        summary["wall_s"] = round(time.perf_counter() - start, 2)
        (out / "distill_text_encoders.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["wall_s"] = round(time.perf_counter() - start, 2)
    (out / "distill_text_encoders.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = markdown(summary)
    (out / "distill_text_encoders.md").write_text(text)
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
