"""The Gradio app (``mediagen app``): generate images and videos, compare attention and text-encoder
configurations side by side, plot recorded latency.

Modules, one purpose each:
    app_cli.py        the ``mediagen app`` subcommand and ``launch``
    ui.py             the page: tabs Image, Video, Compare, Benchmarks (one API endpoint each)
    handlers.py       the request functions behind the endpoints (checks, outputs)
    models.py         which models are served (``default_models``) and the load-once cache
    sizes.py          output sizes and token grids of the served models
    generation.py     one generation timed per stage (text encoding, denoising, decoding)
    compare.py        the Compare run: reference first, quality against it
    similarity.py     PSNR and SSIM;  scores.py  digit-classifier and VBench-style scores
    bench_results.py  latency rows recorded in the package (eval/recorded) or from a fresh run
    limits.py         bounds on requests, with readable errors;  files.py  where outputs go
Gradio is imported only here, never below.
"""
