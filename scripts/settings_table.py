"""Print (or refresh in a file) the markdown table of every mmsync setting.

The table is generated from ``app.settings.Settings.model_fields``, so the
operator's page cannot drift from the code: ``tests/unit/test_deploy.py``
checks that ``docs/operations.md`` holds exactly this output.

    .venv/bin/python scripts/settings_table.py                  # print it
    .venv/bin/python scripts/settings_table.py --write docs/operations.md

``--write`` replaces what lies between the ``settings-table:begin`` and
``settings-table:end`` comment markers of the file.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotated_types import Ge, Gt, Le, Lt  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402

from app.settings import Settings  # noqa: E402

__all__ = ["BEGIN", "END", "render", "replace_between_markers"]

BEGIN = "<!-- settings-table:begin (scripts/settings_table.py --write docs/operations.md) -->"
END = "<!-- settings-table:end -->"

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(f: FieldInfo) -> str:
    if f.default_factory is not None:
        doc = (f.default_factory.__doc__ or f.default_factory.__name__).strip()
        return " ".join(doc.split(":", 1)[0].split())
    d = f.default
    if d is None:
        return "unset"
    if isinstance(d, bool):
        return f"`{str(d).lower()}`"
    if isinstance(d, SecretStr):
        return "(secret)"
    if d == "":
        return "empty"
    return f"`{d}`"


def _values(f: FieldInfo) -> str:
    ann: Any = f.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) is typing.Literal:
        return ", ".join(f"`{a}`" for a in typing.get_args(ann))
    if args and all(typing.get_origin(a) is typing.Literal for a in args):
        return ", ".join(f"`{v}`" for a in args for v in typing.get_args(a))
    base = args[0] if len(args) == 1 else ann
    name = {bool: "bool", int: "int", float: "number", str: "string", Path: "path",
            SecretStr: "secret"}.get(base, getattr(base, "__name__", str(base)))
    bounds = []
    for m in f.metadata:
        for cls, attr, op in ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="),
                              (Lt, "lt", "<")):
            if isinstance(m, cls):
                bounds.append(f"{op} {getattr(m, attr)}")
    return name + (f" ({', '.join(bounds)})" if bounds else "")


def render() -> str:
    """The markdown table, one row per Settings field, in the model's order."""
    rows = ["| variable | default | values | meaning |", "|---|---|---|---|"]
    for name, f in Settings.model_fields.items():
        meaning = f.description or "(undocumented)"
        rows.append(f"| `MMSYNC_{name.upper()}` | {_cell(_default(f))} | {_cell(_values(f))} "
                    f"| {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def replace_between_markers(doc: str, table: str) -> str:
    """``doc`` with the text between the markers replaced by ``table``."""
    head, sep, rest = doc.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"markers not found: {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path, help="refresh the table between the markers of FILE")
    args = ap.parse_args()
    table = render()
    if args.write:
        args.write.write_text(replace_between_markers(args.write.read_text(), table))
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
