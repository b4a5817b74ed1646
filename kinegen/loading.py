"""Resolve a model name, folder or hub id to a loaded diffusers pipeline.

``load_pipeline`` checks a folder *before* handing it to diffusers, so a missing
component is reported by name with the command that fetches it, instead of a deep
traceback from ``from_pretrained``. Device and dtype default to CUDA + bf16 where a GPU
is present and CPU + fp32 otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .adapters import ModelAdapter, adapter_for_pipeline_class
from .errors import (
    ConfigError,
    CorruptModelFileError,
    IncompleteModelFolderError,
    KinegenError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from .memory import out_of_memory_guard
from .registry import MODELS, ModelSpec, get_model_spec
from .text import env_flag

if TYPE_CHECKING:
    import torch


def _assets_dir() -> Path:
    """The bundled models and predictors: ``kinegen/assets`` in an installed wheel (setup.py copies them there),
    ``assets/`` beside the package in the repository."""
    here = Path(__file__).resolve().parent
    packaged = here / "assets"
    return packaged if packaged.is_dir() else here.parent / "assets"


ASSETS_DIR = _assets_dir()
MODELS_DIR_ENV = "KINEGEN_MODELS_DIR"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "vocab.json", "tokenizer.model")


# ---------------------------------------------------------------------------- device and dtype

# torch is imported where it is used, so that `kinegen models` and `kinegen --help` do not wait 3 s for it.
_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The requested device, else CUDA, else MPS, else CPU."""
    import torch

    if device is not None and str(device) != "auto":
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise KinegenError(f"Unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps.") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise KinegenError("--device cuda was requested but no CUDA GPU is visible to torch.")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """The requested dtype, else bf16 on CUDA (fp16 where bf16 is unsupported), fp16 on MPS, fp32 on CPU."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is not None and dtype != "auto":
        try:
            return getattr(torch, _DTYPES[str(dtype).lower()])
        except KeyError:
            raise KinegenError(f"Unknown dtype {dtype!r}; use one of: auto, {', '.join(_DTYPES)}.") from None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


# ---------------------------------------------------------------------------- folder checks


def _has_weights(folder: Path) -> tuple[bool, str]:
    """Whether a component folder holds safetensors weights (sharded or not); a reason if not."""
    for index in folder.glob("*.safetensors.index.json"):
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        absent = sorted(s for s in shards if not (folder / s).is_file())
        if absent:
            return False, f"shards listed in {index.name}: {', '.join(absent)}"
        return True, ""
    if any(folder.glob("*.safetensors")):
        return True, ""
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.ckpt")):
        return False, "safetensors weights (only pickle .bin/.pt files found; Kinegen loads safetensors only)"
    return False, "weights (*.safetensors)"


def _safetensors_problem(path: Path) -> str | None:
    """Why a ``.safetensors`` file cannot be loaded (truncated, corrupt header), or None. Reads the header only."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes: shorter than a safetensors header"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            return f"its header length field says {n} bytes, the file has {size}: truncated or a corrupt header"
        if n > 100_000_000:  # safetensors' own limit; do not read gigabytes of a corrupt file as JSON
            return f"its header length field says {n} bytes, above safetensors' limit: a corrupt header"
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "its header is not valid safetensors JSON: corrupt"
    if size != 8 + n + end:
        what = "truncated" if size < 8 + n + end else "corrupt"
        return f"{what}: {size} bytes where its header lists {8 + n + end}"
    try:  # what the header check above does not cover (dtypes, overlapping offsets...)
        from safetensors import safe_open

        with safe_open(str(path), "pt"):
            pass
    except Exception as e:
        return f"corrupt: {str(e).strip() or type(e).__name__}"
    return None


def check_weight_files(folder: str | os.PathLike) -> list[str]:
    """Every ``.safetensors`` file of a pipeline folder that is truncated or corrupt, as
    ``"transformer/diffusion_pytorch_model.safetensors (why)"`` (empty if all are sound)."""
    return [f"{path.relative_to(folder)} ({why})" for path, why in _weight_problems(Path(folder))]


def _weight_problems(folder: Path) -> list[tuple[Path, str]]:
    return [(p, why) for p in sorted(folder.glob("*/*.safetensors")) if (why := _safetensors_problem(p)) is not None]


