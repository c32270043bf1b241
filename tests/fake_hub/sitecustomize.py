"""Loaded at interpreter start-up by processes a test launches with this directory on PYTHONPATH.

The real huggingface_hub code path runs; only its network calls are replaced by recorders that
append one JSON line per call to ``$FAKE_HUB_LOG`` (with the calling rank), so a test can check
exactly what would have been uploaded or downloaded, and by whom. Used by tests/test_publish.py and the guide
tests.
"""

import json
import os
import types

import huggingface_hub

LOG = os.environ["FAKE_HUB_LOG"]


def _record(kind, **kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({"call": kind, "rank": os.environ.get("RANK", "0"), **kw}) + "\n")


def create_repo(self, repo_id, **kw):
    _record("create_repo", repo_id=repo_id, private=kw.get("private"))


def create_commit(self, repo_id, operations, **kw):
    files = {}  # path in repo -> the uploaded text (bytes) or the local file's name
    for op in operations:
        src = op.path_or_fileobj
        files[op.path_in_repo] = src.decode() if isinstance(src, bytes) else os.path.basename(src)
    failing = os.environ.get("FAKE_HUB_FAIL_COMMIT")  # tests: a commit whose message names this fails
    if failing and failing in kw.get("commit_message", ""):
        _record("create_commit_failed", repo_id=repo_id, message=kw.get("commit_message"))
        raise OSError(f"fake hub: the connection was reset during {kw.get('commit_message')!r}")
    _record("create_commit", repo_id=repo_id, files=files, message=kw.get("commit_message"))
    return types.SimpleNamespace(oid=f"fake{len(files):036d}", commit_url=f"fake://{repo_id}")


def create_tag(self, repo_id, *, tag, revision=None, **kw):
    _record("create_tag", repo_id=repo_id, tag=tag, revision=revision)


def _inner_whoami(self, token=None):
    """The /whoami-v2 request behind ``HfApi.whoami`` (the token check before it stays real)."""
    _record("whoami")
    return {"name": "me", "type": "user"}


def snapshot_download(repo_id, *, repo_type=None, local_dir=None, revision=None, **kw):
    """The download's transport: copies ``$FAKE_HUB_DATASETS/<repo_id>`` (a local stand-in for the Hub
    repo) into ``local_dir``, slowly enough that a second concurrent download would be seen overlapping."""
    import shutil
    import time

    _record(
        "snapshot_download",
        repo_id=repo_id,
        repo_type=repo_type,
        local_rank=os.environ.get("LOCAL_RANK", "0"),
    )
    source = os.path.join(os.environ.get("FAKE_HUB_DATASETS", "/nonexistent"), repo_id)
    if not os.path.isdir(source):
        raise OSError(f"fake hub: no repository {repo_id}")
    time.sleep(1.0)
    shutil.copytree(source, local_dir, dirs_exist_ok=True)
    _record("snapshot_done", repo_id=repo_id)
    return local_dir


# The test user is logged in: a token exists, so the real credential lookup finds one.
os.environ.setdefault("HF_TOKEN", "hf_fake_token_of_the_test_user")
huggingface_hub.HfApi._inner_whoami = _inner_whoami
huggingface_hub.HfApi.create_repo = create_repo
huggingface_hub.HfApi.create_commit = create_commit
huggingface_hub.HfApi.create_tag = create_tag
huggingface_hub.snapshot_download = snapshot_download
