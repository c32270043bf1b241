"""A loopback Hugging Face Hub: serves one local LeRobot dataset directory as a dataset repo.

Enough of huggingface.co's API for the real ``huggingface_hub`` client (``HfApi.dataset_info``,
``HfFileSystem`` ls/info/cat_file, ranged GETs, ``hf_hub_download``) with
``HF_ENDPOINT=http://127.0.0.1:<port>``:

- ``GET /api/datasets/{repo}`` and ``GET /api/datasets/{repo}/revision/{rev}``: repo info with ``sha``;
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=...``: a directory listing (one page);
- ``POST /api/datasets/{repo}/paths-info/{rev}`` (form field ``paths``): info of those paths;
- ``HEAD``/``GET /datasets/{repo}/resolve/{rev}/{path}``: the file, ``Range`` answered with 206.

``main`` resolves to one fixed fake commit sha (:attr:`HubServer.sha`, changeable to simulate a push);
any other revision that is not that sha (nor an earlier sha of main) is a 404 ``RevisionNotFound``.
Fault injection for tests: ``drop_every`` closes the connection mid-body on every K-th file GET,
``fail_path`` answers 500 to every file GET whose path contains it. ``GET /_stats`` gives the
requests and bytes served. Nothing outside ``root`` is ever served (paths are resolved, symlinks
leaving the root refused).

CLI: ``python tools/hub_server.py --root DIR --repo-id org/name [--latency-ms 20] [--port 0]`` prints
``http://127.0.0.1:<port>`` and serves until killed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_SHA = "0123456789abcdef0123456789abcdef01234567"
_SHA = re.compile(r"^[0-9a-f]{40}$")


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        root: Path,
        repo_id: str,
        latency_s: float = 0.0,
        port: int = 0,
        drop_every: int = 0,
        fail_path: str | None = None,
        sha: str = DEFAULT_SHA,
    ) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.root = Path(root).resolve()
        self.repo_id = repo_id
        self.latency_s = latency_s
        self.drop_every = drop_every
        self.fail_path = fail_path
        self.shas = [sha]  # every sha main has pointed to; the last is main now
        self.lock = threading.RLock()
        self.stats = {"requests": 0, "bytes": 0, "file_gets": 0, "drops": 0, "paths": {}, "revs": {}}

    @property
    def sha(self) -> str:
        return self.shas[-1]

    def move_main(self, sha: str) -> None:
        """Point ``main`` at another commit (a push); the old sha still resolves."""
        with self.lock:
            self.shas.append(sha)

    def resolve_rev(self, rev: str) -> str | None:
        rev = unquote(rev)
        if rev == "main":
            return self.sha
        return rev if rev in self.shas else None

    def local(self, path_in_repo: str) -> Path | None:
        """The file or directory ``path_in_repo`` names under the root; None if it escapes the root."""
        path_in_repo = unquote(path_in_repo).strip("/")
        target = (self.root / path_in_repo).resolve()
        if target != self.root and self.root not in target.parents:
            return None
        return target


def _oid(path: Path) -> str:
    st = path.stat()
    return hashlib.sha1(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:
        pass

    # ------------------------------------------------------------------ helpers
    def _count(self, nbytes: int, path: str | None = None) -> None:
        with self.server.lock:
            self.server.stats["bytes"] += nbytes
            if path is not None:
                paths = self.server.stats["paths"]
                paths[path] = paths.get(path, 0) + nbytes

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
            self._count(len(body))

    def _json(self, code: int, obj, head: bool = False) -> None:
        self._send(code, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head)

    def _error(self, code: int, error_code: str, message: str, head: bool = False) -> None:
        self._send(
            code,
            json.dumps({"error": message}).encode(),
            {"Content-Type": "application/json", "X-Error-Code": error_code, "X-Error-Message": message},
            head,
        )

    def _entry(self, path: Path) -> dict:
        rel = path.relative_to(self.server.root).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": _oid(path), "size": 0, "path": rel}
        return {"type": "file", "oid": _oid(path), "size": path.stat().st_size, "path": rel}

    def _repo_prefix(self, path: str, prefix: str) -> str | None:
        """The rest of ``path`` after ``prefix + repo_id``, or None when it names another repo."""
        start = prefix + self.server.repo_id
        if path == start:
            return ""
        if path.startswith(start + "/"):
            return path[len(start) :]
        return None

    # ------------------------------------------------------------------ dispatch
    def _handle(self, head: bool = False) -> None:
        with self.server.lock:
            self.server.stats["requests"] += 1
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        split = urlsplit(self.path)
        raw, query = split.path, parse_qs(split.query)
        if raw == "/_stats":
            with self.server.lock:
                return self._json(200, json.loads(json.dumps(self.server.stats)))
        rest = self._repo_prefix(raw, "/api/datasets/")
        if rest is not None:
            return self._api(rest, query, head)
        rest = self._repo_prefix(raw, "/datasets/")
        if rest is not None and rest.startswith("/resolve/"):
            rev, _, path_in_repo = rest[len("/resolve/") :].partition("/")
            return self._resolve(rev, path_in_repo, head)
        self._error(404, "RepoNotFound", f"Repository not found: {raw}", head)

    def _api(self, rest: str, query: dict, head: bool) -> None:
        parts = rest.strip("/").split("/", 2) if rest.strip("/") else []
        if not parts or parts[0] == "revision":
            sha = self.server.resolve_rev(parts[1] if len(parts) > 1 else "main")
            if sha is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {parts[1]}", head)
            files = [
                {"rfilename": p.relative_to(self.server.root).as_posix()}
                for p in sorted(self.server.root.rglob("*"))
                if p.is_file()
            ]
            return self._json(
                200,
                {
                    "_id": "0" * 24,
                    "id": self.server.repo_id,
                    "author": self.server.repo_id.split("/")[0],
                    "sha": sha,
                    "private": False,
                    "gated": False,
                    "disabled": False,
                    "tags": [],
                    "siblings": files,
                },
                head,
            )
        if parts[0] in ("tree", "paths-info") and len(parts) >= 2:
            if self.server.resolve_rev(parts[1]) is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {parts[1]}", head)
            if parts[0] == "tree":
                target = self.server.local(parts[2] if len(parts) > 2 else "")
                if target is None or not target.is_dir():
                    return self._error(404, "EntryNotFound", "Entry not found", head)
                recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
                found = target.rglob("*") if recursive else target.iterdir()
                entries = [self._entry(p) for p in sorted(found) if self._inside(p)]
                return self._json(200, entries, head)
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode()) if length else {}
            out = []
            for p in form.get("paths", []):
                target = self.server.local(p)
                if target is not None and target.exists() and self._inside(target):
                    out.append(self._entry(target))
            return self._json(200, out, head)
        self._error(404, "EntryNotFound", f"unknown API path {rest}", head)

    def _inside(self, path: Path) -> bool:
        resolved = path.resolve()
        return resolved == self.server.root or self.server.root in resolved.parents

    def _resolve(self, rev: str, path_in_repo: str, head: bool) -> None:
        with self.server.lock:
            revs = self.server.stats["revs"]
            revs[unquote(rev)] = revs.get(unquote(rev), 0) + 1
        sha = self.server.resolve_rev(rev)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {unquote(rev)}", head)
        target = self.server.local(path_in_repo)
        if target is None or not target.is_file():
            return self._error(404, "EntryNotFound", f"Entry not found: {unquote(path_in_repo)}", head)
        size = target.stat().st_size
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{_oid(target)}"',
            "X-Linked-Size": size,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if head:
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(size))
            self.end_headers()
            return
        rel = target.relative_to(self.server.root).as_posix()
        fail = self.server.fail_path
        if fail and fail in rel:
            return self._error(500, "InternalError", "simulated server error")
        with self.server.lock:
            self.server.stats["file_gets"] += 1
            k = self.server.drop_every
            drop = bool(k) and self.server.stats["file_gets"] % k == 0
            if drop:
                self.server.stats["drops"] += 1
        start, end, code = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not m or (not m.group(1) and not m.group(2)):
                return self._error(416, "RangeNotSatisfiable", f"bad range {rng}")
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start = max(0, size - int(m.group(2)))
            if start >= size or start > end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            code = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        with open(target, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if drop:  # half the body, then the connection goes away
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self._count(len(body) // 2, rel)
            return
        self.wfile.write(body)
        self._count(len(body), rel)

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_POST(self) -> None:
        self._handle()


def serve(
    root: str | Path,
    repo_id: str,
    latency_s: float = 0.0,
    port: int = 0,
    drop_every: int = 0,
    fail_path: str | None = None,
    sha: str = DEFAULT_SHA,
) -> tuple[HubServer, str]:
    """Start a :class:`HubServer` in a daemon thread; returns it and its ``http://127.0.0.1:<port>``.
    Stop it with ``server.shutdown(); server.server_close()``."""
    server = HubServer(Path(root), repo_id, latency_s, port, drop_every, fail_path, sha)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--repo-id", required=True)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--drop-every", type=int, default=0)
    p.add_argument("--fail-path", default=None)
    p.add_argument("--sha", default=DEFAULT_SHA)
    a = p.parse_args(argv)
    if not _SHA.match(a.sha):
        p.error("--sha must be 40 lowercase hex digits")
    server = HubServer(Path(a.root), a.repo_id, a.latency_ms / 1000, a.port, a.drop_every, a.fail_path, a.sha)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