def check_model_folder(folder: str | os.PathLike) -> list[str]:
    """Every file or folder a diffusers pipeline folder lacks, as readable strings (empty if complete)."""
    folder = Path(folder)
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        return ["model_index.json"]
    try:
        index = json.loads(index_path.read_text())
    except json.JSONDecodeError as e:
        return [f"a valid model_index.json ({e})"]
    if not isinstance(index, dict):
        return ["a valid model_index.json (it holds a JSON object naming the pipeline and its components)"]
    missing: list[str] = []
    for comp, value in index.items():
        if comp.startswith("_") or not isinstance(value, list) or len(value) != 2 or value[0] is None:
            continue
        lib, cls = value
        sub = folder / comp
        if not sub.is_dir():
            missing.append(f"{comp}/ ({lib}.{cls})")
            continue
        if "Scheduler" in cls or comp.startswith("scheduler"):
            needed = ["scheduler_config.json"]
        elif "Tokenizer" in cls or comp.startswith("tokenizer"):
            if not any((sub / f).is_file() for f in _TOKENIZER_FILES):
                missing.append(f"{comp}/ tokenizer files (one of {', '.join(_TOKENIZER_FILES)})")
            continue
        elif "Processor" in cls or "FeatureExtractor" in cls:
            needed = ["preprocessor_config.json"]
        else:
            needed = ["config.json"]
            ok, what = _has_weights(sub)
            if not ok:
                missing.append(f"{comp}/ {what}")
        missing += [f"{comp}/{name}" for name in needed if not (sub / name).is_file()]
    return missing


# ---------------------------------------------------------------------------- resolution


@dataclasses.dataclass
class ResolvedModel:
    """Where a model's weights come from. ``spec`` is ``None`` for a hub id Kinegen does not know
    yet (its family is read from ``model_index.json`` once downloaded)."""

    spec: ModelSpec | None
    folder: Path | None = None  # a complete local diffusers folder
    repo_id: str | None = None  # a hub id still to be fetched
    key: str = ""  # what identifies it in the pipeline cache


def _download_hint(repo_id: str, name: str | None = None) -> str:
    target = f"./models/{name or repo_id.split('/')[-1]}"
    return (
        f"To get it: `hf download {repo_id} --local-dir {target}` on a machine with network, then pass "
        f"`--model {target}` (or set {MODELS_DIR_ENV} to the folder that holds it)."
    )


def _family_of_folder(folder: Path) -> tuple[str, ModelAdapter]:
    """(pipeline class name, family adapter) of a diffusers folder; a clear error for classes nobody drives."""
    cls = json.loads((Path(folder) / "model_index.json").read_text()).get("_class_name")
    if not isinstance(cls, str) or not cls:
        raise ModelNotFoundError(f"{folder}/model_index.json names no pipeline class (its \"_class_name\" is "
                                 f"{cls!r}); copy model_index.json from the original checkpoint.")
    try:
        return cls, adapter_for_pipeline_class(cls)
    except UnsupportedModelError as e:
        raise ModelNotFoundError(f"{folder} holds a {cls}, which Kinegen does not drive. "
                                 f"{str(e).split('. ', 1)[1]}") from None


def _spec_for_folder(folder: Path, name: str) -> ModelSpec:
    cls, adapter = _family_of_folder(folder)
    family = adapter.name
    # Defaults from the folder's kinegen_defaults.json if it has one (the bundled models and what
    # `kinegen train` exports do), else from the first registered hub model of the same family.
    base = next((s for s in MODELS.values() if s.family == family and s.repo_id), None)
    base = base or next(s for s in MODELS.values() if s.family == family)
    return dataclasses.replace(base, name=name, description=f"local folder ({cls})", repo_id=None, builder=None,
                               bundled=None, call_defaults={}, **read_generation_defaults(folder))


GENERATION_DEFAULTS_FILE = "kinegen_defaults.json"
_DEFAULT_TYPES = {"height": int, "width": int, "frames": int, "steps": int, "guidance": float, "fps": int}


