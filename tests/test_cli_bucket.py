"""`robotloop bucket ...` as a user runs it: a real process against the real bucket server."""

import json
import os
import subprocess
import sys

from robotloop.storage.embedded import stop_embedded_server

from .conftest import READ_TOKEN, WRITE_TOKEN


def robotloop(server, *args, token=WRITE_TOKEN, cwd=None, env=None):
    env = {**os.environ, "ROBOTLOOP_STORAGE__ENDPOINT": server.endpoint, "COLUMNS": "200", **(env or {})}
    if token:
        env["ROBOTLOOP_STORAGE__TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "robotloop.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_put_ls_du_get(bucket_server, tmp_path):
    folder = tmp_path / "ep"
    folder.mkdir()
    (folder / "a.bin").write_bytes(os.urandom(300_000))
    (folder / "b.txt").write_text("hello")
    put = robotloop(bucket_server, "bucket", "put", str(folder), "hf://buckets/lab/cli/runs/1")
    assert put.returncode == 0, put.stdout + put.stderr
    assert "uploaded 2 file(s), 300,005 bytes" in put.stdout

    ls = robotloop(bucket_server, "bucket", "ls", "-R", "hf://buckets/lab/cli")
    assert ls.returncode == 0 and "runs/1/a.bin" in ls.stdout and "300,000" in ls.stdout
    du = robotloop(bucket_server, "bucket", "du", "hf://buckets/lab/cli/runs")
    assert "300,005 bytes" in du.stdout

    get = robotloop(bucket_server, "bucket", "get", "hf://buckets/lab/cli/runs/1", str(tmp_path / "back"))
    assert get.returncode == 0, get.stdout + get.stderr
    assert (tmp_path / "back" / "a.bin").read_bytes() == (folder / "a.bin").read_bytes()
    one = robotloop(bucket_server, "bucket", "get", "hf://buckets/lab/cli/runs/1/b.txt", str(tmp_path / "b.txt"))
    assert one.returncode == 0 and (tmp_path / "b.txt").read_text() == "hello"
    folder_rm = robotloop(bucket_server, "bucket", "rm", "hf://buckets/lab/cli/runs/1")
    assert folder_rm.returncode == 1 and "is a folder: delete it with recursive (CLI: -R)" in folder_rm.stdout
    assert robotloop(bucket_server, "bucket", "rm", "hf://buckets/lab/cli/runs/1/b.txt").returncode == 0
    rm = robotloop(bucket_server, "bucket", "rm", "-R", "hf://buckets/lab/cli/runs/1")
    assert rm.returncode == 0 and "deleted 1 file(s)" in rm.stdout, rm.stdout + rm.stderr
    assert robotloop(bucket_server, "bucket", "rm", "hf://buckets/lab/cli/runs/1").returncode == 1  # nothing left
    created = robotloop(bucket_server, "bucket", "create", "hf://buckets/lab/cli-new")
    assert created.returncode == 0 and "created hf://buckets/lab/cli-new (private)" in created.stdout
    again = robotloop(bucket_server, "bucket", "create", "hf://buckets/lab/cli-new", "--public")
    assert again.returncode == 0 and "exists already (left as it is)" in again.stdout
    (tmp_path / "empty").mkdir()
    empty = robotloop(bucket_server, "bucket", "put", str(tmp_path / "empty"), "hf://buckets/lab/cli/e")
    assert empty.returncode == 1 and "no files in it" in empty.stdout
    for command in ("ls", "du"):  # a mistyped path is not an empty folder
        typo = robotloop(bucket_server, "bucket", command, "hf://buckets/lab/cli/runz")
        assert typo.returncode == 1 and "nothing at hf://buckets/lab/cli/runz" in typo.stdout, typo.stdout
    into_file = robotloop(bucket_server, "bucket", "get", "hf://buckets/lab/cli/runs/1", str(tmp_path / "b.txt"))
    assert into_file.returncode == 1 and "is a file: give a folder" in " ".join(into_file.stdout.split())
    # A trailing slash names a folder, existing or not: the file goes into it.
    put = robotloop(bucket_server, "bucket", "put", str(tmp_path / "b.txt"), "hf://buckets/lab/cli/new/")
    assert (
        put.returncode == 0
        and "new/b.txt" in robotloop(bucket_server, "bucket", "ls", "-R", "hf://buckets/lab/cli").stdout
    )


def test_put_and_get_show_progress_on_stderr_and_keep_json_pure(bucket_server, tmp_path):
    """In a terminal (TTY_INTERACTIVE=1 stands in for one: rich's switch) put and get draw a bar on stderr;
    --quiet and --json draw none, and --json's stdout is one JSON document."""
    (tmp_path / "big.bin").write_bytes(os.urandom(3_000_000))
    url = "hf://buckets/lab/cli-progress/big.bin"
    terminal = {"TTY_INTERACTIVE": "1"}
    put = robotloop(bucket_server, "bucket", "put", str(tmp_path / "big.bin"), url, env=terminal)
    assert put.returncode == 0, put.stdout + put.stderr
    assert "uploading" in put.stderr and "3.0/3.0 MB" in put.stderr and "uploaded 1 file(s)" in put.stdout
    get = robotloop(bucket_server, "bucket", "get", url, str(tmp_path / "back.bin"), env=terminal)
    assert get.returncode == 0 and "downloading" in get.stderr and "3.0/3.0 MB" in get.stderr, get.stderr
    quiet = robotloop(bucket_server, "bucket", "get", "-q", url, str(tmp_path / "q.bin"), env=terminal)
    assert quiet.returncode == 0 and "downloading" not in quiet.stderr and "downloaded 1 file(s)" in quiet.stdout
    piped = robotloop(bucket_server, "bucket", "put", str(tmp_path / "big.bin"), url)  # no terminal: no bar
    assert piped.returncode == 0 and "uploading" not in piped.stderr

    put_json = robotloop(bucket_server, "bucket", "put", "--json", str(tmp_path / "big.bin"), url, env=terminal)
    assert put_json.returncode == 0 and "uploading" not in put_json.stderr
    report = json.loads(put_json.stdout)
    assert report["url"] == url and report["bytes_total"] == 3_000_000 and report["bytes_new"] == 0
    assert report["bytes_deduplicated"] == 3_000_000 and report["files"][0]["path"] == "big.bin"
    get_json = robotloop(bucket_server, "bucket", "get", "--json", url, str(tmp_path / "j.bin"), env=terminal)
    assert get_json.returncode == 0 and "downloading" not in get_json.stderr
    assert json.loads(get_json.stdout) == {"url": url, "files": [str(tmp_path / "j.bin")]}
    assert (tmp_path / "j.bin").read_bytes() == (tmp_path / "big.bin").read_bytes()


def test_ls_and_du_print_json_for_scripts(bucket_server, tmp_path):
    (tmp_path / "run" / "sub").mkdir(parents=True)
    (tmp_path / "run" / "a.bin").write_bytes(b"a" * 100)
    (tmp_path / "run" / "sub" / "b.bin").write_bytes(b"b" * 20)
    assert (
        robotloop(bucket_server, "bucket", "put", str(tmp_path / "run"), "hf://buckets/lab/cli-json/run").returncode
        == 0
    )
    ls = robotloop(bucket_server, "bucket", "ls", "--json", "hf://buckets/lab/cli-json/run")
    assert ls.returncode == 0, ls.stdout + ls.stderr
    entries = sorted(json.loads(ls.stdout), key=lambda e: e["path"])
    assert entries[0]["type"] == "file" and entries[0]["path"] == "run/a.bin" and entries[0]["size"] == 100
    assert len(entries[0]["xet_hash"]) == 64 and entries[1] == {"type": "directory", "path": "run/sub"}
    deep = json.loads(robotloop(bucket_server, "bucket", "ls", "-R", "--json", "hf://buckets/lab/cli-json").stdout)
    assert {e["path"] for e in deep if e["type"] == "file"} == {"run/a.bin", "run/sub/b.bin"}
    du = robotloop(bucket_server, "bucket", "du", "--json", "hf://buckets/lab/cli-json/run")
    assert json.loads(du.stdout) == {"url": "hf://buckets/lab/cli-json/run", "bytes": 120}


def test_bad_input_is_a_clear_error(bucket_server, tmp_path):
    bad_url = robotloop(bucket_server, "bucket", "ls", "s3://nope")
    assert bad_url.returncode != 0 and "hf://buckets/<namespace>/<bucket>" in bad_url.stdout + bad_url.stderr
    missing = robotloop(bucket_server, "bucket", "ls", "hf://buckets/lab/never-made")
    assert missing.returncode == 1 and "never-made" in missing.stdout and "robotloop bucket create" in missing.stdout
    no_token = robotloop(bucket_server, "bucket", "put", str(tmp_path), "hf://buckets/lab/cli2", token=None)
    assert no_token.returncode == 1 and "token" in no_token.stdout.lower()
    # Messages are printed as text, not rich markup: brackets in a path neither crash nor vanish.
    brackets = robotloop(bucket_server, "bucket", "ls", "hf://buckets/lab/never-made/[red]x[/red]")
    assert brackets.returncode == 1 and "[red]x[/red]" in brackets.stdout and "Traceback" not in brackets.stderr
    # Nothing listening at the endpoint: one clear line naming where to set it, no traceback.
    gone = robotloop(type(bucket_server)("http://127.0.0.1:1", None, None, None), "bucket", "ls", "hf://buckets/lab/x")
    assert gone.returncode == 1 and "does not answer" in gone.stdout and "Traceback" not in gone.stderr


def test_the_embedded_server_can_be_seen_reached_by_other_tools_and_stopped(tmp_path):
    """`robotloop bucket server status|env|stop`: the detached embedded server is no longer invisible, and hf,
    lerobot or curl get its endpoint and token from `env`."""
    import json
    import shlex

    import httpx

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "COLUMNS": "200", "ROBOTLOOP_CONFIG": os.devnull}
    env.pop("ROBOTLOOP_STORAGE__ENDPOINT", None)

    def run(*args):
        done = subprocess.run(
            [sys.executable, "-m", "robotloop.cli", "bucket", "server", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert json.loads(run("status", "--json"))["running"] is False
    exports = dict(line.removeprefix("export ").split("=", 1) for line in run("env").splitlines())
    endpoint, token = shlex.split(exports["HF_ENDPOINT"])[0], shlex.split(exports["HF_TOKEN"])[0]
    stats = httpx.get(f"{endpoint}/api/robotloop/stats", headers={"authorization": f"Bearer {token}"}, timeout=10)
    assert stats.status_code == 200  # what curl, hf and lerobot would reach with that environment
    state = json.loads(run("status", "--json"))
    assert state["running"] and state["endpoint"] == endpoint and state["pid"]
    assert "stopped" in run("stop")
    assert json.loads(run("status", "--json"))["running"] is False


def test_buckets_are_listed_and_deleted_whole(bucket_server, tmp_path):
    import json

    (tmp_path / "f.txt").write_text("x" * 1000)
    assert (
        robotloop(bucket_server, "bucket", "put", str(tmp_path / "f.txt"), "hf://buckets/lab/doomed/").returncode == 0
    )
    listed = json.loads(robotloop(bucket_server, "bucket", "list", "lab", "--json").stdout)
    doomed = next(b for b in listed if b["id"] == "lab/doomed")
    assert doomed["private"] is True and doomed["total_files"] == 1 and doomed["size"] == 1000
    assert "hf://buckets/lab/doomed" in robotloop(bucket_server, "bucket", "list", "lab").stdout
    refused = robotloop(bucket_server, "bucket", "delete", "hf://buckets/lab/doomed/f.txt", "--yes")
    assert refused.returncode == 2 and "robotloop bucket rm" in refused.stdout + refused.stderr
    assert robotloop(bucket_server, "bucket", "delete", "hf://buckets/lab/doomed", "--yes").returncode == 0
    listed = json.loads(robotloop(bucket_server, "bucket", "list", "lab", "--json").stdout)
    assert "lab/doomed" not in [b["id"] for b in listed]
    again = robotloop(bucket_server, "bucket", "delete", "hf://buckets/lab/doomed", "--yes")
    assert again.returncode == 1 and "does not exist" in again.stdout + again.stderr
    reader = robotloop(bucket_server, "bucket", "delete", "hf://buckets/lab/cli", "--yes", token=None)
    assert reader.returncode == 1  # no token: no delete


def _one_error_line(done) -> str:
    """The one line a failed command prints (errors go to stdout, as the other results): nothing else, no
    traceback, no library log line, exit code 1."""
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), done.stdout + done.stderr
    return lines[0]


def test_a_file_under_a_file_is_refused_and_a_bucket_holding_one_anyway_is_not_a_traceback(bucket_server, tmp_path):
    import sqlite3

    (tmp_path / "notes.md").write_text("notes")
    assert (
        robotloop(bucket_server, "bucket", "put", str(tmp_path / "notes.md"), "hf://buckets/lab/clash/").returncode == 0
    )
    put = robotloop(bucket_server, "bucket", "put", str(tmp_path / "notes.md"), "hf://buckets/lab/clash/notes.md/in.md")
    line = _one_error_line(put)
    assert "'notes.md/in.md' cannot be added under 'notes.md', which is a file" in line and "(409)" in line

    # A bucket that holds a file and files under it anyway (the public Hub's, a store from before the server refused
    # them): planted in the real server's metadata, as such a store has it.
    with sqlite3.connect(bucket_server.root / "buckets.sqlite") as db:
        bucket_id, xet_hash, size = db.execute(
            "SELECT f.bucket_id, f.xet_hash, f.size FROM files f JOIN buckets b ON b.id = f.bucket_id"
            " WHERE b.namespace = 'lab' AND b.name = 'clash' AND f.path = 'notes.md'"
        ).fetchone()
        db.execute(
            "INSERT INTO files (bucket_id, path, xet_hash, size, mtime_ms, uploaded_at) VALUES (?, ?, ?, ?, 0, 0)",
            (bucket_id, "notes.md/in.md", xet_hash, size),
        )
    get = robotloop(bucket_server, "bucket", "get", "hf://buckets/lab/clash", str(tmp_path / "all"))
    line = _one_error_line(get)
    assert "hf://buckets/lab/clash/notes.md is a file and hf://buckets/lab/clash/notes.md/in.md is under it" in line
    assert not (tmp_path / "all").exists()  # refused before anything was written
    one = robotloop(bucket_server, "bucket", "get", "hf://buckets/lab/clash/notes.md/in.md", str(tmp_path / "in.md"))
    assert one.returncode == 0 and (tmp_path / "in.md").read_text() == "notes"
    # A file on disk where the download needs a folder: one line too.
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "notes.md").write_text("local")
    blocked = robotloop(
        bucket_server, "bucket", "get", "hf://buckets/lab/clash/notes.md/in.md", str(tmp_path / "here/notes.md/in.md")
    )
    assert f"{tmp_path / 'here' / 'notes.md'} is a file, not a folder" in _one_error_line(blocked)


