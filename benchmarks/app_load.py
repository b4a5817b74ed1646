"""Load on the web app: concurrent gradio_client users against `kinegen app` on loopback.

    .venv/bin/python benchmarks/app_load.py --clients 6 --requests 3 --out within.json
    ./benchmarks/run_app_load.sh     # the three runs of benchmarks/app_load.md, into benchmarks/results/app_load/

The server runs in its own process (``kinegen app``, as an operator starts it), with the bundled model at its
defaults (17x128x128, 20 steps). Each client is a thread with its own ``gradio_client.Client`` that sends its
requests one after another (different prompts and seeds, so no two outputs are alike). Bounded: ``--clients``,
``--requests`` and ``--timeout`` (the whole run).

What is measured:
- latency per completed request (submit to file in hand): median, p90, max; the server's own run time of each
  (its history's seconds) and so the time spent waiting in the queue;
- queue behaviour: requests refused by Gradio's queue when it is full (``--max-queue``), with the message the
  client got; a refusal is an answer, not a loss;
- lost requests: neither an output file the client can read nor a clear refusal (must be 0); each completed
  output is checked to exist and to be a readable 17-frame mp4;
- the server's memory (RSS) after a warm-up request, every 2 s during the run (against the number of
  requests done so far, to tell a leak, which grows with every request, from caches that fill once) and after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

PROMPTS = ["a red circle moving right on a gray background", "a blue square moving up on a white background",
           "a green triangle moving left on a black background", "a yellow star moving down on a navy background",
           "a purple circle moving up on a brown background", "an orange square moving right on a gray background"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, out_dir: Path, concurrency: int, max_queue: int, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kinegen.cli", "app", "--port", str(port), "--output-dir", str(out_dir),
           "--concurrency", str(concurrency), "--max-queue", str(max_queue), "--gan-models"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see its log")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit("the server did not answer within 180 s")


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def client_loop(url: str, idx: int, n: int, results: list, stop: threading.Event) -> None:
    from gradio_client import Client

    from kinegen.media import read_video

    client = Client(url, verbose=False)
    for j in range(n):
        if stop.is_set():
            results.append({"client": idx, "request": j, "outcome": "not sent (time limit)"})
            continue
        prompt, seed = PROMPTS[(idx + j) % len(PROMPTS)], 1000 * idx + j
        t0 = time.perf_counter()
        rec = {"client": idx, "request": j, "prompt": prompt, "seed": seed}
        try:
            path = client.predict(prompt=prompt, seed=seed, api_name="/generate")
            rec["latency_s"] = time.perf_counter() - t0
            frames = read_video(path)
            rec["outcome"] = "done" if frames.shape[0] == 17 else f"lost (read {frames.shape[0]} frames)"
            rec["output"] = Path(path).name
        except Exception as e:  # a refusal (queue full) is an answer; anything else is a loss
            rec["latency_s"] = time.perf_counter() - t0
            msg = " ".join(str(e).split())
            rec["message"] = msg
            rec["outcome"] = "refused" if "queue is full" in msg.lower() else "lost"
        results.append(rec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=6, help="concurrent users, 1-32 (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=3, help="requests per user, 1-20 (default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=1, help="the server's --concurrency (default: %(default)s)")
    ap.add_argument("--max-queue", type=int, default=16, help="the server's --max-queue (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the whole run (default: %(default)s)")
    ap.add_argument("--out", required=True, help="JSON file for the results")
    args = ap.parse_args(argv)
    if not 1 <= args.clients <= 32 or not 1 <= args.requests <= 20:
        ap.error("--clients 1-32 and --requests 1-20 (this benchmark is bounded)")

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "outputs"
        with open(Path(tmp) / "server.log", "w+") as log:
            server = start_server(port, out_dir, args.concurrency, args.max_queue, log)
            try:
                from gradio_client import Client

                t0 = time.perf_counter()
                Client(url, verbose=False).predict(prompt=PROMPTS[0], seed=0, api_name="/generate")  # warm-up
                warm_s = time.perf_counter() - t0
                rss_before = rss_mb(server.pid)
                results: list = []
                stop = threading.Event()
                threads = [threading.Thread(target=client_loop, args=(url, i, args.requests, results, stop))
                           for i in range(args.clients)]
                t0 = time.perf_counter()
                memory: list = []

                def sample():
                    while not stop.is_set():
                        done_so_far = sum(r["outcome"] == "done" for r in list(results))
                        memory.append([round(time.perf_counter() - t0, 1), done_so_far, round(rss_mb(server.pid), 1)])
                        stop.wait(2.0)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                for t in threads:
                    t.start()
                deadline = t0 + args.timeout
                for t in threads:
                    t.join(max(0.0, deadline - time.perf_counter()))
                stop.set()
                for t in threads:
                    t.join(300)
                sampler.join(10)
                wall = time.perf_counter() - t0
                rss_after = rss_mb(server.pid)
                history = [json.loads(line) for line in (out_dir / "history.jsonl").read_text().splitlines()]
            finally:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(30)
            log.seek(0)
            server_log = log.read()

    run_s = {h["output"].rsplit("/", 1)[-1]: h["total_s"] for h in history}
    for r in results:
        if r.get("output") in run_s:
            r["server_run_s"] = run_s[r["output"]]
            r["queue_wait_s"] = r["latency_s"] - r["server_run_s"]
    done = [r for r in results if r["outcome"] == "done"]
    lat = [r["latency_s"] for r in done]
    summary = {
        "command": "python benchmarks/app_load.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M"), "clients": args.clients, "requests_per_client": args.requests,
        "server": {"concurrency": args.concurrency, "max_queue": args.max_queue},
        "sent": sum(1 for r in results if r["outcome"] != "not sent (time limit)"),
        "done": len(done), "refused": sum(r["outcome"] == "refused" for r in results),
        "lost": sum(r["outcome"].startswith("lost") for r in results),
        "refusal_messages": sorted({r["message"] for r in results if r["outcome"] == "refused"}),
        "wall_s": wall, "throughput_per_min": 60 * len(done) / wall if wall else 0.0,
        "latency_s": {"median": statistics.median(lat), "p90": percentile(lat, 0.9), "max": max(lat)} if lat else {},
        "server_run_s_median": statistics.median([r["server_run_s"] for r in done if "server_run_s" in r] or [0]),
        "queue_wait_s_median": statistics.median([r["queue_wait_s"] for r in done if "queue_wait_s" in r] or [0]),
        "warm_up_request_s": warm_s, "server_rss_mb": {"after_warm_up": rss_before, "after_run": rss_after,
                                                       "max": max([m[2] for m in memory] + [rss_after])},
        "rss_mb_samples": {"columns": ["seconds", "requests_done", "rss_mb"], "rows": memory},
        "tracebacks_in_server_log": server_log.count("Traceback"),
        "requests": sorted(results, key=lambda r: (r["client"], r["request"])),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(summary, indent=1))
    tmp_out.replace(out)
    brief = {k: v for k, v in summary.items() if k not in ("requests", "rss_mb_samples")}
    print(json.dumps(brief, indent=1))
    return 0 if summary["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
