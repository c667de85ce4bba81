"""The repository stands alone: README.md and docs/*.md point at nothing outside it, and
what they list from the code (settings, commands, metrics, dead-letter reasons, topics,
the producer examples) is what the code has."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from app.kafka.clients import CONTRACT_TOPICS
from app.runtime.metrics import DLQ_REASONS, Metrics
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: [text](target) and ![alt](target); [label]: target
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)")
_REF = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
#: a web address anywhere, links, code and prose alike
_URL = re.compile(r"\b(?:https?|ftp)://([^/\s:)\]`'\"<>]+)")
#: a relative path that climbs: ../x, ../../y
_CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+[^\s`'\")\]>,;]*)")
#: `some/path.ext` in inline code
_CODE_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+/?)`")
_LOOPBACK = {"127.0.0.1", "localhost", "[::1]"}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", path.read_text(), re.M)}


def _inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def _problems(doc: Path, text: str | None = None) -> list[str]:
    """What in ``doc`` (or ``text`` as if it were ``doc``) points outside the repository."""
    text = doc.read_text() if text is None else text
    out = []
    for host in _URL.findall(text):
        if host not in _LOOPBACK:
            out.append(f"web address on {host}")
    for target in _LINK.findall(text) + _REF.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # a scheme: checked above if web
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file) if file else doc
        if file and not _inside(dest):
            out.append(f"link {target!r} leaves the repository")
        elif file and not dest.exists():
            out.append(f"link {target!r}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            out.append(f"link {target!r}: no such heading")
    for rel in _CLIMB.findall(text):
        dest = doc.parent / rel
        if not _inside(dest) or not dest.exists():
            out.append(f"path {rel!r} points outside the repository")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(doc: Path) -> None:
    assert not _problems(doc)


def test_the_link_check_finds_what_issue_19_found() -> None:
    """The check itself, on a page in docs/: each kind of fault is reported, good links not."""
    text = ("The contract is `../shared/contract.md`; see [x](../../elsewhere.md), "
            "[y](missing.md), [z](contract.md#no-such-heading), <https://example.org/a>; "
            "fine: [ok](contract.md#window-identity), [up](../README.md), "
            "`open http://127.0.0.1:3000`.")
    found = _problems(ROOT / "docs" / "probe.md", text)
    for fault in ("'../shared/contract.md' points outside", "'../../elsewhere.md' leaves",
                  "'missing.md': no such file", "no-such-heading': no such heading",
                  "example.org"):
        assert any(fault in f for f in found), (fault, found)
    assert not any("window-identity" in f or "README" in f or "127.0.0.1" in f
                   for f in found), found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_named_in_docs_exist(doc: Path) -> None:
    """`app/x.py`, `docs/y.md`, `deploy/...`: named files and folders are there."""
    roots = {p.name for p in ROOT.iterdir()}
    missing = [p for p in _CODE_PATH.findall(doc.read_text())
               if p.split("/")[0] in roots
               and not (ROOT / p).exists() and not (doc.parent / p).exists()]
    assert not missing


# --- generated and checked lists ---------------------------------------------

def _doc_blocks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("doc_blocks", ROOT / "scripts" / "doc_blocks.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_blocks_are_current() -> None:
    mod = _doc_blocks()
    for path in dict.fromkeys(p for p, _ in mod.BLOCKS.values()):
        names = [n for n, (p, _) in mod.BLOCKS.items() if p == path]
        doc = (ROOT / path).read_text()
        assert mod.refresh(doc, names) == doc, (
            f"{path} is stale: .venv/bin/python scripts/doc_blocks.py --write")


def test_examples_in_clients_page_are_the_tested_files() -> None:
    doc = (ROOT / "docs" / "clients.md").read_text()
    for name in ("produce_confluent.py", "produce_aiokafka.py"):
        assert (ROOT / "scripts" / "examples" / name).read_text() in doc, name


def _table_column(doc: str, header: str) -> list[str]:
    """First-column code spans of the markdown table whose header row starts with ``header``."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        out += re.findall(r"^\| `([^`]+)`", line)
    return out


def test_contract_lists_every_dead_letter_reason() -> None:
    doc = (ROOT / "docs" / "contract.md").read_text()
    assert _table_column(doc, "reason") == list(DLQ_REASONS)


def test_contract_lists_every_topic() -> None:
    doc = (ROOT / "docs" / "contract.md").read_text()
    topics = set(_table_column(doc, "topic"))
    missing = {Settings().topic(t) for t in CONTRACT_TOPICS} - topics
    assert not missing


def _texts() -> list[tuple[Path, str]]:
    examples = sorted((ROOT / "scripts" / "examples").glob("*.py"))
    return [(p, p.read_text()) for p in [*DOCS, *examples]]


def test_settings_named_in_docs_exist() -> None:
    fields = set(Settings.model_fields)
    for path, text in _texts():
        for var in re.findall(r"MMSYNC_[A-Z0-9_]+(?![\w*])", text):
            assert var.removeprefix("MMSYNC_").lower() in fields, f"{path.name}: {var}"


def test_metrics_named_in_docs_exist() -> None:
    names: set[str] = set()
    for fam in Metrics().registry.collect():
        names |= {fam.name, f"{fam.name}_total"} | {s.name for s in fam.samples}
    for path, text in _texts():
        for name in re.findall(r"\bmmsync_[a-z0-9_]+", text):
            assert name in names, f"{path.name}: {name}"
