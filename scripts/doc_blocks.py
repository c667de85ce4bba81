"""Print (or refresh) the generated blocks of docs/contract.md and docs/clients.md.

What the code defines is written into the docs from the code, so they cannot drift:
the contract's settings (from ``app.settings.Settings`` and the CLI's ``[env: ...]``
flags), the commands (from the CLI's parser), the metrics (from a fresh
``app.runtime.metrics.Metrics`` registry, with the label values every worker exposes
from its start) and the producer examples (``scripts/examples/``, verbatim).
``tests/unit/test_docs.py`` fails when a block is stale.

    .venv/bin/python scripts/doc_blocks.py            # print every block
    .venv/bin/python scripts/doc_blocks.py --write    # refresh them in docs/

A block lies between ``<!-- generated:NAME:begin ... -->`` and ``<!-- generated:NAME:end -->``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.metrics import MetricWrapperBase  # noqa: E402

from app.runtime.metrics import DYNAMIC_LABELS, Metrics  # noqa: E402
from app.settings import Settings  # noqa: E402
from scripts.settings_table import _cell, _default, _values  # noqa: E402

__all__ = ["BLOCKS", "refresh", "render"]

#: The settings the external contract names, plus the limits and the metrics port a
#: producer or an operator meets first; every other one is in docs/operations.md.
CONTRACT_SETTINGS = ("broker", "topic_prefix", "partitions", "create_topics", "data_dir",
                     "sync_hz", "window_ms", "lateness_ms", "device", "gpu_mem_limit_mb",
                     "cache_max_bytes",
                     "image_ttl_s", "text_ttl_s", "audio_ttl_s", "max_text_bytes",
                     "max_image_bytes", "max_audio_bytes", "max_future_s", "web_host",
                     "web_port")


def _cli() -> argparse.ArgumentParser:
    from app.cli import _parser

    return _parser()


def _subparsers(p: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help or "" for c in sub._choices_actions}
    return {name: (helps.get(name, ""), sp) for name, sp in sub.choices.items()}


def _flags() -> dict[str, list[str]]:
    """MMSYNC_X -> ``--flag (commands)`` from the CLI's ``[env: MMSYNC_X]`` help strings."""
    out: dict[str, dict[str, list[str]]] = {}
    for cmd, (_, sp) in _subparsers(_cli()).items():
        for action in sp._actions:
            m = re.search(r"\[env: (MMSYNC_\w+)\]", action.help or "")
            if m and action.option_strings:
                out.setdefault(m.group(1), {}).setdefault(action.option_strings[-1], []).append(cmd)
    return {env: [f"`{flag}` ({', '.join(cmds)})" for flag, cmds in flags.items()]
            for env, flags in out.items()}


def settings() -> str:
    flags = _flags()
    rows = ["| variable | flag | default | values | meaning |", "|---|---|---|---|---|"]
    for name in CONTRACT_SETTINGS:
        f = Settings.model_fields[name]
        env = f"MMSYNC_{name.upper()}"
        rows.append(f"| `{env}` | {'; '.join(flags.get(env, [])) or '-'} | "
                    f"{_cell(_default(f))} | {_cell(_values(f))} | {_cell(f.description or '')} |")
    return "\n".join(rows) + "\n"


def commands() -> str:
    rows = ["| command | what it does |", "|---|---|"]
    for name, (help_, _) in _subparsers(_cli()).items():
        rows.append(f"| `mmsync {name}` | {_cell(help_)} |")
    return "\n".join(rows) + "\n"


def metrics() -> str:
    m = Metrics()
    families = {fam.name: fam for fam in m.registry.collect()}
    rows = ["| metric | type | labels (values from the start) | meaning |", "|---|---|---|---|"]
    for w in vars(m).values():
        if not isinstance(w, MetricWrapperBase):
            continue
        name, kind = w._name, w._type
        fam = families[name]
        exposed = f"{name}_total" if kind == "counter" else name
        labels = []
        for label in w._labelnames:
            if name in DYNAMIC_LABELS:
                labels.append(f"`{label}` (as assigned)")
                continue
            values = list(dict.fromkeys(s.labels[label] for s in fam.samples if label in s.labels))
            labels.append(f"`{label}`: " + ", ".join(f"`{v}`" for v in values))
        rows.append(f"| `{exposed}` | {kind} | {'; '.join(labels) or '-'} | "
                    f"{_cell(w._documentation)} |")
    rows.append("| `process_*` | gauge, counter | - | the process's resident memory, CPU "
                "seconds and open files (prometheus_client's process collector) |")
    return "\n".join(rows) + "\n"


def _example(name: str) -> Callable[[], str]:
    def render_file() -> str:
        text = (ROOT / "scripts" / "examples" / name).read_text()
        return f"```python\n{text}```\n"

    return render_file


#: block name -> (file holding it, renderer)
BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "settings": ("docs/contract.md", settings),
    "commands": ("docs/contract.md", commands),
    "metrics": ("docs/contract.md", metrics),
    "example-confluent": ("docs/clients.md", _example("produce_confluent.py")),
    "example-aiokafka": ("docs/clients.md", _example("produce_aiokafka.py")),
}


def render(name: str) -> str:
    return BLOCKS[name][1]()


def refresh(doc: str, names: list[str]) -> str:
    """``doc`` with each named block replaced by its current rendering."""
    for name in names:
        begin = f"<!-- generated:{name}:begin (scripts/doc_blocks.py --write) -->"
        end = f"<!-- generated:{name}:end -->"
        head, sep, rest = doc.partition(begin)
        _, sep2, tail = rest.partition(end)
        if not sep or not sep2:
            raise SystemExit(f"markers not found: {begin!r} ... {end!r}")
        doc = f"{head}{begin}\n{render(name)}{end}{tail}"
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="refresh the blocks in docs/")
    args = ap.parse_args()
    if not args.write:
        for name in BLOCKS:
            sys.stdout.write(f"--- {name}\n{render(name)}")
        return 0
    for path in dict.fromkeys(p for p, _ in BLOCKS.values()):
        names = [n for n, (p, _) in BLOCKS.items() if p == path]
        f = ROOT / path
        f.write_text(refresh(f.read_text(), names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
