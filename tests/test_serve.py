"""`kinegen serve`: the HTTP API's validation, a replica's work and the front end's remote runner, without Ray (a
fake backend: a plain HTTP server around the real replica code); the CLI without Ray; and, where Ray is installed,
the real backend end to end (slow)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from kinegen.apps.service import AppConfig, RateLimiter, Service
from kinegen.errors import ConfigError, InvalidRequestError, RunCancelled
from kinegen.serve.protocol import GenerateBody, check_body, jsonable, validation_message

# ---------------------------------------------------------------------------- the API's validation (no model)


def test_request_body_is_bounded_and_checked_before_the_queue():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="less than or equal to 4096"):
        GenerateBody(prompt="x", height=5000)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        GenerateBody(prompt="x", bogus=1)
    with pytest.raises(ValidationError, match="at least 1 character"):
        GenerateBody(prompt="")
    with pytest.raises(ValidationError, match="at most 2 items"):
        GenerateBody(prompt="x", accelerators=["a", "b", "c"])
    config = AppConfig(models=["tiny-wan"], gan_models=[], max_side=64, max_steps=4)
    request, specs = check_body(GenerateBody(prompt="a red circle", steps=3, accelerators=[" first-block "]), config)
    assert (request.steps, request.height, specs) == (3, None, ["first-block"])
    with pytest.raises(InvalidRequestError, match="above this server's limit of 64"):
        check_body(GenerateBody(prompt="x", height=128), config)
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        check_body(GenerateBody(prompt="   "), config)
    with pytest.raises(ConfigError, match="Unknown accelerator 'nope'. Valid names"):
        check_body(GenerateBody(prompt="x", accelerators=["nope"]), config)
    with pytest.raises(ConfigError, match="Only one cache accelerator at a time"):
        check_body(GenerateBody(prompt="x", accelerators=["first-block", "mapguided"]), config)
    try:
        GenerateBody.model_validate({"prompt": "x", "steps": 5000, "extra": 1})
    except ValidationError as e:
        message = validation_message(e.errors())
    assert message == ("Bad request: steps: Input should be less than or equal to 1000; extra: Extra inputs are not "
                       "permitted.")


def test_stats_cross_the_wire_as_json():
    import torch

    stats = {"map": np.ones((2, 3), np.float32), "density": np.float64(0.25), "bad": float("nan"),
             "pair": (1, 2), "t": torch.tensor([1.5]), "obj": object, "flag": np.bool_(True)}
    out = jsonable(stats)
    assert out["map"] == [[1.0] * 3] * 2 and out["density"] == 0.25 and out["bad"] is None
    assert out["pair"] == [1, 2] and out["t"] == [1.5] and out["flag"] is True and isinstance(out["obj"], str)
    json.dumps(out, allow_nan=False)


def test_rate_limiter_refund_gives_back_the_latest_run():
    rl = RateLimiter(1, clock=lambda: 0.0)
    rl.check("a")
    rl.refund("a")  # the backend turned it away: it did not count
    rl.check("a")
    with pytest.raises(InvalidRequestError, match="Rate limit"):
        rl.check("a")


TOKEN = "s3cret-token-0123456789abcdef"


def test_the_token_is_checked_in_constant_time_and_refusals_say_what_to_do(monkeypatch):
    import hmac

    from kinegen.serve import protocol
    from kinegen.serve.protocol import check_authorization

    assert check_authorization(None, None) is None and check_authorization("Bearer x", "") is None  # no token: open
    compared, real = [], hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(protocol.hmac, "compare_digest", spy)
    assert check_authorization(f"Bearer {TOKEN}", TOKEN) is None
    assert check_authorization(f"bearer   {TOKEN} ", TOKEN) is None
    assert compared == [(TOKEN.encode(), TOKEN.encode())] * 2
    missing = check_authorization(None, TOKEN)
    assert "requires a token" in missing and "'Authorization: Bearer TOKEN'" in missing
    assert "--backend-token-file" in missing and "KINEGEN_BACKEND_TOKEN" in missing
    assert "must be 'Bearer TOKEN'" in check_authorization(f"Basic {TOKEN}", TOKEN)
    assert "must be 'Bearer TOKEN'" in check_authorization("Bearer ", TOKEN)
    wrong = check_authorization("Bearer " + TOKEN[:-1] + "X", TOKEN)
    assert "is not this backend's" in wrong and TOKEN not in wrong
    assert "is not this backend's" in check_authorization("Bearer " + TOKEN + "é", TOKEN)  # not ASCII: no crash


def test_the_backend_token_comes_from_a_file_or_the_environment(tmp_path):
    from kinegen.serve.launch import backend_token, is_loopback, new_token

    token_file = tmp_path / "token.txt"
    token_file.write_text(f"  {TOKEN}  \nthe rest is ignored\n")
    assert backend_token(token_file, environ={}) == TOKEN
    assert backend_token(token_file, environ={"KINEGEN_BACKEND_TOKEN": "x" * 20}) == TOKEN  # the flag first
    assert backend_token(None, environ={"KINEGEN_BACKEND_TOKEN": f" {TOKEN}\n"}) == TOKEN
    assert backend_token(None, environ={}) is None
    assert backend_token(None, environ={"KINEGEN_BACKEND_TOKEN": ""}) is None
    with pytest.raises(ConfigError, match="at least 16 printable ASCII characters.*secrets.token_urlsafe"):
        backend_token(None, environ={"KINEGEN_BACKEND_TOKEN": "short"})
    with pytest.raises(ConfigError, match="without spaces"):
        backend_token(None, environ={"KINEGEN_BACKEND_TOKEN": "a token with spaces in it"})
    with pytest.raises(ConfigError, match="does not exist; give a text file whose first line is the token"):
        backend_token(tmp_path / "nope.txt", environ={})
    (tmp_path / "empty.txt").write_text("\n" + TOKEN)
    with pytest.raises(ConfigError, match="first line is empty"):
        backend_token(tmp_path / "empty.txt", environ={})
    made = {new_token() for _ in range(3)}
    assert len(made) == 3 and all(len(t) >= 40 for t in made)
    assert all(map(is_loopback, ["127.0.0.1", "::1", "localhost", "[::1]", "127.0.1.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.5", "example.org", ""]))


# ---------------------------------------------------------------------------- one replica's work (no Ray)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    from kinegen.serve.worker import GenerationWorker

    return GenerationWorker("tiny-wan", {"max_steps": 10, "max_side": 128}, tmp_path_factory.mktemp("replica"),
                            threads=None, replica="r1")


def test_worker_runs_encodes_and_reports_progress(worker):
    from kinegen.media import read_video
    from kinegen.serve.protocol import GenerateResponse, decode_file

    events = []
    out = worker.generate({"prompt": "a red circle", "steps": 2, "seed": 3}, emit=events.append)
    GenerateResponse.model_validate({**out, "attempts": 1})  # the API's answer, as the ingress checks it
    assert [e["step"] for e in events] == [1, 2] and out["replica"] == "r1" and out["kind"] == "video"
    assert out["request"]["frames"] == 9 and out["timings"]["total"] > 0 and out["media_type"] == "video/mp4"
    path = Path(worker.config.output_dir) / "check.mp4"
    path.write_bytes(decode_file(out["data"]))
    assert read_video(path).shape == (9, 64, 64, 3)
    at_path = worker.generate({"prompt": "a red circle", "steps": 2, "seed": 3, "output": "path"})
    assert Path(at_path["path"]).is_file() and Path(at_path["path"]).parent == worker.config.output_dir.resolve()
    assert not list(worker.config.output_dir.glob(".*part*"))  # written atomically: no temporary left
    compared = worker.generate({"prompt": "a dot", "steps": 2, "accelerators": ["first-block"], "compare": True})
    assert compared["dense"]["data"] and compared["psnr_db"] is not None
    with pytest.raises(InvalidRequestError, match="limit of 10"):
        worker.generate({"prompt": "x", "steps": 20})
    with pytest.raises(InvalidRequestError, match="4k \\+ 1"):
        worker.generate({"prompt": "x", "steps": 2, "frames": 10})


def test_worker_stops_a_cancelled_run_and_checks_its_health(worker):
    from kinegen.serve.worker import error_event

    cancel = threading.Event()
    steps = []

    def emit(ev):
        steps.append(ev)
        cancel.set()  # as if the client left after the first step

    with pytest.raises(RunCancelled):
        worker.generate({"prompt": "a red circle", "steps": 5}, emit=emit, cancel=cancel)
    assert len(steps) == 1
    assert worker.info() == {"name": "tiny-wan", "defaults": {"height": 64, "width": 64, "frames": 9, "steps": 4,
                                                               "guidance": 5.0, "kind": "video"}, "frame_counts": None}
    worker.check_health()
    worker.broken = "RuntimeError: CUDA error: an illegal memory access"
    try:
        with pytest.raises(RuntimeError, match="needs replacing"):
            worker.check_health()
    finally:
        worker.broken = None
    refused = error_event(InvalidRequestError("bad"))
    assert refused["refused"] and refused["status"] == 400 and refused["message"] == "bad"
    bug = error_event(ZeroDivisionError("x"))
    assert bug["status"] == 500 and "ZeroDivisionError" in bug["message"] and not bug["refused"]


# ---------------------------------------------------------------------------- the front end's runner


class FakeBackend:
    """A plain HTTP server speaking the backend's API around the real replica code (no Ray, no queue): ``mode``
    "ok", "busy" (503 as a full queue answers), "slow" (steps every 0.2 s until the client leaves); with ``token``,
    the backend's token check (401 on every path but /health)."""

    def __init__(self, worker):
        self.worker, self.mode, self.requests, self.disconnected = worker, "ok", [], threading.Event()
        self.token, self.authorization = None, []  # the token it requires; the Authorization headers it was sent
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the answer ends when the connection closes: a stream without chunking

            def log_message(self, *args):
                pass

            def _json(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _denied(self):
                from kinegen.serve.protocol import check_authorization

                fake.authorization.append(self.headers.get("authorization"))
                denied = check_authorization(self.headers.get("authorization"), fake.token)
                if denied is not None and self.path != "/health":
                    self._json(401, {"error": denied})
                    return True
                return False

            def do_GET(self):
                if self._denied():
                    return
                if self.path == "/health":
                    self._json(200, {"status": "ok", "models": {"tiny-wan": {"replicas_running": 1, "replicas": 1}}})
                else:
                    self._json(200, {"models": [fake.worker.info()], "limits": {"max_side": 128, "max_frames": 81,
                                     "max_steps": 10, "max_prompt_chars": 500}, "replicas": 2, "max_queue": 3})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self._denied():
                    return
                fake.requests.append(body)
                if fake.mode == "busy":
                    return self._json(503, {"error": "The backend's queue is full: try again in a minute."})
                self.send_response(200)
                self.send_header("content-type", "application/x-ndjson")
                self.end_headers()

                def send(ev):
                    self.wfile.write((json.dumps(ev) + "\n").encode())
                    self.wfile.flush()

                try:
                    send({"event": "waiting"})
                    send({"event": "started", "replica": "r1", "at": time.time()})
                    if fake.mode == "slow":
                        for i in range(100):
                            time.sleep(0.2)
                            send({"event": "step", "step": i + 1, "steps": 100})
                        return
                    try:
                        out = fake.worker.generate(body, emit=send)
                        send({"event": "result", **out, "attempts": 1, "queue_s": 0.0})
                    except Exception as e:  # noqa: BLE001 (as the replica: every error is an event)
                        from kinegen.serve.worker import error_event

                        send(error_event(e))
                except (BrokenPipeError, ConnectionResetError):
                    fake.disconnected.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fake_backend(worker):
    fake = FakeBackend(worker)
    yield fake
    fake.close()


def _remote_service(fake, out_dir, **config):
    from kinegen.serve.client import RemoteRunner
    from kinegen.serve.launch import frontend_config

    runner = RemoteRunner(fake.url)
    runner.wait_ready(timeout_s=5)
    cfg = frontend_config(runner, output_dir=out_dir, rate_limit=config.pop("rate_limit", 0), max_queue=4,
                          concurrency=None, auth=None)
    return Service(cfg, runner=runner)


def test_remote_runner_writes_the_backends_file_and_keeps_the_apps_rules(fake_backend, tmp_path):
    from kinegen.generation import GenerationRequest
    from kinegen.media import read_video

    fake_backend.mode = "ok"
    svc = _remote_service(fake_backend, tmp_path / "out", rate_limit=2)
    # the backend's models, bounds and defaults; it passes replicas + queue on at once
    assert svc.config.models == ["tiny-wan"] and svc.config.max_steps == 10 and svc.config.concurrency == 5
    assert svc.model_defaults("tiny-wan")["frames"] == 9 and svc.config.gan_models == []
    steps = []
    out = svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", steps=2, seed=4), user="u",
                       step_callback=lambda i, n, latents: steps.append((i, n, latents)))
    assert steps == [(0, 2, None), (1, 2, None)]  # as run_job's: index, count; no latents cross the wire
    assert svc.is_served(out["output"]) and read_video(out["output"]).shape == (9, 64, 64, 3)
    assert out["replica"] == "r1" and out["request"]["seed"] == 4 and out["timings"]["total"] > 0
    entry = json.loads((tmp_path / "out" / "history.jsonl").read_text().splitlines()[-1])
    assert entry["replica"] == "r1" and entry["attempts"] == 1 and entry["output"] == out["output"]
    assert fake_backend.requests[-1]["stream"] is True and fake_backend.requests[-1]["output"] == "bytes"
    # the server's bounds before anything leaves; the model's rules from the backend, refunded
    n = len(fake_backend.requests)
    with pytest.raises(InvalidRequestError, match="limit of 10"):
        svc.generate("tiny-wan", GenerationRequest(prompt="x", steps=50), user="u")
    assert len(fake_backend.requests) == n
    with pytest.raises(InvalidRequestError, match="frame counts of the form 4k"):
        svc.generate("tiny-wan", GenerationRequest(prompt="x", steps=2, frames=10), user="u")
    fake_backend.mode = "busy"
    n = len(fake_backend.requests)
    with pytest.raises(Exception, match="queue is full") as busy:
        svc.generate("tiny-wan", GenerationRequest(prompt="x", steps=2), user="u")
    from kinegen.serve.client import BackendBusy

    assert isinstance(busy.value, BackendBusy) and len(fake_backend.requests) == n + 2  # tried once more, a second on
    fake_backend.mode = "ok"
    svc.generate("tiny-wan", GenerationRequest(prompt="x", steps=2), user="u")  # 2 per minute: refusals refunded
    with pytest.raises(InvalidRequestError, match="Rate limit: 2 runs per minute"):
        svc.generate("tiny-wan", GenerationRequest(prompt="x", steps=2), user="u")
    with pytest.raises(InvalidRequestError, match="use `kinegen app`"):
        svc.generate_gan("x", ["red circle"], 4, 0, 1.0)


