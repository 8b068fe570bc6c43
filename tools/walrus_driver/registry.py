"""The pass registry: pass name -> PassInfo, filled by the @register decorator in each pass module.

A pass is a module in ncc.tools.walrus_driver.passes whose docstring's first line is its summary,
with a NAME, an optional options dataclass and one `run(ctx) -> None` decorated with
`@register(NAME, Options)`. `load_passes()` imports every module of that package once.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.context import PassContext

RunFn = Callable[[PassContext], None]


@dataclass(frozen=True)
class PassInfo:
    name: str
    summary: str
    description: str
    run: RunFn
    options: type | None

    def make_options(self, values: dict[str, str]) -> Any:
        """The pass's options object from text values (`pre_sched{pressure_fraction=0.5}`)."""
        if self.options is None:
            if values:
                raise CompileError("E400", f"pass {self.name} takes no options (got {', '.join(values)})")
            return None
        fields = {f.name: f for f in dataclasses.fields(self.options)}
        kwargs: dict[str, Any] = {}
        for key, text in values.items():
            if key not in fields:
                raise CompileError(
                    "E400", f"pass {self.name} has no option {key!r} (options: {', '.join(sorted(fields))})"
                )
            kwargs[key] = _convert(self.name, key, text, fields[key].type)
        return self.options(**kwargs)


def _convert(pass_name: str, key: str, text: str, annotation: Any) -> Any:
    kind = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    try:
        if kind == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        return text
    except ValueError:
        raise CompileError("E400", f"pass {pass_name}: option {key}={text!r} is not a valid {kind}") from None


PASSES: dict[str, PassInfo] = {}


def register(name: str, options: type | None = None) -> Callable[[RunFn], RunFn]:
    """Register `run` as the entry point of pass `name` (summary from its module's docstring)."""

    def wrap(run: RunFn) -> RunFn:
        doc = (sys.modules[run.__module__].__doc__ or "").strip()
        summary, _, description = doc.partition("\n")
        if not summary:
            raise ValueError(f"pass {name} has no docstring summary")
        if name in PASSES and PASSES[name].run is not run:
            raise ValueError(f"pass {name} registered twice")
        PASSES[name] = PassInfo(name, summary.strip(), description.strip(), run, options)
        return run

    return wrap


def load_passes() -> dict[str, PassInfo]:
    """Import every pass module (a no-op after the first time: Python caches modules)."""
    from ncc.tools.walrus_driver import passes

    for module in pkgutil.iter_modules(passes.__path__):
        importlib.import_module(f"{passes.__name__}.{module.name}")
    return PASSES


def get_pass(name: str) -> PassInfo:
    known = load_passes()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise CompileError(
            "E401", f"unknown walrus pass '{name}' (known: {', '.join(sorted(known))}){hint}", name
        )
    return known[name]
