"""Load on `kinegen serve`: concurrent gradio_client users against the front end, Ray Serve replicas behind it.

    .venv/bin/python benchmarks/serve_load.py --replicas 2 --clients 4 --requests 3 --out r2.json
    .venv/bin/python benchmarks/serve_load.py --replicas 2 --clients 4 --requests 3 --kill-at 12 --out kill.json
    ./benchmarks/run_serve_load.sh     # the runs of benchmarks/serve_load.md, into benchmarks/results/serve/

The same shape as benchmarks/app_load.py, and its client code (``app_load.client_loop``): `kinegen serve` starts in
its own process on loopback (the Ray Serve backend with ``--replicas`` replicas of the bundled model at its defaults,
17x128x128 and 20 steps, then the Gradio front end as its own process); each client is a thread with its own
``gradio_client.Client`` sending its requests one after another. Bounded: ``--clients`` (at most 16), ``--requests``
(at most 10) and ``--timeout`` (the whole run).

What is measured:
- throughput and latency per completed request (median, p90, max), split into the backend's queue wait and its run
  (the front end's history records, for each output, the replica that ran it, its queue wait and attempts);
- requests spread over the replicas (count per replica id), and none lost: every request is done (a readable 17-frame
  mp4) or refused at once with a message ("queue is full"), never anything else;
- queue behaviour: refusals by the page's queue, and (``--backend-burst N``) N simultaneous requests sent straight to
  the backend's API to show its bounded queue (``--max-queue``): how many ran, waited, or were answered 503;
- memory: the RSS of each replica, the ingress and the front end, every 2 s;
- ``--kill-at S``: S seconds into the run, one replica's actor is killed (``ray.kill``); the requests it was running
  and those queued must still complete (the ingress runs a request again when its replica dies), and Serve must start
  a replacement (``/health`` sampled through the run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_load import PROMPTS, client_loop, free_port, percentile  # noqa: E402 (the shared client code)

# the backend API's token: kinegen serve gets it in its environment, the direct requests and /health samples send it
TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class StampedResults(list):
    """``client_loop``'s results, each stamped with the time it came back (to place requests against a kill)."""

    def append(self, rec):
        rec.setdefault("done_at", time.time())
        if "latency_s" in rec:
            rec["sent_at"] = rec["done_at"] - rec["latency_s"]
        super().append(rec)


def get_json(url: str, timeout: float = 10.0):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH), timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except (OSError, ValueError) as e:
        return 0, {"error": str(e)}


def processes() -> dict[str, list]:
    """This machine's Kinegen serve processes by role (Ray names its replica processes after their deployment)."""
    import psutil

    roles: dict[str, list] = {"replica": [], "ingress": [], "frontend": []}
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if cmd.startswith("ray::ServeReplica:kinegen:generator"):
            roles["replica"].append(p)
        elif cmd.startswith("ray::ServeReplica:kinegen:Ingress"):
            roles["ingress"].append(p)
        elif "kinegen.cli serve --frontend-only" in cmd:
            roles["frontend"].append(p)
    return roles


def rss_by_role() -> dict[str, dict[str, float]]:
    out = {}
    for role, procs in processes().items():
        for p in procs:
            try:
                out.setdefault(role, {})[str(p.pid)] = round(p.memory_info().rss / 2**20, 1)
            except Exception:  # noqa: BLE001 (it exited between the listing and the read)
                pass
    return out


def start_serve(args, port: int, backend_port: int, out_dir: Path, log) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "kinegen.cli", "serve", "--port", str(port), "--backend-port", str(backend_port),
           "--output-dir", str(out_dir), "--replicas", str(args.replicas), "--max-queue", str(args.max_queue)]
    if args.cpus_per_replica:
        cmd += ["--cpus-per-replica", str(args.cpus_per_replica)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, KINEGEN_BACKEND_TOKEN=TOKEN))
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kinegen serve exited with {proc.returncode}; see its log")
        log.flush()
        text = Path(log.name).read_text(errors="replace")
        if "Kinegen serve: the page on" in text:
            address = re.search(r"Ray started \(([\d.]+:\d+)\)", text)
            return proc, address.group(1) if address else "auto"
        time.sleep(1)
    stop_serve(proc)
    raise SystemExit("kinegen serve did not start within 300 s")


def stop_serve(proc: subprocess.Popen) -> None:
    """SIGTERM (kinegen serve stops the front end, Serve and Ray), then whatever of its session is left."""
    import psutil

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    time.sleep(2)
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == proc.pid:  # the processes this run started and left behind
                p.kill()
        except (OSError, psutil.Error):
            pass


