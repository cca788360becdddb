"""The training service, end to end: a real bucket server and a real `python -m services.trainer` on 127.0.0.1;
jobs are real `robotloop train` subprocesses training a tiny ACT on CPU.

Cancel must checkpoint first (the bucket's `checkpoints/last.json` names the step the job reached); a job left
alone runs to its last step; every refused request is a 4xx with a clear JSON message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from robotloop.capture import DatasetRecorder
from robotloop.cli import trainer_service
from robotloop.storage import BucketClient, BucketUrl
from robotloop.train.jobs import JobSpec

from .conftest import WRITE_TOKEN, free_port
from .test_capture import SPEC, synthetic_episode

WRITER, READER, ELSEWHERE = "rl_trainer_w", "rl_trainer_r", "rl_trainer_elsewhere"
DATASET = "hf://buckets/lab/trainsvc/datasets/cube"


@dataclass
class Trainer:
    endpoint: str
    root: Path
    bucket: BucketClient

    def call(self, method: str, path: str, token: str | None = WRITER, **kw) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, f"{self.endpoint}{path}", headers=headers, timeout=60, **kw)

    def wait(self, job_id: str, until, timeout_s: float = 60) -> dict:
        deadline = time.monotonic() + timeout_s
        while not until(state := self.call("GET", f"/v1/jobs/{job_id}").json()):
            assert time.monotonic() < deadline, f"job {job_id} stuck: {state}\n{self.log(job_id)[-3000:]}"
            time.sleep(0.2)
        return state

    def log(self, job_id: str) -> str:
        return self.call("GET", f"/v1/jobs/{job_id}/log").json()["text"]


@pytest.fixture(scope="module")
def trainer(bucket_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trainer]:
    """The service, writing to the test bucket server with its own storage token, plus a 2-episode dataset."""
    base = tmp_path_factory.mktemp("trainer")
    bucket = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    recorder = DatasetRecorder(bucket, BucketUrl.parse(DATASET), SPEC, staging=base / "stage")
    for k in range(2):
        recorder.commit(synthetic_episode(k, frames=16))
    tokens = base / "tokens"
    tokens.write_text(f"{WRITER} write lab\n{READER} read lab\n{ELSEWHERE} write elsewhere\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROBOTLOOP_", "HF_"))}
    env.update(
        {
            "ROBOTLOOP_CONFIG": os.devnull,
            "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
            "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
            "ROBOTLOOP_TRAINER__CANCEL_GRACE_S": "60",
            "XDG_CACHE_HOME": str(base / "cache"),
            "HF_HOME": str(base / "hf"),
        }
    )
    log = open(base / "trainer.log", "ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.trainer",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tokens",
            str(tokens),
            "--root",
            str(base / "jobs"),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (base / "trainer.log").read_text()[-3000:]
        try:
            if httpx.get(f"{endpoint}/v1/health").status_code == 200:
                break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "training service did not start"
            time.sleep(0.1)
    yield Trainer(endpoint, base / "jobs", bucket)
    proc.terminate()
    proc.wait(30)


def job(output: str, steps: int, **kw) -> dict:
    return {
        "datasets": [DATASET],
        "output": output,
        "steps": steps,
        "batch_size": 4,
        "device": "cpu",
        "tiny": True,
        "log_every": 1,
        "checkpoint_every": 10,
        "decode_workers": 1,
        "onnx": "off",  # no export of the last checkpoint: seconds of 2 cores that these tests are not about
        **kw,
    }


def last_checkpoint_step(trainer: Trainer, output: str) -> int:
    return json.loads(trainer.bucket.read_range(BucketUrl.parse(output) / "checkpoints" / "last.json", 0, 4096))["step"]


def test_cancel_checkpoints_first_and_a_queued_job_then_runs_to_the_end(trainer):
    # A long job (it must still be running when cancelled), then a 30-step one that waits behind it (1 slot).
    long_out, short_out = "hf://buckets/lab/trainsvc/models/cancelled", "hf://buckets/lab/trainsvc/models/done"
    submitted = trainer.call("POST", "/v1/jobs", json=job(long_out, 100_000))
    assert submitted.status_code == 201, submitted.text
    first = submitted.json()["id"]
    queued = trainer.call("POST", "/v1/jobs", json=job(short_out, 30)).json()
    assert queued["status"] == "queued" and queued["spec"]["storage_token_set"]
    second = queued["id"]
    assert WRITE_TOKEN not in (trainer.root / first / "job.json").read_text()  # the storage token stays in memory

    state = trainer.wait(first, lambda s: (s["step"] or 0) > 0)
    assert state["status"] == "running" and isinstance(state["loss"], float)
    assert state["samples_per_s"] > 0 and 0 <= state["data_wait_share"] <= 1 and state["episodes"] >= 1

    page = trainer.call("GET", f"/v1/jobs/{first}/log", params={"offset": 0}).json()
    assert "step " in page["text"] and page["next_offset"] == len(page["text"].encode())
    more = trainer.call("GET", f"/v1/jobs/{first}/log", params={"offset": page["next_offset"]}).json()
    assert more["next_offset"] >= page["next_offset"]

    cancelled = trainer.call("POST", f"/v1/jobs/{first}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["message"].startswith("cancelling")
    state = trainer.wait(first, lambda s: s["status"] == "cancelled")
    assert state["exit_code"] == 0, state  # stopped by the trainer, not killed
    assert state["last_checkpoint"].endswith(f"checkpoints/{state['step']:06d}")
    assert last_checkpoint_step(trainer, long_out) == state["step"]  # the checkpoint was written at the step reached

    streamed = trainer.call("GET", f"/v1/jobs/{second}/log", params={"follow": "true"})  # returns once it ends
    assert "30 steps in" in streamed.text, streamed.text[-2000:]
    state = trainer.wait(second, lambda s: s["status"] != "running")
    assert state["status"] == "succeeded" and state["step"] == 30 and state["exit_code"] == 0, state
    assert state["last_checkpoint"].endswith("checkpoints/000030") and last_checkpoint_step(trainer, short_out) == 30

    watched = CliRunner().invoke(
        trainer_service.app, ["watch", second, "--url", trainer.endpoint, "--service-token", READER]
    )
    assert watched.exit_code == 0 and "succeeded: finished 30 steps" in watched.output, watched.output
    listed = trainer.call("GET", "/v1/jobs", token=READER).json()["jobs"]  # a read token may watch
    assert [(j["id"], j["status"]) for j in listed][-2:] == [(first, "cancelled"), (second, "succeeded")]
    again = trainer.call("POST", f"/v1/jobs/{first}/cancel").json()  # cancelling a finished job changes nothing
    assert again["status"] == "cancelled"
    # A token of another namespace sees none of lab's jobs: not listed, and 404 like a job that does not exist.
    assert trainer.call("GET", "/v1/jobs", token=ELSEWHERE).json()["jobs"] == []
    for path in (f"/v1/jobs/{second}", f"/v1/jobs/{second}/log"):
        hidden = trainer.call("GET", path, token=ELSEWHERE)
        assert hidden.status_code == 404 and "no job" in hidden.json()["error"]


@pytest.mark.parametrize(
    "method, path, token, body, status, message",
    [
        ("POST", "/v1/jobs", None, job("hf://buckets/lab/x/models/a", 5), 401, "token is required"),
        ("POST", "/v1/jobs", "rl_nobody", job("hf://buckets/lab/x/models/a", 5), 401, "Invalid credentials"),
        ("POST", "/v1/jobs", READER, job("hf://buckets/lab/x/models/a", 5), 403, "read-only"),
        ("POST", "/v1/jobs", ELSEWHERE, job("hf://buckets/lab/x/models/a", 5), 403, "scoped to namespace"),
        (
            "POST",
            "/v1/jobs",
            WRITER,
            {**job("hf://buckets/lab/x/models/a", 5), "datasets": ["s3://lab/cube"]},
            422,
            "datasets",
        ),
        ("POST", "/v1/jobs", WRITER, job("hf://models/lab/a", 5), 422, "buckets"),
        ("POST", "/v1/jobs", WRITER, job("hf://buckets/lab/x/models/a", 0), 422, "steps"),
        ("POST", "/v1/jobs", WRITER, {**job("hf://buckets/lab/x/models/a", 5), "lr": 2}, 422, "lr"),  # lr <= 1
        ("POST", "/v1/jobs", WRITER, job("hf://buckets/lab/x/models/a", 5, gpus=2), 422, "needs device 'cuda'"),
        ("GET", "/v1/jobs", None, None, 401, "token is required"),
        ("GET", "/v1/jobs", "rl_nobody", None, 401, "Invalid credentials"),  # reads check the token too
        ("GET", "/v1/nope", READER, None, 404, "Not Found"),  # every refusal has the {"error": ...} shape
        ("DELETE", "/v1/jobs", WRITER, None, 405, "Method Not Allowed"),
        ("POST", "/v1/jobs", WRITER, job("hf://buckets/lab/x/models/a", 5, seed=10**30), 422, "seed"),
        (  # the fixture's service has no weights folder: a caller cannot make it load a file of its machine
            "POST",
            "/v1/jobs",
            WRITER,
            job("hf://buckets/lab/x/models/a", 5, backbone_weights="/etc/passwd"),
            400,
            "no weights folder",
        ),
        ("GET", f"/v1/jobs/nope/log?offset={2**62}", READER, None, 422, "offset"),
        ("GET", "/v1/jobs/nope", READER, None, 404, "no job 'nope'"),
        ("GET", "/v1/jobs/nope/log", READER, None, 404, "no job 'nope'"),
        ("POST", "/v1/jobs/nope/cancel", WRITER, None, 404, "no job 'nope'"),
        ("POST", "/v1/jobs/nope/cancel", READER, None, 403, "read-only"),
    ],
)
def test_bad_requests_are_4xx_with_a_message(trainer, method, path, token, body, status, message):
    before = len(list(trainer.root.iterdir()))
    response = trainer.call(method, path, token=token, json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    assert len(list(trainer.root.iterdir())) == before  # nothing was submitted


def test_a_huge_body_is_refused_before_anyone_reads_it(trainer):
    response = httpx.post(
        f"{trainer.endpoint}/v1/jobs",
        content=b"[" + b" " * (2 * 2**20) + b"]",
        headers={"content-type": "application/json"},
    )  # no token: refused by size first
    assert response.status_code == 413 and "limit" in response.json()["error"]


def test_robotloop_train_serve_is_the_training_service():
    """Every service starts as `robotloop <X> serve`: `train serve` and `train watch` reach the trainer group."""
    import subprocess
    import sys

    for argv in (["train", "serve", "--help"], ["--endpoint", "http://127.0.0.1:1", "train", "watch", "--help"]):
        out = subprocess.run([sys.executable, "-m", "robotloop.cli", *argv], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and f"robotloop trainer {argv[-2]}" in out.stdout, out.stdout + out.stderr


SUBMIT = ["trainer", "submit", "--dataset", DATASET, "--output", "hf://buckets/lab/trainsvc/models/submitted"]
SUBMIT += ["--steps", "2", "--batch-size", "4", "--tiny", "--decode-workers", "1", "--log-every", "1"]
SUBMIT += ["--onnx", "off"]  # as `job`: no export of the last checkpoint


@pytest.fixture(scope="module")
def submitted(trainer) -> tuple[dict, dict]:
    """A 2-step job `robotloop trainer submit --json` sent: what it printed, and the job's state once it ended."""
    from robotloop.cli import app

    args = [*SUBMIT, "--trainer-url", trainer.endpoint, "--trainer-token", WRITER, "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    done = trainer.wait(printed["id"], lambda s: s["status"] in ("succeeded", "failed"), timeout_s=240)
    assert done["status"] == "succeeded", trainer.log(printed["id"])[-3000:]
    return printed, done


def test_robotloop_trainer_submit_runs_a_job_and_every_service_serves_its_openapi(trainer, submitted):
    """No curl with an undocumented body: `robotloop trainer submit` takes `robotloop train`'s options, and
    GET /openapi.json documents the routes."""
    from robotloop.cli import app

    printed, _ = submitted
    assert printed["spec"]["steps"] == 2 and printed["spec"]["tiny"] is True
    args = [*SUBMIT, "--trainer-url", trainer.endpoint, "--trainer-token", WRITER, "--json"]
    zero_steps = [("0" if i and args[i - 1] == "--steps" else a) for i, a in enumerate(args)]
    bad = CliRunner().invoke(app, zero_steps)
    assert bad.exit_code == 2 and "--steps" in bad.output  # the same bounds as `robotloop train`, before sending
    schema = httpx.get(f"{trainer.endpoint}/openapi.json", timeout=30).json()
    assert "/v1/jobs" in schema["paths"] and "post" in schema["paths"]["/v1/jobs"]


def test_trainer_status_list_and_watch_print_text_and_json(trainer, submitted):
    """`robotloop train status|list|watch` (the trainer group's, as `train` spells them): a line or table for
    people, with --json the job's state as GET /v1/jobs answers it (watch: its final state, no bar)."""
    _, done = submitted
    job = done["id"]
    service = ["--trainer-url", trainer.endpoint, "--trainer-token", READER]

    def cli(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "robotloop.cli", "train", *args, *service]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})

    status = cli("status", job, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    state = json.loads(status.stdout)
    assert state["id"] == job and state["status"] == "succeeded" and state["step"] == 2
    assert state["last_checkpoint"].endswith("checkpoints/000002") and state["spec"]["steps"] == 2
    text = cli("status", job).stdout
    assert f"job {job} succeeded: step 2/2" in text and "checkpoints/000002" in text
    listed = cli("list", "--json")
    assert listed.returncode == 0 and job in [j["id"] for j in json.loads(listed.stdout)]
    assert job in cli("list").stdout
    watched = cli("watch", job, "--json")
    assert watched.returncode == 0 and json.loads(watched.stdout)["status"] == "succeeded", watched.stdout
    missing = cli("status", "nope", "--json")
    assert missing.returncode == 1 and "no job 'nope'" in missing.stdout


def test_a_full_queue_refuses_new_jobs_and_creates_nothing(tmp_path):
    from robotloop.train.jobs import JobManager, JobSpec, QueueFull

    manager = JobManager(tmp_path / "jobs", max_queued=0)
    try:
        with pytest.raises(QueueFull, match="the limit is 0"):
            manager.submit(JobSpec(datasets=[DATASET], output="hf://buckets/lab/trainsvc/models/q", steps=1))
        assert list((tmp_path / "jobs").iterdir()) == [] and manager.list() == []
    finally:
        manager.close()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_training_route_answers_below_500(trainer, tmp_path_factory, data):
    """Property-based fuzzing of every route (read from the app itself): any path parameter, query offset and JSON
    body. Random bodies lack a job spec's required fields, so no job starts."""
    from fastapi.routing import APIRoute

    from robotloop.config import load_settings
    from services.trainer.app import create_app

    tokens = tmp_path_factory.getbasetemp() / "fuzz-trainer-tokens"
    tokens.write_text(f"{WRITER} write lab\n")
    app = create_app(load_settings(), tokens, root=tmp_path_factory.getbasetemp() / "fuzz-trainer-jobs")
    routes = sorted((m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods if m != "HEAD")
    method, template = data.draw(st.sampled_from(routes))
    value = data.draw(st.text(max_size=30) | st.sampled_from(["\x00", "..", "0" * 32, "\U0010ffff"]))
    path = re.sub(r"\{[^}]+\}", quote(value.encode("utf-8", "surrogatepass"), safe="") or "x", template)
    offset = data.draw(st.none() | st.integers() | st.text(max_size=10))
    params = {} if offset is None else {"offset": str(offset)}
    body = json.dumps(data.draw(_json)).encode() if method == "POST" else None
    r = trainer.call(method, path, params=params, content=body)
    assert r.status_code < 500, (method, path, r.text)
    assert r.status_code not in (200, 201, 202) or method != "POST" or not path.endswith("/jobs"), (
        "a random body started a job"
    )


def test_a_job_names_backbone_weights_from_the_services_weights_folder(tmp_path):
    """JobSpec.backbone_weights is a file name in the service's weights folder (trainer.weights_dir), resolved by
    the service; the child trains with `--backbone-weights <that file>`. A path, a hidden or missing file: refused."""
    from robotloop.errors import BadValue

    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "resnet18.pt").write_bytes(b"weights")
    spec = JobSpec(datasets=["hf://buckets/lab/x/datasets/cube"], output="hf://buckets/lab/x/models/a")
    assert spec.with_weights(None) is spec and "--backbone-weights" not in spec.command(tmp_path / "p")
    named = spec.model_copy(update={"backbone_weights": "resnet18.pt"}).with_weights(folder)
    argv = named.command(tmp_path / "p")
    assert argv[argv.index("--backbone-weights") + 1] == str((folder / "resnet18.pt").resolve())
    for bad, message in [
        ("../weights/resnet18.pt", "not a path"),
        ("/etc/passwd", "not a path"),
        (".hidden", "not a path"),
        ("other.pt", "no weights file 'other.pt'"),
    ]:
        with pytest.raises(BadValue, match=message):
            spec.model_copy(update={"backbone_weights": bad}).with_weights(folder)
