"""Known collections and where a collection lives: a local directory, the cache, or a download.

``KNOWN_COLLECTIONS`` lists the BEIR datasets published as zips by UKP Darmstadt, with the md5
checksums from the BEIR README (github.com/beir-cellar/beir, "Available Datasets" table) and the splits
that table lists, and Cranfield (Cleverdon 1967; ir_datasets name ``cranfield``), downloaded as the original
SMART files from the University of Glasgow (the archive and md5 ir_datasets uses) and converted to BEIR layout:
documents keep their ids (title = ``.T``, text = ``.W``), queries are numbered 1–225 in file order (the
numbering ``cranqrel`` uses; the ``.I`` numbers of ``cran.qry`` skip values), and the grades 1 (complete answer)
… 4 (minimum interest) become 4 … 1, so that higher is more relevant; ``-1`` (no interest) is left out.
CQADupStack is left out: its zip holds one sub-collection per forum, not one BEIR directory. ``msmarco-titled`` is
MS MARCO's passages *with titles*, the corpus the BoW, DupMAE, CoT-MAE and CoT-MoTE authors fine-tuned and evaluated
on: RocketQA's ``para.txt`` joined with its ``para.title.txt`` (the archive bowdpr's and RetroMAE's ``get_data.sh``
download; :func:`pretrieve.data.convert.convert` with ``titles``), with the queries and qrels of BEIR's ``msmarco``
(the same passage ids; resolved, or downloaded, first).

:func:`resolve_collection` (and :func:`resolve_collections`, several at once) is the one resolver of collection
names for every command, the recipe runner and the Python API: a path is used as given; a name is looked for under
the data roots of :func:`data_roots` (``--data-root`` / ``data_root=``, a recipe's ``data_root``,
``$PRETRIEVE_DATA``, ``../shared/data`` beside a source checkout), then in the download cache, and a name of the
registry found nowhere is downloaded into that cache; a Hugging Face Hub or ir_datasets name (``BeIR/scifact``,
``mteb/scifact``, ``beir/scifact/test``) is fetched once into the cache by :mod:`pretrieve.data.hub`, and a mistyped
name gets the closest known one (:func:`did_you_mean`). :func:`check_collection` validates a directory and counts
what it holds (the ``pretrieve data check`` command).

Nothing here reaches the network unless a known name is found nowhere yet. Set ``PRETRIEVE_OFFLINE=1``
to fail at once instead of trying; ``PRETRIEVE_CACHE`` moves the cache (default
``$XDG_CACHE_HOME/pretrieve`` or ``~/.cache/pretrieve``; collections go to ``<cache>/collections/<name>``).
"""

from __future__ import annotations

import difflib
import hashlib
import http.client
import io
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pretrieve.data.beir import check_qrels, iter_corpus, load_qrels, load_queries
from pretrieve.data.collection import BeirCollection
from pretrieve.data.convert import convert
from pretrieve.data.hub import fetch, hub_names, hub_source
from pretrieve.data.pretrain_text import split_corpus
from pretrieve.data.records import default_cache_dir
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_dir

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
#: The SMART distribution of Cranfield (cran.all.1400, cran.qry, cranqrel) that ir_datasets downloads as well.
CRANFIELD_URL = "http://ir.dcs.gla.ac.uk/resources/test_collections/cran/cran.tar.gz"
#: RocketQA's MS MARCO passages with titles (marco/para.txt, marco/para.title.txt, …); no published checksum.
ROCKETQA_MARCO_URL = "https://rocketqa.bj.bcebos.com/corpus/marco.tar.gz"
DOWNLOAD_TIMEOUT_S = 60
OFFLINE_ENV = "PRETRIEVE_OFFLINE"


@dataclass(frozen=True)
class CollectionInfo:
    """A downloadable collection: its archive URL, md5 (None when unpublished), splits and a description."""

    name: str
    url: str
    md5: str | None
    splits: tuple[str, ...]
    description: str
    archive: str = "beir-zip"      # how the download is unpacked: "beir-zip", "cranfield-smart" or "rocketqa-titled"
    base: str | None = None        # the collection whose queries and qrels a derived corpus takes