def test_remote_runner_stop_closes_the_stream_and_a_dead_backend_is_named(fake_backend, tmp_path):
    from kinegen.generation import GenerationRequest
    from kinegen.serve.client import BackendUnavailable, RemoteRunner

    svc = _remote_service(fake_backend, tmp_path / "out")
    fake_backend.mode, fake_backend.disconnected = "slow", threading.Event()
    cancel = threading.Event()
    seen = []

    def on_step(i, n, _latents):
        seen.append(i)
        if i == 2:
            cancel.set()  # the page's Stop

    with pytest.raises(RunCancelled):
        svc.generate("tiny-wan", GenerationRequest(prompt="x", steps=2), step_callback=on_step, cancel=cancel)
    assert seen == [0, 1, 2] and fake_backend.disconnected.wait(5)  # the backend saw the client leave
    assert not list((tmp_path / "out").glob("*.mp4"))  # nothing written
    fake_backend.mode = "ok"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = RemoteRunner(f"http://127.0.0.1:{port}", connect_timeout_s=2)
    with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port} is not answering .*Start it with `kinegen serve`"):
        dead.health()
    with pytest.raises(BackendUnavailable, match="was not ready within 1 s"):
        dead.wait_ready(timeout_s=1, poll_s=0.2)


def test_remote_runner_sends_the_backends_token(fake_backend, tmp_path):
    from kinegen.generation import GenerationRequest
    from kinegen.serve.client import BackendTokenRefused, RemoteRunner
    from kinegen.serve.launch import frontend_config

    fake_backend.mode, fake_backend.token = "ok", TOKEN
    try:
        runner = RemoteRunner(fake_backend.url, token=TOKEN)
        runner.wait_ready(timeout_s=5)
        cfg = frontend_config(runner, output_dir=tmp_path / "out", rate_limit=1, max_queue=4, concurrency=None,
                              auth=None)
        out = Service(cfg, runner=runner).generate("tiny-wan", GenerationRequest(prompt="a dot", steps=2), user="u")
        assert Path(out["output"]).is_file()
        assert fake_backend.authorization[-1] == f"Bearer {TOKEN}"  # every call: /health, /models, /generate
        assert set(fake_backend.authorization[-3:]) == {f"Bearer {TOKEN}"}
        # a front end without the token: refused at start (the model list), saying how to give it
        bare = RemoteRunner(fake_backend.url)
        assert bare.wait_ready(timeout_s=5)["status"] == "ok"  # /health is open
        with pytest.raises(BackendTokenRefused, match="requires a token and this front end called it without a "
                                                      "token. Give .*--backend-token-file FILE .*BACKEND_TOKEN"):
            frontend_config(bare, output_dir=tmp_path / "out", rate_limit=0, max_queue=4, concurrency=None, auth=None)
        # a wrong token on a run: refused, and not counted against the user's rate limit (1 per minute)
        wrong = RemoteRunner(fake_backend.url, token="another-token-0123456789")
        wrong._info = runner.info()
        svc = Service(cfg, runner=wrong)
        for _ in range(2):
            with pytest.raises(BackendTokenRefused, match="with a token that is not its own"):
                svc.generate("tiny-wan", GenerationRequest(prompt="a dot", steps=2), user="v")
        assert fake_backend.authorization[-1] == "Bearer another-token-0123456789"
    finally:
        fake_backend.token = None


