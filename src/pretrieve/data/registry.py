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

import ast
import contextlib
import csv
import difflib
import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Mapping

from pretrieve.data.beir import check_qrels, iter_corpus, load_qrels, load_queries
from pretrieve.data.collection import BeirCollection
from pretrieve.data.convert import convert
from pretrieve.data.hub import fetch, hub_names, hub_source
from pretrieve.data.pretrain_text import split_corpus
from pretrieve.data.records import default_cache_dir
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_dir, write_json

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
#: The SMART distribution of Cranfield (cran.all.1400, cran.qry, cranqrel) that ir_datasets downloads as well.
CRANFIELD_URL = "http://ir.dcs.gla.ac.uk/resources/test_collections/cran/cran.tar.gz"
#: RocketQA's MS MARCO passages with titles (marco/para.txt, marco/para.title.txt, …); no published checksum.
ROCKETQA_MARCO_URL = "https://rocketqa.bj.bcebos.com/corpus/marco.tar.gz"
#: Microsoft's MS MARCO passage files (the host ir_datasets and Anserini's guide use today).
MSMARCO_URL = "https://msmarco.z22.web.core.windows.net/msmarcoranking/"
#: NIST's TREC Deep Learning judgments.
TREC_DL_URL = "https://trec.nist.gov/data/deep/"
#: Tevatron's raw files on the Hugging Face hub (downloaded as files: their loading scripts are never run).
TEVATRON_URL = "https://huggingface.co/datasets/Tevatron/{repo}/resolve/main/{file}"
#: DPR's Wikipedia passages and question/answer files (facebookresearch/DPR, dpr/data/download_data.py).
DPR_URL = "https://dl.fbaipublicfiles.com/dpr/"
DOWNLOAD_TIMEOUT_S = 60
DOWNLOAD_ATTEMPTS = 5              # a cut connection is resumed (HTTP Range) this many times within one call
OFFLINE_ENV = "PRETRIEVE_OFFLINE"
#: Checksums recorded on first download of a file whose publisher gives none (trust on first use), beside the
#: collections: ``<cache>/checksums.lock.json`` (``{url: {"md5": ..., "bytes": ...}}``).
CHECKSUM_LOCK = "checksums.lock.json"
#: Where files are downloaded (and ``.part`` files resumed) before a collection is built from them.
DOWNLOADS_DIR = ".downloads"


@dataclass(frozen=True)
class Source:
    """One downloaded file: its URL and md5 (None when its publisher gives none: recorded on first download)."""

    url: str
    md5: str | None = None

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class CollectionInfo:
    """A downloadable collection: its archive URL, md5 (None when unpublished), splits and a description."""

    name: str
    url: str
    md5: str | None
    splits: tuple[str, ...]
    description: str
    archive: str = "beir-zip"      # how the downloads are built into the collection: a key of _BUILDERS
    base: str | None = None        # the collection whose queries and qrels (or corpus) a derived collection takes
    extra: tuple[Source, ...] = ()  # further files the build reads besides ``url``

    @property
    def sources(self) -> tuple[Source, ...]:
        return (Source(self.url, self.md5), *self.extra)


def _msmarco_file(name: str, md5: str) -> Source:
    return Source(MSMARCO_URL + name, md5)


#: TREC DL 2019 and 2020 queries and judgments (md5s: ir_datasets' downloads.json, docs/data.md).
DL19_FILES = (_msmarco_file("msmarco-test2019-queries.tsv.gz", "eda71eccbe4d251af83150abe065368c"),
              Source(TREC_DL_URL + "2019qrels-pass.txt", "2f4be390198da108f6845c822e5ada14"))
DL20_FILES = (_msmarco_file("msmarco-test2020-queries.tsv.gz", "00a406fb0d14ed3752d70d1e4eb98600"),
              Source(TREC_DL_URL + "2020qrels-pass.txt", "0355ccee7509ac0463e8278186cdd8d1"))
#: CQADupStack's 12 StackExchange forums, the sub-collections of BEIR's ``cqadupstack.zip``; BEIR's CQADupStack
#: score is the mean of the 12 forums' scores.
CQADUPSTACK_FORUMS = ("android", "english", "gaming", "gis", "mathematica", "physics", "programmers", "stats", "tex",
                      "unix", "webmasters", "wordpress")
