"""The documents hold together: the runbook's contents list is its chapters, every document
the product notes name exists under that name, relative links resolve, and the
coordinatorctl reference has a section for every command the CLI registers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNBOOK = DOCS / "runbook.md"
CLI_REFERENCE = DOCS / "coordinatorctl.md"

# The names the two product notes (the overview and "Deploy Registry Coordinator") give the
# documents they send a reader to. The notes live outside the repository, so the list is
# written out here; each name must be the H1 title of a file in docs/ or the title of a
# runbook chapter (its number aside).
NOTE_NAMES = (
    "Review an application and send an approval notice",
    "Deployment runbook",
    "Install and package",
    "Create the keys and secrets",
    "Create the database and roles",
    "Configure the deployment",
    "Completion destinations",
    "Add, upgrade, roll back and remove a workflow",
    "Watch metrics",
    "Recover safely",
    "Rotate and replace keys",
    "Backup and restore",
    "Author a Coordinator workflow",
    "How Registry Coordinator works",
    "Registry Coordinator API",
    "Registry Coordinator configuration reference",
)

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`+[^`\n]*`+")
_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_HEADING = re.compile(r"^(?P<marks>#{1,6})[ \t]+(?P<text>.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_CHAPTER_NUMBER = re.compile(r"^\d+\.\s+")


def prose(text: str) -> str:
    """``text`` without fenced code blocks (links and headings there are not links)."""
    return _FENCE.sub("", text)


def headings(text: str, level: int | None = None) -> list[str]:
    """The headings of a markdown document (outside code blocks), in order."""
    return [
        match["text"]
        for match in _HEADING.finditer(prose(text))
        if level is None or len(match["marks"]) == level
    ]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation but ``-`` and ``_`` gone,
    each space a hyphen."""
    text = _LINK.sub(lambda m: m["text"], heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor of a document, with GitHub's ``-1``, ``-2`` for repeated headings."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in headings(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> Iterator[tuple[str, str]]:
    """``(text, target)`` of every inline link outside code."""
    for match in _LINK.finditer(_INLINE_CODE.sub("", prose(text))):
        yield match["text"], match["target"]


def h1(path: Path) -> str | None:
    """The document's first H1, if it has one."""
    found = headings(path.read_text(encoding="utf-8"), level=1)
    return found[0] if found else None


def chapters() -> list[str]:
    """The runbook's ``## `` chapter headings, as written."""
    return headings(RUNBOOK.read_text(encoding="utf-8"), level=2)


# ------------------------------------------------------------------------------ (a) runbook


def contents_links() -> list[tuple[str, str]]:
    """The links of the runbook's ``Contents:`` paragraph."""
    text = RUNBOOK.read_text(encoding="utf-8")
    start = text.index("\nContents:")
    end = text.find("\n\n", start + 1)
    return list(links(text[start : end if end != -1 else len(text)]))


def test_the_runbook_contents_list_is_its_chapters_in_order() -> None:
    listed = contents_links()
    assert [title for title, _ in listed] == chapters()
    assert [target for _, target in listed] == [f"#{slug(title)}" for title in chapters()]


def test_every_contents_anchor_exists_in_the_runbook() -> None:
    known = anchors(RUNBOOK.read_text(encoding="utf-8"))
    missing = [target for _, target in contents_links() if target[1:] not in known]
    assert not missing


# ---------------------------------------------------------------------- (b) the notes' names


def titles() -> dict[str, str]:
    """Every place a note's name may live: each docs file's H1 and each runbook chapter."""
    found: dict[str, str] = {}
    for path in sorted(DOCS.glob("*.md")):
        title = h1(path)
        if title is not None:
            found[title] = path.name
    for chapter in chapters():
        found[_CHAPTER_NUMBER.sub("", chapter)] = f"runbook.md#{slug(chapter)}"
    return found


@pytest.mark.parametrize("name", NOTE_NAMES)
def test_every_document_the_notes_name_exists_under_that_name(name: str) -> None:
    assert name in titles(), f"no docs/*.md H1 and no runbook chapter is titled {name!r}"


def test_every_new_document_is_its_own_file() -> None:
    for name, file in (
        ("Install and package", "install-and-package.md"),
        ("Configure the deployment", "configure-the-deployment.md"),
        ("Completion destinations", "completion-destinations.md"),
        ("Rotate and replace keys", "rotate-and-replace-keys.md"),
        (
            "Review an application and send an approval notice",
            "review-an-application-and-send-an-approval-notice.md",
        ),
    ):
        assert h1(DOCS / file) == name


# ------------------------------------------------------------------------- (c) relative links


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` whose file (or anchor in a markdown file) is missing."""
    broken: list[str] = []
    for _, target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: and the like
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif (
            anchor
            and linked.suffix == ".md"
            and anchor not in anchors(linked.read_text(encoding="utf-8"))
        ):
            broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("path", documents(), ids=lambda path: path.name)
def test_every_relative_link_resolves(path: Path) -> None:
    assert not broken_links(path)


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## A heading\n\n[ok](#a-heading) [gone](missing.md) [bad](#nowhere)\n"
        "```\n[in code](ignored.md)\n```\n"
        "1. a step:\n\n   ```sh\n   [in an indented block](ignored.md)\n   ```\n"
        "`[in inline code](ignored.md)` and [a link over\ntwo lines](also-missing.md)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "#nowhere: no such heading",
        "also-missing.md: no such file",
    ]


def test_slugs_follow_github() -> None:
    assert slug("8. Recover safely") == "8-recover-safely"
    assert slug("`deployment.logging`") == "deploymentlogging"
    assert slug("What receipt.expired proves, and what it does not") == (
        "what-receiptexpired-proves-and-what-it-does-not"
    )
    assert anchors("## A\n\n## A\n") == {"a", "a-1"}


# -------------------------------------------------------------- (d) the coordinatorctl reference


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    """Every command the CLI registers, groups descended into (``workflow check``)."""
    subcommands = getattr(command, "commands", None)
    if not isinstance(subcommands, dict):
        yield " ".join(prefix)
        return
    for name, subcommand in sorted(subcommands.items()):
        yield from command_paths(subcommand, (*prefix, name))


def registered() -> list[str]:
    """The commands of the real ``coordinatorctl`` app, as the command line resolves them."""
    return list(command_paths(typer.main.get_command(app)))


def test_the_cli_registers_what_the_reference_is_checked_against() -> None:
    paths = registered()
    assert {"check", "workflow check", "keys fingerprint", "retry-same"} <= set(paths)


@pytest.mark.parametrize("command", registered())
def test_the_cli_reference_has_a_section_for_every_command(command: str) -> None:
    sections = {
        heading.replace("`", "")
        for heading in headings(CLI_REFERENCE.read_text(encoding="utf-8"), level=2)
    }
    assert command in sections, f"docs/coordinatorctl.md has no '## {command}' section"
