"""Screenshot of the web app's Generate tab (headless Chromium), for docs/images/.

    .venv/bin/python scripts/app_screenshot.py docs/images/app_generate.png
"""

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

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
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1280,1100", "--virtual-time-budget=15000", f"--screenshot={out.resolve()}",
                        f"http://127.0.0.1:{port}/"], check=True, capture_output=True, timeout=120)
    finally:
        app.close()
print(f"wrote {out}")
