"""CachedLaunch (mediagen/kernels/launch.py): the first launch goes through Triton's dispatch, later ones call
the compiled kernel directly with every parameter in the kernel's order, and anything that would make Triton
pick another compiled kernel (a dtype, a misaligned pointer, another kernel) goes through the dispatch again.

A stand-in kernel records both paths, so this runs without a GPU; tests/test_mhla_triton.py checks the op's
results on the direct path on a GPU."""

import pytest
import torch

from mediagen.kernels.switches import use_switches
from mediagen.kernels.launch import CachedLaunch


def _fn(X, Y, n, scale, BLOCK, FLAG, MODE=7):  # the stand-in kernel's parameters, as a @triton.jit function has them
    pass


class _Compiled:
    def __init__(self, calls, key):
        self.calls, self.key = calls, key
        self.run = object()  # a compiled kernel has a launcher

    def __getitem__(self, grid3):
        def runner(*args):
            self.calls.append(("direct", self.key, grid3, args))
        return runner


class _Kernel:
    """Stands in for a @triton.jit kernel: ``kernel[grid](...)`` records a dispatch and returns a compiled kernel
    (one per dtype of the first tensor, as Triton compiles one per specialisation), or None like the interpreter
    when ``compiles`` is False."""

    fn = staticmethod(_fn)

    def __init__(self, compiles=True):
        self.calls, self.compiles = [], compiles

    def __getitem__(self, grid):
        def dispatch(*args, **kwargs):
            self.calls.append(("dispatch", grid, args, kwargs))
            return _Compiled(self.calls, args[0].dtype) if self.compiles else None
        return dispatch


def _record():
    return CachedLaunch((3, 2), (5, 0.5), dict(BLOCK=16, FLAG=True, num_warps=4, num_stages=2))


def _tensors(dtype=torch.float32):
    return torch.zeros(8, dtype=dtype), torch.zeros(8, dtype=dtype)


def test_the_second_launch_calls_the_compiled_kernel_with_every_parameter_in_order():
    kernel, launch = _Kernel(), _record()
    x, y = _tensors()
    launch(kernel, x, y)
    launch(kernel, x, y)
    launch(kernel, *_tensors())  # other tensors of the same dtypes: still direct
    dispatch, direct, again = kernel.calls
    assert dispatch[0] == "dispatch" and dispatch[1] == (3, 2)
    assert dispatch[2][2:] == (5, 0.5)
    assert dispatch[3] == dict(BLOCK=16, FLAG=True, num_warps=4, num_stages=2)
    # the launcher takes every kernel parameter (constexprs and defaults too), never the launch options; the
    # tensors as their data pointers
    assert direct[0] == "direct" and direct[2] == (3, 2, 1)
    assert direct[3] == (x.data_ptr(), y.data_ptr(), 5, 0.5, 16, True, 7)
    assert all(type(a) is int for a in direct[3][:2])
    assert again[0] == "direct"


def test_another_dtype_dispatches_and_its_compiled_kernel_is_kept():
    kernel, launch = _Kernel(), _record()
    launch(kernel, *_tensors())
    launch(kernel, *_tensors(torch.float16))
    launch(kernel, *_tensors(torch.float16))
    assert [c[0] for c in kernel.calls] == ["dispatch", "dispatch", "direct"]
    assert kernel.calls[2][1] == torch.float16  # the fp16 compiled kernel, not the fp32 one


def test_a_misaligned_pointer_always_dispatches():
    kernel, launch = _Kernel(), _record()
    x, y = _tensors()
    odd = torch.zeros(9)[1:]  # 4 bytes past a 16-byte boundary: Triton compiles another variant for it
    assert odd.data_ptr() % 16
    launch(kernel, x, y)
    launch(kernel, odd, y)
    launch(kernel, odd, y)
    launch(kernel, x, y)
    assert [c[0] for c in kernel.calls] == ["dispatch", "dispatch", "dispatch", "dispatch"]
    launch(kernel, x, y)
    assert kernel.calls[-1][0] == "direct"


def test_a_tensor_on_another_device_type_dispatches(monkeypatch):
    """The key counts the CUDA tensors: where one argument's device type differs from the launch the record was
    made for, the call goes through the dispatch (which checks it) rather than to the launcher as a bare pointer.
    (A stand-in for a CUDA tensor here: ``is_cuda`` true, CPU memory.)"""

    class _FakeCuda(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kernel, launch = _Kernel(), _record()
    x, y = _tensors()
    cx, cy = x.as_subclass(_FakeCuda), y.as_subclass(_FakeCuda)
    launch(kernel, cx, cy)
    launch(kernel, cx, cy)
    launch(kernel, cx, y)  # one CPU tensor among CUDA ones
    assert [c[0] for c in kernel.calls] == ["dispatch", "direct", "dispatch"]


def test_another_kernel_object_dispatches():
    """A kernel swapped in (a benchmark's timer, a test's recorder) sees its launches."""
    first, second, launch = _Kernel(), _Kernel(), _record()
    launch(first, *_tensors())
    launch(second, *_tensors())
    assert [c[0] for c in first.calls] == ["dispatch"] and [c[0] for c in second.calls] == ["dispatch"]


def test_no_compiled_kernel_means_every_launch_dispatches():
    """The CPU interpreter's dispatch returns no compiled kernel."""
    kernel, launch = _Kernel(compiles=False), _record()
    for _ in range(3):
        launch(kernel, *_tensors())
    assert [c[0] for c in kernel.calls] == ["dispatch"] * 3


def test_direct_launches_can_be_switched_off():
    kernel, launch = _Kernel(), _record()
    with use_switches(direct_launch=False):
        for _ in range(2):
            launch(kernel, *_tensors())
    assert [c[0] for c in kernel.calls] == ["dispatch"] * 2


def test_a_parameter_without_a_value_is_named():
    kernel = _Kernel()
    launch = CachedLaunch((1,), (5, 0.5), dict(BLOCK=16))  # FLAG missing: the dispatch would have failed
    with pytest.raises(TypeError, match="FLAG"):
        launch(kernel, *_tensors())


def test_switches_are_replaced_for_a_block_and_restored():
    """use_switches replaces fields for the block, process-wide (a backward on autograd's worker thread sees
    them), restores them on exit, also by an exception, and names the switches when given an unknown one."""
    import threading

    from mediagen.kernels.switches import empty_output, kernel_switches

    before = kernel_switches()
    seen = []
    with pytest.raises(RuntimeError):
        with use_switches(poison_outputs=True):
            thread = threading.Thread(target=lambda: seen.append(kernel_switches().poison_outputs))
            thread.start()
            thread.join()
            assert torch.isnan(empty_output((2, 3), "cpu")).all()
            raise RuntimeError
    assert seen == [True] and kernel_switches() == before
    with pytest.raises(ValueError, match="poison_outputs"):
        with use_switches(poison=True):
            pass


def test_readout_settings_are_replaced_for_a_block():
    from mediagen.text.kernels.hla.triton_readout import readout_settings, use_readout_settings

    before = readout_settings()
    with use_readout_settings(BT64=128, warps=8) as now:
        assert (now.BT64, now.warps, now.BT128) == (128, 8, before.BT128)
    assert readout_settings() == before
    with pytest.raises(ValueError, match="BT64"):
        with use_readout_settings(BT=64):
            pass
