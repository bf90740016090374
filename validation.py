"""Bad input, reported the same way by every tower: one line per problem, naming the file,
the field and the value, and what was expected (no tracebacks, no pydantic URLs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


def validation_lines(err: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem of a pydantic error: ``<prefix><field>: <message> (got <value>)``,
    without pydantic's "Value error," prefix and documentation URL."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        where = prefix + loc if loc else (prefix.strip() or "(top level)")
        msg = e["msg"].removeprefix("Value error, ")
        got = f" (got {e['input']!r})" if e["type"] != "value_error" or e.get("loc") else ""
        lines.append(f"{where}: {msg}{got}"[:400])
    return lines


def read_yaml(path: str | Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """The YAML document at ``path``; ``error`` in one line saying "no such <what>", why the
    file cannot be read (a folder, no permission, not UTF-8 text) or "not valid YAML" with
    the line and column of the first problem."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not valid YAML: not UTF-8 text (byte {e.start}); expected a {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{path}: not valid YAML{where}: {problem}") from None


def validate_yaml(model, path: str | Path, what: str, error: type[ValueError] = ValueError):
    """``model`` (a pydantic class) from the YAML at ``path``; ``error`` names the file and
    lists every invalid field, one per line."""
    try:
        return model.model_validate(read_yaml(path, what, error))
    except ValidationError as e:
        raise error("\n".join([f"{path}: invalid {what}"] + ["  " + line for line in validation_lines(e)])) from None
