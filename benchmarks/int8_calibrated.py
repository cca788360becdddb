"""The int8 graph of a checkpoint's export, made as `deploy publish --onnx-int8` makes it: the convolutions
calibrated on frames of the datasets the checkpoint's lineage names (they stay fp32 if that is too far from fp32).

Run:  python3 benchmarks/int8_calibrated.py MODEL_DIR hf://buckets/local/loop/models/RUN
      (MODEL_DIR: the checkpoint's pretrained_model/ on this machine, with its ONNX export; the int8 graph is
      written beside it, for `robotloop eval --policy MODEL_DIR --backend onnx-int8`)
"""

import sys

from robotloop.deploy.onnx_int8 import calibration_inputs, quantize_int8
from robotloop.storage import BucketUrl, connect
from robotloop.train.checkpoint import read_lineage
from robotloop.train.layout import checkpoint_url, latest_step

if __name__ == "__main__":
    model, run = sys.argv[1], BucketUrl.parse(sys.argv[2])
    client = connect()
    lineage = read_lineage(client, checkpoint_url(run, latest_step(client, run)))
    datasets = [BucketUrl.parse(url) for url in lineage.get("datasets", [])]
    made = quantize_int8(model, calibration=calibration_inputs(client, datasets, model) if datasets else None)
    print(made)
