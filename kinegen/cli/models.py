"""``kinegen models``: the registered models, where their weights come from and whether they are
available here; with ``--accelerators``, the registered accelerators and their keys."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    mod = subparsers.add_parser("models", help="list registered models and which are available locally",
                                description="List registered models, where their weights come from and whether "
                                            "they are available on this machine (bundled, built in code, in "
                                            "$KINEGEN_MODELS_DIR or the Hugging Face cache).")
    mod.add_argument("--json", action="store_true", help="print JSON instead of a table")
    mod.add_argument("--accelerators", action="store_true", help="list the registered accelerators and their keys")
    mod.set_defaults(func=run)


def run(args) -> int:
    if args.accelerators:
        return _list_accelerators(args)
    from ..loading import describe_models
    from ..registry import DEFAULT_MODEL

    rows = describe_models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<20} {'kind':<6} {'family':<14} {'local':<6} source")
    for r in rows:
        default = " (default)" if r["name"] == DEFAULT_MODEL else ""
        size = f"  [{r['size']}]" if r["size"] and not r["available"] else ""
        print(f"{r['name']:<20} {r['kind']:<6} {r['family']:<14} {'yes' if r['available'] else 'no':<6} "
              f"{r['source']}{default}{size}")
    print("\nReal checkpoints load from $KINEGEN_MODELS_DIR/<name>, the Hugging Face cache, or any folder passed "
          "to --model. Download one with `hf download <repo> --local-dir <folder>`.")
    return 0


def _list_accelerators(args) -> int:
    from ..accelerators.catalog import list_accelerators

    rows = [{"name": a.name, "kind": a.kind, "summary": a.summary, "keys": a.keys()} for a in list_accelerators()]
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for r in rows:
        keys = ", ".join(f"{k}={v}" for k, v in r["keys"].items())
        print(f"{r['name']:<12} {r['kind']:<9} {r['summary']}\n{'':<22}keys: {keys}")
    return 0