#: DPR's question/answer files per collection: ``{name: ((split, file), ...)}``; CuratedTREC's answers are regular
#: expressions (DPR's ``--match regex``).
DPR_QA_FILES = {"dpr-nq": (("dev", "nq-dev.qa.csv"), ("test", "nq-test.qa.csv")),
                "dpr-trivia": (("dev", "trivia-dev.qa.csv"), ("test", "trivia-test.qa.csv")),
                "dpr-curatedtrec": (("test", "curatedtrec-test.qa.csv"),)}


def _dpr_qa(name: str, description: str) -> CollectionInfo:
    files = tuple(Source(DPR_URL + "data/retriever/" + file) for _, file in DPR_QA_FILES[name])
    return CollectionInfo(name, files[0].url, None, tuple(split for split, _ in DPR_QA_FILES[name]), description,
                          archive="dpr-qa", base="dpr-wiki", extra=files[1:])


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
    CollectionInfo("msmarco-titled", ROCKETQA_MARCO_URL, None, ("train", "dev", "test", "dl19", "dl20"),
                   "MS MARCO passages with RocketQA's titles (the BoW, DupMAE, CoT-MAE, CoT-MoTE corpus); queries and "
                   "qrels of BEIR's msmarco (test = dl19 = TREC DL 2019), TREC DL 2020 as dl20",
                   archive="rocketqa-titled", base="msmarco", extra=DL20_FILES),
    CollectionInfo("msmarco-passage", MSMARCO_URL + "collectionandqueries.tar.gz", "31644046b18952c1386cd4564ba2ae69",
                   ("train", "dev", "dl19", "dl20"),
                   "MS MARCO passage from Microsoft's files (no titles): train, dev (= dev.small, 6,980 queries), "
                   "TREC DL 2019 and 2020", archive="msmarco-microsoft", extra=DL19_FILES + DL20_FILES),
    CollectionInfo("msmarco-bm25-negatives", TEVATRON_URL.format(repo="msmarco-passage", file="train.jsonl.gz"), None,
                   (), "Tevatron's msmarco-passage training groups with their BM25 negatives (the file, not the "
                   "loading script) as groups/train.jsonl; ids of msmarco-titled", archive="tevatron-groups"),
    CollectionInfo("cqadupstack", BEIR_URL.format(name="cqadupstack"), "4e41456d7df8ee7760a7f866133bda78", ("test",),
                   "CQADupStack, 12 StackExchange forums evaluated as one benchmark (the mean of the forums' scores, "
                   "as BEIR reports it)", archive="beir-forums"),
    CollectionInfo("dpr-wiki", DPR_URL + "wikipedia_split/psgs_w100.tsv.gz", None, (),
                   "DPR's Wikipedia (2018-12-20), 21M passages of 100 words with titles: the corpus of dpr-nq, "
                   "dpr-trivia, dpr-curatedtrec", archive="dpr-wiki"),
    _dpr_qa("dpr-nq", "Natural Questions open (DPR's split) on dpr-wiki: answer accuracy (Acc@k), no qrels"),
    _dpr_qa("dpr-trivia", "TriviaQA (DPR's split) on dpr-wiki: answer accuracy (Acc@k), no qrels"),
    _dpr_qa("dpr-curatedtrec", "CuratedTREC (DPR's split) on dpr-wiki: answer accuracy, answers are regular "
            "expressions"),
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
        if _is_built(candidate):
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
    """Download the files of a known collection into ``cache_dir/.downloads`` (resumed, checksummed) and build the
    collection in ``cache_dir/<name>`` from them, unless already there (a Hub or ir_datasets name:
    :func:`pretrieve.data.hub.fetch`)."""
    info = KNOWN_COLLECTIONS.get(name.lower())
    if info is None and (source := hub_source(name)) is not None:
        return fetch(source, cache_dir)
    if info is None:
        raise InputError(f"unknown collection '{name}'; known collections: {', '.join(KNOWN_COLLECTIONS)}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / info.name
    if _is_built(target):
        return target
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InputError(f"exists but holds no corpus.jsonl; remove it or download '{info.name}' elsewhere "
                         "(it is never overwritten)", path=target)
    base = resolve_collection(info.base, cache_dir=cache_dir) if info.base else None   # before the long download
    files = fetch_files(info.name, info.sources, root)
    try:
        _BUILDERS[info.archive](files, target, base, info)
    except InputError:   # a file no checksum vouches for (an error page?) is fetched again next time
        for source in info.sources:
            if expected_md5(source, root)[0] is None:
                files[source.filename].unlink(missing_ok=True)
        _remove_if_empty(root / DOWNLOADS_DIR)
        raise
    record_checksums(info.sources, files, root)   # trust on first use: only once the build accepted the files
    for path in files.values():   # the collection is built: its archives go (they are kept while it fails)
        path.unlink(missing_ok=True)
    _remove_if_empty(root / DOWNLOADS_DIR)
    return target


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.startswith((".", "~"))


def _has_corpus(root: Path) -> bool:
    return (root / "corpus.jsonl").is_file() or (root / "corpus.jsonl.gz").is_file()


def _is_built(root: Path) -> bool:
    """A collection directory, a benchmark of several (:func:`benchmark_parts`) or a directory of training groups."""
    return _has_corpus(root) or bool(benchmark_parts(root)) or (root / "groups" / "train.jsonl").is_file()


def benchmark_parts(root: str | Path) -> list[Path]:
    """The collections of a benchmark directory that is scored as the mean of its parts — CQADupStack's 12 forums
    (BEIR's layout: ``cqadupstack/<forum>/corpus.jsonl``) — or ``[]`` for any other directory."""
    root = Path(root)
    if _has_corpus(root) or not root.is_dir():
        return []
    parts = [root / forum for forum in CQADUPSTACK_FORUMS]
    return parts if all(_has_corpus(part) for part in parts) else []


# ----------------------------------------------------------------------------------------- downloading

def download_file(url: str, dest: Path) -> None:
    """Fetch ``url`` into ``dest``, resuming what ``dest`` already holds with an HTTP Range request (a server that
    ignores the range sends the whole file, which replaces it); a connection cut before the announced length is
    resumed up to ``DOWNLOAD_ATTEMPTS`` times. Network errors propagate (tests replace this function)."""
    failure: Exception | None = None
    for _ in range(DOWNLOAD_ATTEMPTS):
        have = dest.stat().st_size if dest.exists() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
                resumed = have and response.status == 206
                length = response.headers.get("Content-Length")
                total = (have if resumed else 0) + int(length) if length is not None else None
                with open(dest, "ab" if resumed else "wb") as out:
                    shutil.copyfileobj(response, out, length=1 << 20)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have:   # nothing left to send: the file is whole (its checksum decides)
                return
            raise
        except (OSError, http.client.HTTPException) as exc:   # a cut connection: resumed below
            failure = exc
            continue
        if total is None or dest.stat().st_size >= total:
            return
        failure = OSError(f"connection closed after {dest.stat().st_size} of {total} bytes")
    raise failure if failure is not None else OSError("download failed")


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_checksum_lock(root: Path) -> dict[str, dict[str, Any]]:
    """``{url: {"md5", "bytes"}}`` recorded on first download under ``root`` (the cache); ``{}`` when none."""
    path = root / CHECKSUM_LOCK
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg}); fix or remove it", path=path, line=exc.lineno) from None


