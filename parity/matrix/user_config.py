"""A user's architecture and DeepSpeed config -> one zoo case (`parity check`).

The config is read key by key (dotted paths to its leaves) against one table, ``KEYS``: each key either sets an
axis of the case (tensor_parallel, zero_optimization.stage, bf16/fp16, gradient_clipping,
gradient_accumulation_steps), picks the subject (preset_model, vocab_parallel_lm_head: ``SUBJECT_PATHS``, with
whether the arch carries an HF plan), is held to the value the case runs (the micro-batch size, DeepSpeed's
defaults the zoo subjects leave alone), or changes no number (logging, bucket sizes at DP 1). Any other key, or a
value the subject's axes do not hold, is a ``UserConfigError`` naming the key: the check never runs a configuration
other than the one the user wrote. A user's config.json is shrunk keeping its structure and carried by the
arch_config axis (``resolve_arch``). docs/check.md has the tables as prose.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from parity.axes import ARCHITECTURES, AXES
from parity.matrix.cases import Case, case_id, load
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve, subject_axes
from references.trajectory import TrainingSpec

# The zoo subject a config's tensor_parallel section asks for, the first row that matches:
# (preset_model given, the arch carries an HF plan, vocab_parallel_lm_head as written: True, False or None for left
# out; None in a row matches any) -> (subject, how vocab_parallel_lm_head reaches it: "axis" the subject's
# vocab_parallel_lm_head axis ("false" when left out), "implied" the subject is that value, "auto" DeepSpeed's choice
# from the plan, which an explicit false may state only where that choice is already false). An arch without a plan
# goes where DeepSpeed sends it: AutoTP's heuristic parser.
SUBJECT_PATHS = (
    ((True, None, None), ("zoo_preset", "axis")),
    ((False, False, None), ("zoo_heuristic", "axis")),
    ((False, True, True), ("zoo_vocab_parallel", "implied")),
    ((False, True, None), ("zoo_hf_plan", "auto")),
)
PRESET_KEY, VOCAB_KEY = "tensor_parallel.preset_model", "tensor_parallel.vocab_parallel_lm_head"
# The precision sections (DeepSpeed also reads "bfloat16" as bf16) -> the dtype axis's value when enabled.
PRECISION = {"bf16.enabled": "bf16", "bfloat16.enabled": "bf16", "fp16.enabled": "fp16"}
# Where the case files' own cases of the zoo subjects live, in order: a case the user's config gives that is one of
# them takes its expectations (known divergences) from the first file holding it (full.toml repeats some of
# zoo.toml's cases without their marks' context).
TWIN_FILES = ("zoo.toml", "zoo/full.toml")


class UserConfigError(ValueError):
    """Input `parity check` cannot honour: one line naming the file and the key (exit 2)."""


@dataclass(frozen=True)
class Key:
    """One honoured key: ``axis`` (the case axis it sets, to a value the subject declares), else ``fixed`` (the only
    value the case runs: a function of the resolved values; ``why``) or ``neutral`` (any value: why it changes no
    number)."""
    axis: str | None = None
    fixed: object = None
    neutral: str = ""
    why: str = ""


# Dotted key -> how the check honours it. Values DeepSpeed would take as its defaults where the zoo subjects do not
# set the key (parity/subjects/deepspeed_autotp.py EngineHead.ds_config) are accepted at exactly that default.
KEYS = {
    "tensor_parallel.autotp_size": Key(axis="tp"),
    "tensor_parallel.tp_size": Key(axis="tp"),
    "zero_optimization.stage": Key(axis="zero"),
    "gradient_accumulation_steps": Key(axis="gas"),
    "gradient_clipping": Key(axis="clip"),
    "train_micro_batch_size_per_gpu": Key(fixed=lambda v: TrainingSpec.batch, why="the trajectory trains micro-batches of "
                                          f"{TrainingSpec.batch} sequences (references/trajectory.py)"),
    "train_batch_size": Key(fixed=lambda v: TrainingSpec.batch * v["gas"],
                            why="micro-batch x gradient_accumulation_steps x DP 1 (the check runs world = tp)"),
    "tensor_parallel.tp.tp_grain_size": Key(fixed=lambda v: 1, why="the zoo subjects shard at grain 1"),
    "tensor_parallel.tp_overlap_comm": Key(fixed=lambda v: False, why="the zoo subjects do not declare overlap"),
    "tensor_parallel.keep_module_on_host": Key(fixed=lambda v: False,
                                               why="the zoo subjects do not declare keep_on_host"),
    "prescale_gradients": Key(fixed=lambda v: False, why="the zoo subjects average gradients by DeepSpeed's default"),
    "gradient_predivide_factor": Key(fixed=lambda v: 1.0,
                                     why="the zoo subjects average gradients by DeepSpeed's default"),
    "steps_per_print": Key(neutral="logging cadence"),
    "wall_clock_breakdown": Key(neutral="timing printout"),
    "zero_allow_untested_optimizer": Key(neutral="lets a client optimizer through; the check always passes one"),
    "zero_optimization.reduce_bucket_size": Key(neutral="communication grouping; at DP 1 each element is reduced "
                                                "over one rank whatever the bucket"),
    "zero_optimization.allgather_bucket_size": Key(neutral="communication grouping; at DP 1 each element is "
                                                   "gathered from one rank whatever the bucket"),
    **{key: Key(neutral="the precision section's switch (read as dtype)") for key in PRECISION},
    PRESET_KEY: Key(neutral="picks the subject (zoo_preset), when it is the arch's family"),
    VOCAB_KEY: Key(neutral="picks the subject, or sets its vocab_parallel_lm_head axis"),
}
CLIP_DEFAULT = 1.0  # DeepSpeed 0.19.8's GRADIENT_CLIPPING_DEFAULT (findings/deepspeed_default_gradient_clipping.toml)


def leaves(config: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every leaf of ``config``, in file order; an empty section is a leaf of its own."""
    found = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            found += leaves(value, path + ".")
        else:
            found.append((path, value))
    return found


