"""How the TUI tells a user's error from a bug: the same table every front end uses
(taehv_console/errors.py: ERROR_CODES), so an error kind added there is caught here too.

A known error (its class, or a base of it, in ERROR_CODES, or an OSError: a path or connection the
system refused) is shown as a dialog with its class's name and its own message, and the console
goes on. Anything else is a bug: its traceback goes to a crash log (errors.write_crash_log) and the
dialog names that log; the console goes on as well. No traceback is ever drawn.
"""

from __future__ import annotations

from taehv_console.errors import ERROR_CODES, describe_error, exit_code_for_error

# what the TUI's workers catch: every class of the one table, and the system's refusals (a runs
# folder that cannot be written, a file that cannot be read), which the TUI always named
USER_ERRORS: tuple[type[BaseException], ...] = (*ERROR_CODES, OSError)


def is_user_error(err: BaseException) -> bool:
    return exit_code_for_error(err) is not None or isinstance(err, OSError)


def error_text(err: BaseException) -> str:
    """One message for a dialog, never a traceback: `ClassName: message` for a known error, else
    the unexpected error's one line with the path of the crash log that holds its traceback."""
    if is_user_error(err):
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    _code, line = describe_error(err, argv=["taehv-console (TUI)"])
    return line