def record_checksums(sources: tuple[Source, ...], files: Mapping[str, Path], root: Path) -> None:
    """Write the md5 of every file whose publisher gives none into ``root/checksums.lock.json`` (trust on first use);
    a later download of the same URL must match it."""
    lock = read_checksum_lock(root)
    new = {s.url: {"md5": file_md5(files[s.filename]), "bytes": files[s.filename].stat().st_size}
           for s in sources if s.md5 is None and s.url not in lock}
    if new:
        write_json(root / CHECKSUM_LOCK, {**lock, **new})


def expected_md5(source: Source, root: Path) -> tuple[str | None, str]:
    """The md5 a download must have and where it comes from (the registry, or the lock of a first download)."""
    if source.md5 is not None:
        return source.md5, "published"
    recorded = read_checksum_lock(root).get(source.url, {}).get("md5")
    return recorded, f"recorded in {root / CHECKSUM_LOCK} on first download"


def fetch_files(name: str, sources: tuple[Source, ...], root: Path) -> dict[str, Path]:
    """Each source downloaded into ``root/.downloads`` (kept there until the collection is built; a ``.part`` file is
    resumed), its md5 checked against the published or recorded one: ``{filename: path}``. Offline, or when the
    network fails, one line names the files to fetch by hand and where to put them."""
    directory = root / DOWNLOADS_DIR
    files = {s.filename: directory / s.filename for s in sources}
    missing = [s for s in sources if not files[s.filename].is_file()]
    if missing and os.environ.get(OFFLINE_ENV, "").strip() not in ("", "0"):
        raise InputError(f"could not download '{name}': offline mode ({OFFLINE_ENV} is set); fetch by hand into "
                         f"{directory}: {_listing(missing, root)}, and run again; or pass a local path to a "
                         "BEIR-layout directory")
    for source in sources:
        path = files[source.filename]
        expected, origin = expected_md5(source, root)
        if not path.is_file():
            directory.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".part")
            try:
                download_file(source.url, part)
            except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError, timeouts are OSErrors
                reason = getattr(exc, "reason", None) or exc
                if part.exists() and part.stat().st_size == 0:
                    part.unlink()
                _remove_if_empty(directory)
                raise InputError(f"could not download '{name}' from {source.url} ({reason}); run again to resume, "
                                 f"or fetch it by hand into {path}; or pass a local path to a BEIR-layout directory"
                                 ) from None
            if expected is not None and file_md5(part) != expected:
                actual = file_md5(part)
                part.unlink()
                _remove_if_empty(directory)
                raise InputError(f"checksum mismatch for '{name}': expected md5 {expected} ({origin}), got {actual} "
                                 "(corrupt or changed download, removed; retry, or pass a local path)",
                                 path=source.url)
            os.replace(part, path)
        elif expected is not None and file_md5(path) != expected:
            raise InputError(f"checksum mismatch for '{name}': expected md5 {expected} ({origin}), got "
                             f"{file_md5(path)}; remove the file to download it again", path=path)
    return files


