"""The site in a real browser: build it, serve it on 127.0.0.1, open every page in headless
Chromium (the OS package, driven by Playwright's Python API) and check what a reader sees.

Checks: every internal link resolves (pages, static files, #anchors); no page asks for
anything from another host (the site works offline: the browser resolves no other host's name,
and every request a page makes is listed) or throws a script error; every
notebook page shows its pictures (each <img> loaded, naturalWidth > 0) and at least
one; math is typeset by MathJax wherever a page has math, and a page that does not load
MathJax shows no TeX (MathJax goes only to the pages with math); search answers (the index loads
for that check only, not on each crawled page: see SEARCH_INDEX). Screenshots
of the landing page and of one notebook page go to site-screenshots/ (git-ignored); the
test prints their paths.

Skips, saying why, when the site's pip packages, Playwright or a Chromium binary are
missing (`.ci/run` installs them); the rest of the suite does not depend on this file.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "site-screenshots"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SEARCH_INDEX = "/search/search_index.json"
"""Material's search worker fetches and indexes this on every page load: 37 s of the crawl's
90 s of CPU over 60 pages. The crawl gets it with its config and no documents (the server
sends that while `crawling` is set); the search check loads the real one."""
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--in-process-gpu",  # no GPU process to start and talk to: 3 CPU-s of a crawl
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",  # no other host, ever
]
"""No request interception (`context.route`): it turns the browser's HTTP cache off, so every
page parsed and compiled the theme's and MathJax's scripts again, and sent each request through
Playwright to this process and back (8 CPU-s of a crawl). A request to another host is still
seen (the `request` event) and never reaches the network (its name does not resolve)."""


def _chromium() -> str | None:
    explicit = os.environ.get("PARALAB_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def _missing() -> str | None:
    for module, package in [
        ("mkdocs", "mkdocs"),
        ("material", "mkdocs-material"),
        ("mkdocs_jupyter", "mkdocs-jupyter"),
        ("jupyter_server_mathjax", "jupyter-server-mathjax"),
        ("playwright", "playwright"),
    ]:
        if importlib.util.find_spec(module) is None:
            return f"pip package {package} is not installed (pip install -r requirements.txt)"
    if _chromium() is None:
        return (
            "no Chromium binary: none of "
            + ", ".join(CHROMIUM_NAMES)
            + " on PATH and PARALAB_CHROMIUM unset "
            "(apt-get install -y chromium; Playwright's own browser download needs the network)"
        )
    return None


needs_browser = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture(scope="module")
def served_site(tmp_path_factory):
    """Build the site into a temporary folder and serve it on a free 127.0.0.1 port: its URL,
    and the event that makes the server send the search index without its documents."""
    from paralab import site

    out = tmp_path_factory.mktemp("site")
    seconds = site.build(site=out / "site", docs=out / "docs")
    print(f"\nsite built in {seconds:.1f} s into {out / 'site'}")
    crawling = threading.Event()
    handler = functools.partial(_SiteHandler, directory=str(out / "site"), crawling=crawling)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", crawling
    server.shutdown()


class _SiteHandler(http.server.SimpleHTTPRequestHandler):
    """The built site, quietly; while `crawling` is set, SEARCH_INDEX with no documents."""

    def __init__(self, *args, crawling: threading.Event, **kwargs) -> None:
        self.crawling = crawling
        super().__init__(*args, **kwargs)

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if not (self.crawling.is_set() and urlparse(self.path).path == SEARCH_INDEX):
            return super().do_GET()
        index = json.loads((Path(self.directory) / SEARCH_INDEX[1:]).read_text())
        body = json.dumps({**index, "docs": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # the search check gets the real one
        self.end_headers()
        self.wfile.write(body)
        return None


UNTYPESET_TEX = r"""() => {
    const body = document.body.cloneNode(true);
    body.querySelectorAll('pre, code, script, style, textarea, noscript').forEach(e => e.remove());
    const found = body.textContent.match(/\$[^$]+\$|\\\(|\\\[/);
    return found ? found[0].slice(0, 80) : null;
}"""
"""The TeX a reader would see raw on a page without MathJax (what tex2jax would have typeset)."""


def _loads_mathjax(page) -> bool:
    return page.evaluate("() => !!document.querySelector('script[src$=\"mathjax/MathJax.js\"]')")


def _typeset(page) -> None:
    """Wait until MathJax has finished its first pass over the page."""
    page.wait_for_function(
        "() => window.MathJax && window.MathJax.Hub && window.MathJax.isReady === true",
        timeout=20_000,
    )
    page.evaluate("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))")


@needs_browser
def test_site_in_a_real_browser(served_site):
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    from paralab.site import lab_dirs

    served_site, crawling = served_site
    notebooks = {
        f"labs/{lab.name}/{nb.stem}/"
        for lab in lab_dirs()
        for nb in lab.glob("*.ipynb")
        if not nb.name.endswith("_exercise.ipynb")
    }
    host = urlparse(served_site).netloc
    external: list[str] = []
    broken: list[str] = []
    problems: list[str] = []
    math_pages = mathjax_pages = 0
    start = time.perf_counter()
    SCREENSHOTS.mkdir(exist_ok=True)

    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(
                executable_path=_chromium(), headless=True, args=CHROMIUM_FLAGS
            )
        except PlaywrightError as error:
            pytest.skip(f"Chromium at {_chromium()} did not start: {error}")
        context = browser.new_context(viewport={"width": 1280, "height": 900})

        crawling.set()  # the search check below loads the real index
        context.on(
            "request",
            lambda r: external.append(r.url) if urlparse(r.url).netloc not in (host, "") else None,
        )
        context.on(
            "response",
            lambda r: (
                broken.append(f"{r.url} -> {r.status} (loaded by a page)")
                if r.status >= 400 and urlparse(r.url).netloc == host
                else None
            ),
        )
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(f"{page.url}: script error: {error}"))
        queue, seen, anchors, ids = [served_site], set(), [], {}
        while queue:
            url = queue.pop(0)
            if url in seen:
                continue
            seen.add(url)
            if not url.endswith("/") and not url.endswith(
                ".html"
            ):  # a static file (.py, .png): status only
                status = context.request.get(url).status
                if status != 200:
                    broken.append(f"{url} -> {status}")
                continue
            response = page.goto(url, wait_until="load")
            if response is None or response.status != 200:
                broken.append(f"{url} -> {response.status if response else 'no response'}")
                continue
            path = urlparse(url).path.lstrip("/")
            if _loads_mathjax(page):
                mathjax_pages += 1
                _typeset(page)
            elif raw := page.evaluate(UNTYPESET_TEX):
                problems.append(f"{path}: TeX shown raw, the page loads no MathJax: {raw!r}")
            state = page.evaluate("""() => ({
                ids: [...document.querySelectorAll('[id]')].map(e => e.id),
                links: [...document.querySelectorAll('a[href]')].map(a => a.href),
                images: [...document.querySelectorAll('.md-content img')]
                    .map(i => [i.complete && i.naturalWidth > 0, i.src.slice(0, 60)]),
                sources: document.querySelectorAll('script[type^="math/tex"]').length
                    + document.querySelectorAll('.arithmatex').length,
                found: document.querySelectorAll('script[type^="math/tex"]').length,
                rendered: document.querySelectorAll('span.MathJax, .MathJax_MathML').length,
                errors: document.querySelectorAll('.MathJax_Error, span.MathJax merror').length,
                raw: [...document.querySelectorAll('.arithmatex')]
                    .filter(s => !s.querySelector('span.MathJax, .MathJax_MathML')).length,
            })""")
            ids[url] = set(state["ids"])
            if path in notebooks and not any(link.endswith(".ipynb") for link in state["links"]):
                problems.append(f"{path}: a notebook page without a download link")
            if path in notebooks:
                if not state["images"]:
                    problems.append(f"{path}: a notebook page with no picture")
                problems += [
                    f"{path}: picture not shown ({src}...)" for ok, src in state["images"] if not ok
                ]
            if state["sources"]:
                math_pages += 1
                if (
                    state["rendered"] < state["found"]
                    or state["found"] == 0
                    or state["raw"]
                    or state["errors"]
                ):
                    problems.append(
                        f"{path}: math not rendered ({state['found']} found, {state['rendered']} typeset, "
                        f"{state['raw']} left raw, {state['errors']} errors)"
                    )
            if path == "":
                page.screenshot(path=str(SCREENSHOTS / "landing.png"))
            if path == sorted(notebooks)[-1]:
                page.screenshot(path=str(SCREENSHOTS / "notebook.png"))
            for link in state["links"]:
                target, fragment = urldefrag(link)
                if urlparse(target).netloc != host:
                    continue
                if fragment:
                    anchors.append((url, target, unquote(fragment)))
                queue.append(target)

        for source, target, fragment in anchors:
            if target in ids and fragment not in ids[target]:
                broken.append(f"{source}: #{fragment} not found in {target}")

        crawling.clear()
        page.goto(served_site)
        page.keyboard.press("/")
        page.keyboard.type("Ulysses")  # typed: Material's search listens to key events
        page.wait_for_selector(".md-search-result__item", timeout=20_000)
        hits = page.locator(".md-search-result__item").count()
        page.keyboard.press("Control+A")
        page.keyboard.type("ranks")  # a word beside math on many pages: no snippet shows TeX
        page.wait_for_selector(".md-search-result__item", timeout=20_000)
        snippets = page.locator(".md-search-result__item").all_inner_texts()
        problems += [
            f"search snippet shows raw TeX: {t[:120]!r}"
            for t in snippets
            if re.search(r"\$[^\s$]{1,40}\$|\\\(", t)
        ]
        browser.close()

    pages = len(seen)
    print(
        f"browser: {pages} URLs opened in {time.perf_counter() - start:.1f} s; "
        f"{len(notebooks)} notebook pages; MathJax loaded on {mathjax_pages}, "
        f"math typeset on {math_pages} pages; search 'Ulysses': {hits} hits"
    )
    print(f"screenshots: {SCREENSHOTS / 'landing.png'} and {SCREENSHOTS / 'notebook.png'}")
    assert not external, (
        f"pages asked for other hosts (the site must work offline): {sorted(set(external))[:10]}"
    )
    assert not broken, "broken links:\n" + "\n".join(sorted(set(broken)))
    assert not problems, "\n".join(problems)
    assert notebooks <= {urlparse(u).path.lstrip("/") for u in seen}, (
        "a notebook page is not reachable from the landing page"
    )
    assert math_pages > 0 and hits > 0


def test_navigation_sections_have_distinct_names():
    from paralab.site import nav

    titles = [
        next(iter(section)) for section in nav() if isinstance(next(iter(section.values())), list)
    ]
    starts = [title.split(" — ")[0] for title in titles]
    assert len(set(starts)) == len(starts), starts


def test_numbered_lists_keep_their_start_and_math_stays_out_of_search():
    import markdown

    from paralab.site import download_link, mkdocs_config, searchable

    extensions = [e for e in mkdocs_config()["markdown_extensions"] if isinstance(e, str)]
    html = markdown.markdown("1. one\n\ntext\n\n4. four\n", extensions=extensions)
    assert '<ol start="4">' in html, html
    page = (
        '<span class="arithmatex">\\(n\\)</span><div class="jp-RenderedHTMLCommon '
        'jp-RenderedMarkdown"><p>on $n$ ranks</p></div><pre>echo $HOME</pre>'
    )
    marked = searchable(page)
    assert '<span class="arithmatex" data-search-exclude>' in marked
    assert "<span data-search-exclude>$n$</span>" in marked and "echo $HOME" in marked
    assert 'href="x_lab.ipynb" download' in download_link("x_lab.ipynb")


def test_mathjax_goes_to_the_pages_with_math_only():
    from paralab.site import has_math

    assert has_math('<span class="arithmatex">\\(n\\)</span>')
    assert has_math("<p>$$\n(n-1)\\,\\frac{S}{n}\n$$</p>")  # display math across lines
    assert has_math("<p>on $n$ ranks</p>")
    assert not has_math("<p>costs $5</p><pre>echo $HOME $PATH</pre><code>$x$</code>")
    assert not has_math('<script>const a = "$", b = "$";</script>')
