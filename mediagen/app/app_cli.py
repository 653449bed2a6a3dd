"""``mediagen app``: the Gradio app on this machine (127.0.0.1 by default).

    mediagen app                          # http://127.0.0.1:7860
    mediagen app --port 8000 --concurrency 1 --max-queue 16 --device cpu

Models load once at start (``--no-preload`` loads each on first use) and stay cached. The bounds on
a request default to the device's (``Limits.for_device``); the flags override them.
"""

from __future__ import annotations

import torch

from .limits import Limits


def register(sub):
    p = sub.add_parser("app", help="launch the Gradio app (image, video, compare, benchmarks)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is a GPU)")
    p.add_argument("--concurrency", type=int, default=2, help="requests run at once per endpoint")
    p.add_argument("--max-queue", type=int, default=32, help="requests waiting at most; more are turned away")
    p.add_argument("--max-side", type=int, default=None,
                   help="largest height/width in pixels (default: by device, Limits.for_device: 64 on cpu or the "
                        "served video models' largest trained size, 128 on cuda)")
    p.add_argument("--max-frames", type=int, default=None,
                   help="default: 17 on cpu or the served video models' largest trained size, 33 on cuda")
    p.add_argument("--max-steps", type=int, default=None, help="default: 20 on cpu, 50 on cuda")
    p.add_argument("--max-batch", type=int, default=None, help="default: 2 on cpu, 4 on cuda")
    p.add_argument("--max-request-s", type=float, default=None,
                   help="refuse a request estimated to take longer (default: 90 on cpu, 120 on cuda)")
    p.add_argument("--checkpoints", default=None, help="folder of shipped checkpoints (see mediagen.app.models)")
    p.add_argument("--results", default=None, help="recorded latency JSON (default: the one shipped in mediagen/eval/recorded)")
    p.add_argument("--output-dir", default=None, help="where outputs are written (default: a temp folder)")
    p.add_argument("--no-preload", action="store_true", help="load models on first use instead of at start")
    p.set_defaults(func=run)


def _positive(name: str, value):
    if value is not None and value <= 0:
        raise ValueError(f"--{name} {value} is not allowed: use a positive number")
    return value


def launch(app, host: str = "127.0.0.1", port: int | None = 7860, concurrency: int = 2, max_queue: int = 32,
           block: bool = True):
    """Build the page for ``app`` and serve it; returns (demo, local_url). ``block=False`` returns
    at once (``launch(prevent_thread_lock=True)``), as the tests need."""
    from gradio.route_utils import FnIndexInferError

    from .ui import build_demo, unknown_endpoint_handler

    demo = build_demo(app, concurrency=concurrency, max_queue=max_queue)
    _, url, _ = demo.launch(server_name=host, server_port=port, prevent_thread_lock=not block, share=False,
                            allowed_paths=[str(app.output_root)], show_error=True, quiet=not block,
                            app_kwargs={"exception_handlers": {FnIndexInferError: unknown_endpoint_handler(demo)}})
    return demo, url


def run(args) -> int:
    from .handlers import MediagenApp
    from .models import default_device, default_models, served_size

    device = torch.device(args.device) if args.device else None
    if device is not None and device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    models = default_models(args.checkpoints)
    limits = Limits.for_device(device or default_device(), served=served_size(models.video),
                               max_side=_positive("max-side", args.max_side),
                               max_frames=_positive("max-frames", args.max_frames),
                               max_steps=_positive("max-steps", args.max_steps),
                               max_batch=_positive("max-batch", args.max_batch),
                               max_request_s=_positive("max-request-s", args.max_request_s))
    app = MediagenApp(models, limits, device, args.output_dir, args.results)
    if not args.no_preload:
        app.cache.preload()
    print(f"mediagen app on {app.cache.device.type}; outputs in {app.output_root}")
    launch(app, args.host, args.port, _positive("concurrency", args.concurrency), _positive("max-queue", args.max_queue))
    return 0
