"""Evaluation: FID/KID, VBench-style video scores, attention diagnostics, latency benchmarks.

    mediagen fid --samples DIR|NPZ | --checkpoint PATH  --reference mnist|DIR|STATS.npz
                 --features mnist|effnet-lite0|inception  [--num-samples N] [--out outputs/fid.json]
    mediagen vbench --videos DIR | --checkpoint PATH  --prompts FILE  [--subject-features effnet-lite0]
    mediagen bench [--e2e] [--plot latency.png]

Modules, one purpose each:
    features.py           FID feature extractors (clean-fid's custom_feat_extractor contract)
    fid.py                feature extraction loop, Fréchet distance, KID
    reference.py          reference sets: shipped MNIST, folders, statistics files
    image_io.py           image folders / .npz in and out
    sampling.py           the one bridge to mediagen.pipelines (checkpoint -> images / videos)
    digit_classifier.py   the shipped MNIST classifier (train_digit_classifier.py retrains it)
    vbench_quality.py     flickering, consistency, motion smoothness, dynamic degree
    moving_mnist.py       Moving-MNIST semantic scores (identity, direction, count)
    vbench_score.py       VBench normalisation and Quality / Semantic / Total
    vbench.py             scoring a set of videos; video_io.py, frame_features.py helpers
    attention_maps.py     dense attention matrices, rank, entropy, recorder
    attention_bench.py, e2e_bench.py, latency_plot.py, bench_report.py   latency
    timing.py, tables.py  timing a callable (measure) and the one markdown table writer
Heavy imports stay inside functions so ``import mediagen.eval`` is cheap.
"""
