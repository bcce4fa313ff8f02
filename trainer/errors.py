"""The trainer's errors about what a user gave it (weights, data, a teacher, a latent cache, eval's
arguments), in a leaf that imports nothing: the console maps them to exit codes
(taehv_console/errors.py) without loading torch. Each is raised by the module named beside it."""

from __future__ import annotations


class WeightsError(ValueError):
    """Initial weights that cannot be loaded: the message names the file and the keys (model.py)."""


class TeacherError(ValueError):
    """The teacher cannot be used; the message names the path and what is wrong. Never followed by a
    silent fall back to reconstruction-only training (teacher.py)."""


class DataSourceError(ValueError):
    """The training data cannot be used; the message names the path and what is wrong (data.py)."""


class EvalError(ValueError):
    """Eval cannot run as asked; the message names the file or folder and what is wrong (evaluate.py)."""


class CacheError(ValueError):
    """The latent cache cannot serve this run; the message says what differs and what to run
    (latent_cache.py)."""
