"""Headless Chromium for the app's browser test: find it, install Debian's ``chromium`` when it is
missing (as root, through apt-get), and render a page to a screenshot and a DOM dump.

Installation failures raise ``BrowserUnavailable`` with apt's output, so the test fails with the
reason instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


class BrowserUnavailable(RuntimeError):
    pass


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(cmd, timeout):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def install_chromium(timeout: int = 900) -> str:
    """Path of a Chromium binary, installing Debian's package first when there is none."""
    found = find_chromium()
    if found:
        return found
    if os.geteuid() != 0:
        raise BrowserUnavailable("chromium is not installed and the tests are not running as root, so they "
                                 "cannot install it: run `apt-get install -y chromium` (Debian) first")
    if shutil.which("apt-get") is None:
        raise BrowserUnavailable("chromium is not installed and there is no apt-get to install it with")
    log = []
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        try:
            result = _run(cmd, timeout)
        except subprocess.TimeoutExpired:
            raise BrowserUnavailable(f"`{' '.join(cmd)}` did not finish within {timeout} s") from None
        log.append(f"$ {' '.join(cmd)} -> {result.returncode}\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        if result.returncode != 0:
            raise BrowserUnavailable("installing chromium failed:\n" + "\n".join(log))
    found = find_chromium()
    if not found:
        raise BrowserUnavailable("apt-get installed chromium but no chromium binary is on PATH:\n" + "\n".join(log))
    return found


def render_page(binary: str, url: str, screenshot: Path, size=(1280, 1600), budget_ms: int = 15000,
                timeout: int = 120) -> str:
    """Screenshot ``url`` to ``screenshot`` (PNG) and return the rendered DOM (after scripts ran)."""
    screenshot = Path(screenshot)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        common = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                  f"--virtual-time-budget={budget_ms}"]
        shot = _run([*common, f"--screenshot={screenshot}", url], timeout)
        if shot.returncode != 0 or not screenshot.is_file():
            raise BrowserUnavailable(f"chromium --screenshot failed ({shot.returncode}): {shot.stderr[-2000:]}")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        common = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                  f"--virtual-time-budget={budget_ms}"]
        dom = _run([*common, "--dump-dom", url], timeout)
        if dom.returncode != 0:
            raise BrowserUnavailable(f"chromium --dump-dom failed ({dom.returncode}): {dom.stderr[-2000:]}")
    return dom.stdout


# Helpers for a script that drives the app inside an iframe of a page served from the app's own origin
# (so the script can read and click the app's DOM). Headless Chromium's virtual time runs ahead of the
# server's real work, so a poll waits by a synchronous request to ``sleep_url``, which answers after
# 0.1 s of real time. ``log(line)`` appends a line to the page's <pre id="result">.
HARNESS = """<!doctype html><html><body>
<iframe id="app" src="{app_url}" style="width:1280px;height:1500px"></iframe><pre id="result"></pre>
<script>
const lines = [];
const log = (line) => {{ lines.push(line); document.getElementById('result').textContent = lines.join('\\n'); }};
const doc = () => document.getElementById('app').contentDocument;
const pause = async (ticks) => {{ for (let i = 0; i < ticks; i++) {{
  const x = new XMLHttpRequest(); x.open('GET', '{sleep_url}', false); x.send();
  await new Promise(r => setTimeout(r, 0)); }} }};
const until = async (cond, ticks) => {{ for (let i = 0; i < ticks; i++) {{
  try {{ if (cond()) return true; }} catch (e) {{}} await pause(1); }} return false; }};
const numberBox = (label) => [...doc().querySelectorAll('.block')].find(b => {{
  const l = b.querySelector('label, [data-testid="block-info"]');
  return l && l.textContent.trim().startsWith(label) && b.querySelector('input[type=number]'); }})
  ?.querySelector('input[type=number]');
const type = (input, value) => {{
  Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(input, value);
  for (const e of ['input', 'change', 'blur']) input.dispatchEvent(new Event(e, {{bubbles: true}})); }};
const choose = (label) => [...doc().querySelectorAll('label')].find(l => l.textContent.trim() === label)
  .querySelector('input').click();
(async () => {{ try {{ {script} }} catch (e) {{ log('exception: ' + e); }} log('done'); }})();
</script></body></html>"""


def drive_page(binary: str, page_url: str, budget_ms: int = 600000, timeout: int = 240) -> list[str]:
    """Load ``page_url`` (a ``HARNESS`` page) in headless Chromium and return the lines its script logged."""
    import html
    import re

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        dom = _run([binary, *FLAGS, f"--user-data-dir={profile}", "--window-size=1300,1600",
                    f"--virtual-time-budget={budget_ms}", "--dump-dom", page_url], timeout)
    if dom.returncode != 0:
        raise BrowserUnavailable(f"chromium --dump-dom failed ({dom.returncode}): {dom.stderr[-2000:]}")
    found = re.search(r'<pre id="result">(.*?)</pre>', dom.stdout, re.S)
    return html.unescape(found[1]).splitlines() if found else []