def read_generation_defaults(folder: str | os.PathLike) -> dict[str, Any]:
    """The generation defaults a model folder declares in ``kinegen_defaults.json`` (``{}`` if none):
    a copy of a model trained at 17 x 128 x 128 should not fall back to its family's 81 x 480 x 832."""
    path = Path(folder) / GENERATION_DEFAULTS_FILE
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); fix or delete it.") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object with keys among {', '.join(_DEFAULT_TYPES)}.")
    unknown = sorted(set(raw) - set(_DEFAULT_TYPES))
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; valid keys: {', '.join(_DEFAULT_TYPES)}.")
    for k, v in raw.items():  # JSON numbers of the right kind: 2.5 steps or a NaN guidance is a broken file
        ok = (isinstance(v, int) and not isinstance(v, bool) and v >= 1 if _DEFAULT_TYPES[k] is int else
              isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf)
        if not ok:
            what = "a positive integer" if _DEFAULT_TYPES[k] is int else "a number >= 0"
            raise ConfigError(f"{path}: {k} must be {what}, got {v!r}; fix or delete the file.")
    return {k: _DEFAULT_TYPES[k](v) for k, v in raw.items()}


def write_generation_defaults(folder: str | os.PathLike, **defaults) -> None:
    """Write ``kinegen_defaults.json`` (keys: height, width, frames, steps, guidance, fps)."""
    unknown = sorted(set(defaults) - set(_DEFAULT_TYPES))
    if unknown:
        raise ValueError(f"unknown generation defaults {unknown}; valid: {', '.join(_DEFAULT_TYPES)}")
    from .media import atomic_path

    with atomic_path(Path(folder) / GENERATION_DEFAULTS_FILE) as tmp:
        tmp.write_text(json.dumps(defaults, indent=2) + "\n")


def _local_copy(spec: ModelSpec) -> Path | None:
    """A complete local copy of a registry model: $KINEGEN_MODELS_DIR/<name> or the hub cache."""
    roots = [Path(p) for p in os.environ.get(MODELS_DIR_ENV, "").split(os.pathsep) if p]
    for root in roots:
        for cand in (root / spec.name, root / spec.repo_id.split("/")[-1]):
            if (cand / "model_index.json").is_file():
                return cand
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(spec.repo_id, local_files_only=True))
        return path if (path / "model_index.json").is_file() else None
    except Exception:
        return None


def resolve_model(model: str | os.PathLike | None) -> ResolvedModel:
    """Turn what the user typed into a :class:`ResolvedModel`, or raise with what to do."""
    from .registry import DEFAULT_MODEL

    model = DEFAULT_MODEL if model is None else model
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise ModelNotFoundError(f"A model is a registered name ({', '.join(MODELS)}), a local diffusers folder or a "
                                 f"hub id (owner/name); got {model!r}.")
    text = os.fspath(model)
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # "~user/..." for a user that does not exist
        path = Path(text)
    if path.is_dir():
        missing = check_model_folder(path)
        if missing:
            raise IncompleteModelFolderError(
                str(path), missing,
                "Copy the missing parts from the original checkpoint, or re-download it with "
                "`hf download <owner/name> --local-dir <folder>`.",
            )
        return ResolvedModel(_spec_for_folder(path, path.name), folder=path.resolve(), key=str(path.resolve()))
    if text in MODELS:
        spec = get_model_spec(text)
        if spec.builder is not None:
            return ResolvedModel(spec, key=spec.name)
        if spec.bundled is not None:
            folder = ASSETS_DIR / "models" / spec.bundled
            missing = check_model_folder(folder)
            if missing:
                raise IncompleteModelFolderError(
                    str(folder), missing, "The bundled model ships with the repository: re-clone it or "
                    "`git checkout -- assets/` (Git LFS is not used).")
            return ResolvedModel(spec, folder=folder, key=spec.name)
        local = _local_copy(spec)
        if local is not None:
            missing = check_model_folder(local)
            if missing:
                raise IncompleteModelFolderError(str(local), missing, _download_hint(spec.repo_id, spec.name))
            return ResolvedModel(spec, folder=local, key=str(local))
        return ResolvedModel(spec, repo_id=spec.repo_id, key=spec.repo_id)
    if path.is_file():
        raise ModelNotFoundError(f"{text} is a file; a model is a diffusers folder (with model_index.json), a hub id "
                                 f"(owner/name) or a registered name ({', '.join(MODELS)}).")
    if os.sep in text.rstrip(os.sep) and not _HUB_ID.match(text) or text.startswith((".", "~", "/")):
        raise ModelNotFoundError(f"The folder {text} does not exist. Pass an existing diffusers folder, a hub id "
                                 f"(owner/name) or a registered name ({', '.join(MODELS)}).")
    if _HUB_ID.match(text):
        known = next((s for s in MODELS.values() if s.repo_id == text), None)
        if known is not None:
            return resolve_model(known.name)
        return ResolvedModel(None, repo_id=text, key=text)
    raise ModelNotFoundError(
        f"Unknown model {text!r}. Registered models: {', '.join(MODELS)}. "
        "You can also pass a local diffusers folder or a hub id (owner/name)."
    )