def kill_replica(address: str) -> dict:
    """Kill one replica actor of the generator deployment (as a crash would); its id and when."""
    # kinegen serve's ray.init turned Ray's token authentication on (its token: ~/.ray/auth_token); a second driver
    # connecting to that cluster must say so, before Ray reads its settings at import
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a["name"].startswith("SERVE_REPLICA::kinegen#generator-0#"))
        victim, busy = names[0], None
        for _ in range(20):  # a replica with a run going (Serve's router asks replicas the same question)
            for name in names:
                try:
                    n = ray.get(ray.get_actor(name, namespace="serve").get_num_ongoing_requests.remote(), timeout=5)
                except Exception:  # noqa: BLE001 (Serve's internal probe; without it, the first replica)
                    n = None
                if n:
                    victim, busy = name, n
                    break
            if busy:
                break
            time.sleep(0.5)
        actor = ray.get_actor(victim, namespace="serve")
        at = time.time()
        ray.kill(actor, no_restart=True)
        dead_at = None
        for _ in range(120):  # ray.kill returns at once; when the actor is really gone is what the run sees
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=2)
            except ray.exceptions.RayActorError:
                dead_at = time.time()
                break
            except ray.exceptions.GetTimeoutError:
                continue
            time.sleep(0.5)
        return {"replica": victim.rsplit("#", 1)[-1], "ongoing_requests_when_killed": busy, "at": at,
                "dead_at": dead_at}
    finally:
        ray.shutdown()


