"""Reading a corpus from disk: a BEIR folder, a ``.jsonl[.gz]`` file, or a folder of .txt/.md files.

Shared by ``normrank index`` (:mod:`normrank.cli`) and Ray indexing (:mod:`normrank.distributed`),
so neither imports the other.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from normrank._validation import check_metadata, check_text, is_blank_text
from normrank.errors import DatasetError

logger = logging.getLogger(__name__)

#: File suffixes ``read_source`` indexes in a folder.
TEXT_SUFFIXES = (".txt", ".md")


def source_kind(source: str | Path) -> str:
    """``"files"`` for a folder of .txt/.md files, ``"rows"`` for a BEIR folder or a .jsonl[.gz] file.

    Files are chunked by default (a long file is many passages); rows keep their ids whole by
    default, since qrels and callers name them.
    """
    path = Path(source)
    if path.is_dir() and not any((path / n).is_file() for n in ("corpus.jsonl", "corpus.jsonl.gz")):
        return "files"
    return "rows"


def read_source(source: str | Path) -> tuple[list[str], list[str], list[dict], list[str]]:
    """(ids, texts, metadatas, skipped ids) from a BEIR folder, a .jsonl[.gz] file or a folder of .txt/.md.

    A file's id is its path relative to the folder (``/`` separators); its metadata holds that path
    as ``path`` (chunking adds ``source``). Files in hidden folders and hidden files (a name starting
    with ``.``) are left out. Empty documents are skipped and returned by id. A row with a title and no
    text is its title, as :func:`~normrank.datasets.load_beir` reads it.

    Raises
    ------
    DatasetError
        The source does not exist, is of none of these kinds, or a row has no text field.
    """
    from normrank.datasets import iter_jsonl

    path = Path(source)
    rows: list[tuple[str, str, dict]] = []
    if path.is_dir():
        corpus = next((path / n for n in ("corpus.jsonl", "corpus.jsonl.gz") if (path / n).is_file()), None)
        if corpus is not None:
            rows = _jsonl_rows(iter_jsonl(corpus), corpus, need_id=True)
        else:
            files = _text_files(path)
            if not files:
                raise DatasetError(f"{path} has no corpus.jsonl[.gz] (BEIR) and no .txt or .md files to index")
            for f in files:
                rel = f.relative_to(path).as_posix()
                if _undecodable(rel):  # Python keeps such bytes as lone surrogates, which no store accepts
                    raise DatasetError(
                        f"{path / rel.encode('utf-8', 'surrogateescape').decode('utf-8', 'backslashreplace')}: "
                        "the file name is not valid UTF-8, and it becomes the document's id and path; "
                        "rename the file (convmv converts a folder of Latin-1 names)")
                rows.append((rel, read_text_file(f), {"path": rel}))
    elif path.is_file() and path.name.lower().endswith((".jsonl", ".jsonl.gz")):  # DOCS.JSONL too, as .TXT
        rows = _jsonl_rows(iter_jsonl(path), path)
    elif path.exists():
        raise DatasetError(f"{path} is neither a folder nor a .jsonl/.jsonl.gz file")
    else:
        raise DatasetError(f"no such file or folder: {path}")
    ids, texts, metas, skipped = [], [], [], []
    for did, text, meta in rows:
        if not is_blank_text(text):
            ids.append(did)
            texts.append(text)
            metas.append(meta)
        else:
            skipped.append(did)
    return ids, texts, metas, skipped


def _text_files(root: Path) -> list[Path]:
    """The .txt/.md files under ``root``, following linked folders once each.

    Why not ``Path.rglob``: on Python 3.11 it does not enter a linked folder, so ``docs/shared ->
    ../shared`` was skipped without a word while linked files were read. A folder reached again (a link
    loop, or two links to one folder) is read only the first time. Hidden files and folders (.git, .venv,
    editor backups) are not the user's documents."""
    files: list[Path] = []
    seen: set[str] = set()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            logger.warning("%s leads to a folder already read (%s); not read again", folder, real)
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))  # the first link read is stable
        for name in names:
            p = Path(folder) / name
            if not name.startswith(".") and p.suffix.lower() in TEXT_SUFFIXES and p.is_file():
                files.append(p)
    return sorted(files)


def _undecodable(name: str) -> bool:
    """Whether a file name read from disk held bytes that are not UTF-8 (``os.fsdecode`` keeps them as
    lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_text_file(path: str | Path) -> str:
    """A UTF-8 text file's content; anything else is a :class:`DatasetError` naming the file and byte."""
    f = Path(path)
    try:
        return f.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{f} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    except IsADirectoryError as exc:
        raise DatasetError(f"{f} is a folder, not a text file") from exc


#: The fields of a corpus row that are not its metadata (besides ``id`` when it names the row).
_ROW_FIELDS = frozenset({"_id", "title", "text", "metadata"})


def _jsonl_rows(rows: Iterable[tuple[int, Any]], path: Path, *, need_id: bool = False) -> list[tuple[str, str, dict]]:
    """(id, text, metadata) per row. The id is ``_id`` (else ``id``), named like ``load_beir`` names it
    when it is null, empty, a list or a dict (``"_id": null`` became the id "None"); a row with
    neither is numbered by its line, except in a BEIR folder (``need_id``), whose qrels name documents by
    ``_id``: there a row needs its ``_id`` (``id`` does not stand in), as ``eval`` (``load_beir``) says. A repeated id names both lines. The metadata is the row's
    ``metadata`` object plus its other fields (``url``, ``year``: they were dropped without a word);
    text, title and metadata that no store accepts are named by file and line."""
    from normrank.datasets import _row_id, _row_text

    out = []
    first: dict[str, int] = {}
    for no, row in rows:
        if not isinstance(row, dict) or ("text" not in row and "title" not in row):
            # a title alone is the document, as load_beir reads it (eval took such a folder, index refused it)
            raise DatasetError(f"{path}:{no} has no 'text' field (expected _id, title, text)")
        key = "_id" if "_id" in row else "id" if "id" in row and not need_id else None
        if key is None and need_id:
            raise DatasetError(f"{path}:{no} has no usable '_id' (a string or number naming the row): a BEIR "
                               "corpus names its documents, and its qrels judge them by that id")
        did = _row_id(row, path, no, key) if key is not None else str(no)
        if did in first:
            raise DatasetError(f"{path}:{no} repeats document id {did!r} (first on line {first[did]}); ids must be "
                               "unique")
        first[did] = no
        where = f"{path}:{no}"
        # checked here, by file and line: later checks know only a position in the batch
        title = check_text(_row_text(row, path, no, "title"), f"{where} title").strip()
        body = check_text(_row_text(row, path, no), f"{where} text").strip()
        own = row.get("metadata")
        if own is not None and not isinstance(own, dict):
            raise DatasetError(f"{where} has a 'metadata' that is a {type(own).__name__}; expected a JSON object")
        # other fields of the row (url, year, ...) are its metadata too; the row's own metadata wins a clash
        extra = {k: v for k, v in row.items() if k not in _ROW_FIELDS and k != key}
        meta = check_metadata({**extra, **(own or {})}, f"{where} metadata")
        if title:
            meta.setdefault("title", title)  # a row's own metadata title is the user's: kept
        out.append((did, f"{title}\n{body}".strip() if title else body, meta))
    return out


__all__ = ["TEXT_SUFFIXES", "read_source", "read_text_file", "source_kind"]
