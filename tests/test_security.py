"""Security: weights load without pickle; the app serves only its output folder, caps uploads, requires a login
and limits each user's runs."""

from __future__ import annotations

import ast
import http.cookiejar
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from kinegen.apps.service import AppConfig, Service

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("kinegen", "benchmarks", "scripts")
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


# ---------------------------------------------------------------------------- weights without pickle


def _keyword_is_true(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def unsafe_loads(source: str, where: str = "<source>") -> list[str]:
    """Every way ``source`` could unpickle: torch.load without weights_only=True, np.load with allow_pickle=True,
    an import of a pickle-based module, a from_pretrained that may fall back to pickle weights."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{where}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] in PICKLE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name == "torch.load" and not _keyword_is_true(node, "weights_only"):
            found.append(f"{where}:{node.lineno}: torch.load without weights_only=True")
        if name in ("np.load", "numpy.load") and any(k.arg == "allow_pickle" for k in node.keywords) and not any(
                k.arg == "allow_pickle" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.keywords):
            found.append(f"{where}:{node.lineno}: np.load with allow_pickle")
        if name.endswith(".from_pretrained") and not _keyword_is_true(node, "use_safetensors"):
            found.append(f"{where}:{node.lineno}: {name} without use_safetensors=True")
    return found


def test_the_scan_finds_unsafe_loads():
    bad = ("import pickle\nfrom joblib import load\nimport torch, numpy as np\ntorch.load('x.pt')\n"
           "torch.load('x.pt', weights_only=False)\nnp.load('x.npy', allow_pickle=True)\n"
           "AutoencoderKLWan.from_pretrained('x')\n")
    assert [f.split(": ", 1)[1] for f in unsafe_loads(bad)] == [
        "imports pickle", "imports joblib", "torch.load without weights_only=True",
        "torch.load without weights_only=True", "np.load with allow_pickle",
        "AutoencoderKLWan.from_pretrained without use_safetensors=True"]
    assert unsafe_loads("torch.load(f, weights_only=True)\nnp.load(f)\nnp.load(f, allow_pickle=False)\n"
                        "Pipe.from_pretrained(p, use_safetensors=True)\n") == []


def test_weights_load_only_through_safetensors_or_weights_only():
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50 and any(p.name == "loading.py" for p in files)
    found = [f for p in files for f in unsafe_loads(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


def test_history_never_points_the_page_outside_the_output_folder(tmp_path):
    """history.jsonl is data: an entry whose output lies outside the folder (or links out of it) is not loaded."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (out / "real.mp4").write_bytes(b"video")
    (out / "link.mp4").symlink_to(tmp_path / "secret.txt")
    entry = {"time": "t", "type": "generate", "user": "u", "model": "tiny-wan", "request": {"prompt": "p", "seed": 0},
             "accelerators": [], "total_s": 1.0}
    lines = [{**entry, "output": str(p)} for p in (out / "real.mp4", tmp_path / "secret.txt", out / "../secret.txt",
                                                   out / "link.mp4")] + ["not an object", {"output": 3}]
    (out / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=out))
    assert [r[-1] for r in svc.history_rows()] == ["real.mp4"]


# ---------------------------------------------------------------------------- the launched app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from kinegen.apps.web import launch_app

    tmp = tmp_path_factory.mktemp("secure")
    out = tmp / "out"
    out.mkdir()
    (tmp / "secret.txt").write_text("TOP SECRET")  # next to the output folder
    (out / "run.txt").write_text("an output")
    (out / "link.txt").symlink_to(tmp / "secret.txt")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = AppConfig(models=["tiny-wan"], gan_models=[], output_dir=out, rate_limit=2,
                       auth=[("alice", "pw"), ("bob", "pw2")])
    launched = launch_app(config, port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}", out
    launched.close()


def _session(base: str, user: str | None = None, password: str | None = None):
    """A cookie-keeping opener, logged in through the login form when a user is given."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    if user:
        form = urllib.parse.urlencode({"username": user, "password": password}).encode()
        with opener.open(base + "/login", data=form) as r:
            assert json.loads(r.read()) == {"success": True}
    return opener


def _fetch(opener, url: str, data: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers or {})) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_only_files_in_the_output_folder_are_served(app):
    base, out = app
    alice = _session(base, "alice", "pw")
    file = base + "/gradio_api/file="
    assert _fetch(alice, file + f"{out}/run.txt") == (200, b"an output")
    assert _fetch(_session(base), file + f"{out}/run.txt")[0] == 401  # and only after a login
    attempts = ["/etc/passwd", f"{out}/../secret.txt", f"{out.parent}/secret.txt", f"{out}/%2e%2e/secret.txt",
                f"{out}/%2e%2e%2fsecret.txt", f"{out}/..%2fsecret.txt", f"{out}%2f..%2fsecret.txt",
                f"{out}/%252e%252e%252fsecret.txt", urllib.parse.quote(f"{out}/../secret.txt", safe=""),
                f"{out}/run.txt/../../secret.txt", f"{out}/link.txt", str(ROOT / "pyproject.toml"), "pyproject.toml"]
    for path in attempts:
        status, body = _fetch(alice, file + path)
        assert 400 <= status < 500 and b"TOP SECRET" not in body and b"root:" not in body, (path, status, body)


def _upload(opener, base: str, size: int) -> tuple[int, bytes]:
    boundary = uuid.uuid4().hex
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="x.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n")
    body = head.encode() + b"\0" * size + f"\r\n--{boundary}--\r\n".encode()
    return _fetch(opener, base + "/gradio_api/upload", body,
                  {"Content-Type": f"multipart/form-data; boundary={boundary}"})


def test_uploads_are_capped_at_10_mb(app):
    base, _ = app
    alice = _session(base, "alice", "pw")
    status, body = _upload(alice, base, 11 * 2**20)
    assert (status, body) == (413, b"File size exceeded maximum allowed size of 10485760 bytes.")
    status, body = _upload(alice, base, 1000)
    assert status == 200 and [Path(p).name for p in json.loads(body)] == ["x.bin"]
    assert _upload(_session(base), base, 1000)[0] == 401


def test_a_login_is_required_and_each_user_has_their_own_rate_limit(app):
    from gradio_client import Client

    base, out = app
    with pytest.raises(ValueError, match="Could not login"):
        Client(base + "/", auth=("alice", "wrong"), verbose=False)
    alice = Client(base + "/", auth=("alice", "pw"), verbose=False)
    bob = Client(base + "/", auth=("bob", "pw2"), verbose=False)
    run = dict(prompt="a red circle", height=16, width=16, frames=1, steps=1, api_name="/generate")
    for seed in (0, 1):
        assert alice.predict(seed=seed, **run).endswith(f"-seed{seed}.mp4")
    with pytest.raises(Exception, match=r"Rate limit: 2 runs per minute per user on this server; try again in \d+ s\."):
        alice.predict(seed=2, **run)
    assert bob.predict(seed=3, **run).endswith("-seed3.mp4")  # another user is not held back by alice
    assert sorted(p.name.rsplit("-", 1)[-1] for p in out.glob("*.mp4")) == ["seed0.mp4", "seed1.mp4", "seed3.mp4"]
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [(h["user"], h["request"]["seed"]) for h in history] == [("user:alice", 0), ("user:alice", 1),
                                                                    ("user:bob", 3)]


def test_the_server_listens_on_loopback_unless_told_otherwise():
    import inspect

    from kinegen.apps.web import launch_app
    from kinegen.cli import build_parser

    assert inspect.signature(launch_app).parameters["host"].default == "127.0.0.1"
    assert build_parser().parse_args(["app"]).host == "127.0.0.1"