def test_a_refused_token_is_one_line(bucket_server, tmp_path):
    (tmp_path / "f.txt").write_text("x")
    assert (
        robotloop(bucket_server, "bucket", "put", str(tmp_path / "f.txt"), "hf://buckets/lab/tokens/").returncode == 0
    )
    wrong = robotloop(bucket_server, "--token", "wrong", "bucket", "ls", "hf://buckets/lab/tokens", env={"COLUMNS": ""})
    line = _one_error_line(wrong)
    assert "the bucket server refused the token (401)" in line and "ROBOTLOOP_STORAGE__TOKEN" in line
    assert "Client error" not in line and "For more information" not in line and "http" not in line.split("(401)")[1]
    reader = robotloop(
        bucket_server, "bucket", "put", str(tmp_path / "f.txt"), "hf://buckets/lab/tokens/g.txt", token=READ_TOKEN
    )
    assert "the token may not do this (403)" in _one_error_line(reader)


def test_listings_never_cut_a_path(bucket_server, tmp_path):
    """Narrow terminal or pipe (rich takes 80 columns there): every path whole, each entry on one line."""
    deep = "pretrained_model/" + "config_of_a_policy_with_a_long_name_" * 3 + ".json"
    (tmp_path / "c.json").write_text("{}")
    url = f"hf://buckets/lab/long-paths-of-a-bucket-whose-name-is-long-too/{deep}"
    assert robotloop(bucket_server, "bucket", "put", str(tmp_path / "c.json"), url).returncode == 0
    for columns in ("40", ""):  # "": no COLUMNS, as in a pipe
        ls = robotloop(
            bucket_server,
            "bucket",
            "ls",
            "-R",
            "hf://buckets/lab/long-paths-of-a-bucket-whose-name-is-long-too",
            env={"COLUMNS": columns},
        )
        assert ls.returncode == 0, ls.stdout + ls.stderr
        lines = ls.stdout.splitlines()
        assert len(lines) == 2 and lines[1].endswith(f"  {deep}") and lines[1].split()[0] == "2", ls.stdout
        listed = robotloop(bucket_server, "bucket", "list", "lab", env={"COLUMNS": columns}).stdout.splitlines()
        assert any(line.endswith("  hf://buckets/lab/long-paths-of-a-bucket-whose-name-is-long-too") for line in listed)
        du = robotloop(bucket_server, "bucket", "du", url, env={"COLUMNS": columns})
        assert du.stdout.count("\n") == 1 and du.stdout.split() == ["2", "bytes", url]


