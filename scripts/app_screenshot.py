"""Screenshot of the web app's Generate tab after one run with Map-Guided Caching (Playwright driving Debian's
headless chromium), for docs/images/.

    .venv/bin/python scripts/app_screenshot.py docs/images/app_generate.png
"""

import shutil
import socket
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from kinegen.apps.service import AppConfig
from kinegen.apps.web import launch_app

out = Path(sys.argv[1] if len(sys.argv) > 1 else "app_generate.png")
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
