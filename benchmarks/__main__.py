"""One entry for the benchmarks: ``python -m benchmarks NAME [options]`` runs benchmarks/NAME.py with the options
(``python -m benchmarks NAME --help`` lists them); ``python -m benchmarks`` lists the names. Run it from the
repository root. Measured numbers, with command, commit, date and device: benchmarks/RESULTS.md; a GPU lease's
set of runs: benchmarks/gpu_session.sh."""

import runpy
import sys

# name -> what it measures; each is benchmarks/<name>.py, --tiny (or the smallest options) runs it on a CPU
BENCHMARKS = {
    "attention": "the MHLA op per shape against every SDPA backend, fwd and fwd+bwd, eager and CUDA graph "
                 "(--sweep: under other launch settings, --profile: per kernel)",
    "wan_model": "a Wan2.1-1.3B-sized transformer's forward and one attention layer: sdpa, mhla, hybrid, floors",
    "dit_images": "DiT-XL/2 images per second of a sampling step, or of a training step (--train)",
    "dit_eager_bisect": "DiT-XL/2 256 px eager sampling step, sdpa and mhla interleaved in one process, with a noise "
                        "control and the 2026-12-01 op's factors put back one at a time (--dry-run: on a CPU)",
    "image_latency": "sampling time of the shipped class-to-image models (the app's Image tab)",
    "video_latency": "text-to-video sampling latency per clip of several pipelines side by side, per runtime: "
                     "median s, peak memory, tokens per clip, speed against the first",
    "text_encoders": "SDPA / MLRA / HLA text encoders: encoding, decoding with a cache, HLA chunk skipping "
                     "(--readout: under other HLA readout launch settings)",
    "profile_hla": "one HLA layer's time stage by stage, beside causal SDPA",
    "kernel_resources": "registers, spills and shared memory of the MHLA kernels, compiled for sm_90a (no GPU needed)",
    "train_step_profile": "where a training step's time goes (attention, matmuls, norms, optimizer, other, host "
                          "wait), from a YAML config's run under torch.profiler",
    "sequence_parallel": "sequence-parallel MHLA on several GPUs (torchrun): agreement with one GPU, bytes sent per "
                         "layer, the Wan-1.3B-sized forward and training step against one GPU",
    "saved_activations": "bytes a Wan2.1-1.3B-sized MHLA block saves for backward, output norm + projection fused "
                         "and apart (--peak: a checkpointed training step's peak on a GPU)",
}
# the other scripts here: runs that produce the docs' samples, scores and checkpoints, called by the GPU scripts
TOOLS = {
    "video_samples": "sample the scored text-to-video grid of pipelines and time their sampling",
    "record_model_latency": "merge video_latency --out JSON files into the shipped sampling time per clip "
                            "(mediagen/eval/recorded/model_latency.json, the app's Benchmarks tab)",
    "video_samples_grid": "picture of sampled clips, one panel per model (docs/RESULTS.md)",
    "dit_samples_grid": "picture of class-conditional digit samples, one band per model (docs/RESULTS.md)",
    "fid_curve": "FID / KID of a training run's checkpoints, step by step",
    "time_reversal": "how far a text-to-video model tells a clip from its reverse; the caption-direction gap",
    "caption_reliance": "how much a video model's digit pixels depend on the caption's digit, by noise level",
    "distill_text_encoders": "distil the shipped MLRA / HLA text encoders from MiniLM",
    "encoder_clips": "a video model's clips through each text encoder, drawn as the app draws them, scored",
    "dense_grad_cases": "the dense backward's half-precision gradients against fp64, launch variant by variant",
    "compare_loss_curves": "compare the per-step losses of two training runs' metrics.jsonl",
    "export_minilm": "a half-precision copy of all-MiniLM-L6-v2 for a machine without its wheel",
    "text_binding": "how far a text encoder's token states tie each digit of a two-digit caption to its own way",
}


def listing() -> str:
    width = max(map(len, {**BENCHMARKS, **TOOLS}))
    lines = ["usage: python -m benchmarks NAME [options]    (NAME --help: its options)", "", "benchmarks:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in BENCHMARKS.items()]
    lines += ["", "tools:"] + [f"  {name:<{width}}  {text}" for name, text in TOOLS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    name = argv[0].replace("-", "_")
    if name not in BENCHMARKS and name not in TOOLS:
        print(f"unknown benchmark {argv[0]!r}\n\n{listing()}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m benchmarks {name}", *argv[1:]]  # the script's own argparse reads them
    runpy.run_module(f"benchmarks.{name}", run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