def read_config(path: str) -> dict:
    shown = f"--ds-config {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserConfigError(f"{shown}: cannot read it: {exc.strerror or exc}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserConfigError(f"{shown}: not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UserConfigError(f"{shown}: not a JSON object (a DeepSpeed config is one)")
    return config


@dataclass
class Translated:
    """The case a config gives, and the lines telling the user what was read into it."""
    case: Case
    notes: list


def _axis_value(shown: str, key: str, axis: str, value, subject: str):
    """``value`` as ``axis`` holds it, or the one-line refusal naming ``key``."""
    if axis == "clip" and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = float(value)
    allowed = subject_axes(SUBJECTS[subject])[axis]
    if not AXES[axis].accepts(value) or (allowed is not None and value not in allowed):
        holds = ", ".join(map(repr, allowed)) if allowed is not None else AXES[axis].allowed()
        raise UserConfigError(f"{shown}: key '{key}' = {value!r} cannot be honoured: {subject} runs {holds} "
                              f"(its {axis} axis)")
    return value


def translate(config: dict, path: str, arch: str, tp: int | None = None, dtype: str | None = None,
              user: str = "") -> Translated:
    """The one case `parity check` runs for ``config`` (read from ``path``) on ``arch`` (``user``: a stored
    config.json of it, the arch_config axis), with the command line's --tp and --dtype where given (a config that
    says otherwise is refused, naming its key)."""
    shown = f"--ds-config {path}"
    items = leaves(config)
    for key, value in items:
        if key not in KEYS:
            raise UserConfigError(f"{shown}: key '{key}' cannot be honoured: `parity check` expresses "
                                  f"{', '.join(sorted(k for k in KEYS))} (docs/check.md)")
        if value == "auto":
            raise UserConfigError(f"{shown}: key '{key}' = 'auto' cannot be honoured: 'auto' is filled in by "
                                  "transformers' Trainer; write the value it would get")
    given = dict(items)
    notes = []
    subject, vocab_axis = _subject(shown, given, arch, user)
    values: dict = {"arch": arch, "arch_config": user, **vocab_axis}
    # Precision: the enabled section, then --dtype, which must agree.
    enabled = [(k, d) for k, d in PRECISION.items() if given.get(k) is True]
    for key in PRECISION:
        if key in given and not isinstance(given[key], bool):
            raise UserConfigError(f"{shown}: key '{key}' = {given[key]!r}: want true or false")
    if len(enabled) > 1:
        raise UserConfigError(f"{shown}: key '{enabled[1][0]}': two precision sections enabled "
                              f"({enabled[0][0]} too)")
    if enabled:
        key, config_dtype = enabled[0]
        if dtype is not None and dtype != config_dtype:
            raise UserConfigError(f"{shown}: key '{key}' asks for {config_dtype}, --dtype {dtype}: give one")
        values["dtype"] = _axis_value(shown, key, "dtype", config_dtype, subject)
    else:
        values["dtype"] = _axis_value(shown, "--dtype", "dtype", dtype or "fp32", subject)
    # The axis keys, the command line's --tp beside the config's tensor_parallel size.
    sizes = [k for k in ("tensor_parallel.autotp_size", "tensor_parallel.tp_size") if k in given]
    if len(sizes) == 2 and given[sizes[0]] != given[sizes[1]]:
        raise UserConfigError(f"{shown}: key '{sizes[1]}' = {given[sizes[1]]!r} differs from '{sizes[0]}' = "
                              f"{given[sizes[0]]!r}")
    if sizes and tp is not None and given[sizes[0]] != tp:
        raise UserConfigError(f"{shown}: key '{sizes[0]}' = {given[sizes[0]]!r} differs from --tp {tp}: give one")
    for key, value in items:
        rule = KEYS[key]
        if rule.axis is not None:
            values[rule.axis] = _axis_value(shown, key, rule.axis, value, subject)
    if "tp" not in values:
        # No size in the config: DeepSpeed alone would not shard; the check is for tensor parallelism, so it runs
        # --tp, or the subject's default, as if the config said autotp_size, and says so.
        values["tp"] = _axis_value(shown, "--tp", "tp", tp if tp is not None else resolve(
            SUBJECTS[subject], {"arch": arch})["tp"], subject)
        notes.append(f"tensor_parallel.autotp_size: absent, so the check runs tp {values['tp']} "
                     f"({'--tp' if tp is not None else 'the default'}) as if the config said it")
    if "clip" not in values:
        values["clip"] = _axis_value(shown, "gradient_clipping", "clip", CLIP_DEFAULT, subject)
        notes.append(f"gradient_clipping: absent, so DeepSpeed 0.19.8 clips at its default {CLIP_DEFAULT:g} "
                     "(finding deepspeed_default_gradient_clipping); the reference clips at it too")
    resolved = resolve(SUBJECTS[subject], values)
    for key, value in items:
        rule = KEYS[key]
        if rule.fixed is not None:
            want = rule.fixed(resolved)
            if value != want or isinstance(value, bool) != isinstance(want, bool):
                raise UserConfigError(f"{shown}: key '{key}' = {value!r} cannot be honoured: the check runs "
                                      f"{want!r} ({rule.why})")
    problem = SUBJECTS[subject].invalid(resolved)
    if problem:
        raise UserConfigError(f"{shown}: {problem}")
    case = Case(id=case_id(subject, resolved), subject=subject, axes=tuple(resolved.items()), source=shown,
                markers=tuple(SUBJECTS[subject].markers(resolved)))
    twin = _twin(case)
    if twin is not None:
        notes.append(f"the case files hold this case ({twin.source}): its expectations apply")
    return Translated(twin or case, notes)


def _has_plan(arch: str, user: str) -> bool:
    from parity.subjects.zoo import planned

    return bool(planned(arch, user)["plan"])


def _subject(shown: str, given: dict, arch: str, user: str) -> tuple[str, dict]:
    """(subject, its vocab_parallel_lm_head axis value where it has one) by SUBJECT_PATHS, or the refusal naming
    the tensor_parallel key that cannot be honoured."""
    from parity.subjects.zoo import PRESET_OF

    vocab = given.get(VOCAB_KEY)
    if VOCAB_KEY in given and not isinstance(vocab, bool):
        raise UserConfigError(f"{shown}: key '{VOCAB_KEY}' = {vocab!r}: want true or false")
    preset = given.get(PRESET_KEY)
    if PRESET_KEY in given:
        if arch not in PRESET_OF:
            raise UserConfigError(f"{shown}: key '{PRESET_KEY}' = {preset!r} cannot be honoured: {arch} is no AutoTP "
                                  f"preset family (the presets' architectures: {', '.join(PRESET_OF)})")
        if preset != PRESET_OF[arch]:
            raise UserConfigError(f"{shown}: key '{PRESET_KEY}' = {preset!r} cannot be honoured: {arch}'s preset is "
                                  f"{PRESET_OF[arch]!r}; another family's layer names would shard it silently wrong")
    has_plan = True if PRESET_KEY in given else _has_plan(arch, user)
    row = (PRESET_KEY in given, has_plan, vocab)
    subject, how = next(path for pattern, path in SUBJECT_PATHS
                        if all(p is None or p == r for p, r in zip(pattern, row)))
    if how == "axis":
        return subject, {"vocab_parallel_lm_head": "true" if vocab else "false"}
    if how == "auto" and vocab is False:
        values = resolve(SUBJECTS[subject], {"arch": arch, "arch_config": user})
        if SUBJECTS[subject].vocab_parallel(values):
            raise UserConfigError(f"{shown}: key '{VOCAB_KEY}' = False cannot be honoured: {arch}'s plan (tied, "
                                  "embedding_rowwise) makes DeepSpeed's own choice vocabulary-parallel, and no zoo "
                                  "subject turns it off; leave the key out or set it true")
    return subject, {}


def case_toml(case: Case, description: str) -> str:
    """A one-entry case file that makes exactly ``case`` (every axis spelled out; JSON scalars are TOML's)."""
    lines = ["[[matrix]]", f"subject = {json.dumps(case.subject)}", f"description = {json.dumps(description)}",
             "[matrix.axes]"]
    lines += [f"{axis} = [{json.dumps(value)}]" for axis, value in case.values.items()]
    return "\n".join(lines) + "\n"


def _twin(case: Case) -> Case | None:
    """The same case (id and values) in the zoo's case files, with their marks; None where they hold none."""
    from parity.matrix.cases import CASES_DIR

    for path in (CASES_DIR / name for name in TWIN_FILES):  # in order: the first file holding it has its marks
        if path.is_file():
            twin = next((c for c in load([path]) if c.id == case.id and c.values == case.values), None)
            if twin is not None:
                return twin
    return None


# ---- the architecture --------------------------------------------------------------------------------------------

def resolve_arch(arch: str) -> tuple[str, str, list]:
    """``--arch``: a model_type of the installed transformers, or a config.json (or a folder holding one) of one,
    shrunk keeping its structure (references.zoo.structure) and stored by name (the arch_config axis).
    -> (model_type, the stored name or "", notes)."""
    if arch in ARCHITECTURES:
        return arch, "", []
    path = Path(arch)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserConfigError(f"--arch {arch}: neither a causal-LM model_type of transformers (e.g. llama, qwen2, "
                              "gemma2; parity/axes.py ARCHITECTURES) nor a config.json")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserConfigError(f"--arch {arch}: not a readable JSON config: {exc}") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in ARCHITECTURES:
        raise UserConfigError(f"--arch {arch}: key 'model_type' = {model_type!r} is no causal-LM model_type of "
                              "transformers (parity/axes.py ARCHITECTURES)")
    from references import zoo

    try:
        full = zoo.config_from_dict(raw)
        small = zoo.shrunk(full)
    except Exception as exc:  # noqa: BLE001 - the config class's own refusal, in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserConfigError(f"--arch {arch}: transformers cannot read it: {first}") from None
    want, got = zoo.structure(full), zoo.structure(small)
    for trait in want:
        if want[trait] != got[trait]:
            raise UserConfigError(f"--arch {arch}: its {trait} is {want[trait]!r}, shrunk {got[trait]!r}: the zoo "
                                  "cannot shrink this config keeping its structure")
    if zoo._text(small).vocab_size != zoo.VOCAB:
        raise UserConfigError(f"--arch {arch}: key 'vocab_size' = {zoo._text(full).vocab_size!r}: the check runs a "
                              f"vocabulary of {zoo.VOCAB} (a larger one is shrunk to it)")
    name = zoo.store_config(raw, path.parent.name if path.name == "config.json" else path.stem)
    kept = ", ".join(f"{k} {v!r}" for k, v in got.items() if v not in (None, False, [], ""))
    t = zoo._config_traits(small)
    return model_type, name, [f"--arch {arch}: {model_type} from this config, shrunk to {t['heads']}/{t['kv_heads']} "
                              f"heads keeping {kept}; stored as arch_config {name} ({zoo.config_store()})"]
