"""The scale case file (cases/scale/*.toml): groups of axes expanded to cases, validated with one-line
errors naming the file, key and value. Kept apart from cases/*.toml (the CPU/GPU matrix): these
cases have their own runner (parity scale), since at these shapes nothing but reductions leaves a rank."""
from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "cases" / "scale" / "h200.toml"
SUBJECTS = {"vocab_parallel": ("torch", "liger"), "column_gathered": (None,), "fused_linear_ce": (None,)}
AXES = {"subject": str, "backend": str, "dtype": str, "vocab": int, "hidden": int, "tokens": int,
        "tp": int, "lr": float, "samples": int, "seed": int, "device": str, "plant": str}
DTYPES = ("fp32", "bf16")


class ScaleCaseError(ValueError):
    pass


def case_id(c: dict) -> str:
    backend = f"-{c['backend']}" if c.get("backend") else ""
    plant = f"-plant_{c['plant']}" if c.get("plant") else ""
    return f"{c['subject']}{backend}-{c['dtype']}-V{c['vocab']}-H{c['hidden']}-T{c['tokens']}-tp{c['tp']}{plant}"


def _check(path, where: str, key: str, value) -> None:
    from parity.scale.subjects import PLANTS

    kind = AXES.get(key)
    if kind is None:
        raise ScaleCaseError(f"{path}: {where}: unknown key {key!r} (known: {', '.join(AXES)})")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        if not (kind is float and isinstance(value, int)):
            raise ScaleCaseError(f"{path}: {where}: {key} = {value!r} must be {kind.__name__}")
    bad = ((key == "subject" and value not in SUBJECTS) or (key == "dtype" and value not in DTYPES)
           or (key == "device" and value not in ("cuda", "cpu")) or (key == "plant" and value not in PLANTS)
           or (kind is int and key != "seed" and value < 1))
    if bad:
        raise ScaleCaseError(f"{path}: {where}: bad value {key} = {value!r}")


def expand(data: dict, path="<scale cases>") -> list[dict]:
    defaults = dict(data.get("defaults", {}))
    for k, v in defaults.items():
        _check(path, "[defaults]", k, v)
    cases, seen = [], set()
    for n, group in enumerate(data.get("group", [])):
        where = f"[[group]] #{n + 1}"
        axes = {k: (v if isinstance(v, list) else [v]) for k, v in group.items() if k != "description"}
        for k, vs in axes.items():
            for v in vs:
                _check(path, where, k, v)
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            c = {"backend": None, "device": "cuda", **defaults, **dict(zip(keys, combo))}
            missing = [k for k in ("subject", "dtype", "vocab", "hidden", "tokens", "tp", "lr", "samples", "seed")
                       if k not in c]
            if missing:
                raise ScaleCaseError(f"{path}: {where}: missing {', '.join(missing)}")
            if c["backend"] not in SUBJECTS[c["subject"]]:
                raise ScaleCaseError(f"{path}: {where}: backend = {c['backend']!r} is not one of "
                                     f"{SUBJECTS[c['subject']]} for subject {c['subject']!r}")
            c["id"] = case_id(c)
            if c["id"] in seen:
                raise ScaleCaseError(f"{path}: {where}: case {c['id']} appears twice")
            seen.add(c["id"])
            cases.append(c)
    if not cases:
        raise ScaleCaseError(f"{path}: no [[group]] cases")
    return cases


def load(path: Path | None = None) -> list[dict]:
    path = Path(path or DEFAULT_FILE)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ScaleCaseError(f"{path}: no such scale case file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScaleCaseError(f"{path}: not valid TOML: {exc}") from None
    return expand(data, path)


def override(cases: list[dict], spec: str | None) -> list[dict]:
    """--shape tokens=64,vocab=128,hidden=16,device=cpu: the same cases at other sizes (CPU rehearsal)."""
    if not spec:
        return cases
    changes = {}
    for item in spec.split(","):
        key, _, raw = item.partition("=")
        if key not in ("tokens", "vocab", "hidden", "samples", "device"):
            raise ScaleCaseError(f"--shape: cannot override {key!r} (tokens, vocab, hidden, samples, device)")
        try:
            changes[key] = raw if key == "device" else int(raw)
        except ValueError:
            raise ScaleCaseError(f"--shape: {key} = {raw!r} is not an integer") from None
        _check("--shape", "override", key, changes[key])
    out, seen = [], set()
    for c in cases:
        c = {**c, **changes}
        c["id"] = case_id(c)
        if c["id"] not in seen:
            seen.add(c["id"])
            out.append(c)
    return out