def _listing(sources: list[Source], root: Path) -> str:
    return ", ".join(f"{s.url} (md5 {expected_md5(s, root)[0] or 'not published: recorded on first use'})"
                     for s in sources)


def _remove_if_empty(directory: Path) -> None:
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()


def _build_beir_zip(files: Mapping[str, Path], target: Path, base: Path | None, info: CollectionInfo) -> None:
    _unpack(files[info.sources[0].filename], target, info.name)


def _unpack(archive: Path, target: Path, name: str) -> None:
    """Unzip atomically into ``target``; the collection may sit in one top-level folder of the zip."""
    try:
        with zipfile.ZipFile(archive) as zf, atomic_dir(target) as tmp:
            staging = tmp / ".unzip"
            _safe_extract(zf, staging, archive)
            root = _collection_root(staging)
            if root is None:
                raise InputError(f"archive of '{name}' holds no corpus.jsonl", path=archive)
            for child in root.iterdir():
                os.replace(child, tmp / child.name)
            shutil.rmtree(staging)
    except zipfile.BadZipFile as exc:
        raise InputError(f"downloaded archive of '{name}' is not a valid zip ({exc})", path=archive) from None


def _safe_extract(zf: zipfile.ZipFile, staging: Path, archive: Path) -> None:
    for member in zf.namelist():
        dest = (staging / member).resolve()
        if not dest.is_relative_to(staging.resolve()):
            raise InputError(f"archive member '{member}' points outside the target", path=archive)
    zf.extractall(staging)


def _convert_cranfield(files: Mapping[str, Path], target: Path, base: Path | None, info: CollectionInfo) -> None:
    """The SMART files of Cranfield (a ``.tar.gz``) → a BEIR-layout directory, atomically (module docstring)."""
    archive = files[info.sources[0].filename]
    with _tar_members(archive, ("cran.all.1400", "cran.qry", "cranqrel"), "Cranfield",
                      "downloaded archive of 'cranfield'") as members:
        read = {name: io.TextIOWrapper(member, encoding="utf-8", errors="replace").read()
                for name, member in members.items()}
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


