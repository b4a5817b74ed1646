"""``--parallel``: one model split over 2 CPU processes (gloo, diffusers' Ulysses attention) gives exactly the
one-process output, with Map-Guided Caching and HyperVAttention too; what cannot work is refused before it runs.

The two ranks are this file run as a script (``python tests/test_parallel.py --worker DIR``) in two processes with
torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``); each writes what it saw to DIR, and the
test compares that with the same calls made here in one process. Bundled model, 9 frames at 64x64: 3 x 4 x 4 = 48
tokens and 4 heads, both split in two. Ulysses moves whole heads between ranks and runs the same SDPA on them, so the
outputs are expected to be bit-identical (max abs diff 0), and are.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

MODEL = "kinegen-shapes-t2v"
PROMPT = "a red circle moving right"
SIZE = dict(frames=9, height=64, width=64)
# (name, accelerator specs, steps): mapguided at fewer than 20 steps needs max_error; a fixed overhead makes the plan
# independent of timing, so that one process plans what rank 0 plans
RUNS = [
    ("dense", [], 4),
    ("mapguided", ["mapguided:speedup=1.5,max_error=inf,overhead=0.1,map=average"], 8),
    # sparse from step 1 (48 tokens: min_tokens=0): an anchor call, then two re-assigning calls per layer
    ("hva", ["hva:backend=dense,min_tokens=0"], 4),
]
MEASURED_PLAN = ["mapguided:speedup=1.5,max_error=inf,map=average"]  # planned on rank 0's measured overhead


# ---------------------------------------------------------------------------- the worker (one rank)


def _frames(pipe, specs, steps):
    from kinegen.generation import prepare, run_job

    result = run_job(prepare(pipe, PROMPT, steps=steps, **SIZE), specs)
    return result.frames, result.accelerators


def worker(out: Path) -> None:
    """One rank: the runs of RUNS split, the refusals that need a split pipeline, then the CLI."""
    import torch

    import kinegen
    from kinegen import parallel
    from kinegen.accelerators.catalog import parse_specs

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    spec = parallel.ParallelSpec.parse("ulysses=2")
    parallel.init_distributed(spec, "cpu")
    pipe = kinegen.load_pipeline(MODEL, device="cpu", cache=False)  # the CLI below loads its own
    pipe.set_progress_bar_config(disable=True)
    parallel.apply_parallel(pipe, spec)
    if rank == 1:  # rank 1 must follow rank 0's plan, never make one
        from kinegen.caching.map_guided_controller import MapGuidedCache

        def refuse(self, run):
            raise AssertionError("rank 1 planned")

        MapGuidedCache._make_plan = refuse
    seen = {}
    for name, specs, steps in RUNS + [("measured", MEASURED_PLAN, 8)]:
        c0 = parallel.comm_seconds()
        frames, stats = _frames(pipe, specs, steps)
        np.save(out / f"{name}-{rank}.npy", frames)
        seen[name] = {"plan": stats[0].get("plan") if stats else None, "comm_s": parallel.comm_seconds() - c0}
    refusals = {}
    for what, call in [
        ("tokens", lambda: parallel.check_run(pipe, (), _request(pipe, frames=9, height=48, width=48))),
        ("backend", lambda: parallel.check_run(pipe, parse_specs(["dense-attention:backend=_native_math"]))),
        ("first-block", lambda: parallel.check_run(pipe, parse_specs(["first-block"]))),
        ("twice", lambda: parallel.apply_parallel(pipe, spec)),
    ]:
        try:
            call()
        except Exception as e:  # noqa: BLE001 (the message is the result)
            refusals[what] = f"{type(e).__name__}: {e}"
    ring = kinegen.load_pipeline("tiny-wan", device="cpu", cache=False)
    parallel.apply_parallel(ring, parallel.ParallelSpec(ring=2))
    try:
        parallel.check_run(ring)
    except Exception as e:  # noqa: BLE001
        refusals["ring"] = f"{type(e).__name__}: {e}"
    (out / f"seen-{rank}.json").write_text(json.dumps({"runs": seen, "refusals": refusals}))
    from kinegen.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):  # leaves the process group
        code = main(["generate", PROMPT, "--steps", "2", "--frames", "9", "--height", "64", "--width", "64",
                     "--parallel", "ulysses=2", "--json", "-o", str(out / "cli.mp4")])
    (out / f"cli-{rank}.json").write_text(json.dumps({"code": code, "stdout": stdout.getvalue(),
                                                      "stderr": stderr.getvalue()}))


def _request(pipe, **fields):
    from kinegen.generation import prepare

    return prepare(pipe, PROMPT, **fields).request


# ---------------------------------------------------------------------------- the tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _one_thread():
    """Run the one-process reference on one thread, as each rank runs: with more threads the CPU matmuls sum in
    another order and the outputs agree to about 1e-4 rather than bit for bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Start the two ranks, make the same runs here in one process meanwhile, wait for the ranks: their folder
    (``out``) and this process's frames (``single``)."""
    out = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(out)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        import kinegen

        pipe = kinegen.load_pipeline(MODEL, device="cpu", cache=False)  # as fresh as each rank's
        pipe.set_progress_bar_config(disable=True)
        with _one_thread():
            single = {name: _frames(pipe, specs, steps)[0] for name, specs, steps in RUNS}
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]
    return {"out": out, "single": single}


@pytest.mark.parametrize("name", [name for name, _, _ in RUNS])
def test_two_ranks_equal_one_process(ranks, name):
    one = ranks["single"][name]
    for rank in range(2):
        split = np.load(ranks["out"] / f"{name}-{rank}.npy")
        assert split.shape == one.shape == (9, 64, 64, 3)
        assert np.abs(split - one).max() == 0.0, (name, rank)


