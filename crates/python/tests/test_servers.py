"""The example servers (crates/python/examples/servers) as a user runs
them: FastAPI under `uvicorn --workers 2` (workers spawned) and a WSGI app
under `gunicorn --preload --workers 2` (sessions made in the master,
workers forked). A few requests of a small model: every answer equals
onnxruntime's, and each worker's arena gives its memory back when idle.
load.py stops each server's whole process group on every path."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def servers_dir() -> Path:
    # tools/python-check.sh copies the folder beside the tests; in the tree
    # it is crates/python/examples/servers.
    for d in (HERE / "servers", HERE.parent / "examples" / "servers"):
        if (d / "load.py").is_file():
            return d
    raise AssertionError(f"examples/servers not found beside {HERE}")


@pytest.fixture(scope="module")
def load(assets, monkeypatch_module):
    d = servers_dir()
    monkeypatch_module.setenv("TENSOR_ARENA_ORT_ASSETS", str(assets))
    sys.path.insert(0, str(d))
    try:
        import load as module
        yield module
    finally:
        sys.path.remove(str(d))


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
def test_server_outputs_equal_onnxruntime_and_workers_give_memory_back(load, server, tmp_path):
    with open(tmp_path / "server.log", "wb") as log:
        r = load.run(server, "ta", requests=16, clients=4, idle=2.5, settle_s=30.0, log=log)
    print(r)
    assert r["identical"], r
    assert len(r["workers"]) == 2, r
    assert sum(w["served"] for w in r["workers"]) == 16, r
    for w in r["workers"]:
        # Idle decay (2 s) in each worker, forked or spawned.
        assert w["reserved"] == 0, (w, (tmp_path / "server.log").read_text()[-3000:])
