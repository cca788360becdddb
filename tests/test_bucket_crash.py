"""kill -9 of the bucket server in the middle of uploads: every path holds an old or a new version, whole.

A writer process uploads generation after generation of 8 files in one batch each and prints each generation
the server acknowledged. The server is SIGKILLed at varying moments, restarted on the same root, and every
path is read back through the real clients.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from robotloop.storage import BucketClient, BucketUrl

from .conftest import WRITE_TOKEN, start_server

FILES = 8
WRITER = textwrap.dedent(
    """
    import sys, random, pathlib
    from robotloop.storage import BucketClient, BucketUrl
    endpoint, token, work = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    client = BucketClient(endpoint, token)
    base = BucketUrl.parse("hf://buckets/lab/crash/gen")
    for gen in range(1, 10_000):
        for i in range(%(files)d):
            body = random.Random(gen * 1000 + i).randbytes(150_000)
            (work / f"f{i}.bin").write_bytes(gen.to_bytes(8, "big") + body)
        try:
            client.upload(work, base)
        except Exception as error:
            print("failed", gen, type(error).__name__, flush=True)
            break
        print("acked", gen, flush=True)
    """
) % {"files": FILES}


def expected(gen: int, i: int) -> bytes:
    import random

    return gen.to_bytes(8, "big") + random.Random(gen * 1000 + i).randbytes(150_000)


@pytest.mark.timeout(240)
def test_sigkill_during_uploads_leaves_old_or_new_content(tmp_path, tokens_file):
    root = tmp_path / "root"
    server = start_server(root, tokens_file)
    client = BucketClient(server.endpoint, WRITE_TOKEN)
    client.create_bucket(BucketUrl.parse("hf://buckets/lab/crash"))
    last_acked = 0
    for round_, delay in enumerate((0.8, 1.3, 2.1)):
        log = tmp_path / f"writer-{round_}.log"
        with open(log, "w") as out:
            work = tmp_path / f"writer-{round_}"  # under tmp_path: the killed writer cannot clean up after itself
            work.mkdir()
            writer = subprocess.Popen(
                [sys.executable, "-c", WRITER, server.endpoint, WRITE_TOKEN, str(work)], stdout=out
            )
            time.sleep(delay)
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
            writer.kill()  # its client would retry for minutes; what it printed before is what was acknowledged
            writer.wait()
        acked = [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("acked")]
        last_acked = max(acked, default=last_acked)

        server = start_server(root, tokens_file, port=int(server.endpoint.rsplit(":", 1)[1]))  # no repair step
        client = BucketClient(server.endpoint, WRITE_TOKEN)
        listing = sorted(e.url.path for e in client.ls(BucketUrl.parse("hf://buckets/lab/crash/gen"), recursive=True))
        if last_acked == 0:
            continue
        assert listing == [f"gen/f{i}.bin" for i in range(FILES)], f"round {round_}: {listing}"
        gens = set()
        for i in range(FILES):
            data = client.read_range(BucketUrl.parse(f"hf://buckets/lab/crash/gen/f{i}.bin"), 0, 150_008)
            gen = int.from_bytes(data[:8], "big")
            assert data == expected(gen, i), f"round {round_}: f{i}.bin is not a whole version"
            gens.add(gen)
        assert len(gens) == 1, f"round {round_}: one batch, yet paths from generations {gens}"
        assert gens.pop() >= last_acked, "an acknowledged batch was lost"
    assert last_acked > 0, "the writer never got a batch through; the test proved nothing"
    server.proc.terminate()
