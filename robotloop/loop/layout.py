"""Where a loop's report lies in its bucket: `<bucket>/models/<run>/report/`, beside the run's checkpoints.

`upload_report` writes there and the dashboard reads from there. Apart from `report.py` (which loads the pipeline,
and with it torch) so that a reader imports only these names.
"""

from __future__ import annotations

from ..storage import BucketUrl

REPORT_FOLDER = "report"  # under the run's folder
EVAL_FOLDER = "eval"  # under the report folder: eval_report.json and videos/*.mp4


def run_report_url(run_url: BucketUrl) -> BucketUrl:
    """The report folder of a training run (its output folder, `<bucket>/models/<run>`)."""
    return run_url / REPORT_FOLDER
