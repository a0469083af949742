"""Monotonic alignment search (MAS): the most likely monotonic, surjective alignment of text tokens to mel frames
under a score matrix, as Glow-TTS (Kim et al., NeurIPS 2020, Section 3.2 and Algorithm 1) defines it and Matcha-TTS
trains its duration predictor and prior with. Compiled by numba on first use; float32 throughout, as the
reference's Cython ``maximum_path_c``, so ties and near-ties resolve the same way."""

from __future__ import annotations

import numba
import numpy as np
import torch

NEGATIVE = np.float32(-1e9)
"""The score of a cell no monotonic path reaches (the reference's ``max_neg_val``)."""


@numba.njit(cache=False)
def _search_one(path: np.ndarray, value: np.ndarray, t_x: int, t_y: int) -> None:
    """One item: ``value`` (T_text, T_mel) float32 becomes the cumulative best scores; ``path`` (T_text, T_mel) int32
    gets 1 on the best path through the ``t_x`` x ``t_y`` top-left corner."""
    for y in range(t_y):
        for x in range(max(0, t_x + y - t_y), min(t_x, y + 1)):
            stay = NEGATIVE if x == y else value[x, y - 1]
            if x == 0:
                advance = np.float32(0.0) if y == 0 else NEGATIVE
            else:
                advance = value[x - 1, y - 1]
            value[x, y] = (stay if stay >= advance else advance) + value[x, y]
    index = t_x - 1
    for y in range(t_y - 1, -1, -1):
        path[index, y] = 1
        if index != 0 and (index == y or value[index, y - 1] < value[index - 1, y - 1]):
            index -= 1


@numba.njit(cache=False)
def _search(paths: np.ndarray, values: np.ndarray, t_xs: np.ndarray, t_ys: np.ndarray) -> None:
    for i in range(values.shape[0]):
        _search_one(paths[i], values[i], t_xs[i], t_ys[i])


def maximum_path(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The best monotonic alignment of each item: ``value`` (B, T_text, T_mel), the log-likelihood of frame ``j``
    under token ``i``; ``mask`` (B, T_text, T_mel), 1 inside each item's ``text_length x mel_length`` corner, 0 outside
    (the lengths are read from its first column and first row). Returns the path (B, T_text, T_mel), 0 or 1 in
    ``value``'s dtype and device: each frame of the corner goes to one token, the first frame to the first token, the
    last to the last, and the token index never falls. An item needs ``text_length <= mel_length``; with fewer frames
    than tokens the path is not surjective (as the reference's). Runs on the CPU: the scores are copied there."""
    scores = (value * mask).detach().float().cpu().numpy()  # float32 (NumPy has no bfloat16: autocast's scores)
    lengths = mask.detach().float().cpu().numpy()
    t_xs = lengths.sum(1)[:, 0].astype(np.int32)
    t_ys = lengths.sum(2)[:, 0].astype(np.int32)
    paths = np.zeros(scores.shape, dtype=np.int32)
    _search(paths, np.ascontiguousarray(scores), t_xs, t_ys)
    return torch.from_numpy(paths).to(device=value.device, dtype=value.dtype)
