"""Secret-looking environment values are never written out.

A recipe's ``serve.env`` may carry credentials (``HF_TOKEN``, ``WANDB_API_KEY``, cloud
keys). The server needs their values; no file, log line or process listing the tool makes
does. `is_secret` says which keys look secret; `redact_env` and `redact_recipe` give the
copies that are written (the run's recipe.yaml, the first line of server.log, what
`recipes show` prints); the docker launcher passes such variables by name only
(``docker run -e KEY``), their values in the docker client's own environment.
"""

from __future__ import annotations

import copy
import re

SECRET_KEY = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
REDACTED = "<redacted>"


def is_secret(key: str) -> bool:
    return bool(SECRET_KEY.search(key))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the value of every secret-looking key replaced by `REDACTED`."""
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def redact_recipe(recipe: dict) -> dict:
    """A recipe dump (``Recipe.model_dump``) with its ``serve.env`` redacted."""
    out = copy.deepcopy(recipe)
    serve = out.get("serve") or {}
    if isinstance(serve.get("env"), dict):
        serve["env"] = redact_env(serve["env"])
    return out