def _beir(name: str, md5: str, splits: tuple[str, ...], description: str) -> CollectionInfo:
    return CollectionInfo(name, BEIR_URL.format(name=name), md5, splits, description)


KNOWN_COLLECTIONS: dict[str, CollectionInfo] = {info.name: info for info in (
    _beir("msmarco", "444067daf65d982533ea17ebd59501e4", ("train", "dev", "test"),
          "MS MARCO passage ranking, 8.8M passages (test = TREC DL 2019)"),
    _beir("trec-covid", "ce62140cb23feb9becf6270d0d1fe6d1", ("test",),
          "TREC-COVID, 171K CORD-19 abstracts, 50 queries"),
    _beir("nfcorpus", "a89dba18a62ef92f7d323ec890a0d38d", ("train", "dev", "test"),
          "NFCorpus nutrition/medical, 3.6K documents, graded qrels"),
    _beir("nq", "d4d3d2e48787a744b6f6e691ff534307", ("train", "test"),
          "Natural Questions, 2.68M Wikipedia passages"),
    _beir("hotpotqa", "f412724f78b0d91183a0e86805e16114", ("train", "dev", "test"),
          "HotpotQA multi-hop QA, 5.23M Wikipedia passages"),
    _beir("fiqa", "17918ed23cd04fb15047f73e6c3bd9d9", ("train", "dev", "test"),
          "FiQA-2018 financial QA, 57K posts"),
    _beir("arguana", "8ad3e3c2a5867cdced806d6503f29b99", ("test",),
          "ArguAna counter-argument retrieval, 8.7K arguments"),
    _beir("webis-touche2020", "46f650ba5a527fc69e0a6521c5a23563", ("test",),
          "Touché-2020 argument retrieval, 382K arguments"),
    _beir("quora", "18fb154900ba42a600f84b839c173167", ("dev", "test"),
          "Quora duplicate questions, 523K questions"),
    _beir("dbpedia-entity", "c2a39eb420a3164af735795df012ac2c", ("dev", "test"),
          "DBpedia-Entity entity retrieval, 4.63M entities"),
    _beir("scidocs", "38121350fc3a4d2f48850f6aff52e4a9", ("test",),
          "SCIDOCS citation prediction, 25K abstracts"),
    _beir("fever", "5a818580227bfb4b35bb6fa46d9b6c03", ("train", "dev", "test"),
          "FEVER fact checking, 5.42M Wikipedia abstracts"),
    _beir("climate-fever", "8b66f0a9126c521bae2bde127b4dc99d", ("test",),
          "Climate-FEVER fact checking, 5.42M Wikipedia abstracts"),
    _beir("scifact", "5f7d1de60b170fc8027bb7898e2efca1", ("train", "test"),
          "SciFact scientific claim verification, 5.2K abstracts"),
    CollectionInfo("cranfield", CRANFIELD_URL, "1730f7be572d95a5a4b56c59a7b900a5", ("test",),
                   "Cranfield aeronautics abstracts (ir_datasets: cranfield), 1.4K documents, 225 queries, "
                   "graded qrels", archive="cranfield-smart"),
    CollectionInfo("msmarco-titled", ROCKETQA_MARCO_URL, None, ("train", "dev", "test"),
                   "MS MARCO passages with RocketQA's titles (the BoW, DupMAE, CoT-MAE, CoT-MoTE corpus); queries and "
                   "qrels of BEIR's msmarco", archive="rocketqa-titled", base="msmarco"),
)}


# ------------------------------------------------------------------------------------------- resolving
# One resolver for every command, the recipe runner and the Python API: a path as given, else a name under the data
# roots (data_root, the recipe's data_root, $PRETRIEVE_DATA, ../shared/data beside a source checkout), in the
# download cache, or downloaded. Nothing is downloaded while a copy is found anywhere before.
DATA_ENV = "PRETRIEVE_DATA"


