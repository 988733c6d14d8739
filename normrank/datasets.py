"""Load retrieval collections in the BEIR layout, from ``../shared/data`` or any folder a user has.

Layout: ``corpus.jsonl[.gz]`` (``_id``, ``title``, ``text``), ``queries.jsonl[.gz]``
(``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id  corpus-id  score``, with header).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from normrank.errors import DatasetError

logger = logging.getLogger(__name__)

DATA_ENV = "NORMRANK_DATA"


def demo_rows(name: str = "demo_corpus.jsonl") -> list[dict]:
    """Rows of a file of the small demo collection bundled with the package (``demo_corpus.jsonl``,
    ``demo_queries.jsonl``): the data the demo, the tests and the tiny benchmark runs share."""
    from importlib import resources

    text = resources.files("normrank").joinpath("data", name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def demo_qrels() -> dict[str, dict[str, int]]:
    """Relevance judgements of the bundled demo queries (``demo_qrels.tsv``): 2 = answers the query,
    1 = on its topic; judged by hand from the 48 passages' text."""
    from importlib import resources

    text = resources.files("normrank").joinpath("data", "demo_qrels.tsv").read_text(encoding="utf-8")
    qrels: dict[str, dict[str, int]] = {}
    for line in text.splitlines()[1:]:
        if line.strip():
            q, d, grade = line.split("\t")
            qrels.setdefault(q, {})[d] = int(grade)
    return qrels


def default_data_dir() -> Path | None:
    """``$NORMRANK_DATA``, else ``../shared/data`` beside the checkout or the working folder, if present."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if cand.is_dir():
            return cand
    return None


def _open(path: Path) -> Iterator[bytes]:
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as fh:  # type: ignore[operator]
        yield from fh


def _find(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.jsonl", f"{stem}.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    raise DatasetError(f"{folder} has no {stem}.jsonl or {stem}.jsonl.gz: it is not a BEIR folder")


def _kind(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` for every non-blank line of a .jsonl or .jsonl.gz file (a UTF-8 byte order
    mark at its start is skipped).

    Raises
    ------
    DatasetError
        The file is missing, is not UTF-8, is a truncated or corrupt gzip, or a line is not a
        JSON object; the message names the file and the line.
    """
    path = Path(path)
    no = 0
    try:
        for no, raw in enumerate(_open(path), 1):
            try:  # a byte order mark (Windows tools write one) is skipped, as the qrels reader skips it
                line = raw.decode("utf-8-sig" if no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{path}:{no} is not UTF-8 text ({exc.reason} at byte {exc.start} of the "
                                   "line)") from exc
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{no} is not valid JSON: {exc.msg}") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{no} is {_kind(row)}, not a JSON object (expected {{\"_id\": ..., "
                                   f"\"text\": ...}})")
            yield no, row
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DatasetError(f"{path} is a truncated or corrupt gzip file (read {no} lines): {exc}") from exc
    except FileNotFoundError as exc:
        raise DatasetError(f"no such file {path}") from exc
    except IsADirectoryError as exc:
        raise DatasetError(f"{path} is a folder, not a .jsonl file") from exc


def read_jsonl(path: str | os.PathLike[str]) -> list[dict]:
    """Rows (JSON objects) of a .jsonl or .jsonl.gz file, naming the line of any bad one."""
    return [row for _, row in iter_jsonl(path)]


def _row_id(row: dict, path: Path, no: int, key: str = "_id") -> str:
    value = row.get(key)
    if value is None or isinstance(value, (dict, list, bool)) or not str(value).strip():
        raise DatasetError(f"{path}:{no} has no usable {key!r} (a string or number naming the row)")
    return str(value)


def _row_text(row: dict, path: Path, no: int, key: str = "text") -> str:
    """A row's ``text`` or ``title``: a string, or empty when missing or null. Anything else is a
    :class:`DatasetError` naming the line: a list of paragraphs was indexed as its Python repr
    (``"['first', 'second']"``), ``true`` as ``"True"``, and ``0`` was skipped as an empty document."""
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DatasetError(f"{path}:{no} has a {key!r} that is a {type(value).__name__} ({str(value)[:40]!r}); "
                           f"expected a string (join paragraphs into one text first)")
    return value


