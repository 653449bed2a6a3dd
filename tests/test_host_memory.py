"""keep_freed_memory: glibc serves blocks up to the limit from its heap and keeps freed memory there."""

import platform
import subprocess
import sys
import textwrap

import pytest

from mediagen import cli
from mediagen.host_memory import keep_freed_memory

# In a fresh process: bytes glibc holds in mmapped blocks (mallinfo2().hblkhd) while a 48 MiB block is alive,
# with and without keep_freed_memory first (48 MiB is above the default threshold's 32 MiB ceiling).
PROBE = textwrap.dedent("""
    import ctypes, sys
    from mediagen.host_memory import keep_freed_memory

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    block = libc.malloc(48 << 20)
    print(libc.mallinfo2().hblkhd)
    libc.free(ctypes.c_void_p(block))
""")


def _mapped_bytes(mode):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt and mallinfo2 only")
def test_large_blocks_come_from_the_heap():
    assert _mapped_bytes("default") >= 48 << 20  # glibc maps a block this large of its own
    assert _mapped_bytes("keep") < 48 << 20       # kept: from the heap, and freed back to it


def test_bad_limit_is_refused():
    with pytest.raises(ValueError, match="limit=1024 is not allowed"):
        keep_freed_memory(1024)


def test_the_console_script_keeps_freed_memory(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("mediagen.host_memory.keep_freed_memory", lambda *a: calls.append(a) or True)
    assert cli.main([]) == 0
    assert calls == [()]
