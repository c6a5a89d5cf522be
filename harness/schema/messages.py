"""Schema, Hydra and OmegaConf errors as one line: the key, the bad value, what is allowed."""

from __future__ import annotations

import difflib
import json
import math
import typing

from pydantic import BaseModel, ValidationError


def show(value) -> str:
    """A value as it is written on the command line (true, inf, [1, 2], fast)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
        short = f"{value:g}"  # six digits, unless they lose what was given (16.0000000001 is not 16)
        return short if float(short) == value else repr(value)
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def closest(name: str, known) -> str:
    """`; did you mean X?` for the nearest known name, or nothing when none is near."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def unknown_key(key: str, fields: list[str], where: str) -> str:
    """`KEY is not a key of WHERE; did you mean NEAREST? (its keys: ...)`."""
    if not fields:  # a table the schema does not spell out (an experiment's): the config shows it
        return f"{key} is not a key of {where} (--cfg job -p {where} beside the same overrides prints its keys)"
    prefix, _, last = key.rpartition(".")
    match = difflib.get_close_matches(last, [f for f in fields if f != last], n=1, cutoff=0.6)
    hint = f"; did you mean {prefix + '.' if prefix else ''}{match[0]}?" if match else ""
    return f"{key} is not a key of {where}{hint} (its keys: {', '.join(fields)})"


def section_model(annotation) -> type[BaseModel] | None:
    """The section a field holds (`Sampling`, or `Sampling | None` as validate's changes hold it)."""
    for kind in (annotation, *typing.get_args(annotation)):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None


def _fields_at(model, loc: list[str]) -> list[str]:
    """The field names of the (nested) model that holds the key at `loc`."""
    cursor = model
    for part in loc[:-1]:
        if isinstance(cursor, type) and issubclass(cursor, BaseModel) and part in cursor.model_fields:
            cursor = cursor.model_fields[part].annotation
            if typing.get_origin(cursor) is not dict:  # a mapping's values are a key further on
                cursor = section_model(cursor) or cursor  # Sampling | None: its Sampling
        elif typing.get_origin(cursor) is dict:
            cursor = typing.get_args(cursor)[1]  # `part` is a key of the mapping
        else:
            break
    return (
        list(cursor.model_fields)
        if isinstance(cursor, type) and issubclass(cursor, BaseModel)
        else list(model.model_fields)
    )


BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _field_at(model, loc: list[str]):
    """The FieldInfo of the (nested) key at `loc`, or None."""
    cursor, field = model, None
    for part in loc:
        fields = cursor.model_fields if isinstance(cursor, type) and issubclass(cursor, BaseModel) else {}
        field = fields.get(part)
        if field is None:
            return None
        cursor = field.annotation
    return field


def allowed(error: dict) -> str:
    """What a pydantic error says is allowed, in kvbench's words (`must be > 0`)."""
    message = error["msg"]
    bound = next(iter((error.get("ctx") or {}).values()), None) if error["type"] in BOUNDS else None
    if isinstance(bound, (int, float)) and abs(bound) >= 1e6:  # 1e+09, not 1000000000
        text = f"{bound:.4g}"
        if float(text) != bound:  # rounded, it would allow what it refuses (seed <= 4.295e+09)
            text = str(int(bound)) if float(bound).is_integer() else repr(float(bound))
        return f"must be {BOUNDS[error['type']]} {text}"
    if error["type"] == "value_error":
        return message.removeprefix("Value error, ")
    if error["type"] in ("bool_type", "bool_parsing"):
        return "must be true or false"
    if error["type"] == "int_from_float":
        return "must be a whole number"
    if error["type"] == "int_parsing_size":  # 1e308: a whole number past any range here
        return "must be a whole number of a sensible size (see bench --help for its range)"
    if error["type"] in ("int_parsing", "int_type"):
        return "must be an integer"
    if error["type"] in ("float_parsing", "float_type"):
        return "must be a number"
    if error["type"] == "finite_number":
        return "must be a finite number"
    if error["type"] == "missing":
        return "is required"
    if error["type"] == "string_type":
        return "must be text (a name)"
    if error["type"] == "string_pattern_mismatch" and (error.get("ctx") or {}).get("pattern") == r"\S":
        return "must not be empty: it names the rows"
    if error["type"] == "list_type":
        return "must be a list: write [a,b]"
    if error["type"] == "too_short":
        least = (error.get("ctx") or {}).get("min_length", 1)
        return f"must list at least {least} value{'s' if least != 1 else ''}"
    return (
        message.replace("Input should be", "must be")
        .replace("greater than or equal to", ">=")
        .replace("less than or equal to", "<=")
        .replace("greater than", ">")
        .replace("less than", "<")
    )


def validation_line(err: ValidationError, group: str, model) -> str:
    """The first error of a group's validation as `group.key=value must be ...`."""
    errors = err.errors(include_url=False)
    error = errors[0]
    loc = [str(part) for part in error["loc"] if not isinstance(part, int)]
    members = []
    if loc and _union_member(loc[-1]):  # a field of several types: one error per type, named by it
        members = [e for e in errors if [str(p) for p in e["loc"] if not isinstance(p, int)][:-1] == loc[:-1]]
        loc = loc[:-1]
    key = ".".join([group, *loc]) if group else ".".join(loc)
    if members:
        texts = dict.fromkeys(allowed(e).removeprefix("must be ") for e in members)
        return f"{key}={show(error.get('input'))} must be {', or '.join(texts)}"
    if error["type"] == "extra_forbidden":
        where = ".".join(part for part in [group, *loc[:-1]] if part) or "the config"
        return unknown_key(key, _fields_at(model, loc), where)
    if error["type"] == "missing":
        return f"{key} is required (set {key}=VALUE)"
    if error["type"] == "dict_type":  # an experiment's table (fig12=5)
        return f"{key}={show(error.get('input'))} must be a section: set its keys, {key}.KEY=VALUE"
    if error["type"] == "model_type":  # a value where a section goes (scenario.sampling=nope)
        keys = ", ".join(_fields_at(model, [*loc, ""]))
        return f"{key}={show(error.get('input'))} must be a section: set its keys, {key}.KEY=VALUE (its keys: {keys})"
    if not loc:  # a check across fields: its message starts with the field it blames, if one
        message = allowed(error)
        blamed = message.split("=", 1)[0]
        return f"{group}.{message}" if group and blamed in model.model_fields else f"{group or 'config'}: {message}"
    text = allowed(error)
    field = _field_at(model, loc) if error["type"] in BOUNDS else None
    if field is not None and field.description and "/s" in field.description:  # a rate: say its unit
        text += f" ({field.description})"
    return rule(f"{key}={show(error.get('input'))}", text)


def _union_member(part: str) -> bool:
    """pydantic names each type of a union field in the error's location: bool, literal['auto'], ..."""
    return part in ("bool", "int", "float", "str", "none") or "[" in part


def rule(setting: str, text: str) -> str:
    """`key=value must be ...`, or `key=value: why not` when the reason is not a rule."""
    return f"{setting} {text}" if text.startswith("must") else f"{setting}: {text}"