@contextlib.contextmanager
def _tar_members(archive: Path, names: tuple[str, ...], label: str,
                 downloaded: str) -> Iterator[dict[str, IO[bytes]]]:
    """The members ``names`` (matched by file name) of a tar archive, open for reading; a missing member (``label
    archive lacks …``) or a broken archive (``downloaded is not a valid tar.gz``) is one located error."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            missing = [name for name in names if name not in members]
            if missing:
                raise InputError(f"{label} archive lacks {', '.join(missing)}", path=archive)
            yield {name: tar.extractfile(members[name]) for name in names}
    except tarfile.TarError as exc:
        raise InputError(f"{downloaded} is not a valid tar.gz ({exc})", path=archive) from None


def _extract(archive: Path, names: tuple[str, ...], staging: Path, label: str) -> None:
    """Copy the members ``names`` (matched by file name) of a tar archive into ``staging``."""
    staging.mkdir(parents=True, exist_ok=True)
    with _tar_members(archive, names, label, f"downloaded {label} archive") as members:
        for name, source in members.items():
            with source, open(staging / name, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)


def _dl_inputs(files: Mapping[str, Path], sources: tuple[Source, ...]) -> tuple[list[Path], list[tuple[str, Path]]]:
    """The queries and ``(split, qrels)`` of the TREC DL files among ``sources`` (dl19, dl20)."""
    queries, qrels = [], []
    for queries_file, qrels_file in zip(sources[::2], sources[1::2]):
        queries.append(files[queries_file.filename])
        qrels.append(("dl" + qrels_file.filename[2:4], files[qrels_file.filename]))
    return queries, qrels


def _convert_rocketqa_titled(files: Mapping[str, Path], target: Path, base: Path | None,
                             info: CollectionInfo) -> None:
    """RocketQA's ``marco.tar.gz`` → the titled passages (``para.txt`` joined with ``para.title.txt``, as
    bowdpr's ``get_data.sh``) with the queries and qrels of ``base`` (BEIR's msmarco; its test split, TREC DL 2019,
    also as ``dl19``) and TREC DL 2020 (``dl20``), atomically."""
    collection = BeirCollection(base)
    with atomic_dir(target) as tmp:
        staging = tmp / ".rocketqa"
        _extract(files[info.sources[0].filename], ("para.txt", "para.title.txt"), staging, "RocketQA's MS MARCO")
        dl_queries, dl_qrels = _dl_inputs(files, info.extra)
        qrels = [(split, collection.qrels_path(split)) for split in collection.splits()]
        qrels += [("dl19", collection.qrels_path("test"))] if "test" in collection.splits() else []
        convert(tmp, corpus=staging / "para.txt", titles=staging / "para.title.txt",
                queries=[collection.queries_path, *dl_queries], qrels=qrels + dl_qrels)
        shutil.rmtree(staging)


def _convert_msmarco_microsoft(files: Mapping[str, Path], target: Path, base: Path | None,
                               info: CollectionInfo) -> None:
    """Microsoft's ``collectionandqueries.tar.gz`` (collection.tsv; train and dev.small queries and qrels) and the
    TREC DL 2019/2020 files → ``msmarco-passage`` (splits train, dev, dl19, dl20), atomically."""
    names = ("collection.tsv", "queries.train.tsv", "queries.dev.small.tsv", "qrels.train.tsv", "qrels.dev.small.tsv")
    with atomic_dir(target) as tmp:
        staging = tmp / ".msmarco"
        _extract(files[info.sources[0].filename], names, staging, "MS MARCO's collectionandqueries")
        dl_queries, dl_qrels = _dl_inputs(files, info.extra)
        convert(tmp, corpus=staging / "collection.tsv",
                queries=[staging / "queries.train.tsv", staging / "queries.dev.small.tsv", *dl_queries],
                qrels=[("train", staging / "qrels.train.tsv"), ("dev", staging / "qrels.dev.small.tsv"), *dl_qrels])
        shutil.rmtree(staging)


def _convert_tevatron_groups(files: Mapping[str, Path], target: Path, base: Path | None,
                             info: CollectionInfo) -> None:
    """Tevatron's ``train.jsonl.gz`` (query, positives, BM25 negatives) → ``groups/train.jsonl`` (ids only)."""
    with atomic_dir(target) as tmp:
        convert(tmp, groups=[files[info.sources[0].filename]])