def test_front_end_page_generates_through_the_backend(fake_backend, tmp_path):
    """The app's page with a remote runner: /generate through gradio_client returns the backend's video; the Profile
    and GAN tabs, which need the models in-process, are not offered."""
    from gradio_client import Client

    from kinegen.apps.web import launch_app
    from kinegen.media import read_video

    fake_backend.mode = "ok"
    svc = _remote_service(fake_backend, tmp_path / "out")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = launch_app(svc.config, port=port, service=svc, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        path = client.predict(prompt="a red circle", seed=1, steps=2, api_name="/generate")
        assert read_video(path).shape == (9, 64, 64, 3)
        profile_tab = next(b for b in app.blocks.values() if getattr(b, "id", None) == "profile")
        assert profile_tab.visible is False
        with pytest.raises(Exception, match="GAN grids and profiles need the models in the same process"):
            client.predict(prompts="a red circle", configs="first-block", api_name="/profile")
    finally:
        app.close()


# ---------------------------------------------------------------------------- the command line


def test_kinegen_serve_without_ray_says_what_to_install(monkeypatch, capsys):
    import sys

    from kinegen.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed: `import ray` fails
    assert main(["serve", "--replicas", "1"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "kinegen[serve]"' in err and "`kinegen app`" in err
    assert main(["serve", "--frontend-only"]) == 2
    assert "--frontend-only needs --backend URL" in capsys.readouterr().err
    assert main(["serve", "--backend", "http://x:1"]) == 2
    assert "--backend is for --frontend-only" in capsys.readouterr().err
    assert main(["serve", "--frontend-only", "--backend", "http://x:1", "--port", "0"]) == 2
    assert "--port must be between 1 and 65535" in capsys.readouterr().err


def test_backend_only_refuses_to_listen_beyond_loopback_without_a_token(monkeypatch, capsys, tmp_path):
    import sys

    from kinegen.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # past the refusal, `require_ray` would fail: nothing starts
    monkeypatch.delenv("KINEGEN_BACKEND_TOKEN", raising=False)
    assert main(["serve", "--backend-only", "--backend-host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--backend-only --backend-host 0.0.0.0 without a token would let anyone" in err
    assert "--backend-token-file FILE" in err and "KINEGEN_BACKEND_TOKEN" in err and "secrets.token_urlsafe" in err
    assert main(["serve", "--backend-only", "--backend-host", "10.0.0.5", "--auth", "alice:pw"]) == 2
    assert "--auth and --auth-file are the page's logins" in capsys.readouterr().err
    (tmp_path / "short.txt").write_text("abc\n")
    assert main(["serve", "--backend-only", "--backend-token-file", str(tmp_path / "short.txt")]) == 2
    assert "must be at least 16 printable ASCII characters" in capsys.readouterr().err
    # with a token (or on loopback) the refusal is passed, and what stops it is the missing Ray
    monkeypatch.setenv("KINEGEN_BACKEND_TOKEN", TOKEN)
    assert main(["serve", "--backend-only", "--backend-host", "0.0.0.0"]) == 2
    assert 'pip install "kinegen[serve]"' in capsys.readouterr().err
    monkeypatch.delenv("KINEGEN_BACKEND_TOKEN")
    for host in ("127.0.0.1", "::1", "localhost"):
        assert main(["serve", "--backend-only", "--backend-host", host]) == 2
        assert 'pip install "kinegen[serve]"' in capsys.readouterr().err


def test_kinegen_serve_makes_a_token_and_hands_it_to_both_halves(monkeypatch, tmp_path):
    from kinegen.cli import main
    from kinegen.cli import serve as serve_cli
    from kinegen.serve import launch

    started = []
    monkeypatch.setattr("kinegen.serve.require_ray", lambda: None)
    monkeypatch.setattr(serve_cli, "_log_to_console", lambda: None)
    monkeypatch.setattr(serve_cli, "backend_settings", lambda args: launch.BackendSettings(models=["tiny-wan"]))
    monkeypatch.setattr(launch, "supervise", lambda settings, args, auth: started.append(("both", settings)) or 0)
    monkeypatch.setattr(launch, "run_backend_only", lambda settings: started.append(("backend", settings)) or 0)
    monkeypatch.delenv("KINEGEN_BACKEND_TOKEN", raising=False)
    assert main(["serve", "--output-dir", str(tmp_path)]) == 0 and main(["serve", "--output-dir", str(tmp_path)]) == 0
    (_, first), (_, second) = started
    assert first.token_made and len(first.token) >= 40 and first.token != second.token  # random, every start
    assert first.token not in repr(first)
    env = launch.frontend_env(None, first.token, environ={"PATH": "/bin", "KINEGEN_BACKEND_TOKEN": "stale"})
    assert env == {"PATH": "/bin", "KINEGEN_BACKEND_TOKEN": first.token}
    assert "KINEGEN_BACKEND_TOKEN" not in launch.frontend_env(None, None, environ={"KINEGEN_BACKEND_TOKEN": "stale"})
    # a given token is used as it is (callers of the API know it)
    monkeypatch.setenv("KINEGEN_BACKEND_TOKEN", TOKEN)
    started.clear()
    assert main(["serve", "--output-dir", str(tmp_path)]) == 0
    assert main(["serve", "--backend-only", "--backend-host", "0.0.0.0", "--output-dir", str(tmp_path)]) == 0
    assert [(kind, s.token, s.token_made) for kind, s in started] == [("both", TOKEN, False),
                                                                       ("backend", TOKEN, False)]
    monkeypatch.delenv("KINEGEN_BACKEND_TOKEN")
    started.clear()
    assert main(["serve", "--backend-only", "--output-dir", str(tmp_path)]) == 0  # loopback: no token needed
    assert started[0][1].token is None


def test_replica_resources_are_checked_against_the_machine():
    from kinegen.serve.launch import BackendSettings, check_resources

    check_resources(BackendSettings(models=["m"], replicas=2, cpus_per_replica=1), cpus=2, gpus=0)
    with pytest.raises(ConfigError, match="3 replicas x 1 CPUs = 3 CPUs, but this machine has 2"):
        check_resources(BackendSettings(models=["m"], replicas=3, cpus_per_replica=1), cpus=2, gpus=0)
    with pytest.raises(ConfigError, match="4 replicas: 2 of each of 2 models"):
        check_resources(BackendSettings(models=["m", "n"], replicas=2, cpus_per_replica=1), cpus=2, gpus=0)
    with pytest.raises(ConfigError, match="needs 2 GPUs; this machine has 1"):
        check_resources(BackendSettings(models=["m"], replicas=2, gpus_per_replica=1), cpus=8, gpus=1)
    check_resources(BackendSettings(models=["m"], replicas=4, cpus_per_replica=0.5), cpus=2, gpus=0)


# ---------------------------------------------------------------------------- the real backend (Ray)


@pytest.mark.slow
def test_ray_serve_backend_end_to_end(tmp_path):
    """Ray Serve with one replica of tiny-wan and a token: /health (open, no model names without the token), /models,
    a generation (and its stream), 401 without the token, a bad request answered 400 before the queue, and the front
    end's runner against it."""
    pytest.importorskip("ray.serve")
    import httpx

    from kinegen.generation import GenerationRequest
    from kinegen.serve.client import RemoteRunner
    from kinegen.serve.launch import BackendSettings, start_backend, stop_backend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = BackendSettings(models=["tiny-wan"], replicas=1, cpus_per_replica=1, max_queue=2, port=port,
                               output_dir=tmp_path / "backend", limits={"max_steps": 10}, token=TOKEN)
    url = start_backend(settings)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        runner = RemoteRunner(url, token=TOKEN)
        assert runner.wait_ready(60)["models"]["tiny-wan"]["replicas_running"] == 1
        assert runner.models()["tiny-wan"]["defaults"]["frames"] == 9
        r = httpx.get(f"{url}/health", timeout=30)  # open, but names no model
        assert r.status_code == 200 and r.json() == {"status": "ok", "replicas_running": 1, "replicas": 1}
        r = httpx.get(f"{url}/models", timeout=30)
        assert r.status_code == 401 and "requires a token" in r.json()["error"]
        r = httpx.post(f"{url}/generate", json={"prompt": "x", "steps": 5000}, timeout=30,
                       headers={"Authorization": "Bearer wrong-token-0123456789"})
        assert r.status_code == 401 and "is not this backend's" in r.json()["error"]  # before the body's check
        r = httpx.post(f"{url}/generate", json={"prompt": "a red circle", "steps": 50}, headers=auth, timeout=60)
        assert r.status_code == 400 and "limit of 10" in r.json()["error"]
        r = httpx.post(f"{url}/generate", json={"prompt": "a red circle", "steps": 2, "output": "path"},
                       headers=auth, timeout=120)
        assert r.status_code == 200 and Path(r.json()["path"]).is_file() and r.json()["attempts"] == 1
        with httpx.stream("POST", f"{url}/generate", json={"prompt": "a dot", "steps": 2, "stream": True},
                          headers=auth, timeout=120) as resp:
            kinds = [json.loads(line)["event"] for line in resp.iter_lines() if line.strip()]
        assert kinds[-1] == "result" and kinds.count("step") == 2 and "started" in kinds
        svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "front"), runner=runner)
        out = svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", steps=2))
        assert Path(out["output"]).is_file() and out["replica"]
    finally:
        stop_backend()


def test_the_page_gets_its_logins_from_the_environment_not_its_command_line(monkeypatch):
    import argparse

    from kinegen.serve.launch import AUTH_ENV, auth_from_env, frontend_command, frontend_env

    args = argparse.Namespace(host="127.0.0.1", port=7860, output_dir="out", rate_limit=6, max_queue=8, concurrency=0)
    cmd = frontend_command("http://127.0.0.1:8000", args)
    assert cmd[-12:] == ["--backend", "http://127.0.0.1:8000", "--host", "127.0.0.1", "--port", "7860",
                         "--output-dir", "out", "--rate-limit", "6", "--max-queue", "8"]
    assert not any("secret" in c for c in cmd)
    env = frontend_env([("alice", "secret")], TOKEN, environ={})
    assert json.loads(env[AUTH_ENV]) == [["alice", "secret"]] and env["KINEGEN_BACKEND_TOKEN"] == TOKEN
    assert not any(TOKEN in c for c in cmd)
    monkeypatch.setenv(AUTH_ENV, json.dumps([["alice", "secret"]]))
    assert auth_from_env() == [("alice", "secret")]
    monkeypatch.setenv(AUTH_ENV, "not json")
    with pytest.raises(ConfigError, match="JSON list of"):
        auth_from_env()
