"""Screenshots of the web app for docs/images/ (Playwright driving Debian's headless chromium): the Generate tab
after one run with Map-Guided Caching, or the GAN tab after a grid of three classes at truncation 0.7.

    .venv/bin/python scripts/app_screenshot.py docs/images/app_generate.png
    .venv/bin/python scripts/app_screenshot.py docs/images/app_gan.png --tab gan
"""

import argparse
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from kinegen.apps.service import AppConfig
from kinegen.apps.web import launch_app

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", nargs="?", default="app_generate.png", type=Path)
parser.add_argument("--tab", choices=("generate", "gan"), default="generate")
args = parser.parse_args()
out = args.out
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if chromium is None:
    sys.exit("needs Debian's chromium: apt-get install chromium")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
with tempfile.TemporaryDirectory() as tmp:
    app = launch_app(AppConfig(output_dir=Path(tmp)), port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            if args.tab == "gan":
                page.get_by_role("tab", name="GAN").click()
                for name in ("blue circle", "yellow star"):  # "red circle" is ticked already
                    page.get_by_label(name, exact=True).check()
                for elem, value in (("images", "18"), ("truncation", "0.7")):
                    box = page.locator(f"#kinegen-gan-{elem} input[type=number]")
                    box.fill(value)
                    box.press("Enter")
                page.get_by_role("button", name="Generate grid", exact=True).click()
                page.wait_for_selector("#kinegen-gan-grid img", timeout=120_000)
                page.wait_for_timeout(500)
            else:
                page.get_by_label("Cache", exact=True).click()
                page.get_by_role("option", name="mapguided", exact=True).click()
                page.get_by_role("button", name="Generate", exact=True).click()
                page.wait_for_selector("#kinegen-heatmap img", timeout=300_000)
                page.wait_for_timeout(1500)  # the video's first frames
            page.screenshot(path=str(out.resolve()), full_page=True)
            browser.close()
    finally:
        app.close()
print(f"wrote {out}")
