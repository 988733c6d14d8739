"""The ``normrank`` command: one parser, ``main(argv) -> int``, errors as one line on stderr."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from normrank.errors import NormRankError

logger = logging.getLogger(__name__)


def _demo_rows(name: str) -> list[dict]:
    text = resources.files("normrank").joinpath("data", name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def cmd_demo(args: argparse.Namespace) -> int:
    """Index the bundled demo corpus and show cosine and normrank rankings side by side."""
    from normrank.cache import cache_dir
    from normrank.scoring import Weights
    from normrank.store import NormIndex

    docs = _demo_rows("demo_corpus.jsonl")
    queries = [q["text"] for q in _demo_rows("demo_queries.jsonl")]
    if args.query:
        queries = args.query
    texts = [f"{d['title']}\n{d['text']}" for d in docs]
    index = NormIndex.from_texts(texts, ids=[d["_id"] for d in docs], metadatas=[{"title": d["title"]} for d in docs])
    out = Path(args.out) if args.out else cache_dir() / "demo-index"
    index.save(out)
    index = NormIndex.load(out, encoder=index.encoder)
    index.calibrate_queries([q["text"] for q in _demo_rows("demo_queries.jsonl")])
    blend = Weights(a=args.a, b=args.b, feature="calibrated")
    print(f"normrank demo: {len(index)} passages, model {index.encoder.model_name}")
    print(f"saved to {out} and reloaded; blend: s = cos + ({args.a:+g} {args.b:+g}*g_q) * g(d), "
          "a hand-set illustrative weight (fit your own with `normrank eval`/`normrank fit`)\n")
    for q in queries:
        index.set_weights(Weights())
        cos_hits = index.search(q, args.k)
        index.set_weights(blend)
        nr_hits = index.search(q, args.k)
        print(f"query: {q}")
        print(f"  {'cosine ranking':<38} | {'normrank ranking':<38} cosine  g(d)   w(q)   score")
        for c, h in zip(cos_hits, nr_hits):
            print(f"  {c.id:<10} {c.cosine:6.3f} {c.metadata['title'][:20]:<20} | "
                  f"{h.id:<10} {h.metadata['title'][:27]:<27} {h.cosine:6.3f} {h.norm_feature:+6.2f} "
                  f"{h.weight:+6.3f} {h.score:6.3f}")
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="normrank", description="Norm-aware retrieval: cosine plus a "
                                     "calibrated, query-conditioned embedding-norm term.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="index a bundled corpus and compare cosine with normrank (no data needed)")
    p.add_argument("--query", action="append", help="a query to run (repeatable); default: bundled queries")
    p.add_argument("-k", type=int, default=3, help="hits per query (default 3)")
    p.add_argument("--a", type=float, default=-0.03, help="constant norm weight (default -0.03)")
    p.add_argument("--b", type=float, default=0.0, help="query-conditioned norm weight (default 0)")
    p.add_argument("--out", help="where to save the demo index (default: the user cache folder)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (NormRankError, FileNotFoundError) as exc:
        print(f"normrank {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
