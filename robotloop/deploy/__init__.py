"""Deploy: signed releases of LeRobot checkpoints, the deploy service's registry, and the robot runtime that
pulls only the bytes it lacks, verifies, hot-swaps between action chunks and rolls back by itself.

Modules, one concern each: `keys` (ed25519 deploy keys), `manifest` (signed release manifests), `fetch`
(ranged hf_xet reads), `store` (the robot's local release store), `registry` (the service's SQLite state),
`client` (HTTP client of the service), `publish`, `runtime` (the robot's control loop), `ledger` (what a robot
knows of each release it was assigned), `reporter` (the robot's heartbeats and events), `runner` (a loaded
policy on torch), `onnx_export` (a checkpoint to ONNX, with its resize and normalization; the trainer runs it
on its last checkpoint, `publish` reuses that export or runs it), `onnx_runner` (an exported policy on ONNX
Runtime: numpy only, no torch) and `policy` (what the runtime runs, either runner, and `load_policy`, which picks
the backend per release). The robot's ONNX path imports no torch: `runner`,
`onnx_export` and `evaluate` do, and are imported only where torch is needed.
"""