def checkout_data_dir() -> Path | None:
    """``../shared/data`` beside the source checkout this package runs from (None for an installed package)."""
    root = Path(__file__).resolve().parents[3]
    return root.parent / "shared" / "data" if (root / "pyproject.toml").exists() else None


def data_roots(recipe: Mapping[str, Any] | None = None, data_root: str | Path | None = None) -> list[Path]:
    """Where named collections are looked for, in order: ``data_root`` (``--data-root`` / ``data_root=``), the
    recipe's ``data_root``, ``$PRETRIEVE_DATA``, ``../shared/data`` beside a source checkout (then the download
    cache, see :func:`resolve_collections`)."""
    roots = []
    for value in (data_root, (recipe or {}).get("data_root"), os.environ.get(DATA_ENV)):
        if value:
            roots.append(Path(os.path.expandvars(str(value))).expanduser())
    checkout = checkout_data_dir()
    if checkout is not None:
        roots.append(checkout)
    return roots


def find_collection(name_or_path: str | Path, recipe: Mapping[str, Any] | None = None,
                    data_root: str | Path | None = None,
                    cache_dir: str | Path | None = None) -> tuple[Path | None, list[Path]]:
    """``(directory, places looked at)``: a path as given, or a name under the data roots or in the download
    cache — without downloading."""
    text = str(name_or_path)
    path = Path(os.path.expandvars(text)).expanduser()
    if path.is_dir():
        return path, [path]
    if _looks_like_path(text):
        return None, [path]
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    looked = [root / text for root in data_roots(recipe, data_root)] + [cache / text.lower()]
    for candidate in looked:
        if _has_corpus(candidate):
            return candidate, looked
    return None, looked


def resolve_collection(name_or_path: str | Path, *, data_root: str | Path | None = None,
                       recipe: Mapping[str, Any] | None = None, cache_dir: str | Path | None = None) -> Path:
    """The BEIR-layout directory of a path or a collection name (see :func:`resolve_collections`)."""
    return resolve_collections([name_or_path], recipe, data_root, cache_dir=cache_dir)[str(name_or_path)]


def resolve_corpus(value: str | Path | list, *, data_root: str | Path | None = None) -> str | list[str]:
    """A pre-training corpus (``--corpus``, ``corpus=``): a bare collection name → its directory
    (:func:`resolve_collection`); a path, ``DIR@SPLIT`` or ``hf:NAME`` is returned as given (see
    :mod:`pretrieve.data.pretrain_text`). Several sources (a list, or comma-separated) → the list of each resolved."""
    if not value:
        return str(value or "")
    sources = [_resolve_corpus_source(str(source), data_root) for source in split_corpus(value)]
    return sources[0] if len(sources) == 1 else sources


def _resolve_corpus_source(text: str, data_root: str | Path | None) -> str:
    if text.startswith("hf:") or "@" in text or Path(text).exists():
        return text
    if _looks_like_path(text) and hub_source(text) is None:   # a Hub or ir_datasets collection resolves as a name
        return text
    return str(resolve_collection(text, data_root=data_root))


