"""A local stand-in for the Hugging Face hub, so hub ids are tested with no network: an HTTP
server on loopback answering what huggingface_hub's `snapshot_download` asks (a repository's
info at a revision, its file tree, each file's `resolve/` URL), and a cache laid out on disk as
huggingface_hub lays it. Tests point HF_ENDPOINT at the server or HF_HUB_CACHE at the cache."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    """A repository's files at each commit, its branches and tags, and whether it is gated."""

    commits: dict[str, dict[str, bytes]]
    refs: dict[str, str]
    # A gated repository's files answer 401 without `Authorization: Bearer <this>`.
    gated_token: str | None = None

    def commit_of(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


@dataclass
class StandInHub:
    """The repositories the stand-in serves, by id; `requests` logs each "METHOD path"."""

    repos: dict[str, HubRepo]
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def requested_files(self) -> set[str]:
        """The file names whose bytes were asked for (GET on a resolve/ URL)."""
        return {
            line.split("/resolve/", 1)[1].split("/", 1)[1]
            for line in self.requests
            if line.startswith("GET ") and "/resolve/" in line
        }


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of a checkpoint folder by its name in the repository."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def blob_name(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@contextmanager
def running_hub(repos: dict[str, HubRepo]) -> Iterator[StandInHub]:
    """Serve `repos` on a free loopback port for the duration of the block."""
    hub = StandInHub(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def write_hub_cache(cache: Path, repo_id: str, commit: str, files: dict[str, bytes]) -> Path:
    """Lay `files` out in `cache` as huggingface_hub does: content in blobs/, a snapshot folder
    per commit of relative symlinks to them, and refs/main naming the commit. Returns the
    snapshot folder."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    for name, content in files.items():
        blob = storage / "blobs" / blob_name(content)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return snapshot


def _handler_for(hub: StandInHub) -> type[BaseHTTPRequestHandler]:
    class HubHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

        def log_message(self, format: str, *args) -> None:
            pass  # the test's output stays the test's

        def _answer(self, with_body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6:
                self._api(f"{parts[2]}/{parts[3]}", parts[4], parts[5], with_body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), with_body)
            else:
                self._error(404, "EntryNotFound", with_body)

        def _api(self, repo_id: str, kind: str, revision: str, with_body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", with_body)
            commit = repo.commit_of(revision)
            if commit is None:
                return self._error(404, "RevisionNotFound", with_body)
            files = repo.commits[commit]
            if kind == "revision":
                siblings = [{"rfilename": name} for name in files]
                body = {"id": repo_id, "sha": commit, "siblings": siblings, "private": False}
            elif kind == "tree":
                body = [
                    {"type": "file", "path": name, "size": len(content), "oid": blob_name(content)}
                    for name, content in files.items()
                ]
            else:
                return self._error(404, "EntryNotFound", with_body)
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, True)

        def _resolve(self, repo_id: str, revision: str, name: str, with_body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", with_body)
            if repo.gated_token and self.headers.get("authorization") != (
                f"Bearer {repo.gated_token}"
            ):
                return self._error(401, "GatedRepo", with_body)
            commit = repo.commit_of(revision)
            if commit is None:
                return self._error(404, "RevisionNotFound", with_body)
            content = repo.commits[commit].get(name)
            if content is None:
                return self._error(404, "EntryNotFound", with_body)
            # The headers huggingface_hub reads a file's metadata from; no X-Xet-Hash, so it
            # downloads over plain HTTP.
            headers = {"X-Repo-Commit": commit, "ETag": f'"{blob_name(content)}"'}
            self._send(200, content, headers, with_body)

        def _error(self, status: int, code: str, with_body: bool) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": code}
            self._send(status, json.dumps({"error": code}).encode(), headers, with_body)

        def _send(self, status: int, body: bytes, headers: dict[str, str], with_body: bool):
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

    return HubHandler
