"""What a person sees from every command: log records and warnings as the CLI's own one-line notes, never Python's
logging format; piped output that never wraps or cuts; tracebacks only with --debug. Each check runs in a fresh
interpreter, as a command does (logging's set-up is process-wide)."""

import os
import subprocess
import sys
import textwrap


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=120
    )


def test_log_records_become_one_line_notes_once_each_and_lerobot_cannot_install_its_format():
    run = _python(
        """
        import logging, warnings
        from robotloop.output import log_to_console
        log_to_console()
        logging.debug("Detected scipy version: 1.0")  # what lerobot's import does: it would call basicConfig()
        log = logging.getLogger("lerobot.utils.import_utils")  # robotloop's trainer says this itself, in one line
        log.warning("Could not load libtorchcodec. Likely causes:\\n  1. FFmpeg is not installed\\n  2. ...")
        log = logging.getLogger("lerobot.datasets")
        for _ in range(3):  # one per worker, per call: said once, its first line
            log.warning("a long note\\n  with a traceback\\n  in it")
        logging.getLogger("robotloop.deploy").error("refused v7: unsigned")
        warnings.warn("a library's note", UserWarning)
        logging.getLogger("robotloop.train").info("not shown without --debug")
        """
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        "warning: a long note",
        "error: refused v7: unsigned",
        "warning: a library's note",
    ]
    assert run.stdout == ""


def test_debug_shows_every_record_with_its_logger_and_traceback():
    run = _python(
        """
        import logging
        from robotloop.output import fail, log_to_console
        log_to_console(debug=True)
        logging.getLogger("robotloop.train").info("step timing")
        try:
            raise RuntimeError("disk full")
        except RuntimeError as error:
            fail(error)
        """
    )
    assert "info [robotloop.train]: step timing" in run.stderr
    assert "Traceback (most recent call last)" in run.stderr and "RuntimeError: disk full" in run.stderr
    assert run.stdout.strip() == "error: disk full"


def test_an_error_is_one_line_without_debug():
    run = _python(
        """
        from robotloop.output import fail, log_to_console
        log_to_console()
        try:
            raise RuntimeError("disk full")
        except RuntimeError as error:
            fail(error)
        """
    )
    assert run.stdout.strip() == "error: disk full" and "Traceback" not in run.stdout + run.stderr


def test_piped_output_is_never_wrapped_nor_cut():
    run = _python(
        """
        from rich.table import Table
        from robotloop.output import cli_console
        console = cli_console()
        console.print("word " * 60)
        table = Table("path", "size")
        table.add_row("checkpoints/000150/pretrained_model/" + "config" * 20 + ".json", "1.2 kB")
        console.print(table)
        """
    )
    lines = run.stdout.splitlines()
    assert lines[0].strip() == ("word " * 60).strip()
    assert any("config" * 20 + ".json" in line for line in lines), run.stdout


def _robotloop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robotloop.cli", *args], capture_output=True, text=True, timeout=120)


def test_a_usage_error_is_one_line_naming_the_help_and_exits_2():
    run = _robotloop("train", "--output", "hf://buckets/lab/demos/models/r")
    assert run.returncode == 2
    assert (run.stdout + run.stderr).strip().splitlines() == [
        "error: Invalid value for --dataset: missing: give the option, or its key in a --config file "
        "(see 'robotloop train --help')"
    ]


def test_piped_help_never_cuts_an_option_name():
    # As from a shell, where COLUMNS is not exported (pytest's own process has one in its real environment).
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    run = subprocess.run(
        [sys.executable, "-m", "robotloop.cli", "train", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0 and "…" not in run.stdout
    assert "--policy-image-size" in run.stdout and "--policy.chunk_size" in run.stdout


def test_a_spawned_worker_notes_as_its_command_does():
    """A worker of `python -m robotloop.cli` imports only what its job needs, never the CLI's set-up: `start_worker`
    gives it the same one-line notes (lerobot's first `logging.debug` would have given it Python's format)."""
    run = _python(
        """
        import logging, multiprocessing as mp, os
        from concurrent.futures import ProcessPoolExecutor
        from robotloop.workers import start_worker
        with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=start_worker,
                                 initargs=(os.getpid(),)) as pool:
            pool.submit(logging.debug, "Detected scipy version").result()  # lerobot's import, in the worker
            pool.submit(logging.getLogger("lerobot.datasets").warning, "a worker's note\\nmore").result()
        """
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == ["warning: a worker's note"]