def resolve_collections(names: list[str | Path], recipe: Mapping[str, Any] | None = None,
                        data_root: str | Path | None = None, *,
                        cache_dir: str | Path | None = None) -> dict[str, Path]:
    """Every collection of ``names`` (keyed by ``str(name)``) → its directory: an existing directory as given; a
    name under the first data root that has it (:func:`data_roots`) or in the download cache (``cache_dir``,
    default :func:`~pretrieve.data.records.default_cache_dir`); a name of the download registry found nowhere is
    downloaded into that cache. One :class:`InputError` lists *all* that cannot be found, with the places looked
    at, so a run never trains for minutes before a later stage's collection fails."""
    found: dict[str, Path] = {}
    problems = []
    unknown = hint = False
    for name in dict.fromkeys(str(n) for n in names):
        path, looked = find_collection(name, recipe, data_root, cache_dir)
        if path is not None:
            found[name] = path
            continue
        places = ", ".join(map(str, looked))
        source = None if name.lower() in KNOWN_COLLECTIONS else hub_source(name)
        if Path(os.path.expandvars(name)).expanduser().is_file():
            problems.append(f"'{name}': expected a collection directory (BEIR layout), got a file")
        elif source is not None:   # the Hugging Face Hub or ir_datasets (pretrieve.data.hub)
            try:
                found[name] = fetch(source, cache_dir)
            except InputError as exc:
                problems.append(str(exc))
            continue
        elif _looks_like_path(name):
            problems.append(f"'{name}': collection directory not found{did_you_mean(name, [])}")
        elif name.lower() in KNOWN_COLLECTIONS:
            try:
                found[name] = fetch_collection(name, cache_dir)
            except InputError as exc:   # its message ends with the advice to pass a local path
                problems.append(f"'{name}' is not in {places}, and {exc}")
            continue
        else:
            unknown = True
            problems.append(f"unknown collection '{name}' (looked in {places}){did_you_mean(name, looked)}")
        hint = True
    if problems:
        known = f"; known collections: {', '.join(KNOWN_COLLECTIONS)}" if unknown else ""
        advice = ("; or pass a local path to a BEIR-layout directory, or a data root holding <name>/corpus.jsonl "
                  f"(${DATA_ENV}; data_root in a recipe or in Python; `pretrieve run --data-root`)") if hint else ""
        raise InputError(f"collection{'s' if len(problems) > 1 else ''} not found: {'; '.join(problems)}{known}"
                         + advice)
    return found


def did_you_mean(name: str, looked: list[Path]) -> str:
    """``; did you mean 'scifact'?`` for a mistyped name: the closest of the registry's names, the collections in
    the folders looked in (``looked``: ``<root>/<name>`` each) and the ir_datasets ids (empty when none is close)."""
    local = [p.name for place in looked if place.parent.is_dir() for p in place.parent.iterdir() if _has_corpus(p)]
    close = difflib.get_close_matches(name, [*KNOWN_COLLECTIONS, *local, *hub_names()], n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


def fetch_collection(name: str, cache_dir: str | Path | None = None) -> Path:
    """Download and unpack a known collection into ``cache_dir/<name>`` unless already there (a Hub or
    ir_datasets name: :func:`pretrieve.data.hub.fetch`)."""
    info = KNOWN_COLLECTIONS.get(name.lower())
    if info is None and (source := hub_source(name)) is not None:
        return fetch(source, cache_dir)
    if info is None:
        raise InputError(f"unknown collection '{name}'; known collections: {', '.join(KNOWN_COLLECTIONS)}")
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = target / info.name
    if _has_corpus(target):
        return target
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InputError(f"exists but holds no corpus.jsonl; remove it or download '{info.name}' elsewhere "
                         "(it is never overwritten)", path=target)
    base = resolve_collection(info.base, cache_dir=cache_dir) if info.base else None   # before the long download
    return _download_and_unpack(info, target, base)


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.startswith((".", "~"))


def _has_corpus(root: Path) -> bool:
    return (root / "corpus.jsonl").is_file() or (root / "corpus.jsonl.gz").is_file()


# ----------------------------------------------------------------------------------------- downloading

def download_file(url: str, dest: Path) -> None:
    """Fetch ``url`` into ``dest`` (network errors propagate; tests replace this function)."""
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out, length=1 << 20)


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_and_unpack(info: CollectionInfo, target: Path, base: Path | None = None) -> Path:
    hint = "; pass a local path to a BEIR-layout directory"
    if os.environ.get(OFFLINE_ENV, "").strip() not in ("", "0"):
        raise InputError(f"could not download '{info.name}' from {info.url}: offline mode ({OFFLINE_ENV} is set)"
                         + hint)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{info.name}.", suffix=".zip.part", dir=target.parent)
    os.close(fd)
    archive = Path(tmp_name)
    try:
        try:
            download_file(info.url, archive)
        except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError, timeouts are OSErrors
            reason = getattr(exc, "reason", None) or exc
            raise InputError(f"could not download '{info.name}' from {info.url} ({reason})" + hint) from None
        if info.md5 is not None:
            actual = file_md5(archive)
            if actual != info.md5:
                raise InputError(f"checksum mismatch for '{info.name}': expected md5 {info.md5}, got {actual} "
                                 f"(corrupt or changed download; retry, or pass a local path)", path=info.url)
        if info.archive == "cranfield-smart":
            _convert_cranfield(archive, target)
        elif info.archive == "rocketqa-titled":
            _convert_rocketqa_titled(archive, target, base)
        else:
            _unpack(archive, target, info.name)
    finally:
        archive.unlink(missing_ok=True)
    return target


