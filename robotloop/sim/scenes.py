"""Where a scene lies among a task's scenes: the positions its seed gives the objects, and the other seeds whose
objects lie nearest. How the rounds spend the expert's demos where the policy fails: a policy that fails on one
scene tends to fail on its neighbours too (Insertion's failures gather where both objects lie far from the robots;
BENCHMARKS.md), so the expert demonstrates fresh scenes near each failure, not only the failed scene itself.

A scene's point is the object coordinates its seed samples that vary from seed to seed (x and y of each object:
heights and orientations are fixed), each scaled to [0, 1] over the candidates, so that no coordinate weighs more
for the width of its sampling range.

Example:
    ```python
    >>> nearest_scenes("insertion", [1020, 1027], range(1_000_000, 1_010_000), per_scene=3)
    [1005817, 1003603, 1005930, 1008613, 1001223, 1006671]
    ```
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import BadValue
from .tasks import TaskSpec, get_task


def scene_points(task: str | TaskSpec, seeds: Sequence[int]) -> np.ndarray:
    """The objects' sampled coordinates of each seed's scene, one row per seed (all of them, unscaled)."""
    spec = get_task(task)
    return np.stack([spec.sample_objects(int(seed)) for seed in seeds])


def nearest_scenes(task: str | TaskSpec, scenes: Sequence[int], candidates: Sequence[int], per_scene: int) -> list[int]:
    """For each of `scenes` in turn, the `per_scene` seeds of `candidates` whose objects lie nearest its own (each
    candidate given once: a scene whose nearest were taken gets the next nearest). In scene order, nearest first.

    Raises:
        BadValue: `per_scene` is negative, or the candidates are fewer than the scenes ask for.
    """
    if per_scene < 0:
        raise BadValue(f"scenes near each scene: at least 0, not {per_scene}")
    wanted = per_scene * len(scenes)
    if wanted == 0:
        return []
    if wanted > len(candidates):
        raise BadValue(f"{len(scenes)} scenes x {per_scene} near each need {wanted} candidates, not {len(candidates)}")
    pool = scene_points(task, candidates)
    low, high = pool.min(axis=0), pool.max(axis=0)
    varying = high > low
    low, span = low[varying], (high - low)[varying]
    pool = (pool[:, varying] - low) / span
    targets = (scene_points(task, scenes)[:, varying] - low) / span
    taken = np.zeros(len(pool), dtype=bool)
    near: list[int] = []
    for target in targets:
        distance = np.linalg.norm(pool - target, axis=1)
        distance[taken] = np.inf
        picked = np.argsort(distance, kind="stable")[:per_scene]
        taken[picked] = True
        near += [int(candidates[i]) for i in picked]
    return near


__all__ = ["nearest_scenes", "scene_points"]
