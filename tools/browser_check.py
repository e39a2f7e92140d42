"""Open every lab notebook in JupyterLab in a headless browser, run all cells, report what a reader would see.

    pip install jupyterlab playwright      # and a Chromium: /usr/bin/chromium or `playwright install chromium`
    python tools/browser_check.py                      # every lab
    python tools/browser_check.py 04_vae_lb --shots /tmp/shots

Optional and slow (it runs every lab once more, in a real browser), so it is not
part of `pytest`. Per lab it reports: whether the tab is marked modified right
after opening (the committed notebook is not what JupyterLab would write), the
cells whose run raised, the stderr boxes (JupyterLab draws them red), and one
screenshot. The labs are copied to a temporary folder first, so JupyterLab's
autosave never touches the committed notebooks.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

# Run in the page: the open notebook's state, read from JupyterLab's own model.
NOTEBOOK_STATE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.model.cells;
  const out = {dirty: panel.context.model.dirty, errors: [], stderr: [], images: 0, running: 0};
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') continue;
    const prompt = panel.content.widgets[i].promptNode;
    if (prompt && prompt.textContent.includes('*')) out.running += 1;
    for (const o of cell.outputs.toJSON()) {
      if (o.output_type === 'error') out.errors.push(`cell ${i}: ${o.ename}: ${String(o.evalue).slice(0, 200)}`);
      if (o.output_type === 'stream' && o.name === 'stderr') {
        const text = Array.isArray(o.text) ? o.text.join('') : o.text;
        out.stderr.push(`cell ${i}: ${text.trim().split('\\n')[0].slice(0, 200)}`);
      }
      if (o.data && Object.keys(o.data).some(k => k.startsWith('image/'))) out.images += 1;
    }
  }
  return out;
}"""


# Shut the kernel down and close the tab without the "save changes?" dialog (the copy is thrown away).
CLOSE_NOTEBOOK = """async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  await panel.sessionContext.shutdown();
  panel.context.model.dirty = false;
  panel.dispose();
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(root: Path, port: int, token: str) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.workspaces_dir={root / '.workspaces'}",
            f"--LabApp.user_settings_dir={root / '.settings'}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
            return server
        except OSError:
            time.sleep(1)
    server.terminate()
    raise SystemExit("JupyterLab did not start within 120 s")


def first_change(committed: Path, saved: Path) -> str:
    """What JupyterLab changed when it saved a notebook it had just opened ('' if nothing)."""
    a, b = json.loads(committed.read_text()), json.loads(saved.read_text())
    for key in sorted(set(a["metadata"]) | set(b["metadata"])):
        old, new = a["metadata"].get(key), b["metadata"].get(key)
        if old != new and isinstance(old, dict) and isinstance(new, dict):
            inner = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            return f"notebook metadata {key}: " + ", ".join(
                f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in inner
            )
        if old != new:
            return f"notebook metadata {key}: {old!r} -> {new!r}"
    for i, (x, y) in enumerate(zip(a["cells"], b["cells"])):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                return f"cell {i} {key}: {str(x.get(key))[:80]} -> {str(y.get(key))[:80]}"
    return ""


def check_lab(
    page, base: str, token: str, notebook: str, shot: Path, run_timeout_s: int, work: Path
) -> dict:
    page.goto(
        f"{base}/lab/tree/{notebook}?reset&token={token}", wait_until="domcontentloaded"
    )  # no restored tabs
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.context"
        " && window.jupyterapp.shell.currentWidget.context.isReady",
        timeout=120_000,
    )
    page.wait_for_function(
        "() => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session;"
        " return k && k.kernel && k.kernel.status === 'idle'; }",
        timeout=180_000,
    )
    time.sleep(3)  # let JupyterLab settle (it rewrites metadata, if it does, on open)
    opened_dirty = page.evaluate(NOTEBOOK_STATE)["dirty"]
    change = ""
    if opened_dirty:  # save the just-opened notebook to see what JupyterLab rewrote
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        time.sleep(3)
        change = first_change(ROOT / notebook, work / notebook)
    start = time.monotonic()
    page.evaluate(
        "() => { window.__ran = false; window.jupyterapp.commands.execute('notebook:run-all-cells')"
        ".then(() => { window.__ran = true; }); }"
    )
    page.wait_for_function(
        "() => window.__ran === true", timeout=run_timeout_s * 1000, polling=2000
    )
    page.wait_for_function(
        "() => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session;"
        " return k.kernel.status === 'idle'; }",
        timeout=60_000,
    )
    seconds = time.monotonic() - start
    state = page.evaluate(NOTEBOOK_STATE)
    page.evaluate(
        "() => { const img = window.jupyterapp.shell.currentWidget.node.querySelector('.jp-RenderedImage');"
        " if (img) img.scrollIntoView({block: 'center'}); }"
    )
    time.sleep(1)
    page.screenshot(path=str(shot))
    return {"opened_dirty": opened_dirty, "change": change, "seconds": seconds, **state}


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", help="lab folders (default: every lab)")
    parser.add_argument(
        "--shots", default=tempfile.gettempdir(), help="folder for one screenshot per lab"
    )
    parser.add_argument(
        "--run-timeout", type=int, default=900, help="seconds allowed for one lab's run-all"
    )
    args = parser.parse_args(argv)
    notebooks = sorted(ROOT.glob("labs/*/*_lab.ipynb"))
    if args.labs:
        notebooks = [n for n in notebooks if n.parent.name in args.labs]
    work = Path(tempfile.mkdtemp(prefix="paralab-browser-"))
    shutil.copytree(ROOT / "labs", work / "labs")
    port, token = _free_port(), secrets.token_hex(16)
    server = start_lab(work, port, token)
    problems = 0
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for nb in notebooks:
                lab = nb.parent.name
                shot = Path(args.shots) / f"browser_{lab}.png"
                try:
                    r = check_lab(
                        page,
                        f"http://127.0.0.1:{port}",
                        token,
                        nb.relative_to(ROOT).as_posix(),
                        shot,
                        args.run_timeout,
                        work,
                    )
                except (
                    Exception
                ) as exc:  # a timeout or a page that never became ready: report, go on
                    problems += 1
                    print(
                        f"{lab:<24} could not be checked: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    )
                    page.evaluate(CLOSE_NOTEBOOK)
                    continue
                bad = r["opened_dirty"] or r["errors"] or r["stderr"] or r["running"]
                problems += bool(bad)
                print(
                    f"{lab:<24} {'PROBLEMS' if bad else 'clean':<9} "
                    f"modified on open: {'yes' if r['opened_dirty'] else 'no'};"
                    f" run all {r['seconds']:.0f} s; {len(r['errors'])} errors; {len(r['stderr'])} stderr boxes;"
                    f" {r['images']} pictures; screenshot {shot}"
                )
                for line in (
                    ([f"on open, JupyterLab rewrote {r['change']}"] if r["change"] else [])
                    + r["errors"]
                    + r["stderr"]
                ):
                    print(f"    {line}")
                page.evaluate(CLOSE_NOTEBOOK)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