def test_ranks_take_rank0s_caching_decisions(ranks):
    seen = [json.loads((ranks["out"] / f"seen-{r}.json").read_text())["runs"] for r in range(2)]
    for name in ("mapguided", "measured"):
        plan0, plan1 = seen[0][name]["plan"], seen[1][name]["plan"]
        assert plan0 is not None and plan0 == plan1  # rank 1's planner raises: it received rank 0's plan
        assert 0 < np.mean(plan0) < 1  # a plan that reuses some blocks
    assert all(s["dense"]["comm_s"] > 0 for s in seen)  # the all-to-alls ran, and were timed


def test_refusals_that_need_a_split_pipeline(ranks):
    refusals = json.loads((ranks["out"] / "seen-0.json").read_text())["refusals"]
    assert "3 x 3 x 3 = 27 tokens" in refusals["tokens"] and "Try --frames 5 or 13" in refusals["tokens"]
    assert "'_native_math' does not support context parallelism" in refusals["backend"]
    assert "native" in refusals["backend"]
    assert "first-block does not work with --parallel" in refusals["first-block"]
    assert "already applied" in refusals["twice"]
    assert "ring attention" in refusals["ring"] and "flash" in refusals["ring"] and "ulysses=2" in refusals["ring"]


def test_only_rank_0_writes_and_speaks(ranks, tmp_path):
    from kinegen.cli import main
    from kinegen.media import read_video

    out = ranks["out"]
    cli = [json.loads((out / f"cli-{r}.json").read_text()) for r in range(2)]
    assert cli[0]["code"] == cli[1]["code"] == 0
    summary = json.loads(cli[0]["stdout"])
    assert summary["parallel"]["spec"] == "ulysses=2" and summary["output"] == str(out / "cli.mp4")
    assert cli[1]["stdout"] == "" and cli[1]["stderr"].strip() == ""
    assert sorted(p.name for p in out.glob("cli*.mp4")) == ["cli.mp4"]
    with _one_thread():
        assert main(["generate", PROMPT, "--steps", "2", "--frames", "9", "--height", "64", "--width", "64",
                     "-o", str(tmp_path / "one.mp4")]) == 0
    np.testing.assert_array_equal(read_video(out / "cli.mp4"), read_video(tmp_path / "one.mp4"))


# ---------------------------------------------------------------------------- refusals before anything runs


def test_spec_parsing():
    from kinegen.parallel import ParallelSpec

    assert ParallelSpec.parse("ulysses=2") == ParallelSpec(ulysses=2)
    assert ParallelSpec.parse(" ring=2 ").layout == "ring"
    unified = ParallelSpec.parse("ulysses=2,ring=2")
    assert (unified.layout, unified.degree, str(unified)) == ("unified", 4, "ulysses=2,ring=2")
    assert str(ParallelSpec.parse("ulysses=2,ring=1")) == "ulysses=2"


@pytest.mark.parametrize("text, message", [
    ("ulyses=2", "unknown key 'ulyses'. Valid keys: ulysses, ring"),
    ("ulysses", "expected KEY=N, got 'ulysses'. Valid keys: ulysses, ring"),
    ("ulysses=two", "is not a whole number of processes"),
    ("ulysses=1", "at least one degree above 1"),
    ("ulysses=2,ulysses=2", "ulysses is given twice"),
    ("", "keys ulysses, ring"),
])
def test_spec_errors_name_the_valid_keys(text, message):
    from kinegen.errors import ConfigError
    from kinegen.parallel import ParallelSpec

    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        ParallelSpec.parse(text)


def test_without_torchrun_the_error_gives_the_command(monkeypatch, capsys):
    from kinegen.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["generate", PROMPT, "--parallel", "ulysses=2", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "start them with torchrun" in err and "torchrun --nproc-per-node 2 -m kinegen generate" in err


@pytest.mark.parametrize("flags, message", [
    (["--cache", "first-block"], "first-block does not work with --parallel"),
    (["--attention", "kmeans-sparse"], "kmeans-sparse does not work with --parallel"),
    (["--attention", "hva", "--parallel", "ring=2"], "which Ulysses gives and ring attention does not"),
])
def test_accelerators_that_cannot_agree_are_refused(capsys, flags, message):
    from kinegen.cli import main

    if "--parallel" not in flags:
        flags = [*flags, "--parallel", "ulysses=2"]
    assert main(["generate", PROMPT, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "mapguided" in err or "ulysses=N" in err  # and says what works


def test_head_count_and_chunk_by_chunk_models_are_refused(load_tiny):
    import kinegen
    from kinegen.errors import ConfigError
    from kinegen.parallel import ParallelSpec, apply_parallel

    pipe = kinegen.load_pipeline(MODEL, device="cpu")
    with pytest.raises(ConfigError, match="has 4 heads, which ulysses=3 cannot divide. Use ulysses=2 or 4"):
        apply_parallel(pipe, ParallelSpec(ulysses=3))
    with pytest.raises(ConfigError, match="generates chunk by chunk"):
        apply_parallel(load_tiny("tiny-wan-ar"), ParallelSpec(ulysses=2))
    assert getattr(pipe.transformer, "_kinegen_parallel", None) is None  # refused before touching the model


def test_help_describes_parallel(capsys):
    from kinegen.cli import main

    for command in ("generate", "profile"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--parallel ulysses=N|ring=N" in text
        assert "torchrun --nproc-per-node N -m kinegen" in text and "Only rank 0 writes" in text


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(Path(sys.argv[2]))
