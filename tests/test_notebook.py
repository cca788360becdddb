"""notebooks/quickstart.ipynb runs top to bottom (tiny sizes) against the real bucket server."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from .conftest import WRITE_TOKEN

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs(bucket_server, tmp_path, monkeypatch):
    monkeypatch.setenv("ROBOTLOOP_QUICKSTART_TINY", "1")
    monkeypatch.setenv("ROBOTLOOP_QUICKSTART_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("ROBOTLOOP_STORAGE__ENDPOINT", bucket_server.endpoint)
    monkeypatch.setenv("ROBOTLOOP_STORAGE__TOKEN", WRITE_TOKEN)
    monkeypatch.setenv("MUJOCO_GL", "egl")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "1 episodes" in outputs and "samples/s" in outputs and "success" in outputs
    assert any(
        o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
        for c in nb.cells
        for o in c.get("outputs", [])
    )
    assert (tmp_path / "out" / "eval" / "eval_report.json").exists()