def _unpack(archive: Path, target: Path, name: str) -> None:
    """Unzip atomically into ``target``; the collection may sit in one top-level folder of the zip."""
    try:
        with zipfile.ZipFile(archive) as zf, atomic_dir(target) as tmp:
            staging = tmp / ".unzip"
            for member in zf.namelist():
                dest = (staging / member).resolve()
                if not dest.is_relative_to(staging.resolve()):
                    raise InputError(f"archive member '{member}' points outside the target", path=archive)
            zf.extractall(staging)
            root = _collection_root(staging)
            if root is None:
                raise InputError(f"archive of '{name}' holds no corpus.jsonl", path=archive)
            for child in root.iterdir():
                os.replace(child, tmp / child.name)
            shutil.rmtree(staging)
    except zipfile.BadZipFile as exc:
        raise InputError(f"downloaded archive of '{name}' is not a valid zip ({exc})", path=archive) from None


def _convert_cranfield(archive: Path, target: Path) -> None:
    """The SMART files of Cranfield (a ``.tar.gz``) → a BEIR-layout directory, atomically (module docstring)."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            missing = [name for name in ("cran.all.1400", "cran.qry", "cranqrel") if name not in members]
            if missing:
                raise InputError(f"Cranfield archive lacks {', '.join(missing)}", path=archive)
            read = {name: io.TextIOWrapper(tar.extractfile(members[name]), encoding="utf-8", errors="replace").read()
                    for name in ("cran.all.1400", "cran.qry", "cranqrel")}
    except tarfile.TarError as exc:
        raise InputError(f"downloaded archive of 'cranfield' is not a valid tar.gz ({exc})", path=archive) from None
    docs = [{"_id": record["I"], "title": record.get("T", ""), "text": record.get("W", "")}
            for record in _smart_records(read["cran.all.1400"])]
    queries = [{"_id": str(number), "text": record.get("W", "")}
               for number, record in enumerate(_smart_records(read["cran.qry"]), start=1)]
    qrels = []
    for line in read["cranqrel"].splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2].lstrip("-").isdigit() and 1 <= int(parts[2]) <= 4:
            qrels.append((parts[0], parts[1], 5 - int(parts[2])))
    with atomic_dir(target) as tmp:
        (tmp / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
        (tmp / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
        (tmp / "qrels").mkdir()
        (tmp / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
            f"{qid}\t{doc}\t{grade}\n" for qid, doc, grade in qrels), encoding="utf-8")


def _convert_rocketqa_titled(archive: Path, target: Path, base: Path) -> None:
    """RocketQA's ``marco.tar.gz`` → the titled passages (``para.txt`` joined with ``para.title.txt``, as
    bowdpr's ``get_data.sh``) with the queries and qrels of ``base`` (BEIR's msmarco), atomically."""
    with atomic_dir(target) as tmp:
        staging = tmp / ".rocketqa"
        staging.mkdir()
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
                missing = [name for name in ("para.txt", "para.title.txt") if name not in members]
                if missing:
                    raise InputError(f"RocketQA's MS MARCO archive lacks {', '.join(missing)}", path=archive)
                for name in ("para.txt", "para.title.txt"):
                    with tar.extractfile(members[name]) as source, open(staging / name, "wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
        except tarfile.TarError as exc:
            raise InputError(f"downloaded archive of 'msmarco-titled' is not a valid tar.gz ({exc})",
                             path=archive) from None
        convert(tmp, corpus=staging / "para.txt", titles=staging / "para.title.txt")
        shutil.rmtree(staging)
        collection = BeirCollection(base)
        shutil.copyfile(collection.queries_path, tmp / collection.queries_path.name)
        shutil.copytree(base / "qrels", tmp / "qrels")


def _smart_records(text: str) -> list[dict[str, str]]:
    """``.I <id>`` records with ``.T``/``.A``/``.B``/``.W`` fields (lines of a field joined by spaces)."""
    records: list[dict[str, str]] = []
    field = None
    for line in text.splitlines():
        if line.startswith(".I"):
            records.append({"I": line[2:].strip().lstrip("0") or "0"})
            field = None
        elif len(line) >= 2 and line[0] == "." and line[1] in "TABW" and line[2:].strip() == "":
            field = line[1]
        elif records and field is not None:
            value = records[-1].get(field, "")
            records[-1][field] = (value + " " + line.strip()).strip()
    return records


def _collection_root(staging: Path) -> Path | None:
    if _has_corpus(staging):
        return staging
    subdirs = [p for p in staging.iterdir() if p.is_dir() and not p.name.startswith("__MACOSX")]
    if len(subdirs) == 1 and _has_corpus(subdirs[0]):
        return subdirs[0]
    return None


# ------------------------------------------------------------------------------------------- checking

@dataclass
class SplitReport:
    """Counts of one qrels split and of its judgments pointing at unknown ids."""

    split: str
    queries: int
    judgments: int
    relevant: int
    unknown_queries: int
    unknown_docs: int


@dataclass
class CollectionReport:
    """What ``pretrieve data check`` found in a collection directory."""

    root: Path
    documents: int
    queries: int
    empty_documents: int = 0
    splits: list[SplitReport] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """Human-readable warnings (unknown ids, empty documents); empty when all is consistent."""
        out = []
        if self.empty_documents:
            out.append(f"{self.empty_documents} documents have neither title nor text")
        for s in self.splits:
            if s.unknown_queries or s.unknown_docs:
                out.append(f"split '{s.split}': {s.unknown_queries} judged queries missing from queries.jsonl, "
                           f"{s.unknown_docs} judgments of documents missing from the corpus")
        return out


def check_collection(root: str | Path, splits: list[str] | None = None) -> CollectionReport:
    """Validate a BEIR-layout directory and count its documents, queries and judgments per split.

    Malformed files raise a located :class:`InputError` (the first problem found). Qrels pointing at
    unknown queries or documents are counted and logged, not errors (see
    :func:`~pretrieve.data.beir.check_qrels`). The corpus is streamed: only its ids are held.
    """
    collection = BeirCollection(Path(root))
    names = splits or collection.splits()
    if not names:
        raise InputError("no relevance judgments (expected qrels/<split>.tsv)", path=collection.root / "qrels")
    qrels_paths = {split: collection.qrels_path(split) for split in names}  # a wrong --split fails first
    corpus_path = collection.corpus_path
    queries_path = collection.queries_path
    doc_line: dict[str, int] = {}
    empty = 0
    for line_no, doc in iter_corpus(corpus_path):
        first = doc_line.setdefault(doc.id, line_no)
        if first != line_no:
            raise InputError(f"duplicate document id '{doc.id}' (first seen on line {first})", path=corpus_path,
                             line=line_no, field="_id")
        if not doc.title.strip() and not doc.text.strip():
            empty += 1
    if not doc_line:
        raise InputError("corpus is empty (no documents)", path=corpus_path)
    queries = load_queries(queries_path)
    report = CollectionReport(collection.root, len(doc_line), len(queries), empty)
    for split, path in qrels_paths.items():
        qrels = load_qrels(path)
        check = check_qrels(qrels, queries, doc_line, path=path)
        report.splits.append(SplitReport(
            split, queries=len(qrels), judgments=sum(len(d) for d in qrels.values()),
            relevant=sum(1 for d in qrels.values() for g in d.values() if g >= 1),
            unknown_queries=check.unknown_queries, unknown_docs=check.unknown_docs))
    return report