@dataclass
class Document:
    id: str
    title: str
    text: str
    metadata: dict = field(default_factory=dict)

    @property
    def full_text(self) -> str:
        """Title and body, as BEIR evaluations embed them."""
        return f"{self.title}\n{self.text}".strip() if self.title else self.text.strip()


@dataclass
class BeirDataset:
    name: str
    corpus: dict[str, Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    split: str

    def doc_items(self) -> tuple[list[str], list[str], list[str]]:
        """(ids, texts, skipped ids): documents with no text cannot be embedded and are skipped."""
        ids, texts, skipped = [], [], []
        for d in self.corpus.values():
            t = d.full_text
            (ids if t else skipped).append(d.id)
            if t:
                texts.append(t)
        return ids, texts, skipped


def read_queries(path: str | os.PathLike[str]) -> dict[str, str]:
    """``{query id: text}`` of a queries.jsonl[.gz] file; a row without ``_id`` or a repeated id is
    a :class:`DatasetError` naming the line."""
    path = Path(path)
    queries: dict[str, str] = {}
    lines: dict[str, int] = {}
    for no, row in iter_jsonl(path):
        qid = _row_id(row, path, no)
        if qid in lines:
            raise DatasetError(f"{path}:{no} repeats query id {qid!r} (first on line {lines[qid]})")
        lines[qid] = no
        queries[qid] = _row_text(row, path, no)
    return queries


def available_splits(path: str | os.PathLike[str]) -> list[str]:
    q = Path(path) / "qrels"
    # hidden files are not splits: macOS leaves "._dev.tsv" beside "dev.tsv" on foreign disks and archives
    return sorted(p.stem for p in q.glob("*.tsv") if not p.name.startswith(".")) if q.is_dir() else []


#: Largest qrels grade magnitude accepted (read from files here, checked again by ``fitting.check_qrels``):
#: every whole number up to it is exact as a float, and sums of gains stay finite (a grade of 10**308 made
#: nDCG NaN in silence, 10**400 a bare OverflowError).
MAX_GRADE = 2**53


def qrels_grade(text: str, path: Path, no: int) -> int:
    """A qrels grade: a whole number ("1", "2.0"). ``int(float())`` turned 0.7 into 0, so a query judged
    that way silently had no relevant document."""
    try:
        whole = int(text)  # exactly, as written: float() rounded 2**53 + 1 to 2**53 before any check
    except ValueError:
        whole = None
    if whole is None:
        try:
            value = float(text)
        except ValueError:
            raise DatasetError(f"{path}:{no}: score {text[:40]!r} is not a number") from None
        if not value.is_integer():
            raise DatasetError(f"{path}:{no}: score {text[:40]!r} is not a whole number (qrels grades are 0, 1, 2, ...)")
        whole = int(value)
    if abs(whole) > MAX_GRADE:
        raise DatasetError(f"{path}:{no}: score {text[:40]!r} is beyond 2**53 in magnitude; qrels grades are small "
                           "whole numbers (0 = not relevant)")
    return whole


def add_judgment(qrels: dict[str, dict[str, int]], seen: dict[tuple[str, str], int], q: str, d: str, grade: int,
                 path: Path, no: int) -> None:
    """Record one judgment; a pair judged twice is named (the last one silently won)."""
    if (q, d) in seen:
        raise DatasetError(f"{path}:{no} judges query {q!r} and document {d!r} again (first on line {seen[q, d]})")
    seen[q, d] = no
    qrels.setdefault(q, {})[d] = grade


#: Grades above this in a qrels file get a warning (BEIR and TREC grades run 0-4; a document id read as a
#: grade does not).
TYPICAL_MAX_GRADE = 10


def read_qrels_file(path: str | os.PathLike[str]) -> dict[str, dict[str, int]]:
    """The judgments of a qrels file, for ``eval`` and ``fit`` alike.

    BEIR's ``query-id<TAB>corpus-id<TAB>score`` (a header optional, further columns ignored); lines
    without a tab split on white space, where four fields are TREC's ``qid iter docid rel`` (with tabs,
    four fields are TREC's when the second is ``0`` or ``Q0``). A UTF-8 byte order mark is skipped. Why one reader: ``fit`` split every line on white space, so an id with a
    space (``normrank index`` names a file ``my notes/a.txt``) became two fields, and it read a BEIR
    line with an extra column as TREC; ``eval`` split on tabs and read TREC's columns as BEIR's. A BEIR
    line with a fourth column and the corpus id ``0`` reads as TREC.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"no qrels file {path}")
    qrels: dict[str, dict[str, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    first = True
    four_as_beir = 0  # tab-separated lines of four fields read as BEIR's (the second field not 0 or Q0)
    for no, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        tabs = "\t" in line
        row = [f.strip() for f in line.split("\t")] if tabs else line.split()
        if not any(row):
            continue
        if first and row[0].lower() in ("query-id", "query_id", "qid"):  # a header, on the first line with text
            first = False
            continue
        first = False
        # TREC: qid iter docid rel. Any white-space line of four fields (TREC-COVID puts its round, 0.5, 1,
        # 2, where others put 0); with tabs only 0 or Q0 second, as BEIR lines may carry a fourth column.
        if len(row) == 4 and (not tabs or row[1] in ("0", "Q0")):
            row = [row[0], row[2], row[3]]
        elif len(row) == 4:
            four_as_beir += 1
        if len(row) < 3 or not row[0] or not row[1]:
            raise DatasetError(f"{path}:{no} needs query-id, corpus-id and score, got {line!r}")
        add_judgment(qrels, seen, row[0], row[1], qrels_grade(row[2], path, no), path, no)
    if not qrels:
        raise DatasetError(f"{path} holds no judgments")
    top = max(abs(g) for docs in qrels.values() for g in docs.values())
    if top > TYPICAL_MAX_GRADE:  # a grade like 184 is a document id read as a grade, far more often than not
        logger.warning("%s: relevance grades reach %d, where graded qrels usually run 0-4%s", path, top,
                       f"; {four_as_beir} tab-separated lines of four fields were read as BEIR's 'query-id "
                       "corpus-id score extra' (TREC's 'qid iter docid rel' has 0 or Q0 second): check the "
                       "columns" if four_as_beir else "")
    return qrels


def load_qrels(path: Path, corpus: dict[str, Document], queries: dict[str, str]) -> dict[str, dict[str, int]]:
    qrels = read_qrels_file(path)
    bad_q = [q for q in qrels if q not in queries]
    bad_d = sorted({d for docs in qrels.values() for d in docs if d not in corpus})
    if not corpus:
        raise DatasetError(f"the corpus of {path.parent.parent} holds no documents")
    if not queries:
        raise DatasetError(f"the queries file of {path.parent.parent} holds no queries")
    if bad_q or bad_d:
        parts = ([f"{len(bad_q)} queries (e.g. {bad_q[:3]})"] if bad_q else []) + (
            [f"{len(bad_d)} documents (e.g. {bad_d[:3]})"] if bad_d else [])
        raise DatasetError(f"{path} names ids the collection lacks: {', '.join(parts)}")
    return qrels


def load_beir(path: str | os.PathLike[str], split: str = "test") -> BeirDataset:
    """Load a BEIR folder; ``split`` names ``qrels/<split>.tsv``."""
    folder = Path(path)
    if not folder.is_dir():
        raise DatasetError(f"no such folder: {folder}")
    corpus: dict[str, Document] = {}
    corpus_path = _find(folder, "corpus")
    lines: dict[str, int] = {}
    for no, row in iter_jsonl(corpus_path):
        did = _row_id(row, corpus_path, no)
        if did in lines:
            raise DatasetError(f"{corpus_path}:{no} repeats document id {did!r} (first on line {lines[did]}); "
                               "ids must be unique")
        lines[did] = no
        meta = row.get("metadata")
        corpus[did] = Document(did, _row_text(row, corpus_path, no, "title"), _row_text(row, corpus_path, no),
                               meta if isinstance(meta, dict) else {})
    queries = read_queries(_find(folder, "queries"))
    splits = available_splits(folder)
    if split not in splits:
        raise DatasetError(f"{folder} has no qrels/{split}.tsv; available splits: {splits or 'none'}")
    qrels = load_qrels(folder / "qrels" / f"{split}.tsv", corpus, queries)
    return BeirDataset(folder.resolve().name or str(folder), corpus, queries, qrels, split)  # "." has no name