def _unpack_forums(files: Mapping[str, Path], target: Path, base: Path | None, info: CollectionInfo) -> None:
    """BEIR's ``cqadupstack.zip`` → ``cqadupstack/<forum>/`` (12 BEIR directories), atomically."""
    archive = files[info.sources[0].filename]
    try:
        with zipfile.ZipFile(archive) as zf, atomic_dir(target) as tmp:
            staging = tmp / ".unzip"
            _safe_extract(zf, staging, archive)
            root = staging / info.name if (staging / info.name).is_dir() else staging
            if not benchmark_parts(root):
                raise InputError(f"archive of '{info.name}' lacks some of its forums (each with a corpus.jsonl): "
                                 f"{', '.join(CQADUPSTACK_FORUMS)}", path=archive)
            for forum in CQADUPSTACK_FORUMS:
                os.replace(root / forum, tmp / forum)
            shutil.rmtree(staging)
    except zipfile.BadZipFile as exc:
        raise InputError(f"downloaded archive of '{info.name}' is not a valid zip ({exc})", path=archive) from None


def _convert_dpr_wiki(files: Mapping[str, Path], target: Path, base: Path | None, info: CollectionInfo) -> None:
    """DPR's ``psgs_w100.tsv.gz`` (header ``id text title``; CSV quoting in a tab-separated file, read as DPR reads it
    with ``csv.reader(delimiter="\\t")``) → ``corpus.jsonl``, atomically."""
    source = files[info.sources[0].filename]
    with atomic_dir(target) as tmp:
        with gzip.open(source, "rt", encoding="utf-8", newline="") as handle, \
                open(tmp / "corpus.jsonl", "w", encoding="utf-8") as out:
            rows = csv.reader(handle, delimiter="\t")
            header = next(rows, None)
            if header != ["id", "text", "title"]:
                raise InputError(f"expected the header 'id<TAB>text<TAB>title', got {header!r}", path=source, line=1)
            for line, row in enumerate(rows, start=2):
                if len(row) != 3 or not row[0].strip():
                    raise InputError(f"expected 3 tab-separated columns (id, text, title), got {len(row)}",
                                     path=source, line=line)
                out.write(json.dumps({"_id": row[0].strip(), "title": row[2], "text": row[1]}) + "\n")


def _convert_dpr_qa(files: Mapping[str, Path], target: Path, base: Path | None, info: CollectionInfo) -> None:
    """DPR's ``*.qa.csv`` files (``question<TAB>["answer", ...]``) → ``queries.jsonl`` (ids ``<split>-<row>``, the row
    from 0 in file order), ``answers/<split>.jsonl`` and the corpus of ``base`` (dpr-wiki) linked, atomically."""
    queries, answers = [], {}
    for split, filename in DPR_QA_FILES[info.name]:
        path = files[filename]
        answers[split] = {}
        with open(path, encoding="utf-8", newline="") as handle:
            for row_no, row in enumerate(csv.reader(handle, delimiter="\t")):
                if len(row) != 2:
                    raise InputError(f"expected 2 tab-separated columns (question, answers), got {len(row)}",
                                     path=path, line=row_no + 1)
                try:
                    given = ast.literal_eval(row[1])
                except (ValueError, SyntaxError):
                    raise InputError("expected a list of answer strings", path=path, line=row_no + 1,
                                     field="answers") from None
                if not isinstance(given, list) or not all(isinstance(a, str) for a in given):
                    raise InputError("expected a list of answer strings", path=path, line=row_no + 1,
                                     field="answers")
                qid = f"{split}-{row_no}"
                queries.append({"_id": qid, "text": row[0]})
                answers[split][qid] = given
    with atomic_dir(target) as tmp:
        corpus = BeirCollection(base).corpus_path
        (tmp / corpus.name).symlink_to(corpus.resolve())
        (tmp / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
        (tmp / "answers").mkdir()
        match = {"match": "regex"} if info.name == "dpr-curatedtrec" else {}   # pretrieve.evaluation.answers
        for split, by_query in answers.items():
            (tmp / "answers" / f"{split}.jsonl").write_text("".join(
                json.dumps({"_id": qid, "answers": given, **match}) + "\n" for qid, given in by_query.items()),
                encoding="utf-8")


_BUILDERS = {"beir-zip": _build_beir_zip, "cranfield-smart": _convert_cranfield,
             "rocketqa-titled": _convert_rocketqa_titled, "msmarco-microsoft": _convert_msmarco_microsoft,
             "tevatron-groups": _convert_tevatron_groups, "beir-forums": _unpack_forums,
             "dpr-wiki": _convert_dpr_wiki, "dpr-qa": _convert_dpr_qa}


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
