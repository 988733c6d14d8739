"""Reading a corpus from disk: a BEIR folder, a ``.jsonl[.gz]`` file, or a folder of .txt/.md files.

Shared by ``normrank index`` (:mod:`normrank.cli`) and Ray indexing (:mod:`normrank.distributed`),
so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from normrank._validation import is_blank_text
from normrank.errors import DatasetError

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
            rows = _jsonl_rows(iter_jsonl(corpus), corpus)
        else:
            # hidden files and folders (.git, .venv, editor backups) are not the user's documents
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
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
    elif path.is_file() and (path.name.endswith(".jsonl") or path.name.endswith(".jsonl.gz")):
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


def _jsonl_rows(rows: Iterable[tuple[int, Any]], path: Path) -> list[tuple[str, str, dict]]:
    """(id, text, metadata) per row. The id is ``_id`` (else ``id``), named like ``load_beir`` names it
    when it is null, empty, a list or a dict (``"_id": null`` became the id "None"); a row with
    neither is numbered by its line. A repeated id names both lines."""
    from normrank.datasets import _row_id, _row_text

    out = []
    first: dict[str, int] = {}
    for no, row in rows:
        if not isinstance(row, dict) or ("text" not in row and "title" not in row):
            # a title alone is the document, as load_beir reads it (eval took such a folder, index refused it)
            raise DatasetError(f"{path}:{no} has no 'text' field (expected _id, title, text)")
        key = "_id" if "_id" in row else "id" if "id" in row else None
        did = _row_id(row, path, no, key) if key is not None else str(no)
        if did in first:
            raise DatasetError(f"{path}:{no} repeats document id {did!r} (first on line {first[did]}); ids must be "
                               "unique")
        first[did] = no
        title = _row_text(row, path, no, "title").strip()
        body = _row_text(row, path, no).strip()
        meta = dict(row["metadata"]) if isinstance(row.get("metadata"), dict) else {}
        if title:
            meta.setdefault("title", title)  # a row's own metadata title is the user's: kept
        out.append((did, f"{title}\n{body}".strip() if title else body, meta))
    return out


__all__ = ["TEXT_SUFFIXES", "read_source", "read_text_file", "source_kind"]
