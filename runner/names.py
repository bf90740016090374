"""Names that become paths, script lines and cluster objects, and the paths made from them.

A suite's and a run's name become folder names under the results root, a Slurm job name
and a Kubernetes object name. Every such name matches `NAME_PATTERN`, checked when the
recipe loads, so no name can climb out of the results root (``../..``), start at the file
system's root (``/tmp/x``) or carry a newline into a generated script. Every path the tool
writes or deletes is also checked to lie inside its root (`inside`), whatever made it.
"""

from __future__ import annotations

import re
from pathlib import Path

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 characters"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # Kubernetes (RFC 1123), at most 63 characters


class UnsafePath(ValueError):
    """A path that would leave the folder it must stay in."""


def check_name(value: str, what: str) -> str:
    """``value`` if it is a safe name (`NAME_PATTERN`); else ValueError naming ``what``."""
    if not isinstance(value, str) or not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(f"{what} {value!r}: expected {NAME_RULE}")
    return value


def slug(value: object) -> str:
    """A matrix value as a name part: lower case, runs of other characters as '-'."""
    return re.sub(r"[^a-z0-9.]+", "-", str(value).lower()).strip("-.") or "x"


def inside(root: str | Path, path: str | Path) -> Path:
    """``path`` resolved, after checking that it lies inside ``root`` (resolved too)."""
    root_resolved, resolved = Path(root).resolve(), Path(path).resolve()
    if resolved != root_resolved and not resolved.is_relative_to(root_resolved):
        raise UnsafePath(f"{path}: outside {root}; nothing is written or deleted there")
    return resolved


def dns_label(value: str) -> str:
    """``value`` as a Kubernetes object name (a DNS-1123 label): lower case, '-' for other
    characters, at most 63 characters; ValueError if nothing is left."""
    label = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:63].rstrip("-")
    if not DNS_LABEL.fullmatch(label):
        raise ValueError(f"{value!r} gives no valid Kubernetes name (RFC 1123 label)")
    return label
