"""`job submit` with p2p: and https: references and no hash made by hand: the files are fetched
by the hash their URIs name (from `dtrain data serve` in another process, over libp2p, or from
an HTTP server), checked as local files are, and pinned; a served file that does not hash to
its URI is refused before any transaction; `--serve --host` binds and names the address it is
given."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import default_sigint, harness_env
from harness.gossip_cluster import ROOT
from harness.served import listening

from dtrain.recipe import Recipe

DTRAIN = [sys.executable, "-m", "dtrain.cli"]
PINS = ("model_hash", "dataset_hash", "recipe_hash", "dataset_summary")


def chat(i: int) -> dict[str, object]:
    user = {"role": "user", "content": f"{i}+{i}="}
    return {"messages": [user, {"role": "assistant", "content": str(2 * i)}]}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A caller's own job: a GPT-2 folder (the real BPE vocabulary), SFT records, a recipe."""
    from dtrain_node.train.toy_models import save

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(chat(i)) + "\n" for i in range(10)))
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("seq_len = 64\n")
    return {"model": save("gpt2", tmp_path / "gpt2-tiny"), "dataset": data, "recipe": recipe}


class DataServe:
    """`dtrain --json data serve PATH...` in its own process, on 127.0.0.1."""

    def __init__(self, tmp_path: Path, paths: list[Path]) -> None:
        self.cache = tmp_path / "serve-cache"
        options = ["--host", "127.0.0.1", "--port", "0", "--cache-dir", str(self.cache)]
        options += ["--key-file", str(tmp_path / "peer.key")]
        self.err = tmp_path / "serve.err"
        self.proc = subprocess.Popen(
            [*DTRAIN, "--json", "data", "serve", *map(str, paths), *options],
            stdout=subprocess.PIPE,
            stderr=self.err.open("w"),
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=default_sigint,
        )
        assert self.proc.stdout is not None
        self.served = {}
        for _ in paths:
            line = self.proc.stdout.readline()  # blocks until served or the process dies
            assert line, self.err.read_text()[-2000:]
            s = json.loads(line)
            self.served[s["path"]] = s

    def uri(self, path: Path) -> str:
        return str(self.served[str(path)]["uri"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.proc.communicate(timeout=30)


@pytest.fixture
def data_serve(tmp_path: Path) -> Iterator[type]:
    started: list[DataServe] = []

    def start(paths: list[Path]) -> DataServe:
        started.append(DataServe(tmp_path, paths))
        return started[-1]

    yield start  # type: ignore[misc]
    for s in started:
        s.stop()


def submit_args(model: str, dataset: str, recipe: str, cache: Path) -> list[str]:
    return [
        "--json", "job", "submit", "--price", "1gwei", "--method", "sft", "--steps", "4",
        "--sync", "2", "--model-uri", model, "--dataset-uri", dataset, "--recipe", recipe,
        "--cache-dir", str(cache),
    ]  # fmt: skip


@pytest.mark.timeout(600)
def test_submit_with_p2p_uris_pins_what_the_local_files_pin(
    run, bsm, accounts, files, data_serve, tmp_path
) -> None:
    from dtrain_node.train.start import model_hash

    caller = accounts[4]
    code, out, err = run(
        *submit_args(*(str(files[k]) for k in ("model", "dataset", "recipe")), tmp_path / "c0"),
        "--dry-run",
        key=caller.key,
    )
    assert code == 0, err
    local = json.loads(out)
    assert local["model_hash"] == "0x" + model_hash(str(files["model"])).hex()
    assert local["dataset_hash"] == "0x" + hashlib.sha256(files["dataset"].read_bytes()).hexdigest()
    assert local["recipe_hash"] == "0x" + Recipe.from_toml(files["recipe"]).hash().hex()
    assert local["dataset_summary"] == "10 records (sft, messages)"

    server = data_serve([files["model"], files["dataset"], files["recipe"]])
    uris = [server.uri(files[k]) for k in ("model", "dataset", "recipe")]
    assert all(u.startswith("p2p:/ip4/127.0.0.1/tcp/") for u in uris), uris
    # The caller's own cache: the folder `data serve` packed there is read where it is.
    pack = server.cache / "sha256" / server.served[str(files["model"])]["sha256"]
    inode = pack.stat().st_ino
    code, out, err = run(*submit_args(*uris, server.cache), "--dry-run", key=caller.key)
    assert code == 0, err
    dry = json.loads(out)
    assert {k: dry[k] for k in PINS} == {k: local[k] for k in PINS}
    assert pack.stat().st_ino == inode  # not fetched again

    # Another machine's cache: everything is fetched over libp2p, checked, pinned, and sent.
    before = bsm.next_job_id()
    code, out, err = run(*submit_args(*uris, tmp_path / "elsewhere"), key=caller.key)
    assert code == 0, err
    made = json.loads(out)
    assert {k: made[k] for k in PINS} == {k: local[k] for k in PINS}
    assert made["job_id"] == before
    spec = bsm.job(before).spec
    assert (spec.model_uri, spec.dataset_uri, spec.recipe_uri) == tuple(uris)
    assert "0x" + spec.model_hash.hex() == local["model_hash"]
    assert "0x" + spec.dataset_hash.hex() == local["dataset_hash"]
    assert "0x" + spec.recipe_hash.hex() == local["recipe_hash"]


@pytest.mark.timeout(300)
def test_submit_with_https_uris_fetches_by_hash_and_pins(run, accounts, files, tmp_path) -> None:
    """The same over HTTP: the model folder as its pack, the dataset and the recipe as files,
    each named with #sha256=; a URI whose hash is not its file's is refused."""
    from starlette.staticfiles import StaticFiles

    from dtrain_node.p2p.dataserve import prepare

    caller = accounts[4]
    local_args = submit_args(*(str(files[k]) for k in ("model", "dataset", "recipe")), tmp_path)
    code, out, err = run(*local_args, "--dry-run", key=caller.key)
    assert code == 0, err
    local = json.loads(out)
    site = tmp_path / "site"
    pack, pack_sha = prepare(files["model"], site)
    for k in ("dataset", "recipe"):
        (site / files[k].name).write_bytes(files[k].read_bytes())
    sha = {k: hashlib.sha256(files[k].read_bytes()).hexdigest() for k in ("dataset", "recipe")}
    with listening(StaticFiles(directory=site)) as url:
        uris = [f"{url}/{pack.name}#sha256={pack_sha}"]
        uris += [f"{url}/{files[k].name}#sha256={sha[k]}" for k in ("dataset", "recipe")]
        code, out, err = run(*submit_args(*uris, tmp_path / "c"), "--dry-run", key=caller.key)
        assert code == 0, err
        dry = json.loads(out)
        assert {k: dry[k] for k in PINS} == {k: local[k] for k in PINS}
        assert (dry["model_uri"], dry["dataset_uri"], dry["recipe_uri"]) == tuple(uris)
        other = hashlib.sha256(b"not the dataset").hexdigest()
        wrong = f"{url}/{files['dataset'].name}#sha256={other}"
        code, out, err = run(*submit_args(uris[0], wrong, uris[2], tmp_path / "c2"), key=caller.key)
    assert code == 1 and not out
    why = f"sha256 {sha['dataset']} != expected {other}"
    assert err == f"error: dataset {wrong}: {why} (nothing was sent)\n"


@pytest.fixture
def lying_peer(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A data peer process serving a file under a sha256 it does not have: (its URI, the file)."""
    real = tmp_path / "real.jsonl"
    real.write_text("".join(json.dumps(chat(i)) + "\n" for i in range(10)))
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(chat(i)) + "\n" for i in range(1, 11)))
    claimed = hashlib.sha256(other.read_bytes()).hexdigest()
    conf = tmp_path / "liar.json"
    key = str(tmp_path / "liar.key")
    conf.write_text(json.dumps({"key_file": key, "lies": {claimed: str(real)}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.data_server", str(conf)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "liar.err").open("w"),
        text=True,
        cwd=ROOT,
        env=harness_env(),
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    assert line, (tmp_path / "liar.err").read_text()[-2000:]
    try:
        yield json.loads(line)["uris"][claimed], real
    finally:
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        proc.wait(30)


@pytest.mark.timeout(300)
def test_a_mismatched_hash_is_refused_before_any_transaction(
    run, bsm, accounts, lying_peer, tmp_path
) -> None:
    caller = accounts[4]
    uri, real = lying_peer
    nonce = bsm.w3.eth.get_transaction_count(caller.address)
    before = bsm.next_job_id()
    base = ["job", "submit", "--price", "1gwei", "--method", "sft"]
    base += ["--cache-dir", str(tmp_path / "cache")]
    code, out, err = run(*base, "--dataset-uri", uri, key=caller.key)
    assert code == 1 and not out
    assert err.startswith(f"error: dataset {uri}: ") and err.endswith("(nothing was sent)\n"), err
    assert len(err.splitlines()) == 1
    assert not list((tmp_path / "cache" / "sha256").glob("[0-9a-f]*[0-9a-f]"))  # nothing kept

    # A hash given by hand that is not the one the URI names: every node would refuse the job.
    sha = hashlib.sha256(real.read_bytes()).hexdigest()
    code, out, err = run(*base, "--dataset-uri", uri, "--dataset-hash", sha, key=caller.key)
    assert code == 1 and not out
    assert err.startswith(f"error: --dataset-hash 0x{sha} is not the sha256 "), err
    # A remote file without a hash cannot be fetched by one.
    code, _, err = run(*base, "--dataset-uri", uri.split("#")[0], key=caller.key)
    assert code == 1 and "needs #sha256=<hex>" in err, err
    assert bsm.w3.eth.get_transaction_count(caller.address) == nonce
    assert bsm.next_job_id() == before


def wait_for(what: str, check, deadline_s: float):  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(600)
def test_submit_serve_binds_and_names_the_host_it_is_given(
    chain, bsm, accounts, files, tmp_path, run
) -> None:
    """127.0.0.2 is a loopback address no default route names: the job's URIs carry it only if
    --host put it there, and an operator fetches the files from it."""
    from dtrain_node.operator.sources import Cache, Fetcher

    caller = accounts[4]
    code, _, err = run("job", "submit", "--price", "1gwei", "--dataset-uri", str(files["dataset"]),
                       "--host", "127.0.0.2", key=caller.key)  # fmt: skip
    assert code == 2 and "--host goes with --serve" in err, err
    code, _, err = run("job", "submit", "--price", "1gwei", "--dataset-uri", str(files["dataset"]),
                       "--serve", "--host", "nowhere", key=caller.key)  # fmt: skip
    assert code == 2 and "'nowhere' is not an IP address" in err, err

    before = bsm.next_job_id()
    argv = [*DTRAIN, "--rpc-url", chain.url, "--contract", bsm.address, "--key", caller.key]
    argv += submit_args(*(str(files[k]) for k in ("model", "dataset", "recipe")), tmp_path / "c")
    argv += ["--serve", "--host", "127.0.0.2", "--serve-port", "0"]
    err_file = tmp_path / "submit.err"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=err_file.open("w"), text=True, env=env,
        preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, err_file.read_text()[-2000:]
        assert json.loads(line)["job_id"] == before
        spec = bsm.job(before).spec
        uris = (spec.model_uri, spec.dataset_uri, spec.recipe_uri)
        assert all(u.startswith("p2p:/ip4/127.0.0.2/tcp/") for u in uris), uris
        with Fetcher(Cache(tmp_path / "operator", timeout_s=10, progress="log")) as f:
            fetched = f.file(spec.dataset_uri, bytes(spec.dataset_hash), "dataset")
        assert fetched.read_bytes() == files["dataset"].read_bytes()
        bsm.with_account(caller.key).cancel_job(before)
        wait_for("the server to stop once the job ended", lambda: proc.poll() is not None, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, err_file.read_text()[-2000:]
    assert json.loads(out.splitlines()[-1])["stopped_serving"] == "cancelled"