def backend_burst(backend: str, n: int) -> list[dict]:
    """``n`` requests at once straight to the backend's API: how many ran, waited or were answered 503."""
    import concurrent.futures as cf

    import httpx

    def one(i: int) -> dict:
        t0 = time.perf_counter()
        r = httpx.post(f"{backend}/generate", json={"prompt": PROMPTS[i % len(PROMPTS)], "seed": 5000 + i},
                       headers=AUTH, timeout=600)
        d = r.json()
        return {"status": r.status_code, "latency_s": time.perf_counter() - t0, "replica": d.get("replica"),
                "queue_s": d.get("queue_s"), "error": d.get("error")}

    with cf.ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1, help="replicas of the model, 1-4 (default: %(default)s)")
    ap.add_argument("--cpus-per-replica", type=float, default=0,
                    help="kinegen serve's --cpus-per-replica (default: its own, the cores divided among replicas)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent users, 1-16 (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=3, help="requests per user, 1-10 (default: %(default)s)")
    ap.add_argument("--max-queue", type=int, default=16, help="kinegen serve's --max-queue (default: %(default)s)")
    ap.add_argument("--kill-at", type=float, default=0,
                    help="seconds into the run to kill one replica's actor (0 = none)")
    ap.add_argument("--backend-burst", type=int, default=0,
                    help="after the users, send N requests at once straight to the backend (0-16)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the users' part (default: %(default)s)")
    ap.add_argument("--out", required=True, help="JSON file for the results")
    args = ap.parse_args(argv)
    if not 1 <= args.replicas <= 4 or not 1 <= args.clients <= 16 or not 1 <= args.requests <= 10 \
            or not 0 <= args.backend_burst <= 16:
        ap.error("--replicas 1-4, --clients 1-16, --requests 1-10, --backend-burst 0-16 (this benchmark is bounded)")

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    port, backend_port = free_port(), free_port()
    url, backend = f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{backend_port}"
    t_start = time.perf_counter()
    load_before = os.getloadavg()  # the machine is shared: how busy it was, beside the numbers
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "outputs"
        with open(Path(tmp) / "serve.log", "w+") as log:
            server, address = start_serve(args, port, backend_port, out_dir, log)
            startup_s = time.perf_counter() - t_start
            kill, burst, health = None, [], []
            try:
                from gradio_client import Client

                t0 = time.perf_counter()
                warm = Client(url, verbose=False)
                jobs = [warm.submit(prompt=PROMPTS[i], seed=900 + i, api_name="/generate")  # every replica's first
                        for i in range(args.replicas)]                                      # run pays one-off costs
                for job in jobs:
                    job.result(timeout=300)
                warm_s = time.perf_counter() - t0
                rss_before = rss_by_role()
                results = StampedResults()
                stop = threading.Event()
                threads = [threading.Thread(target=client_loop, args=(url, i, args.requests, results, stop))
                           for i in range(args.clients)]
                t0 = time.perf_counter()
                wall0 = time.time()
                memory: list = []

                def sample():
                    while not stop.is_set():
                        done_so_far = sum(r["outcome"] == "done" for r in list(results))
                        memory.append([round(time.perf_counter() - t0, 1), done_so_far, rss_by_role()])
                        code, h = get_json(f"{backend}/health", timeout=5)
                        health.append([round(time.perf_counter() - t0, 1), code, h.get("status"),
                                       {m: v.get("replicas_running") for m, v in (h.get("models") or {}).items()}])
                        stop.wait(2.0)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                for t in threads:
                    t.start()
                if args.kill_at:
                    time.sleep(args.kill_at)
                    kill = kill_replica(address)
                    kill["at_s"] = round(kill.pop("at") - wall0, 1)
                    dead_at = kill.pop("dead_at")
                    kill["dead_at_s"] = None if dead_at is None else round(dead_at - wall0, 1)
                deadline = t0 + args.timeout
                for t in threads:
                    t.join(max(0.0, deadline - time.perf_counter()))
                stop.set()
                for t in threads:
                    t.join(300)
                wall = time.perf_counter() - t0
                if args.kill_at:  # the replacement: wait (bounded) until /health counts every replica again
                    until = time.time() + 60
                    while time.time() < until and get_json(f"{backend}/health")[1].get("status") != "ok":
                        time.sleep(2)
                    code, h = get_json(f"{backend}/health")
                    health.append([round(time.perf_counter() - t0, 1), code, h.get("status"),
                                   {m: v.get("replicas_running") for m, v in (h.get("models") or {}).items()}])
                sampler.join(10)
                rss_after = rss_by_role()
                if args.backend_burst:
                    burst = backend_burst(backend, args.backend_burst)
                history = [json.loads(line) for line in (out_dir / "history.jsonl").read_text().splitlines()]
            finally:
                stop_serve(server)
            log.seek(0)
            server_log = log.read()

    by_output = {Path(h["output"]).name: h for h in history}
    for r in results:
        h = by_output.get(r.get("output"))
        if h is not None:
            r.update(replica=h.get("replica"), attempts=h.get("attempts"), queue_s=h.get("queue_s"),
                     backend_run_s=h.get("backend_run_s"), server_run_s=h.get("total_s"))
        for k in ("sent_at", "done_at"):
            if k in r:
                r[k] = round(r[k] - wall0, 2)
    done = [r for r in results if r["outcome"] == "done"]
    lat = [r["latency_s"] for r in done]
    per_replica: dict[str, int] = {}
    for r in done:
        per_replica[r.get("replica") or "?"] = per_replica.get(r.get("replica") or "?", 0) + 1

    def med(key):
        xs = [r[key] for r in done if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    kill_report = None
    if kill is not None:
        at = kill["dead_at_s"] if kill["dead_at_s"] is not None else kill["at_s"]  # when the replica was gone
        in_flight = [r for r in results if "sent_at" in r and r["sent_at"] <= at <= r["done_at"]]
        kill_report = {
            **kill,
            "requests_in_the_backend_at_the_kill": len(in_flight),
            "of_them_done": sum(r["outcome"] == "done" for r in in_flight),
            "run_again_on_another_replica": sum((r.get("attempts") or 1) > 1 for r in done),
            "killed_replica_seen_after_the_kill": any(r.get("replica") == kill["replica"] and r["sent_at"] > at
                                                      for r in done),
            "replicas_after_the_kill": sorted({r.get("replica") for r in done if r["done_at"] > at} - {None}),
            "health_samples": health,
        }
    summary = {
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
        "load_average_1min": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "replicas": args.replicas, "clients": args.clients, "requests_per_client": args.requests,
        "max_queue": args.max_queue, "startup_s": startup_s, "warm_up_s": warm_s,
        "sent": sum(1 for r in results if r["outcome"] != "not sent (time limit)"),
        "done": len(done), "refused": sum(r["outcome"] == "refused" for r in results),
        "lost": sum(r["outcome"].startswith("lost") for r in results),
        "refusal_messages": sorted({r["message"] for r in results if r["outcome"] == "refused"}),
        "wall_s": wall, "throughput_per_min": 60 * len(done) / wall if wall else 0.0,
        "latency_s": {"median": statistics.median(lat), "p90": percentile(lat, 0.9), "max": max(lat)} if lat else {},
        "queue_s_median": med("queue_s"), "backend_run_s_median": med("backend_run_s"),
        "done_per_replica": per_replica,
        "rss_mb": {"after_warm_up": rss_before, "after_run": rss_after,
                   "max_per_role": {role: max([sum(m[2].get(role, {}).values()) for m in memory] or [0])
                                    for role in ("replica", "ingress", "frontend")}},
        "rss_mb_samples": {"columns": ["seconds", "requests_done", "rss_mb_by_role_and_pid"], "rows": memory},
        "kill": kill_report,
        "backend_burst": {"sent": len(burst), "status_counts": {str(c): sum(b["status"] == c for b in burst)
                                                                for c in sorted({b["status"] for b in burst})},
                          "waited": sum((b.get("queue_s") or 0) > 0.5 for b in burst if b["status"] == 200),
                          "messages": sorted({b["error"] for b in burst if b.get("error")}),
                          "requests": burst} if burst else None,
        "tracebacks_in_serve_log": server_log.count("Traceback"),
        "requests": sorted(results, key=lambda r: (r["client"], r["request"])),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(summary, indent=1, default=str))
    tmp_out.replace(out)
    out.with_suffix(".log").write_text(server_log[-50_000:])  # the end of kinegen serve's log
    brief = {k: v for k, v in summary.items() if k not in ("requests", "rss_mb_samples")}
    if brief["kill"]:
        brief["kill"] = {k: v for k, v in brief["kill"].items() if k != "health_samples"}
    print(json.dumps(brief, indent=1, default=str))
    return 0 if summary["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
