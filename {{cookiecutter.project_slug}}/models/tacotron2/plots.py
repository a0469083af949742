"""Tacotron2's validation pictures: attention alignment, mel spectrogram and stop gate, as PNG files or TensorBoard
figures. Plain :class:`matplotlib.figure.Figure` objects on the Agg canvas: no GUI backend and no pyplot state, so
nothing stays open between calls, and headless servers are safe."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from utils.plotting import ArrayLike, to_numpy

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn: importing it costs ~1 s per process
    from matplotlib.figure import Figure

PathLike = Union[str, Path]


def _new_axes(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    return figure.add_subplot()


def _finish(axes: Any, xlabel: str, ylabel: str, title: Optional[str], path: Optional[PathLike]) -> Figure:
    """Label the axes, lay the figure out and save it as a PNG at ``path`` when given."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    figure = axes.figure
    figure.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png")
    return figure


def plot_alignment(alignment: ArrayLike, path: Optional[PathLike] = None, title: Optional[str] = None) -> Figure:
    """Heat map of attention weights ``(enc_steps, dec_steps)`` (a model's ``(T, L)`` alignment transposed): encoder
    steps (text) up, decoder steps (frames) across. Saved as a PNG at ``path`` when given (folders created).

    Raises:
        ValueError: ``alignment`` is not 2-D.
    """
    return _image(to_numpy(alignment, 2, "alignment"), (6, 4), "decoder step", "encoder step", path, title)


def plot_spectrogram(mel: ArrayLike, path: Optional[PathLike] = None, title: Optional[str] = None) -> Figure:
    """Image of a log-mel spectrogram ``(n_mels, frames)``, low bands at the bottom.

    Raises:
        ValueError: ``mel`` is not 2-D.
    """
    return _image(to_numpy(mel, 2, "mel spectrogram"), (8, 3), "frame", "mel channel", path, title)


def _image(data, size, xlabel: str, ylabel: str, path: Optional[PathLike], title: Optional[str]) -> Figure:
    """A 2-D array as an image with a colour bar, row 0 at the bottom."""
    axes = _new_axes(size)
    axes.figure.colorbar(axes.imshow(data, aspect="auto", origin="lower", interpolation="none"), ax=axes)
    return _finish(axes, xlabel, ylabel, title, path)


def plot_gate(gate_target: ArrayLike, gate_pred: ArrayLike, path: Optional[PathLike] = None,
              title: Optional[str] = None) -> Figure:
    """Stop-gate target (0/1) and predicted stop probability (``sigmoid`` of the logits), each ``(frames,)``, over
    decoder steps.

    Raises:
        ValueError: either input is not 1-D.
    """
    target = to_numpy(gate_target, 1, "gate_target")
    pred = to_numpy(gate_pred, 1, "gate_pred")
    axes = _new_axes((8, 3))
    axes.scatter(np.arange(len(target)), target, color="green", marker="+", s=4, label="target")
    axes.scatter(np.arange(len(pred)), pred, color="red", marker=".", s=4, label="predicted")
    axes.set_ylim(-0.05, 1.05)
    axes.legend(loc="center left")
    return _finish(axes, "frame", "stop probability", title, path)