def test_the_embedded_server_is_not_stopped_under_a_process_using_it(tmp_path):
    """Every checkout and run of one user shares the embedded server: `stop` refuses, naming the pid, while another
    process uses it (unless --force), and forgets a user killed with -9. `status` names the data root `scrub`
    takes."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "COLUMNS": "", "ROBOTLOOP_CONFIG": os.devnull}
    env.pop("ROBOTLOOP_STORAGE__ENDPOINT", None)

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "robotloop.cli", "bucket", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def user():  # a run in progress elsewhere: it found (started) the server and goes on using it
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from robotloop.storage import connect; connect(); print('ready');"
                " sys.stdout.flush(); sys.stdin.read()",
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline() == "ready\n"
        return proc

    try:  # whatever fails, the server goes at the end (forced)
        first = user()
        try:
            state = json.loads(run("server", "status", "--json").stdout)
            assert state["running"] and state["clients"] == [first.pid]
            assert f"used by pid {first.pid}" in run("server", "status").stdout
            scrub = run("scrub", "--root", state["root"])
            assert scrub.returncode == 0 and "nothing damaged" in scrub.stdout, scrub.stdout + scrub.stderr
            refused = run("server", "stop")
            assert f"in use by pid {first.pid}" in _one_error_line(refused) and "--force" in refused.stdout
            assert json.loads(run("server", "status", "--json").stdout)["running"]  # still serving the run
            wrong_root = run("scrub", "--root", str(tmp_path / "xdg" / "robotloop" / "buckets"))
            assert f"the one in it is {state['root']}" in _one_error_line(wrong_root)
        finally:
            first.kill()  # -9: its lease goes with it
            first.wait()
        assert run("server", "stop").stdout == "stopped\n"
        second = user()
        try:
            assert run("server", "stop").returncode == 1
            assert run("server", "stop", "--force").stdout == "stopped\n"
            assert json.loads(run("server", "status", "--json").stdout)["running"] is False
        finally:
            second.stdin.close()
            second.wait(30)
    finally:
        stop_embedded_server(tmp_path / "xdg" / "robotloop" / "buckets", force=True)