def fetch_from_hub(repo_id: str, name: str | None = None) -> Path:
    """Download (or find in the hub cache) a pipeline repository; one clear error on any failure."""
    try:
        from diffusers import DiffusionPipeline

        offline = env_flag("HF_HUB_OFFLINE")
        folder = Path(DiffusionPipeline.download(repo_id, local_files_only=offline, use_safetensors=True))
    except Exception as e:  # network, auth, gating, missing repo: all become one actionable message
        kind = type(e).__name__
        why = "the hub is unreachable or offline mode is on (HF_HUB_OFFLINE=1)"
        if "Gated" in kind:
            why = "the repository is gated: accept its licence on the hub and log in with `hf auth login`"
        elif "RepositoryNotFound" in kind:
            why = "no such repository on the hub (check the id, or log in for a private one)"
        also = f" There is no folder named {repo_id} here either." if name is None else ""
        raise ModelNotFoundError(
            f"Could not get {repo_id}: {why} ({kind}).{also}\n{_download_hint(repo_id, name)}"
        ) from None
    missing = check_model_folder(folder)
    if missing:
        raise IncompleteModelFolderError(str(folder), missing, _download_hint(repo_id, name))
    return folder


# ---------------------------------------------------------------------------- loading

_PIPELINE_CACHE: dict[tuple, Any] = {}


def load_pipeline(
    model: str | os.PathLike | ResolvedModel | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    cpu_offload: str | bool = False,
    vae_tiling: bool = False,
    cache: bool = True,
):
    """Load a diffusers pipeline by registry name, local folder or hub id.

    Args:
        model: a name from ``kinegen models`` (default: the bundled/tiny default model), a local
            diffusers folder (checked for every component first), a hub id ``owner/name``, or what
            :func:`resolve_model` returned for one of these (so that it is resolved once).
        device: ``"cuda"``, ``"cpu"``, ``"mps"``... (default: the best available).
        dtype: ``"bf16"``, ``"fp16"``, ``"fp32"`` or a ``torch.dtype`` (default: bf16 on CUDA, fp32 on CPU).
        cpu_offload: ``"model"`` (or True) moves whole components to the GPU only while they run;
            ``"sequential"`` streams submodules (slowest, least memory). Needs a GPU.
        vae_tiling: decode the VAE in tiles (less memory for large videos).
        cache: reuse a pipeline already loaded with the same arguments in this process.

    The returned pipeline carries ``pipe.kinegen_spec`` (a :class:`~kinegen.registry.ModelSpec`
    with the model's default size, frames, steps and guidance).
    """
    import torch

    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model)
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    try:
        offload = {True: "model", False: None, "none": None}.get(cpu_offload, cpu_offload)
    except TypeError:  # unhashable: refused just below
        offload = cpu_offload
    if offload not in (None, "model", "sequential"):
        raise KinegenError(f"cpu_offload must be 'model', 'sequential' or False, not {cpu_offload!r}.")
    if offload and dev.type == "cpu":
        raise KinegenError("CPU offload moves components to a GPU while they run; there is no GPU here. "
                           "Drop --cpu-offload.")
    key = (resolved.key, str(dev), str(dt), offload, vae_tiling)
    if cache and key in _PIPELINE_CACHE:
        return _PIPELINE_CACHE[key]

    spec = resolved.spec
    if spec is not None and spec.builder is not None:
        pipe = spec.builder()
        if dt != torch.float32:
            pipe.to(dtype=dt)
    else:
        folder = resolved.folder or fetch_from_hub(resolved.repo_id, spec.name if spec else None)
        spec = spec or _spec_for_folder(folder, resolved.repo_id)
        bad = _weight_problems(Path(folder))  # before diffusers, which says little about a truncated file
        if bad:
            what = (f"The weights file {bad[0][0]} is truncated or corrupt ({bad[0][1]})." if len(bad) == 1 else
                    f"{len(bad)} weights files in {folder} are truncated or corrupt: "
                    + "; ".join(f"{p.relative_to(folder)} ({why})" for p, why in bad) + ".")
            raise CorruptModelFileError(f"{what} {_corrupt_hint(folder, resolved.repo_id or spec.repo_id)}")
        with out_of_memory_guard(doing=f"loading {spec.name} on {dev}", hint=_LOAD_OOM_HINT):
            pipe = _from_folder(folder, dt)
    with out_of_memory_guard(doing=f"loading {spec.name} on {dev}", hint=_LOAD_OOM_HINT):
        if offload == "model":
            pipe.enable_model_cpu_offload(device=dev)
        elif offload == "sequential":
            pipe.enable_sequential_cpu_offload(device=dev)
        else:
            pipe.to(dev)
    if vae_tiling:
        if not hasattr(pipe.vae, "enable_tiling"):
            raise KinegenError(f"The VAE of {spec.name} ({type(pipe.vae).__name__}) does not support tiling.")
        pipe.vae.enable_tiling()
    pipe.set_progress_bar_config(leave=False)
    pipe.kinegen_spec = spec
    if cache:
        _PIPELINE_CACHE[key] = pipe
    return pipe


