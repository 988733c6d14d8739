"""No code path of normrank can execute stored data: no pickle, no eval, no unsafe YAML.

The scan parses every source file (docstrings that *mention* pickle are fine; code that
uses it is not). It is itself tested on a file full of violations, so it cannot pass
by finding nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("normrank", "integrations", "benchmarks")

#: Modules whose loaders can run arbitrary code.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal", "copyreg"}
#: Builtins that execute strings.
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}
#: Attribute calls that unpickle or construct arbitrary objects.
UNSAFE_ATTRS = {"read_pickle", "to_pickle", "unsafe_load", "full_load", "load_all", "unsafe_load_all"}


def _is_false(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def scan_source(source: str, filename: str = "<string>") -> list[str]:
    """Every unsafe use in ``source``, as ``file:line: what``."""
    found: list[str] = []
    tree = ast.parse(source, filename=filename)

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UNSAFE_MODULES:
                    hit(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in UNSAFE_MODULES:
                hit(node, f"from {node.module} import ...")
        elif isinstance(node, ast.Name) and node.id in UNSAFE_MODULES:
            hit(node, f"name {node.id}")
        elif isinstance(node, ast.Attribute) and ("pickle" in node.attr.lower() or node.attr in UNSAFE_ATTRS):
            hit(node, f"attribute .{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in UNSAFE_CALLS:
                hit(node, f"call {func.id}()")
            for kw in node.keywords:
                if kw.arg in ("allow_pickle", "allow_dangerous_deserialization") and not _is_false(kw.value):
                    hit(node, f"{kw.arg}={ast.unparse(kw.value)}")
                if kw.arg == "weights_only" and not (isinstance(kw.value, ast.Constant) and kw.value.value is True):
                    hit(node, f"weights_only={ast.unparse(kw.value)}")
            if isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name):
                if func.value.id == "yaml" and not any(kw.arg == "Loader" and "Safe" in ast.unparse(kw.value)
                                                      for kw in node.keywords):
                    hit(node, "yaml.load without a SafeLoader")
                if func.value.id == "torch" and not any(kw.arg == "weights_only" for kw in node.keywords):
                    hit(node, "torch.load without weights_only=True")
    return found


def scan_tree(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        found += scan_source(path.read_text(encoding="utf-8"), str(path.relative_to(root.parent)))
    return found


def test_package_has_no_unsafe_deserialisation():
    scanned = [ROOT / d for d in SCANNED if (ROOT / d).is_dir()]
    assert ROOT / "normrank" in scanned
    n_files = sum(1 for d in scanned for _ in d.rglob("*.py"))
    assert n_files >= 10, "the scan found too few files to be meaningful"
    found = [f for d in scanned for f in scan_tree(d)]
    assert found == [], "unsafe deserialisation or code execution:\n" + "\n".join(found)


BAD_SOURCE = '''
"""A docstring may say pickle; that is not a use."""
import pickle
import joblib as jl
from cloudpickle import dumps
import numpy as np, yaml, torch, pandas as pd

data = pickle.loads(b"")
arr = np.load("x.npy", allow_pickle=True)
cfg = yaml.load(open("c.yaml"))
ok_cfg = yaml.load(open("c.yaml"), Loader=yaml.SafeLoader)
w = torch.load("w.bin")
frame = pd.read_pickle("f.pkl")
value = eval("1 + 1")
exec("x = 1")
store = FAISS.load_local("p", emb, allow_dangerous_deserialization=True)
safe = np.load("x.npy", allow_pickle=False)
'''


def test_scan_catches_every_kind_of_violation(tmp_path):
    pkg = tmp_path / "badpkg"
    pkg.mkdir()
    (pkg / "bad.py").write_text(BAD_SOURCE)
    (pkg / "good.py").write_text('"""Never pickle."""\nimport json\nx = json.loads("1")\n')
    found = scan_tree(pkg)
    text = "\n".join(found)
    for what in ("import pickle", "import joblib", "from cloudpickle", "name pickle",
                 "allow_pickle=True", "yaml.load without a SafeLoader", "torch.load without weights_only",
                 "attribute .read_pickle", "call eval()", "call exec()", "allow_dangerous_deserialization=True"):
        assert what in text, f"the scan missed {what!r}:\n{text}"
    assert all(f.startswith("badpkg/bad.py:") for f in found), "good.py (only a docstring) was flagged"
    lines = {int(f.split(":")[1]) for f in found}
    assert 17 not in lines and 11 not in lines, "allow_pickle=False / SafeLoader were flagged"
    assert 2 not in lines, "a docstring mentioning pickle was flagged"


def test_saved_index_has_no_pickled_arrays(tmp_path):
    """Every .npy a save writes loads with allow_pickle=False, i.e. holds plain numbers."""
    from normrank import NormIndex
    from tests.conftest import synthetic

    vecs, counts = synthetic(30, dim=16)
    index = NormIndex(dim=16)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(30)], metadatas=[{"i": i} for i in range(30)])
    folder = index.save(tmp_path / "idx")
    npys = sorted(folder.glob("*.npy"))
    assert [p.name for p in npys] == ["lengths.npy", "norms.npy", "token_counts.npy", "tombstones.npy"]
    for p in npys:
        arr = np.load(p, allow_pickle=False)
        assert arr.dtype != object
