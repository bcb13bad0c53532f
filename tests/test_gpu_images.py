"""The install holds on GPU images: BM25 never starts JAX, and exact dense search runs without FAISS.

GPU images often ship JAX, and bm25s' ``selection`` module imports ``jax.lax`` and runs a top-k with it at
import when it can, which starts XLA and preallocates most of the GPU's memory. A fake ``jax`` package that
records every use stands in for it here, in a fresh interpreter (bm25s may already be imported in this one).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_FAKE_JAX = {
    "__init__.py": "import os\nopen(os.environ['FAKE_JAX_LOG'], 'a').write('import jax\\n')\n",
    "lax.py": textwrap.dedent("""
        import os
        open(os.environ['FAKE_JAX_LOG'], 'a').write('import jax.lax\\n')

        def top_k(scores, k):
            import numpy as np
            open(os.environ['FAKE_JAX_LOG'], 'a').write('jax.lax.top_k\\n')
            order = np.argsort(-np.asarray(scores), kind="stable")[:k]
            return np.asarray(scores)[order], order
    """),
}

_BM25_SEARCH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    if sys.argv[2] == "first":
        import jax            # a program that uses JAX itself, before BM25
    from pretrieve.retrieval.bm25 import BM25Index
    index = BM25Index.build_from_texts(["d1", "d2", "d3"], ["the cat sat on the mat", "dogs chase cats",
                                                            "a study of mats and rugs"])
    run = index.search({"q1": "cat mats"}, k=3)
    import bm25s.selection
    print(json.dumps({"run": run, "jax_available": bm25s.selection.JAX_IS_AVAILABLE,
                      "backend": index.retriever.backend, "jax_kept": sys.argv[2] != "first" or "jax" in sys.modules}))
""")


@pytest.mark.parametrize("jax_imported", ["never", "first"])
def test_bm25_leaves_jax_alone(tmp_path, jax_imported):
    fake = tmp_path / "site" / "jax"
    fake.mkdir(parents=True)
    for name, text in _FAKE_JAX.items():
        (fake / name).write_text(text)
    log = tmp_path / "jax.log"
    env = {**__import__("os").environ, "FAKE_JAX_LOG": str(log)}
    result = subprocess.run([sys.executable, "-c", _BM25_SEARCH, str(tmp_path / "site"), jax_imported],
                            capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr
    used = log.read_text().splitlines() if log.exists() else []
    assert used == (["import jax"] if jax_imported == "first" else []), used   # bm25s neither imported nor ran it
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["jax_available"] is False and report["backend"] == "numpy" and report["jax_kept"]
    ranking = list(report["run"]["q1"])
    assert ranking[0] == "d1" and sorted(ranking) == ["d1", "d2", "d3"]             # the search still searches