_LOAD_OOM_HINT = "try --cpu-offload model (or sequential, least memory), or a smaller --dtype (bf16)"


def _corrupt_hint(folder: Path, repo_id: str | None) -> str:
    """What to do about a truncated or corrupt weights file, by where the folder came from."""
    if Path(folder).resolve().is_relative_to(ASSETS_DIR.resolve()):
        return "The bundled models ship with the repository: `git checkout -- assets/` restores them."
    if repo_id and "snapshots" in Path(folder).parts:  # the hub cache
        return f"Re-download it: `hf download {repo_id} --force-download`."
    if repo_id:
        return f"Re-download it: `hf download {repo_id} --local-dir {folder} --force-download`."
    return (f"Re-download the model (`hf download <owner/name> --local-dir {folder} --force-download`) or re-export "
            "it (`pipe.save_pretrained(folder)`, or run `kinegen train` again).")


def _from_folder(folder: Path, dtype: torch.dtype):
    import diffusers

    cls_name, adapter = _family_of_folder(folder)
    cls = adapter.pipeline_class(cls_name)
    if cls is None:
        raise ModelNotFoundError(f"{folder} holds a {cls_name}, which this diffusers {diffusers.__version__} "
                                 "does not have; install the diffusers version Kinegen pins (pip install -e .).")
    from .models.rope import install_position_interpolation, read_rope_file

    reference_grid = read_rope_file(folder)  # a broken file fails before the weights load
    try:
        pipe = cls.from_pretrained(folder, dtype=dtype, use_safetensors=True, local_files_only=True)
    except Exception as e:  # corrupt or mismatched files: one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelNotFoundError(f"diffusers could not load {folder} as a {cls_name}: {first.rstrip('.')}. Restore "
                                 "the folder from the original checkpoint (or download it again).") from None
    if reference_grid is not None:  # trained at several sizes with interpolated positions (kinegen.models.rope)
        install_position_interpolation(pipe.transformer, reference_grid)
    return pipe


def describe_models() -> list[dict[str, Any]]:
    """One row per registered model: name, family, kind, source and whether it is available offline."""
    rows = []
    for spec in MODELS.values():
        if spec.builder is not None:
            avail, where = True, "built in code"
        elif spec.bundled is not None:
            folder = ASSETS_DIR / "models" / spec.bundled
            avail, where = not check_model_folder(folder), str(folder)
        else:
            local = _local_copy(spec)
            avail, where = local is not None and not check_model_folder(local), str(local or "not downloaded")
        rows.append(dict(name=spec.name, family=spec.family, kind=spec.kind,
                         description=spec.description, source=spec.source, available=avail, where=where,
                         size=spec.size_note))
    return rows
