"""The registry's download path against a real HTTP server on loopback (``http.server`` in a thread): a connection cut
mid-file is resumed with an HTTP Range request, a ``.part`` left by an earlier run is resumed, a differing checksum
(published, or recorded on first download) is refused, offline names the files to fetch by hand; and the papers'
sets built from small stand-ins of their files: CQADupStack's 12 forums, DPR's Wikipedia with NQ's answers."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import json
import threading
import zipfile
from pathlib import Path

import pytest

from pretrieve.data import registry
from pretrieve.data.registry import CollectionInfo, Source
from pretrieve.errors import InputError


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files`` (path → bytes), honouring ``Range: bytes=N-``; a path in ``server.cut`` sends only
    half of its bytes (announcing all of them) the first time, then closes the connection."""

    def do_GET(self):   # noqa: N802 (http.server's name)
        server = self.server
        server.requests.append((self.path, self.headers.get("Range")))
        payload = server.files.get(self.path)
        if payload is None:
            self.send_error(404)
            return
        start = 0
        if self.headers.get("Range", "").startswith("bytes="):
            start = int(self.headers["Range"][len("bytes="):].rstrip("-"))
            if start >= len(payload):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(payload) - 1}/{len(payload)}")
        else:
            self.send_response(200)
        body = payload[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in server.cut:
            server.cut.discard(self.path)
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.delenv(registry.OFFLINE_ENV, raising=False)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.files, httpd.cut, httpd.requests = {}, set(), []
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


PAYLOAD = bytes(range(256)) * 4096   # 1 MiB


def test_a_cut_connection_is_resumed_with_a_range_request(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    server.cut.add("/big.bin")
    dest = tmp_path / "big.bin.part"
    registry.download_file(server.url + "/big.bin", dest)
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/big.bin", None), ("/big.bin", f"bytes={len(PAYLOAD) // 2}-")]


def test_a_part_left_by_an_earlier_run_is_resumed_and_checked(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    source = Source(server.url + "/big.bin", hashlib.md5(PAYLOAD).hexdigest())
    (tmp_path / registry.DOWNLOADS_DIR).mkdir()
    (tmp_path / registry.DOWNLOADS_DIR / "big.bin.part").write_bytes(PAYLOAD[:1000])
    files = registry.fetch_files("big", (source,), tmp_path)
    assert files["big.bin"].read_bytes() == PAYLOAD and server.requests == [("/big.bin", "bytes=1000-")]
    assert registry.fetch_files("big", (source,), tmp_path) == files and len(server.requests) == 1   # kept: no fetch


def test_a_differing_checksum_is_refused_and_the_file_removed(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    with pytest.raises(InputError, match=r"checksum mismatch for 'big': expected md5 0{32} \(published\), got "
                                         + hashlib.md5(PAYLOAD).hexdigest()):
        registry.fetch_files("big", (Source(server.url + "/big.bin", "0" * 32),), tmp_path)
    assert list(tmp_path.iterdir()) == []


def _forums_zip(forums) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for forum in forums:
            zf.writestr(f"cqadupstack/{forum}/corpus.jsonl", json.dumps({"_id": "d1", "title": "", "text": forum})
                        + "\n")
            zf.writestr(f"cqadupstack/{forum}/queries.jsonl", json.dumps({"_id": "q1", "text": forum}) + "\n")
            zf.writestr(f"cqadupstack/{forum}/qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return buffer.getvalue()


def test_a_file_without_published_checksum_is_pinned_on_first_use(server, tmp_path, monkeypatch):
    """Trust on first use: the md5 of the first download that builds is written to the lock; a later download of
    the same URL with other bytes is refused, naming the lock."""
    first = _forums_zip(registry.CQADUPSTACK_FORUMS)
    server.files["/cqadupstack.zip"] = first
    info = CollectionInfo("cqadupstack", server.url + "/cqadupstack.zip", None, ("test",), "12 forums",
                          archive="beir-forums")
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "cqadupstack", info)
    path = registry.fetch_collection("cqadupstack", tmp_path)
    assert [p.name for p in registry.benchmark_parts(path)] == list(registry.CQADUPSTACK_FORUMS)
    lock = json.loads((tmp_path / registry.CHECKSUM_LOCK).read_text())
    assert lock == {info.url: {"md5": hashlib.md5(first).hexdigest(), "bytes": len(first)}}
    assert registry.resolve_collection("cqadupstack", cache_dir=tmp_path) == path   # a benchmark resolves by name
    server.files["/cqadupstack.zip"] = _forums_zip(registry.CQADUPSTACK_FORUMS[::-1])   # the host changed it
    other = tmp_path / "other"
    other.mkdir()
    (other / registry.CHECKSUM_LOCK).write_text(json.dumps(lock))   # the lock copied to a second machine
    with pytest.raises(InputError, match=r"checksum mismatch for 'cqadupstack': expected md5 \w{32} \(recorded in "
                                         r".*checksums.lock.json on first download\)"):
        registry.fetch_collection("cqadupstack", other)


def test_an_archive_missing_a_forum_is_refused(server, tmp_path, monkeypatch):
    server.files["/cqadupstack.zip"] = _forums_zip(registry.CQADUPSTACK_FORUMS[:11])
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "cqadupstack", CollectionInfo(
        "cqadupstack", server.url + "/cqadupstack.zip", None, ("test",), "11 forums", archive="beir-forums"))
    with pytest.raises(InputError, match="lacks some of its forums"):
        registry.fetch_collection("cqadupstack", tmp_path)
    assert not (tmp_path / "cqadupstack").exists() and not (tmp_path / registry.CHECKSUM_LOCK).exists()


def test_offline_names_every_file_to_fetch_by_hand_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.OFFLINE_ENV, "1")
    with pytest.raises(InputError) as caught:
        registry.fetch_collection("msmarco-passage", tmp_path)
    message = str(caught.value)
    assert "\n" not in message and f"fetch by hand into {tmp_path / registry.DOWNLOADS_DIR}:" in message
    for source in registry.KNOWN_COLLECTIONS["msmarco-passage"].sources:
        assert f"{source.url} (md5 {source.md5})" in message


def test_files_fetched_by_hand_are_used_after_their_checksum(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.OFFLINE_ENV, "1")
    (tmp_path / registry.DOWNLOADS_DIR).mkdir()
    (tmp_path / registry.DOWNLOADS_DIR / "x.bin").write_bytes(b"by hand")
    source = Source("https://example.invalid/x.bin", hashlib.md5(b"by hand").hexdigest())
    assert registry.fetch_files("x", (source,), tmp_path)["x.bin"].read_bytes() == b"by hand"
    with pytest.raises(InputError, match="checksum mismatch.*remove the file to download it again"):
        registry.fetch_files("x", (Source(source.url, "1" * 32),), tmp_path)


def test_dpr_wiki_and_nq_from_dprs_files(server, tmp_path, monkeypatch):
    """psgs_w100.tsv (id, text, title; CSV quoting) → corpus.jsonl; nq-*.qa.csv → queries and answers/<split>.jsonl,
    the corpus linked, not copied."""
    wiki = ('id\ttext\ttitle\n1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron\n'
            '2\tThe Eiffel Tower is in Paris, France.\tEiffel Tower\n')
    server.files["/psgs_w100.tsv.gz"] = gzip.compress(wiki.encode())
    server.files["/nq-dev.qa.csv"] = b"where is the eiffel tower\t['Paris', 'France']\n"
    server.files["/nq-test.qa.csv"] = b'who was aaron\t["a prophet"]\nwho is x\t["nobody"]\n'
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "dpr-wiki", CollectionInfo(
        "dpr-wiki", server.url + "/psgs_w100.tsv.gz", None, (), "wiki", archive="dpr-wiki"))
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "dpr-nq", CollectionInfo(
        "dpr-nq", server.url + "/nq-dev.qa.csv", None, ("dev", "test"), "nq", archive="dpr-qa", base="dpr-wiki",
        extra=(Source(server.url + "/nq-test.qa.csv"),)))
    monkeypatch.delenv(registry.DATA_ENV, raising=False)
    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)
    path = registry.resolve_collection("dpr-nq", cache_dir=tmp_path)
    corpus = [json.loads(line) for line in (path / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    assert corpus == [{"_id": "1", "title": "Aaron", "text": 'Aaron Aaron ( or ; "Ahärôn") is a prophet'},
                      {"_id": "2", "title": "Eiffel Tower", "text": "The Eiffel Tower is in Paris, France."}]
    assert (path / "corpus.jsonl").is_symlink() and (path / "corpus.jsonl").resolve() == \
        (tmp_path / "dpr-wiki" / "corpus.jsonl").resolve()
    queries = [json.loads(line) for line in (path / "queries.jsonl").read_text().splitlines()]
    assert queries == [{"_id": "dev-0", "text": "where is the eiffel tower"}, {"_id": "test-0", "text": "who was aaron"},
                       {"_id": "test-1", "text": "who is x"}]
    answers = [json.loads(line) for line in (path / "answers" / "test.jsonl").read_text().splitlines()]
    assert answers == [{"_id": "test-0", "answers": ["a prophet"]}, {"_id": "test-1", "answers": ["nobody"]}]
    assert sorted(json.loads((tmp_path / registry.CHECKSUM_LOCK).read_text())) == sorted(
        server.url + name for name in ("/psgs_w100.tsv.gz", "/nq-dev.qa.csv", "/nq-test.qa.csv"))
